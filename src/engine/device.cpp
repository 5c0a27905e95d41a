#include "engine/device.hpp"

#include <mutex>

#include "platform/process.hpp"

#if DEEPIO_HAVE_GPU
#include "engine/cuda_stager.hpp"
#endif

namespace deepio::detail {

namespace {
std::mutex g_mutex;
DeviceSupport g_override;  // guarded by g_mutex

// Held across every fork (platform/process.hpp): a child never inherits it locked.
void lock_for_fork() noexcept { g_mutex.lock(); }
void unlock_for_fork() noexcept { g_mutex.unlock(); }
[[maybe_unused]] const bool g_fork_lock = register_fork_lock(ForkLockRank::kDeviceSupport,
                                                             {&lock_for_fork, &unlock_for_fork});

DeviceSupport default_support() {
#if DEEPIO_HAVE_GPU
  return cuda_device_support();
#else
  // Built without the GPU layer: every pointer is host memory.
  return DeviceSupport{[](const void*) { return -1; }, {}, {}};
#endif
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
