// `deepio bench` without --io_size: deepio beside the naive single-threaded buffered copy and
// the device ceiling (fio with the engine, block size and depth deepio used, or a raw
// O_DIRECT loop), all measured in one run, interleaved with the order rotated (A B C, B C A,
// C A B), medians of `runs`. Three operations: "write" into a fresh file (unlinked before each
// run), "overwrite" in place over the file the writes left, "read" from a dropped page cache;
// writes include fsync, for every engine; the first read of deepio and of the naive copy is
// compared with what was written (outside the timed region).
//
// The ceiling is segment-friendly (ceiling.hpp): fio with hugetlb buffers (--mem=shmhuge),
// else the raw loop on deepio's own page-locked THP buffers; fio with ordinary buffers only
// where the device does not split a block_size request of 4 KiB pages. Every figure is judged
// against the ceiling's own samples (judge_against_ceiling, ceiling.hpp): within their spread,
// or above the fastest by no more than the noise margin, it reads "at ceiling"; below them, a
// percentage; beyond every sample by more than the margin, it is flagged with one reason,
// never given as a percentage over 100. The GPU disk rows (Handle and GdsHandle on device
// memory) follow the same rule; a flagged one is withheld (its reason carries the figure),
// where a flagged deepio or naive figure stands and the ceiling is doubted instead (and so does
// a GPU row's when the ceiling is the one known to be low: 4 KiB-page buffers the device splits). The copy
// ceilings of the GPU rows are not judged against the disk's.
//
// Several folders (one per drive, no RAID): every row moves the same bytes to (from) one file
// in each folder, all folders at once, and its figure is the aggregate (all bytes over the
// wall time, CPU of the whole process). deepio: one handle (its queue depth as given, shared
// among the folders' devices), one operation per file (deepio_write_files); the naive copy:
// one thread per folder; the ceiling: fio with one job per folder in one run, or the raw loop
// in every folder at once. Each result keeps the bytes per folder (folder_bytes). The GPU rows
// are measured with one folder only.
//
// choose_size is pure; prepare_compare and run_compare throw std::exception (deepio::Error
// with errno and path for I/O) and leave the temporary folder to remove_temp_dir().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ceiling.hpp"
#include "deepio/deepio.hpp"
#include "gpu.hpp"
#include "measure.hpp"

namespace deepio::cli {

struct CompareRequest {
  HandleOptions handle;
  std::size_t runs = 3;
  bool no_fio = false;   ///< measure the ceiling with the raw loop even if fio is installed
  bool progress = true;  ///< draw a progress line (on a terminal)
  /// Where the hugetlb pool lacks the pages fio needs: add them to vm.nr_hugepages for the run
  /// (root only) and take them away after (false: --no_hugepage_reserve).
  bool may_reserve_hugepages = true;
  /// CUDA is usable (probe_gpu): add the GPU rows, on device `device`: Handle on device memory
  /// (staged), GdsHandle in Auto mode (with its mode), and the copy ceilings host->device (read)
  /// and device->host (write) between device memory and CUDA-registered host memory.
  bool gpu = false;
  bool gpu_required = false;  ///< --gpu: a GPU set-up failure fails the run (else: no GPU rows, and why)
  int device = 0;
  GpuProbe gpu_probe;  ///< what the GPU layer said (reported either way)
};

/// How many bytes each file gets, and why.
struct SizeChoice {
  std::uint64_t nbytes = 0;
  std::string reason;  ///< "--size", "1 GiB", "1/8 of free disk", "1/8 of RAM"
  std::string error;   ///< not empty: no run possible (says why and what to give)
};
/// `requested` (--size) or min(1 GiB, free_disk/8, ram/8) cut to whole max(block_size, 1 MiB)
/// blocks (at least 16 MiB); then rounded up to 4 KiB (the raw loop's O_DIRECT blocks). `files`
/// files of that size (3; 4 with the GPU rows) must fit in free_disk.
[[nodiscard]] SizeChoice choose_size(std::optional<std::uint64_t> requested, std::uint64_t free_disk, std::uint64_t ram,
                                     std::size_t block_size, const std::string& parent, int files = 3);

/// The temporary folder of one comparison and its three files.
struct CompareSetup {
  std::string dir;
  DirectIoInfo dinfo;
  std::string f_deepio, f_naive, f_ceiling;
  std::string f_gpu;  ///< written by the GPU rows (reads use f_deepio, like every engine)
};
/// Creates "<parent>/deepio-bench-XXXXXX", probes its direct-I/O support and registers the
/// files for removal on every way out.
CompareSetup prepare_compare(const std::string& parent);

/// One engine's samples for one operation.
struct EngineResult {
  std::string op;      ///< "write" (fresh file) / "overwrite" / "read"
  std::string engine;  ///< "deepio", "naive", "ceiling"; GPU: "gpu_staged", "gpu_gds", "h2d", "d2h"
  std::string label;
  std::vector<Sample> samples;
  std::string path;      ///< I/O path actually used
  std::string verified;  ///< "" not checked, "yes", "MISMATCH"
  /// Not empty: a measurement problem, in one sentence (row_verdict's reason, set by
  /// flag_results): the median is beyond every ceiling sample by more than the noise margin.
  /// deepio and naive rows: the figure stands, the ceiling is doubted; GPU disk rows: the
  /// figure is withheld (gpu_disk_row), unless the ceiling is known to be low (ceiling_low).
  std::string flag;
  /// Bytes moved in each folder by one run (the last; every run moves the same), in the
  /// order of CompareReport::folders; their sum is the run's nbytes.
  std::vector<std::uint64_t> folder_bytes = {};
  [[nodiscard]] double median_gib() const;
  [[nodiscard]] double cpu_per_gib() const;
};

struct CompareReport {
  CompareSetup setup;  ///< the (first) folder's
  /// Every folder's setup, measured at once (folders[0] is `setup`); one for a single folder.
  std::vector<CompareSetup> folders;
  std::vector<std::string> parents;         ///< the folders given, in order
  std::vector<std::uint64_t> folder_free;   ///< free bytes in each
  std::vector<std::string> folder_devices;  ///< the block device behind each ("" unknown)
  std::string same_device_note;             ///< same_device_note(parents): "" when each is its own
  std::vector<bool> folder_in_memory;       ///< each folder on tmpfs/ramfs (memory_fs: any of them)
  SizeChoice size;
  std::uint64_t free_disk = 0, ram = 0, memlock = 0;
  std::size_t runs = 0;
  HandleOptions handle;
  BackendKind backend = BackendKind::Threads;
  bool locked = false, memory_fs = false;
  std::string ceiling_desc, ceiling_note, fio_command_read, fio_command_write;
  /// The ceiling's buffers: "hugetlb" (fio --mem=shmhuge), "thp" (the raw loop on deepio's
  /// page-locked buffers, mostly on transparent huge pages) or "pages" (4 KiB pages); the
  /// detail says where they came from.
  std::string ceiling_buffers, ceiling_buffers_detail;
  std::uint64_t hugepages_reserved = 0;  ///< pages added to vm.nr_hugepages for the run (given back)
  /// Fresh-file writes: how many of deepio's allocated the file first (HandleStats::
  /// preallocated), and whether the ceiling's then did too (fio --fallocate=native, or the raw
  /// loop's fallocate): the same workload on both sides.
  std::uint64_t deepio_preallocated = 0;
  bool ceiling_preallocated = false;
  QueueLimits queue;       ///< the device behind the folder
  double buffers_thp = 0;  ///< fraction of deepio's buffers on transparent huge pages
  GpuProbe gpu;            ///< what the GPU layer offered
  bool gpu_rows = false;   ///< the GPU rows were measured
  std::string gpu_error;   ///< why they were not although CUDA loaded (device memory, registration refused)
  int gpu_device = 0;
  std::string gds_mode;  ///< the GdsHandle's mode() and mode_reason() after the run
  /// write, overwrite, read; deepio, naive, ceiling each (then the GPU rows, for write and read)
  std::vector<EngineResult> results;
  bool mismatch = false;  ///< data read back differed from what was written
  /// The result of `engine` for `op` (the first result when absent).
  [[nodiscard]] const EngineResult& find(const std::string& op, const std::string& engine) const;
};

CompareReport run_compare(const CompareRequest& req, const SizeChoice& size, const CompareSetup& setup,
                          std::uint64_t free_disk, std::uint64_t ram);
/// The same over several folders at once (`setups` in the order given; `parents` the folders
/// they were made in). `free_disk` is the least free space among them. GPU rows need one folder.
CompareReport run_compare(const CompareRequest& req, const SizeChoice& size, const std::vector<CompareSetup>& setups,
                          const std::vector<std::string>& parents, std::uint64_t free_disk, std::uint64_t ram);

/// The text report: configuration first, then the table and one line per operation.
[[nodiscard]] std::string compare_text(const CompareReport& r, const std::string& version);
/// Where `g` stands against `ceiling`'s samples (judge_against_ceiling); when it is flagged
/// and the ceiling's 4 KiB-page buffers are split by the device, the reason says that instead
/// (the likelier cause). None when no ceiling was measured.
[[nodiscard]] CeilingVerdict ceiling_verdict(const CompareReport& r, double g, const EngineResult& ceiling);
/// True when the device (q) splits a direct request of block_size bytes made of 4 KiB pages
/// (more pages than it takes segments per request): a ceiling on such buffers is low.
[[nodiscard]] bool splits_small_pages(const QueueLimits& q, std::size_t block_size);
/// The GPU rows that move data to or from the disk ("gpu_staged", "gpu_gds"; not the copy
/// ceilings "h2d"/"d2h"). Flagged, their figure is not a result: the page cache or a fake
/// driver served it, not the disk.
[[nodiscard]] bool gpu_disk_row(const EngineResult& e) noexcept;
/// Where row `e` stands against `ceiling`, the ceiling row of its op: ceiling_verdict of its
/// median, one rule for every row. None for the copy ceilings "h2d"/"d2h" (another path's
/// ceiling, not the disk's). A flagged GPU disk row's reason leads with its figure, which the
/// table withholds, and ends "; not a result": "8.70 GiB/s, above every ceiling sample (...)
/// by more than their noise margin (...); not a result"; where the ceiling is known to be low
/// (CeilingVerdict::ceiling_low) the figure stands and the reason blames the ceiling. Pure.
[[nodiscard]] CeilingVerdict row_verdict(const CompareReport& r, const EngineResult& e, const EngineResult& ceiling);
/// The same against the ceiling row of e's op in r.results (None when there is none).
[[nodiscard]] CeilingVerdict row_verdict(const CompareReport& r, const EngineResult& e);
/// Sets every result's flag to its row_verdict's reason (empty when not flagged). Pure.
void flag_results(CompareReport& r);

/// The --json document (schema deepio.bench.compare/3).
[[nodiscard]] std::string compare_json(const CompareReport& r, const std::string& version);

}  // namespace deepio::cli
