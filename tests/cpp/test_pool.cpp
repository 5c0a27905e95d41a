// StagingPool (memory/pool.hpp): blocks lent, given back, kept up to the budget and lent
// again; retired, abandoned and orphaned leases; many threads at once; and the engine's use of
// it: the workers' bounce arenas and the binding's windows come from one pool, seen in
// HandleStats.
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/capabilities.hpp"
#include "deepio/handle.hpp"
#include "deepio/memory.hpp"
#include "engine/binding.hpp"
#include "memory/pool.hpp"
#include "platform/sys.hpp"

namespace deepio {
namespace {

using detail::StagingPool;

const std::size_t kPage = detail::page_size();

TEST(StagingPool, ABlockGivenBackIsLentAgain) {
  const std::uint64_t blocks = StagingPool::live_blocks();
  StagingPool pool(1 << 20);
  std::byte* first = nullptr;
  {
    StagingPool::Lease a = pool.take(10000);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), (10000 + kPage - 1) / kPage * kPage) << "whole pages";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % kPage, 0u);
    EXPECT_TRUE(is_locked(a.data(), a.size())) << "deepio's locked memory: registered for the engine";
    std::memset(a.data(), 0x5a, a.size());
    first = a.data();
    EXPECT_EQ(pool.stats().lent_bytes, a.size());
  }
  const StagingPool::Stats kept = pool.stats();
  EXPECT_EQ(kept.lent_bytes, 0u);
  EXPECT_EQ(kept.kept_bytes, 3 * kPage);
  StagingPool::Lease b = pool.take(3 * kPage - 5);  // the same rounded size
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(static_cast<unsigned char>(b.data()[0]), 0x5a) << "the same memory, not a fresh mapping";
  const StagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.reuses, 1u);
  EXPECT_EQ(s.kept_bytes, 0u);
  EXPECT_EQ(StagingPool::live_blocks(), blocks + 1);
}

TEST(StagingPool, OnlyABlockOfTheSameSizeIsReused) {
  StagingPool pool(1 << 20);
  std::byte* one = nullptr;
  std::byte* two = nullptr;
  {
    StagingPool::Lease a = pool.take(kPage);
    StagingPool::Lease b = pool.take(2 * kPage);
    one = a.data();
    two = b.data();
  }
  StagingPool::Lease c = pool.take(2 * kPage);
  EXPECT_EQ(c.data(), two);
  StagingPool::Lease d = pool.take(3 * kPage);
  EXPECT_NE(d.data(), one);
  EXPECT_EQ(pool.stats().allocations, 3u);
  EXPECT_EQ(pool.stats().kept_bytes, kPage);
}

TEST(StagingPool, KeepsNoMoreThanItsBudgetAndFreesTheRest) {
  StagingPool pool(2 * kPage);
  std::vector<std::byte*> given;
  {
    std::vector<StagingPool::Lease> out;
    for (int i = 0; i < 3; ++i) out.push_back(pool.take(kPage));
    for (auto& l : out) given.push_back(l.data());
  }  // given back in order: the first two kept, the third freed
  EXPECT_EQ(pool.stats().kept_bytes, 2 * kPage);
  EXPECT_TRUE(is_locked(given[0], kPage));
  EXPECT_TRUE(is_locked(given[1], kPage));
  EXPECT_FALSE(is_locked(given[2], kPage)) << "past the budget: unmapped";
  pool.trim();
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  EXPECT_FALSE(is_locked(given[0], kPage));
}

TEST(StagingPool, RetiredAndAbandonedBlocksAreNeverLentAgain) {
  const std::uint64_t blocks = StagingPool::live_blocks();
  StagingPool pool(1 << 20);
  StagingPool::Lease a = pool.take(kPage);
  std::byte* retired = a.data();
  a.retire();
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_FALSE(is_locked(retired, kPage)) << "retired: freed at once";
  StagingPool::Lease b = pool.take(kPage);
  std::byte* abandoned = b.data();
  b.abandon();
  EXPECT_TRUE(is_locked(abandoned, kPage)) << "abandoned: leaked, still mapped";
  StagingPool::Lease c = pool.take(kPage);
  EXPECT_NE(c.data(), abandoned);
  const StagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.reuses, 0u);
  EXPECT_EQ(s.lent_bytes, kPage) << "only c is out";
  EXPECT_TRUE(free_locked(abandoned));  // the test's own clean-up of the leak
  c.give_back();
  pool.trim();
  EXPECT_EQ(StagingPool::live_blocks(), blocks) << "an abandoned block is no pool's";
}

TEST(StagingPool, ALeaseOutlivesItsPool) {
  StagingPool::Lease kept_out;
  std::byte* p = nullptr;
  {
    StagingPool pool(1 << 20);
    kept_out = pool.take(4 * kPage);
    p = kept_out.data();
    { StagingPool::Lease other = pool.take(kPage); }  // kept by the pool, freed with it
  }
  std::memset(p, 1, 4 * kPage);  // still valid memory
  EXPECT_TRUE(is_locked(p, 4 * kPage));
  kept_out.give_back();
  EXPECT_FALSE(is_locked(p, 4 * kPage)) << "no pool to keep it: freed";
}

TEST(StagingPool, MovedLeasesGiveBackOnce) {
  StagingPool pool(1 << 20);
  StagingPool::Lease a = pool.take(kPage);
  StagingPool::Lease b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  a.give_back();                 // nothing to give
  StagingPool::Lease c = pool.take(kPage);
  c = std::move(b);  // c's own block goes back first
  EXPECT_EQ(pool.stats().kept_bytes, kPage);
  EXPECT_EQ(pool.stats().lent_bytes, kPage);
}

TEST(StagingPool, ManyThreadsTakeAndGiveBack) {
  StagingPool pool(16 * kPage);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const std::size_t pages = 1 + static_cast<std::size_t>((t + i) % 3);
        StagingPool::Lease l = pool.take(pages * kPage);
        const auto mark = static_cast<std::byte>(t + 1);
        std::memset(l.data(), static_cast<int>(mark), l.size());
        std::this_thread::yield();
        for (std::size_t k = 0; k < l.size(); k += kPage) {
          if (l.data()[k] != mark) bad.fetch_add(1);  // two borrowers of one block at once
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  const StagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.lent_bytes, 0u);
  EXPECT_LE(s.kept_bytes, 16 * kPage);
  EXPECT_EQ(s.allocations + s.reuses, 8u * 300u);
  EXPECT_GT(s.reuses, 0u);
}

TEST(StagingPool, TheEnginesBounceArenasAndWindowsShareOnePool) {
  test::TempDir dir;
  const auto info = probe_direct_io(dir.path().string());
  if (!info.supported || info.mem_align <= 1) GTEST_SKIP() << "bouncing needs a memory alignment > 1";
  HandleOptions o;
  o.intra_op_parallelism = 1;
  Handle h(o);
  EXPECT_EQ(h.stats().staging_allocations, 0u) << "nothing before the first bounce";
  test::OffsetBuffer src(1 << 20, 1);
  src.fill(test::pattern(1 << 20, 3));
  h.sync_pwrite(src.data(), src.size(), dir.file("f"));
  ASSERT_GT(h.stats().bytes_bounced, 0u);
  const HandleStats arena = h.stats();
  EXPECT_EQ(arena.staging_allocations, 1u) << "the worker's arena";
  EXPECT_GT(arena.staging_lent_bytes, 0u);
  std::byte* window = nullptr;
  {
    StagingPool::Lease w = detail::lend_staging(h, 3 << 20);
    window = w.data();
    EXPECT_TRUE(is_locked(w.data(), w.size()));
    EXPECT_EQ(h.stats().staging_lent_bytes, arena.staging_lent_bytes + w.size());
  }
  EXPECT_EQ(h.stats().staging_kept_bytes, std::size_t{3} << 20);
  StagingPool::Lease again = detail::lend_staging(h, 3 << 20);
  EXPECT_EQ(again.data(), window) << "the next file's window is the last one's memory";
  EXPECT_EQ(h.stats().staging_reuses, 1u);
  EXPECT_EQ(h.stats().staging_allocations, 2u);
}

}  // namespace
}  // namespace deepio
