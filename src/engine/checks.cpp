// The argument checks of the engine's submissions (see checks.hpp): pure, and cheap when the
// arguments are fine (the messages are made only for a refusal).
#include "engine/checks.hpp"

#include <sys/types.h>

#include <algorithm>
#include <vector>

#include "deepio/error.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

std::string as_written(std::uint64_t v) {
  return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
             ? std::to_string(static_cast<std::int64_t>(v))
             : std::to_string(v);
}

void check_count(const char* name, std::size_t value, std::size_t max) {
  if (value != 0 && value <= max) return;
  throw InvalidArgument(std::string(name) + " must be a positive integer" +
                        (max < kMaxCount ? " of at most " + std::to_string(max) : std::string()) + ", got " +
                        as_written(value));
}

std::string file_name(const std::string* path, int fd) { return path != nullptr ? *path : "fd " + std::to_string(fd); }

void check_request(const void* buf, std::size_t nbytes, const std::string& name, std::uint64_t file_offset) {
  if (buf == nullptr && nbytes > 0) throw InvalidArgument("null buffer", name, file_offset, nbytes);
  if (file_offset > kMaxCount) {
    throw InvalidArgument("file_offset must be non-negative, got " + as_written(file_offset), name);
  }
  if (file_offset > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - nbytes) {
    throw_error(EOVERFLOW, "file_offset + nbytes overflows a file offset", name, file_offset, nbytes);
  }
}

bool request_valid(const void* buf, std::size_t nbytes, std::uint64_t file_offset) noexcept {
  return (buf != nullptr || nbytes == 0) && file_offset <= kMaxCount &&
         file_offset <= static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - nbytes;
}

void check_request_at(const std::string& where, const void* buf, std::size_t nbytes, const std::string& name,
                      std::uint64_t file_offset) {
  try {
    check_request(buf, nbytes, name, file_offset);
  } catch (const Error& e) {
    if (e.invalid_argument()) throw InvalidArgument(where + e.message(), e.path(), e.offset(), e.nbytes());
    throw Error(e.errnum(), where + e.message(), e.path(), e.offset(), e.nbytes());
  }
}

std::uint64_t check_ranges(bool write, const void* buf, std::size_t buffer_bytes, const std::string& name,
                           std::span<const IoRange> ranges) {
  const auto where = [](std::size_t i) { return "range " + std::to_string(i) + ": "; };
  std::uint64_t total = 0;
  bool sorted = true;
  std::uint64_t last_end = 0;  // end of the previous non-empty range, in the checked space
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const IoRange& r = ranges[i];
    if (r.buffer_offset > buffer_bytes || r.nbytes > buffer_bytes - r.buffer_offset) {
      throw InvalidArgument(where(i) + "buffer bytes [" + as_written(r.buffer_offset) + ", +" + as_written(r.nbytes) +
                                ") lie outside the buffer of " + std::to_string(buffer_bytes) + " bytes",
                            name, r.file_offset, r.nbytes);
    }
    if (!request_valid(buf, r.nbytes, r.file_offset)) check_request_at(where(i), buf, r.nbytes, name, r.file_offset);
    if (r.nbytes > kMaxCount - total) {
      throw_error(EOVERFLOW, where(i) + "the ranges' sizes add up to more than 2^63 - 1 bytes", name, r.file_offset,
                  r.nbytes);
    }
    total += r.nbytes;
    if (r.nbytes == 0) continue;
    const std::uint64_t start = write ? r.file_offset : r.buffer_offset;
    if (start < last_end) sorted = false;
    last_end = start + r.nbytes;
  }
  if (sorted) return total;
  struct Span {
    std::uint64_t start, end;
    std::size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const IoRange& r = ranges[i];
    const std::uint64_t start = write ? r.file_offset : r.buffer_offset;
    if (r.nbytes > 0) spans.push_back({start, start + r.nbytes, i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  for (std::size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].start >= spans[k - 1].end) continue;
    const std::size_t a = std::min(spans[k - 1].index, spans[k].index);
    const std::size_t b = std::max(spans[k - 1].index, spans[k].index);
    throw InvalidArgument("ranges " + std::to_string(a) + " and " + std::to_string(b) +
                              (write ? " overlap in the file (which write lands last would be unspecified)"
                                     : " overlap in the buffer (a read would fill the same bytes twice)"),
                          name);
  }
  return total;
}

void check_batch(std::span<const IoRequest> requests) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    // The common case costs no string: the message is made only for a refused request.
    if (r.path.empty() != (r.fd < 0) && !(r.op.fsync && !r.write) && request_valid(r.buffer, r.nbytes, r.file_offset)) {
      continue;
    }
    const std::string where = "request " + std::to_string(i) + " of the batch: ";
    if (r.path.empty() == (r.fd < 0)) {
      throw InvalidArgument(where + "exactly one of path and fd must name the file");
    }
    if (r.op.fsync && !r.write) throw InvalidArgument(where + "fsync applies to writes only");
    check_request_at(where, r.buffer, r.nbytes, file_name(r.path.empty() ? nullptr : &r.path, r.fd), r.file_offset);
  }
}

}  // namespace deepio::detail
