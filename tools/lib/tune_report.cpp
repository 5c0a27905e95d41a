#include "tune_report.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "format.hpp"
#include "json.hpp"

namespace deepio::cli {

std::string aio_json(const TuneConfig& c, bool gds, int indent) {
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

std::string tune_text(const TuneSummary& s, const TuneResult& r) {
  char line[512];
  std::snprintf(line, sizeof line, "Best performance (GB/sec): read = %5.2f, write = %5.2f\n", r.outcome.read,
                r.outcome.write);
  std::string out = line;
  out += aio_json(r.outcome.best, s.gds, 3);
  std::snprintf(line, sizeof line,
                "%s %zu of %zu configurations (%zu ds_io runs, %.1f GiB moved) in %.1f s; backend %s; io_size %s; ",
                s.exhaustive ? "swept" : "searched", r.distinct_configs(), s.space_size, r.runs, s.gib_moved,
                s.elapsed_sec, s.backend.c_str(), size_label(s.io_size).c_str());
  out += line;
  if (s.folders.size() < 2) return out + (s.folders.empty() ? "" : s.folders.front()) + "\n";
  // Several folders: every configuration ran on all of them at once; the figures are their sum.
  out += std::to_string(s.folders.size()) + " folders at once (aggregate):";
  for (const auto& d : s.folders) out += " " + d;
  out += "\n";
  if (!s.same_device_note.empty()) out += "note: " + s.same_device_note + "\n";
  return out;
}

namespace {

void config_members(Json& j, const TuneConfig& c) {
  j.value("block_size", c.block_size);
  j.value("queue_depth", c.queue_depth);
  j.value("intra_op_parallelism", c.io_parallel);
  j.value("single_submit", c.single_submit);
  j.value("overlap_events", c.overlap_events);
}

void measurements(Json& j, const std::vector<TuneRecord>& records) {
  j.begin_array("measurements");
  for (const auto& r : records) {
    j.begin_object();
    j.value("stage", r.stage);
    config_members(j, r.cfg);
    j.value("io_size", r.io_size);
    j.value_or_null("read_gib_per_sec", r.read, r.read >= 0);
    j.value_or_null("write_gib_per_sec", r.write, r.write >= 0);
    j.value("pruned", r.pruned);
    j.end_object();
  }
  j.end_array();
}

}  // namespace

std::string tune_json(const TuneSummary& s, const TuneResult& r, const std::string& version) {
  Json j;
  j.begin_object();
  j.value("schema", "deepio.tune/1");
  j.value("version", version);
  j.value("mode", s.exhaustive ? "exhaustive" : "search");
  j.begin_array("folders");
  for (const auto& d : s.folders) j.item(d);
  j.end_array();
  j.value("same_device_note", s.same_device_note);
  j.value("io_size", s.io_size);
  j.value("backend", s.backend);
  j.value("space_size", static_cast<std::uint64_t>(s.space_size));
  j.value("configurations_measured", static_cast<std::uint64_t>(r.distinct_configs()));
  j.value("ds_io_runs", static_cast<std::uint64_t>(r.runs));
  j.value("gib_moved", s.gib_moved);
  j.value("elapsed_sec", s.elapsed_sec);
  j.begin_object("best");
  j.value("read_gib_per_sec", r.outcome.read);
  j.value("write_gib_per_sec", r.outcome.write);
  j.end_object();
  j.begin_object("aio");
  config_members(j, r.outcome.best);
  j.value("use_gds", s.gds);
  j.end_object();
  measurements(j, r.records);
  j.end_object();
  return j.str();
}

std::string tune_verbose_line(const std::string& prog, const TuneRecord& r) {
  char line[512];
  std::snprintf(line, sizeof line, "%s: %-8s %-34s io %-5s read %6s write %6s%s\n", prog.c_str(), r.stage.c_str(),
                r.cfg.label().c_str(), size_label(r.io_size).c_str(), r.read < 0 ? "-" : fixed(r.read, 2).c_str(),
                r.write < 0 ? "-" : fixed(r.write, 2).c_str(), r.pruned ? "  (pruned)" : "");
  return line;
}

std::string tune_chart_title(const TuneSummary& s, const TuneResult& r) {
  return std::string("deepio tune ") + (s.exhaustive ? "(exhaustive)" : "(search)") + ": " +
         std::to_string(r.distinct_configs()) + " of " + std::to_string(s.space_size) + " configurations, " +
         fixed(s.elapsed_sec, 1) + " s, " + s.backend + ", " + (s.folders.empty() ? "" : s.folders.front());
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

// ---- the chart ---------------------------------------------------------------------------

namespace {

/// One configuration's bar: the measurements at the largest io_size it was measured at.
struct Bar {
  TuneConfig cfg;
  std::string stage;
  std::uint64_t io = 0;
  std::vector<double> r, w;
  bool pruned = false;
  [[nodiscard]] double score() const { return median(r) + median(w); }
};

std::vector<Bar> bars(const std::vector<TuneRecord>& records) {
  std::map<TuneConfig, Bar> rows;
  for (const auto& rec : records) {
    Bar& row = rows[rec.cfg];
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
  std::vector<Bar> v;
  for (auto& [c, row] : rows) v.push_back(row);
  std::stable_sort(v.begin(), v.end(), [](const Bar& a, const Bar& b) { return a.score() > b.score(); });
  return v;
}

struct ChartGeometry {
  int bar_h = 16, gap = 4, left = 330, width = 900, top = 60;
  double scale = 1;
};

std::string svg_bar(const Bar& row, bool winner, int y, const ChartGeometry& g) {
  const double rd = median(row.r), wr = median(row.w);
  const std::string label = row.cfg.label() + " [" + row.stage + " " + size_label(row.io) + "]";
  std::string s = "<text x=\"10\" y=\"" + std::to_string(y + 12) + "\"" + (winner ? " font-weight=\"bold\"" : "") +
                  ">" + xml_escape(label) + "</text>\n";
  const double rw = rd * g.scale, ww = wr * g.scale;
  s += "<rect x=\"" + std::to_string(g.left) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fixed(rw, 1) +
       "\" height=\"" + std::to_string(g.bar_h) + "\" fill=\"#1f77b4\"/>\n";
  s += "<rect x=\"" + fixed(g.left + rw, 1) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fixed(ww, 1) +
       "\" height=\"" + std::to_string(g.bar_h) + "\" fill=\"#ff7f0e\"/>\n";
  if (winner) {
    s += "<rect x=\"" + std::to_string(g.left) + "\" y=\"" + std::to_string(y - 1) + "\" width=\"" + fixed(rw + ww, 1) +
         "\" height=\"" + std::to_string(g.bar_h + 2) + "\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/>\n";
  }
  s += "<text x=\"" + fixed(g.left + rw + ww + 6, 1) + "\" y=\"" + std::to_string(y + 12) + "\">" + fixed(rd + wr, 2) +
       (row.pruned ? " (pruned: weak read)" : "") + (winner ? "  best" : "") + "</text>\n";
  return s;
}

}  // namespace

std::string tune_svg(const std::vector<TuneRecord>& records, const TuneOutcome& win, const std::string& title) {
  const std::vector<Bar> v = bars(records);
  double max_score = 0.1;
  for (const auto& row : v) max_score = std::max(max_score, row.score());
  ChartGeometry g;
  const int height = g.top + static_cast<int>(v.size()) * (g.bar_h + g.gap) + 50;
  g.scale = (g.width - g.left - 80) / max_score;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(g.width) + "\" height=\"" +
                  std::to_string(height) + "\" font-family=\"monospace\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  s += "<text x=\"10\" y=\"40\">score = read + write GiB/s (E2E, ds_io); bar = largest io_size measured; "
       "<tspan fill=\"#1f77b4\">read</tspan> + <tspan fill=\"#ff7f0e\">write</tspan></text>\n";
  int y = g.top;
  for (const auto& row : v) {
    s += svg_bar(row, row.cfg == win.best, y, g);
    y += g.bar_h + g.gap;
  }
  return s + "</svg>\n";
}

}  // namespace deepio::cli
