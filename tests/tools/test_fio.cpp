// The fio runner: the command line, the report parser on fio's real JSON shape, and the
// runner against a stand-in program (always) and the real fio (when installed); the ceiling's
// huge pages (ceiling.hpp): the pool parser, the loan that reserves and gives back (as root),
// fio on them, and an overwrite that stays in place.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "ceiling.hpp"
#include "common/support.hpp"
#include "fio.hpp"
#include "process.hpp"

namespace deepio::cli {
namespace {

// The parts of fio 3.33's --output-format=json that the parser reads, after the note fio
// prints first when it lays out a file.
const char* const kReport = R"(note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "deepio-ceiling",
      "job_runtime" : 500,
      "usr_cpu" : 2.0,
      "sys_cpu" : 8.0,
      "read" : { "io_bytes" : 1073741824, "runtime" : 400 },
      "write" : { "io_bytes" : 0, "runtime" : 0 }
    }
  ]
}
)";

TEST(Fio, CommandLine) {
  const FioJob job{"/d/f.bin", true, 64 << 20, 1 << 20, 32, 4, "libaio", true};
  const std::vector<std::string> argv = fio_argv("fio", job);
  const std::vector<std::string> want = {"fio",
                                         "--name=deepio-ceiling",
                                         "--filename=/d/f.bin",
                                         "--rw=write",
                                         "--bs=1048576",
                                         "--iodepth=32",
                                         "--ioengine=libaio",
                                         "--direct=1",
                                         "--size=16777216",
                                         "--numjobs=4",
                                         "--group_reporting",
                                         "--thread",
                                         "--fallocate=none",
                                         "--invalidate=1",
                                         "--output-format=json",
                                         "--offset_increment=16777216",
                                         "--end_fsync=1"};
  EXPECT_EQ(argv, want);
  // A fresh-file write where deepio allocated its file first: the ceiling does too.
  FioJob allocated = job;
  allocated.preallocate = true;
  EXPECT_EQ(fio_argv("fio", allocated)[12], "--fallocate=native");
  const std::vector<std::string> read = fio_argv("fio", {"/f", false, 1 << 20, 4096, 1, 1, "psync", false});
  EXPECT_EQ(read[3], "--rw=read");
  EXPECT_EQ(read[7], "--direct=0");
  EXPECT_EQ(read.back(), "--output-format=json") << "one job: no offset_increment, no end_fsync";
  EXPECT_EQ(fio_engine_for(BackendKind::IoUring), "io_uring");
  EXPECT_EQ(fio_engine_for(BackendKind::Libaio), "libaio");
  EXPECT_EQ(fio_engine_for(BackendKind::Threads), "psync");
}

TEST(Fio, ReportParser) {
  const FioResult r = parse_fio_report(kReport, false);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.sample.nbytes, 1ULL << 30);
  EXPECT_DOUBLE_EQ(r.sample.seconds, 0.4);
  EXPECT_DOUBLE_EQ(r.sample.cpu_seconds, 0.05) << "(2 + 8) % of the 500 ms job runtime";
  EXPECT_DOUBLE_EQ(r.sample.gib_per_s(), 2.5);

  EXPECT_EQ(parse_fio_report(kReport, true).error, "fio reported no I/O");
  EXPECT_EQ(parse_fio_report("fio: no jobs", false).error, "cannot parse fio's JSON output");
  EXPECT_EQ(parse_fio_report("{\"jobs\": [", false).error,
            "cannot parse fio's JSON output: unexpected end at offset 10");
  EXPECT_EQ(parse_fio_report("{\"jobs\": []}", false).error, "cannot parse fio's JSON output");
}

/// A stand-in for fio in `dir`: prints `stdout_text`, `stderr_text`, exits with `status`, and
/// records its arguments one per line in dir/args.
std::string fake_fio(const test::TempDir& dir, const std::string& stdout_text, const std::string& stderr_text,
                     int status) {
  std::ofstream(dir.file("out.txt")) << stdout_text;
  std::ofstream(dir.file("err.txt")) << stderr_text;
  const std::string path = dir.file("fio");
  std::ofstream(path) << "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > '" << dir.file("args") << "'\n"
                      << "cat '" << dir.file("out.txt") << "'; cat '" << dir.file("err.txt") << "' >&2; exit " << status
                      << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(Fio, RunnerAgainstAStandIn) {
  test::TempDir dir;
  const std::string fio = fake_fio(dir, kReport, "", 0);
  const FioJob job{"/data/x.bin", false, 1 << 30, 1 << 20, 8, 1, "io_uring", true};
  const FioResult r = run_fio(fio, job);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.sample.gib_per_s(), 2.5);
  std::string cmd;
  for (const auto& a : fio_argv(fio, job)) cmd += (cmd.empty() ? "" : " ") + a;
  EXPECT_EQ(r.command, cmd);
  std::ifstream args(dir.file("args"));
  std::string first;
  std::getline(args, first);
  EXPECT_EQ(first, "--name=deepio-ceiling") << "the arguments arrived one by one";
}

TEST(Fio, RunnerReportsFailures) {
  test::TempDir dir;
  const std::string fio = fake_fio(dir, "", "fio: engine io_uring not loadable\nmore detail\n", 1);
  const FioResult r = run_fio(fio, {});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "fio exited with status 1: fio: engine io_uring not loadable");
  EXPECT_FALSE(r.command.empty());

  const FioResult missing = run_fio(dir.file("no-fio-here"), {});
  EXPECT_FALSE(missing.ok);
  EXPECT_EQ(missing.error, "cannot run " + dir.file("no-fio-here") + ": No such file or directory");
  EXPECT_TRUE(fio_version(dir.file("no-fio-here")).empty());
}

TEST(Fio, RealFio) {
  const std::string fio = find_on_path("fio");
  if (fio.empty()) GTEST_SKIP() << "fio is not installed";
  EXPECT_EQ(fio_version(fio).rfind("fio-", 0), 0U) << fio_version(fio);
  test::TempDir dir;
  const std::string file = dir.file("data.bin");
  const bool direct = probe_direct_io(dir.path().string()).supported;
  const FioResult w = run_fio(fio, {file, true, 4 << 20, 1 << 20, 4, 2, "psync", direct});
  ASSERT_TRUE(w.ok) << w.error << "\n" << w.command;
  EXPECT_EQ(w.sample.nbytes, 4U << 20);
  EXPECT_GT(w.sample.seconds, 0.0);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4 << 20) << "two jobs of 2 MiB, one after the other in the file";
  const FioResult r = run_fio(fio, {file, false, 4 << 20, 1 << 20, 4, 1, "psync", direct});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.sample.nbytes, 4U << 20);
}

// Several folders: the common options first (fio's global section), then one named job per
// file; no --group_reporting, so that each file's bytes can be read back.
TEST(Fio, SeveralFilesOneJobEach) {
  FioJob job{"/a/f.bin", true, 64 << 20, 1 << 20, 32, 2, "io_uring", true};
  const std::vector<std::string> one = fio_argv("fio", job);
  job.extra_paths = {"/b/f.bin", "/c/f.bin"};
  const std::vector<std::string> argv = fio_argv("fio", job);
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--group_reporting"), 0);
  const std::vector<std::string> jobs(argv.end() - 6, argv.end());
  const std::vector<std::string> want = {"--name=deepio-ceiling-0", "--filename=/a/f.bin",
                                         "--name=deepio-ceiling-1", "--filename=/b/f.bin",
                                         "--name=deepio-ceiling-2", "--filename=/c/f.bin"};
  EXPECT_EQ(jobs, want);
  // Every other option of the one-file command, in its order, before the first job.
  std::vector<std::string> common(one.begin() + 3, one.end());
  common.erase(std::find(common.begin(), common.end(), "--group_reporting"));
  common.insert(common.begin(), "fio");
  EXPECT_EQ(std::vector<std::string>(argv.begin(), argv.end() - 6), common);
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--size=33554432"), argv.end()) << "per file, split over numjobs";
}

// fio's report of two files with numjobs 2: four jobs, two per file name.
const char* const kTwoFiles = R"({"jobs": [
  {"jobname": "deepio-ceiling-0", "job_runtime": 400, "usr_cpu": 5.0, "sys_cpu": 5.0,
   "read": {"io_bytes": 1048576, "runtime": 400}},
  {"jobname": "deepio-ceiling-0", "job_runtime": 500, "usr_cpu": 10.0, "sys_cpu": 10.0,
   "read": {"io_bytes": 1048576, "runtime": 500}},
  {"jobname": "deepio-ceiling-1", "job_runtime": 800, "usr_cpu": 0.0, "sys_cpu": 25.0,
   "read": {"io_bytes": 1048576, "runtime": 800}},
  {"jobname": "deepio-ceiling-1", "job_runtime": 200, "usr_cpu": 50.0, "sys_cpu": 0.0,
   "read": {"io_bytes": 1048576, "runtime": 200}}
]})";

TEST(Fio, SeveralFilesReport) {
  const FioResult r = parse_fio_report_files(kTwoFiles, false, 2);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.file_bytes, (std::vector<std::uint64_t>{2 << 20, 2 << 20}));
  EXPECT_EQ(r.sample.nbytes, 4U << 20) << "the sum of the files";
  EXPECT_DOUBLE_EQ(r.sample.seconds, 0.8) << "the longest job: they ran at once";
  EXPECT_NEAR(r.sample.cpu_seconds, 0.04 + 0.1 + 0.2 + 0.1, 1e-12) << "every job's CPU";
  const FioResult missing = parse_fio_report_files(kTwoFiles, false, 3);
  EXPECT_FALSE(missing.ok);
  EXPECT_EQ(missing.error, "fio reported no I/O for file 2");
  EXPECT_FALSE(parse_fio_report_files(kTwoFiles, true, 2).ok) << "no write side";
  EXPECT_EQ(parse_fio_report_files("fio: no jobs", false, 2).error, "cannot parse fio's JSON output");
}

TEST(Fio, RealFioOnSeveralFiles) {
  const std::string fio = find_on_path("fio");
  if (fio.empty()) GTEST_SKIP() << "fio is not installed";
  test::TempDir a, b;
  const bool direct = probe_direct_io(a.path().string()).supported && probe_direct_io(b.path().string()).supported;
  FioJob job{a.file("data.bin"), true, 4 << 20, 1 << 20, 4, 2, "psync", direct};
  job.extra_paths = {b.file("data.bin")};
  const FioResult w = run_fio(fio, job);
  ASSERT_TRUE(w.ok) << w.error << "\n" << w.command;
  EXPECT_EQ(w.file_bytes, (std::vector<std::uint64_t>{4 << 20, 4 << 20}));
  EXPECT_EQ(w.sample.nbytes, 8U << 20);
  for (const auto& f : {a.file("data.bin"), b.file("data.bin")}) {
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_size, 4 << 20) << f;
  }
  job.write = false;
  const FioResult r = run_fio(fio, job);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.sample.nbytes, 8U << 20);
}

TEST(Fio, CommandLineWithHugePageBuffers) {
  FioJob job{"/d/f.bin", false, 64 << 20, 1 << 20, 32, 1, "io_uring", true};
  job.mem = "shmhuge";
  job.hugepage_bytes = 2 << 20;
  const std::vector<std::string> argv = fio_argv("fio", job);
  ASSERT_GE(argv.size(), 2U);
  EXPECT_EQ(argv[argv.size() - 2], "--mem=shmhuge");
  EXPECT_EQ(argv.back(), "--hugepage-size=2097152");
}

TEST(HugePages, PoolParserAndPagesNeeded) {
  const HugePagePool p = parse_hugepage_pool(
      "MemTotal:       24683656 kB\nHugePages_Total:      40\nHugePages_Free:       30\nHugePages_Rsvd:        4\n"
      "HugePages_Surp:        0\nHugepagesize:       2048 kB\nHugetlb:           81920 kB\n");
  EXPECT_EQ(p.page_bytes, 2U << 20);
  EXPECT_EQ(p.total, 40U);
  EXPECT_EQ(p.free, 30U);
  EXPECT_EQ(p.available(), 26U) << "free pages promised to a mapping are not available";
  EXPECT_EQ(parse_hugepage_pool("MemTotal: 1 kB\n").page_bytes, 0U) << "no hugetlb";
  // 32 x 1 MiB (+ fio's alignment) = 17 pages of 2 MiB, one spare: 18 per job.
  EXPECT_EQ(fio_huge_pages_needed(1 << 20, 32, 1, 2 << 20), 18U);
  EXPECT_EQ(fio_huge_pages_needed(1 << 20, 32, 2, 2 << 20), 36U);
  EXPECT_EQ(fio_huge_pages_needed(1 << 20, 32, 1, 0), 0U);
}

std::string nr_hugepages() {
  std::ifstream f("/proc/sys/vm/nr_hugepages");
  std::string v;
  f >> v;
  return v;
}

TEST(HugePages, LoanRefusedWithoutReservingLeavesThePoolAlone) {
  const std::string before = nr_hugepages();
  const HugePageLoan l = HugePageLoan::obtain(std::uint64_t{1} << 40, false);
  EXPECT_FALSE(l.ok());
  EXPECT_EQ(l.added(), 0U);
  EXPECT_FALSE(l.description().empty());
  EXPECT_EQ(nr_hugepages(), before);
}

// As root: the loan adds the pages fio lacks, real fio runs on them (--mem=shmhuge), and the
// pool is back where it was once the loan is gone.
TEST(HugePages, ReservedForFioAndGivenBack) {
  const std::string fio = find_on_path("fio");
  if (fio.empty()) GTEST_SKIP() << "fio is not installed";
  if (::access("/proc/sys/vm/nr_hugepages", W_OK) != 0) GTEST_SKIP() << "vm.nr_hugepages is not writable (not root)";
  test::TempDir dir;
  if (!probe_direct_io(dir.path().string()).supported) GTEST_SKIP() << "no O_DIRECT here";
  const std::string before = nr_hugepages();
  const HugePagePool pool = read_hugepage_pool();
  if (pool.page_bytes == 0) GTEST_SKIP() << "no hugetlb in this kernel";
  {
    const std::uint64_t need = fio_huge_pages_needed(1 << 20, 4, 1, pool.page_bytes) + pool.available();
    HugePageLoan l = HugePageLoan::obtain(need, true);
    ASSERT_TRUE(l.ok()) << l.description();
    EXPECT_GT(l.added(), 0U) << "more than the free pages were asked for, so some were reserved";
    EXPECT_NE(l.description().find("given back"), std::string::npos) << l.description();
    FioJob job{dir.file("h.bin"), true, 8 << 20, 1 << 20, 4, 1, "psync", true};
    job.mem = "shmhuge";
    job.hugepage_bytes = l.page_bytes();
    const FioResult w = run_fio(fio, job);
    ASSERT_TRUE(w.ok) << w.error << "\n" << w.command;
    EXPECT_EQ(w.sample.nbytes, 8U << 20);
  }
  // Another process (a `deepio bench` of the Python tests under `ctest -j`) may hold a loan of
  // its own for a moment: wait for the pool to settle before comparing.
  for (int i = 0; i < 150 && nr_hugepages() != before; ++i) ::usleep(200 * 1000);
  EXPECT_EQ(nr_hugepages(), before);
}

// Two processes reserving and giving back at once (two `deepio bench` runs, or a run beside
// this suite's other tests) must leave the pool where it was: each read-modify-write of
// vm.nr_hugepages happens under deepio's pool lock, so no update is lost.
TEST(HugePages, TwoProcessesReservingAtOnceLeaveThePoolWhereItWas) {
  if (::access("/proc/sys/vm/nr_hugepages", W_OK) != 0) GTEST_SKIP() << "vm.nr_hugepages is not writable (not root)";
  if (read_hugepage_pool().page_bytes == 0) GTEST_SKIP() << "no hugetlb in this kernel";
  const std::string before = nr_hugepages();
  std::vector<pid_t> kids;
  for (int k = 0; k < 2; ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int reserved = 0;
      for (int i = 0; i < 60; ++i) {
        HugePageLoan l = HugePageLoan::obtain(read_hugepage_pool().available() + 1 + static_cast<unsigned>(i % 3),
                                              true);
        if (l.added() > 0) ++reserved;
        l.give_back();
      }
      ::_exit(reserved > 0 ? 0 : 3);  // 3: never reserved, so the race was not exercised
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "a child never reserved a page";
  }
  for (int i = 0; i < 150 && nr_hugepages() != before; ++i) ::usleep(200 * 1000);
  EXPECT_EQ(nr_hugepages(), before) << "an update of vm.nr_hugepages was lost";
}

// The "overwrite" row: fio writing a file that exists at full size writes it in place (same
// inode, same size), it does not lay it out again.
TEST(Fio, WriteOverAnExistingFileStaysInPlace) {
  const std::string fio = find_on_path("fio");
  if (fio.empty()) GTEST_SKIP() << "fio is not installed";
  test::TempDir dir;
  const std::string file = dir.file("o.bin");
  const bool direct = probe_direct_io(dir.path().string()).supported;
  ASSERT_TRUE(run_fio(fio, {file, true, 4 << 20, 1 << 20, 4, 1, "psync", direct}).ok);
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat(file.c_str(), &a), 0);
  const FioResult w = run_fio(fio, {file, true, 4 << 20, 1 << 20, 4, 1, "psync", direct});
  ASSERT_TRUE(w.ok) << w.error;
  ASSERT_EQ(::stat(file.c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(b.st_size, 4 << 20);
}

// The "write" row where deepio preallocates: fio allocates the fresh file first and writes it
// whole (size and allocated blocks), as deepio's fallocate + direct writes leave it.
TEST(Fio, FreshFileWriteAllocatedFirst) {
  const std::string fio = find_on_path("fio");
  if (fio.empty()) GTEST_SKIP() << "fio is not installed";
  test::TempDir dir;
  const std::string file = dir.file("p.bin");
  const bool direct = probe_direct_io(dir.path().string()).supported;
  FioJob job{file, true, 4 << 20, 1 << 20, 4, 1, "psync", direct};
  job.preallocate = true;
  const FioResult w = run_fio(fio, job);
  ASSERT_TRUE(w.ok) << w.error << "\n" << w.command;
  EXPECT_NE(w.command.find("--fallocate=native"), std::string::npos) << w.command;
  EXPECT_EQ(w.sample.nbytes, 4U << 20);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4 << 20);
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 4U << 20);
}

TEST(Ceiling, QueueLimitsOfTheDiskBehindAFolder) {
  test::TempDir dir;
  const QueueLimits q = queue_limits_of(dir.path().string());
  if (q.device.empty()) GTEST_SKIP() << "the test folder is not on a block device";
  EXPECT_GT(q.max_segments, 0U) << q.device;
  EXPECT_GT(q.max_sectors_kb, 0U) << q.device;
  EXPECT_EQ(queue_limits_of(dir.file("missing")).device, "");
}

}  // namespace
}  // namespace deepio::cli
