#include "tune.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "format.hpp"
#include "json.hpp"

namespace deepio::cli {

// ---- configurations and spaces -----------------------------------------------------------

std::string TuneConfig::label() const {
  return "bs" + size_label(block_size) + " qd" + std::to_string(queue_depth) + " p" + std::to_string(io_parallel) +
         (overlap_events ? " overlap" : " sequential") + (single_submit ? " single" : " block");
}

std::string TuneConfig::log_name(const std::string& op, std::size_t ndirs) const {
  return op + "_" + (single_submit ? "single" : "block") + "_" + (overlap_events ? "overlap" : "sequential") + "_ftd" +
         std::to_string(ndirs) + "_d" + std::to_string(queue_depth) + "_bs" + size_label(block_size) + "_p" +
         std::to_string(io_parallel) + ".txt";
}

std::vector<TuneConfig> TuneSpace::all() const {
  std::vector<TuneConfig> out;
  for (auto bs : block_size)
    for (auto qd : queue_depth)
      for (bool seq : sequential_requests)
        for (bool ss : single_submit)
          for (auto p : io_parallel) out.push_back({bs, qd, ss, !seq, p});
  return out;
}

std::uint64_t TuneSpace::max_block_size() const {
  return block_size.empty() ? 0 : *std::max_element(block_size.begin(), block_size.end());
}

std::uint64_t TuneSpace::max_io_parallel() const {
  return io_parallel.empty() ? 0 : *std::max_element(io_parallel.begin(), io_parallel.end());
}

// ---- --sweep_config ----------------------------------------------------------------------

namespace {

// Reads one list of a sweep config (a scalar is a list of one); appends errors.
template <class T, class F>
std::vector<T> json_list(const JsonValue& v, const std::string& key, F convert, std::vector<std::string>& errors) {
  std::vector<const JsonValue*> items;
  if (v.type == JsonValue::Type::Array) {
    for (const auto& i : v.array) items.push_back(&i);
  } else {
    items.push_back(&v);
  }
  std::vector<T> out;
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

}  // namespace

TuneSpace parse_sweep_config(std::string_view text, const std::string& name, std::vector<std::string>& errors) {
  TuneSpace s;
  std::string perr;
  auto doc = parse_json(text, &perr);
  if (!doc || doc->type != JsonValue::Type::Object) {
    errors.push_back("--sweep_config: '" + name + "' is not a JSON object" + (perr.empty() ? "" : " (" + perr + ")"));
    return s;
  }
  for (const auto& [key, v] : doc->object) {
    if (key == "block_size") s.block_size = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "queue_depth") s.queue_depth = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "io_parallel") s.io_parallel = json_list<std::uint64_t>(v, key, json_size, errors);
    else if (key == "sequential_requests") s.sequential_requests = json_list<bool>(v, key, json_bool, errors);
    else if (key == "single_submit") s.single_submit = json_list<bool>(v, key, json_bool, errors);
    else
      errors.push_back("--sweep_config: unsupported key \"" + key +
                       "\" (block_size, queue_depth, io_parallel, sequential_requests, single_submit)");
  }
  return s;
}

TuneSpace load_sweep_config(const std::string& path, std::vector<std::string>& errors) {
  std::ifstream in(path);
  if (!in) {
    errors.push_back("--sweep_config: cannot read '" + path + "'");
    return {};
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_sweep_config(text, path, errors);
}

std::vector<std::string> space_problems(const TuneSpace& space, std::uint64_t io_size) {
  std::vector<std::string> errors;
  if (io_size != 0 && !space.block_size.empty() && io_size < space.max_block_size()) {
    errors.push_back("--io_size (" + size_label(io_size) + ") is smaller than the largest block_size searched (" +
                     size_label(space.max_block_size()) + ")");
  }
  for (auto v : space.queue_depth) {
    if (v == 0) errors.push_back("--sweep_config: queue_depth must be at least 1");
  }
  for (auto v : space.io_parallel) {
    if (v == 0) errors.push_back("--sweep_config: io_parallel must be at least 1");
  }
  return errors;
}

// ---- sizes and budget --------------------------------------------------------------------

StageSizes stage_sizes(const TuneSpace& space, std::uint64_t io) {
  // Small runs still give every worker at least one block of the largest size.
  const std::uint64_t floor = space.max_block_size() * space.max_io_parallel();
  return {std::min(io, std::max(io / 8, floor)), std::min(io, std::max(io / 4, floor)), io};
}

namespace {

/// The submission knobs every screened configuration gets: off when the space has off.
bool preferred(const std::vector<bool>& values) {
  return std::find(values.begin(), values.end(), false) != values.end() ? false : values.front();
}

/// How many overlap_events x single_submit variants the refine stage tries per configuration.
std::size_t refine_variants(const TuneSpace& space) {
  const bool seq = preferred(space.sequential_requests), ss = preferred(space.single_submit);
  const auto same = static_cast<std::size_t>(
      std::count(space.sequential_requests.begin(), space.sequential_requests.end(), seq) *
      std::count(space.single_submit.begin(), space.single_submit.end(), ss));
  return space.sequential_requests.size() * space.single_submit.size() - same;
}

constexpr std::size_t kConfirmed = 6, kRefined = 2, kFinalists = 3, kFinalRounds = 2;

}  // namespace

std::size_t search_budget(const TuneSpace& space, bool read, bool write) {
  const std::size_t screen = space.io_parallel.size() * space.block_size.size() * space.queue_depth.size();
  const std::size_t confirm = std::min(kConfirmed, screen);
  const std::size_t refine = std::min(kRefined, confirm) * refine_variants(space);
  const std::size_t final = kFinalRounds * std::min(kFinalists, confirm + refine);
  return (screen + confirm + refine + final) * ((read ? 1 : 0) + (write ? 1 : 0));
}

std::size_t TuneResult::distinct_configs() const {
  std::set<TuneConfig> distinct;
  for (const auto& r : records) distinct.insert(r.cfg);
  return distinct.size();
}

TuneOutcome pick_final(const std::vector<TuneRecord>& records, const std::string& stage) {
  std::map<TuneConfig, std::pair<std::vector<double>, std::vector<double>>> by;
  std::vector<TuneConfig> order;
  for (const auto& r : records) {
    if (r.stage != stage) continue;
    if (!by.count(r.cfg)) order.push_back(r.cfg);
    if (r.read >= 0) by[r.cfg].first.push_back(r.read);
    if (r.write >= 0) by[r.cfg].second.push_back(r.write);
  }
  TuneOutcome best;
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

// ---- the search --------------------------------------------------------------------------

namespace {

class Searcher {
 public:
  Searcher(const TuneSpace& space, const TuneOptions& o, const TuneMeasure& m) : space_(space), opt_(o), measure_(m) {}

  /// Read first (when asked) so a weak configuration can be pruned before its write.
  TuneRecord measure(const TuneConfig& c, std::uint64_t io, std::size_t loops, const std::string& stage,
                     double prune_read_below) {
    TuneRecord r{c, stage, io, -1, -1, false};
    if (opt_.read) {
      r.read = run({c, io, loops, true});
      if (r.read < prune_read_below) r.pruned = true;
    }
    if (opt_.write && !r.pruned) r.write = run({c, io, loops, false});
    if (opt_.on_record) opt_.on_record(r);
    result_.records.push_back(r);
    return r;
  }
  /// The prune threshold: half the best read, or none when reads are not measured.
  [[nodiscard]] double prune_below(double best_read) const { return opt_.read ? 0.5 * best_read : -1; }

  std::vector<TuneRecord> screen(std::uint64_t io);
  std::vector<TuneRecord> confirm(const std::vector<TuneRecord>& screened, std::uint64_t io);
  std::vector<TuneRecord> refine(const std::vector<TuneRecord>& confirmed, std::uint64_t io);
  void final(const std::vector<TuneRecord>& refined);
  TuneResult finish(const TuneOutcome& outcome) {
    result_.outcome = outcome;
    return std::move(result_);
  }
  [[nodiscard]] const std::vector<TuneRecord>& records() const { return result_.records; }

 private:
  double run(const TuneRun& r) {
    ++result_.runs;
    return measure_(r);
  }
  const TuneSpace& space_;
  const TuneOptions& opt_;
  const TuneMeasure& measure_;
  TuneResult result_;
};

void sort_by_score(std::vector<TuneRecord>& v) {
  std::stable_sort(v.begin(), v.end(), [](const TuneRecord& a, const TuneRecord& b) { return a.score() > b.score(); });
}

std::vector<TuneRecord> Searcher::screen(std::uint64_t io) {
  const bool seq = preferred(space_.sequential_requests), ss = preferred(space_.single_submit);
  std::vector<TuneRecord> kept;
  double best_read = 0;
  for (auto p : space_.io_parallel)
    for (auto bs : space_.block_size)
      for (auto qd : space_.queue_depth) {
        const TuneRecord r = measure({bs, qd, ss, !seq, p}, io, 1, "screen", prune_below(best_read));
        best_read = std::max(best_read, r.read);
        if (!r.pruned) kept.push_back(r);
      }
  sort_by_score(kept);
  return kept;
}

std::vector<TuneRecord> Searcher::confirm(const std::vector<TuneRecord>& screened, std::uint64_t io) {
  std::vector<TuneRecord> out;
  for (std::size_t i = 0; i < std::min(kConfirmed, screened.size()); ++i) {
    out.push_back(measure(screened[i].cfg, io, 1, "confirm", -1));
  }
  sort_by_score(out);
  return out;
}

std::vector<TuneRecord> Searcher::refine(const std::vector<TuneRecord>& confirmed, std::uint64_t io) {
  std::vector<TuneRecord> out = confirmed;
  double best_read = 0;
  for (const auto& r : confirmed) best_read = std::max(best_read, r.read);  // the best confirmed read
  for (std::size_t i = 0; i < std::min(kRefined, confirmed.size()); ++i) {
    for (bool seq : space_.sequential_requests)
      for (bool ss : space_.single_submit) {
        TuneConfig c = confirmed[i].cfg;
        c.overlap_events = !seq;
        c.single_submit = ss;
        if (c == confirmed[i].cfg) continue;
        const TuneRecord r = measure(c, io, 1, "refine", prune_below(best_read));
        if (!r.pruned) out.push_back(r);
      }
  }
  sort_by_score(out);
  return out;
}

/// The best three distinct configurations at full size, interleaved rounds (A B C A B C).
void Searcher::final(const std::vector<TuneRecord>& refined) {
  std::vector<TuneConfig> finalists;
  for (const auto& r : refined) {
    if (std::find(finalists.begin(), finalists.end(), r.cfg) == finalists.end()) finalists.push_back(r.cfg);
    if (finalists.size() == kFinalists) break;
  }
  for (std::size_t round = 0; round < kFinalRounds; ++round) {
    for (const auto& c : finalists) measure(c, opt_.io_size, opt_.loops, "final", -1);
  }
}

}  // namespace

TuneResult tune_search(const TuneSpace& space, const TuneOptions& options, const TuneMeasure& measure) {
  const StageSizes io = stage_sizes(space, options.io_size);
  Searcher s(space, options, measure);
  const auto refined = s.refine(s.confirm(s.screen(io.screen), io.confirm), io.confirm);
  s.final(refined);
  const TuneOutcome outcome = pick_final(s.records(), "final");
  return s.finish(outcome);
}

TuneResult tune_exhaustive(const TuneSpace& space, const TuneOptions& options, const TuneMeasure& measure) {
  Searcher s(space, options, measure);
  TuneOutcome best;
  double best_score = -1;
  for (const TuneConfig& c : space.all()) {
    const TuneRecord r = s.measure(c, options.io_size, options.loops, "sweep", -1);
    if (r.score() > best_score) {  // the first strictly greatest, as ds_nvme_tune
      best_score = r.score();
      best = {c, std::max(r.read, 0.0), std::max(r.write, 0.0)};
    }
  }
  return s.finish(best);
}

}  // namespace deepio::cli
