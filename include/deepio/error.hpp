// The one exception type of deepio's C++ API.
//
// Every failure a caller can cause or meet (missing file, permission, end of file, full disk,
// EIO, bad argument) reaches the caller as deepio::Error: a std::system_error whose code() is
// the errno in std::generic_category(), carrying the path, file offset and size of the
// request that failed. The library never prints, asserts on user input or exits.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

namespace deepio {

class Error : public std::system_error {
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

 private:
  std::string message_;
  std::string path_;
  std::uint64_t offset_;
  std::uint64_t nbytes_;
};

}  // namespace deepio
