#include "deepio/options.hpp"

namespace deepio {

namespace {
constexpr std::string_view kBackendNames[] = {"auto", "io_uring", "libaio", "threads"};
constexpr std::string_view kDirectNames[] = {"auto", "on", "off"};
constexpr std::string_view kRouteNames[] = {"auto", "staged", "gds"};
}  // namespace

std::string_view to_string(BackendKind kind) noexcept { return kBackendNames[static_cast<int>(kind)]; }
std::optional<BackendKind> parse_backend(std::string_view name) noexcept {
  for (int i = 0; i < 4; ++i) {
    if (kBackendNames[i] == name) return static_cast<BackendKind>(i);
  }
  if (name == "uring" || name == "iouring") return BackendKind::IoUring;
  if (name == "aio") return BackendKind::Libaio;
  return std::nullopt;
}
std::string_view to_string(DirectIo mode) noexcept { return kDirectNames[static_cast<int>(mode)]; }
std::optional<DirectIo> parse_direct_io(std::string_view name) noexcept {
  for (int i = 0; i < 3; ++i) {
    if (kDirectNames[i] == name) return static_cast<DirectIo>(i);
  }
  return std::nullopt;
}
std::string_view to_string(DeviceRouteMode mode) noexcept { return kRouteNames[static_cast<int>(mode)]; }
std::optional<DeviceRouteMode> parse_device_route(std::string_view name) noexcept {
  for (int i = 0; i < 3; ++i) {
    if (kRouteNames[i] == name) return static_cast<DeviceRouteMode>(i);
  }
  return std::nullopt;
}

}  // namespace deepio
