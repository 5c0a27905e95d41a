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
  if (!parsed) throw_error(EINVAL, std::string(name) + "='" + v + "' is not " + allowed);
  return parsed;
}
}  // namespace

std::optional<BackendKind> env_backend() {
  return read<BackendKind>("DEEPIO_BACKEND", parse_backend, "one of auto, io_uring, libaio, threads");
}

std::optional<DirectIo> env_direct_io() {
  return read<DirectIo>("DEEPIO_DIRECT_IO", parse_direct_io, "one of auto, on, off");
}

std::optional<std::size_t> env_staging_bytes() {
  return read<std::size_t>(
      "DEEPIO_STAGING_BYTES",
      [](const char* v) -> std::optional<std::size_t> {
        char* end = nullptr;
        errno = 0;
        const unsigned long long n = std::strtoull(v, &end, 10);
        if (end == v || errno != 0 || *v == '-') return std::nullopt;
        unsigned shift = 0;
        if (*end == 'K' || *end == 'k') shift = 10;
        if (*end == 'M' || *end == 'm') shift = 20;
        if (*end == 'G' || *end == 'g') shift = 30;
        if (shift != 0) ++end;
        if (*end != '\0') return std::nullopt;
        if (n > (1ull << 30) >> shift) return std::nullopt;
        const std::size_t bytes = static_cast<std::size_t>(n) << shift;
        if (bytes < (std::size_t{64} << 10) || bytes > (std::size_t{1} << 30)) return std::nullopt;
        return bytes;
      },
      "a byte count from 64K to 1G (digits with an optional K, M or G suffix)");
}

}  // namespace deepio::detail
