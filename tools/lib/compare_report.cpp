// compare_text and compare_json (compare.hpp): what `deepio bench` prints in comparison mode.
#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "compare.hpp"
#include "dsio_report.hpp"
#include "format.hpp"
#include "json.hpp"
#include "table.hpp"

namespace deepio::cli {

namespace {

/// "gpu: ..." : the device and modes of the GPU rows, or why there are none.
std::string gpu_line(const CompareReport& r) {
  const GpuProbe& g = r.gpu;
  if (!r.gpu_rows) {
    return "gpu: no GPU rows (" +
           (!g.cuda               ? g.cuda_reason
            : r.gpu_error.empty() ? "not measured"
                                  : r.gpu_error) +
           ")\n";
  }
  return "gpu: CUDA driver " + std::to_string(g.driver_version) + ", device " + std::to_string(r.gpu_device) + " of " +
         std::to_string(g.device_count) + "; rows: Handle on device memory (staged), GdsHandle auto (" + r.gds_mode +
         "), copy ceilings with CUDA-registered host memory; a disk row flagged by the vs ceiling rule is "
         "withheld, not a result (unless the ceiling is known to be low)\n";
}

/// "fresh-file writes: ..." : whether deepio and the ceiling allocated the file before writing
/// it (one workload for both, or both without).
std::string preallocation_line(const CompareReport& r) {
  const bool fio = r.ceiling_desc.rfind("fio", 0) == 0;
  const std::string runs = std::to_string(r.deepio_preallocated) + " of " + std::to_string(r.runs);
  if (r.deepio_preallocated > 0) {
    return "fresh-file writes: deepio allocates the file first (fallocate, " + runs +
           " runs), and so does the ceiling (" +
           (r.ceiling_preallocated ? (fio ? "fio --fallocate=native" : "fallocate before the loop")
                                   : "NOT: it did not") +
           ")\n";
  }
  return "fresh-file writes: neither deepio nor the ceiling allocates the file first (" +
         std::string(fio ? "fio --fallocate=none" : "no fallocate") + ")\n";
}

/// Several folders: which, and that every figure is their aggregate; nothing for one folder.
std::string folders_lines(const CompareReport& r) {
  if (r.folders.size() < 2) return {};
  std::string s = "folders: " + std::to_string(r.folders.size()) + " at once, " + human_bytes(r.size.nbytes) +
                  " per folder per run; every figure is the aggregate (all folders' bytes / wall time):\n";
  for (std::size_t i = 0; i < r.folders.size(); ++i) {
    const CompareSetup& f = r.folders[i];
    const std::string dev = i < r.folder_devices.size() ? r.folder_devices[i] : std::string();
    s += "  " + f.dir + " (" + f.dinfo.filesystem + (f.dinfo.supported ? ", O_DIRECT ok" : ", no O_DIRECT: buffered") +
         (dev.empty() ? std::string() : ", device " + dev) +
         (i < r.folder_free.size() ? ", " + human_bytes(r.folder_free[i]) + " free" : std::string()) + ")\n";
  }
  if (!r.same_device_note.empty()) s += "note: " + r.same_device_note + "\n";
  return s;
}

std::string config_lines(const CompareReport& r, const std::string& version) {
  const DirectIoInfo& d = r.setup.dinfo;
  const HandleOptions& ho = r.handle;
  std::string s = "deepio " + version + " bench: " + human_bytes(r.size.nbytes) + " per file in " + r.setup.dir + " (" +
                  d.filesystem + ", " +
                  (d.supported
                       ? "O_DIRECT ok, alignment " + std::to_string(d.mem_align) + "/" + std::to_string(d.offset_align)
                       : std::string("no O_DIRECT: buffered")) +
                  ")\n";
  if (r.folders.size() > 1) {
    s = "deepio " + version + " bench: " + human_bytes(r.size.nbytes) + " per file in each of " +
        std::to_string(r.folders.size()) + " folders, at once\n";
  }
  s += folders_lines(r);
  s += "size: " + human_bytes(r.size.nbytes) + " (" + r.size.reason + "; " + human_bytes(r.free_disk) + " free disk, " +
       human_bytes(r.ram) + " RAM)\n";
  s += "deepio: backend " + std::string(to_string(r.backend)) + ", block_size " + size_label(ho.block_size) +
       ", queue_depth " + std::to_string(ho.queue_depth) +
       (r.folders.size() > 1 ? " (one handle, shared among the " + std::to_string(r.folders.size()) + " folders)"
                             : std::string()) +
       ", overlap_events " + (ho.overlap_events ? "true" : "false") + ", single_submit " +
       (ho.single_submit ? "true" : "false") + ", intra_op_parallelism " + std::to_string(ho.intra_op_parallelism) +
       ", buffers " +
       (r.locked ? std::string("page-locked")
                 : "not page-locked (RLIMIT_MEMLOCK " +
                       (r.memlock == UINT64_MAX ? std::string("unlimited") : human_bytes(r.memlock)) + ")") +
       ", " + fixed(100.0 * r.buffers_thp, 0) + "% on transparent huge pages\n";
  s += "ceiling: " + r.ceiling_desc + (r.ceiling_note.empty() ? "" : "; ") + r.ceiling_note + "\n";
  s += "ceiling buffers: " + r.ceiling_buffers + " (" + r.ceiling_buffers_detail + ")" +
       (r.queue.device.empty()
            ? std::string()
            : "; device " + r.queue.device + ": max_segments " + std::to_string(r.queue.max_segments) +
                  ", max_sectors_kb " + std::to_string(r.queue.max_sectors_kb)) +
       "\n";
  s += preallocation_line(r);
  s += "method: " + std::to_string(r.runs) +
       " interleaved runs per engine (order rotated), medians; reads start from a dropped page\n"
       "        cache (fsync + posix_fadvise DONTNEED); writes include fsync: \"write\" goes to a fresh\n"
       "        file, \"overwrite\" in place over the file the writes left\n"
       "vs ceiling: a figure within the ceiling's own runs (slowest to fastest), or above its fastest\n"
       "        by no more than max(their spread, " +
       fixed(100.0 * kCeilingNoise, 0) + "%), reads \"at ceiling\"; only one beyond that is flagged\n";
  s += gpu_line(r);
  if (r.memory_fs) {
    // One warning per folder in memory (the first folder's when the report does not say which).
    for (std::size_t i = 0; i < std::max<std::size_t>(r.folders.size(), 1); ++i) {
      if (r.folders.size() > 1 && (i >= r.folder_in_memory.size() || !r.folder_in_memory[i])) continue;
      const CompareSetup& f = r.folders.empty() ? r.setup : r.folders[i];
      s += "warning: " + f.dir + " is in memory (" + f.dinfo.filesystem +
           "): these are memory speeds, not a device's\n";
    }
  }

  return s;
}

/// "3.2x" / "-" and "85%" / "-": g against the naive copy and against the ceiling.
std::string ratio(double g, double base, int decimals, double factor, const char* suffix) {
  return base > 0 ? fixed(factor * g / base, decimals) + suffix : "-";
}

/// Flagged GPU disk rows are not results; deepio's and the naive copy's figures stand when
/// flagged, and the ceiling is doubted instead.
bool figure_withheld(const CompareReport& r, const EngineResult& e) {
  if (e.flag.empty() || !gpu_disk_row(e)) return false;
  return !row_verdict(r, e).ceiling_low;
}

/// The "vs ceiling" cell: "78%", "at ceiling", "above" (flagged), "-" (nothing to compare with).
std::string ceiling_cell(const CompareReport& r, const EngineResult& e) {
  if (!e.flag.empty()) return "above";
  const CeilingVerdict v = row_verdict(r, e);
  switch (v.standing) {
    case CeilingStanding::Below: return fixed(v.percent, 0) + "%";
    case CeilingStanding::AtCeiling: return "at ceiling";
    case CeilingStanding::Above: return "above";
    default: return "-";
  }
}

std::string results_table(const CompareReport& r) {
  Table t(
      {{9}, {30}, {8, Align::Right}, {9, Align::Right}, {11, Align::Right}, {10, Align::Right}, {0, Align::Left, 2}});
  t.row({"op", "engine", "GiB/s", "vs naive", "vs ceiling", "CPU s/GiB", "I/O path"});
  for (const auto& e : r.results) {
    const double naive = r.find(e.op, "naive").median_gib();
    const double g = e.median_gib();
    std::string path = e.path;
    if (!e.verified.empty()) path += e.verified == "yes" ? ", data verified" : ", DATA MISMATCH";
    if (figure_withheld(r, e)) {
      t.row({e.op, e.label, "flagged", "-", "-", fixed(e.cpu_per_gib(), 2), "FLAGGED: " + e.flag + "; " + path});
      continue;
    }
    t.row({e.op, e.label, fixed(g, 2), ratio(g, naive, 1, 1.0, "x"), ceiling_cell(r, e), fixed(e.cpu_per_gib(), 2),
           e.flag.empty() ? path : "FLAGGED: " + e.flag + "; " + path});
  }
  return "\n" + t.str();
}

/// deepio against the ceiling, in words: "78% of the ceiling", "at the ceiling (fio:
/// 2.50-2.60 GiB/s)", "FLAGGED: <reason>", "no ceiling measured".
std::string ceiling_words(const CompareReport& r, const EngineResult& d) {
  if (!d.flag.empty()) return "FLAGGED: " + d.flag;
  const CeilingVerdict v = row_verdict(r, d);
  switch (v.standing) {
    case CeilingStanding::Below: return fixed(v.percent, 0) + "% of the ceiling";
    case CeilingStanding::AtCeiling:
      return "at the ceiling (its runs: " + fixed(v.lo, 2) + "-" + fixed(v.hi, 2) + " GiB/s)";
    case CeilingStanding::Above: return "FLAGGED: " + v.reason;
    default: return "no ceiling measured";
  }
}

std::string op_lines(const CompareReport& r) {
  std::string s;
  for (const char* op : {"write", "overwrite", "read"}) {
    const EngineResult& d = r.find(op, "deepio");
    const double g = d.median_gib();
    const double naive = r.find(op, "naive").median_gib();
    const std::string name = op == std::string("write")       ? "write (fresh file)"
                             : op == std::string("overwrite") ? "overwrite (in place)"
                                                              : "read";
    s += std::string(op == std::string("write") ? "\n" : "") + " " + name + ": deepio " + fixed(g, 2) +
         " GiB/s = " + ratio(g, naive, 1, 1.0, "") + "x the naive copy, " + ceiling_words(r, d) + "\n";
  }
  return s;
}

}  // namespace

std::string compare_text(const CompareReport& r, const std::string& version) {
  return config_lines(r, version) + results_table(r) + op_lines(r);
}

namespace {

void json_settings(Json& j, const CompareReport& r) {
  const HandleOptions& ho = r.handle;
  j.begin_object("config");
  j.value("backend", to_string(r.backend));
  handle_json_members(j, ho);
  j.value("direct_io", to_string(ho.direct_io));
  j.value("buffers_thp_fraction", r.buffers_thp);
  j.end_object();
  j.begin_object("ceiling");
  j.value("source", r.ceiling_desc.rfind("fio", 0) == 0 ? "fio" : "raw");
  j.value("description", r.ceiling_desc);
  j.value("fio_write_command", r.fio_command_write);
  j.value("fio_read_command", r.fio_command_read);
  j.value("note", r.ceiling_note);
  j.value("buffers", r.ceiling_buffers);
  j.value("buffers_detail", r.ceiling_buffers_detail);
  j.value("hugepages_reserved", r.hugepages_reserved);
  j.value("noise_floor", kCeilingNoise);
  j.value("preallocated", r.ceiling_preallocated);
  j.value("deepio_preallocated_writes", r.deepio_preallocated);
  j.end_object();
  j.begin_object("device");
  j.value("name", r.queue.device);
  j.value("max_segments", r.queue.max_segments);
  j.value("max_sectors_kb", r.queue.max_sectors_kb);
  j.end_object();
}

/// "folders": every folder measured at once (one for a single folder), and the note when two
/// are on one device.
void json_folders(Json& j, const CompareReport& r) {
  j.begin_array("folders");
  for (std::size_t i = 0; i < r.folders.size(); ++i) {
    const CompareSetup& f = r.folders[i];
    j.begin_object();
    j.value("folder", f.dir);
    j.value("parent", i < r.parents.size() ? r.parents[i] : std::string());
    j.value("filesystem", f.dinfo.filesystem);
    j.value("direct_io", f.dinfo.supported);
    j.value("device", i < r.folder_devices.size() ? r.folder_devices[i] : std::string());
    j.value("free_bytes", i < r.folder_free.size() ? r.folder_free[i] : std::uint64_t{0});
    j.end_object();
  }
  j.end_array();
  j.value("same_device_note", r.same_device_note);
}

void json_gpu(Json& j, const CompareReport& r) {
  const GpuProbe& g = r.gpu;
  j.begin_object("gpu");
  j.value("available", g.cuda);
  j.value("reason", g.cuda ? r.gpu_error : g.cuda_reason);
  j.value("rows", r.gpu_rows);
  j.value("device", r.gpu_device);
  j.value("device_count", g.device_count);
  j.value("driver_version", g.driver_version);
  j.value("gds_mode", r.gpu_rows ? r.gds_mode : g.gds_mode + (g.gds_reason.empty() ? "" : ": " + g.gds_reason));
  j.end_object();
}

void json_results(Json& j, const CompareReport& r) {
  j.begin_array("results");
  for (const auto& e : r.results) {
    const double naive = r.find(e.op, "naive").median_gib();
    const CeilingVerdict v = row_verdict(r, e);
    const bool comparable = e.flag.empty() &&
                            (v.standing == CeilingStanding::Below || v.standing == CeilingStanding::AtCeiling);
    j.begin_object();
    j.value("op", e.op);
    j.value("engine", e.engine);
    j.value("label", e.label);
    j.value("gib_per_sec", e.median_gib());
    j.begin_array("samples_gib_per_sec");
    for (const auto& s : e.samples) j.item(s.gib_per_s());
    j.end_array();
    j.value("speedup_vs_naive", naive > 0 ? e.median_gib() / naive : 0.0);
    if (comparable) j.value("percent_of_ceiling", v.percent);
    else j.null("percent_of_ceiling");
    j.value("vs_ceiling", e.flag.empty() ? to_string(v.standing) : "above");
    j.value("cpu_sec_per_gib", e.cpu_per_gib());
    j.value("bytes", e.samples.empty() ? std::uint64_t{0} : e.samples.back().nbytes);
    j.begin_array("folder_bytes");
    for (const auto b : e.folder_bytes) j.value({}, b);
    j.end_array();
    j.value("io_path", e.path);
    if (e.verified.empty()) j.null("verified");
    else j.value("verified", e.verified == "yes");
    j.value("flagged", !e.flag.empty());
    j.value("flag", e.flag);
    j.end_object();
  }
  j.end_array();
}

}  // namespace

std::string compare_json(const CompareReport& r, const std::string& version) {
  const DirectIoInfo& d = r.setup.dinfo;
  Json j;
  j.begin_object();
  j.value("schema", "deepio.bench.compare/3");
  j.value("version", version);
  j.value("folder", r.setup.dir);
  j.value("filesystem", d.filesystem);
  j.begin_object("direct_io");
  j.value("supported", d.supported);
  j.value("mem_align", static_cast<std::uint64_t>(d.mem_align));
  j.value("offset_align", static_cast<std::uint64_t>(d.offset_align));
  j.end_object();
  j.value("size_bytes", r.size.nbytes);
  j.value("size_reason", r.size.reason);
  j.value("runs", static_cast<std::uint64_t>(r.runs));
  j.value("page_locked", r.locked);
  j.value("memlock_limit_bytes", r.memlock);
  json_folders(j, r);
  json_settings(j, r);
  json_gpu(j, r);
  json_results(j, r);
  j.end_object();
  return j.str();
}

}  // namespace deepio::cli
