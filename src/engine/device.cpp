#include "engine/device.hpp"

#include <mutex>

namespace deepio::detail {

namespace {
std::mutex g_mutex;
DeviceSupport g_override;  // guarded by g_mutex

DeviceSupport default_support() {
  // No GPU layer linked yet: every pointer is host memory.
  return DeviceSupport{[](const void*) { return -1; }, {}};
}
}  // namespace

DeviceSupport device_support() {
  std::lock_guard lock(g_mutex);
  if (g_override.classify) return g_override;
  return default_support();
}

void set_device_support(DeviceSupport support) {
  std::lock_guard lock(g_mutex);
  g_override = std::move(support);
}

}  // namespace deepio::detail
