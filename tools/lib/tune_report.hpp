// What `deepio tune` prints and writes: DeepSpeed's "aio" config section, the text summary,
// the --json document (schema deepio.tune/1), the --verbose line per measurement, and the
// --chart SVG. Pure string builders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tune.hpp"

namespace deepio::cli {

/// How a tune run went, beside its TuneResult.
struct TuneSummary {
  bool exhaustive = false;
  std::vector<std::string> folders;  ///< as the user named them (not the work sub-folders)
  std::uint64_t io_size = 0;
  std::string backend;  ///< the backend the runs used
  std::size_t space_size = 0;
  double gib_moved = 0, elapsed_sec = 0;
  bool gds = false;
  std::string same_device_note = {};  ///< same_device_note(folders): two of them on one device
};

/// {"aio": {block_size, queue_depth, intra_op_parallelism, single_submit, overlap_events,
/// use_gds}} with real booleans, indented by `indent` (ds_nvme_tune uses 3).
[[nodiscard]] std::string aio_json(const TuneConfig& c, bool gds, int indent);
/// "Best performance (GB/sec): ..." line, the aio section, and one line saying what was
/// measured and how long it took.
[[nodiscard]] std::string tune_text(const TuneSummary& s, const TuneResult& r);
/// One JSON object: settings, counts, the best, the aio section and every measurement.
[[nodiscard]] std::string tune_json(const TuneSummary& s, const TuneResult& r, const std::string& version);
/// "<prog>: <stage> <config> io <size> read <GiB/s> write <GiB/s>[  (pruned)]".
[[nodiscard]] std::string tune_verbose_line(const std::string& prog, const TuneRecord& r);
/// The chart's title: mode, configurations measured, seconds, backend, first folder.
[[nodiscard]] std::string tune_chart_title(const TuneSummary& s, const TuneResult& r);
/// One bar per configuration (its largest-io measurement, final = median), read and write
/// stacked, sorted by score; the winner outlined. Opens in any browser.
[[nodiscard]] std::string tune_svg(const std::vector<TuneRecord>& records, const TuneOutcome& win,
                                   const std::string& title);
/// `s` with <, > and & escaped for XML text.
[[nodiscard]] std::string xml_escape(const std::string& s);

}  // namespace deepio::cli
