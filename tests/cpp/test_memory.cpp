#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/memory.hpp"

namespace deepio {
namespace {

TEST(LockedMemory, AllocationIsPageAlignedAndRegistered) {
  LockedBuffer b = allocate_locked(10000);
  ASSERT_NE(b.data, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data) % 4096, 0u);
  EXPECT_EQ(b.nbytes, 10000u);
  std::memset(b.data, 0xab, b.nbytes);  // writable over the whole size
  EXPECT_TRUE(is_pinned(b.data, 10000));
  EXPECT_TRUE(is_pinned(static_cast<char*>(b.data) + 100, 500)) << "views inside count";
  EXPECT_TRUE(is_pinned(static_cast<char*>(b.data) + 9999, 1));
  EXPECT_FALSE(is_pinned(static_cast<char*>(b.data) + 9999, 2)) << "range past the end";
  EXPECT_FALSE(is_pinned(static_cast<char*>(b.data) - 1, 1));
  EXPECT_FALSE(free_locked(static_cast<char*>(b.data) + 4096)) << "a view is not a base";
  EXPECT_TRUE(free_locked(b.data));
  EXPECT_FALSE(free_locked(b.data)) << "double free is refused";
  EXPECT_FALSE(is_pinned(b.data, 1));
}

TEST(LockedMemory, ForeignMemoryIsNotPinned) {
  std::vector<char> v(4096);
  EXPECT_FALSE(is_pinned(v.data(), v.size()));
  EXPECT_FALSE(free_locked(v.data()));
  EXPECT_FALSE(free_locked(nullptr));
}

TEST(LockedMemory, ZeroBytesIsAValidAllocation) {
  LockedBuffer b = allocate_locked(0);
  ASSERT_NE(b.data, nullptr);
  EXPECT_TRUE(free_locked(b.data));
}

TEST(LockedMemory, OverTheMemlockLimitFallsBackToUnlockedAndSaysSo) {
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  if (rl.rlim_cur == RLIM_INFINITY) {
    // Lower the soft limit for this process (allowed without privileges), then restore it.
    rlimit low{1 << 20, rl.rlim_max};
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  }
  rlimit now{};
  getrlimit(RLIMIT_MEMLOCK, &now);
  // Root ignores RLIMIT_MEMLOCK (CAP_IPC_LOCK); then locking a large buffer succeeds.
  LockedBuffer b = allocate_locked(static_cast<std::size_t>(now.rlim_cur) + (4 << 20));
  ASSERT_NE(b.data, nullptr);
  if (b.locked) {
    EXPECT_EQ(b.lock_errno, 0);
  } else {
    EXPECT_TRUE(b.lock_errno == ENOMEM || b.lock_errno == EPERM || b.lock_errno == EAGAIN) << b.lock_errno;
  }
  EXPECT_TRUE(is_pinned(b.data, b.nbytes)) << "registered either way";
  std::memset(b.data, 1, b.nbytes);
  EXPECT_TRUE(free_locked(b.data));
  setrlimit(RLIMIT_MEMLOCK, &rl);
}

TEST(LockedMemory, StatsFollowAllocations) {
  const auto before = locked_memory_stats();
  {
    PinnedBuffer a(8192), c(100);
    const auto during = locked_memory_stats();
    EXPECT_EQ(during.allocations, before.allocations + 2);
    EXPECT_EQ(during.bytes, before.bytes + 8192 + 100);
  }
  EXPECT_EQ(locked_memory_stats().allocations, before.allocations);
}

TEST(LockedMemory, ManyThreadsAllocateAndFree) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) {
        PinnedBuffer b(static_cast<std::size_t>(4096 * (1 + i % 4)));
        static_cast<char*>(b.data())[0] = 1;
        EXPECT_TRUE(is_pinned(b.data(), b.size()));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(LockedMemory, PinnedBufferMoves) {
  PinnedBuffer a(4096);
  void* p = a.data();
  PinnedBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(is_pinned(p, 4096));
  b.reset();
  EXPECT_FALSE(is_pinned(p, 1));
}

}  // namespace
}  // namespace deepio
