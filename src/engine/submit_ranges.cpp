// Ranged operations (Handle::async_pread_ranges / async_pwrite_ranges, File::pread_ranges /
// pwrite_ranges): one op over many ranges of one file and one buffer, checked
// (check_ranges), opened once (or not at all, on a file object), planned by plan_ranges() and
// queued like a single request. Device memory is always staged here.
#include <algorithm>
#include <limits>

#include "engine/checks.hpp"
#include "engine/engine_parts.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

std::shared_ptr<OpState> Engine::submit_ranges(bool write, void* buf, std::size_t buffer_bytes, const std::string* path,
                                               int fd, std::span<const IoRange> ranges, OpOptions op_options,
                                               BindingOp binding, const std::shared_ptr<SharedFile>& file) {
  process_.check();
  std::string name = file_name(path, fd);
  const std::uint64_t total = check_ranges(write, buf, buffer_bytes, name, ranges);
  const std::uint64_t first = ranges.empty() ? 0 : ranges.front().file_offset;
  auto op = new_op(write, buf, total, std::move(name), first, std::move(op_options), std::move(binding), buffer_bytes);
  Opened opened;
  std::uint64_t size = 0;
  open_op(*op, path, fd, file, &opened, &size);
  if (!write) {
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const IoRange& r = ranges[i];
      if (r.nbytes == 0 || r.file_offset + r.nbytes <= size) continue;
      if (file && (size = size_for(*file, r.file_offset + r.nbytes)) >= r.file_offset + r.nbytes) continue;
      throw_error(ENODATA,
                  "range " + std::to_string(i) + " reads past end of file: the file holds " + std::to_string(size) +
                      " bytes, the range ends at " + std::to_string(r.file_offset + r.nbytes),
                  op->path(), r.file_offset, r.nbytes);
    }
  }
  if (write && opened.direct && op->direct_fd() >= 0 && total > options_.block_size &&
      size != std::numeric_limits<std::uint64_t>::max()) {
    // Ranges that tile one span of the file exactly (they cannot overlap, so: no gap) and
    // extend the file are allocated first, as a large single write is (see preallocate):
    // nothing is allocated that the operation does not write.
    std::uint64_t lo = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t hi = 0;
    for (const IoRange& r : ranges) {
      if (r.nbytes == 0) continue;
      lo = std::min(lo, r.file_offset);
      hi = std::max<std::uint64_t>(hi, r.file_offset + r.nbytes);
    }
    if (hi - lo == total && hi > size) preallocate(op->direct_fd(), lo, static_cast<std::size_t>(total));
  }
  // Device memory is staged (no route: a route binds one contiguous range of the buffer).
  queue(op, plan_ranges(plan_input(*op, buf, opened, Route{}), ranges), opened, Route{}, /*tracked=*/false);
  if (file && write && size != std::numeric_limits<std::uint64_t>::max()) {
    // The next request on the file object sees the size this write leaves.
    for (const IoRange& r : ranges) raise_size(file->size, r.file_offset + r.nbytes);
  }
  return op;
}

}  // namespace deepio::detail
