// The measure callback of `deepio tune` on real folders: each TuneRun is one ds_io run
// (dsio.hpp) with one process per folder, warm-up 1, the run's loops; it returns E2E GiB/s
// and throws std::runtime_error with the first failed process's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "deepio/options.hpp"
#include "dsio.hpp"
#include "tune.hpp"

namespace deepio::cli {

class Progress;

class DsIoTuneMeasure {
 public:
  /// `folders`: one process each. `flush`: drop the read file's pages before each read run.
  /// `log_dir`: when not empty, ds_nvme_tune's per-run log files are written there.
  DsIoTuneMeasure(std::vector<std::string> folders, bool flush, std::string log_dir, Progress* progress = nullptr)
      : folders_(std::move(folders)), flush_(flush), log_dir_(std::move(log_dir)), progress_(progress) {}

  double operator()(const TuneRun& run);

  [[nodiscard]] double gib_moved() const noexcept { return gib_moved_; }   ///< warm-up included
  [[nodiscard]] BackendKind backend() const noexcept { return backend_; }  ///< of the last run

 private:
  [[nodiscard]] DsIoPlan plan(const TuneRun& run) const;
  void write_log(const TuneRun& run, const DsIoTotals& t) const;
  std::vector<std::string> folders_;
  bool flush_;
  std::string log_dir_;
  Progress* progress_;
  double gib_moved_ = 0;
  BackendKind backend_ = BackendKind::Threads;
};

/// Registers, for removal on every way out (system.hpp), the ds_io files the search may
/// create in `work` folders for this space and io_size.
void register_tune_files(const TuneSpace& space, std::uint64_t io_size, const std::vector<std::string>& work);

/// ds_io's four result lines ("Task Read Latency = ... sec", ...), as ds_nvme_tune's log
/// parser reads them.
[[nodiscard]] std::string ds_io_log_text(bool read, const DsIoTotals& t);

}  // namespace deepio::cli
