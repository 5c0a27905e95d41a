// The pure parts of a comparison (compare.hpp): a row's figures from its samples, and the one
// ceiling rule (ceiling.hpp's judge_against_ceiling) applied to every row of a report, with the
// reasons that name a ceiling known to be low and the GPU rows that are not results.
#include <unistd.h>

#include <vector>

#include "compare.hpp"
#include "format.hpp"

namespace deepio::cli {

double EngineResult::median_gib() const {
  std::vector<double> v;
  for (const auto& s : samples) v.push_back(s.gib_per_s());
  return median(v);
}

double EngineResult::cpu_per_gib() const {
  double cpu = 0, gib = 0;
  for (const auto& s : samples) {
    cpu += s.cpu_seconds;
    gib += static_cast<double>(s.nbytes) / static_cast<double>(1ULL << 30);
  }
  return gib > 0 ? cpu / gib : 0.0;
}

/// True when the device behind the folder splits a direct request of block_size bytes from
/// 4 KiB pages (more pages than segments per request).
bool splits_small_pages(const QueueLimits& q, std::size_t block_size) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::uint64_t pages = block_size / static_cast<std::size_t>(page > 0 ? page : 4096);
  return q.max_segments > 0 && pages > q.max_segments;
}

CeilingVerdict ceiling_verdict(const CompareReport& r, double g, const EngineResult& ceiling) {
  std::vector<double> samples;
  for (const auto& s : ceiling.samples) samples.push_back(s.gib_per_s());
  CeilingVerdict v = judge_against_ceiling(g, samples);
  if (v.flagged() && r.ceiling_buffers == "pages" && splits_small_pages(r.queue, r.handle.block_size)) {
    v.reason = "above the ceiling, whose 4 KiB-page buffers " + r.queue.device + " splits (max_segments " +
               std::to_string(r.queue.max_segments) + " < pages per " + size_label(r.handle.block_size) + ")";
    v.ceiling_low = true;
  }
  return v;
}

bool gpu_disk_row(const EngineResult& e) noexcept { return e.engine == "gpu_staged" || e.engine == "gpu_gds"; }

CeilingVerdict row_verdict(const CompareReport& r, const EngineResult& e, const EngineResult& ceiling) {
  if (e.engine == "h2d" || e.engine == "d2h") return {};
  const double g = e.median_gib();
  CeilingVerdict v = ceiling_verdict(r, g, ceiling);
  // A GPU disk row beyond the ceiling is not a disk figure (the page cache or a fake served it),
  // unless the ceiling is the one known to be low: then the figure stands, like a disk row's.
  if (v.flagged() && gpu_disk_row(e) && !v.ceiling_low) {
    v.reason = fixed(g, 2) + " GiB/s, " + v.reason + "; not a result";
  }
  return v;
}

CeilingVerdict row_verdict(const CompareReport& r, const EngineResult& e) {
  for (const auto& c : r.results) {
    if (c.op == e.op && c.engine == "ceiling") return row_verdict(r, e, c);
  }
  return {};
}

void flag_results(CompareReport& r) {
  for (auto& e : r.results) e.flag = row_verdict(r, e).reason;
}

const EngineResult& CompareReport::find(const std::string& op, const std::string& engine) const {
  for (const auto& r : results) {
    if (r.op == op && r.engine == engine) return r;
  }
  return results.front();
}

}  // namespace deepio::cli
