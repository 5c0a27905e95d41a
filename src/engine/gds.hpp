// GdsHandle over given CUDA and cuFile drivers (the process-wide ones, or fakes loaded by
// tests): the engine with a GdsRoute (src/backends/gds/gds_route.hpp).
#pragma once

#include <functional>
#include <memory>

#include "deepio/gpu.hpp"
#include "engine/device.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "platform/status.hpp"

namespace deepio::detail::gpu {

struct GdsParts {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<GdsRoute> route;
};

/// What a GdsHandle is made of: the route, and the engine it is part of.
/// cuda_api null -> throws deepio::Error(cuda_why.errnum or ENOTSUP) with cuda_why's message.
/// cufile_api may be null (cufile_why says why): Auto and Compat then stage through host
/// memory, CuFile throws ENOTSUP. Options are validated as Handle's (EINVAL).
GdsParts make_gds_parts(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                        CuFileApi* cufile_api, const Status& cufile_why);

/// The drivers a handle's route uses, as loaded (a null api: absent, its Status says why).
struct Drivers {
  const CudaApi* cuda = nullptr;
  Status cuda_why;
  CuFileApi* cufile = nullptr;
  Status cufile_why;
};
/// Called when a route needs the drivers: at construction for DeviceRouteMode::Gds, on the
/// first operation on device memory for Auto, never for Staged.
using DriverSource = std::function<Drivers()>;
/// The process-wide CUDA, then (only where CUDA loaded) the process-wide cuFile.
Drivers process_drivers();

/// The engine of a Handle with `options.device_route`: Staged, a plain engine; Gds, a GdsRoute
/// in CuFile mode made now (throws as make_gds_parts); Auto, a GdsRoute in Auto mode made on
/// the first operation on device memory where both drivers load, else staging. `device`
/// (classify unset: device_support()) recognises and stages device memory.
std::unique_ptr<Engine> make_engine(const HandleOptions& options, DriverSource drivers, DeviceSupport device = {});

/// A Handle over make_engine() with the given drivers (tests: the fakes); a null cuda_api
/// means CUDA is absent.
Handle make_handle(const HandleOptions& options, const CudaApi* cuda_api, const Status& cuda_why, CuFileApi* cufile_api,
                   const Status& cufile_why);

/// A GdsHandle over make_gds_parts().
GdsHandle make_gds_handle(const GdsOptions& options, const CudaApi* cuda_api, const Status& cuda_why,
                          CuFileApi* cufile_api, const Status& cufile_why);

}  // namespace deepio::detail::gpu
