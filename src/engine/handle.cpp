#include "deepio/handle.hpp"

#include <cerrno>

#include "engine/engine.hpp"

#if DEEPIO_HAVE_GPU
#include "engine/gds.hpp"
#endif

namespace deepio {

namespace {
// The engine with options.device_route (gds.hpp: make_engine): Auto looks for CUDA and cuFile
// only on the first operation on device memory, Gds now, Staged never.
std::unique_ptr<detail::Engine> handle_engine(const HandleOptions& options) {
#if DEEPIO_HAVE_GPU
  return detail::gpu::make_engine(options, &detail::gpu::process_drivers);
#else
  if (options.device_route == DeviceRouteMode::Gds) {
    detail::throw_error(ENOTSUP, "device_route gds: this deepio was built without its GPU layer (no cuFile)");
  }
  return std::make_unique<detail::Engine>(options);
#endif
}

// In a process forked from the op's, the op's count of Futures is never looked at again and
// its mutex may have been held by a parent thread at the fork: copies and drops there leave it.
bool counts_futures(const std::shared_ptr<detail::OpState>& state) noexcept {
  return state != nullptr && state->stamp().here();
}
}  // namespace

Future::Future(std::shared_ptr<detail::OpState> state) noexcept : state_(std::move(state)) {
  if (counts_futures(state_)) state_->add_future();
}
Future::Future(const Future& other) noexcept : state_(other.state_) {
  if (counts_futures(state_)) state_->add_future();
}
Future& Future::operator=(const Future& other) noexcept {
  if (this != &other) *this = Future(other);
  return *this;
}
Future& Future::operator=(Future&& other) noexcept {
  if (this != &other) {
    if (counts_futures(state_)) state_->drop_future();
    state_ = std::move(other.state_);
  }
  return *this;
}
Future::~Future() {
  if (counts_futures(state_)) state_->drop_future();
}

bool Future::done() const {
  if (state_ == nullptr) return true;
  state_->stamp().check();
  return state_->done();
}

void Future::wait() const {
  if (state_ == nullptr) return;
  state_->stamp().check();
  state_->wait();
}

bool Future::wait_for(std::chrono::nanoseconds timeout) const {
  if (state_ == nullptr) return true;
  state_->stamp().check();
  return state_->wait_for(timeout);
}

std::size_t Future::get() {
  if (!state_) throw InvalidArgument("get() on an empty Future");
  state_->stamp().check();
  std::shared_ptr<void> keep_alive;  // released on return, on this thread
  detail::throw_if_error(state_->take_result(&keep_alive));
  return state_->nbytes();
}

Handle::Handle(const HandleOptions& options) : engine_(handle_engine(options)) {}
Handle::Handle(PreparedEngine, std::unique_ptr<detail::Engine> engine) noexcept : engine_(std::move(engine)) {}
Handle::~Handle() {
  // A forked child: the engine's worker, opener and sync threads are in the parent, its
  // mutexes may have been held there at the fork. Destroying it would join threads that do
  // not exist (a hang): a deliberate leak, bounded by what the parent had made.
  if (engine_ && !engine_->in_own_process()) (void)engine_.release();
}

Future Handle::async_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset,
                           OpOptions op) {
  return Future(engine_->submit(false, buffer, nbytes, &path, -1, file_offset, std::move(op)));
}
Future Handle::async_pwrite(const void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset,
                            OpOptions op) {
  // The engine never writes through a write op's buffer; the cast only unifies the plumbing.
  return Future(engine_->submit(true, const_cast<void*>(buffer), nbytes, &path, -1, file_offset, std::move(op)));
}
Future Handle::async_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset, OpOptions op) {
  return Future(engine_->submit(false, buffer, nbytes, nullptr, fd, file_offset, std::move(op)));
}
Future Handle::async_pwrite(const void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset, OpOptions op) {
  return Future(engine_->submit(true, const_cast<void*>(buffer), nbytes, nullptr, fd, file_offset, std::move(op)));
}

Future Handle::async_pread_ranges(void* buffer, std::size_t buffer_bytes, const std::string& path,
                                  std::span<const IoRange> ranges, OpOptions op) {
  return Future(engine_->submit_ranges(false, buffer, buffer_bytes, &path, -1, ranges, std::move(op)));
}
Future Handle::async_pwrite_ranges(const void* buffer, std::size_t buffer_bytes, const std::string& path,
                                   std::span<const IoRange> ranges, OpOptions op) {
  return Future(
      engine_->submit_ranges(true, const_cast<void*>(buffer), buffer_bytes, &path, -1, ranges, std::move(op)));
}
Future Handle::async_pread_ranges(void* buffer, std::size_t buffer_bytes, int fd, std::span<const IoRange> ranges,
                                  OpOptions op) {
  return Future(engine_->submit_ranges(false, buffer, buffer_bytes, nullptr, fd, ranges, std::move(op)));
}
Future Handle::async_pwrite_ranges(const void* buffer, std::size_t buffer_bytes, int fd,
                                   std::span<const IoRange> ranges, OpOptions op) {
  return Future(
      engine_->submit_ranges(true, const_cast<void*>(buffer), buffer_bytes, nullptr, fd, ranges, std::move(op)));
}

std::vector<Future> Handle::submit_batch(std::vector<IoRequest> requests) {
  std::vector<Future> futures;
  futures.reserve(requests.size());
  for (auto& op : engine_->submit_batch(std::move(requests))) futures.push_back(Future(std::move(op)));
  return futures;
}

namespace {
// A synchronous call is its own detached op collected by its own Future: a wait() in another
// thread never takes it (nor its count and failure) away from this call, and this call takes
// nothing else. Operations submitted before it keep running; their count and failures stay
// with their Futures and the next wait()/collect().
detail::BindingOp detached() { return {.keep_alive = nullptr, .detached = true}; }

std::size_t collect_own(Future own) {
  (void)own.get();
  return 1;
}
}  // namespace

std::size_t Handle::sync_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset) {
  return collect_own(Future(engine_->submit(false, buffer, nbytes, &path, -1, file_offset, {}, detached())));
}
std::size_t Handle::sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                                std::uint64_t file_offset, bool fsync) {
  OpOptions op;
  op.fsync = fsync;
  // The engine never writes through a write op's buffer; the cast only unifies the plumbing.
  return collect_own(Future(
      engine_->submit(true, const_cast<void*>(buffer), nbytes, &path, -1, file_offset, std::move(op), detached())));
}

std::size_t Handle::wait() { return engine_->wait(); }
WaitResult Handle::collect(const CollectOptions& options) {
  detail::BindingCollect selection;
  selection.deadline = options.deadline;
  // A user's operations carry no keep-alive (only a binding's do): nothing is handed over.
  detail::Collected r = engine_->collect(selection, nullptr);
  return std::move(static_cast<WaitResult&>(r));
}
std::size_t Handle::pending() const noexcept { return engine_->pending(); }
const HandleOptions& Handle::options() const noexcept { return engine_->options(); }
BackendKind Handle::backend() const noexcept { return engine_->backend(); }
HandleStats Handle::stats() const noexcept { return engine_->stats(); }

std::size_t live_handles() noexcept { return detail::live_engines(); }

}  // namespace deepio
