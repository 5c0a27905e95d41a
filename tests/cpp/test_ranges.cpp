// Ranged operations (Handle::async_pread_ranges / async_pwrite_ranges): one operation over many
// ranges of one file. The bytes are exactly those of one pread/pwrite per range, on disk and on
// tmpfs, aligned or not, from any buffer address; bad ranges are refused before anything is
// queued, naming the range; a failure (injected EIO) fails the whole operation with its file;
// short transfers are finished; a durable write syncs its file once; many threads at once.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "common/support.hpp"
#include "core/plan.hpp"
#include "platform/fault.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::put;
using test::slurp;
using test::take_turn;

using Ranges = test::BackendTest;

// `n` ranges of `size` bytes at a random permutation of the file's size-sized slots, packed in
// the buffer in the order given.
std::vector<IoRange> shuffled(std::size_t n, std::size_t size, std::uint32_t seed) {
  std::vector<std::size_t> slot(n);
  std::iota(slot.begin(), slot.end(), std::size_t{0});
  std::shuffle(slot.begin(), slot.end(), std::mt19937(seed));
  std::vector<IoRange> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = {slot[i] * size, i * size, size};
  return r;
}

// What one pread per range gives: the file's bytes of each range at its buffer offset.
std::vector<std::byte> gathered(const std::vector<std::byte>& file, const std::vector<IoRange>& ranges,
                                std::size_t buffer_bytes) {
  std::vector<std::byte> out(buffer_bytes);
  for (const IoRange& r : ranges) {
    std::copy_n(file.begin() + static_cast<std::ptrdiff_t>(r.file_offset), r.nbytes,
                out.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset));
  }
  return out;
}

// A tmpfs folder (io_uring's workers run its requests with pread/pwrite: Segment::in_memory).
class ShmDir {
 public:
  ShmDir() {
    char templ[] = "/dev/shm/deepio-ranges-XXXXXX";
    if (::mkdtemp(templ) != nullptr) path_ = templ;
  }
  ~ShmDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;
  [[nodiscard]] bool ok() const { return !path_.empty(); }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST_P(Ranges, GatherOf4KiBRangesInRandomOrderMatchesPreadOnDiskAndTmpfs) {
  ShmDir shm;
  ASSERT_TRUE(shm.ok());
  constexpr std::size_t kCount = 4096;
  constexpr std::size_t kSize = 4096;
  const auto data = pattern(kCount * kSize, 1);
  const auto ranges = shuffled(kCount, kSize, 7);
  for (const std::string& path : {dir_.file("f"), shm.file("f")}) {
    put(path, data);
    Handle h(opts({.queue_depth = 32, .intra_op_parallelism = 2}));
    for (std::size_t misalign : {std::size_t{0}, std::size_t{1}}) {
      test::OffsetBuffer buf(kCount * kSize, misalign);
      Future f = h.async_pread_ranges(buf.data(), buf.size(), path, ranges);
      EXPECT_EQ(f.get(), kCount * kSize) << path;
      EXPECT_EQ(buf.copy(), gathered(data, ranges, buf.size())) << path << " misalign " << misalign;
    }
    EXPECT_EQ(h.wait(), 0u) << "collected by its Future";
    EXPECT_EQ(h.stats().ops_completed, 2u) << "one operation per call, whatever the range count";
  }
}

TEST_P(Ranges, UnalignedSizesOffsetsAndBufferGapsMatchPread) {
  const auto data = pattern((3 << 20) + 777, 2);
  put(dir_.file("f"), data);
  std::mt19937 rng(3);
  // Random ranges (sizes 0 .. 300 KiB, some larger than a block), placed in the buffer with
  // gaps that must stay untouched, in a random order.
  std::vector<IoRange> ranges;
  std::size_t at = 0;
  for (int i = 0; i < 200; ++i) {
    const std::size_t n = i % 50 == 0 ? 0 : (i % 17 == 0 ? (1 << 20) + rng() % 4096 : rng() % (300 << 10));
    const std::uint64_t off = rng() % (data.size() - n + 1);
    at += rng() % 5000;
    ranges.push_back({off, at, n});
    at += n;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  Handle h(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 3}));
  std::vector<std::byte> buf(at, std::byte{0x5a});
  std::vector<std::byte> expect = gathered(data, ranges, at);
  std::vector<bool> covered(at, false);
  for (const IoRange& r : ranges)
    std::fill_n(covered.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset), r.nbytes, true);
  for (std::size_t i = 0; i < at; ++i) {
    if (!covered[i]) expect[i] = std::byte{0x5a};  // the gaps keep their bytes
  }
  const std::uint64_t total = std::accumulate(ranges.begin(), ranges.end(), std::uint64_t{0},
                                              [](std::uint64_t s, const IoRange& r) { return s + r.nbytes; });
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), ranges).get(), total);
  EXPECT_EQ(buf, expect);
}

TEST_P(Ranges, ScatterWriteMatchesPwriteAndADurableOneSyncsOnce) {
  constexpr std::size_t kCount = 1000;
  const auto src = pattern(kCount * 5000, 4);
  std::mt19937 rng(5);
  // Ranges of 1..5000 bytes written to disjoint places of a fresh file, with holes between.
  std::vector<IoRange> ranges;
  std::uint64_t file_at = 100;
  for (std::size_t i = 0; i < kCount; ++i) {
    const std::size_t n = 1 + rng() % 5000;
    ranges.push_back({file_at, i * 5000, n});
    file_at += n + rng() % 3;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  std::vector<std::byte> expect(file_at);
  for (const IoRange& r : ranges) {
    std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset), r.nbytes,
                expect.begin() + static_cast<std::ptrdiff_t>(r.file_offset));
  }
  // The file ends where the range that ends last ends (the holes read as zeros).
  std::uint64_t end = 0;
  for (const IoRange& r : ranges) end = std::max<std::uint64_t>(end, r.file_offset + r.nbytes);
  expect.resize(end);
  std::atomic<int> syncs{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Sync) ++syncs;
    return std::nullopt;
  });
  Handle h(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 2}));
  OpOptions durable;
  durable.fsync = true;
  h.async_pwrite_ranges(src.data(), src.size(), dir_.file("w"), ranges, durable);
  EXPECT_EQ(h.wait(), 1u);
  detail::set_fault_hook({});
  EXPECT_EQ(syncs.load(), 1) << "one fdatasync for the whole operation";
  EXPECT_EQ(h.stats().synced, 1u);
  EXPECT_EQ(slurp(dir_.file("w")), expect);
}

TEST_P(Ranges, WriteTilingASpanIsPreallocatedAndOneWithGapsIsNot) {
  Handle h(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 2}));
  const auto src = pattern(64 * 65536, 13);
  // 64 ranges of 64 KiB at a random permutation of the span [4096, 4096 + 4 MiB): no gap.
  auto ranges = shuffled(64, 65536, 14);
  for (IoRange& r : ranges) r.file_offset += 4096;
  EXPECT_EQ(h.async_pwrite_ranges(src.data(), src.size(), dir_.file("tiled"), ranges).get(), src.size());
  EXPECT_EQ(h.stats().preallocated, 1u);
  auto tiled = slurp(dir_.file("tiled"));
  ASSERT_EQ(tiled.size(), 4096 + src.size());
  for (const IoRange& r : ranges) {
    EXPECT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset),
                           src.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset + r.nbytes),
                           tiled.begin() + static_cast<std::ptrdiff_t>(r.file_offset)));
  }
  // One page left out of the span: a hole that must stay a hole, so nothing is allocated.
  ranges.pop_back();
  EXPECT_EQ(h.async_pwrite_ranges(src.data(), src.size(), dir_.file("gappy"), ranges).get(), 63u * 65536);
  EXPECT_EQ(h.stats().preallocated, 1u);
  // Rewriting the tiled span inside the file extends nothing: not allocated again.
  EXPECT_EQ(h.async_pwrite_ranges(src.data(), src.size(), dir_.file("tiled"), shuffled(64, 65536, 15)).get(),
            src.size());
  EXPECT_EQ(h.stats().preallocated, 1u);
}

TEST_P(Ranges, BadRangesAreRefusedNamingTheRangeAndQueueNothing) {
  put(dir_.file("f"), pattern(1 << 16, 6));
  Handle h(opts());
  std::vector<std::byte> buf(8192);
  const std::string f = dir_.file("f");
  const auto refused = [&](bool write, std::vector<IoRange> r, const std::string& path, const std::string& text,
                           bool invalid = true) {
    try {
      if (write) {
        h.async_pwrite_ranges(buf.data(), buf.size(), path, r);
      } else {
        h.async_pread_ranges(buf.data(), buf.size(), path, r);
      }
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      EXPECT_EQ(e.invalid_argument(), invalid) << e.what();
    }
  };
  refused(false, {{0, 0, 4096}, {0, 8000, 193}}, f, "range 1: buffer bytes [8000, +193) lie outside the buffer");
  refused(false, {{0, static_cast<std::size_t>(-8), 4}}, f, "buffer bytes [-8, +4)");
  refused(false, {{static_cast<std::uint64_t>(-4096), 0, 4}}, f,
          "range 0: file_offset must be non-negative, got -4096");
  refused(false, {{0, 0, 100}, {1, 4096, 100}, {2, 50, 10}}, f, "ranges 0 and 2 overlap in the buffer");
  refused(true, {{0, 0, 100}, {4096, 0, 100}, {50, 200, 10}}, dir_.file("new"), "ranges 0 and 2 overlap in the file");
  refused(false, {{0, 0, 4096}, {65536 - 10, 4096, 11}}, f, "range 1 reads past end of file", /*invalid=*/false);
  refused(false, {{(std::uint64_t{1} << 63) - 2, 0, 4}}, f, "overflows", /*invalid=*/false);
  try {  // sizes adding up past 2^63 - 1 (a buffer size taken on trust): EOVERFLOW, naming the
         // range with its offset and size (the binding tells an open failure by their absence)
    const std::size_t q = std::size_t{1} << 62;
    h.async_pread_ranges(buf.data(), std::numeric_limits<std::size_t>::max(), f,
                         std::vector<IoRange>{{0, 0, q}, {512, q, q}});
    ADD_FAILURE() << "sizes beyond 2^63 - 1 were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EOVERFLOW);
    EXPECT_NE(std::string(e.what()).find("range 1: the ranges' sizes add up"), std::string::npos) << e.what();
    EXPECT_EQ(e.offset(), 512u);
    EXPECT_EQ(e.nbytes(), std::size_t{1} << 62);
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("new"))) << "a refused write creates nothing";
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.wait(), 0u);
  // What is not an overlap: reads may share file bytes, writes may share buffer bytes.
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), f, std::vector<IoRange>{{0, 4096, 100}, {0, 0, 100}}).get(),
            200u);
  EXPECT_EQ(
      h.async_pwrite_ranges(buf.data(), buf.size(), dir_.file("w"), std::vector<IoRange>{{4096, 0, 100}, {0, 0, 100}})
          .get(),
      200u);
  try {
    h.async_pread_ranges(nullptr, 0, f, std::vector<IoRange>{{0, 0, 1}});
    ADD_FAILURE() << "a range outside an empty buffer was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.invalid_argument());
  }
  try {
    h.async_pread_ranges(buf.data(), buf.size(), dir_.file("missing"), std::vector<IoRange>{{0, 0, 1}});
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOENT);
  }
}

TEST_P(Ranges, NoRangesOrOnlyEmptyOnesCompleteAtOnce) {
  put(dir_.file("f"), pattern(4096, 7));
  Handle h(opts());
  std::vector<std::byte> buf(16);
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), {}).get(), 0u);
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), std::vector<IoRange>{{1 << 20, 0, 0}}).get(),
            0u)
      << "an empty range past the end reads nothing";
  h.async_pwrite_ranges(buf.data(), buf.size(), dir_.file("empty"), std::vector<IoRange>{{0, 0, 0}});
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(std::filesystem::file_size(dir_.file("empty")), 0u) << "created, never truncated, nothing written";
}

TEST_P(Ranges, InjectedEioFailsTheWholeOperationNamingTheFile) {
  const auto data = pattern(1 << 20, 8);
  put(dir_.file("f"), data);
  const auto ranges = shuffled(256, 4096, 9);
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Read && s.offset == 100 * 4096) return -EIO;
    return std::nullopt;
  });
  Handle h(opts({.queue_depth = 8, .intra_op_parallelism = 2}));
  std::vector<std::byte> buf(data.size());
  h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), ranges);
  try {
    h.wait();
    ADD_FAILURE() << "the injected EIO was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), dir_.file("f"));
    EXPECT_EQ(e.offset(), 100u * 4096);
  }
  detail::set_fault_hook({});
  EXPECT_EQ(h.stats().ops_failed, 1u);
  // The handle goes on: the same read succeeds now.
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), ranges).get(), data.size());
  EXPECT_EQ(buf, gathered(data, ranges, buf.size()));
}

TEST_P(Ranges, InjectedShortTransfersAreFinished) {
  const auto data = pattern(1 << 20, 10);
  put(dir_.file("f"), data);
  std::atomic<int> shortened{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if ((s.point == FaultPoint::Read || s.point == FaultPoint::Write) && s.result > 1 &&
        take_turn(shortened, 40) >= 0) {
      return s.result / 2;
    }
    return std::nullopt;
  });
  Handle h(opts({.queue_depth = 8}));
  const auto ranges = shuffled(256, 4096, 11);
  std::vector<std::byte> buf(data.size());
  EXPECT_EQ(h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), ranges).get(), data.size());
  EXPECT_EQ(h.async_pwrite_ranges(data.data(), data.size(), dir_.file("w"), ranges).get(), data.size());
  detail::set_fault_hook({});
  EXPECT_EQ(shortened.load(), 40);
  EXPECT_EQ(h.stats().short_transfers, 40u);
  EXPECT_EQ(buf, gathered(data, ranges, buf.size()));
  // Range k of the write put buffer bytes [k * 4096, +4096) at slot[k] * 4096 of the file.
  const auto written = slurp(dir_.file("w"));
  ASSERT_EQ(written.size(), data.size());
  for (const IoRange& r : ranges) {
    EXPECT_TRUE(std::equal(data.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset),
                           data.begin() + static_cast<std::ptrdiff_t>(r.buffer_offset + r.nbytes),
                           written.begin() + static_cast<std::ptrdiff_t>(r.file_offset)));
  }
}

TEST_P(Ranges, DescriptorFormAndManyThreadsAtOnce) {
  const auto data = pattern(8 << 20, 12);
  put(dir_.file("f"), data);
  const int fd = ::open(dir_.file("f").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Handle h(opts({.queue_depth = 32, .intra_op_parallelism = 2}));
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread gathers 256 random 4 KiB pages of its own MiB of the file, 4 times.
      for (int round = 0; round < 4; ++round) {
        auto ranges = shuffled(256, 4096, static_cast<std::uint32_t>(100 * t + round));
        for (IoRange& r : ranges) r.file_offset += static_cast<std::uint64_t>(t) << 20;
        std::vector<std::byte> buf(1 << 20);
        Future f = t % 2 == 0 ? h.async_pread_ranges(buf.data(), buf.size(), fd, ranges)
                              : h.async_pread_ranges(buf.data(), buf.size(), dir_.file("f"), ranges);
        if (f.get() != buf.size() || buf != gathered(data, ranges, buf.size())) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  ::close(fd);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(h.stats().ops_completed, static_cast<std::uint64_t>(kThreads * 4));
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Ranges);

}  // namespace
}  // namespace deepio
