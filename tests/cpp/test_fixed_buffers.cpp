// io_uring registered ("fixed") buffers for locked allocations: the bytes are right, the
// registration is used, it ends before the memory is freed (the kernel's own pinned-page
// count, VmPin, goes back down), addresses reused by a later allocation get the new pages,
// more allocations than table slots, a request crossing two registration pieces, a
// registration refused by a real RLIMIT_MEMLOCK, and frees racing with I/O on other buffers.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "memory/regions.hpp"

namespace deepio {
namespace {

using test::in_child;
using test::kernel_has_sparse_buffers;
using test::pattern;
using test::slurp;
using test::vm_pin_kib;

// VmPin once it has stopped moving, for a baseline: rings of earlier tests are torn down
// asynchronously by the kernel, and their pages are unpinned a little after the handle is gone.
// Waits up to 2 s for two equal readings 50 ms apart (a better baseline, never an assertion).
long settled_vm_pin_kib() {
  long last = vm_pin_kib();
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const long now = vm_pin_kib();
    if (now == last) break;
    last = now;
  }
  return last;
}

// VmPin once it is at most `target` KiB: the kernel unpins a released registration a little
// later (deferred until its resource node is idle). Polls until then; the 30 s bound is only a
// hang guard, the caller asserts on the value returned.
long vm_pin_kib_down_to(long target) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  long now = vm_pin_kib();
  while (now > target && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    now = vm_pin_kib();
  }
  return now;
}

class FixedBuffers : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!test::backend_available(BackendKind::IoUring, &why)) GTEST_SKIP() << "io_uring: " << why;
    if (!kernel_has_sparse_buffers()) GTEST_SKIP() << "kernel older than 5.19: no sparse registered-buffer table";
  }
  static HandleOptions opts(HandleOptions o = {}) {
    o.backend = BackendKind::IoUring;
    return o;
  }
  test::TempDir dir_;
};

TEST_F(FixedBuffers, PinnedMemoryGoesThroughARegisteredBuffer) {
  const std::size_t n = (4 << 20) + 100;  // a buffered tail as well as the direct body
  const auto data = pattern(n, 1);
  UniqueLockedBuffer out(n), in(n);
  if (!out.locked()) GTEST_SKIP() << "mlock refused here: no locked allocation to register";
  std::memcpy(out.data(), data.data(), n);
  const std::string path = dir_.file("f");
  Handle h(opts({.block_size = 1 << 20, .intra_op_parallelism = 2}));
  h.sync_pwrite(out.data(), n, path);
  EXPECT_EQ(h.stats().bytes_fixed, n);
  std::memset(in.data(), 0, n);
  h.sync_pread(in.data(), n, path);
  EXPECT_EQ(std::memcmp(in.data(), data.data(), n), 0);
  EXPECT_EQ(h.stats().bytes_fixed, 2 * n);
  EXPECT_EQ(slurp(path), data);

  // A view inside the allocation is registered memory too; foreign memory is not.
  h.sync_pread(in.bytes() + 4096, 8192, path, 4096);
  EXPECT_EQ(std::memcmp(in.bytes() + 4096, data.data() + 4096, 8192), 0);
  EXPECT_EQ(h.stats().bytes_fixed, 2 * n + 8192);
  std::vector<std::byte> plain(8192);
  h.sync_pread(plain.data(), plain.size(), path);
  EXPECT_EQ(h.stats().bytes_fixed, 2 * n + 8192);
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), data.begin()));
}

TEST_F(FixedBuffers, FreeingEndsTheRegistrationBeforeTheMemoryIsReturned) {
  Handle h(opts());
  const std::string path = dir_.file("f");
  const long before = settled_vm_pin_kib();
  ASSERT_GE(before, 0) << "no VmPin in /proc/self/status";
  long during = -1;
  {
    UniqueLockedBuffer b(8 << 20);
    if (!b.locked()) GTEST_SKIP() << "mlock refused here";
    std::memset(b.data(), 7, b.size());
    h.sync_pwrite(b.data(), b.size(), path);
    ASSERT_EQ(h.stats().bytes_fixed, b.size());
    during = vm_pin_kib();
    EXPECT_GE(during - before, 8 << 10) << "the kernel holds the registration while the buffer lives";
  }
  // The handle is still alive: only the release listener can have ended the registration.
  const long after = vm_pin_kib_down_to(before);
  EXPECT_LE(after, before) << "the registration still pins the freed buffer";
  EXPECT_LE(after, during - (8 << 10));
}

TEST_F(FixedBuffers, AReusedAddressGetsTheNewAllocationsPages) {
  // munmap then mmap of the same size usually returns the same address: a registration left
  // behind would write the old pages' bytes. Each round's data must land.
  Handle h(opts());
  const std::size_t n = 1 << 20;
  const std::string path = dir_.file("f");
  std::vector<void*> seen;
  bool reused = false;
  for (std::uint32_t round = 0; round < 12; ++round) {
    UniqueLockedBuffer b(n);
    reused = reused || std::find(seen.begin(), seen.end(), b.data()) != seen.end();
    seen.push_back(b.data());
    const auto data = pattern(n, 100 + round);
    std::memcpy(b.data(), data.data(), n);
    h.sync_pwrite(b.data(), n, path, round * n);
    UniqueLockedBuffer back(n);
    std::memset(back.data(), 0, n);
    h.sync_pread(back.data(), n, path, round * n);
    ASSERT_EQ(std::memcmp(back.data(), data.data(), n), 0) << "round " << round;
  }
  const auto file = slurp(path);
  ASSERT_EQ(file.size(), 12 * n);
  for (std::uint32_t round = 0; round < 12; ++round) {
    const auto data = pattern(n, 100 + round);
    ASSERT_TRUE(std::equal(data.begin(), data.end(), file.begin() + static_cast<std::ptrdiff_t>(round * n)))
        << "round " << round;
  }
  if (!reused) std::printf("note: no address was reused by mmap in this run\n");
}

TEST_F(FixedBuffers, MoreLiveAllocationsThanTableSlots) {
  // 300 live allocations against a 256-slot table: least recently used registrations are
  // replaced while their buffers are still alive and used again later.
  Handle h(opts({.queue_depth = 16}));
  const std::size_t n = 16 << 10;
  constexpr std::uint32_t kCount = 300;
  std::vector<UniqueLockedBuffer> bufs;
  for (std::uint32_t i = 0; i < kCount; ++i) {
    bufs.emplace_back(n);
    const auto data = pattern(n, i);
    std::memcpy(bufs.back().data(), data.data(), n);
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (std::uint32_t i = 0; i < kCount; ++i) h.async_pwrite(bufs[i].data(), n, dir_.file("f" + std::to_string(i)));
    EXPECT_EQ(h.wait(), kCount);
  }
  for (auto& b : bufs) std::memset(b.data(), 0, n);
  for (std::uint32_t i = 0; i < kCount; ++i) h.async_pread(bufs[i].data(), n, dir_.file("f" + std::to_string(i)));
  EXPECT_EQ(h.wait(), kCount);
  for (std::uint32_t i = 0; i < kCount; ++i) {
    const auto data = pattern(n, i);
    ASSERT_EQ(std::memcmp(bufs[i].data(), data.data(), n), 0) << i;
  }
  if (bufs[0].locked()) {
    EXPECT_EQ(h.stats().bytes_fixed, 3 * kCount * n);
  }
}

TEST_F(FixedBuffers, ARequestCrossingTwoRegistrationPiecesTakesTheOrdinaryPath) {
  // Allocations are registered in 64 MiB pieces (the kernel takes at most 1 GiB per buffer);
  // a request that crosses from one piece into the next cannot use either.
  const std::size_t piece = std::size_t{64} << 20;
  UniqueLockedBuffer big(piece + (4 << 20));
  if (!big.locked()) GTEST_SKIP() << "cannot lock 68 MiB here";
  const std::size_t n = 2 << 20;
  std::byte* p = big.bytes() + piece - (1 << 20);  // 1 MiB on each side of the boundary
  const auto data = pattern(n, 9);
  std::memcpy(p, data.data(), n);
  const std::string path = dir_.file("f");
  {
    Handle h(opts({.block_size = 1 << 20}));  // two requests, one in each piece
    h.sync_pwrite(p, n, path);
    EXPECT_EQ(h.stats().bytes_fixed, n);
  }
  {
    Handle h(opts({.block_size = 4 << 20}));  // one request across the boundary
    std::memset(p, 0, n);
    h.sync_pread(p, n, path);
    EXPECT_EQ(std::memcmp(p, data.data(), n), 0);
    EXPECT_EQ(h.stats().bytes_fixed, 0u);
    EXPECT_EQ(h.stats().bytes_direct, n);
  }
}

TEST_F(FixedBuffers, ARegistrationRefusedByRlimitMemlockFallsBackToTheOrdinaryPath) {
  // io_uring charges registered pages to the user's RLIMIT_MEMLOCK (root is exempt), per
  // registration: as nobody with an 8 MiB limit, a 6 MiB locked buffer can be registered by
  // one handle but not by a second one at the same time. The second handle's bytes must
  // still be right and simply not counted as fixed.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged user";
  std::filesystem::permissions(dir_.path(), std::filesystem::perms::all);
  const std::string path = dir_.file("f");
  const int code = in_child([&] {
    rlimit rl{8 << 20, 8 << 20};
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 90;
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 90;
    const std::size_t n = 6 << 20;
    UniqueLockedBuffer b(n);
    if (!b.locked()) return 91;
    const auto data = pattern(n, 5);
    std::memcpy(b.data(), data.data(), n);
    Handle first(opts()), second(opts());
    try {
      first.sync_pwrite(b.data(), n, path);
      if (first.stats().bytes_fixed != n) return 92;
      std::memset(b.data(), 0, n);
      second.sync_pread(b.data(), n, path);
    } catch (const Error&) {
      return 95;  // the folder is not writable by nobody here
    }
    if (second.stats().bytes_fixed != 0) return 93;
    if (std::memcmp(b.data(), data.data(), n) != 0) return 94;
    return 0;
  });
  if (code == 91) GTEST_SKIP() << "mlock of 6 MiB refused under an 8 MiB limit";
  if (code == 95) GTEST_SKIP() << "folder not reachable by an unprivileged user here";
  EXPECT_EQ(code, 0);
}

TEST_F(FixedBuffers, FreesRaceWithIoOnOtherBuffers) {
  // Threads allocate, transfer and free their own buffers through one shared handle, so
  // release listeners run while the workers register other allocations (for TSan).
  Handle h(opts({.block_size = 64 << 10, .intra_op_parallelism = 2}));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string path = dir_.file("t" + std::to_string(t));
      for (std::uint32_t i = 0; i < 25; ++i) {
        const std::size_t n = (256 << 10) + i * 4096;
        const auto data = pattern(n, static_cast<std::uint32_t>(t * 100) + i);
        UniqueLockedBuffer b(n);
        std::memcpy(b.data(), data.data(), n);
        auto w = h.async_pwrite(b.data(), n, path);
        w.get();
        std::memset(b.data(), 0, n);
        auto r = h.async_pread(b.data(), n, path);
        r.get();
        if (std::memcmp(b.data(), data.data(), n) != 0) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(h.wait(), 0u) << "every op was collected through its future";
}

TEST(LockedRegions, FindLockedRegionCoversTheWholeMapping) {
  UniqueLockedBuffer b(10000);
  if (!b.locked()) GTEST_SKIP() << "mlock refused here";
  const auto r = detail::find_locked_region(b.bytes() + 100, 500);
  EXPECT_NE(r.id, 0u);
  EXPECT_EQ(r.base, b.bytes());
  EXPECT_EQ(r.size, 3 * 4096u) << "whole pages";
  EXPECT_EQ(detail::find_locked_region(b.bytes() + 4096, 3 * 4096).id, 0u) << "past the mapping";
  std::vector<char> foreign(100);
  EXPECT_EQ(detail::find_locked_region(foreign.data(), 100).id, 0u);
  UniqueLockedBuffer other(10000);
  EXPECT_NE(detail::find_locked_region(other.data(), 1).id, r.id) << "ids differ";
  std::vector<std::uint64_t> released;
  const auto token = detail::add_release_listener([&](std::uint64_t id) { released.push_back(id); });
  const std::uint64_t id = r.id;
  b.reset();
  detail::remove_release_listener(token);
  other.reset();  // after removal: not heard
  EXPECT_EQ(released, std::vector<std::uint64_t>{id});
}

}  // namespace
}  // namespace deepio
