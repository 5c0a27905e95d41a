// Internal error value: errno + what was attempted + which request. Cheap when ok.
// Converted to deepio::Error at the public API boundary (to_error / throw_if_error).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace deepio::detail {

/// [[nodiscard]]: a Status nobody looks at is an error nobody hears about.
struct [[nodiscard]] Status {
  int errnum = 0;  ///< 0: success; otherwise a positive errno value
  std::string message;
  std::string path;
  std::uint64_t offset = 0;
  std::uint64_t nbytes = 0;

  [[nodiscard]] bool ok() const noexcept { return errnum == 0; }
  static Status success() { return {}; }
  static Status failure(int errnum, std::string message, std::string path = {}, std::uint64_t offset = 0,
                        std::uint64_t nbytes = 0) {
    return Status{errnum, std::move(message), std::move(path), offset, nbytes};
  }
};

/// Throws deepio::Error built from a failed status; does nothing for success.
void throw_if_error(const Status& status);
/// Hands a failure nobody can observe any more to the process's UnobservedFailureHandler
/// (deepio/error.hpp). Call with no lock held. Does nothing for success.
void report_unobserved(const Status& status) noexcept;
[[noreturn]] void throw_error(int errnum, const std::string& message, const std::string& path = {},
                              std::uint64_t offset = 0, std::uint64_t nbytes = 0);

}  // namespace deepio::detail
