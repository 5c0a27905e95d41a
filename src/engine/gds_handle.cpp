// deepio::GdsHandle: a Handle whose engine has a GdsRoute, plus the route's own calls
// (pinning device buffers, the mode report).
#include "engine/cuda_stager.hpp"
#include "engine/engine.hpp"
#include "engine/gds.hpp"
#include "engine/handle_access.hpp"
#include "backends/gds/gds_route.hpp"

namespace deepio {

namespace detail::gpu {

GdsParts make_gds_parts(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                        CuFileApi* cufile_api, const Status& cufile_why) {
  if (cuda_api == nullptr) {
    const int errnum = cuda_why.errnum != 0 ? cuda_why.errnum : ENOTSUP;
    throw_error(errnum, "GdsHandle needs the CUDA driver: " +
                            (cuda_why.message.empty() ? std::string("not loaded") : cuda_why.message));
  }
  const HandleOptions ho = handle_options(options);
  EngineSetup setup;
  setup.device = cuda_device_support(cuda_api);
  // Options are validated by the engine (EINVAL); a route made for invalid options only
  // opens and closes the driver reference.
  auto route = std::make_shared<GdsRoute>(options, cuda_api, cufile_api, cufile_why);
  setup.route = route;
  GdsParts parts;
  parts.engine = std::make_unique<Engine>(ho, std::move(setup));
  parts.route = std::move(route);
  return parts;
}

Drivers process_drivers() {
  Drivers d;
  d.cuda = cuda(&d.cuda_why);
  if (d.cuda != nullptr) d.cufile = cufile_mutable(&d.cufile_why);
  return d;
}

std::unique_ptr<Engine> make_engine(const HandleOptions& options, DriverSource drivers, DeviceSupport device) {
  switch (options.device_route) {
    case DeviceRouteMode::Staged: break;
    case DeviceRouteMode::Gds: {
      const Drivers d = drivers();
      return make_gds_parts(gds_options(options), d.cuda, d.cuda_why, d.cufile, d.cufile_why).engine;
    }
    case DeviceRouteMode::Auto: {
      EngineSetup setup;
      setup.device = std::move(device);
      // Made on the first operation on device memory (Engine::device_route): a handle that
      // never sees device memory never loads cuFile nor opens its driver. Without either
      // driver, every operation is staged.
      setup.make_route = [options, drivers = std::move(drivers)]() -> std::shared_ptr<DeviceRoute> {
        const Drivers d = drivers();
        if (d.cuda == nullptr || d.cufile == nullptr) return nullptr;
        return std::make_shared<GdsRoute>(gds_options(options, GdsMode::Auto), d.cuda, d.cufile, d.cufile_why);
      };
      return std::make_unique<Engine>(options, std::move(setup));
    }
  }
  EngineSetup setup;
  setup.device = std::move(device);
  return std::make_unique<Engine>(options, std::move(setup));
}

Handle make_handle(const HandleOptions& options, const CudaApi* cuda_api, const Status& cuda_why, CuFileApi* cufile_api,
                   const Status& cufile_why) {
  DeviceSupport device;
  if (cuda_api != nullptr) device = cuda_device_support(cuda_api);
  DriverSource drivers = [=] { return Drivers{cuda_api, cuda_why, cufile_api, cufile_why}; };
  return HandleAccess::handle(make_engine(options, std::move(drivers), std::move(device)));
}

GdsHandle make_gds_handle(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                          CuFileApi* cufile_api, const Status& cufile_why) {
  return HandleAccess::gds_handle(options, make_gds_parts(options, cuda_api, cuda_why, cufile_api, cufile_why));
}

}  // namespace detail::gpu

GdsHandle detail::HandleAccess::gds_handle(const GdsOptions& options, gpu::GdsParts&& parts) noexcept {
  return GdsHandle(options, std::move(parts));
}

namespace {
detail::gpu::GdsParts default_parts(const GdsOptions& options) {
  detail::Status cuda_why;
  detail::Status cufile_why;
  const auto* cuda_api = detail::gpu::cuda(&cuda_why);
  auto* cufile_api = cuda_api != nullptr && options.mode != GdsMode::Compat ? detail::gpu::cufile_mutable(&cufile_why)
                                                                            : nullptr;
  return detail::gpu::make_gds_parts(options, cuda_api, cuda_why, cufile_api, cufile_why);
}
}  // namespace

GdsHandle::GdsHandle(const GdsOptions& options) : GdsHandle(options, default_parts(options)) {}

GdsHandle::GdsHandle(const GdsOptions& options, detail::gpu::GdsParts&& parts) noexcept
    : Handle(PreparedEngine{}, std::move(parts.engine)), gds_options_(options), route_(std::move(parts.route)) {}

GdsHandle::~GdsHandle() {
  // In a forked child the route's cuFile and CUDA state are the parent's: leaked with the
  // engine (Handle::~Handle), never torn down here.
  if (!engine().in_own_process()) (void)new std::shared_ptr<detail::gpu::GdsRoute>(std::move(route_));
}

bool GdsHandle::pin_device_buffer(void* device_ptr, std::size_t nbytes) { return route_->pin(device_ptr, nbytes); }
bool GdsHandle::unpin_device_buffer(void* device_ptr) { return route_->unpin(device_ptr); }
void* GdsHandle::new_pinned_device_buffer(std::size_t nbytes, int device) { return route_->new_pinned(nbytes, device); }
bool GdsHandle::free_pinned_device_buffer(void* device_ptr) { return route_->free_pinned(device_ptr); }
std::string GdsHandle::mode() const { return route_->mode(); }
std::string GdsHandle::mode_reason() const { return route_->mode_reason(); }

GdsStats GdsHandle::gds_stats() const noexcept {
  const detail::Counters& c = engine().counters();
  GdsStats s;
  s.ops_completed = c.device_ops_completed.load();
  s.ops_failed = c.device_ops_failed.load();
  s.chunks = c.device_requests.load();
  // The engine counts what its route's backend moved as cuFile's; the backend's own staging
  // after a cuFile failure is moved to the staged side.
  const std::uint64_t io_staged = route_->io_fallback_bytes();
  const std::uint64_t by_route = c.bytes_gds.load();
  s.bytes_cufile = by_route > io_staged ? by_route - io_staged : 0;
  s.bytes_staged = c.bytes_staged.load() + io_staged;
  s.files_fallback = route_->files_fallback();
  s.pins_refused = route_->pins_refused();
  s.registrations_skipped = route_->registrations_skipped();
  s.io_fallbacks = route_->io_fallbacks();
  return s;
}

}  // namespace deepio
