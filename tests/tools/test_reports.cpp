// What the commands print, from synthetic results: the comparison table, ds_io's lines, the
// tune summary, JSON documents that parse back, the SVG chart.
#include <cstdio>

#include <gtest/gtest.h>

#include "compare.hpp"
#include "dsio_report.hpp"
#include "info.hpp"
#include "json.hpp"
#include "tune_dsio.hpp"
#include "tune_report.hpp"

namespace deepio::cli {
namespace {

Sample gib(double per_s, double cpu = 0.0) { return {1.0 / per_s, cpu, 1ULL << 30}; }

CompareReport sample_compare() {
  CompareReport r;
  r.setup.dir = "/var/tmp/deepio-bench-abc123";
  r.setup.dinfo = {true, 512, 4096, true, "ext4", "statx"};
  r.size = {1ULL << 30, "1 GiB", {}};
  r.free_disk = 100ULL << 30;
  r.ram = 16ULL << 30;
  r.memlock = 8ULL << 20;
  r.runs = 3;
  r.backend = BackendKind::IoUring;
  r.ceiling_desc = "fio-3.33 --ioengine=io_uring --bs=1M --iodepth=32 --numjobs=1 --direct=1 --mem=shmhuge";
  r.ceiling_buffers = "hugetlb";
  r.ceiling_buffers_detail = "fio --mem=shmhuge: 18 of the 64 free hugetlb pages of 2 MiB";
  r.queue = {"vda", 254, 4096};
  r.buffers_thp = 0.98;
  for (const char* op : {"write", "overwrite", "read"}) {
    r.results.push_back({op,
                         "deepio",
                         "deepio",
                         {gib(2.0, 0.1), gib(2.2, 0.1), gib(1.8, 0.1)},
                         "io_uring, O_DIRECT 100%",
                         op == std::string("read") ? "yes" : "",
                         ""});
    r.results.push_back({op, "naive", "naive 1-thread buffered copy", {gib(0.5, 0.5)}, "buffered", "", ""});
    r.results.push_back({op, "ceiling", "fio (device ceiling)", {gib(2.5), gib(2.6)}, "O_DIRECT", "", ""});
  }
  return r;
}

/// A row as the comparison table prints it (the op column is 9 wide since "overwrite").
std::string printf_row(const char* op, const char* engine, const char* g, const char* x, const char* pct,
                       const char* cpu, const char* path) {
  char line[768];
  std::snprintf(line, sizeof line, "%-9s %-30s %8s %9s %11s %10s  %s\n", op, engine, g, x, pct, cpu, path);
  return line;
}

TEST(Reports, ComparisonTable) {
  const std::string text = compare_text(sample_compare(), "9.9.9");
  EXPECT_EQ(
      text.substr(0, text.find('\n')),
      "deepio 9.9.9 bench: 1.00 GiB per file in /var/tmp/deepio-bench-abc123 (ext4, O_DIRECT ok, alignment 512/4096)");
  EXPECT_NE(text.find("buffers not page-locked (RLIMIT_MEMLOCK 8 MiB), 98% on transparent huge pages\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nceiling buffers: hugetlb (fio --mem=shmhuge: 18 of the 64 free hugetlb pages of 2 MiB); "
                      "device vda: max_segments 254, max_sectors_kb 4096\n"),
            std::string::npos)
      << text;
  std::string table = "\n" + printf_row("op", "engine", "GiB/s", "vs naive", "vs ceiling", "CPU s/GiB", "I/O path");
  for (const char* op : {"write", "overwrite", "read"}) {
    const bool read = op == std::string("read");
    table += printf_row(op, "deepio", "2.00", "4.0x", "78%", "0.10",
                        read ? "io_uring, O_DIRECT 100%, data verified" : "io_uring, O_DIRECT 100%");
    table += printf_row(op, "naive 1-thread buffered copy", "0.50", "1.0x", "20%", "0.50", "buffered");
    table += printf_row(op, "fio (device ceiling)", "2.55", "5.1x", "at ceiling", "0.00", "O_DIRECT");
  }
  EXPECT_NE(text.find(table), std::string::npos) << text;
  EXPECT_NE(text.find("\n\n write (fresh file): deepio 2.00 GiB/s = 4.0x the naive copy, 78% of the ceiling\n"
                      " overwrite (in place): deepio 2.00 GiB/s = 4.0x the naive copy, 78% of the ceiling\n"
                      " read: deepio 2.00 GiB/s = 4.0x the naive copy, 78% of the ceiling\n"),
            std::string::npos)
      << text;
}

TEST(Reports, ComparisonJson) {
  const auto j = parse_json(compare_json(sample_compare(), "9.9.9"));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->get("schema")->string, "deepio.bench.compare/3");
  EXPECT_EQ(j->get("ceiling")->get("source")->string, "fio");
  EXPECT_EQ(j->get("ceiling")->get("buffers")->string, "hugetlb");
  EXPECT_EQ(j->get("device")->get("max_segments")->number, 254.0);
  EXPECT_DOUBLE_EQ(j->get("config")->num("buffers_thp_fraction"), 0.98);
  const JsonValue* results = j->get("results");
  ASSERT_EQ(results->array.size(), 9U);
  EXPECT_EQ(results->at(3)->get("op")->string, "overwrite");
  EXPECT_DOUBLE_EQ(results->at(0)->num("speedup_vs_naive"), 4.0);
  EXPECT_NEAR(results->at(0)->num("percent_of_ceiling"), 100.0 * 2.0 / 2.55, 1e-9);
  EXPECT_EQ(results->at(0)->get("vs_ceiling")->string, "below");
  EXPECT_EQ(results->at(2)->get("vs_ceiling")->string, "at_ceiling");
  EXPECT_DOUBLE_EQ(j->get("ceiling")->num("noise_floor"), kCeilingNoise);
  EXPECT_EQ(results->at(0)->get("verified")->type, JsonValue::Type::Null);
  EXPECT_TRUE(results->at(6)->get("verified")->boolean);
  EXPECT_EQ(results->at(6)->get("samples_gib_per_sec")->array.size(), 3U);
}

// The ceiling rule, case by case: the figure against the ceiling's samples (GiB/s).
TEST(Reports, CeilingVerdictTable) {
  using S = CeilingStanding;
  struct Case {
    const char* what;
    double figure;
    std::vector<double> samples;
    S standing;
    double percent;      // of the median, where a percentage is kept (else 0)
    const char* reason;  // the start of the flag's reason ("" = not flagged)
  };
  const std::vector<Case> cases = {
      {"within the spread", 2.55, {2.5, 2.6, 2.7}, S::AtCeiling, 100.0 * 2.55 / 2.6, ""},
      {"at the slowest sample", 2.5, {2.5, 2.6, 2.7}, S::AtCeiling, 100.0 * 2.5 / 2.6, ""},
      // Issue 25's read: 2% above fio's is noise, not a broken measurement.
      {"2% above the fastest", 1.02 * 1.87, {1.80, 1.84, 1.87}, S::AtCeiling, 100.0 * 1.02 * 1.87 / 1.84, ""},
      {"above the fastest by less than the spread", 3.19, {2.0, 2.6}, S::AtCeiling, 100.0 * 3.19 / 2.3, ""},
      {"above the fastest by a little more than the spread", 3.21, {2.0, 2.6}, S::Above, 0, "above every ceiling"},
      {"clearly above every sample",
       3.43,
       {2.5, 2.6},
       S::Above,
       0,
       "above every ceiling sample (2.50-2.60 GiB/s) by more than their noise margin (2.86 GiB/s)"},
      // Issue 25's fresh-file write against a ceiling that ran another workload.
      {"more than twice the ceiling", 3.37, {1.47, 1.49, 1.52}, S::Above, 0, "above every ceiling sample (1.47-1.52"},
      {"below the ceiling", 2.0, {2.5, 2.6}, S::Below, 100.0 * 2.0 / 2.55, ""},
      {"just below the slowest sample", 2.49, {2.5, 2.6}, S::Below, 100.0 * 2.49 / 2.55, ""},
      {"one sample, figure equal", 1.8, {1.8}, S::AtCeiling, 100.0, ""},
      {"one sample, 9% above: the noise floor", 1.8 * 1.09, {1.8}, S::AtCeiling, 109.0, ""},
      {"one sample, 11% above", 1.8 * 1.11, {1.8}, S::Above, 0, "above every ceiling sample (1.80-1.80"},
      {"one sample, below", 0.9, {1.8}, S::Below, 50.0, ""},
      {"no ceiling measured", 9.0, {}, S::None, 0, ""},
      {"a failed ceiling: zero", 9.0, {0.0}, S::None, 0, ""},
      {"failed runs beside good ones are ignored", 2.0, {0.0, 2.5, 2.6}, S::Below, 100.0 * 2.0 / 2.55, ""},
      {"nothing moved, against a ceiling", 0.0, {2.5}, S::Below, 0.0, ""},
  };
  for (const Case& c : cases) {
    const CeilingVerdict v = judge_against_ceiling(c.figure, c.samples);
    EXPECT_EQ(v.standing, c.standing) << c.what << ": " << to_string(v.standing);
    EXPECT_NEAR(v.percent, c.percent, 1e-9) << c.what;
    EXPECT_EQ(v.flagged(), c.standing == S::Above) << c.what;
    EXPECT_EQ(v.reason.rfind(c.reason, 0), 0U) << c.what << ": " << v.reason;
    EXPECT_EQ(v.reason.empty(), std::string(c.reason).empty()) << c.what << ": " << v.reason;
  }
}

// In the report: a figure beyond the margin is flagged with its one reason, its GiB/s kept, no
// percentage over 100 (text "above", JSON null); a figure within the spread reads "at ceiling".
TEST(Reports, OnlyAFigureBeyondEveryCeilingSampleIsFlagged) {
  CompareReport r = sample_compare();
  const EngineResult& ceiling = r.results[8];  // read: 2.5 and 2.6 GiB/s
  EXPECT_EQ(ceiling_verdict(r, 2.58, ceiling).standing, CeilingStanding::AtCeiling);
  EXPECT_EQ(ceiling_verdict(r, 9.0, EngineResult{}).standing, CeilingStanding::None);
  EXPECT_EQ(ceiling_verdict(r, 3.43, ceiling).reason,
            "above every ceiling sample (2.50-2.60 GiB/s) by more than their noise margin (2.86 GiB/s)");
  // Ordinary buffers on a device that splits their requests: that is the reason given.
  r.ceiling_buffers = "pages";
  r.handle.block_size = 1 << 20;
  EXPECT_EQ(ceiling_verdict(r, 3.43, ceiling).reason,
            "above the ceiling, whose 4 KiB-page buffers vda splits (max_segments 254 < pages per 1M)");
  r.ceiling_buffers = "hugetlb";

  // deepio 2% above fio's fastest read: at the ceiling, not flagged.
  r.results[6].samples = {gib(2.652, 0.1)};
  r.results[6].flag = ceiling_verdict(r, 2.652, ceiling).reason;
  EXPECT_EQ(r.results[6].flag, "");
  std::string text = compare_text(r, "9.9.9");
  EXPECT_NE(text.find(printf_row("read", "deepio", "2.65", "5.3x", "at ceiling", "0.10",
                                 "io_uring, O_DIRECT 100%, data verified")),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(" read: deepio 2.65 GiB/s = 5.3x the naive copy, at the ceiling (its runs: 2.50-2.60 GiB/s)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("FLAGGED"), std::string::npos) << text;

  r.results[6].samples = {gib(3.43, 0.1)};
  r.results[6].flag = ceiling_verdict(r, 3.43, ceiling).reason;
  text = compare_text(r, "9.9.9");
  EXPECT_NE(
      text.find(printf_row("read", "deepio", "3.43", "6.9x", "above", "0.10",
                           ("FLAGGED: " + r.results[6].flag + "; io_uring, O_DIRECT 100%, data verified").c_str())),
      std::string::npos)
      << text;
  EXPECT_NE(text.find(" read: deepio 3.43 GiB/s = 6.9x the naive copy, FLAGGED: above every ceiling sample ("),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("134%"), std::string::npos) << text;
  const auto j = parse_json(compare_json(r, "9.9.9"));
  ASSERT_TRUE(j);
  const JsonValue* row = j->get("results")->at(6);
  EXPECT_TRUE(row->get("flagged")->boolean);
  EXPECT_EQ(row->get("vs_ceiling")->string, "above");
  EXPECT_EQ(row->get("percent_of_ceiling")->type, JsonValue::Type::Null);
  EXPECT_NEAR(row->num("gib_per_sec"), 3.43, 1e-9);
}

DsIoRequest sample_ds_io() {
  DsIoRequest r;
  r.plan.io_size = 1 << 20;
  r.plan.read = true;
  r.plan.loops = 2;
  r.plan.handle.queue_depth = 32;  // what `deepio bench` passes (the library's default is 128)
  r.plan.handle.overlap_events = true;
  r.folder = "/mnt/nvme";
  r.mapping = {{"/mnt/nvme", "0"}, {"/mnt/nvme", "1"}};
  r.multi_process = "2";
  return r;
}

TEST(Reports, DsIoHeaderAndLines) {
  const std::string h = ds_io_header(sample_ds_io(), 2, false);
  EXPECT_EQ(
      h,
      "args = Namespace(folder='/mnt/nvme', folder_to_device_mapping=[], io_size=1048576, read=True, "
      "multi_process=2, block_size=1048576, queue_depth=32, single_submit=False, sequential_requests=False, "
      "validate=False, engine='aio_handle', loops=2, io_parallel=None, gpu=False, use_gds=False, warmup_loops=1, "
      "include_warmup_time=False, different_file_each_iteration=False, backend='auto')\n"
      "Successful validation of command line arguments\n"
      "Configuring 2 process to folder mapping\n"
      "[0]: process 0 <----> /mnt/nvme\n"
      "[1]: process 1 <----> /mnt/nvme\n"
      "tid 0: read 1M per process, 2 loop(s) after 1 warm-up, block_size 1M, queue_depth 32, overlap_events true, "
      "single_submit false, intra_op_parallelism 1\n");
  DsIoTotals t;
  t.ok = true;
  t.task_latency = 0.25;
  t.e2e_latency = 0.5;
  t.bytes = 1ULL << 30;
  t.bytes_direct = 1ULL << 30;
  t.backend = BackendKind::IoUring;
  EXPECT_EQ(ds_io_result_text(sample_ds_io(), t, ""),
            "tid 0: backend io_uring, O_DIRECT 100%, 0.000 CPU s/GiB\n"
            "Task Read Latency = 0.25 sec\n"
            "Task Read Speed = 4.0 GB/sec\n"
            "E2E Read Latency = 0.5 sec\n"
            "E2E Read Speed = 2.0 GB/sec\n");
  EXPECT_EQ(ds_io_log_text(true, t),
            "Task Read Latency = 0.25 sec\nTask Read Speed = 4.0 GB/sec\nE2E Read Latency = 0.5 sec\n"
            "E2E Read Speed = 2.0 GB/sec\n");
  const auto j = parse_json(ds_io_json(sample_ds_io(), t, {}, 2, false, "9.9.9"));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->num("e2e_gib_per_sec"), 2.0);
  EXPECT_EQ(j->get("io")->get("summary")->string, "O_DIRECT 100%");
}

TEST(Reports, IoPathSummary) {
  EXPECT_EQ(io_path(0, 0, 0, 0), "no I/O");
  EXPECT_EQ(io_path(100, 0, 0, 0), "O_DIRECT 100%");
  EXPECT_EQ(io_path(0, 0, 100, 2), "buffered 100%, O_DIRECT refused 2x");
  EXPECT_EQ(io_path(50, 10, 40, 0), "O_DIRECT 60%, buffered 40% (10% via bounce buffer)");
}

TEST(Reports, TuneSummaryJsonAndChart) {
  TuneResult r;
  const TuneConfig best{1 << 20, 128, false, true, 2};
  r.records = {{best, "final", 400 << 20, 3.0, 2.0, false}, {TuneConfig{}, "screen", 50 << 20, 0.5, -1, true}};
  r.outcome = {best, 3.0, 2.0};
  r.runs = 3;
  const TuneSummary s{false, {"/mnt/nvme"}, 400 << 20, "io_uring", 64, 1.5, 12.25, false};
  EXPECT_EQ(tune_text(s, r),
            "Best performance (GB/sec): read =  3.00, write =  2.00\n"
            "{\n   \"aio\": {\n      \"block_size\": 1048576,\n      \"queue_depth\": 128,\n"
            "      \"intra_op_parallelism\": 2,\n      \"single_submit\": false,\n      \"overlap_events\": true,\n"
            "      \"use_gds\": false\n   }\n}\n"
            "searched 2 of 64 configurations (3 ds_io runs, 1.5 GiB moved) in 12.2 s; backend io_uring; io_size 400M; "
            "/mnt/nvme\n");
  const auto j = parse_json(tune_json(s, r, "9.9.9"));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->num("configurations_measured"), 2.0);
  EXPECT_EQ(j->get("measurements")->at(1)->get("write_gib_per_sec")->type, JsonValue::Type::Null);
  EXPECT_TRUE(j->get("measurements")->at(1)->get("pruned")->boolean);
  EXPECT_EQ(tune_verbose_line("deepio tune", r.records[1]),
            "deepio tune: screen   bs1M qd32 p1 overlap block         io 50M   read   0.50 write      -  (pruned)\n");
  const std::string svg = tune_svg(r.records, r.outcome, "a <title> & more");
  EXPECT_EQ(svg.rfind("<svg ", 0), 0U);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("bs1M qd128 p2 overlap block [final 400M]"), std::string::npos);
  EXPECT_NE(svg.find("5.00  best"), std::string::npos);
  EXPECT_NE(svg.find("(pruned: weak read)"), std::string::npos);
  EXPECT_EQ(tune_chart_title(s, r), "deepio tune (search): 2 of 64 configurations, 12.2 s, io_uring, /mnt/nvme");
}

TEST(Reports, InfoOnThisMachine) {
  const InfoReport r = gather_info(".");
  const auto j = parse_json(info_json(r));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->get("schema")->string, "deepio.info/1");
  EXPECT_EQ(j->get("folder")->get("filesystem")->string, r.dio.filesystem);
  const std::string text = info_text(r);
  EXPECT_NE(text.find("\nDeepSpeed op report (ds_report)\nop name ................ installed .. compatible\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  threads   available"), std::string::npos) << text;
}

}  // namespace
}  // namespace deepio::cli
