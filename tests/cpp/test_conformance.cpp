// The conformance suite: the specification every backend must meet. Each test runs once per
// backend; a backend that cannot be set up here skips with its reason. It runs a fourth time
// over the GPUDirect Storage route (GdsHandle, cuFile's backend) with the fake CUDA driver
// treating every test buffer as device memory: that instance needs DEEPIO_CUDA_LIBRARY and
// DEEPIO_CUFILE_LIBRARY pointed at the fakes (the CTest entry deepio_tests.gds does) and skips
// otherwise. Tests of host-path counters (direct, bounced, buffered bytes) skip there.
//
// Byte-for-byte checks are against plain pread()/pwrite() on the same files.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "deepio/gpu.hpp"
#include "platform/fault.hpp"
#include "common/support.hpp"

namespace deepio {
namespace {

using test::OffsetBuffer;
using test::pattern;
using test::put;
using test::slurp;

// A backend, or the GDS route (kind ignored).
struct Variant {
  BackendKind kind = BackendKind::Auto;
  bool gds = false;
};

std::string variant_name(const testing::TestParamInfo<Variant>& info) {
  return info.param.gds ? "gds" : std::string(to_string(info.param.kind));
}

// Turns the fake driver's "every buffer is device memory" switch on or off; false when the
// process did not load the fake (a real driver, or none).
bool adopt_all(bool on) {
  const char* lib = std::getenv("DEEPIO_CUDA_LIBRARY");
  if (lib == nullptr || *lib == '\0') return false;
  void* h = ::dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  auto* fn = reinterpret_cast<void (*)(int)>(::dlsym(h, "deepio_fake_cuda_adopt_all"));
  if (fn != nullptr) fn(on ? 1 : 0);
  ::dlclose(h);
  return fn != nullptr;
}

class Conformance : public testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    if (gds()) {
      const GpuInfo info = gpu_info();  // loads the drivers named by the environment
      if (!info.cuda_found || !info.cufile_found) {
        GTEST_SKIP() << "no CUDA/cuFile: " << info.cuda_reason << info.cufile_reason;
      }
      if (!adopt_all(true)) {
        GTEST_SKIP() << "the GDS instance needs the fake CUDA driver (DEEPIO_CUDA_LIBRARY)";
      }
      return;
    }
    std::string why;
    if (!test::backend_available(GetParam().kind, &why)) {
      GTEST_SKIP() << to_string(GetParam().kind) << ": " << why;
    }
  }
  void TearDown() override {
    detail::set_fault_hook({});
    if (gds()) {
      // Every test really went through cuFile, not through staging or the host path.
      for (const auto& h : made_) EXPECT_EQ(h->gds_stats().bytes_staged, 0u);
      std::uint64_t cufile = 0;
      for (const auto& h : made_) cufile += h->gds_stats().bytes_cufile;
      if (!made_.empty()) {
        EXPECT_GT(cufile, 0u) << "no byte went through cuFile";
      }
      adopt_all(false);
    }
  }
  [[nodiscard]] bool gds() const { return GetParam().gds; }
  /// `o` with this test's backend.
  [[nodiscard]] HandleOptions opts(HandleOptions o = {}) const {
    if (!gds()) o.backend = GetParam().kind;
    return o;
  }
  /// A Handle, or for the GDS instance a GdsHandle with the same options.
  std::shared_ptr<Handle> make(const HandleOptions& o) {
    if (!gds()) return std::make_shared<Handle>(o);
    auto h = std::make_shared<GdsHandle>(GdsOptions{.block_size = o.block_size,
                                                    .queue_depth = o.queue_depth,
                                                    .single_submit = o.single_submit,
                                                    .overlap_events = o.overlap_events,
                                                    .intra_op_parallelism = o.intra_op_parallelism,
                                                    .mode = GdsMode::CuFile});
    const std::lock_guard lock(made_mutex_);  // tests make handles from several threads
    made_.push_back(h);
    return h;
  }
  /// For a test that must destroy its handle: TearDown's cuFile check no longer covers it.
  void forget(const Handle* h) {
    const std::lock_guard lock(made_mutex_);
    std::erase_if(made_, [h](const auto& m) { return m.get() == h; });
  }
  test::TempDir dir_;
  std::mutex made_mutex_;
  std::vector<std::shared_ptr<GdsHandle>> made_;  // kept for TearDown's check of their stats
};

// Writes `n` bytes at `offset` from a buffer misaligned by `misalign`, checks the file, then
// reads them back into another misaligned buffer and checks memory.
void round_trip(Handle& h, const std::string& path, std::size_t n, std::uint64_t offset, std::size_t misalign,
                std::uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset << " misalign=" << misalign);
  const auto data = pattern(n, seed);
  const auto before = slurp(path);
  OffsetBuffer src(n, misalign);
  src.fill(data);
  h.sync_pwrite(src.data(), n, path, offset);
  auto after = slurp(path);
  ASSERT_EQ(after.size(), std::max<std::size_t>(before.size(), offset + n)) << "no truncation, exact extent";
  ASSERT_TRUE(std::equal(data.begin(), data.end(), after.begin() + static_cast<std::ptrdiff_t>(offset)))
      << "written bytes differ";
  for (std::size_t i = 0; i < std::min<std::size_t>(before.size(), offset); ++i) {
    ASSERT_EQ(after[i], before[i]) << "byte " << i << " before the write changed";
  }
  for (std::size_t i = offset + n; i < before.size(); ++i) {
    ASSERT_EQ(after[i], before[i]) << "byte " << i << " after the write changed";
  }
  OffsetBuffer dst(n, (misalign * 7 + 3) % 4096);
  std::memset(dst.data(), 0x5a, n);
  h.sync_pread(dst.data(), n, path, offset);
  ASSERT_EQ(dst.copy(), data) << "read bytes differ";
}

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

// A batch: reads and writes mixed, paths and descriptors, many files and one file at
// offsets, sizes and offsets not aligned; one call, then one wait() for all of it.
TEST_P(Conformance, BatchOfReadsAndWritesMovesExactlyThePlainIoBytes) {
  auto h_owner = make(opts({.block_size = 65536, .queue_depth = 32, .intra_op_parallelism = 3}));
  Handle& h = *h_owner;
  constexpr int kFiles = 150;
  std::vector<std::vector<std::byte>> data;
  std::vector<IoRequest> writes;
  for (int i = 0; i < kFiles; ++i) {
    data.push_back(pattern(4096 * static_cast<std::size_t>(i % 7) + static_cast<std::size_t>(i) * 13 + 1,
                           static_cast<std::uint32_t>(i)));
    writes.push_back({.write = true,
                      .buffer = data.back().data(),
                      .nbytes = data.back().size(),
                      .path = dir_.file("b" + std::to_string(i)),
                      .file_offset = static_cast<std::uint64_t>(i % 3) * 511});
  }
  // One file at offsets, through a descriptor the caller owns.
  const auto big = pattern(3 << 20, 99);
  const int fd = ::open(dir_.file("one").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  for (std::size_t off = 0; off < big.size(); off += 300000) {
    const std::size_t n = std::min<std::size_t>(300000, big.size() - off);
    writes.push_back(
        {.write = true, .buffer = const_cast<std::byte*>(big.data() + off), .nbytes = n, .fd = fd, .file_offset = off});
  }
  const std::size_t nwrites = writes.size();
  std::vector<Future> wf = h.submit_batch(std::move(writes));
  EXPECT_EQ(wf.size(), nwrites);
  EXPECT_EQ(h.wait(), nwrites) << "every request of the batch is collected by wait()";
  for (int i = 0; i < kFiles; ++i) {
    const auto file = slurp(dir_.file("b" + std::to_string(i)));
    const std::size_t off = static_cast<std::size_t>(i % 3) * 511;
    ASSERT_EQ(file.size(), off + data[i].size()) << i;
    ASSERT_TRUE(std::equal(data[i].begin(), data[i].end(), file.begin() + static_cast<std::ptrdiff_t>(off))) << i;
  }
  EXPECT_EQ(slurp(dir_.file("one")), big);

  std::vector<std::vector<std::byte>> back(kFiles);
  std::vector<std::byte> big_back(big.size());
  std::vector<IoRequest> reads;
  for (int i = 0; i < kFiles; ++i) {
    back[i].resize(data[i].size());
    reads.push_back({.buffer = back[i].data(),
                     .nbytes = back[i].size(),
                     .path = dir_.file("b" + std::to_string(i)),
                     .file_offset = static_cast<std::uint64_t>(i % 3) * 511});
  }
  for (std::size_t off = 0; off < big.size(); off += 262144) {
    const std::size_t n = std::min<std::size_t>(262144, big.size() - off);
    reads.push_back({.buffer = big_back.data() + off, .nbytes = n, .fd = fd, .file_offset = off});
  }
  std::vector<Future> rf = h.submit_batch(std::move(reads));
  std::size_t moved = 0;
  for (auto& f : rf) moved += f.get();
  std::size_t expected = big.size();
  for (const auto& d : data) expected += d.size();
  EXPECT_EQ(moved, expected);
  EXPECT_EQ(h.wait(), 0u) << "collected through their Futures";
  for (int i = 0; i < kFiles; ++i) ASSERT_EQ(back[i], data[i]) << i;
  EXPECT_EQ(big_back, big);
  ::close(fd);
}

// A request that cannot be opened or reads past the end fails alone, reported by its Future
// and by wait(), while the rest of the batch completes; argument errors refuse the batch.
TEST_P(Conformance, BatchFailuresBelongToTheirRequest) {
  auto h_owner = make(opts({.block_size = 65536, .queue_depth = 8, .intra_op_parallelism = 2}));
  Handle& h = *h_owner;
  const auto a = pattern(100000, 5);
  put(dir_.file("a"), a);
  std::vector<std::byte> r1(a.size()), r2(10), r3(a.size());
  std::vector<IoRequest> reqs;
  reqs.push_back({.buffer = r1.data(), .nbytes = r1.size(), .path = dir_.file("a")});
  reqs.push_back({.buffer = r2.data(), .nbytes = r2.size(), .path = dir_.file("missing")});
  reqs.push_back({.buffer = r3.data(), .nbytes = r3.size(), .path = dir_.file("a"), .file_offset = 1});
  std::vector<Future> f = h.submit_batch(std::move(reqs));
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].get(), a.size());
  EXPECT_EQ(r1, a);
  try {
    f[1].get();
    ADD_FAILURE() << "a missing file must fail its request";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOENT);
    EXPECT_EQ(e.path(), dir_.file("missing"));
    EXPECT_EQ(e.nbytes(), 10u) << "the failure names the request";
  }
  try {
    f[2].get();
    ADD_FAILURE() << "a read past the end must fail its request";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA);
  }
  EXPECT_EQ(h.pending(), 0u);

  // The same failures through wait(): all three collected, the first failure (ENOENT) thrown.
  std::vector<IoRequest> again;
  again.push_back({.buffer = r1.data(), .nbytes = r1.size(), .path = dir_.file("a")});
  again.push_back({.buffer = r2.data(), .nbytes = r2.size(), .path = dir_.file("missing")});
  (void)h.submit_batch(std::move(again));
  WaitResult w = h.collect();
  EXPECT_EQ(w.count, 2u);
  ASSERT_EQ(w.errors.size(), 1u);
  EXPECT_EQ(w.errors[0].errnum(), ENOENT);

  // Argument errors refuse the whole batch before anything is submitted.
  std::vector<IoRequest> bad;
  bad.push_back({.buffer = r1.data(), .nbytes = r1.size(), .path = dir_.file("never")});
  bad.push_back({.buffer = nullptr, .nbytes = 8, .path = dir_.file("never")});
  try {
    (void)h.submit_batch(std::move(bad));
    ADD_FAILURE() << "a null buffer must refuse the batch";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
  }
  std::vector<IoRequest> neither;
  neither.push_back({.buffer = r1.data(), .nbytes = 1});
  EXPECT_THROW((void)h.submit_batch(std::move(neither)), InvalidArgument);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(::access(dir_.file("never").c_str(), F_OK), -1) << "nothing of a refused batch ran";
  EXPECT_TRUE(h.submit_batch({}).empty());
}

// Consecutive requests on one path share one open of it: unaligned chunks (heads and tails
// through the page cache), writes that extend the file as they go, a read past the end that
// fails alone among good reads of the same file, and direction changes on the same path.
TEST_P(Conformance, BatchOnOnePathAtManyOffsets) {
  auto h_owner = make(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 2}));
  Handle& h = *h_owner;
  const std::string path = dir_.file("shared");
  const auto big = pattern((5 << 20) + 12345, 61);
  std::vector<IoRequest> writes;
  for (std::size_t off = 0; off < big.size(); off += 100003) {
    const std::size_t n = std::min<std::size_t>(100003, big.size() - off);
    writes.push_back({.write = true,
                      .buffer = const_cast<std::byte*>(big.data() + off),
                      .nbytes = n,
                      .path = path,
                      .file_offset = off});
  }
  const std::size_t nwrites = writes.size();
  EXPECT_EQ(h.submit_batch(std::move(writes)).size(), nwrites);
  EXPECT_EQ(h.wait(), nwrites);
  ASSERT_EQ(slurp(path), big);

  std::vector<std::byte> back(big.size());
  std::vector<std::byte> past(10);
  std::vector<IoRequest> reads;
  for (std::size_t off = 0; off < big.size(); off += 77777) {
    const std::size_t n = std::min<std::size_t>(77777, big.size() - off);
    reads.push_back({.buffer = back.data() + off, .nbytes = n, .path = path, .file_offset = off});
    if (reads.size() == 5) {
      reads.push_back({.buffer = past.data(), .nbytes = past.size(), .path = path, .file_offset = big.size() - 5});
    }
  }
  std::vector<Future> f = h.submit_batch(std::move(reads));
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (i == 5) {
      EXPECT_THROW(f[i].get(), Error) << "the read past the end fails alone";
    } else {
      EXPECT_NO_THROW(f[i].get()) << i;
    }
  }
  EXPECT_EQ(back, big);

  // Write, read, write again on one path in one batch: each direction change reopens.
  const auto head = pattern(8192, 62);
  std::vector<std::byte> got(8192);
  std::vector<IoRequest> mixed;
  mixed.push_back({.write = true, .buffer = const_cast<std::byte*>(head.data()), .nbytes = 4096, .path = path});
  mixed.push_back({.write = true,
                   .buffer = const_cast<std::byte*>(head.data() + 4096),
                   .nbytes = 4096,
                   .path = path,
                   .file_offset = 4096});
  mixed.push_back({.buffer = got.data(), .nbytes = 4096, .path = path, .file_offset = 1 << 20});
  mixed.push_back({.buffer = got.data() + 4096, .nbytes = 4096, .path = path, .file_offset = (1 << 20) + 4096});
  mixed.push_back({.write = true,
                   .buffer = const_cast<std::byte*>(head.data()),
                   .nbytes = 8192,
                   .path = path,
                   .file_offset = big.size()});
  mixed.push_back({.write = true,
                   .buffer = const_cast<std::byte*>(head.data()),
                   .nbytes = 8192,
                   .path = path,
                   .file_offset = big.size() + 8192});
  EXPECT_EQ(h.submit_batch(std::move(mixed)).size(), 6u);
  EXPECT_EQ(h.wait(), 6u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), big.begin() + (1 << 20)));
  const auto file = slurp(path);
  ASSERT_EQ(file.size(), big.size() + 16384);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), file.begin()));
  EXPECT_TRUE(std::equal(head.begin(), head.end(), file.begin() + static_cast<std::ptrdiff_t>(big.size())));
  EXPECT_TRUE(std::equal(head.begin(), head.end(), file.begin() + static_cast<std::ptrdiff_t>(big.size() + 8192)));
}

// The submission-bound case (issue 15): thousands of 4 KiB requests at random offsets of one
// file in one batch, on the disk and on tmpfs (where io_uring workers run the requests with
// pread/pwrite themselves), from locked memory (registered buffers) and from a plain vector.
// Every byte lands where it belongs; a read past the end and a missing file fail alone, each
// with its own errno, reported in submission order by collect().
void many_small_reads(Handle& h, const std::string& dir, bool locked) {
  SCOPED_TRACE(testing::Message() << "dir=" << dir << " locked=" << locked);
  constexpr std::size_t kPage = 4096;
  constexpr std::size_t kCount = 4096;
  const std::string path = dir + "/small";
  const auto data = pattern(kPage * kCount, 71);
  put(path, data);
  UniqueLockedBuffer locked_mem(locked ? kPage * (kCount + 2) : 0);
  std::vector<std::byte> plain(locked ? 0 : kPage * (kCount + 2));
  std::byte* mem = locked ? static_cast<std::byte*>(locked_mem.data()) : plain.data();
  std::memset(mem, 0x5a, kPage * (kCount + 2));
  std::vector<std::size_t> order(kCount);
  for (std::size_t i = 0; i < kCount; ++i) order[i] = (i * 2654435761u) % kCount;  // a permutation
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < kCount; ++i) {
    reqs.push_back({.buffer = mem + i * kPage, .nbytes = kPage, .path = path, .file_offset = order[i] * kPage});
    if (i == 1000) {  // past the end: fails alone
      reqs.push_back({.buffer = mem + kCount * kPage, .nbytes = kPage, .path = path, .file_offset = data.size() - 100});
    }
    if (i == 3000) {  // a missing file between requests on the shared one
      reqs.push_back(
          {.buffer = mem + (kCount + 1) * kPage, .nbytes = kPage, .path = dir + "/missing", .file_offset = 0});
    }
  }
  const std::size_t n = reqs.size();
  EXPECT_EQ(h.submit_batch(std::move(reqs)).size(), n);
  const WaitResult r = h.collect();
  EXPECT_EQ(r.count, n);
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].errnum(), ENODATA);
  EXPECT_EQ(r.errors[0].offset(), data.size() - 100);
  EXPECT_EQ(r.errors[1].errnum(), ENOENT);
  EXPECT_EQ(r.errors[1].path(), dir + "/missing");
  for (std::size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(std::memcmp(mem + i * kPage, data.data() + order[i] * kPage, kPage), 0) << "request " << i;
  }
  EXPECT_EQ(h.pending(), 0u);
}

TEST_P(Conformance, BatchOfManySmallReadsAtRandomOffsets) {
  if (gds()) GTEST_SKIP() << "thousands of host requests; the route's batches are tested above";
  auto h_owner = make(opts({.block_size = 1 << 20, .queue_depth = 128}));
  many_small_reads(*h_owner, dir_.path().string(), true);
  many_small_reads(*h_owner, dir_.path().string(), false);
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm for the tmpfs half";
  const std::string shm = "/dev/shm/deepio-test-" + std::to_string(::getpid()) + "-small";
  ::mkdir(shm.c_str(), 0700);
  many_small_reads(*h_owner, shm, true);
  many_small_reads(*h_owner, shm, false);
  auto h2 = make(opts({.block_size = 1 << 20, .queue_depth = 7, .intra_op_parallelism = 3}));
  many_small_reads(*h2, shm, true);
  ::unlink((shm + "/small").c_str());
  ::rmdir(shm.c_str());
}

// Files on tmpfs: requests the io_uring worker runs itself go through the same completion
// checks as the kernel's: short transfers are finished, an injected EIO fails its request
// alone, writes at random offsets land byte for byte.
TEST_P(Conformance, TmpfsBatchesFinishShortTransfersAndReportErrors) {
  if (gds()) GTEST_SKIP() << "host-path behaviour";
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  const std::string path = "/dev/shm/deepio-test-" + std::to_string(::getpid()) + "-short";
  constexpr std::size_t kPage = 4096;
  constexpr std::size_t kCount = 1024;
  auto h_owner = make(opts({.block_size = 1 << 20, .queue_depth = 32}));
  Handle& h = *h_owner;
  const auto data = pattern(kPage * kCount, 72);
  std::vector<std::size_t> order(kCount);
  for (std::size_t i = 0; i < kCount; ++i) order[i] = (i * 40503u) % kCount;
  std::vector<IoRequest> writes;
  for (std::size_t i = 0; i < kCount; ++i) {
    writes.push_back({.write = true,
                      .buffer = const_cast<std::byte*>(data.data() + order[i] * kPage),
                      .nbytes = kPage,
                      .path = path,
                      .file_offset = order[i] * kPage});
  }
  (void)h.submit_batch(std::move(writes));
  EXPECT_EQ(h.wait(), kCount);
  ASSERT_EQ(slurp(path), data);

  std::atomic<int> shortened{0};
  detail::set_fault_hook([&](const detail::FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == detail::FaultPoint::Read && s.offset == 77 * kPage) return -EIO;
    if (s.point == detail::FaultPoint::Read && s.result > 1 && shortened.fetch_add(1) < 200) return s.result / 2;
    return std::nullopt;
  });
  std::vector<std::byte> back(data.size(), std::byte{0x5a});
  std::vector<IoRequest> reads;
  for (std::size_t i = 0; i < kCount; ++i) {
    reads.push_back(
        {.buffer = back.data() + order[i] * kPage, .nbytes = kPage, .path = path, .file_offset = order[i] * kPage});
  }
  (void)h.submit_batch(std::move(reads));
  const WaitResult r = h.collect();
  detail::set_fault_hook({});
  EXPECT_EQ(r.count, kCount);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].errnum(), EIO);
  EXPECT_EQ(r.errors[0].offset(), 77 * kPage);
  EXPECT_GE(shortened.load(), 200);
  EXPECT_GT(h.stats().short_transfers, 0u);
  for (std::size_t p = 0; p < kCount; ++p) {
    if (p == 77) continue;
    ASSERT_EQ(std::memcmp(back.data() + p * kPage, data.data() + p * kPage, kPage), 0) << "page " << p;
  }
  ::unlink(path.c_str());
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
