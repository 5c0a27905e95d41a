// The GPU pieces of `deepio bench` that need no driver: the --gpu flag checks (ds_io's "every
// mapped device exists"), the probe asked in a child process (it must agree with the one asked
// here), ds_io's GPU header and lines, and the GPU rows of the comparison report under the one
// ceiling rule of ceiling.hpp (the rule itself is table-tested in test_reports.cpp). The
// driver-facing parts (device memory, copies, the handles on device memory) run against the
// fake CUDA and cuFile drivers in tests/python/test_gpu_cli.py, through the command itself,
// and here in GpuFake.* (run by the ctest entry deepio_tools_tests.gpu_fake with
// DEEPIO_CUDA_LIBRARY pointing at the fake; they skip without it).
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.hpp"
#include "dsio_report.hpp"
#include "gpu.hpp"
#include "json.hpp"
#include "measure.hpp"

namespace deepio::cli {
namespace {

GpuProbe with_devices(int n) {
  GpuProbe g;
  g.cuda = true;
  g.device_count = n;
  g.driver_version = 12040;
  g.gds_mode = "compat";
  return g;
}

TEST(GpuFlags, NoCudaIsOneLineWithTheLoadersReason) {
  GpuProbe g;
  g.cuda_reason = "CUDA disabled: DEEPIO_CUDA_LIBRARY=none";
  const auto p = gpu_problems(g, "--gpu", {0, 1, 7}, "--multi_process");
  ASSERT_EQ(p.size(), 1u);  // the device ids are moot without a driver
  EXPECT_EQ(p[0], "--gpu: no usable CUDA driver: CUDA disabled: DEEPIO_CUDA_LIBRARY=none");
}

TEST(GpuFlags, EveryMappedDeviceMustExistEachMissingOneNamedOnce) {
  EXPECT_TRUE(gpu_problems(with_devices(2), "--gpu", {0, 1, 0, 1}, "--folder_to_device_mapping").empty());
  const auto p = gpu_problems(with_devices(1), "--gpu", {0, 3, 3, 1}, "--folder_to_device_mapping");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "--folder_to_device_mapping: device 3 does not exist (1 CUDA device(s))");
  EXPECT_EQ(p[1], "--folder_to_device_mapping: device 1 does not exist (1 CUDA device(s))");
  EXPECT_EQ(gpu_problems(with_devices(1), "--gpu", {-1}, "--multi_process").size(), 1u);
}

TEST(GpuFlags, ProbeInAChildAgreesWithTheProbeHere) {
  // Whatever this machine has (no driver, or DEEPIO_CUDA_LIBRARY pointing at a fake), the
  // answer that crossed the pipe from the child is the one this process gets itself.
  const GpuProbe child = probe_gpu(true);
  const GpuProbe here = probe_gpu(false);
  EXPECT_EQ(child.cuda, here.cuda);
  EXPECT_EQ(child.cuda_reason, here.cuda_reason);
  EXPECT_EQ(child.device_count, here.device_count);
  EXPECT_EQ(child.driver_version, here.driver_version);
  EXPECT_EQ(child.cufile, here.cufile);
  EXPECT_EQ(child.cufile_reason, here.cufile_reason);
  EXPECT_EQ(child.gds_mode, here.gds_mode);
  if (!here.cuda) {
    EXPECT_FALSE(here.cuda_reason.empty());
  }
}

DsIoRequest gpu_request(bool gds) {
  DsIoRequest r;
  r.folder = "/mnt/nvme";
  r.mapping = {{"/mnt/nvme", "0"}};
  r.plan.folders = {"/mnt/nvme"};
  r.plan.io_size = 1 << 20;
  r.plan.read = true;
  r.plan.gpu = true;
  r.plan.use_gds = gds;
  r.plan.devices = {0};
  return r;
}

TEST(GpuReports, DsIoSaysGpuWhereDsIoDoes) {
  const std::string h = ds_io_header(gpu_request(true), 1, false);
  EXPECT_NE(h.find("gpu=True, use_gds=True"), std::string::npos) << h;
  EXPECT_NE(h.find("Configuring 1 gpu to folder mapping\n"), std::string::npos) << h;
  EXPECT_NE(h.find("[0]: gpu 0 <----> /mnt/nvme\n"), std::string::npos) << h;
  DsIoRequest cpu = gpu_request(false);
  cpu.plan.gpu = false;
  const std::string hc = ds_io_header(cpu, 1, false);
  EXPECT_NE(hc.find("gpu=False, use_gds=False"), std::string::npos) << hc;
  EXPECT_NE(hc.find("Configuring 1 process to folder mapping\n"), std::string::npos) << hc;
}

TEST(GpuReports, DsIoSecondTidLineSaysHowDeviceMemoryMoved) {
  DsIoTotals t;
  t.ok = true;
  t.processes = 1;
  t.bytes = 3ULL << 20;
  t.task_latency = t.e2e_latency = 0.5;
  t.bytes_cufile = 1ULL << 20;
  t.bytes_staged = 3ULL << 20;
  t.files_fallback = 3;
  t.gpu_mode = "compat: cuFileHandleRegister refused /mnt/nvme/x (5027)";
  EXPECT_EQ(gpu_summary(gpu_request(true).plan, t),
            "gds_handle compat: cuFileHandleRegister refused /mnt/nvme/x (5027); cuFile 25%, staged 75%, "
            "files cuFile refused 3");
  EXPECT_EQ(gpu_summary(gpu_request(false).plan, t), "GPU memory staged through page-locked slots (aio_handle)");
  DsIoPlan cpu;
  EXPECT_EQ(gpu_summary(cpu, t), "");
  const std::string text = ds_io_result_text(gpu_request(true), t, "");
  EXPECT_NE(text.find("\ntid 0: gds_handle compat"), std::string::npos) << text;
  EXPECT_NE(text.find("Task Read Speed = "), std::string::npos) << text;
  // The JSON carries the same, and parses back.
  const auto j = parse_json(ds_io_json(gpu_request(true), t, {}, 1, false, "0"));
  ASSERT_TRUE(j);
  EXPECT_TRUE(j->get("gpu")->get("use_gds")->boolean);
  EXPECT_DOUBLE_EQ(j->get("gpu")->num("files_fallback"), 3.0);
  EXPECT_EQ(j->get("schema")->string, "deepio.bench.ds_io/1");
}

Sample gib(double per_s) { return {1.0 / per_s, 0.0, 1ULL << 30}; }

TEST(GpuReports, ComparisonShowsGpuRowsAndFlagsWhatBeatsTheDisk) {
  CompareReport r;
  r.setup.dir = "/var/tmp/deepio-bench-x";
  r.setup.dinfo = {true, 512, 4096, true, "ext4", "statx"};
  r.size = {1ULL << 30, "1 GiB", {}};
  r.runs = 1;
  r.ceiling_desc = "fio-3.33";
  r.gpu = with_devices(1);
  r.gpu_rows = true;
  r.gds_mode = "compat: cuFile's compatibility mode (no nvidia-fs)";
  for (const char* op : {"write", "read"}) {
    r.results.push_back({op, "deepio", "deepio", {gib(1.6)}, "io_uring", "", ""});
    r.results.push_back({op, "naive", "naive 1-thread buffered copy", {gib(0.5)}, "buffered", "", ""});
    r.results.push_back({op, "ceiling", "fio (device ceiling)", {gib(1.8)}, "O_DIRECT", "", ""});
    r.results.push_back({op, "gpu_staged", "GPU staged (aio_handle)", {gib(1.7)}, "staged", "yes", ""});
    r.results.push_back({op, "gpu_gds", "GPU gds (compat)", {gib(8.7)}, "gds_handle compat", "yes", ""});
    r.results.push_back(
        {op, op == std::string("read") ? "h2d" : "d2h", "copy (ceiling)", {gib(40.0)}, "cuMemcpy", "", ""});
  }
  flag_results(r);
  const std::string text = compare_text(r, "0");
  EXPECT_NE(text.find("gpu: CUDA driver 12040, device 0 of 1"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU staged (aio_handle)            1.70"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU gds (compat)                flagged"), std::string::npos) << text;
  EXPECT_EQ(text.find("8.70  "), std::string::npos) << text;  // the figure is no result column
  EXPECT_NE(text.find("FLAGGED: 8.70 GiB/s, above every ceiling sample (1.80-1.80 GiB/s)"), std::string::npos) << text;

  const auto j = parse_json(compare_json(r, "0"));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->get("schema")->string, "deepio.bench.compare/3");
  EXPECT_TRUE(j->get("gpu")->get("rows")->boolean);
  const JsonValue* results = j->get("results");
  ASSERT_EQ(results->array.size(), 12U);
  EXPECT_EQ(results->at(4)->get("engine")->string, "gpu_gds");
  EXPECT_TRUE(results->at(4)->get("flagged")->boolean);
  EXPECT_FALSE(results->at(3)->get("flagged")->boolean);
  EXPECT_NEAR(results->at(3)->num("gib_per_sec"), 1.7, 1e-9);

  CompareReport none;
  none.setup = r.setup;
  none.gpu.cuda_reason = "CUDA disabled: DEEPIO_CUDA_LIBRARY=none";
  none.results = {r.results[0], r.results[1], r.results[2]};
  EXPECT_NE(compare_text(none, "0").find("gpu: no GPU rows (CUDA disabled: DEEPIO_CUDA_LIBRARY=none)"),
            std::string::npos);
  const auto jn = parse_json(compare_json(none, "0"));
  ASSERT_TRUE(jn);
  EXPECT_FALSE(jn->get("gpu")->get("available")->boolean);
  EXPECT_FALSE(jn->get("gpu")->get("rows")->boolean);
}

std::string printf_row(const char* op, const char* engine, const char* g, const char* x, const char* pct,
                       const char* cpu, const std::string& path) {
  char line[768];
  std::snprintf(line, sizeof line, "%-9s %-30s %8s %9s %11s %10s  %s\n", op, engine, g, x, pct, cpu, path.c_str());
  return line;
}

/// A read comparison: deepio, the naive copy at 0.5 GiB/s, the ceiling with `ceiling`'s samples
/// (a zero is a failed run), and one GPU row `engine` ("GPU row") at `figure`, flagged as
/// run_compare flags its rows.
CompareReport gpu_report(const char* engine, double figure, const std::vector<double>& ceiling) {
  CompareReport r;
  r.setup.dir = "/var/tmp/deepio-bench-x";
  r.setup.dinfo = {true, 512, 4096, true, "ext4", "statx"};
  r.size = {1ULL << 30, "1 GiB", {}};
  r.runs = ceiling.size();
  r.ceiling_desc = "fio-3.33";
  r.ceiling_buffers = "hugetlb";
  r.gpu = with_devices(1);
  r.gpu_rows = true;
  r.gds_mode = "gds";
  EngineResult c{"read", "ceiling", "fio (device ceiling)", {}, "O_DIRECT", "", ""};
  for (const double s : ceiling) c.samples.push_back(s > 0 ? gib(s) : Sample{1.0, 0.0, 0});
  r.results = {{"read", "deepio", "deepio", {gib(1.6)}, "io_uring", "yes", ""},
               {"read", "naive", "naive 1-thread buffered copy", {gib(0.5)}, "buffered", "yes", ""},
               c,
               {"read", engine, "GPU row", {gib(figure)}, "p", "", ""}};
  flag_results(r);
  return r;
}

// The GPU disk rows are judged by the one ceiling rule of the disk rows (judge_against_ceiling:
// beyond the fastest ceiling sample by more than max(spread, 10%) is flagged); a flagged one is
// withheld from the table, its figure in the flag. The copy ceilings are not judged at all.
TEST(GpuReports, GpuRowsFollowTheOneCeilingRule) {
  using S = CeilingStanding;
  struct Case {
    const char* what;
    const char* engine;
    double figure;                // GiB/s
    std::vector<double> ceiling;  // the ceiling's samples, GiB/s
    S standing;
    double percent;   // JSON percent_of_ceiling (of the samples' median); < 0: null
    const char* gib;  // the text table's cells: GiB/s, vs naive, vs ceiling
    const char* naive;
    const char* vs_ceiling;
    const char* flag;  // the whole flag; "" = none
  };
  const char* const kAbove2 =
      "2.00 GiB/s, above every ceiling sample (1.80-1.80 GiB/s) by more than their noise margin (1.98 GiB/s); "
      "not a result";
  const char* const kAbove87 =
      "8.70 GiB/s, above every ceiling sample (1.80-1.80 GiB/s) by more than their noise margin (1.98 GiB/s); "
      "not a result";
  const char* const kAt = "at ceiling";
  const std::vector<Case> cases = {
      {"below the ceiling", "gpu_staged", 1.7, {1.8}, S::Below, 100 * 1.7 / 1.8, "1.70", "3.4x", "94%", ""},
      {"just above, in the noise", "gpu_gds", 1.95, {1.8}, S::AtCeiling, 100 * 1.95 / 1.8, "1.95", "3.9x", kAt, ""},
      {"in the spread", "gpu_staged", 2.0, {1.8, 1.9, 2.1}, S::AtCeiling, 100 * 2.0 / 1.9, "2.00", "4.0x", kAt, ""},
      // The GPU rows' old rule (median x 1.1 = 2.2) flagged this; the one rule's margin is the
      // ceiling's own spread.
      {"above median x 1.1", "gpu_gds", 2.4, {1.8, 2.0, 2.2}, S::AtCeiling, 100 * 2.4 / 2.0, "2.40", "4.8x", kAt, ""},
      {"just beyond the noise margin", "gpu_gds", 2.0, {1.8}, S::Above, -1, "flagged", "-", "-", kAbove2},
      // Issue 11: the page cache served GdsHandle's compat reads, 4.8x the disk.
      {"well above the ceiling", "gpu_gds", 8.7, {1.8}, S::Above, -1, "flagged", "-", "-", kAbove87},
      {"well above, staged", "gpu_staged", 8.7, {1.8}, S::Above, -1, "flagged", "-", "-", kAbove87},
      {"no ceiling measured", "gpu_gds", 8.7, {}, S::None, -1, "8.70", "17.4x", "-", ""},
      {"the ceiling failed (zero)", "gpu_staged", 8.7, {0.0}, S::None, -1, "8.70", "17.4x", "-", ""},
      {"the copy ceiling is not judged against the disk", "h2d", 40.0, {1.8}, S::None, -1, "40.00", "80.0x", "-", ""},
  };
  for (const Case& c : cases) {
    const CompareReport r = gpu_report(c.engine, c.figure, c.ceiling);
    const EngineResult& e = r.results[3];
    EXPECT_EQ(row_verdict(r, e).standing, c.standing) << c.what;
    EXPECT_EQ(e.flag, c.flag) << c.what;

    const std::string path = e.flag.empty() ? "p" : "FLAGGED: " + e.flag + "; p";
    const std::string text = compare_text(r, "0");
    EXPECT_NE(text.find(printf_row("read", "GPU row", c.gib, c.naive, c.vs_ceiling, "0.00", path)), std::string::npos)
        << c.what << "\n"
        << text;

    const auto j = parse_json(compare_json(r, "0"));
    ASSERT_TRUE(j) << c.what;
    const JsonValue* x = j->get("results")->at(3);
    EXPECT_EQ(x->get("vs_ceiling")->string, to_string(c.standing)) << c.what;
    EXPECT_EQ(x->get("flagged")->boolean, c.standing == S::Above) << c.what;
    EXPECT_EQ(x->get("flag")->string, c.flag) << c.what;
    EXPECT_NEAR(x->num("gib_per_sec"), c.figure, 1e-9) << c.what;  // withheld from the table, not from JSON
    if (c.percent < 0) {
      EXPECT_EQ(x->get("percent_of_ceiling")->type, JsonValue::Type::Null) << c.what;
    } else {
      EXPECT_NEAR(x->num("percent_of_ceiling"), c.percent, 1e-9) << c.what;
    }
  }
}

// A GPU disk row above a ceiling that is known to be low (fio on 4 KiB-page buffers that the
// device splits into more segments than it takes) keeps its figure, as a disk row does: the
// flag blames the ceiling, and the row is a result. The same row above a trustworthy ceiling
// (hugetlb buffers) is withheld.
TEST(GpuReports, AGpuRowAboveALowCeilingKeepsItsFigure) {
  CompareReport r = gpu_report("gpu_staged", 2.6, {1.8});
  EXPECT_NE(compare_text(r, "0").find("; not a result"), std::string::npos);  // hugetlb: withheld
  r.ceiling_buffers = "pages";
  r.queue = {"vda", 2, 4096};  // 2 segments < 256 pages per 1 MiB request
  r.handle.block_size = 1 << 20;
  flag_results(r);
  const EngineResult& e = r.results[3];
  const CeilingVerdict v = row_verdict(r, e);
  EXPECT_TRUE(v.flagged());
  EXPECT_TRUE(v.ceiling_low);
  EXPECT_EQ(e.flag, "above the ceiling, whose 4 KiB-page buffers vda splits (max_segments 2 < pages per 1M)");
  const std::string text = compare_text(r, "0");
  EXPECT_EQ(text.find("; not a result"), std::string::npos) << text;
  EXPECT_NE(text.find(printf_row("read", "GPU row", "2.60", "5.2x", "above", "0.00", "FLAGGED: " + e.flag + "; p")),
            std::string::npos)
      << text;
  const auto j = parse_json(compare_json(r, "0"));
  ASSERT_TRUE(j);
  EXPECT_TRUE(j->get("results")->at(3)->get("flagged")->boolean);
  EXPECT_NEAR(j->get("results")->at(3)->num("gib_per_sec"), 2.6, 1e-9);
}

TEST(GpuReports, TheGpuRowsNeedAFourthFile) {
  const SizeChoice three = choose_size(std::uint64_t{1} << 30, std::uint64_t{7} << 29, 64ULL << 30, 1 << 20, "/d");
  EXPECT_TRUE(three.error.empty()) << three.error;
  const SizeChoice four = choose_size(std::uint64_t{1} << 30, std::uint64_t{7} << 29, 64ULL << 30, 1 << 20, "/d", 4);
  EXPECT_NE(four.error.find("for 4 files"), std::string::npos) << four.error;
}

bool fake_driver() {
  const char* lib = std::getenv("DEEPIO_CUDA_LIBRARY");
  return lib != nullptr && std::strstr(lib, "fake") != nullptr;
}

TEST(GpuFake, DeviceMemoryRoundTripsOnlyWithAContextCurrent) {
  if (!fake_driver()) GTEST_SKIP() << "DEEPIO_CUDA_LIBRARY does not name the fake driver";
  const GpuProbe g = probe_gpu(true);  // the child's answer, before this process loads CUDA
  ASSERT_TRUE(g.cuda) << g.cuda_reason;
  std::string a(1 << 20, '\0'), b(1 << 20, '\0');
  fill_pattern(a.data(), a.size(), 5);
  {
    CudaDevice dev(0);
    DeviceBuffer d(a.size());
    d.upload(a.data(), a.size());
    d.download(b.data(), b.size());
    EXPECT_EQ(a, b);
    EXPECT_THROW(d.upload(a.data(), a.size() + 1), Error);  // past the end: refused, not copied
  }
  // The context was current only inside the scope: the driver refuses an allocation now, as
  // the real one does (CUDA_ERROR_INVALID_CONTEXT), and the error names the call.
  try {
    DeviceBuffer orphan(4096);
    FAIL() << "cuMemAlloc without a current context succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code().value(), EIO);
    EXPECT_NE(std::string(e.what()).find("cuMemAlloc: CUDA_ERROR_INVALID_CONTEXT"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CudaDevice(7), Error);  // a device the driver does not have
}

TEST(GpuFake, CopyCeilingsMoveEveryByteFromRegisteredMemory) {
  if (!fake_driver()) GTEST_SKIP() << "DEEPIO_CUDA_LIBRARY does not name the fake driver";
  CudaDevice dev(0);
  const std::size_t n = 4 << 20;
  UniqueLockedBuffer host(n);
  fill_pattern(host.data(), n, 9);
  const std::string want(static_cast<const char*>(host.data()), n);
  DeviceBuffer d(n);
  {
    HostRegistration reg(host.data(), n);
    EXPECT_THROW(HostRegistration(host.data(), n), Error);  // already registered: the driver says so
    const Sample up = timed_copy(true, d, host.data(), n);
    EXPECT_EQ(up.nbytes, n);
    EXPECT_GT(up.seconds, 0.0);
    std::memset(host.data(), 0, n);
    const Sample down = timed_copy(false, d, host.data(), n);
    EXPECT_EQ(down.nbytes, n);
    EXPECT_EQ(std::memcmp(host.data(), want.data(), n), 0);
  }
  HostRegistration again(host.data(), n);  // the first one was unregistered on destruction
}

}  // namespace
}  // namespace deepio::cli
