// The transfers `deepio bench` and `deepio tune` time: deepio itself, the naive
// single-threaded buffered copy users write without deepio, and the device ceiling (fio with
// matching parameters, or a raw O_DIRECT loop when fio is not installed).
//
// Every function moves exactly nbytes or throws deepio::Error with errno, path and offset;
// timings cover open to close, and for writes include fsync (the data is durable when the
// clock stops, for every engine alike). CPU seconds are getrusage(RUSAGE_SELF) deltas, which
// count every thread of this process; fio's come from its own JSON report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "deepio/deepio.hpp"

namespace deepio::cli {

struct Sample {
  double seconds = 0.0;
  double cpu_seconds = 0.0;
  std::uint64_t nbytes = 0;
  [[nodiscard]] double gib_per_s() const noexcept {
    return seconds > 0 ? static_cast<double>(nbytes) / seconds / static_cast<double>(1ULL << 30) : 0.0;
  }
};

/// deepio: one async_pwrite of the whole buffer, wait(), then fsync of the file.
Sample deepio_write(Handle& h, const void* buf, std::size_t nbytes, const std::string& path);
/// deepio: one async_pread of the whole file range, wait().
Sample deepio_read(Handle& h, void* buf, std::size_t nbytes, const std::string& path);

/// What `open(f,'rb').read()` into a tensor does: allocate a fresh bytes object, read(2) the
/// file into it through the page cache, one thread, then memcpy into `dst`.
Sample naive_read(void* dst, std::size_t nbytes, const std::string& path);
/// What `open(f,'wb').write(t.numpy().tobytes())` does: memcpy into a fresh buffer, write(2)
/// it through the page cache, one thread; then fsync (so the timing ends on the device).
Sample naive_write(const void* src, std::size_t nbytes, const std::string& path);

/// A raw ceiling without fio: `threads` threads each pread/pwrite one block_size block at a
/// time with O_DIRECT, taking the next block from a shared counter (psync at depth `threads`).
/// `buf` must be page aligned and nbytes a multiple of 4096. Writes end with fsync.
Sample raw_direct(bool write, void* buf, std::size_t nbytes, std::size_t block_size,
                  std::size_t threads, const std::string& path);

struct FioJob {
  std::string path;
  bool write = false;
  std::uint64_t nbytes = 0;
  std::size_t block_size = 1 << 20;
  std::size_t iodepth = 32;
  std::size_t numjobs = 1;       ///< the file is split into numjobs equal ranges
  std::string ioengine = "io_uring";
  bool direct = true;
};

struct FioResult {
  bool ok = false;
  Sample sample;
  std::string command;  ///< the exact command line run
  std::string error;    ///< why not ok
};

/// Runs `fio` (found on PATH as `fio_path`) on one job and parses --output-format=json.
FioResult run_fio(const std::string& fio_path, const FioJob& job);
/// "fio-3.33", or empty when `fio --version` fails.
std::string fio_version(const std::string& fio_path);
/// The fio ioengine that matches a deepio backend: io_uring, libaio, psync.
std::string fio_engine_for(BackendKind kind);

/// Fills nbytes with a deterministic pattern derived from `seed` (fast: 8 bytes per step).
void fill_pattern(void* buf, std::size_t nbytes, std::uint64_t seed);
/// Makes every page of buf resident (writes one byte per page), so timings exclude page faults
/// of the destination.
void touch_pages(void* buf, std::size_t nbytes);

}  // namespace deepio::cli
