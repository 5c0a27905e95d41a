// `deepio bench`: two modes.
//
//  * ds_io mode (`--io_size` given): DeepSpeed's ds_io, flag for flag and output line for
//    output line (reference/deepnvme.md §3): N processes on a barrier, warm-up loops, then
//    "Task/E2E Read/Write Latency/Speed" with GB = 2^30 and Python's float repr.
//  * comparison mode (no `--io_size`): picks a folder on the local disk and a size that suits
//    the machine, writes then reads, and prints deepio beside the naive single-threaded copy
//    and the device ceiling (fio with the same engine, block size and depth, or a raw
//    O_DIRECT loop), all measured in this run, interleaved, medians of --runs.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "deepio/deepio.hpp"
#include "dsio.hpp"
#include "group.hpp"
#include "measure.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio bench";

// Flags that only make sense in ds_io mode (with --io_size).
const char* const kDsIoOnly[] = {"--folder_to_device_mapping", "--read", "--multi_process",
                                 "--loops", "--warmup_loops", "--include_warmup_time",
                                 "--different_file_each_iteration", "--validate", "--engine",
                                 "--fast_io_size", "--slow_bounce_buffer", "--torch_legacy_save",
                                 "--use_accelerator_pin_memory"};
// Flags that only make sense in comparison mode.
const char* const kCompareOnly[] = {"--size", "--runs", "--no_fio", "--keep"};

ArgParser make_parser() {
  ArgParser p(kProg,
              "Measure file I/O with deepio.\n\n"
              "Without --io_size: the main job. Picks a folder on the local disk (or --folder) and\n"
              "a size that suits the machine, writes then reads, and prints deepio's GiB/s beside a\n"
              "naive single-threaded buffered copy (what open(f,'rb').read() into a tensor does) and\n"
              "the device ceiling measured in the same run (fio with the same engine, block size and\n"
              "queue depth when fio is installed, else a raw O_DIRECT loop).\n\n"
              "With --io_size: DeepSpeed's ds_io, same flags, same output lines (GB = 2^30).");
  p.value("--folder", "FOLDER", "Folder for I/O files (used by all processes)");
  p.list("--folder_to_device_mapping", "F:D", "One process per entry: folder F, device id D");
  p.value("--io_size", "SIZE", "Bytes per process per iteration, K/M/G suffixes (selects ds_io mode)");
  p.value("--fast_io_size", "SIZE", "Accepted for ds_io compatibility (torch_fastio engine only)", "64M", true);
  p.flag("--read", "Read test (default is write)");
  p.value("--multi_process", "N", "Number of processes when --folder is used", "1");
  p.value("--block_size", "SIZE", "Handle block size", "1M");
  p.value("--queue_depth", "N", "Handle queue depth", "32");
  p.flag("--single_submit", "Submit each request with its own system call");
  p.flag("--sequential_requests", "Wait for each batch before the next (overlap_events = false)");
  p.flag("--validate", "Check every transfer against a plain read of the file");
  p.value("--engine", "NAME", "I/O engine (aio_handle)", "aio_handle");
  p.value("--loops", "N", "Measured iterations", "3");
  p.value("--io_parallel", "N", "intra_op_parallelism: worker threads per handle", "1");
  p.flag("--gpu", "Use accelerator memory");
  p.flag("--use_gds", "Use GPUDirect Storage (requires --gpu)");
  p.flag("--slow_bounce_buffer", "Accepted for ds_io compatibility", true);
  p.flag("--torch_legacy_save", "Accepted for ds_io compatibility", true);
  p.flag("--use_accelerator_pin_memory", "Accepted for ds_io compatibility", true);
  p.value("--warmup_loops", "N", "Warm-up iterations", "1");
  p.flag("--include_warmup_time", "Include warm-up iterations in the totals");
  p.flag("--different_file_each_iteration", "Use a new file for every iteration");
  p.value("--backend", "NAME", "deepio backend: auto, io_uring, libaio, threads", "auto");
  p.value("--direct", "MODE", "O_DIRECT: auto (where the file system allows), on, off", "auto");
  p.value("--size", "SIZE", "Comparison mode: bytes per file (default: min(1G, free disk/8, RAM/8))");
  p.value("--runs", "N", "Comparison mode: interleaved runs per engine; medians are reported", "3");
  p.flag("--no_fio", "Comparison mode: measure the ceiling with deepio's raw O_DIRECT loop even if fio is installed");
  p.flag("--keep", "Comparison mode: keep the temporary folder and its files");
  p.flag("--json", "Print one JSON object instead of text");
  p.epilog(
      "Examples:\n"
      "  deepio bench                                   # the main job: deepio vs naive vs fio\n"
      "  deepio bench --folder /mnt/nvme --json\n"
      "  deepio bench --folder /mnt/nvme --io_size 1G --read --queue_depth 128 --io_parallel 4\n"
      "  mpirun -np 4 deepio bench --folder /mnt/nvme --io_size 1G   # one process per rank");
  return p;
}

struct Config {
  HandleOptions handle;
  bool json = false;
};

std::string bool_py(bool b) { return b ? "True" : "False"; }
std::string str_py(const std::string& s) { return "'" + s + "'"; }

HandleOptions handle_options(const ParsedArgs& a, std::vector<std::string>& errors, std::size_t default_qd) {
  HandleOptions o;
  o.block_size = static_cast<std::size_t>(size_arg(a, "--block_size", errors).value_or(1 << 20));
  o.queue_depth = static_cast<std::size_t>(count_arg(a, "--queue_depth", errors).value_or(default_qd));
  o.single_submit = a.has("--single_submit");
  o.overlap_events = !a.has("--sequential_requests");
  o.intra_op_parallelism = static_cast<std::size_t>(count_arg(a, "--io_parallel", errors).value_or(1));
  if (a.has("--backend")) {
    if (auto b = parse_backend(a.get("--backend"))) o.backend = *b;
    else errors.push_back("--backend: '" + a.get("--backend") + "' is not one of auto, io_uring, libaio, threads");
  }
  if (a.has("--direct")) {
    if (auto d = parse_direct_io(a.get("--direct"))) o.direct_io = *d;
    else errors.push_back("--direct: '" + a.get("--direct") + "' is not one of auto, on, off");
  }
  return o;
}

// ==== ds_io mode ==========================================================================

int ds_io_main(const ParsedArgs& a, std::vector<std::string> errors, int argc, char** argv) {
  DsIoPlan p;
  const Launch launch = detect_launch();
  const bool has_folder = a.has("--folder");
  const bool has_map = a.has("--folder_to_device_mapping");
  if (has_folder == has_map) errors.push_back("give exactly one of --folder or --folder_to_device_mapping");
  std::vector<std::pair<std::string, std::string>> mapping;  // folder, device label
  if (has_folder) {
    const auto procs = count_arg(a, "--multi_process", errors).value_or(1);
    if (procs > 1024) errors.push_back("--multi_process: at most 1024 processes");
    for (std::uint64_t i = 0; i < std::min<std::uint64_t>(procs, 1024); ++i) {
      mapping.emplace_back(a.get("--folder"), std::to_string(i));
    }
  }
  for (const auto& entry : a.list("--folder_to_device_mapping")) {
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos || colon == 0 || !parse_uint(entry.substr(colon + 1))) {
      errors.push_back("--folder_to_device_mapping: '" + entry + "' is not FOLDER:DEVICE_ID");
      continue;
    }
    mapping.emplace_back(entry.substr(0, colon), entry.substr(colon + 1));
  }
  std::vector<std::string> seen;
  for (const auto& [folder, dev] : mapping) {
    if (std::find(seen.begin(), seen.end(), folder) != seen.end()) continue;
    seen.push_back(folder);
    if (auto problem = folder_problem(folder); !problem.empty()) errors.push_back(problem);
  }
  if (auto v = size_arg(a, "--io_size", errors)) p.io_size = *v;
  size_arg(a, "--fast_io_size", errors);
  p.read = a.has("--read");
  p.loops = static_cast<std::size_t>(count_arg(a, "--loops", errors).value_or(3));
  p.warmup = static_cast<std::size_t>(count_arg(a, "--warmup_loops", errors, true).value_or(1));
  p.include_warmup = a.has("--include_warmup_time");
  p.different_files = a.has("--different_file_each_iteration");
  p.validate = a.has("--validate");
  p.handle = handle_options(a, errors, 32);
  if (p.io_size != 0 && a.has("--block_size") && p.handle.block_size > p.io_size) {
    errors.push_back("--io_size (" + a.get("--io_size") + ") is smaller than --block_size (" +
                     a.get("--block_size") + ")");
  }
  const std::string engine = a.get("--engine", "aio_handle");
  if (engine != "aio_handle") {
    if (engine == "aio_basic" || engine == "torch_io" || engine == "torch_fastio") {
      errors.push_back("--engine " + engine + " is not implemented by deepio bench (only aio_handle; "
                       "DeepSpeed's own copy of it does not run either)");
    } else {
      errors.push_back("--engine: '" + engine + "' is not one of aio_handle, aio_basic, torch_io, torch_fastio");
    }
  }
  if (a.has("--use_gds") && !a.has("--gpu")) errors.push_back("--use_gds requires --gpu");
  if (a.has("--gpu")) errors.push_back(gpu_problem("--gpu", "--use_gds", a.has("--use_gds")));
  if (launch.mpi && a.has("--multi_process") && a.get("--multi_process") != "1") {
    errors.push_back("--multi_process: under " + launch.launcher + " each MPI rank is one process; set the count with mpirun -np");
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  const bool json = a.has("--json");

  auto body = [&p](Group& g) { return ds_io_process(p, g); };
  std::vector<ProcReport> reports;
  int nproc = static_cast<int>(mapping.size());
  int rank = 0;
  std::string mpi_library;
  auto print_header = [&](int count) {
    if (json) return;
    std::string ns = "args = Namespace(folder=" + (has_folder ? str_py(a.get("--folder")) : "None") +
                     ", folder_to_device_mapping=[";
    for (std::size_t i = 0; i < a.list("--folder_to_device_mapping").size(); ++i) {
      ns += (i ? ", " : "") + str_py(a.list("--folder_to_device_mapping")[i]);
    }
    ns += "], io_size=" + std::to_string(p.io_size) + ", read=" + bool_py(p.read) +
          ", multi_process=" + a.get("--multi_process", "1") + ", block_size=" + std::to_string(p.handle.block_size) +
          ", queue_depth=" + std::to_string(p.handle.queue_depth) + ", single_submit=" + bool_py(p.handle.single_submit) +
          ", sequential_requests=" + bool_py(!p.handle.overlap_events) + ", validate=" + bool_py(p.validate) +
          ", engine='aio_handle', loops=" + std::to_string(p.loops) +
          ", io_parallel=" + (a.has("--io_parallel") ? a.get("--io_parallel") : "None") +
          ", gpu=False, use_gds=False, warmup_loops=" + std::to_string(p.warmup) +
          ", include_warmup_time=" + bool_py(p.include_warmup) +
          ", different_file_each_iteration=" + bool_py(p.different_files) +
          ", backend='" + std::string(to_string(p.handle.backend)) + "')";
    std::printf("%s\nSuccessful validation of command line arguments\n", ns.c_str());
    std::printf("Configuring %d process to folder mapping\n", count);
    for (int i = 0; i < count; ++i) {
      const auto& m = mapping[static_cast<std::size_t>(i) % mapping.size()];
      std::printf("[%d]: process %s <----> %s\n", i, launch.mpi ? std::to_string(i).c_str() : m.second.c_str(),
                  m.first.c_str());
    }
    std::printf("tid 0: %s %s per process, %zu loop(s) after %zu warm-up, block_size %s, queue_depth %zu, "
                "overlap_events %s, single_submit %s, intra_op_parallelism %zu\n",
                p.read ? "read" : "write", size_label(p.io_size).c_str(), p.loops, p.warmup,
                size_label(p.handle.block_size).c_str(), p.handle.queue_depth,
                p.handle.overlap_events ? "true" : "false", p.handle.single_submit ? "true" : "false",
                p.handle.intra_op_parallelism);
    std::fflush(stdout);
  };
  for (const auto& m : mapping) p.folders.push_back(m.first);
  try {
    if (launch.mpi) {
      // Print the header only once MPI told us our rank.
      auto mpi_body = [&](Group& g) {
        if (g.rank() == 0) print_header(g.size());
        return ds_io_process(p, g);
      };
      MpiRun run = run_mpi(&argc, &argv, mpi_body);
      rank = run.rank;
      nproc = run.size;
      reports = std::move(run.reports);
      mpi_library = run.library;
    } else {
      print_header(nproc);
      reports = run_local(nproc, body);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    return 1;
  }
  if (rank != 0) return 0;

  for (std::size_t i = 0; i < reports.size(); ++i) {
    if (reports[i].failed) std::fprintf(stderr, "%s: error: process %zu: %s\n", kProg, i, reports[i].error);
  }
  const DsIoTotals t = aggregate(reports);
  if (!t.ok) return 1;
  const double task_lat = t.task_latency, e2e_lat = t.e2e_latency, gib = t.gib(), cpu = t.cpu_sec;
  const double task_speed = t.task_speed(), e2e_speed = t.e2e_speed();
  const std::uint64_t bytes = t.bytes, direct = t.bytes_direct, bounced = t.bytes_bounced,
                      buffered = t.bytes_buffered, refused = t.direct_refused;
  const std::string op = p.read ? "Read" : "Write";
  const std::string backend(to_string(t.backend));
  const std::string path = io_path(direct, bounced, buffered, refused);
  if (json) {
    Json j;
    j.begin_object();
    j.value("schema", "deepio.bench.ds_io/1");
    j.value("version", version());
    j.value("op", p.read ? "read" : "write");
    j.value("io_size", p.io_size);
    j.value("processes", nproc);
    j.value("mpi", launch.mpi);
    j.value("loops", static_cast<std::uint64_t>(p.loops));
    j.value("warmup_loops", static_cast<std::uint64_t>(p.warmup));
    j.begin_object("config");
    j.value("block_size", static_cast<std::uint64_t>(p.handle.block_size));
    j.value("queue_depth", static_cast<std::uint64_t>(p.handle.queue_depth));
    j.value("single_submit", p.handle.single_submit);
    j.value("overlap_events", p.handle.overlap_events);
    j.value("intra_op_parallelism", static_cast<std::uint64_t>(p.handle.intra_op_parallelism));
    j.value("backend", backend);
    j.value("direct_io", to_string(p.handle.direct_io));
    j.end_object();
    j.value("task_latency_sec", task_lat);
    j.value("task_gib_per_sec", task_speed);
    j.value("e2e_latency_sec", e2e_lat);
    j.value("e2e_gib_per_sec", e2e_speed);
    j.value("bytes", bytes);
    j.value("cpu_sec_per_gib", gib > 0 ? cpu / gib : 0.0);
    j.begin_object("io");
    j.value("bytes_direct", direct);
    j.value("bytes_bounced", bounced);
    j.value("bytes_buffered", buffered);
    j.value("direct_refused", refused);
    j.value("summary", path);
    j.end_object();
    j.begin_array("processes_detail");
    for (const auto& r : reports) {
      j.begin_object();
      j.value("task_sec", r.task_sec);
      j.value("e2e_sec", r.e2e_sec);
      j.value("bytes", r.bytes);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::fputs(j.str().c_str(), stdout);
    return 0;
  }
  std::printf("tid 0: backend %s, %s, %s CPU s/GiB%s%s\n", backend.c_str(), path.c_str(),
              fixed(gib > 0 ? cpu / gib : 0.0, 3).c_str(), mpi_library.empty() ? "" : ", MPI: ",
              mpi_library.c_str());
  std::printf("Task %s Latency = %s sec\n", op.c_str(), py_float(task_lat).c_str());
  std::printf("Task %s Speed = %s GB/sec\n", op.c_str(), py_float(task_speed).c_str());
  std::printf("E2E %s Latency = %s sec\n", op.c_str(), py_float(e2e_lat).c_str());
  std::printf("E2E %s Speed = %s GB/sec\n", op.c_str(), py_float(e2e_speed).c_str());
  return 0;
}

// ==== comparison mode (the main job) ======================================================

struct EngineResult {
  std::string op;      ///< "write" / "read"
  std::string engine;  ///< "deepio", "naive", "ceiling"
  std::string label;
  std::vector<Sample> samples;
  std::string path;    ///< I/O path actually used
  std::string verified;
  [[nodiscard]] double median_gib() const {
    std::vector<double> v;
    for (const auto& s : samples) v.push_back(s.gib_per_s());
    return median(v);
  }
  [[nodiscard]] double cpu_per_gib() const {
    double cpu = 0, gib = 0;
    for (const auto& s : samples) {
      cpu += s.cpu_seconds;
      gib += static_cast<double>(s.nbytes) / static_cast<double>(1ULL << 30);
    }
    return gib > 0 ? cpu / gib : 0.0;
  }
};

int compare_main(const ParsedArgs& a, std::vector<std::string> errors) {
  for (const char* f : kDsIoOnly) {
    if (a.has(f)) errors.push_back(std::string(f) + " is a ds_io-mode flag: give --io_size as well");
  }
  if (a.has("--use_gds") && !a.has("--gpu")) errors.push_back("--use_gds requires --gpu");
  if (a.has("--gpu")) errors.push_back(gpu_problem("--gpu", "--use_gds", a.has("--use_gds")));
  HandleOptions ho = handle_options(a, errors, 32);
  const auto runs = static_cast<std::size_t>(count_arg(a, "--runs", errors).value_or(3));
  if (runs > 1000) errors.push_back("--runs: at most 1000");
  auto size = size_arg(a, "--size", errors);
  std::string parent;
  if (a.has("--folder")) {
    parent = a.get("--folder");
    if (auto problem = folder_problem(parent); !problem.empty()) errors.push_back(problem);
  } else {
    std::string why;
    parent = pick_disk_folder(&why);
    if (parent.empty()) errors.push_back("no writable folder on a disk found (" + why + "); give --folder");
  }
  if (size && a.has("--block_size") && *size < ho.block_size) {
    errors.push_back("--size (" + a.get("--size") + ") is smaller than --block_size (" + a.get("--block_size") + ")");
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  const bool json = a.has("--json");

  // ---- size ----
  const std::uint64_t free_disk = free_disk_bytes(parent);
  const std::uint64_t ram = physical_memory_bytes();
  std::uint64_t n = 0;
  std::string size_reason;
  if (size) {
    n = *size;
    size_reason = "--size";
  } else {
    n = 1ULL << 30;
    size_reason = "1 GiB";
    if (free_disk / 8 < n) { n = free_disk / 8; size_reason = "1/8 of free disk"; }
    if (ram / 8 < n) { n = ram / 8; size_reason = "1/8 of RAM"; }
    n -= n % std::max<std::uint64_t>(ho.block_size, 1 << 20);
    if (n < (16ULL << 20)) {
      return print_errors(kProg, {"not enough room for a meaningful run in " + parent + " (" +
                                  human_bytes(free_disk) + " free disk, " + human_bytes(ram) +
                                  " RAM); give --size"});
    }
  }
  if (n % 4096 != 0) n += 4096 - n % 4096;  // the raw ceiling loop needs whole O_DIRECT blocks
  if (3 * n > free_disk) {
    return print_errors(kProg, {"not enough free space in " + parent + ": need " + human_bytes(3 * n) +
                                " for three files, " + human_bytes(free_disk) + " free"});
  }

  std::string dir;
  DirectIoInfo dinfo;
  try {
    dir = make_temp_dir(parent, "bench");
    dinfo = probe_direct_io(dir);
  } catch (const std::exception& e) {
    return print_errors(kProg, {e.what()});
  }
  const std::string f_deepio = dir + "/deepio.bin", f_naive = dir + "/naive.bin", f_ceiling = dir + "/ceiling.bin";
  for (const auto& f : {f_deepio, f_naive, f_ceiling}) register_temp_file(f);

  const std::string fio_path = a.has("--no_fio") ? std::string() : find_on_path("fio");
  const std::string fio_ver = fio_path.empty() ? std::string() : fio_version(fio_path);
  const bool memory_fs = is_memory_filesystem(dir);
  int status = 0;
  std::vector<EngineResult> results;
  std::string ceiling_desc, fio_command_read, fio_command_write, ceiling_note;
  BackendKind backend = BackendKind::Threads;
  bool locked = false;
  try {
    PinnedBuffer src(n), dst(n);
    locked = src.locked() && dst.locked();
    fill_pattern(src.data(), n, 42);
    touch_pages(dst.data(), n);
    Handle h(ho);
    backend = h.backend();
    const std::string fio_engine = fio_engine_for(backend);
    const std::size_t raw_threads = std::min<std::size_t>(ho.queue_depth * ho.intra_op_parallelism, 64);
    bool use_fio = !fio_path.empty() && !memory_fs && dinfo.supported;
    if (!fio_path.empty() && !use_fio) ceiling_note = "fio skipped: the folder does not support O_DIRECT";
    if (fio_path.empty() && !a.has("--no_fio")) ceiling_note = "fio not found on PATH";
    if (use_fio) {
      ceiling_desc = fio_ver + " --ioengine=" + fio_engine + " --bs=" + size_label(ho.block_size) +
                     " --iodepth=" + std::to_string(ho.queue_depth) + " --numjobs=" +
                     std::to_string(ho.intra_op_parallelism) + " --direct=1";
    } else {
      ceiling_desc = "raw O_DIRECT pread/pwrite loop, " + std::to_string(raw_threads) + " threads x " +
                     size_label(ho.block_size);
    }
    const std::string naive_label = "naive 1-thread buffered copy";
    const std::string ceil_label = use_fio ? "fio (device ceiling)" : "raw O_DIRECT (ceiling)";
    EngineResult res[2][3];
    for (int op = 0; op < 2; ++op) {
      res[op][0] = {op ? "read" : "write", "deepio", "deepio", {}, {}, {}};
      res[op][1] = {op ? "read" : "write", "naive", naive_label, {}, "buffered read(2)/write(2) + memcpy", {}};
      res[op][2] = {op ? "read" : "write", "ceiling", ceil_label, {}, dinfo.supported ? "O_DIRECT" : "buffered", {}};
    }
    res[1][1].path = "buffered read(2) + memcpy";
    res[0][1].path = "memcpy + buffered write(2)";
    std::uint64_t d0[4] = {}, d1[4] = {};  // stats deltas per op: direct, bounced, buffered, refused
    Progress progress(runs * 6, !json);
    auto snap = [&](std::uint64_t* out) {
      const HandleStats s = h.stats();
      out[0] = s.bytes_direct, out[1] = s.bytes_bounced, out[2] = s.bytes_buffered, out[3] = s.direct_refused;
    };
    std::uint64_t acc[2][4] = {};
    bool fio_failed = false;
    for (int op = 0; op < 2; ++op) {
      const bool write = op == 0;
      for (std::size_t r = 0; r < runs; ++r) {
        for (std::size_t k = 0; k < 3; ++k) {
          const std::size_t e = (r + k) % 3;  // rotate the order: A B C, B C A, C A B
          progress.step(std::string(write ? "write " : "read ") + res[op][e].engine + ", run " +
                        std::to_string(r + 1) + "/" + std::to_string(runs));
          const bool first = r == 0;
          if (write) {
            const std::string& f = e == 0 ? f_deepio : e == 1 ? f_naive : f_ceiling;
            ::unlink(f.c_str());  // a fresh file each time, as ds_io's write test
          } else {
            drop_page_cache(f_deepio);
            if (first && e != 2) std::memset(dst.data(), 0, n);
          }
          Sample s;
          if (e == 0) {
            snap(d0);
            s = write ? deepio_write(h, src.data(), n, f_deepio) : deepio_read(h, dst.data(), n, f_deepio);
            snap(d1);
            for (int i = 0; i < 4; ++i) acc[op][i] += d1[i] - d0[i];
          } else if (e == 1) {
            s = write ? naive_write(src.data(), n, f_naive) : naive_read(dst.data(), n, f_deepio);
          } else if (use_fio && !fio_failed) {
            FioJob job{write ? f_ceiling : f_deepio, write, n, ho.block_size, ho.queue_depth,
                       ho.intra_op_parallelism, fio_engine, true};
            FioResult fr = run_fio(fio_path, job);
            (write ? fio_command_write : fio_command_read) = fr.command;
            if (fr.ok) {
              s = fr.sample;
            } else {
              // Fall back to the raw loop for this and every later ceiling sample.
              fio_failed = true;
              ceiling_note = fr.error + "; ceiling measured with the raw O_DIRECT loop instead";
            }
          }
          if (e == 2 && (!use_fio || fio_failed)) {
            s = raw_direct(write, write ? src.data() : dst.data(), n, ho.block_size, raw_threads,
                           write ? f_ceiling : f_deepio);
          }
          if (!write && first && e != 2) {
            res[op][e].verified = std::memcmp(dst.data(), src.data(), n) == 0 ? "yes" : "MISMATCH";
            if (res[op][e].verified != "yes") status = 1;
          }
          res[op][e].samples.push_back(s);
        }
      }
      res[op][0].path = std::string(to_string(backend)) + ", " + io_path(acc[op][0], acc[op][1], acc[op][2], acc[op][3]);
      if (fio_failed) {
        res[op][2].label = "raw O_DIRECT (ceiling)";
        ceiling_desc = "raw O_DIRECT pread/pwrite loop, " + std::to_string(raw_threads) + " threads x " +
                       size_label(ho.block_size);
      }
    }
    progress.done();
    for (auto& row : res) {
      for (auto& e : row) results.push_back(std::move(e));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    if (!a.has("--keep")) remove_temp_dir();
    return 1;
  }
  if (!a.has("--keep")) remove_temp_dir();

  const auto find = [&](const std::string& op, const std::string& engine) -> const EngineResult& {
    for (const auto& r : results) {
      if (r.op == op && r.engine == engine) return r;
    }
    return results.front();
  };
  const std::uint64_t memlock = capabilities().memlock_limit_bytes;
  if (json) {
    Json j;
    j.begin_object();
    j.value("schema", "deepio.bench.compare/1");
    j.value("version", version());
    j.value("folder", dir);
    j.value("filesystem", dinfo.filesystem);
    j.begin_object("direct_io");
    j.value("supported", dinfo.supported);
    j.value("mem_align", static_cast<std::uint64_t>(dinfo.mem_align));
    j.value("offset_align", static_cast<std::uint64_t>(dinfo.offset_align));
    j.end_object();
    j.value("size_bytes", n);
    j.value("size_reason", size_reason);
    j.value("runs", static_cast<std::uint64_t>(runs));
    j.value("page_locked", locked);
    j.value("memlock_limit_bytes", memlock);
    j.begin_object("config");
    j.value("backend", to_string(backend));
    j.value("block_size", static_cast<std::uint64_t>(ho.block_size));
    j.value("queue_depth", static_cast<std::uint64_t>(ho.queue_depth));
    j.value("single_submit", ho.single_submit);
    j.value("overlap_events", ho.overlap_events);
    j.value("intra_op_parallelism", static_cast<std::uint64_t>(ho.intra_op_parallelism));
    j.value("direct_io", to_string(ho.direct_io));
    j.end_object();
    j.begin_object("ceiling");
    j.value("source", ceiling_desc.rfind("fio", 0) == 0 ? "fio" : "raw");
    j.value("description", ceiling_desc);
    j.value("fio_write_command", fio_command_write);
    j.value("fio_read_command", fio_command_read);
    j.value("note", ceiling_note);
    j.end_object();
    j.begin_array("results");
    for (const auto& r : results) {
      const double naive = find(r.op, "naive").median_gib();
      const double ceil = find(r.op, "ceiling").median_gib();
      j.begin_object();
      j.value("op", r.op);
      j.value("engine", r.engine);
      j.value("label", r.label);
      j.value("gib_per_sec", r.median_gib());
      j.begin_array("samples_gib_per_sec");
      for (const auto& s : r.samples) j.item(s.gib_per_s());
      j.end_array();
      j.value("speedup_vs_naive", naive > 0 ? r.median_gib() / naive : 0.0);
      j.value("percent_of_ceiling", ceil > 0 ? 100.0 * r.median_gib() / ceil : 0.0);
      j.value("cpu_sec_per_gib", r.cpu_per_gib());
      j.value("io_path", r.path);
      if (r.verified.empty()) j.null("verified");
      else j.value("verified", r.verified == "yes");
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::fputs(j.str().c_str(), stdout);
    return status;
  }

  std::printf("deepio %s bench: %s per file in %s (%s, %s)\n", version(), human_bytes(n).c_str(), dir.c_str(),
              dinfo.filesystem.c_str(),
              dinfo.supported ? ("O_DIRECT ok, alignment " + std::to_string(dinfo.mem_align) + "/" +
                                 std::to_string(dinfo.offset_align)).c_str()
                              : "no O_DIRECT: buffered");
  std::printf("size: %s (%s; %s free disk, %s RAM)\n", human_bytes(n).c_str(), size_reason.c_str(),
              human_bytes(free_disk).c_str(), human_bytes(ram).c_str());
  std::printf("deepio: backend %s, block_size %s, queue_depth %zu, overlap_events %s, single_submit %s, "
              "intra_op_parallelism %zu, buffers %s\n",
              std::string(to_string(backend)).c_str(), size_label(ho.block_size).c_str(), ho.queue_depth,
              ho.overlap_events ? "true" : "false", ho.single_submit ? "true" : "false", ho.intra_op_parallelism,
              locked ? "page-locked"
                     : ("not page-locked (RLIMIT_MEMLOCK " +
                        (memlock == UINT64_MAX ? std::string("unlimited") : human_bytes(memlock)) + ")").c_str());
  std::printf("ceiling: %s%s%s\n", ceiling_desc.c_str(), ceiling_note.empty() ? "" : "; ", ceiling_note.c_str());
  std::printf("method: %zu interleaved runs per engine (order rotated), medians; reads start from a dropped page\n"
              "        cache (fsync + posix_fadvise DONTNEED); writes go to a fresh file and include fsync\n",
              runs);
  if (memory_fs) std::printf("warning: %s is in memory (%s): these are memory speeds, not a device's\n", dir.c_str(), dinfo.filesystem.c_str());
  std::printf("\n%-6s %-30s %8s %9s %9s %10s  %s\n", "op", "engine", "GiB/s", "vs naive", "% ceiling",
              "CPU s/GiB", "I/O path");
  for (const auto& r : results) {
    const double naive = find(r.op, "naive").median_gib();
    const double ceil = find(r.op, "ceiling").median_gib();
    const double g = r.median_gib();
    std::string speed = naive > 0 ? fixed(g / naive, 1) + "x" : "-";
    std::string pct = ceil > 0 ? fixed(100.0 * g / ceil, 0) + "%" : "-";
    std::string path = r.path;
    if (!r.verified.empty()) path += r.verified == "yes" ? ", data verified" : ", DATA MISMATCH";
    std::printf("%-6s %-30s %8s %9s %9s %10s  %s\n", r.op.c_str(), r.label.c_str(), fixed(g, 2).c_str(),
                speed.c_str(), pct.c_str(), fixed(r.cpu_per_gib(), 2).c_str(), path.c_str());
  }
  for (const char* op : {"write", "read"}) {
    const double g = find(op, "deepio").median_gib();
    const double naive = find(op, "naive").median_gib();
    const double ceil = find(op, "ceiling").median_gib();
    std::printf("%s %s: deepio %s GiB/s = %sx the naive copy, %s%% of the ceiling\n", op == std::string("write") ? "\n" : "",
                op, fixed(g, 2).c_str(), naive > 0 ? fixed(g / naive, 1).c_str() : "-",
                ceil > 0 ? fixed(100.0 * g / ceil, 0).c_str() : "-");
  }
  if (status != 0) std::fprintf(stderr, "%s: error: data read back differs from what was written\n", kProg);
  return status;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  const ArgParser parser = make_parser();
  std::vector<std::string> errors;
  ParsedArgs a = parser.parse(argc, argv, 1, errors);
  if (a.has("--help")) {
    std::fputs(parser.help().c_str(), stdout);
    return 0;
  }
  if (a.has("--io_size")) {
    for (const char* f : kCompareOnly) {
      if (a.has(f)) errors.push_back(std::string(f) + " belongs to the comparison mode (without --io_size)");
    }
  }
  // Parse errors travel on so that the mode's own checks add theirs: one report, all problems.
  return a.has("--io_size") ? ds_io_main(a, std::move(errors), argc, argv) : compare_main(a, std::move(errors));
}

}  // namespace deepio::cli
