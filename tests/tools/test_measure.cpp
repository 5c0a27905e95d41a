// The timed transfers and the tune's ds_io measure on a real folder: every byte arrives,
// short files and mismatches are reported, ds_nvme_tune's logs are written.
#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ceiling.hpp"
#include "common/support.hpp"
#include "dsio.hpp"
#include "measure.hpp"
#include "tune_dsio.hpp"

namespace deepio::cli {
namespace {

constexpr std::size_t kSize = 4 << 20;

TEST(Measure, EveryEngineRoundTrips) {
  test::TempDir dir;
  UniqueLockedBuffer src(kSize), dst(kSize);
  fill_pattern(src.data(), kSize, 42);
  const Sample w = naive_write(src.data(), kSize, dir.file("naive"));
  EXPECT_EQ(w.nbytes, kSize);
  EXPECT_GT(w.seconds, 0.0);
  EXPECT_EQ(naive_read(dst.data(), kSize, dir.file("naive")).nbytes, kSize);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kSize), 0);

  Handle h(HandleOptions{.block_size = 256 << 10, .queue_depth = 8});
  deepio_write(h, src.data(), kSize, dir.file("deepio"));
  std::memset(dst.data(), 0, kSize);
  deepio_read(h, dst.data(), kSize, dir.file("deepio"));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kSize), 0);
  EXPECT_EQ(compare_with_file(src.data(), kSize, dir.file("deepio")), "");
}

// Several folders: one handle over every file, one operation each; each file gets all its
// bytes, in place.
TEST(Measure, OneHandleOverSeveralFiles) {
  test::TempDir a, b, c;
  UniqueLockedBuffer src(kSize), d0(kSize), d1(kSize), d2(kSize);
  fill_pattern(src.data(), kSize, 5);
  const std::vector<std::string> paths = {a.file("f"), b.file("f"), c.file("f")};
  Handle h(HandleOptions{.block_size = 256 << 10, .queue_depth = 8});
  EXPECT_EQ(deepio_write_files(h, src.data(), kSize, paths).nbytes, 3 * kSize);
  for (const auto& p : paths) EXPECT_EQ(compare_with_file(src.data(), kSize, p), "") << p;
  const Sample r = deepio_read_files(h, {d0.data(), d1.data(), d2.data()}, kSize, paths);
  EXPECT_EQ(r.nbytes, 3 * kSize);
  EXPECT_GT(r.seconds, 0.0);
  for (const UniqueLockedBuffer* d : {&d0, &d1, &d2}) EXPECT_EQ(std::memcmp(src.data(), d->data(), kSize), 0);
}

// Jobs run at once: the aggregate is every job's bytes over one wall time; a failure of one
// comes back after all have finished.
TEST(Measure, RunTogether) {
  test::TempDir a, b;
  UniqueLockedBuffer src(kSize);
  fill_pattern(src.data(), kSize, 9);
  std::vector<Sample> each;
  const Sample s = run_together({[&] { return naive_write(src.data(), kSize, a.file("n")); },
                                 [&] { return naive_write(src.data(), kSize / 2, b.file("n")); }},
                                &each);
  ASSERT_EQ(each.size(), 2U);
  EXPECT_EQ(each[0].nbytes, kSize);
  EXPECT_EQ(each[1].nbytes, kSize / 2);
  EXPECT_EQ(s.nbytes, kSize + kSize / 2);
  EXPECT_GE(s.seconds, std::max(each[0].seconds, each[1].seconds));
  EXPECT_EQ(compare_with_file(src.data(), kSize, a.file("n")), "");
  std::vector<char> dst(kSize);
  bool finished = false;
  try {
    (void)run_together({[&] { return naive_read(dst.data(), kSize, a.file("absent")); },
                        [&] {
                          finished = true;
                          return Sample{};
                        }});
    ADD_FAILURE() << "a missing file read as a success";
  } catch (const Error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
  }
  EXPECT_TRUE(finished);
}

// The report says how much of deepio's (and the raw ceiling's) buffers sit on transparent huge
// pages: page-locked buffers of 2 MiB and more are advised onto them.
TEST(Measure, ThpShareOfABuffer) {
  constexpr std::size_t kBig = 16 << 20;
  UniqueLockedBuffer big(kBig);
  touch_pages(big.data(), kBig);
  const std::uint64_t huge = thp_bytes(big.data(), kBig);
  EXPECT_LE(huge, kBig);
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty()) GTEST_SKIP() << "THP off: " << mode;
  EXPECT_GT(huge, 0U) << "16 MiB advised onto huge pages has none (THP " << mode << ")";
  EXPECT_EQ(thp_bytes(big.data(), 0), 0U);
}

TEST(Measure, RawDirectLoopOnManyThreads) {
  test::TempDir dir;
  if (!probe_direct_io(dir.path().string()).supported) GTEST_SKIP() << "no O_DIRECT here";
  UniqueLockedBuffer src(kSize), dst(kSize);
  fill_pattern(src.data(), kSize, 7);
  // 5 threads over 16 blocks of 256 KiB: uneven shares, each block written exactly once.
  EXPECT_EQ(raw_direct(true, src.data(), kSize, 256 << 10, 5, dir.file("raw")).nbytes, kSize);
  EXPECT_EQ(raw_direct(false, dst.data(), kSize, 256 << 10, 5, dir.file("raw")).nbytes, kSize);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kSize), 0);
}

TEST(Measure, ShortFilesAndMismatchesAreReported) {
  test::TempDir dir;
  write_file_plain(dir.file("f"), kSize / 2, 3);
  UniqueLockedBuffer buf(kSize);
  try {
    naive_read(buf.data(), kSize, dir.file("f"));
    ADD_FAILURE() << "a short file read as a success";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA);
    EXPECT_EQ(e.path(), dir.file("f"));
  }
  std::vector<char> expect(kSize / 2);
  fill_pattern(expect.data(), expect.size(), 3);
  EXPECT_EQ(compare_with_file(expect.data(), expect.size(), dir.file("f")), "");
  expect[12345] = static_cast<char>(expect[12345] ^ 1);
  EXPECT_EQ(compare_with_file(expect.data(), expect.size(), dir.file("f")),
            "validation failed: " + dir.file("f") + " differs from the buffer at byte 12345");
  EXPECT_EQ(compare_with_file(expect.data(), kSize, dir.file("f")),
            "validation read of " + dir.file("f") + " failed at offset " + std::to_string(kSize / 2));
  EXPECT_THROW(naive_read(buf.data(), 1, dir.file("absent")), Error);
}

TEST(Measure, TuneMeasureRunsDsIoAndWritesDeepSpeedLogs) {
  test::TempDir dir;
  std::filesystem::create_directory(dir.path() / "work");
  const std::string logs = dir.file("logs");
  DsIoTuneMeasure measure({dir.file("work")}, true, logs);
  const TuneRun run{{256 << 10, 4, false, true, 2}, 1 << 20, 1, true};
  EXPECT_GT(measure(run), 0.0);
  TuneRun write = run;
  write.read = false;
  EXPECT_GT(measure(write), 0.0);
  EXPECT_DOUBLE_EQ(measure.gib_moved(), 2 * 2.0 / 1024) << "two runs of warm-up + one loop of 1 MiB";
  std::ifstream log(logs + "/_aio_bench_read_logs/read_block_overlap_ftd1_d4_bs256K_p2.txt");
  ASSERT_TRUE(log) << "ds_nvme_tune's log name";
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_EQ(text.str().rfind("Task Read Latency = ", 0), 0U) << text.str();
  EXPECT_NE(text.str().find("\nE2E Read Speed = "), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(logs + "/_aio_bench_write_logs/write_block_overlap_ftd1_d4_bs256K_p2.txt"));

  DsIoTuneMeasure missing({dir.file("no-such-folder")}, false, "");
  EXPECT_THROW(missing(run), std::runtime_error);
}

}  // namespace
}  // namespace deepio::cli
