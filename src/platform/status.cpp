#include "platform/status.hpp"

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

namespace detail {

void throw_if_error(const Status& status) {
  if (!status.ok()) throw_error(status.errnum, status.message, status.path, status.offset, status.nbytes);
}

void throw_error(int errnum, const std::string& message, const std::string& path, std::uint64_t offset,
                 std::uint64_t nbytes) {
  throw Error(errnum, message, path, offset, nbytes);
}

}  // namespace detail
}  // namespace deepio
