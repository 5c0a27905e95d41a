// The conformance suite: the specification every backend must meet. Each test runs once per
// backend; a backend that cannot be set up here skips with its reason. It runs a fourth time
// over the GPUDirect Storage route (GdsHandle, cuFile's backend) with the fake CUDA driver
// treating every test buffer as device memory: that instance needs DEEPIO_CUDA_LIBRARY and
// DEEPIO_CUFILE_LIBRARY pointed at the fakes (the CTest entry deepio_tests.gds does) and skips
// otherwise. Tests of host-path counters (direct, bounced, buffered bytes) skip there.
//
// Byte-for-byte checks are against plain pread()/pwrite() on the same files.
#include "conformance.hpp"

namespace deepio {
namespace {

using namespace conformance;  // NOLINT(google-build-using-namespace): the suite's own fixture

TEST_P(Conformance, SizesOffsetsAndBufferAlignments) {
  auto h_owner = make(opts({.block_size = 64 << 10, .queue_depth = 8, .overlap_events = true}));
  Handle& h = *h_owner;
  const std::string path = dir_.file("f");
  put(path, pattern(3 << 20, 99));  // existing content that must survive around each write
  std::uint32_t seed = 1;
  for (std::size_t n : {0ul, 1ul, 511ul, 512ul, 4095ul, 4096ul, (1ul << 20) - 1, 1ul << 20, (1ul << 20) + 1}) {
    for (std::uint64_t offset : {0ul, 1ul, 512ul, 4096ul + 7, 1ul << 20}) {
      for (std::size_t misalign : {0ul, 1ul, 512ul}) {
        round_trip(h, path, n, offset, misalign, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(Conformance, LargeUnalignedTransfer) {
  auto h_owner = make(opts({.queue_depth = 32, .overlap_events = true, .intra_op_parallelism = 3}));
  Handle& h = *h_owner;
  round_trip(h, dir_.file("big"), (64ul << 20) + 17, 4096 * 3 + 5, 0, 7);
}

TEST_P(Conformance, ParallelismWithIndivisibleSizes) {
  const std::string path = dir_.file("p");
  for (std::size_t p = 1; p <= 8; ++p) {
    auto h_owner = make(opts({.block_size = 8192, .queue_depth = 4, .intra_op_parallelism = p}));
    Handle& h = *h_owner;
    const std::size_t n = 1000003 + p;  // a prime plus p: never divisible by p * 512
    round_trip(h, path, n, p * 333, p % 2 == 0 ? 0 : 64, static_cast<std::uint32_t>(p));
    if (HasFatalFailure()) return;
  }
}

TEST_P(Conformance, BlockSizesBelowAlignmentAndOdd) {
  const std::string path = dir_.file("b");
  for (std::size_t block : {1ul, 100ul, 512ul, 4097ul, 65536ul + 1}) {
    auto h_owner = make(
        opts({.block_size = block, .queue_depth = 16, .overlap_events = true, .intra_op_parallelism = 2}));
    Handle& h = *h_owner;
    round_trip(h, path, 300000, 4096, 0, static_cast<std::uint32_t>(block));
    if (HasFatalFailure()) return;
  }
}

TEST_P(Conformance, QueueDepthsAndSubmitModes) {
  const std::string path = dir_.file("q");
  std::uint32_t seed = 0;
  for (std::size_t qd : {1ul, 2ul, 7ul, 64ul, 256ul}) {
    for (bool single : {false, true}) {
      for (bool overlap : {false, true}) {
        auto h_owner = make(
            opts({.block_size = 16384, .queue_depth = qd, .single_submit = single, .overlap_events = overlap}));
        Handle& h = *h_owner;
        ++seed;
        round_trip(h, path, (1 << 20) + 4096 * 3, 8192, seed % 2 == 0 ? 0 : 8, seed);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(Conformance, ManyAsyncOpsThenOneWait) {
  auto h_owner = make(opts({.block_size = 65536, .queue_depth = 32, .overlap_events = true}));
  Handle& h = *h_owner;
  constexpr int kFiles = 200;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kFiles; ++i)
    data.push_back(pattern(65536 + static_cast<std::size_t>(i) * 13, static_cast<std::uint32_t>(i)));
  for (int i = 0; i < kFiles; ++i) {
    h.async_pwrite(data[i].data(), data[i].size(), dir_.file("m" + std::to_string(i)));
  }
  EXPECT_EQ(h.pending(), static_cast<std::size_t>(kFiles));
  EXPECT_EQ(h.wait(), static_cast<std::size_t>(kFiles));
  EXPECT_EQ(h.wait(), 0u) << "nothing pending";
  std::vector<std::vector<std::byte>> back(kFiles);
  for (int i = 0; i < kFiles; ++i) {
    back[i].resize(data[i].size());
    h.async_pread(back[i].data(), back[i].size(), dir_.file("m" + std::to_string(i)));
  }
  EXPECT_EQ(h.wait(), static_cast<std::size_t>(kFiles));
  for (int i = 0; i < kFiles; ++i) ASSERT_EQ(back[i], data[i]) << i;
}

// Destroying the handle right after a batch: every write of it still lands.
TEST_P(Conformance, HandleDestroyedRightAfterABatchFinishesIt) {
  constexpr int kFiles = 64;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kFiles; ++i) data.push_back(pattern(70000 + static_cast<std::size_t>(i), 40u + i));
  {
    auto h = make(opts({.block_size = 16384, .queue_depth = 4, .intra_op_parallelism = 2}));
    std::vector<IoRequest> reqs;
    for (int i = 0; i < kFiles; ++i) {
      reqs.push_back({.write = true,
                      .buffer = data[i].data(),
                      .nbytes = data[i].size(),
                      .path = dir_.file("d" + std::to_string(i))});
    }
    (void)h->submit_batch(std::move(reqs));
    forget(h.get());  // `h` is now the last owner: the scope's end destroys the handle
  }
  for (int i = 0; i < kFiles; ++i) ASSERT_EQ(slurp(dir_.file("d" + std::to_string(i))), data[i]) << i;
}

TEST_P(Conformance, SyncCallCountsOnlyItsOwnOp) {
  auto h_owner = make(opts());
  Handle& h = *h_owner;
  auto a = pattern(10000, 1), b = pattern(20000, 2);
  h.async_pwrite(a.data(), a.size(), dir_.file("a"));
  EXPECT_EQ(h.sync_pwrite(b.data(), b.size(), dir_.file("b")), 1u) << "its own op only (DeepNVMe counted every one)";
  EXPECT_EQ(slurp(dir_.file("b")), b);
  EXPECT_EQ(h.wait(), 1u) << "the earlier async op stays for wait()";
  EXPECT_EQ(slurp(dir_.file("a")), a);
}

TEST_P(Conformance, FutureReportsCompletionAndBytes) {
  auto h_owner = make(opts());
  Handle& h = *h_owner;
  auto a = pattern(123457, 3);
  Future f = h.async_pwrite(a.data(), a.size(), dir_.file("fut"));
  EXPECT_EQ(f.get(), a.size());
  EXPECT_TRUE(f.done());
  EXPECT_EQ(h.pending(), 0u) << "collected through its Future: no longer pending";
  EXPECT_EQ(h.wait(), 0u) << "an op collected through its Future is not counted again";
  std::vector<std::byte> back(a.size());
  Future r = h.async_pread(back.data(), back.size(), dir_.file("fut"));
  EXPECT_TRUE(r.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(back, a);
}

TEST_P(Conformance, ConcurrentThreadsOnOneHandleAndAcrossHandles) {
  auto shared_owner = make(
      opts({.block_size = 32768, .queue_depth = 16, .overlap_events = true, .intra_op_parallelism = 2}));
  Handle& shared = *shared_owner;
  constexpr int kThreads = 6, kOps = 20;
  std::atomic<std::size_t> counted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto own_owner = make(opts({.queue_depth = 8}));
      Handle& own = *own_owner;
      for (int i = 0; i < kOps; ++i) {
        const auto data = pattern(50000 + static_cast<std::size_t>(i), static_cast<std::uint32_t>(t * 100 + i));
        const std::string path = dir_.file("t" + std::to_string(t) + "_" + std::to_string(i));
        Handle& h = i % 2 == 0 ? shared : own;
        h.async_pwrite(data.data(), data.size(), path);
        counted += h.wait();
        std::vector<std::byte> back(data.size());
        counted += h.sync_pread(back.data(), back.size(), path);
        EXPECT_EQ(back, data);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every op (a write and a read per iteration) is collected by exactly one wait(): its own
  // thread's, or another thread's that started after it was submitted.
  EXPECT_EQ(counted.load(), static_cast<std::size_t>(2 * kThreads * kOps));
  EXPECT_EQ(shared.pending(), 0u);
}

TEST_P(Conformance, ConcurrentWaitersEachOpCountedOnce) {
  auto h_owner = make(opts({.block_size = 4096, .queue_depth = 4}));
  Handle& h = *h_owner;
  constexpr int kOps = 64;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kOps; ++i) data.push_back(pattern(200000, static_cast<std::uint32_t>(i)));
  for (int i = 0; i < kOps; ++i) h.async_pwrite(data[i].data(), data[i].size(), dir_.file("w" + std::to_string(i)));
  std::atomic<std::size_t> total{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t) waiters.emplace_back([&] { total += h.wait(); });
  for (auto& t : waiters) t.join();
  EXPECT_EQ(total.load(), static_cast<std::size_t>(kOps));
  for (int i = 0; i < kOps; ++i) ASSERT_EQ(slurp(dir_.file("w" + std::to_string(i))), data[i]);
}

TEST_P(Conformance, DescriptorVariantsDirectAndBuffered) {
  const std::string path = dir_.file("fd");
  put(path, pattern(1 << 20, 5));
  for (int extra : {0, O_DIRECT}) {
    const int fd = ::open(path.c_str(), O_RDWR | extra | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    auto h_owner = make(opts({.block_size = 65536, .intra_op_parallelism = 2}));
    Handle& h = *h_owner;
    const auto data = pattern(300001, static_cast<std::uint32_t>(extra + 1));
    h.async_pwrite(data.data(), data.size(), fd, 4097);
    EXPECT_EQ(h.wait(), 1u);
    std::vector<std::byte> back(data.size());
    h.async_pread(back.data(), back.size(), fd, 4097);
    EXPECT_EQ(h.wait(), 1u);
    EXPECT_EQ(back, data);
    EXPECT_EQ(::fcntl(fd, F_GETFD), FD_CLOEXEC) << "deepio never closes the caller's descriptor";
    ::close(fd);
    auto file = slurp(path);
    ASSERT_EQ(file.size(), 1u << 20);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), file.begin() + 4097));
  }
}

TEST_P(Conformance, DirectIoReallyHappensOnAlignedRequests) {
  if (gds()) GTEST_SKIP() << "host-path counters: cuFile moves device memory itself";
  const auto info = probe_direct_io(dir_.path().string());
  if (!info.supported) GTEST_SKIP() << "no O_DIRECT here: " << info.reason;
  auto h_owner = make(opts({.direct_io = DirectIo::On}));
  Handle& h = *h_owner;
  UniqueLockedBuffer buf(4 << 20);
  std::memset(buf.data(), 7, buf.size());
  h.sync_pwrite(buf.data(), buf.size(), dir_.file("d"));
  h.sync_pread(buf.data(), buf.size(), dir_.file("d"));
  const auto s = h.stats();
  EXPECT_EQ(s.bytes_direct, 2u * buf.size());
  EXPECT_EQ(s.bytes_buffered, 0u);
  EXPECT_EQ(s.bytes_bounced, 0u);
  EXPECT_EQ(s.ops_completed, 2u);
}

TEST_P(Conformance, MisalignedBufferBouncesAndStaysCorrect) {
  if (gds()) GTEST_SKIP() << "host-path counters: cuFile moves device memory itself";
  const auto info = probe_direct_io(dir_.path().string());
  if (!info.supported || info.mem_align <= 1) GTEST_SKIP() << "bounce needs a memory alignment > 1";
  auto h_owner = make(opts());
  Handle& h = *h_owner;
  OffsetBuffer src(1 << 20, 1);
  src.fill(pattern(1 << 20, 11));
  h.sync_pwrite(src.data(), src.size(), dir_.file("bounce"));
  EXPECT_EQ(h.stats().bytes_bounced, 1u << 20);
  EXPECT_EQ(slurp(dir_.file("bounce")), src.copy());
}

TEST_P(Conformance, TmpfsFileWorksWhateverItsDirectIoSupport) {
  if (gds()) GTEST_SKIP() << "host-path counters: cuFile moves device memory itself";
  // tmpfs refused O_DIRECT before Linux 6.6 and accepts it since; both must work and the
  // statistics must say which happened.
  const std::string path = "/dev/shm/deepio-test-" + std::to_string(::getpid()) + "-" +
                           std::string(to_string(GetParam().kind));
  const bool direct = probe_direct_io("/dev/shm").supported;
  auto h_owner = make(opts());
  Handle& h = *h_owner;
  const auto data = pattern((1 << 20) + 3, 21);
  h.sync_pwrite(data.data(), data.size(), path);
  std::vector<std::byte> back(data.size());
  h.sync_pread(back.data(), back.size(), path);
  EXPECT_EQ(back, data);
  const auto s = h.stats();
  if (direct) {
    EXPECT_GT(s.bytes_direct + s.bytes_bounced, 0u);
  } else {
    EXPECT_GT(s.direct_refused, 0u);
    EXPECT_EQ(s.bytes_direct + s.bytes_bounced, 0u);
  }
  ::unlink(path.c_str());
}

// A file system that refuses O_DIRECT at open (older tmpfs, some FUSE): simulated with the
// fault hook, which fails every open that asks for O_DIRECT with EINVAL as such kernels do.
TEST_P(Conformance, FileSystemRefusingDirectIoFallsBackVisibly) {
  if (gds()) GTEST_SKIP() << "host-path counters: cuFile moves device memory itself";
  detail::set_fault_hook([](const detail::FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == detail::FaultPoint::Open && (s.flags & O_DIRECT) != 0) return -EINVAL;
    return std::nullopt;
  });
  const std::string path = dir_.file("nodirect");
  auto h_owner = make(opts());
  Handle& h = *h_owner;
  const auto data = pattern((1 << 20) + 3, 21);
  h.sync_pwrite(data.data(), data.size(), path);
  std::vector<std::byte> back(data.size());
  h.sync_pread(back.data(), back.size(), path);
  EXPECT_EQ(back, data);
  EXPECT_EQ(h.stats().direct_refused, 2u);
  EXPECT_EQ(h.stats().bytes_direct + h.stats().bytes_bounced, 0u);
  auto strict_owner = make(opts({.direct_io = DirectIo::On}));
  Handle& strict = *strict_owner;
  try {
    strict.sync_pwrite(data.data(), data.size(), path);
    ADD_FAILURE() << "direct_io=on must fail where O_DIRECT is refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_EQ(e.path(), path);
  }
  detail::set_fault_hook({});
}

TEST_P(Conformance, BufferedModeMatchesPlainIo) {
  if (gds()) GTEST_SKIP() << "host-path counters: cuFile moves device memory itself";
  auto h_owner = make(
      opts({.block_size = 4096, .queue_depth = 8, .intra_op_parallelism = 3, .direct_io = DirectIo::Off}));
  Handle& h = *h_owner;
  round_trip(h, dir_.file("off"), 1234567, 33, 5, 77);
  EXPECT_EQ(h.stats().bytes_direct + h.stats().bytes_bounced, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         testing::Values(Variant{BackendKind::IoUring}, Variant{BackendKind::Libaio},
                                         Variant{BackendKind::Threads}, Variant{BackendKind::Auto, true}),
                         variant_name);

}  // namespace
}  // namespace deepio
