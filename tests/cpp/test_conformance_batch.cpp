// The conformance suite (test_conformance.cpp), batches: many requests of mixed directions,
// paths and descriptors submitted in one call, their failures, and the submission-bound case.
#include "conformance.hpp"

namespace deepio {
namespace {

using namespace conformance;  // NOLINT(google-build-using-namespace): the suite's own fixture

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

}  // namespace
}  // namespace deepio
