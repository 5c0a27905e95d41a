// The binding's protocol (binding.hpp) over the engine a Handle owns.
#include "engine/binding.hpp"

#include "engine/engine.hpp"
#include "engine/engine_parts.hpp"
#include "engine/handle_access.hpp"

namespace deepio::detail {

Future submit(Handle& h, bool write, void* buffer, std::size_t nbytes, const std::string* path, int fd,
              std::uint64_t file_offset, OpOptions op, BindingOp binding) {
  return HandleAccess::future(HandleAccess::engine(h).submit(write, buffer, nbytes, path, path != nullptr ? -1 : fd,
                                                             file_offset, std::move(op), std::move(binding)));
}

Future submit_ranges(Handle& h, bool write, void* buffer, std::size_t buffer_bytes, const std::string* path, int fd,
                     std::span<const IoRange> ranges, OpOptions op, BindingOp binding) {
  return HandleAccess::future(HandleAccess::engine(h).submit_ranges(
      write, buffer, buffer_bytes, path, path != nullptr ? -1 : fd, ranges, std::move(op), std::move(binding)));
}

std::vector<Future> submit_batch(Handle& h, std::vector<IoRequest> requests, std::vector<BindingOp> binding) {
  std::vector<Future> futures;
  futures.reserve(requests.size());
  for (auto& op : HandleAccess::engine(h).submit_batch(std::move(requests), std::move(binding))) {
    futures.push_back(HandleAccess::future(std::move(op)));
  }
  return futures;
}

std::shared_ptr<SharedFile> open_file(Handle& h, const std::string& path, int flags, DirectIo direct_io) {
  return HandleAccess::engine(h).open_object(path, flags, direct_io);
}

int file_fd(const SharedFile& file) noexcept { return file.main.get(); }
bool file_direct(const SharedFile& file) noexcept { return file.opened.direct; }

Future submit_file(Handle& h, bool write, void* buffer, std::size_t nbytes, const std::shared_ptr<SharedFile>& file,
                   std::uint64_t file_offset, OpOptions op, BindingOp binding) {
  return HandleAccess::future(
      HandleAccess::engine(h).submit_file(write, buffer, nbytes, file, file_offset, std::move(op), std::move(binding)));
}

Future submit_file_ranges(Handle& h, bool write, void* buffer, std::size_t buffer_bytes,
                          const std::shared_ptr<SharedFile>& file, std::span<const IoRange> ranges, OpOptions op,
                          BindingOp binding) {
  return HandleAccess::future(HandleAccess::engine(h).submit_file_ranges(write, buffer, buffer_bytes, file, ranges,
                                                                         std::move(op), std::move(binding)));
}

StagingPool::Lease lend_staging(Handle& h, std::size_t nbytes) {
  return HandleAccess::engine(h).staging_pool().take(nbytes);
}

Collected collect(Handle& h, const BindingCollect& options) {
  return HandleAccess::engine(h).collect(options,
                                         options.with != nullptr ? HandleAccess::state(*options.with) : nullptr);
}

std::uint64_t mark(const Handle& h) noexcept { return HandleAccess::engine(h).mark(); }

void give_to_wait(const Future& f) noexcept {
  if (const auto& state = HandleAccess::state(f)) state->set_detached(false);
}

void on_done(const Future& f, std::function<void()> fn) {
  const auto& state = HandleAccess::state(f);
  if (!state) throw InvalidArgument("on_done: an empty Future");
  state->stamp().check();
  state->on_done(std::move(fn));
}

}  // namespace deepio::detail
