// The one exception type of deepio's C++ API.
//
// Every failure a caller can cause or meet (missing file, permission, end of file, full disk,
// EIO, bad argument) reaches the caller as deepio::Error: a std::system_error whose code() is
// the errno in std::generic_category(), carrying the path, file offset and size of the
// request that failed. The library never prints, asserts on user input or exits.
//
// An argument deepio itself rejects before doing any I/O (a zero block_size, a negative
// file offset, an unknown backend name) throws deepio::InvalidArgument, an Error with errno
// EINVAL whose invalid_argument() is true; the Python package turns exactly these into
// ValueError. EINVAL from the kernel or a file system (e.g. O_DIRECT refused with
// direct_io=on) is a plain Error with invalid_argument() false.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "deepio/export.hpp"

namespace deepio {

class DEEPIO_API Error : public std::system_error {
 public:
  /// `errnum` is a positive errno value. `message` says what was attempted; path, offset and
  /// nbytes identify the request (empty path / zero when they do not apply).
  Error(int errnum, const std::string& message, std::string path = {}, std::uint64_t offset = 0,
        std::uint64_t nbytes = 0);

  /// The errno value (same as code().value()).
  [[nodiscard]] int errnum() const noexcept { return code().value(); }
  /// The file the failed request named; empty when none.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// File offset of the part of the request that failed.
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  /// Size in bytes of the part of the request that failed.
  [[nodiscard]] std::uint64_t nbytes() const noexcept { return nbytes_; }
  /// The message without the strerror suffix that what() appends.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  /// True when deepio rejected an argument of the call (see InvalidArgument); survives copies
  /// into an Error.
  [[nodiscard]] bool invalid_argument() const noexcept { return invalid_argument_; }
  /// True when the handle was used in a process other than the one that created it (see
  /// ForkedHandle); survives copies into an Error.
  [[nodiscard]] bool forked_handle() const noexcept { return forked_handle_; }

 protected:
  bool invalid_argument_ = false;
  bool forked_handle_ = false;

 private:
  std::string message_;
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t nbytes_;
};

/// A bad argument, found by deepio's own checks before any I/O: errno EINVAL, a message that
/// names the parameter and the value, invalid_argument() true.
class DEEPIO_API InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message, std::string path = {}, std::uint64_t offset = 0,
                           std::uint64_t nbytes = 0)
      : Error(EINVAL, message, std::move(path), offset, nbytes) {
    invalid_argument_ = true;
  }
};

/// A handle (its workers, rings and descriptors belong to the process that created it) was
/// used in another process: a child made by fork(), which inherits no threads. Thrown at once
/// by every submission and wait in the child, with errno EBADF and both process ids in the
/// message; the parent's rings and descriptors are not touched. Make a new handle in the child.
class DEEPIO_API ForkedHandle : public Error {
 public:
  ForkedHandle(long creator_pid, long current_pid);
};

/// Receives the failure of an operation that nobody can observe any more: an operation
/// nobody collected when its handle was destroyed, or one of the Python binding's that
/// belongs to its Future alone (deepio.File's, a batch's with futures) whose every Future was
/// destroyed before anyone asked for its result. Called
/// once per such failure, on whichever thread made it unobservable (a worker finishing the
/// operation, the thread destroying the last Future or the handle), with no deepio lock held.
/// It must not throw and should return quickly; it must not call into the handle.
using UnobservedFailureHandler = void (*)(const Error& error) noexcept;

/// Installs `handler` for the whole process and returns the previous one; nullptr restores
/// the default, which writes one line to stderr ("deepio: failure nobody collected: ...").
/// Thread-safe. A failure is never dropped silently: this is where the ones nobody waited
/// for go.
DEEPIO_API UnobservedFailureHandler set_unobserved_failure_handler(UnobservedFailureHandler handler) noexcept;

}  // namespace deepio
