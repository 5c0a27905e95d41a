// Planner invariants over many random requests: every byte covered exactly once, in order per
// worker; direct segments aligned in file offset, length and (for Direct) buffer address;
// head/tail only where alignment forbids direct I/O; chunks whole alignment units.
#include <random>

#include <gtest/gtest.h>

#include "core/plan.hpp"

namespace deepio::detail {
namespace {

void check_plan(const PlanInput& in) {
  const auto slices = plan_request(in);
  if (in.nbytes == 0) {
    EXPECT_TRUE(slices.empty());
    return;
  }
  const std::uint64_t unit = std::max<std::uint64_t>(in.offset_align, in.page);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::size_t last_worker = 0;
  bool first = true;
  for (const auto& s : slices) {
    ASSERT_LT(s.worker, in.workers);
    if (!first) {
      EXPECT_GT(s.worker, last_worker) << "slices in worker order, one per worker";
    }
    first = false;
    last_worker = s.worker;
    ASSERT_FALSE(s.segments.empty());
    for (const auto& g : s.segments) {
      ASSERT_GT(g.nbytes, 0u);
      EXPECT_EQ(g.buf, in.buf + (g.file_offset - in.file_offset)) << "buffer follows file offset";
      ASSERT_GT(g.chunk, 0u);
      if (g.mode != SegmentMode::Buffered) {
        EXPECT_TRUE(in.direct);
        EXPECT_EQ(g.file_offset % unit, 0u);
        EXPECT_EQ(g.nbytes % unit, 0u);
        EXPECT_EQ(g.chunk % unit, 0u);
        if (g.mode == SegmentMode::Direct) {
          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g.buf) % in.mem_align, 0u);
        } else {
          EXPECT_LE(g.chunk, in.bounce_bytes);
        }
      }
      ranges.emplace_back(g.file_offset, g.file_offset + g.nbytes);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t pos = in.file_offset;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, pos) << "gap or overlap";
    pos = e;
  }
  EXPECT_EQ(pos, in.file_offset + in.nbytes);
}

TEST(Plan, RandomRequestsKeepInvariants) {
  std::mt19937_64 rng(12345);
  alignas(4096) static std::byte arena[1 << 16];
  for (int i = 0; i < 20000; ++i) {
    PlanInput in;
    in.buf = arena + rng() % 8192;
    const int shape = static_cast<int>(rng() % 4);
    in.nbytes = shape == 0   ? rng() % 64
                : shape == 1 ? rng() % (1 << 20)
                : shape == 2 ? (rng() % 64) * 4096
                             : rng() % (64u << 20);
    in.file_offset = rng() % 3 == 0 ? (rng() % 1024) * 4096 : rng() % (1ull << 34);
    in.direct = rng() % 4 != 0;
    in.mem_align = std::size_t{1} << (rng() % 13);
    in.offset_align = std::size_t{512} << (rng() % 5);
    in.page = 4096;
    in.block_size = 1 + rng() % (2 << 20);
    in.workers = 1 + rng() % 9;
    in.bounce_bytes = rng() % 5 == 0 ? 0 : (std::size_t{1} << (12 + rng() % 9));
    SCOPED_TRACE(testing::Message() << "case " << i << " n=" << in.nbytes << " off=" << in.file_offset
                                    << " workers=" << in.workers << " block=" << in.block_size);
    check_plan(in);
    if (HasFailure()) return;
  }
}

// A backend that takes any alignment (GPUDirect Storage): every byte Direct, in worker order;
// a short first segment up to the first page boundary, then page-aligned chunks; every request
// the workers cut (chunk by chunk from each segment's start) starts page-aligned but the very
// first; and no 4 KiB page is touched by two workers, so parallel cuFile writes never
// read-modify-write one block from two threads.
TEST(Plan, AnyAlignmentCutsPageAlignedChunksAndNoPageIsShared) {
  std::mt19937_64 rng(777);
  alignas(4096) static std::byte arena[1 << 16];
  constexpr std::uint64_t kPage = 4096;
  for (int i = 0; i < 20000; ++i) {
    PlanInput in;
    in.buf = arena + rng() % 8192;
    in.nbytes = rng() % 3 == 0 ? rng() % 100 : rng() % (16u << 20);
    in.file_offset = rng() % 2 == 0 ? (rng() % 4096) * kPage : rng() % (1ull << 34);
    in.direct = rng() % 2 == 0;
    in.mem_align = 4096;
    in.offset_align = 4096;
    in.page = kPage;
    in.block_size = 1 + rng() % (2 << 20);
    in.workers = 1 + rng() % 9;
    in.any_alignment = true;
    SCOPED_TRACE(testing::Message() << "case " << i << " n=" << in.nbytes << " off=" << in.file_offset
                                    << " workers=" << in.workers << " block=" << in.block_size);
    const auto slices = plan_request(in);
    if (in.nbytes == 0) {
      ASSERT_TRUE(slices.empty());
      continue;
    }
    const std::uint64_t end = in.file_offset + in.nbytes;
    const std::size_t chunk = std::max<std::size_t>(kPage, in.block_size / kPage * kPage);
    std::uint64_t pos = in.file_offset;
    std::size_t last_worker = 0;
    std::uint64_t last_page_of_previous_worker = 0;
    bool first_request = true;
    for (std::size_t k = 0; k < slices.size(); ++k) {
      const auto& s = slices[k];
      ASSERT_LT(s.worker, in.workers);
      ASSERT_FALSE(s.segments.empty());
      if (k > 0) {
        ASSERT_GT(s.worker, last_worker);
        ASSERT_GT(s.segments.front().file_offset / kPage, last_page_of_previous_worker) << "a page shared by workers";
      }
      last_worker = s.worker;
      for (const auto& g : s.segments) {
        ASSERT_EQ(g.mode, SegmentMode::Direct);
        ASSERT_EQ(g.file_offset, pos);
        ASSERT_EQ(g.buf, in.buf + (g.file_offset - in.file_offset));
        ASSERT_EQ(g.chunk, chunk);
        // The worker's cut: requests of g.chunk bytes from the segment's start.
        for (std::uint64_t r = g.file_offset; r < g.file_offset + g.nbytes; r += g.chunk) {
          if (!first_request) {
            ASSERT_EQ(r % kPage, 0u) << "request at " << r << " not page-aligned";
          }
          ASSERT_LE(std::min<std::uint64_t>(g.chunk, g.file_offset + g.nbytes - r), chunk);
          first_request = false;
        }
        pos += g.nbytes;
      }
      last_page_of_previous_worker = (pos - 1) / kPage;
    }
    ASSERT_EQ(pos, end);
    // The first segment ends at the first page boundary (or the end of the request).
    const auto& head = slices.front().segments.front();
    if (in.file_offset % kPage != 0) {
      ASSERT_EQ(head.file_offset + head.nbytes, std::min(end, (in.file_offset / kPage + 1) * kPage));
    }
  }
}

TEST(Plan, AlignedRequestIsAllDirectAndEvenlySplit) {
  alignas(4096) static std::byte arena[1 << 12];
  PlanInput in{arena, std::size_t{64} << 20, 0, true, 512, 512, 4096, 1 << 20, 4, 1 << 20};
  const auto slices = plan_request(in);
  ASSERT_EQ(slices.size(), 4u);
  for (const auto& s : slices) {
    ASSERT_EQ(s.segments.size(), 1u);
    EXPECT_EQ(s.segments[0].mode, SegmentMode::Direct);
    EXPECT_EQ(s.segments[0].nbytes, std::size_t{16} << 20);
    EXPECT_EQ(s.segments[0].chunk, std::size_t{1} << 20);
  }
}

TEST(Plan, UnalignedEndsGoBufferedAndMisalignedBufferBounces) {
  alignas(4096) static std::byte arena[1 << 12];
  PlanInput in{arena + 1, 3 * 4096 + 100, 4095, true, 512, 512, 4096, 1 << 20, 1, 1 << 20};
  const auto slices = plan_request(in);
  ASSERT_EQ(slices.size(), 1u);
  const auto& g = slices[0].segments;
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].mode, SegmentMode::Buffered);
  EXPECT_EQ(g[0].nbytes, 1u);                 // 4095 -> 4096
  EXPECT_EQ(g[1].mode, SegmentMode::Bounce);  // buffer + 1 is never 512-aligned
  EXPECT_EQ(g[1].file_offset, 4096u);
  EXPECT_EQ(g[2].mode, SegmentMode::Buffered);
}

TEST(Plan, BlockBelowAlignmentBecomesOneUnit) {
  alignas(4096) static std::byte arena[1 << 12];
  PlanInput in{arena, 8 * 4096, 0, true, 512, 512, 4096, 100, 1, 1 << 20};
  const auto slices = plan_request(in);
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].segments[0].chunk, 4096u);
}

TEST(Plan, SmallRequestsUseOneWorker) {
  alignas(4096) static std::byte arena[1 << 12];
  PlanInput in{arena, 100, 0, true, 512, 512, 4096, 1 << 20, 8, 1 << 20};
  const auto slices = plan_request(in);
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].segments[0].mode, SegmentMode::Buffered);
}

// Issue 46: an op of at most two blocks is one slice, on the worker the engine turns round;
// cutting a 64 KiB read into two 32 KiB requests on two workers only doubled the requests.
TEST(Plan, RequestsUpToTwoBlocksGoWholeToTheGivenWorkerAndLargerOnesAreCut) {
  alignas(4096) static std::byte arena[1 << 12];
  PlanInput in{arena, 64 << 10, 1 << 20, true, 512, 512, 4096, 1 << 20, 2, 1 << 20};
  for (std::size_t first = 0; first < 5; ++first) {
    in.first_worker = first;
    for (const std::size_t n : {std::size_t{4096}, std::size_t{64} << 10, std::size_t{2} << 20}) {
      in.nbytes = n;
      const auto slices = plan_request(in);
      ASSERT_EQ(slices.size(), 1u) << n;
      EXPECT_EQ(slices[0].worker, first % 2);
      ASSERT_EQ(slices[0].segments.size(), 1u);
      EXPECT_EQ(slices[0].segments[0].nbytes, n);
      EXPECT_EQ(slices[0].segments[0].mode, SegmentMode::Direct);
    }
    in.nbytes = (2 << 20) + 4096;  // more than two blocks: both workers
    const auto cut = plan_request(in);
    ASSERT_EQ(cut.size(), 2u);
    EXPECT_EQ(cut[0].segments[0].nbytes + cut[1].segments[0].nbytes, in.nbytes);
  }
  // One-range operations spread over the workers too.
  const std::vector<IoRange> one{{0, 0, 64 << 10}};
  in.first_worker = 3;
  const auto r = plan_ranges(in, one);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].worker, 1u);
}

TEST(PlanRanges, SmallRangesGoWholeToWorkersInEqualSharesAndLargeOnesAreCut) {
  alignas(4096) static std::byte arena[16 << 20];
  // 2 workers, 1 MiB blocks: 64 ranges of 4 KiB (two halves of 128 KiB), one empty range, then
  // one 8 MiB range (more than two blocks: cut across both workers).
  std::vector<IoRange> ranges;
  for (std::size_t i = 0; i < 64; ++i) ranges.push_back({(63 - i) * 4096, i * 4096, 4096});
  ranges.push_back({1 << 30, 0, 0});
  ranges.push_back({std::uint64_t{1} << 24, 1 << 20, 8 << 20});
  PlanInput in{arena, 0, 0, true, 512, 512, 4096, 1 << 20, 2, 1 << 20};
  const auto slices = plan_ranges(in, ranges);
  ASSERT_EQ(slices.size(), 2u);
  std::uint64_t bytes[2] = {0, 0};
  std::size_t small_on[2] = {0, 0};
  for (const Slice& s : slices) {
    for (const Segment& g : s.segments) {
      EXPECT_EQ(g.mode, SegmentMode::Direct);
      bytes[s.worker] += g.nbytes;
      if (g.nbytes == 4096) {
        ++small_on[s.worker];
        // each small range keeps its own buffer place: file slot (63 - i) <-> buffer slot i
        EXPECT_EQ(static_cast<std::size_t>(g.buf - arena) / 4096, 63 - g.file_offset / 4096);
      }
    }
  }
  EXPECT_EQ(bytes[0] + bytes[1], 64u * 4096 + (8 << 20));
  EXPECT_EQ(small_on[0], 64u) << "the small ranges come first in the order: all in worker 0's share";
  EXPECT_EQ(bytes[1], 4u << 20) << "the large range is cut in two halves";
  // Without the large range, 64 ranges of 64 KiB (4 MiB, more than two blocks) split half and
  // half, each worker's in order.
  std::vector<IoRange> mid;
  for (std::size_t i = 0; i < 64; ++i) mid.push_back({(63 - i) * 65536, i * 65536, 65536});
  const auto halves = plan_ranges(in, mid);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0].segments.size(), 32u);
  EXPECT_EQ(halves[1].segments.size(), 32u);
  EXPECT_EQ(halves[1].segments.front().file_offset, 31u * 65536);
  // The 64 small ones alone (256 KiB, at most two blocks): whole to worker first_worker, one
  // wake-up and one completion for the op; the next op's first_worker takes it to the other.
  ranges.resize(64);
  const auto whole = plan_ranges(in, ranges);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].worker, 0u);
  EXPECT_EQ(whole[0].segments.size(), 64u);
  PlanInput next = in;
  next.first_worker = 1;
  const auto other = plan_ranges(next, ranges);
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(other[0].worker, 1u);
  // Nothing to move: no slices.
  EXPECT_TRUE(plan_ranges(in, std::vector<IoRange>{{0, 0, 0}}).empty());
  EXPECT_TRUE(plan_ranges(in, {}).empty());
}

}  // namespace
}  // namespace deepio::detail
