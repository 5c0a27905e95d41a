#include "platform/fault.hpp"

#include <atomic>
#include <memory>
#include <mutex>

#include "platform/process.hpp"

namespace deepio::detail {

namespace {
std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::shared_ptr<const FaultHook> g_hook;  // guarded by g_mutex

// Held across every fork (platform/process.hpp): a child never inherits it locked.
void lock_for_fork() noexcept { g_mutex.lock(); }
void unlock_for_fork() noexcept { g_mutex.unlock(); }
[[maybe_unused]] const bool g_fork_lock = register_fork_lock(ForkLockRank::kFaultHook,
                                                             {&lock_for_fork, &unlock_for_fork});
}  // namespace

void set_fault_hook(FaultHook hook) {
  std::lock_guard lock(g_mutex);
  if (hook) {
    g_hook = std::make_shared<const FaultHook>(std::move(hook));
    g_enabled.store(true, std::memory_order_release);
  } else {
    g_hook.reset();
    g_enabled.store(false, std::memory_order_release);
  }
}

std::optional<std::int64_t> consult_fault_hook(const FaultSite& site) {
  if (!g_enabled.load(std::memory_order_acquire)) return std::nullopt;
  std::shared_ptr<const FaultHook> hook;
  {
    std::lock_guard lock(g_mutex);
    hook = g_hook;
  }
  if (!hook) return std::nullopt;
  return (*hook)(site);
}

}  // namespace deepio::detail
