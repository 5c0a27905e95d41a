// The device ceiling: fio run with the engine, block size and depth deepio used, and its JSON
// report read back. fio_argv and parse_fio_report are pure (tested without fio); run_fio
// runs the program through run_process (process.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deepio/options.hpp"
#include "measure.hpp"

namespace deepio::cli {

struct FioJob {
  std::string path;
  bool write = false;
  std::uint64_t nbytes = 0;
  std::size_t block_size = 1 << 20;
  std::size_t iodepth = 32;
  std::size_t numjobs = 1;  ///< the file is split into numjobs equal ranges
  std::string ioengine = "io_uring";
  bool direct = true;
  /// A write into a fresh file: true allocates the whole range first (--fallocate=native,
  /// fallocate(2) mode 0, as deepio does for an extending direct write: HandleStats::
  /// preallocated), false leaves it unallocated (--fallocate=none). fio allocates while laying
  /// the file out, before its clock starts; deepio's fallocate is inside its timing.
  bool preallocate = false;
  /// fio's --mem: "" (its default, malloc: 4 KiB pages) or "shmhuge" (hugetlb pages, so a
  /// request is one DMA segment per huge page: ceiling.hpp); hugepage_bytes: --hugepage-size.
  std::string mem = {};
  std::uint64_t hugepage_bytes = 0;
  /// Several folders (`deepio bench --folder A --folder B`): further files, each one more job
  /// of the same kind and size as `path`'s, all run at once. Empty: one file, as always.
  std::vector<std::string> extra_paths = {};
};

struct FioResult {
  bool ok = false;
  Sample sample;
  std::string command;  ///< the exact command line run
  std::string error;    ///< why not ok
  /// Several files (FioJob::extra_paths): the bytes fio moved on each, in the job's order.
  std::vector<std::uint64_t> file_bytes = {};
};

/// The command line for one job: sequential read or write of nbytes split over numjobs
/// threads, --output-format=json, --fallocate=native or none (FioJob::preallocate), --end_fsync=1 for writes (deepio's
/// write timings include fsync). A write to an existing file of nbytes overwrites it in place (fio neither truncates
/// nor lays it out again).
[[nodiscard]] std::vector<std::string> fio_argv(const std::string& fio_path, const FioJob& job);
/// With FioJob::extra_paths (several files at once): the options common to all jobs first
/// (fio's global section), then one "--name=deepio-ceiling-<i> --filename=<path i>" per file;
/// no --group_reporting, so that the report has each job on its own (parse_fio_report_files).
/// Reads fio's --output-format=json (anything before the first '{' is skipped: fio prints
/// notes there): bytes and runtime of the job's read or write side, CPU from usr_cpu/sys_cpu.
/// ok = false with the reason when the text is not such a report or reports no I/O.
[[nodiscard]] FioResult parse_fio_report(std::string_view out, bool write);
/// The report of a several-file run (fio_argv with extra_paths): jobs named
/// "deepio-ceiling-<i>" for i < files. Bytes are summed per file (file_bytes) and over all;
/// the time is the longest job's runtime (they start together); CPU is every job's. ok =
/// false with the reason when a file's job is missing or moved nothing.
[[nodiscard]] FioResult parse_fio_report_files(std::string_view out, bool write, std::size_t files);
/// Runs `fio` (fio_path: a path or a name on PATH) on one job and parses its report.
FioResult run_fio(const std::string& fio_path, const FioJob& job);
/// "fio-3.33", or empty when `fio --version` fails.
[[nodiscard]] std::string fio_version(const std::string& fio_path);
/// The fio ioengine that matches a deepio backend: io_uring, libaio, psync.
[[nodiscard]] std::string fio_engine_for(BackendKind kind);

}  // namespace deepio::cli
