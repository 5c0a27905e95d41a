// ds_io's measurement loop (reference/deepnvme.md §3.2), shared by `deepio bench --io_size`
// and `deepio tune`: per process, barrier; set up files, buffer and handle; barrier; then
// warm-up + measured iterations, each "op, barrier" so E2E time includes waiting for the
// slowest process. Aggregation: latency = max over processes of summed seconds, speed =
// all bytes / latency / 2^30.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepio/deepio.hpp"
#include "group.hpp"

namespace deepio::cli {

struct DsIoPlan {
  std::vector<std::string> folders;  ///< process i uses folders[i % size]
  std::uint64_t io_size = 0;
  bool read = false;
  std::size_t loops = 3, warmup = 1;
  bool include_warmup = false, different_files = false, validate = false;
  HandleOptions handle;
  /// --gpu: the buffer is CUDA device memory on devices[i % size] (process i), moved by a
  /// deepio::Handle (staged through page-locked slots), or with --use_gds by a GdsHandle in Auto
  /// mode (cuFile, staging where cuFile refuses a file).
  bool gpu = false, use_gds = false;
  std::vector<int> devices;
};

/// `<folder>/_aio_<read|write>_<io_size>.pt.<tid>_<loop or 0>`, ds_io's file names.
std::string ds_io_file(const DsIoPlan& p, int tid, std::size_t loop, const std::string& folder);

/// One process's part of a ds_io run. Throws deepio::Error / std::runtime_error on failure.
/// With plan.gpu the process makes its device's primary context current, allocates the buffer
/// with cuMemAlloc and, with --validate, copies it back to host memory outside the timed region.
ProcReport ds_io_process(const DsIoPlan& p, Group& g);

struct DsIoTotals {
  bool ok = false;
  std::string error;  ///< the first failed process's message
  int processes = 0;
  double task_latency = 0, e2e_latency = 0, cpu_sec = 0;
  std::uint64_t bytes = 0, bytes_direct = 0, bytes_bounced = 0, bytes_buffered = 0, direct_refused = 0;
  BackendKind backend = BackendKind::Threads;
  std::uint64_t bytes_cufile = 0, bytes_staged = 0, files_fallback = 0;
  std::string gpu_mode;  ///< process 0's ProcReport::gpu_mode ("" without --gpu)
  [[nodiscard]] double gib() const noexcept { return static_cast<double>(bytes) / static_cast<double>(1ULL << 30); }
  [[nodiscard]] double task_speed() const noexcept { return task_latency > 0 ? gib() / task_latency : 0.0; }
  [[nodiscard]] double e2e_speed() const noexcept { return e2e_latency > 0 ? gib() / e2e_latency : 0.0; }
};
DsIoTotals aggregate(const std::vector<ProcReport>& reports);

/// Runs plan.folders.size() local processes (forked when more than one) and aggregates.
DsIoTotals ds_io_run(const DsIoPlan& plan);

/// "O_DIRECT 100%", "buffered 100%", "O_DIRECT 60%, buffered 40%" from byte counters.
std::string io_path(std::uint64_t direct, std::uint64_t bounced, std::uint64_t buffered, std::uint64_t refused);

/// Writes nbytes of a deterministic pattern with plain pwrite, then fsync.
void write_file_plain(const std::string& path, std::size_t nbytes, std::uint64_t seed);
/// Compares buf with the file's first nbytes (plain pread); returns "" or the problem.
std::string compare_with_file(const void* buf, std::size_t nbytes, const std::string& path);

}  // namespace deepio::cli
