// Fork is a normal event: a child made by a real fork() never hangs on what it inherited.
// A Future of the parent's refuses at once in the child (whatever its operation's state), and
// a fork while another thread holds any process-wide lock of the engine (the locked-memory
// registry and its listeners, the CUDA fence pools, the device support, the fault hook)
// leaves a child whose own engine works. Each child runs under alarm(): a hang becomes
// SIGALRM (exit 214), not a stuck test.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "deepio/memory.hpp"
#include "engine/device.hpp"
#include "platform/fault.hpp"
#include "platform/process.hpp"

namespace deepio {
namespace {

#if defined(__SANITIZE_THREAD__)
// TSan kills a child that starts threads after a fork of a multi-threaded process
// (die_after_fork): the children here then only take the locks, without making an engine.
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

using detail::ForkLock;
using detail::ForkLockRank;
using test::in_child;
using test::pattern;

// Holds every write of the engine on its worker (after the kernel call) until released.
class HeldWrites {
 public:
  HeldWrites() {
    detail::set_fault_hook([this](const detail::FaultSite& site) -> std::optional<std::int64_t> {
      if (site.point != detail::FaultPoint::Write) return std::nullopt;
      entered_.store(true);
      while (!released_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return std::nullopt;
    });
  }
  ~HeldWrites() {
    release();
    detail::set_fault_hook({});
  }
  HeldWrites(const HeldWrites&) = delete;
  HeldWrites& operator=(const HeldWrites&) = delete;
  void wait_entered() const {
    while (!entered_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void release() { released_.store(true); }

 private:
  std::atomic<bool> entered_{false};
  std::atomic<bool> released_{false};
};

// Runs `call` in the child; 0 if it threw ForkedHandle (EBADF). "At once" needs no clock: the
// parent's operation never finishes in the child (its worker is in the parent, and the parent
// holds it until the child is gone), so a call that waited for it at all would wait until
// its own 30 s limit or for ever, past the child's alarm (exit 214).
template <typename Call>
int refuses_at_once(Call call) {
  try {
    call();
    return 1;
  } catch (const Error& e) {
    if (!e.forked_handle() || e.errnum() != EBADF) return 2;
  }
  return 0;
}

TEST(ForkedFuture, EveryWaitInTheChildRefusesAtOnceWhileTheParentsOperationRuns) {
  test::TempDir dir;
  const auto data = pattern(1 << 16, 3);
  const std::string path = dir.file("f");
  Handle h({.intra_op_parallelism = 1});
  HeldWrites held;
  Future running = h.async_pwrite(data.data(), data.size(), path);
  held.wait_entered();  // in flight: its worker is in the parent only
  const int code = in_child([&] {
    ::alarm(10);
    if (int r = refuses_at_once([&] { running.wait(); }); r != 0) return 10 + r;
    if (int r = refuses_at_once([&] { (void)running.wait_for(std::chrono::seconds(30)); }); r != 0) return 20 + r;
    if (int r = refuses_at_once([&] { (void)running.get(); }); r != 0) return 30 + r;
    if (int r = refuses_at_once([&] { (void)running.done(); }); r != 0) return 40 + r;
    {
      const Future copy = running;  // copies and drops in the child touch nothing of the parent's
      if (int r = refuses_at_once([&] { copy.wait(); }); r != 0) return 50 + r;
    }
    running = Future();
    return 0;
  });
  EXPECT_EQ(code, 0);
  held.release();
  EXPECT_EQ(running.get(), data.size());  // the parent's operation is untouched
}

TEST(ForkedFuture, AFinishedOperationsFutureRefusesInTheChildToo) {
  test::TempDir dir;
  const auto data = pattern(4096, 4);
  Handle h;
  Future done = h.async_pwrite(data.data(), data.size(), dir.file("f"));
  ASSERT_EQ(done.get(), data.size());
  const int code = in_child([&] {
    ::alarm(10);
    if (int r = refuses_at_once([&] { (void)done.get(); }); r != 0) return 10 + r;
    if (int r = refuses_at_once([&] { done.wait(); }); r != 0) return 20 + r;
    return 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(done.done());
}

// In the child: every registered process-wide lock is free (taking one that a parent thread
// held at the fork would hang), and, where a child may start threads, an engine of its own
// reads the file back and locked memory comes and goes.
int child_works(const std::string& path, const std::vector<std::byte>& data) {
  ::alarm(10);
  for (int rank = 0; rank < static_cast<int>(ForkLockRank::kCount); ++rank) {
    const ForkLock fns = detail::registered_fork_lock(static_cast<ForkLockRank>(rank));
    if (fns.lock == nullptr) continue;
    fns.lock();
    fns.unlock();
  }
  (void)detail::device_support();
  LockedBuffer b = allocate_locked(4096);
  if (!is_locked(b.data, 4096)) return 10;
  if (!free_locked(b.data)) return 11;
  if (kThreadSanitizer) return 0;
  Handle mine;
  std::vector<std::byte> back(data.size());
  if (mine.sync_pread(back.data(), back.size(), path) != 1 || back != data) return 20;
  return 0;
}

class ForkLocks : public ::testing::TestWithParam<ForkLockRank> {};

TEST_P(ForkLocks, AForkWhileAnotherThreadHoldsTheLockLeavesAWorkingChild) {
  const ForkLock fns = detail::registered_fork_lock(GetParam());
  if (fns.lock == nullptr) GTEST_SKIP() << "nothing registered for this rank in this build";
  test::TempDir dir;
  const auto data = pattern(1 << 16, 5);
  const std::string path = dir.file("f");
  test::put(path, data);
  std::atomic<bool> holding{false};
  std::atomic<bool> forked{false};
  std::thread holder([&] {
    fns.lock();
    holding.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the fork comes meanwhile
    fns.unlock();
    // Alive until the child is gone: under TSan a thread that finished unjoined before the
    // fork is reported as leaked by the child.
    while (!forked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!holding.load()) std::this_thread::yield();
  const int code = in_child([&] { return child_works(path, data); });
  forked.store(true);
  holder.join();
  EXPECT_EQ(code, 0) << "214: the child hung";
}

std::string rank_name(const ::testing::TestParamInfo<ForkLockRank>& rank) {
  switch (rank.param) {
    case ForkLockRank::kDeviceSupport: return "DeviceSupport";
    case ForkLockRank::kFencePools: return "FencePools";
    case ForkLockRank::kLockedListeners: return "LockedListeners";
    case ForkLockRank::kLockedRegistry: return "LockedRegistry";
    default: return "FaultHook";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ForkLocks,
                         ::testing::Values(ForkLockRank::kDeviceSupport, ForkLockRank::kFencePools,
                                           ForkLockRank::kLockedListeners, ForkLockRank::kLockedRegistry,
                                           ForkLockRank::kFaultHook),
                         rank_name);

}  // namespace
}  // namespace deepio
