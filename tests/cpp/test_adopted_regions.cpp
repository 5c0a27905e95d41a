// Caller memory adopted as a region io_uring registers (adopt_host_region: what
// deepio.kv.Store.register does with a host pool): requests on it go through a registered
// buffer with the right bytes, the release ends the registration (VmPin back down), the
// refusals (empty, too large, overlapping), a locked allocation made over an adopted range
// that its owner unmapped, and a forked child whose releases must not end the parent's
// registrations (one io_uring instance is shared across fork).
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "common/support.hpp"
#include "memory/regions.hpp"

namespace deepio {
namespace {

using test::in_child;
using test::kernel_has_sparse_buffers;
using test::pattern;
using test::vm_pin_kib;

// Anonymous memory of the caller's own (not deepio's): unmapped at scope exit.
struct Mapping {
  explicit Mapping(std::size_t n) : size(n) {
    data = static_cast<std::byte*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (data == MAP_FAILED) data = nullptr;
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::byte* data;
  std::size_t size;
};

class AdoptedRegions : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!test::backend_available(BackendKind::IoUring, &why)) GTEST_SKIP() << "io_uring: " << why;
    if (!kernel_has_sparse_buffers()) GTEST_SKIP() << "kernel older than 5.19: no sparse registered-buffer table";
  }
  static HandleOptions opts() {
    HandleOptions o;
    o.backend = BackendKind::IoUring;
    o.block_size = 1 << 20;
    return o;
  }
  test::TempDir dir_;
};

TEST_F(AdoptedRegions, CallerMemoryGoesThroughARegisteredBufferUntilReleased) {
  const std::size_t n = 8 << 20;
  Mapping m(n);
  ASSERT_NE(m.data, nullptr);
  const auto data = pattern(n, 3);
  const std::string path = dir_.file("f");
  test::put(path, data);
  Handle h(opts());
  const long before = vm_pin_kib();
  ASSERT_GE(before, 0) << "no VmPin in /proc/self/status";

  std::vector<std::byte> plain(n);  // before the adoption: the ordinary path
  h.sync_pread(m.data, n, path);
  EXPECT_EQ(h.stats().bytes_fixed, 0u);

  const std::uint64_t id = detail::adopt_host_region(m.data + 100, n - 200);  // widened to pages
  ASSERT_NE(id, 0u);
  const detail::LockedRegion r = detail::find_locked_region(m.data + 4096, 4096);
  EXPECT_EQ(r.id, id);
  EXPECT_EQ(r.base, m.data);
  EXPECT_EQ(r.size, n);
  EXPECT_FALSE(is_locked(m.data, n)) << "adopted memory is not deepio's locked memory";
  EXPECT_EQ(locked_memory_stats().allocations, 0u);

  std::memset(m.data, 0, n);
  h.sync_pread(m.data, n, path);
  EXPECT_EQ(h.stats().bytes_fixed, n);
  EXPECT_EQ(std::memcmp(m.data, data.data(), n), 0);
  EXPECT_GE(vm_pin_kib(), before + 4096) << "the 8 MiB registration pins its pages";
  // Writes too: a changed page goes out through the registration and reads back.
  std::memset(m.data + 4096, 0x5a, 4096);
  h.sync_pwrite(m.data + 4096, 4096, path, 4096);
  EXPECT_EQ(h.stats().bytes_fixed, n + 4096);
  h.sync_pread(plain.data(), n, path);
  EXPECT_EQ(std::memcmp(plain.data(), m.data, n), 0);

  detail::release_host_region(id);
  EXPECT_EQ(detail::find_locked_region(m.data, 4096).id, 0u);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (vm_pin_kib() > before && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_LE(vm_pin_kib(), before) << "the release unpinned the pages";
  h.sync_pread(m.data, n, path);
  EXPECT_EQ(h.stats().bytes_fixed, n + 4096) << "released memory takes the ordinary path again";
  detail::release_host_region(id);  // a second release: nothing
}

TEST_F(AdoptedRegions, EmptyTooLargeAndOverlappingRangesAreNotAdopted) {
  Mapping m(4 << 20);
  ASSERT_NE(m.data, nullptr);
  EXPECT_EQ(detail::adopt_host_region(m.data, 0), 0u);
  EXPECT_EQ(detail::adopt_host_region(nullptr, 4096), 0u);
  // Nothing is touched or mapped by an adoption: a size past the limit is refused as such.
  EXPECT_EQ(detail::adopt_host_region(m.data, detail::kMaxAdoptedBytes + 4096), 0u);
  const std::uint64_t id = detail::adopt_host_region(m.data, 2 << 20);
  ASSERT_NE(id, 0u);
  EXPECT_EQ(detail::adopt_host_region(m.data + (1 << 20), 2 << 20), 0u) << "overlaps an adopted region";
  const std::uint64_t second = detail::adopt_host_region(m.data + (2 << 20), 2 << 20);
  EXPECT_NE(second, 0u) << "the neighbouring range is free";
  UniqueLockedBuffer locked(1 << 20);
  EXPECT_EQ(detail::adopt_host_region(locked.data(), 4096), 0u) << "deepio's own allocation serves it";
  EXPECT_FALSE(free_locked(m.data)) << "an adopted region is never unmapped by deepio";
  detail::release_host_region(id);
  detail::release_host_region(second);
  EXPECT_EQ(detail::find_locked_region(m.data + (2 << 20), 4096).id, 0u);
}

TEST_F(AdoptedRegions, ALockedAllocationOverAStaleAdoptedRangeDropsIt) {
  const std::size_t n = 4 << 20;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const std::uint64_t id = detail::adopt_host_region(p, n);
  ASSERT_NE(id, 0u);
  ::munmap(p, n);  // the owner's mistake: unmapped while adopted
  UniqueLockedBuffer b(n);
  if (b.data() != p) GTEST_SKIP() << "the kernel placed the new mapping elsewhere";
  const detail::LockedRegion r = detail::find_locked_region(b.data(), n);
  EXPECT_NE(r.id, id) << "the new allocation, not the stale region";
  EXPECT_TRUE(is_locked(b.data(), n) || !b.locked());
  detail::release_host_region(id);  // already gone: nothing
  EXPECT_EQ(detail::find_locked_region(b.data(), n).id, r.id);
}

TEST_F(AdoptedRegions, AForkedChildsReleaseLeavesTheParentsRegistration) {
  const std::size_t n = 2 << 20;
  Mapping m(n);
  ASSERT_NE(m.data, nullptr);
  const auto data = pattern(n, 5);
  const std::string path = dir_.file("f");
  test::put(path, data);
  Handle h(opts());
  const std::uint64_t id = detail::adopt_host_region(m.data, n);
  ASSERT_NE(id, 0u);
  h.sync_pread(m.data, n, path);
  ASSERT_EQ(h.stats().bytes_fixed, n);
  // The child ends the adoption in its copy of the registry: its listener must not touch the
  // ring, which is the parent's too.
  EXPECT_EQ(in_child([&] {
              detail::release_host_region(id);
              return 0;
            }),
            0);
  std::memset(m.data, 0, n);
  h.sync_pread(m.data, n, path);  // through the same registration: still there
  EXPECT_EQ(h.stats().bytes_fixed, 2 * n);
  EXPECT_EQ(std::memcmp(m.data, data.data(), n), 0);
  detail::release_host_region(id);
}

}  // namespace
}  // namespace deepio
