#include "core/env.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "platform/status.hpp"

namespace deepio::detail {

namespace {
template <typename T, typename Parse>
std::optional<T> read(const char* name, Parse parse, const char* allowed) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  auto parsed = parse(v);
  if (!parsed) throw_error(EINVAL, std::string(name) + "='" + v + "' is not one of " + allowed);
  return parsed;
}
}  // namespace

std::optional<BackendKind> env_backend() {
  return read<BackendKind>("DEEPIO_BACKEND", parse_backend, "auto, io_uring, libaio, threads");
}

std::optional<DirectIo> env_direct_io() { return read<DirectIo>("DEEPIO_DIRECT_IO", parse_direct_io, "auto, on, off"); }

}  // namespace deepio::detail
