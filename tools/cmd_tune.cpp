// `deepio tune`: ds_nvme_tune without its 128 full jobs. The search is lib/tune.hpp (coarse
// to fine with early stopping, or --exhaustive); each measurement is one ds_io run
// (lib/tune_dsio.hpp); the reports are lib/tune_report.hpp. This file reads the command line,
// works in fresh sub-folders of the folders given, and prints.
//
// Output: ds_nvme_tune's "Best performance" line and DeepSpeed's "aio" section with real
// booleans and intra_op_parallelism (reference/deepnvme.md §3.5, §4.1); --output writes it to
// a file, --json prints everything, --chart draws every measurement as an SVG.
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "deepio/deepio.hpp"
#include "system.hpp"
#include "tune.hpp"
#include "tune_dsio.hpp"
#include "tune_report.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio tune";

ArgParser make_parser() {
  ArgParser parser(kProg,
                   "Find the best block_size, queue_depth, single_submit, overlap_events and\n"
                   "intra_op_parallelism for a folder, and print DeepSpeed's \"aio\" config section\n"
                   "(real booleans, intra_op_parallelism). Same flags as ds_nvme_tune; instead of running\n"
                   "all 64 configurations x read/write it screens the knobs on small runs, prunes weak\n"
                   "ones early and measures only the best three at full size (--exhaustive: all of them).");
  parser.list("--nvme_dir", "DIR", "Folder(s) to tune; one process per folder (default: a folder on the local disk)");
  parser.value("--folder", "DIR",
               "A folder to tune, like --nvme_dir; repeat it for several (one per drive): each candidate "
               "is then measured on all of them at once and the best for the set is reported");
  parser.value("--sweep_config", "JSON",
               "Search space: {\"block_size\": [...], \"queue_depth\": [...], "
               "\"io_parallel\": [...], \"sequential_requests\": [...], \"single_submit\": [...]}",
               "DeepSpeed's 64 configurations");
  parser.flag("--no_read", "Do not measure reads");
  parser.flag("--no_write", "Do not measure writes");
  parser.value("--io_size", "SIZE", "Bytes per process per run", "400M");
  parser.value("--loops", "N", "Measured loops per run at full size", "1");
  parser.flag("--gpu", "Tune GPU transfers");
  parser.flag("--use_gds", "Tune GPUDirect Storage (requires --gpu; ds_nvme_tune's --gds works too)");
  parser.alias("--gds", "--use_gds");  // ds_nvme_tune's spelling: DeepSpeed users' scripts keep working
  parser.flag("--flush_page_cache", "Drop the read files' pages before each read run (O_DIRECT bypasses them anyway)");
  parser.value("--log_dir", "DIR", "Also write ds_nvme_tune-style logs (one file per run) there");
  parser.flag("--exhaustive", "Measure every configuration at full size, as ds_nvme_tune does");
  parser.value("--output", "FILE", "Write the {\"aio\": ...} section to FILE");
  parser.value("--chart", "FILE.svg", "Draw every measurement as an SVG chart");
  parser.flag("--keep", "Keep the data files");
  parser.flag("--json", "Print one JSON object instead of text");
  parser.flag("--verbose", "Print every measurement on stderr");
  parser.epilog(
      "Examples:\n"
      "  deepio tune --nvme_dir /mnt/nvme --output ds_aio.json --chart tune.svg\n"
      "  deepio tune --nvme_dir /mnt/nvme0 /mnt/nvme1 --io_size 1G\n"
      "  deepio tune --folder /mnt/nvme0 --folder /mnt/nvme1   # the same, as deepio bench spells it\n"
      "  deepio tune --nvme_dir /mnt/nvme --exhaustive       # ds_nvme_tune's full sweep");
  return parser;
}

/// What the command line asks for, checked.
struct TuneRequest {
  std::vector<std::string> dirs;
  TuneSpace space;
  TuneOptions options;
};

/// --nvme_dir / --folder (repeatable), each usable, none twice, at most 16.
std::vector<std::string> read_dirs(const ParsedArgs& a, std::vector<std::string>& errors) {
  std::vector<std::string> dirs = a.list("--nvme_dir");
  if (a.has("--folder")) {
    if (!dirs.empty()) errors.push_back("give --nvme_dir or --folder, not both");
    for (const auto& f : a.list("--folder")) dirs.push_back(f);
  }
  for (auto& e : folder_set_problems(dirs, a.has("--folder") ? "--folder" : "--nvme_dir"))
    errors.push_back(std::move(e));
  if (dirs.size() > 16) errors.push_back("--nvme_dir: at most 16 folders");
  return dirs;
}

TuneRequest read_request(const ParsedArgs& a, std::vector<std::string>& errors) {
  TuneRequest r;
  r.dirs = read_dirs(a, errors);
  const bool explicit_dirs = !r.dirs.empty();
  r.options.read = !a.has("--no_read");
  r.options.write = !a.has("--no_write");
  if (!r.options.read && !r.options.write)
    errors.push_back("--no_read and --no_write together leave nothing to measure");
  if (a.has("--sweep_config")) r.space = load_sweep_config(a.get("--sweep_config"), errors);
  r.options.io_size = a.has("--io_size") ? size_arg(a, "--io_size", errors).value_or(0) : (400ULL << 20);
  r.options.loops = static_cast<std::size_t>(count_arg(a, "--loops", errors).value_or(1));
  for (auto& e : space_problems(r.space, r.options.io_size)) errors.push_back(std::move(e));
  if (a.has("--use_gds") && !a.has("--gpu")) errors.push_back("--use_gds requires --gpu");
  if (a.has("--gpu")) errors.push_back(gpu_problem("--gpu", "--use_gds", a.has("--use_gds")));
  if (!explicit_dirs) {
    std::string why;
    std::string d = pick_disk_folder(&why);
    if (d.empty()) errors.push_back("no writable folder on a disk found (" + why + "); give --nvme_dir");
    else r.dirs.push_back(d);
  }
  return r;
}

/// Writes `text` to `path`; prints the error and returns false when it cannot.
bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (f) return true;
  std::fprintf(stderr, "%s: error: cannot write %s\n", kProg, path.c_str());
  return false;
}

/// The search (or sweep) in `work`, fresh sub-folders of the folders. Throws when a run fails.
TuneResult run_tune(const ParsedArgs& a, TuneRequest& r, const std::vector<std::string>& work, TuneSummary& summary) {
  register_tune_files(r.space, r.options.io_size, work);
  const bool exhaustive = a.has("--exhaustive");
  const std::size_t ops = (r.options.read ? 1 : 0) + (r.options.write ? 1 : 0);
  Progress progress(exhaustive ? r.space.all().size() * ops : search_budget(r.space, r.options.read, r.options.write),
                    !a.has("--json") && !a.has("--verbose"));
  DsIoTuneMeasure measure(work, a.has("--flush_page_cache"), a.get("--log_dir"), &progress);
  if (a.has("--verbose")) {
    r.options.on_record = [](const TuneRecord& rec) { std::fputs(tune_verbose_line(kProg, rec).c_str(), stderr); };
  }
  const double t0 = now_seconds();
  TuneResult result = exhaustive ? tune_exhaustive(r.space, r.options, std::ref(measure))
                                 : tune_search(r.space, r.options, std::ref(measure));
  summary.elapsed_sec = now_seconds() - t0;
  progress.done();
  summary.backend = to_string(measure.backend());
  summary.gib_moved = measure.gib_moved();
  return result;
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  const ArgParser parser = make_parser();
  std::vector<std::string> errors;
  ParsedArgs a;
  if (parse_or_help(parser, argc, argv, a, errors)) return 0;
  TuneRequest r = read_request(a, errors);
  if (!errors.empty()) return print_errors(kProg, errors);
  TuneSummary summary{
      a.has("--exhaustive"),   r.dirs, r.options.io_size, {}, r.space.all().size(), 0, 0, a.has("--use_gds"),
      same_device_note(r.dirs)};
  // Work in a fresh sub-folder of each folder, removed at the end.
  std::vector<std::string> work;
  try {
    for (const auto& d : r.dirs) work.push_back(make_temp_dir(d, "tune"));
  } catch (const std::exception& e) {
    remove_temp_dir();
    return print_errors(kProg, {e.what()});
  }
  TuneResult result;
  try {
    result = run_tune(a, r, work, summary);
  } catch (const std::exception& e) {
    if (a.has("--keep")) keep_temp_files();
    else remove_temp_dir();
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    return 1;
  }
  if (a.has("--keep")) keep_temp_files();
  else remove_temp_dir();
  int status = 0;
  if (a.has("--output") && !write_file(a.get("--output"), aio_json(result.outcome.best, summary.gds, 3))) status = 1;
  if (a.has("--chart") &&
      !write_file(a.get("--chart"), tune_svg(result.records, result.outcome, tune_chart_title(summary, result)))) {
    status = 1;
  }
  if (a.has("--json")) {
    std::fputs(tune_json(summary, result, version()).c_str(), stdout);
    return status;
  }
  std::fputs(tune_text(summary, result).c_str(), stdout);
  if (a.has("--output")) std::printf("wrote %s\n", a.get("--output").c_str());
  if (a.has("--chart")) std::printf("wrote %s\n", a.get("--chart").c_str());
  return status;
}

}  // namespace deepio::cli
