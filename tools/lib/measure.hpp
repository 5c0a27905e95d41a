// The transfers `deepio bench` and `deepio tune` time: deepio itself, the naive
// single-threaded buffered copy users write without deepio, and a raw O_DIRECT loop (the
// device ceiling when fio is not installed; fio itself is run by fio.hpp).
//
// Every function moves exactly nbytes or throws deepio::Error with errno, path and offset;
// timings cover open to close, and for writes include fsync (the data is durable when the
// clock stops, for every engine alike). CPU seconds are getrusage(RUSAGE_SELF) deltas, which
// count every thread of this process; fio's come from its own JSON report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

/// deepio on several files at once (`deepio bench` with several folders): one handle, one
/// operation of nbytes per path, all submitted, then one wait() (the handle's workers serve
/// every device at once: core/worker.hpp); writes then fsync every file. A write sends `buf`
/// to every file; a read fills bufs[i] from paths[i].
Sample deepio_write_files(Handle& h, const void* buf, std::size_t nbytes, const std::vector<std::string>& paths);
Sample deepio_read_files(Handle& h, const std::vector<void*>& bufs, std::size_t nbytes,
                         const std::vector<std::string>& paths);

/// Runs every job at once, one thread each: the aggregate sample is the bytes of all over the
/// wall time from before the first starts to after the last ends, and the whole process's CPU
/// seconds (every thread) in that time. `each`, when given, receives each job's own sample.
/// When jobs throw, the first one's exception is rethrown once all have finished.
Sample run_together(const std::vector<std::function<Sample()>>& jobs, std::vector<Sample>* each = nullptr);

/// What `open(f,'rb').read()` into a tensor does: allocate a fresh bytes object, read(2) the
/// file into it through the page cache, one thread, then memcpy into `dst`.
Sample naive_read(void* dst, std::size_t nbytes, const std::string& path);
/// What `open(f,'wb').write(t.numpy().tobytes())` does: memcpy into a fresh buffer, write(2)
/// it through the page cache, one thread; then fsync (so the timing ends on the device).
/// `in_place`: open(f,'r+b') instead, overwriting the file without truncating it.
Sample naive_write(const void* src, std::size_t nbytes, const std::string& path, bool in_place = false);

/// A raw ceiling without fio: `threads` threads each pread/pwrite one block_size block at a
/// time with O_DIRECT, taking the next block from a shared counter (psync at depth `threads`).
/// `buf` must be page aligned and nbytes a multiple of 4096. Writes end with fsync.
/// `preallocate`: a write first allocates [0, nbytes) with fallocate(2) mode 0 (inside the
/// timing, best effort), as deepio does for an extending direct write.
Sample raw_direct(bool write, void* buf, std::size_t nbytes, std::size_t block_size, std::size_t threads,
                  const std::string& path, bool preallocate = false);

/// Fills nbytes with a deterministic pattern derived from `seed` (fast: 8 bytes per step).
void fill_pattern(void* buf, std::size_t nbytes, std::uint64_t seed);
/// Makes every page of buf resident (writes one byte per page), so timings exclude page faults
/// of the destination.
void touch_pages(void* buf, std::size_t nbytes);

}  // namespace deepio::cli
