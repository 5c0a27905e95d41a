#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/memory.hpp"
#include "memory/regions.hpp"

namespace deepio {
namespace {

TEST(LockedMemory, AllocationIsPageAlignedAndRegistered) {
  LockedBuffer b = allocate_locked(10000);
  ASSERT_NE(b.data, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data) % 4096, 0u);
  EXPECT_EQ(b.nbytes, 10000u);
  std::memset(b.data, 0xab, b.nbytes);  // writable over the whole size
  EXPECT_TRUE(is_locked(b.data, 10000));
  EXPECT_TRUE(is_locked(static_cast<char*>(b.data) + 100, 500)) << "views inside count";
  EXPECT_TRUE(is_locked(static_cast<char*>(b.data) + 9999, 1));
  EXPECT_FALSE(is_locked(static_cast<char*>(b.data) + 9999, 2)) << "range past the end";
  EXPECT_FALSE(is_locked(static_cast<char*>(b.data) - 1, 1));
  EXPECT_FALSE(free_locked(static_cast<char*>(b.data) + 4096)) << "a view is not a base";
  EXPECT_TRUE(free_locked(b.data));
  EXPECT_FALSE(free_locked(b.data)) << "double free is refused";
  EXPECT_FALSE(is_locked(b.data, 1));
}

TEST(LockedMemory, ForeignMemoryIsNotLocked) {
  std::vector<char> v(4096);
  EXPECT_FALSE(is_locked(v.data(), v.size()));
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
  EXPECT_TRUE(is_locked(b.data, b.nbytes)) << "registered either way";
  std::memset(b.data, 1, b.nbytes);
  EXPECT_TRUE(free_locked(b.data));
  setrlimit(RLIMIT_MEMLOCK, &rl);
}

TEST(LockedMemory, StatsFollowAllocations) {
  const auto before = locked_memory_stats();
  {
    UniqueLockedBuffer a(8192), c(100);
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
        UniqueLockedBuffer b(static_cast<std::size_t>(4096 * (1 + i % 4)));
        static_cast<char*>(b.data())[0] = 1;
        EXPECT_TRUE(is_locked(b.data(), b.size()));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(LockedMemory, UniqueLockedBufferMoves) {
  UniqueLockedBuffer a(4096);
  void* p = a.data();
  UniqueLockedBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(is_locked(p, 4096));
  b.reset();
  EXPECT_FALSE(is_locked(p, 1));
}

// The old names ("pinned", before deepio settled on "locked" for its memory) still compile, as
// deprecated aliases of the new ones: PinnedBuffer is UniqueLockedBuffer, is_pinned() is
// is_locked(). The deprecation warning, an error under DEEPIO_WERROR, is silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<PinnedBuffer, UniqueLockedBuffer>);
TEST(LockedMemory, OldPinnedNamesAreAliasesOfTheLockedOnes) {
  PinnedBuffer old_name(8192);
  UniqueLockedBuffer& same = old_name;
  ASSERT_NE(same.data(), nullptr);
  EXPECT_TRUE(is_pinned(same.data(), 8192));
  EXPECT_TRUE(is_locked(same.data(), 8192));
  EXPECT_EQ(is_pinned(same.bytes() + 8191, 2), is_locked(same.bytes() + 8191, 2));
  int on_stack = 0;
  EXPECT_FALSE(is_pinned(&on_stack, sizeof on_stack));
  bool (*const old_fn)(const void*, std::size_t) noexcept = &is_pinned;
  void* p = same.data();
  old_name.reset();
  EXPECT_FALSE(old_fn(p, 1));
  EXPECT_FALSE(is_locked(p, 1));
}
#pragma GCC diagnostic pop

// The AnonHugePages (kB) of the mapping that starts at `base`, from /proc/self/smaps; -1 if none.
long anon_huge_kb(const void* base) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  char line[512];
  bool in = false;
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
      in = lo <= reinterpret_cast<std::uintptr_t>(base) && reinterpret_cast<std::uintptr_t>(base) < hi;
    } else if (in && std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) {
      break;
    }
  }
  std::fclose(f);
  return kb;
}

// thp_fault_fallback from /proc/vmstat: huge-page faults the kernel served with small pages.
long thp_fault_fallbacks() {
  FILE* f = std::fopen("/proc/vmstat", "r");
  if (f == nullptr) return 0;
  char line[256];
  long n = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "thp_fault_fallback %ld", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

TEST(LockedMemory, LargeAllocationsUseTransparentHugePagesWhereTheSystemAllows) {
  std::string mode;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
    char buf[128] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) mode = buf;
    std::fclose(f);
  }
  if (mode.find("[never]") != std::string::npos || mode.empty()) GTEST_SKIP() << "no transparent huge pages here";
  const long fallbacks = thp_fault_fallbacks();
  UniqueLockedBuffer big(16 << 20);
  std::memset(big.data(), 1, big.size());
  const long huge = anon_huge_kb(big.data());
  if (huge < (8 << 10) && thp_fault_fallbacks() > fallbacks) {
    GTEST_SKIP() << "the kernel had no free huge page (thp_fault_fallback grew)";
  }
  // At least half of it: the ends of a mapping that is not 2 MiB aligned stay small pages.
  EXPECT_GE(huge, 8 << 10) << "THP mode: " << mode;
  UniqueLockedBuffer small(1 << 20);
  std::memset(small.data(), 1, small.size());
  EXPECT_EQ(anon_huge_kb(small.data()), 0) << "small buffers stay on small pages";
}

// VmLck of this process in kB, from /proc/self/status.
long vm_locked_kb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

TEST(LockedMemory, RetireUnlocksAndUnregistersButKeepsTheDataMappedUntilFreed) {
  std::vector<std::uint64_t> heard;
  std::mutex heard_mutex;
  const auto token = detail::add_release_listener([&](std::uint64_t id) {
    std::lock_guard lock(heard_mutex);
    heard.push_back(id);
  });
  const long vm_before = vm_locked_kb();
  const auto stats_before = locked_memory_stats();
  LockedBuffer b = allocate_locked(1 << 20);
  if (!b.locked) {
    free_locked(b.data);
    detail::remove_release_listener(token);
    GTEST_SKIP() << "memory cannot be locked here: " << std::strerror(b.lock_errno);
  }
  std::memset(b.data, 0x5a, b.nbytes);
  const auto region = detail::find_locked_region(b.data, b.nbytes);
  ASSERT_NE(region.id, 0u);
  // ASan's mlock does nothing (it returns 0 without locking): VmLck is not observable there.
  const bool observable = vm_locked_kb() >= vm_before + 1024;

  EXPECT_FALSE(detail::retire_locked(static_cast<char*>(b.data) + 4096)) << "a view is not a base";
  EXPECT_TRUE(detail::retire_locked(b.data));
  EXPECT_FALSE(detail::retire_locked(b.data)) << "a second retire is refused";
  if (observable) {
    EXPECT_EQ(vm_locked_kb(), vm_before) << "unlocked at once";
  }
  EXPECT_FALSE(is_locked(b.data, 1));
  EXPECT_EQ(detail::find_locked_region(b.data, 1).id, 0u) << "no new registration can find it";
  EXPECT_EQ(locked_memory_stats().allocations, stats_before.allocations);
  {
    std::lock_guard lock(heard_mutex);
    EXPECT_EQ(heard, std::vector<std::uint64_t>{region.id}) << "registrations end at the retire";
  }
  EXPECT_EQ(static_cast<unsigned char*>(b.data)[b.nbytes - 1], 0x5a) << "still mapped, data intact";

  EXPECT_TRUE(free_locked(b.data)) << "the mapping goes at the free";
  EXPECT_FALSE(free_locked(b.data));
  {
    std::lock_guard lock(heard_mutex);
    EXPECT_EQ(heard.size(), 1u) << "listeners hear of a region once";
  }
  detail::remove_release_listener(token);
}

}  // namespace
}  // namespace deepio
