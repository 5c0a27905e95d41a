#include "platform/process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include "deepio/error.hpp"

namespace deepio::detail {

namespace {
std::atomic<std::uint64_t> g_generation{0};

void on_fork_child() noexcept { g_generation.fetch_add(1, std::memory_order_relaxed); }

std::uint64_t generation() noexcept {
  // Registered by the first stamp: a fork before any exists has nothing to invalidate.
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &on_fork_child) == 0;
  (void)registered;  // without the handler every stamp stays valid, as before this check
  return g_generation.load(std::memory_order_relaxed);
}
}  // namespace

ProcessStamp::ProcessStamp() noexcept : generation_(generation()), pid_(static_cast<long>(::getpid())) {}

bool ProcessStamp::here() const noexcept { return g_generation.load(std::memory_order_relaxed) == generation_; }

void ProcessStamp::check() const {
  if (!here()) throw ForkedHandle(pid_, static_cast<long>(::getpid()));
}

}  // namespace deepio::detail
