// `deepio tune`: ds_nvme_tune without its 128 full jobs.
//
// Each measurement is one ds_io run (dsio.hpp): one process per folder, barrier, warm-up,
// measured loops, E2E GiB/s; the score of a configuration is read + write GiB/s, as
// ds_nvme_tune scores it. The search (default) is coarse to fine with early stopping:
//   1. screen: every combination of the "bytes in flight" knobs (intra_op_parallelism,
//      block_size, queue_depth) with overlap_events on and single_submit off, on a small
//      io_size; a configuration whose read is below half the best read so far is not
//      written (pruned early);
//   2. confirm: the best six again on a larger io_size;
//   3. refine: the best two with every overlap_events x single_submit variant;
//   4. final: the best three at the full io_size, interleaved rounds, medians.
// --exhaustive runs the whole space at the full io_size, as ds_nvme_tune does (one ds_io run
// per configuration and operation), so the two can be compared on the same machine.
//
// Output: ds_nvme_tune's "Best performance" line and DeepSpeed's "aio" section with real
// booleans and intra_op_parallelism (reference/deepnvme.md §3.5, §4.1); --output writes it to
// a file, --json prints everything, --chart draws every measurement as an SVG.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "deepio/deepio.hpp"
#include "dsio.hpp"
#include "measure.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio tune";

struct Cfg {
  std::uint64_t block_size = 1 << 20;
  std::uint64_t queue_depth = 32;
  bool single_submit = false;
  bool overlap_events = true;
  std::uint64_t io_parallel = 1;
  auto key() const { return std::tie(block_size, queue_depth, single_submit, overlap_events, io_parallel); }
  bool operator==(const Cfg& o) const { return key() == o.key(); }
  bool operator<(const Cfg& o) const { return key() < o.key(); }
  [[nodiscard]] std::string label() const {
    return "bs" + size_label(block_size) + " qd" + std::to_string(queue_depth) + " p" + std::to_string(io_parallel) +
           (overlap_events ? " overlap" : " sequential") + (single_submit ? " single" : " block");
  }
  /// ds_nvme_tune's log file name: <op>_<single|block>_<sequential|overlap>_ftd<n>_d<qd>_bs<bs>_p<par>.txt
  [[nodiscard]] std::string log_name(const std::string& op, std::size_t ndirs) const {
    return op + "_" + (single_submit ? "single" : "block") + "_" + (overlap_events ? "overlap" : "sequential") +
           "_ftd" + std::to_string(ndirs) + "_d" + std::to_string(queue_depth) + "_bs" + size_label(block_size) +
           "_p" + std::to_string(io_parallel) + ".txt";
  }
};

struct Space {
  std::vector<std::uint64_t> block_size{1 << 20, 8 << 20};
  std::vector<std::uint64_t> queue_depth{32, 128};
  std::vector<bool> sequential_requests{true, false};
  std::vector<bool> single_submit{false, true};
  std::vector<std::uint64_t> io_parallel{1, 2, 4, 8};
  [[nodiscard]] std::vector<Cfg> all() const {
    std::vector<Cfg> out;
    for (auto bs : block_size)
      for (auto qd : queue_depth)
        for (bool seq : sequential_requests)
          for (bool ss : single_submit)
            for (auto p : io_parallel) out.push_back({bs, qd, ss, !seq, p});
    return out;
  }
};

struct Record {
  Cfg cfg;
  std::string stage;
  std::uint64_t io_size = 0;
  double read = -1, write = -1;  ///< E2E GiB/s; -1 = not measured
  bool pruned = false;
  [[nodiscard]] double score() const { return std::max(read, 0.0) + std::max(write, 0.0); }
};

// Reads one list of a sweep config; appends errors.
template <class T, class F>
std::vector<T> json_list(const JsonValue& v, const std::string& key, F convert, std::vector<std::string>& errors) {
  std::vector<T> out;
  std::vector<const JsonValue*> items;
  if (v.type == JsonValue::Type::Array) {
    for (const auto& i : v.array) items.push_back(&i);
  } else {
    items.push_back(&v);
  }
  for (const JsonValue* i : items) {
    std::optional<T> t = convert(*i);
    if (!t) {
      errors.push_back("--sweep_config: bad value for \"" + key + "\"");
      return {};
    }
    out.push_back(*t);
  }
  if (out.empty()) errors.push_back("--sweep_config: \"" + key + "\" has no values");
  return out;
}

std::optional<std::uint64_t> json_size(const JsonValue& v) {
  if (v.type == JsonValue::Type::Number && v.number >= 1 && v.number == std::floor(v.number)) {
    return static_cast<std::uint64_t>(v.number);
  }
  if (v.type == JsonValue::Type::String) return parse_size(v.string);
  return std::nullopt;
}

std::optional<bool> json_bool(const JsonValue& v) {
  if (v.type == JsonValue::Type::Bool) return v.boolean;
  if (v.type == JsonValue::Type::String && (v.string == "true" || v.string == "True")) return true;
  if (v.type == JsonValue::Type::String && (v.string == "false" || v.string == "False")) return false;
  return std::nullopt;
}

Space load_space(const std::string& path, std::vector<std::string>& errors) {
  Space s;
  std::ifstream in(path);
  if (!in) {
    errors.push_back("--sweep_config: cannot read '" + path + "'");
    return s;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string perr;
  auto doc = parse_json(text, &perr);
  if (!doc || doc->type != JsonValue::Type::Object) {
    errors.push_back("--sweep_config: '" + path + "' is not a JSON object" + (perr.empty() ? "" : " (" + perr + ")"));
    return s;
  }
  for (const auto& [key, v] : doc->object) {
    if (key == "block_size") s.block_size = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "queue_depth") s.queue_depth = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "io_parallel") s.io_parallel = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "sequential_requests") s.sequential_requests = json_list<bool>(v, key, json_bool, errors);
    else if (key == "single_submit") s.single_submit = json_list<bool>(v, key, json_bool, errors);
    else errors.push_back("--sweep_config: unsupported key \"" + key +
                          "\" (block_size, queue_depth, io_parallel, sequential_requests, single_submit)");
  }
  return s;
}

class Tuner {
 public:
  Tuner(std::vector<std::string> dirs, bool do_read, bool do_write, bool flush, bool verbose, bool quiet)
      : dirs_(std::move(dirs)), read_(do_read), write_(do_write), flush_(flush), verbose_(verbose), quiet_(quiet) {}

  /// One ds_io run per requested operation; read first so a weak configuration can be pruned
  /// before its write. Throws std::runtime_error when a run fails.
  Record measure(const Cfg& c, std::uint64_t io, std::size_t loops, const std::string& stage, double prune_read_below) {
    Record r{c, stage, io, -1, -1, false};
    if (read_) {
      r.read = run(c, io, loops, true);
      if (r.read < prune_read_below) r.pruned = true;
    }
    if (write_ && !r.pruned) r.write = run(c, io, loops, false);
    if (verbose_) {
      std::fprintf(stderr, "%s: %-8s %-34s io %-5s read %6s write %6s%s\n", kProg, stage.c_str(), c.label().c_str(),
                   size_label(io).c_str(), r.read < 0 ? "-" : fixed(r.read, 2).c_str(),
                   r.write < 0 ? "-" : fixed(r.write, 2).c_str(), r.pruned ? "  (pruned)" : "");
    }
    records_.push_back(r);
    return r;
  }

  [[nodiscard]] const std::vector<Record>& records() const { return records_; }
  [[nodiscard]] std::size_t runs() const { return runs_; }
  [[nodiscard]] double gib_moved() const { return gib_moved_; }
  [[nodiscard]] BackendKind backend() const { return backend_; }
  void set_log_dir(std::string d) { log_dir_ = std::move(d); }
  Progress* progress = nullptr;

 private:
  double run(const Cfg& c, std::uint64_t io, std::size_t loops, bool read) {
    DsIoPlan p;
    p.folders = dirs_;
    p.io_size = io;
    p.read = read;
    p.loops = loops;
    p.warmup = 1;
    p.handle.block_size = static_cast<std::size_t>(c.block_size);
    p.handle.queue_depth = static_cast<std::size_t>(c.queue_depth);
    p.handle.single_submit = c.single_submit;
    p.handle.overlap_events = c.overlap_events;
    p.handle.intra_op_parallelism = static_cast<std::size_t>(c.io_parallel);
    if (flush_ && read) {
      for (std::size_t t = 0; t < dirs_.size(); ++t) drop_page_cache(ds_io_file(p, static_cast<int>(t), 0, dirs_[t]));
    }
    if (progress != nullptr) progress->step(std::string(read ? "read " : "write ") + c.label());
    const DsIoTotals t = ds_io_run(p);
    if (!t.ok) throw std::runtime_error(t.error);
    ++runs_;
    gib_moved_ += t.gib() * static_cast<double>(loops + 1) / static_cast<double>(loops);
    backend_ = t.backend;
    if (!log_dir_.empty()) write_log(c, read, t);
    return t.e2e_speed();
  }

  void write_log(const Cfg& c, bool read, const DsIoTotals& t) {
    const std::string op = read ? "read" : "write";
    const std::string sub = log_dir_ + "/_aio_bench_" + op + "_logs";
    ::mkdir(log_dir_.c_str(), 0755);
    ::mkdir(sub.c_str(), 0755);
    std::ofstream out(sub + "/" + c.log_name(op, dirs_.size()));
    const std::string Op = read ? "Read" : "Write";
    out << "Task " << Op << " Latency = " << py_float(t.task_latency) << " sec\n"
        << "Task " << Op << " Speed = " << py_float(t.task_speed()) << " GB/sec\n"
        << "E2E " << Op << " Latency = " << py_float(t.e2e_latency) << " sec\n"
        << "E2E " << Op << " Speed = " << py_float(t.e2e_speed()) << " GB/sec\n";
  }

  std::vector<std::string> dirs_;
  bool read_, write_, flush_, verbose_, quiet_;
  std::vector<Record> records_;
  std::size_t runs_ = 0;
  double gib_moved_ = 0;
  BackendKind backend_ = BackendKind::Threads;
  std::string log_dir_;
};

struct Outcome {
  Cfg best;
  double read = 0, write = 0;
};

/// Medians per configuration over records of one stage.
Outcome pick_final(const std::vector<Record>& recs, const std::string& stage) {
  std::map<Cfg, std::pair<std::vector<double>, std::vector<double>>> by;
  std::vector<Cfg> order;
  for (const auto& r : recs) {
    if (r.stage != stage) continue;
    if (!by.count(r.cfg)) order.push_back(r.cfg);
    if (r.read >= 0) by[r.cfg].first.push_back(r.read);
    if (r.write >= 0) by[r.cfg].second.push_back(r.write);
  }
  Outcome best;
  double best_score = -1;
  for (const auto& c : order) {
    const double rd = median(by[c].first), wr = median(by[c].second);
    if (rd + wr > best_score) {
      best_score = rd + wr;
      best = {c, rd, wr};
    }
  }
  return best;
}

Outcome search(Tuner& t, const Space& space, std::uint64_t io, std::size_t loops, bool do_read) {
  const std::uint64_t max_bs = *std::max_element(space.block_size.begin(), space.block_size.end());
  const std::uint64_t max_par = *std::max_element(space.io_parallel.begin(), space.io_parallel.end());
  // Small runs still give every worker at least one block of the largest size.
  const std::uint64_t io1 = std::min(io, std::max(io / 8, max_bs * max_par));
  const std::uint64_t io2 = std::min(io, std::max(io / 4, max_bs * max_par));
  const bool pref_seq = std::find(space.sequential_requests.begin(), space.sequential_requests.end(), false) !=
                                space.sequential_requests.end()
                            ? false
                            : space.sequential_requests.front();
  const bool pref_ss = std::find(space.single_submit.begin(), space.single_submit.end(), false) != space.single_submit.end()
                           ? false
                           : space.single_submit.front();
  auto by_score = [](const Record& a, const Record& b) { return a.score() > b.score(); };

  // 1. screen the bytes-in-flight knobs.
  std::vector<Record> s1;
  double best_read = 0;
  for (auto p : space.io_parallel)
    for (auto bs : space.block_size)
      for (auto qd : space.queue_depth) {
        Record r = t.measure({bs, qd, pref_ss, !pref_seq, p}, io1, 1, "screen", do_read ? 0.5 * best_read : -1);
        best_read = std::max(best_read, r.read);
        if (!r.pruned) s1.push_back(r);
      }
  std::stable_sort(s1.begin(), s1.end(), by_score);
  // 2. confirm the best six on a larger io_size.
  std::vector<Record> s2;
  for (std::size_t i = 0; i < std::min<std::size_t>(6, s1.size()); ++i) {
    s2.push_back(t.measure(s1[i].cfg, io2, 1, "confirm", -1));
  }
  std::stable_sort(s2.begin(), s2.end(), by_score);
  // 3. refine the best two with the submission knobs.
  std::vector<Record> s3 = s2;
  best_read = s2.empty() ? 0 : std::max_element(s2.begin(), s2.end(), [](auto& a, auto& b) { return a.read < b.read; })->read;
  for (std::size_t i = 0; i < std::min<std::size_t>(2, s2.size()); ++i) {
    for (bool seq : space.sequential_requests)
      for (bool ss : space.single_submit) {
        Cfg c = s2[i].cfg;
        c.overlap_events = !seq;
        c.single_submit = ss;
        if (c == s2[i].cfg) continue;
        Record r = t.measure(c, io2, 1, "refine", do_read ? 0.5 * best_read : -1);
        if (!r.pruned) s3.push_back(r);
      }
  }
  std::stable_sort(s3.begin(), s3.end(), by_score);
  // 4. final: the best three at full size, interleaved rounds (A B C A B C), medians.
  std::vector<Cfg> finalists;
  for (const auto& r : s3) {
    if (std::find(finalists.begin(), finalists.end(), r.cfg) == finalists.end()) finalists.push_back(r.cfg);
    if (finalists.size() == 3) break;
  }
  for (int round = 0; round < 2; ++round) {
    for (const auto& c : finalists) t.measure(c, io, loops, "final", -1);
  }
  return pick_final(t.records(), "final");
}

Outcome exhaustive(Tuner& t, const Space& space, std::uint64_t io, std::size_t loops) {
  Outcome best;
  double best_score = -1;
  for (const Cfg& c : space.all()) {
    const Record r = t.measure(c, io, loops, "sweep", -1);
    if (r.score() > best_score) {  // the first strictly greatest, as ds_nvme_tune
      best_score = r.score();
      best = {c, std::max(r.read, 0.0), std::max(r.write, 0.0)};
    }
  }
  return best;
}

std::string aio_json(const Cfg& c, bool gds, int indent) {
  Json j(indent);
  j.begin_object();
  j.begin_object("aio");
  j.value("block_size", c.block_size);
  j.value("queue_depth", c.queue_depth);
  j.value("intra_op_parallelism", c.io_parallel);
  j.value("single_submit", c.single_submit);
  j.value("overlap_events", c.overlap_events);
  j.value("use_gds", gds);
  j.end_object();
  j.end_object();
  return j.str();
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o.push_back(c);
  }
  return o;
}

/// One bar per configuration (its largest-io measurement, final = median), read and write
/// stacked, sorted by score; the winner outlined. Opens in any browser.
std::string svg_chart(const std::vector<Record>& recs, const Outcome& win, const std::string& title) {
  struct Row {
    Cfg cfg;
    std::string stage;
    std::uint64_t io = 0;
    std::vector<double> r, w;
    bool pruned = false;
  };
  std::map<Cfg, Row> rows;
  for (const auto& rec : recs) {
    Row& row = rows[rec.cfg];
    row.cfg = rec.cfg;
    if (rec.io_size > row.io || (rec.io_size == row.io && rec.stage != row.stage)) {
      if (rec.io_size > row.io) {
        row.r.clear();
        row.w.clear();
      }
      row.io = rec.io_size;
      row.stage = rec.stage;
    }
    if (rec.io_size == row.io) {
      if (rec.read >= 0) row.r.push_back(rec.read);
      if (rec.write >= 0) row.w.push_back(rec.write);
      row.pruned = rec.pruned;
    }
  }
  std::vector<Row> v;
  for (auto& [c, row] : rows) v.push_back(row);
  std::stable_sort(v.begin(), v.end(), [](const Row& a, const Row& b) {
    return median(a.r) + median(a.w) > median(b.r) + median(b.w);
  });
  double max_score = 0.1;
  for (const auto& row : v) max_score = std::max(max_score, median(row.r) + median(row.w));
  const int bar_h = 16, gap = 4, left = 330, width = 900, top = 60;
  const int height = top + static_cast<int>(v.size()) * (bar_h + gap) + 50;
  const double scale = (width - left - 80) / max_score;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                  std::to_string(height) + "\" font-family=\"monospace\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  s += "<text x=\"10\" y=\"40\">score = read + write GiB/s (E2E, ds_io); bar = largest io_size measured; "
       "<tspan fill=\"#1f77b4\">read</tspan> + <tspan fill=\"#ff7f0e\">write</tspan></text>\n";
  int y = top;
  for (const auto& row : v) {
    const double rd = median(row.r), wr = median(row.w);
    const bool winner = row.cfg == win.best;
    const std::string label = row.cfg.label() + " [" + row.stage + " " + size_label(row.io) + "]";
    s += "<text x=\"10\" y=\"" + std::to_string(y + 12) + "\"" + (winner ? " font-weight=\"bold\"" : "") + ">" +
         xml_escape(label) + "</text>\n";
    const double rw = rd * scale, ww = wr * scale;
    s += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fixed(rw, 1) +
         "\" height=\"" + std::to_string(bar_h) + "\" fill=\"#1f77b4\"/>\n";
    s += "<rect x=\"" + fixed(left + rw, 1) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fixed(ww, 1) +
         "\" height=\"" + std::to_string(bar_h) + "\" fill=\"#ff7f0e\"/>\n";
    if (winner) {
      s += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(y - 1) + "\" width=\"" + fixed(rw + ww, 1) +
           "\" height=\"" + std::to_string(bar_h + 2) + "\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/>\n";
    }
    s += "<text x=\"" + fixed(left + rw + ww + 6, 1) + "\" y=\"" + std::to_string(y + 12) + "\">" +
         fixed(rd + wr, 2) + (row.pruned ? " (pruned: weak read)" : "") + (winner ? "  best" : "") + "</text>\n";
    y += bar_h + gap;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  ArgParser parser(kProg,
                   "Find the best block_size, queue_depth, single_submit, overlap_events and\n"
                   "intra_op_parallelism for a folder, and print DeepSpeed's \"aio\" config section\n"
                   "(real booleans, intra_op_parallelism). Same flags as ds_nvme_tune; instead of running\n"
                   "all 64 configurations x read/write it screens the knobs on small runs, prunes weak\n"
                   "ones early and measures only the best three at full size (--exhaustive: all of them).");
  parser.list("--nvme_dir", "DIR", "Folder(s) to tune; one process per folder (default: a folder on the local disk)");
  parser.value("--folder", "DIR", "Same as --nvme_dir with one folder", "", true);
  parser.value("--sweep_config", "JSON", "Search space: {\"block_size\": [...], \"queue_depth\": [...], "
                                         "\"io_parallel\": [...], \"sequential_requests\": [...], \"single_submit\": [...]}",
               "DeepSpeed's 64 configurations");
  parser.flag("--no_read", "Do not measure reads");
  parser.flag("--no_write", "Do not measure writes");
  parser.value("--io_size", "SIZE", "Bytes per process per run", "400M");
  parser.value("--loops", "N", "Measured loops per run at full size", "1");
  parser.flag("--gpu", "Tune GPU transfers");
  parser.flag("--gds", "Tune GPUDirect Storage (requires --gpu)");
  parser.flag("--flush_page_cache", "Drop the read files' pages before each read run (O_DIRECT bypasses them anyway)");
  parser.value("--log_dir", "DIR", "Also write ds_nvme_tune-style logs (one file per run) there");
  parser.flag("--exhaustive", "Measure every configuration at full size, as ds_nvme_tune does");
  parser.value("--output", "FILE", "Write the {\"aio\": ...} section to FILE");
  parser.value("--chart", "FILE.svg", "Draw every measurement as an SVG chart");
  parser.flag("--keep", "Keep the data files");
  parser.flag("--json", "Print one JSON object instead of text");
  parser.flag("--verbose", "Print every measurement on stderr");
  parser.epilog("Examples:\n"
                "  deepio tune --nvme_dir /mnt/nvme --output ds_aio.json --chart tune.svg\n"
                "  deepio tune --nvme_dir /mnt/nvme0 /mnt/nvme1 --io_size 1G\n"
                "  deepio tune --nvme_dir /mnt/nvme --exhaustive       # ds_nvme_tune's full sweep");
  std::vector<std::string> errors;
  ParsedArgs a = parser.parse(argc, argv, 1, errors);
  if (a.has("--help")) {
    std::fputs(parser.help().c_str(), stdout);
    return 0;
  }
  std::vector<std::string> dirs = a.list("--nvme_dir");
  if (a.has("--folder")) {
    if (!dirs.empty()) errors.push_back("give --nvme_dir or --folder, not both");
    dirs.push_back(a.get("--folder"));
  }
  const bool explicit_dirs = !dirs.empty();
  for (const auto& d : dirs) {
    if (auto problem = folder_problem(d); !problem.empty()) errors.push_back(problem);
  }
  if (dirs.size() > 16) errors.push_back("--nvme_dir: at most 16 folders");
  const bool do_read = !a.has("--no_read"), do_write = !a.has("--no_write");
  if (!do_read && !do_write) errors.push_back("--no_read and --no_write together leave nothing to measure");
  Space space;
  if (a.has("--sweep_config")) space = load_space(a.get("--sweep_config"), errors);
  const std::uint64_t io = a.has("--io_size") ? size_arg(a, "--io_size", errors).value_or(0) : (400ULL << 20);
  const auto loops = static_cast<std::size_t>(count_arg(a, "--loops", errors).value_or(1));
  if (io != 0 && !space.block_size.empty()) {
    const std::uint64_t max_bs = *std::max_element(space.block_size.begin(), space.block_size.end());
    if (io < max_bs) {
      errors.push_back("--io_size (" + size_label(io) + ") is smaller than the largest block_size searched (" +
                       size_label(max_bs) + ")");
    }
  }
  for (auto v : space.queue_depth) {
    if (v == 0) errors.push_back("--sweep_config: queue_depth must be at least 1");
  }
  for (auto v : space.io_parallel) {
    if (v == 0) errors.push_back("--sweep_config: io_parallel must be at least 1");
  }
  if (a.has("--gds") && !a.has("--gpu")) errors.push_back("--gds requires --gpu");
  if (a.has("--gpu")) errors.push_back(gpu_problem("--gpu", "--gds", a.has("--gds")));
  if (!explicit_dirs) {
    std::string why;
    std::string d = pick_disk_folder(&why);
    if (d.empty()) errors.push_back("no writable folder on a disk found (" + why + "); give --nvme_dir");
    else dirs.push_back(d);
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  const bool json = a.has("--json"), exhaust = a.has("--exhaustive");

  // Work in a fresh sub-folder of each folder, removed at the end.
  std::vector<std::string> work;
  try {
    for (const auto& d : dirs) work.push_back(make_temp_dir(d, "tune"));
  } catch (const std::exception& e) {
    remove_temp_dir();
    return print_errors(kProg, {e.what()});
  }
  {
    // ds_io's file names for every io_size the search may use, so every exit removes them.
    std::set<std::uint64_t> sizes{io};
    const std::uint64_t max_bs = *std::max_element(space.block_size.begin(), space.block_size.end());
    const std::uint64_t max_par = *std::max_element(space.io_parallel.begin(), space.io_parallel.end());
    sizes.insert(std::min(io, std::max(io / 8, max_bs * max_par)));
    sizes.insert(std::min(io, std::max(io / 4, max_bs * max_par)));
    for (auto s : sizes)
      for (bool rd : {true, false})
        for (std::size_t t = 0; t < work.size(); ++t) {
          DsIoPlan p;
          p.io_size = s;
          p.read = rd;
          register_temp_file(ds_io_file(p, static_cast<int>(t), 0, work[t]));
        }
  }
  Tuner tuner(work, do_read, do_write, a.has("--flush_page_cache"), a.has("--verbose"), json);
  if (a.has("--log_dir")) tuner.set_log_dir(a.get("--log_dir"));
  const std::size_t nspace = space.all().size();
  const std::size_t ops = (do_read ? 1 : 0) + (do_write ? 1 : 0);
  Progress progress(exhaust ? nspace * ops : (space.io_parallel.size() * space.block_size.size() *
                                              space.queue_depth.size() + 6 + 6 + 6) * ops,
                    !json && !a.has("--verbose"));
  tuner.progress = &progress;
  Outcome out;
  const double t0 = now_seconds();
  try {
    out = exhaust ? exhaustive(tuner, space, io, loops) : search(tuner, space, io, loops, do_read);
  } catch (const std::exception& e) {
    progress.done();
    if (!a.has("--keep")) remove_temp_dir();
    std::fprintf(stderr, "%s: error: %s\n", kProg, e.what());
    return 1;
  }
  const double elapsed = now_seconds() - t0;
  progress.done();
  if (!a.has("--keep")) remove_temp_dir();

  std::set<Cfg> distinct;
  for (const auto& r : tuner.records()) distinct.insert(r.cfg);
  const bool gds = a.has("--gds");
  const std::string aio = aio_json(out.best, gds, 3);
  int status = 0;
  if (a.has("--output")) {
    std::ofstream f(a.get("--output"));
    f << aio;
    if (!f) {
      std::fprintf(stderr, "%s: error: cannot write %s\n", kProg, a.get("--output").c_str());
      status = 1;
    }
  }
  const std::string title = std::string("deepio tune ") + (exhaust ? "(exhaustive)" : "(search)") + ": " +
                            std::to_string(distinct.size()) + " of " + std::to_string(nspace) + " configurations, " +
                            fixed(elapsed, 1) + " s, " + std::string(to_string(tuner.backend())) + ", " + dirs.front();
  if (a.has("--chart")) {
    std::ofstream f(a.get("--chart"));
    f << svg_chart(tuner.records(), out, title);
    if (!f) {
      std::fprintf(stderr, "%s: error: cannot write %s\n", kProg, a.get("--chart").c_str());
      status = 1;
    }
  }
  if (json) {
    Json j;
    j.begin_object();
    j.value("schema", "deepio.tune/1");
    j.value("version", version());
    j.value("mode", exhaust ? "exhaustive" : "search");
    j.begin_array("folders");
    for (const auto& d : dirs) j.item(d);
    j.end_array();
    j.value("io_size", io);
    j.value("backend", to_string(tuner.backend()));
    j.value("space_size", static_cast<std::uint64_t>(nspace));
    j.value("configurations_measured", static_cast<std::uint64_t>(distinct.size()));
    j.value("ds_io_runs", static_cast<std::uint64_t>(tuner.runs()));
    j.value("gib_moved", tuner.gib_moved());
    j.value("elapsed_sec", elapsed);
    j.begin_object("best");
    j.value("read_gib_per_sec", out.read);
    j.value("write_gib_per_sec", out.write);
    j.end_object();
    j.begin_object("aio");
    j.value("block_size", out.best.block_size);
    j.value("queue_depth", out.best.queue_depth);
    j.value("intra_op_parallelism", out.best.io_parallel);
    j.value("single_submit", out.best.single_submit);
    j.value("overlap_events", out.best.overlap_events);
    j.value("use_gds", gds);
    j.end_object();
    j.begin_array("measurements");
    for (const auto& r : tuner.records()) {
      j.begin_object();
      j.value("stage", r.stage);
      j.value("block_size", r.cfg.block_size);
      j.value("queue_depth", r.cfg.queue_depth);
      j.value("intra_op_parallelism", r.cfg.io_parallel);
      j.value("single_submit", r.cfg.single_submit);
      j.value("overlap_events", r.cfg.overlap_events);
      j.value("io_size", r.io_size);
      if (r.read >= 0) j.value("read_gib_per_sec", r.read);
      else j.null("read_gib_per_sec");
      if (r.write >= 0) j.value("write_gib_per_sec", r.write);
      else j.null("write_gib_per_sec");
      j.value("pruned", r.pruned);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::fputs(j.str().c_str(), stdout);
    return status;
  }
  std::printf("Best performance (GB/sec): read = %5.2f, write = %5.2f\n", out.read, out.write);
  std::fputs(aio.c_str(), stdout);
  std::printf("%s %zu of %zu configurations (%zu ds_io runs, %.1f GiB moved) in %.1f s; backend %s; io_size %s; %s\n",
              exhaust ? "swept" : "searched", distinct.size(), nspace, tuner.runs(), tuner.gib_moved(), elapsed,
              std::string(to_string(tuner.backend())).c_str(), size_label(io).c_str(), dirs.front().c_str());
  if (a.has("--output")) std::printf("wrote %s\n", a.get("--output").c_str());
  if (a.has("--chart")) std::printf("wrote %s\n", a.get("--chart").c_str());
  return status;
}

}  // namespace deepio::cli
