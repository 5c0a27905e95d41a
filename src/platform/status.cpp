#include "platform/status.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "deepio/error.hpp"
#include "platform/sys.hpp"

namespace deepio {

namespace {
std::string full_message(int errnum, const std::string& message, const std::string& path, std::uint64_t offset,
                         std::uint64_t nbytes) {
  std::string s = message;
  if (!path.empty()) s += " '" + path + "'";
  if (nbytes != 0 || offset != 0) {
    s += " (offset " + std::to_string(offset) + ", " + std::to_string(nbytes) + " bytes)";
  }
  (void)errnum;
  return s;
}
}  // namespace

Error::Error(int errnum, const std::string& message, std::string path, std::uint64_t offset, std::uint64_t nbytes)
    : std::system_error(errnum, std::generic_category(), full_message(errnum, message, path, offset, nbytes)),
      message_(message),
      path_(std::move(path)),
      offset_(offset),
      nbytes_(nbytes) {}

ForkedHandle::ForkedHandle(long creator_pid, long current_pid)
    : Error(EBADF, "this deepio handle was created in process " + std::to_string(creator_pid) +
                       " before a fork and cannot be used in process " + std::to_string(current_pid) +
                       " (its worker threads stayed in the parent); make a new handle in the child") {
  forked_handle_ = true;
}

namespace {
void print_unobserved(const Error& error) noexcept {
  // One write(2) of one line: no stdio lock (a forked child, a signal-heavy program), and
  // lines from several threads never interleave.
  std::string line;
  try {
    line = std::string("deepio: failure nobody collected: ") + error.what() + "\n";
  } catch (...) {
    return;
  }
  ssize_t r;
  do {
    r = ::write(STDERR_FILENO, line.data(), line.size());
  } while (r < 0 && errno == EINTR);
}

std::atomic<UnobservedFailureHandler> g_unobserved{&print_unobserved};
}  // namespace

UnobservedFailureHandler set_unobserved_failure_handler(UnobservedFailureHandler handler) noexcept {
  return g_unobserved.exchange(handler != nullptr ? handler : &print_unobserved);
}

namespace detail {

void report_unobserved(const Status& status) noexcept {
  if (status.ok()) return;
  try {
    const Error e(status.errnum, status.message, status.path, status.offset, status.nbytes);
    g_unobserved.load()(e);
  } catch (...) {  // std::bad_alloc building the message: nothing else can be done
  }
}

void throw_if_error(const Status& status) {
  if (!status.ok()) throw_error(status.errnum, status.message, status.path, status.offset, status.nbytes);
}

void throw_error(int errnum, const std::string& message, const std::string& path, std::uint64_t offset,
                 std::uint64_t nbytes) {
  throw Error(errnum, message, path, offset, nbytes);
}

}  // namespace detail
}  // namespace deepio
