#include "platform/process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>

#include "deepio/error.hpp"

namespace deepio::detail {

namespace {
constexpr auto kRanks = static_cast<std::size_t>(ForkLockRank::kCount);

std::atomic<std::uint64_t> g_generation{0};
// This process's id once asked (0: not yet, or a fork since): a stamp is made per engine
// operation, and getpid(2) is a system call each time. Only with the handlers installed, whose
// child handler resets it.
std::atomic<long> g_pid{0};
std::atomic<bool> g_installed{false};
// Constant-initialised: registrations from other translation units' static initialisers may
// run before this one's.
std::array<std::atomic<void (*)() noexcept>, kRanks> g_lock{};
std::array<std::atomic<void (*)() noexcept>, kRanks> g_unlock{};
// Which ranks the prepare handler took, for the parent and child handlers (a rank registered
// between prepare and fork must not be released unheld).
std::array<bool, kRanks> g_taken{};

void on_fork_prepare() noexcept {
  for (std::size_t i = 0; i < kRanks; ++i) {
    auto* lock = g_lock[i].load(std::memory_order_acquire);
    g_taken[i] = lock != nullptr && g_unlock[i].load(std::memory_order_acquire) != nullptr;
    if (g_taken[i]) lock();
  }
}

void release_taken() noexcept {
  for (std::size_t i = kRanks; i-- > 0;) {
    if (!g_taken[i]) continue;
    g_taken[i] = false;
    g_unlock[i].load(std::memory_order_acquire)();
  }
}

void on_fork_parent() noexcept { release_taken(); }

void on_fork_child() noexcept {
  g_pid.store(0, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_relaxed);
  release_taken();
}

void install_handlers() noexcept {
  // Without the handlers every stamp stays valid and no lock is taken at a fork, as before
  // these checks existed: nothing else to do if the registration fails (ENOMEM).
  static const bool installed = [] {
    const bool ok = ::pthread_atfork(&on_fork_prepare, &on_fork_parent, &on_fork_child) == 0;
    g_installed.store(ok, std::memory_order_relaxed);
    return ok;
  }();
  (void)installed;
}

long current_pid() noexcept {
  long pid = g_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  pid = static_cast<long>(::getpid());
  if (g_installed.load(std::memory_order_relaxed)) g_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

std::uint64_t generation() noexcept {
  install_handlers();  // by the first stamp at the latest: a fork before any has nothing to invalidate
  return g_generation.load(std::memory_order_relaxed);
}
}  // namespace

ProcessStamp::ProcessStamp() noexcept : generation_(generation()), pid_(current_pid()) {}

bool ProcessStamp::here() const noexcept { return g_generation.load(std::memory_order_relaxed) == generation_; }

void ProcessStamp::check() const {
  if (!here()) throw ForkedHandle(pid_, static_cast<long>(::getpid()));
}

bool register_fork_lock(ForkLockRank rank, ForkLock fns) noexcept {
  install_handlers();
  const auto i = static_cast<std::size_t>(rank);
  // unlock before lock: the prepare handler takes a rank only once both are set.
  g_unlock[i].store(fns.unlock, std::memory_order_release);
  g_lock[i].store(fns.lock, std::memory_order_release);
  return true;
}

ForkLock registered_fork_lock(ForkLockRank rank) noexcept {
  const auto i = static_cast<std::size_t>(rank);
  return {g_lock[i].load(std::memory_order_acquire), g_unlock[i].load(std::memory_order_acquire)};
}

}  // namespace deepio::detail
