// `deepio bench`: two modes, both measured by tools/lib.
//
//  * ds_io mode (`--io_size` given): DeepSpeed's ds_io, flag for flag and output line for
//    output line (reference/deepnvme.md §3; lib/dsio.hpp, lib/dsio_report.hpp).
//  * comparison mode (no `--io_size`): deepio beside the naive single-threaded copy and the
//    device ceiling, measured in this run, interleaved, medians of --runs (lib/compare.hpp);
//    with GPU rows when CUDA is usable (--gpu makes them required).
//
// --gpu / --use_gds (lib/gpu.hpp): device memory through Handle (staged) or GdsHandle.
//
// This file reads the command line into those libraries' requests and prints their reports.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "compare.hpp"
#include "deepio/deepio.hpp"
#include "dsio.hpp"
#include "dsio_report.hpp"
#include "format.hpp"
#include "gpu.hpp"
#include "group.hpp"
#include "system.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio bench";

// Flags that only make sense in ds_io mode (with --io_size).
const char* const kDsIoOnly[] = {"--folder_to_device_mapping",
                                 "--read",
                                 "--multi_process",
                                 "--loops",
                                 "--warmup_loops",
                                 "--include_warmup_time",
                                 "--different_file_each_iteration",
                                 "--validate",
                                 "--engine",
                                 "--fast_io_size",
                                 "--slow_bounce_buffer",
                                 "--torch_legacy_save",
                                 "--use_accelerator_pin_memory"};
// Flags that only make sense in comparison mode.
const char* const kCompareOnly[] = {"--size", "--runs", "--no_fio", "--no_hugepage_reserve", "--keep"};

ArgParser make_parser() {
  ArgParser p(kProg,
              "Measure file I/O with deepio.\n\n"
              "Without --io_size: the main job. Picks a folder on the local disk (or --folder) and\n"
              "a size that suits the machine, writes a fresh file, overwrites it, reads it, and prints\n"
              "deepio's GiB/s beside a naive single-threaded buffered copy (what open(f,'rb').read()\n"
              "into a tensor does) and the device ceiling measured in the same run: fio with the same\n"
              "engine, block size and queue depth on huge-page buffers (so the device does not split\n"
              "its requests), else a raw O_DIRECT loop on deepio's page-locked huge-page buffers. A\n"
              "figure above the ceiling is flagged, not given as a percentage. With CUDA: GPU rows too\n"
              "(staged, gds with its mode, the host<->device copy ceilings).\n\n"
              "Several folders (one per drive, no RAID): repeat --folder. Every row then moves --size\n"
              "to one file in each folder, all at once, and reports the aggregate GiB/s against fio\n"
              "with one job per folder in the same run.\n\n"
              "With --io_size: DeepSpeed's ds_io, same flags, same output lines (GB = 2^30).");
  p.value("--folder", "FOLDER",
          "Folder for I/O files (used by all processes); comparison mode: repeat it to measure several "
          "folders at once");
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
  p.flag("--gpu", "Use CUDA device memory (ds_io mode); require the GPU rows (comparison mode)");
  p.flag("--use_gds", "Use GPUDirect Storage through deepio's gds_handle (requires --gpu)");
  p.alias("--gds", "--use_gds");  // ds_nvme_tune's spelling, as deepio tune takes it
  p.flag("--slow_bounce_buffer", "Accepted for ds_io compatibility", true);
  p.flag("--torch_legacy_save", "Accepted for ds_io compatibility", true);
  p.flag("--use_accelerator_pin_memory", "Accepted for ds_io compatibility", true);
  p.value("--warmup_loops", "N", "Warm-up iterations", "1");
  p.flag("--include_warmup_time", "Include warm-up iterations in the totals");
  p.flag("--different_file_each_iteration", "Use a new file for every iteration");
  p.value("--backend", "NAME", "deepio backend: auto, io_uring, libaio, threads", "auto");
  p.value("--direct_io", "MODE", "O_DIRECT: auto (where the file system allows), on, off", "auto");
  p.alias("--direct", "--direct_io");  // its spelling before deepio tune and the Python API's direct_io
  p.value("--size", "SIZE", "Comparison mode: bytes per file (default: min(1G, free disk/8, RAM/8))");
  p.value("--runs", "N", "Comparison mode: interleaved runs per engine; medians are reported", "3");
  p.flag("--no_fio", "Comparison mode: measure the ceiling with deepio's raw O_DIRECT loop even if fio is installed");
  p.flag("--no_hugepage_reserve",
         "Comparison mode: never add huge pages to vm.nr_hugepages for fio's buffers (by default root "
         "adds the few it lacks for the run and gives them back)");
  p.flag("--keep", "Comparison mode: keep the temporary folder and its files");
  p.flag("--json", "Print one JSON object instead of text");
  p.epilog(
      "Examples:\n"
      "  deepio bench                                   # the main job: deepio vs naive vs fio\n"
      "  deepio bench --folder /mnt/nvme --json\n"
      "  deepio bench --folder /mnt/nvme0 --folder /mnt/nvme1 --json   # two drives at once, aggregate\n"
      "  deepio bench --folder /mnt/nvme --io_size 1G --read --queue_depth 128 --io_parallel 4\n"
      "  deepio bench --folder /mnt/nvme --io_size 1G --read --gpu --use_gds --validate\n"
      "  mpirun -np 4 deepio bench --folder /mnt/nvme --io_size 1G   # one process per rank");
  return p;
}

HandleOptions handle_options(const ParsedArgs& a, std::vector<std::string>& errors) {
  HandleOptions o;
  o.block_size = static_cast<std::size_t>(size_arg(a, "--block_size", errors).value_or(1 << 20));
  o.queue_depth = static_cast<std::size_t>(count_arg(a, "--queue_depth", errors).value_or(32));
  o.single_submit = a.has("--single_submit");
  o.overlap_events = !a.has("--sequential_requests");
  o.intra_op_parallelism = static_cast<std::size_t>(count_arg(a, "--io_parallel", errors).value_or(1));
  if (a.has("--backend")) {
    if (auto b = parse_backend(a.get("--backend"))) o.backend = *b;
    else errors.push_back("--backend: '" + a.get("--backend") + "' is not one of auto, io_uring, libaio, threads");
  }
  if (a.has("--direct_io")) {
    if (auto d = parse_direct_io(a.get("--direct_io"))) o.direct_io = *d;
    else errors.push_back("--direct_io: '" + a.get("--direct_io") + "' is not one of auto, on, off");
  }
  return o;
}

/// --gpu/--use_gds: what the GPU layer offers (asked in a child process when `isolated`, so a
/// parent about to fork workers has not initialised CUDA), and the problems with the flags.
GpuProbe check_gpu_flags(const ParsedArgs& a, const std::vector<int>& devices, const char* devices_flag, bool isolated,
                         std::vector<std::string>& errors) {
  if (a.has("--use_gds") && !a.has("--gpu")) errors.push_back("--use_gds requires --gpu");
  if (!a.has("--gpu")) return {};
  const GpuProbe g = probe_gpu(isolated);
  for (auto& e : gpu_problems(g, "--gpu", devices, devices_flag)) errors.push_back(std::move(e));
  return g;
}

// ==== ds_io mode ==========================================================================

/// The processes: --folder x --multi_process, or one per --folder_to_device_mapping entry;
/// each distinct folder must be usable.
void read_mapping(const ParsedArgs& a, DsIoRequest& r, std::vector<std::string>& errors) {
  if (a.list("--folder").size() > 1) {
    errors.push_back("--folder given " + std::to_string(a.list("--folder").size()) +
                     " times: in ds_io mode (--io_size) give one --folder, or one process per folder with "
                     "--folder_to_device_mapping FOLDER1:0 FOLDER2:1 ...");
    return;
  }
  if (a.has("--folder") && a.has("--folder_to_device_mapping")) {
    errors.push_back("give exactly one of --folder or --folder_to_device_mapping");
  } else if (!a.has("--folder") && !a.has("--folder_to_device_mapping")) {
    // Most often a new user who wanted the main job at a smaller size.
    errors.push_back(
        "--io_size selects ds_io mode, which needs --folder or --folder_to_device_mapping (for the "
        "main job on a smaller file, give --size " +
        a.get("--io_size") + " instead)");
  }
  if (a.has("--folder")) {
    r.folder = a.get("--folder");
    const auto procs = count_arg(a, "--multi_process", errors).value_or(1);
    if (procs > 1024) errors.push_back("--multi_process: at most 1024 processes");
    for (std::uint64_t i = 0; i < std::min<std::uint64_t>(procs, 1024); ++i)
      r.mapping.emplace_back(*r.folder, std::to_string(i));
  }
  r.mapping_args = a.list("--folder_to_device_mapping");
  for (const auto& entry : r.mapping_args) {
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos || colon == 0 || !parse_uint(entry.substr(colon + 1))) {
      errors.push_back("--folder_to_device_mapping: '" + entry + "' is not FOLDER:DEVICE_ID");
      continue;
    }
    r.mapping.emplace_back(entry.substr(0, colon), entry.substr(colon + 1));
  }
  std::vector<std::string> seen;
  for (const auto& m : r.mapping) {
    if (std::find(seen.begin(), seen.end(), m.first) != seen.end()) continue;
    seen.push_back(m.first);
    if (auto problem = folder_problem(m.first); !problem.empty()) errors.push_back(problem);
  }
  for (const auto& m : r.mapping) r.plan.folders.push_back(m.first);
}

void check_engine(const ParsedArgs& a, std::vector<std::string>& errors) {
  const std::string engine = a.get("--engine", "aio_handle");
  if (engine == "aio_handle") return;
  if (engine == "aio_basic" || engine == "torch_io" || engine == "torch_fastio") {
    errors.push_back("--engine " + engine +
                     " is not implemented by deepio bench (only aio_handle; "
                     "DeepSpeed's own copy of it does not run either)");
  } else {
    errors.push_back("--engine: '" + engine + "' is not one of aio_handle, aio_basic, torch_io, torch_fastio");
  }
}

DsIoRequest read_ds_io(const ParsedArgs& a, const Launch& launch, std::vector<std::string>& errors) {
  DsIoRequest r;
  DsIoPlan& p = r.plan;
  read_mapping(a, r, errors);
  if (auto v = size_arg(a, "--io_size", errors)) p.io_size = *v;
  (void)size_arg(a, "--fast_io_size", errors);
  p.read = a.has("--read");
  p.loops = static_cast<std::size_t>(count_arg(a, "--loops", errors).value_or(3));
  p.warmup = static_cast<std::size_t>(count_arg(a, "--warmup_loops", errors, true).value_or(1));
  p.include_warmup = a.has("--include_warmup_time");
  p.different_files = a.has("--different_file_each_iteration");
  p.validate = a.has("--validate");
  p.handle = handle_options(a, errors);
  if (p.io_size != 0 && a.has("--block_size") && p.handle.block_size > p.io_size) {
    errors.push_back("--io_size (" + a.get("--io_size") + ") is smaller than --block_size (" + a.get("--block_size") +
                     ")");
  }
  check_engine(a, errors);
  p.gpu = a.has("--gpu");
  p.use_gds = p.gpu && a.has("--use_gds");
  for (const auto& m : r.mapping) p.devices.push_back(static_cast<int>(parse_uint(m.second).value_or(0)));
  // ds_io's rule: every device id of the mapping exists. Local runs fork their processes.
  (void)check_gpu_flags(a, p.devices, a.has("--folder") ? "--multi_process" : "--folder_to_device_mapping",
                        !launch.mpi && r.mapping.size() > 1, errors);
  if (launch.mpi && a.has("--multi_process") && a.get("--multi_process") != "1") {
    errors.push_back("--multi_process: under " + launch.launcher +
                     " each MPI rank is one process; set the count with mpirun -np");
  }
  r.multi_process = a.get("--multi_process", "1");
  if (a.has("--io_parallel")) r.io_parallel = a.get("--io_parallel");
  return r;
}

/// What the processes of a ds_io run reported (at rank 0: all of them).
struct DsIoOutcome {
  std::vector<ProcReport> reports;
  int processes = 0, rank = 0;
  std::string mpi_library;
};

/// Runs the processes (local, or this MPI rank); the header is printed once the process count
/// is known. Throws when the processes cannot be started.
DsIoOutcome run_ds_io(const DsIoRequest& r, const Launch& launch, bool json, int argc, char** argv) {
  DsIoOutcome o;
  auto print_header = [&](int count) {
    if (json) return;
    std::fputs(ds_io_header(r, count, launch.mpi).c_str(), stdout);
    std::fflush(stdout);
  };
  if (!launch.mpi) {
    o.processes = static_cast<int>(r.mapping.size());
    print_header(o.processes);
    o.reports = run_local(o.processes, [&r](Group& g) { return ds_io_process(r.plan, g); });
    return o;
  }
  // Print the header only once MPI told us our rank.
  MpiRun run = run_mpi(&argc, &argv, [&](Group& g) {
    if (g.rank() == 0) print_header(g.size());
    return ds_io_process(r.plan, g);
  });
  o.rank = run.rank;
  o.processes = run.size;
  o.reports = std::move(run.reports);
  o.mpi_library = run.library;
  return o;
}

int ds_io_main(const ParsedArgs& a, std::vector<std::string> errors, int argc, char** argv) {
  const Launch launch = detect_launch();
  const DsIoRequest r = read_ds_io(a, launch, errors);
  if (!errors.empty()) return print_errors(kProg, errors);
  const bool json = a.has("--json");
  DsIoOutcome o;
  try {
    o = run_ds_io(r, launch, json, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    return 1;
  }
  if (o.rank != 0) return 0;
  for (std::size_t i = 0; i < o.reports.size(); ++i) {
    if (o.reports[i].failed) std::fprintf(stderr, "%s: error: process %zu: %s\n", kProg, i, o.reports[i].error);
  }
  const DsIoTotals t = aggregate(o.reports);
  if (!t.ok) return 1;
  const std::string out = json ? ds_io_json(r, t, o.reports, o.processes, launch.mpi, version())
                               : ds_io_result_text(r, t, o.mpi_library);
  std::fputs(out.c_str(), stdout);
  return 0;
}

// ==== comparison mode (the main job) ======================================================

/// At most this many folders at once (4 temporary files each: system.hpp's 64).
constexpr std::size_t kMaxFolders = 16;

/// The folders to work in: every --folder (each usable, none twice), or the first on a disk
/// (pick_disk_folder).
std::vector<std::string> compare_parents(const ParsedArgs& a, std::vector<std::string>& errors) {
  if (a.has("--folder")) {
    const std::vector<std::string>& parents = a.list("--folder");
    for (auto& e : folder_set_problems(parents, "--folder")) errors.push_back(std::move(e));
    const bool comma = std::any_of(parents.begin(), parents.end(),
                                   [](const std::string& p) { return p.find(',') != std::string::npos; });
    if (comma && !errors.empty()) errors.push_back("for several folders, repeat --folder (--folder A --folder B)");
    if (parents.size() > kMaxFolders) errors.push_back("--folder: at most " + std::to_string(kMaxFolders) + " folders");
    return parents;
  }
  std::string why;
  std::string parent = pick_disk_folder(&why);
  if (parent.empty()) errors.push_back("no writable folder on a disk found (" + why + "); give --folder");
  return {parent};
}

int compare_main(const ParsedArgs& a, std::vector<std::string> errors) {
  for (const char* f : kDsIoOnly) {
    if (a.has(f)) errors.push_back(std::string(f) + " is a ds_io-mode flag: give --io_size as well");
  }
  CompareRequest req;
  // GPU rows whenever CUDA is usable; --gpu/--use_gds make them required (an error without CUDA).
  req.gpu_probe = check_gpu_flags(a, {0}, "--gpu", false, errors);
  if (!a.has("--gpu")) req.gpu_probe = probe_gpu(false);
  req.gpu = req.gpu_probe.cuda;
  req.gpu_required = a.has("--gpu");
  req.handle = handle_options(a, errors);
  req.runs = static_cast<std::size_t>(count_arg(a, "--runs", errors).value_or(3));
  if (req.runs > 1000) errors.push_back("--runs: at most 1000");
  const auto size = size_arg(a, "--size", errors);
  const std::vector<std::string> parents = compare_parents(a, errors);
  if (parents.size() > 1 && a.has("--gpu")) errors.push_back("--gpu measures one folder: give one --folder");
  if (size && a.has("--block_size") && *size < req.handle.block_size) {
    errors.push_back("--size (" + a.get("--size") + ") is smaller than --block_size (" + a.get("--block_size") + ")");
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  const bool json = a.has("--json");
  req.no_fio = a.has("--no_fio");
  req.may_reserve_hugepages = !a.has("--no_hugepage_reserve");
  req.progress = !json;

  if (parents.size() > 1) req.gpu = false;  // the GPU rows take one folder (gpu_probe says what CUDA offers)
  // The size suits the folder with the least room; with several, RAM holds a read buffer each.
  std::size_t tightest = 0;
  for (std::size_t i = 1; i < parents.size(); ++i) {
    if (free_disk_bytes(parents[i]) < free_disk_bytes(parents[tightest])) tightest = i;
  }
  const std::uint64_t free_disk = free_disk_bytes(parents[tightest]), ram = physical_memory_bytes();
  const SizeChoice n = choose_size(size, free_disk, ram / parents.size(), req.handle.block_size, parents[tightest],
                                   req.gpu ? 4 : 3);
  if (!n.error.empty()) return print_errors(kProg, {n.error});
  std::vector<CompareSetup> setups;
  try {
    for (const auto& parent : parents) setups.push_back(prepare_compare(parent));
  } catch (const std::exception& e) {
    remove_temp_dir();
    return print_errors(kProg, {e.what()});
  }
  CompareReport rep;
  try {
    rep = run_compare(req, n, setups, parents, free_disk, ram);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    if (a.has("--keep")) keep_temp_files();
    else remove_temp_dir();
    return 1;
  }
  if (a.has("--keep")) keep_temp_files();
  else remove_temp_dir();
  std::fputs((json ? compare_json(rep, version()) : compare_text(rep, version())).c_str(), stdout);
  if (rep.mismatch && !json) std::fprintf(stderr, "%s: error: data read back differs from what was written\n", kProg);
  return rep.mismatch ? 1 : 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  const ArgParser parser = make_parser();
  std::vector<std::string> errors;
  ParsedArgs a;
  if (parse_or_help(parser, argc, argv, a, errors)) return 0;
  if (a.has("--io_size")) {
    for (const char* f : kCompareOnly) {
      if (a.has(f)) errors.push_back(std::string(f) + " belongs to the comparison mode (without --io_size)");
    }
  }
  // Parse errors travel on so that the mode's own checks add theirs: one report, all problems.
  return a.has("--io_size") ? ds_io_main(a, std::move(errors), argc, argv) : compare_main(a, std::move(errors));
}

}  // namespace deepio::cli
