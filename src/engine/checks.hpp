// The argument checks a submission gets before anything is created: pure functions of their
// arguments (no engine state), each either returning or throwing the error the caller sees.
//
// Errors: a rejected argument throws deepio::InvalidArgument (errno EINVAL); a range past what
// a file offset can hold throws deepio::Error with EOVERFLOW. Messages name what was wrong and
// the value as the caller most likely wrote it (as_written). Nothing here allocates on the
// accepting path except check_ranges() with unsorted ranges (one sort). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "deepio/handle.hpp"

namespace deepio::detail {

/// The largest count or offset a caller can mean: 2^63 - 1 (a signed 64-bit integer).
inline constexpr std::size_t kMaxCount = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());

/// `v` as its caller most likely wrote it: callers that take signed integers (the Python
/// binding) pass a negative number through as a huge unsigned one, shown negative again.
std::string as_written(std::uint64_t v);

/// The one check of a count option (block_size, queue_depth, ...): positive and at most `max`.
/// Throws InvalidArgument "<name> must be a positive integer[ of at most <max>], got <value>".
void check_count(const char* name, std::size_t value, std::size_t max);

/// The name errors carry for a request: the path, or "fd <n>" when path is null.
std::string file_name(const std::string* path, int fd);

/// One request: a buffer unless nbytes is 0 (InvalidArgument "null buffer"), a file offset
/// that is non-negative as written (InvalidArgument), and file_offset + nbytes within off_t
/// (EOVERFLOW).
void check_request(const void* buf, std::size_t nbytes, const std::string& name, std::uint64_t file_offset);

/// Whether check_request() would accept the request (no message, no allocation).
bool request_valid(const void* buf, std::size_t nbytes, std::uint64_t file_offset) noexcept;

/// check_request() with `where` ("request 3 of the batch: ", "range 5: ") before its message;
/// the error keeps its kind (InvalidArgument or not), errno, path, offset and size.
void check_request_at(const std::string& where, const void* buf, std::size_t nbytes, const std::string& name,
                      std::uint64_t file_offset);

/// A ranged operation (Handle::async_pread_ranges / async_pwrite_ranges): returns the sum of
/// the ranges' sizes. Each range lies inside the buffer of `buffer_bytes` and passes
/// check_request() ("range <i>: ..."); the sizes add up to at most 2^63 - 1 (EOVERFLOW); no
/// two non-empty ranges overlap in the bytes they fill: the buffer's for a read, the file's
/// for a write ("ranges <a> and <b> overlap in the ..."). Costs no allocation when the ranges
/// come sorted by those bytes, and one sort when they do not.
std::uint64_t check_ranges(bool write, const void* buf, std::size_t buffer_bytes, const std::string& name,
                           std::span<const IoRange> ranges);

/// A batch (Handle::submit_batch), every request before any is submitted: exactly one of
/// path and fd names each file, fsync only on writes, and check_request(); a refusal names
/// the request ("request <i> of the batch: ..."). The common case makes no string.
void check_batch(std::span<const IoRequest> requests);

}  // namespace deepio::detail
