// File objects: deepio::File (Handle::open) and the engine's side of them, open_object (in
// open.cpp) and submit_file. A file object is a SharedFile opened once; its operations go
// through start() and submit_ranges() as a batch's requests on a shared file do (open_op
// hands the op the shared descriptors and its facts), so they are planned, queued, tracked,
// collected and counted exactly as path operations, minus the open, statx and close — and,
// on device memory through the route, minus the cuFile registration: start() hands
// bind_route() the file object, whose SharedFile::route_slot keeps the registration from its
// first device operation until the SharedFile goes (before its descriptors close). On io_uring
// its descriptors are registered files of the workers' rings (SharedFile::fixed_main and
// fixed_buffered, core/fixed_files.hpp), taken out of every ring when the SharedFile goes.
// Thread safety: see deepio::File (include/deepio/handle.hpp); SharedFile::size is atomic,
// route_slot has its own mutex.
#include <fcntl.h>

#include "engine/checks.hpp"
#include "engine/engine_parts.hpp"
#include "engine/handle_access.hpp"
#include "platform/status.hpp"
#include "platform/sys.hpp"

namespace deepio {

namespace detail {

namespace {
// A read of a write-only file or a write of a read-only one: refused at submission, as
// pread(2)/pwrite(2) would refuse every request of it.
void check_access(const SharedFile& file, bool write, std::uint64_t file_offset, std::size_t nbytes) {
  const bool ok = write ? file.access != O_RDONLY : file.access != O_WRONLY;
  if (!ok) {
    throw_error(EBADF, write ? "the file was opened for reading only" : "the file was opened for writing only",
                file.path, file_offset, nbytes);
  }
}
}  // namespace

std::shared_ptr<OpState> Engine::submit_file(bool write, void* buf, std::size_t nbytes,
                                             const std::shared_ptr<SharedFile>& file, std::uint64_t file_offset,
                                             OpOptions op_options, BindingOp binding) {
  process_.check();
  check_request(buf, nbytes, file->path, file_offset);
  check_access(*file, write, file_offset, nbytes);
  auto op = new_op(write, buf, nbytes, file->path, file_offset, std::move(op_options), std::move(binding), nbytes);
  start(op, buf, &file->path, -1, /*tracked=*/false, file);
  return op;
}

std::shared_ptr<OpState> Engine::submit_file_ranges(bool write, void* buf, std::size_t buffer_bytes,
                                                    const std::shared_ptr<SharedFile>& file,
                                                    std::span<const IoRange> ranges, OpOptions op_options,
                                                    BindingOp binding) {
  check_access(*file, write, ranges.empty() ? 0 : ranges.front().file_offset, 0);
  return submit_ranges(write, buf, buffer_bytes, &file->path, -1, ranges, std::move(op_options), std::move(binding),
                       file);
}

}  // namespace detail

File Handle::open(const std::string& path, int flags, std::optional<DirectIo> direct_io) {
  return File(engine_.get(), engine_->open_object(path, flags, direct_io.value_or(engine_->options().direct_io)));
}

File::File() noexcept = default;
File::File(detail::Engine* engine, std::shared_ptr<detail::SharedFile> file) noexcept
    : engine_(engine), file_(std::move(file)) {}
File::File(File&& other) noexcept = default;
File& File::operator=(File&& other) noexcept = default;
File::~File() = default;

void File::check_open() const {
  if (!file_) throw InvalidArgument("operation on a File that is not open");
}

const std::string& File::path() const noexcept {
  static const std::string none;
  return file_ ? file_->path : none;
}
int File::fd() const noexcept { return file_ ? file_->main.get() : -1; }
bool File::direct() const noexcept { return file_ && file_->opened.direct; }

Future File::pread(void* buffer, std::size_t nbytes, std::uint64_t file_offset, OpOptions op) {
  check_open();
  return detail::HandleAccess::future(engine_->submit_file(false, buffer, nbytes, file_, file_offset, std::move(op)));
}
Future File::pwrite(const void* buffer, std::size_t nbytes, std::uint64_t file_offset, OpOptions op) {
  check_open();
  // The engine never writes through a write op's buffer; the cast only unifies the plumbing.
  return detail::HandleAccess::future(
      engine_->submit_file(true, const_cast<void*>(buffer), nbytes, file_, file_offset, std::move(op)));
}
Future File::pread_ranges(void* buffer, std::size_t buffer_bytes, std::span<const IoRange> ranges, OpOptions op) {
  check_open();
  return detail::HandleAccess::future(
      engine_->submit_file_ranges(false, buffer, buffer_bytes, file_, ranges, std::move(op)));
}
Future File::pwrite_ranges(const void* buffer, std::size_t buffer_bytes, std::span<const IoRange> ranges,
                           OpOptions op) {
  check_open();
  return detail::HandleAccess::future(
      engine_->submit_file_ranges(true, const_cast<void*>(buffer), buffer_bytes, file_, ranges, std::move(op)));
}

std::uint64_t File::size() const {
  check_open();
  detail::SharedFile& f = *file_;
  detail::FileFacts facts;
  detail::throw_if_error(detail::file_facts(f.main.get(), f.path, &facts));
  if (facts.sized()) detail::raise_size(f.size, facts.size);
  return facts.size;
}

void File::close() noexcept {
  file_.reset();
  engine_ = nullptr;
}

}  // namespace deepio
