// The search of `deepio tune`, as pure functions over a "measure" callback, so that it can be
// tested against a synthetic storage model without any disk.
//
// A configuration's score is read + write GiB/s (E2E, one ds_io run each), as ds_nvme_tune
// scores it. tune_search (the default) goes coarse to fine with early stopping:
//   1. screen: every combination of the "bytes in flight" knobs (io_parallel x block_size x
//      queue_depth, in that nesting) with overlap_events on and single_submit off (when the
//      space has those values; else its first), on io_size/8 (at least one largest block per
//      worker); a configuration whose read is below half the best read so far is not
//      written: it is pruned and leaves the search;
//   2. confirm: the best six again on io_size/4;
//   3. refine: the best two with every other overlap_events x single_submit variant, on
//      io_size/4, pruned like the screen against the best confirmed read;
//   4. final: the best three (by their latest score) at the full io_size with `loops` loops,
//      two interleaved rounds (A B C A B C); the winner has the highest median sum.
// tune_exhaustive measures the whole space at the full io_size, in ds_nvme_tune's order, and
// keeps the first strictly greatest score.
//
// Order of calls: for each configuration, read (when asked) before write, so that a weak read
// can spare the write. Ties keep the earlier configuration (stable sorts). Exceptions thrown
// by the callback end the search and propagate. Nothing here prints or touches a disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace deepio::cli {

struct TuneConfig {
  std::uint64_t block_size = 1 << 20;
  std::uint64_t queue_depth = 32;
  bool single_submit = false;
  bool overlap_events = true;
  std::uint64_t io_parallel = 1;  ///< intra_op_parallelism
  [[nodiscard]] auto key() const {
    return std::tie(block_size, queue_depth, single_submit, overlap_events, io_parallel);
  }
  bool operator==(const TuneConfig& o) const { return key() == o.key(); }
  bool operator<(const TuneConfig& o) const { return key() < o.key(); }
  /// "bs1M qd32 p1 overlap block".
  [[nodiscard]] std::string label() const;
  /// ds_nvme_tune's log file name: <op>_<single|block>_<sequential|overlap>_ftd<n>_d<qd>_bs<bs>_p<par>.txt
  [[nodiscard]] std::string log_name(const std::string& op, std::size_t ndirs) const;
};

/// The search space: DeepSpeed's 64 configurations by default.
struct TuneSpace {
  std::vector<std::uint64_t> block_size{1 << 20, 8 << 20};
  std::vector<std::uint64_t> queue_depth{32, 128};
  std::vector<bool> sequential_requests{true, false};  ///< = !overlap_events
  std::vector<bool> single_submit{false, true};
  std::vector<std::uint64_t> io_parallel{1, 2, 4, 8};
  /// Every configuration, in ds_nvme_tune's order (block_size outermost, io_parallel inner).
  [[nodiscard]] std::vector<TuneConfig> all() const;
  [[nodiscard]] std::uint64_t max_block_size() const;   ///< 0 when empty
  [[nodiscard]] std::uint64_t max_io_parallel() const;  ///< 0 when empty
};

/// Reads a --sweep_config document ({"block_size": ["1M", 8388608], "queue_depth": [32],
/// "io_parallel": [1, 2], "sequential_requests": [true], "single_submit": [false]}; a scalar
/// counts as a one-element list; sizes as numbers or size strings, booleans also as
/// "true"/"True"/"false"/"False"). Keys left out keep the default. Every problem is appended
/// to `errors` as "--sweep_config: ..."; `name` is how the document is named in them.
TuneSpace parse_sweep_config(std::string_view text, const std::string& name, std::vector<std::string>& errors);
/// The same from a file.
TuneSpace load_sweep_config(const std::string& path, std::vector<std::string>& errors);
/// What makes a space unusable with this io_size: a zero queue_depth or io_parallel, a block
/// size larger than io_size. Empty lists are reported by the parser.
[[nodiscard]] std::vector<std::string> space_problems(const TuneSpace& space, std::uint64_t io_size);

/// One measurement the search asks for: one ds_io run of one operation.
struct TuneRun {
  TuneConfig cfg;
  std::uint64_t io_size = 0;
  std::size_t loops = 1;
  bool read = true;
};
/// Measures one run and returns its E2E GiB/s; throws to end the search.
using TuneMeasure = std::function<double(const TuneRun&)>;

/// One configuration measured at one stage: read and write GiB/s, -1 = not measured.
struct TuneRecord {
  TuneConfig cfg;
  std::string stage;  ///< "screen", "confirm", "refine", "final" or "sweep"
  std::uint64_t io_size = 0;
  double read = -1, write = -1;
  bool pruned = false;  ///< read below half the best so far: write not measured
  [[nodiscard]] double score() const { return (read > 0 ? read : 0.0) + (write > 0 ? write : 0.0); }
};

struct TuneOptions {
  std::uint64_t io_size = 400ULL << 20;                   ///< the full size (final stage, exhaustive)
  std::size_t loops = 1;                                  ///< loops per run at the full size
  bool read = true, write = true;                         ///< which operations to measure (at least one)
  std::function<void(const TuneRecord&)> on_record = {};  ///< called after each configuration
};

struct TuneOutcome {
  TuneConfig best;
  double read = 0, write = 0;  ///< the winner's GiB/s (medians for the search)
};

struct TuneResult {
  TuneOutcome outcome;
  std::vector<TuneRecord> records;  ///< every measurement, in order
  std::size_t runs = 0;             ///< calls of the measure callback
  [[nodiscard]] std::size_t distinct_configs() const;
};

/// The io_sizes of the stages: screen io/8, confirm and refine io/4 (each at least one
/// largest block per worker of the largest io_parallel, at most io), final io.
struct StageSizes {
  std::uint64_t screen = 0, confirm = 0, full = 0;
};
[[nodiscard]] StageSizes stage_sizes(const TuneSpace& space, std::uint64_t io_size);

/// The most measure calls tune_search can make for this space (with no pruning); the
/// exhaustive sweep makes exactly all().size() x operations.
[[nodiscard]] std::size_t search_budget(const TuneSpace& space, bool read, bool write);

TuneResult tune_search(const TuneSpace& space, const TuneOptions& options, const TuneMeasure& measure);
TuneResult tune_exhaustive(const TuneSpace& space, const TuneOptions& options, const TuneMeasure& measure);

/// The configuration with the highest median read + median write over the records of one
/// stage (the first such in order of appearance).
[[nodiscard]] TuneOutcome pick_final(const std::vector<TuneRecord>& records, const std::string& stage);

}  // namespace deepio::cli
