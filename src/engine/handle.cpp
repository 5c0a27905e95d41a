#include "deepio/handle.hpp"

#include "engine/engine.hpp"

namespace deepio {

Future::Future(std::shared_ptr<detail::OpState> state) noexcept : state_(std::move(state)) {}

bool Future::done() const noexcept { return state_ == nullptr || state_->done(); }

void Future::wait() const noexcept {
  if (state_) state_->wait();
}

bool Future::wait_for(std::chrono::nanoseconds timeout) const noexcept {
  return state_ == nullptr || state_->wait_for(timeout);
}

std::size_t Future::get() {
  if (!state_) detail::throw_error(EINVAL, "get() on an empty Future");
  detail::throw_if_error(state_->take_result());
  return state_->nbytes();
}

Handle::Handle(const HandleOptions& options) : engine_(std::make_unique<detail::Engine>(options)) {}
Handle::~Handle() = default;

Future Handle::async_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset) {
  return Future(engine_->submit(false, buffer, nbytes, &path, -1, file_offset));
}
Future Handle::async_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                            std::uint64_t file_offset) {
  // The engine never writes through a write op's buffer; the cast only unifies the plumbing.
  return Future(engine_->submit(true, const_cast<void*>(buffer), nbytes, &path, -1, file_offset));
}
Future Handle::async_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset) {
  return Future(engine_->submit(false, buffer, nbytes, nullptr, fd, file_offset));
}
Future Handle::async_pwrite(const void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset) {
  return Future(engine_->submit(true, const_cast<void*>(buffer), nbytes, nullptr, fd, file_offset));
}

std::size_t Handle::sync_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset) {
  async_pread(buffer, nbytes, path, file_offset);
  return wait();
}
std::size_t Handle::sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                                std::uint64_t file_offset) {
  async_pwrite(buffer, nbytes, path, file_offset);
  return wait();
}

std::size_t Handle::wait() { return engine_->wait(); }
std::size_t Handle::pending() const noexcept { return engine_->pending(); }
const HandleOptions& Handle::options() const noexcept { return engine_->options(); }
BackendKind Handle::backend() const noexcept { return engine_->backend(); }
HandleStats Handle::stats() const noexcept { return engine_->stats(); }

}  // namespace deepio
