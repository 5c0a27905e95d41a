// OpState: the shared state of one read or write, from submission to collection.
//
// Lifecycle: the submitting thread creates it, opens the file, plans the slices and hands one
// to each involved worker (remaining_ = number of slices). Each worker calls slice_done()
// when its slice has fully completed or failed; the last call closes the descriptors deepio
// opened, marks the op done and wakes waiters. Failures are recorded with fail(): the first
// one is kept, later ones are dropped, and workers skip the unsubmitted blocks of a failed op.
// Thread safety: all mutable fields are guarded by mutex_, except remaining_ and failed_
// which are atomics; descriptors are immutable after submission except the lazily opened
// buffered one, which is created under mutex_.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "memory/regions.hpp"
#include "platform/fd.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

/// Engine-wide counters; updated with relaxed atomics by workers.
struct Counters {
  std::atomic<std::uint64_t> ops_completed{0};
  std::atomic<std::uint64_t> ops_failed{0};
  std::atomic<std::uint64_t> bytes_direct{0};
  std::atomic<std::uint64_t> bytes_bounced{0};
  std::atomic<std::uint64_t> bytes_buffered{0};
  std::atomic<std::uint64_t> bytes_fixed{0};
  std::atomic<std::uint64_t> direct_refused{0};
  std::atomic<std::uint64_t> short_transfers{0};
  std::atomic<std::uint64_t> retries{0};
};

/// Something waiting for "any op finished" (the engine, for fd back-pressure and shutdown).
struct CompletionSignal {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t finished = 0;  ///< guarded by mutex
};

class OpState {
 public:
  OpState(bool write, std::string path, std::uint64_t offset, std::size_t nbytes,
          Counters* counters, CompletionSignal* signal)
      : write_(write), path_(std::move(path)), offset_(offset), nbytes_(nbytes),
        counters_(counters), signal_(signal) {}

  [[nodiscard]] bool write() const noexcept { return write_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::size_t nbytes() const noexcept { return nbytes_; }
  /// The GPU whose memory the buffer is in, or -1 for host memory. Set before dispatch.
  [[nodiscard]] int device() const noexcept { return device_; }
  void set_device(int device) noexcept { device_ = device; }
  /// The locked allocation holding the whole buffer (id 0: none). Set before dispatch.
  [[nodiscard]] const LockedRegion& region() const noexcept { return region_; }
  void set_region(const LockedRegion& region) noexcept { region_ = region; }

  // --- descriptors (set before the op is handed to workers) ---
  void set_direct_fd(UniqueFd fd) noexcept { owned_direct_ = std::move(fd); direct_fd_ = owned_direct_.get(); }
  void borrow_direct_fd(int fd) noexcept { direct_fd_ = fd; }
  void set_buffered_fd(UniqueFd fd) noexcept { owned_buffered_ = std::move(fd); buffered_fd_ = owned_buffered_.get(); }
  void borrow_buffered_fd(int fd) noexcept { buffered_fd_ = fd; }
  void set_borrowed_source(int fd) noexcept { borrowed_source_ = fd; }
  [[nodiscard]] int direct_fd() const noexcept { return direct_fd_; }
  /// A descriptor without O_DIRECT, opened on first use (by path, or for a caller's O_DIRECT
  /// descriptor by reopening /proc/self/fd/N). Thread-safe.
  Status buffered_fd(int* out);

  // --- progress ---
  void set_slices(int n) noexcept { remaining_.store(n, std::memory_order_relaxed); }
  void fail(Status status);
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  /// Called once per slice by the worker that ran it; the last call completes the op.
  void slice_done() noexcept;
  /// Completes an op that has no slices (nbytes == 0) or failed before any was queued.
  void complete_now() noexcept;

  // --- waiting and collection ---
  [[nodiscard]] bool done() const noexcept;
  void wait() const noexcept;
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds timeout) const noexcept;
  /// For Future::get(): the error (marked observed so wait() skips it) or success.
  Status take_result();
  /// For Handle::wait(): claims the op once; returns false if already claimed. Sets *error to
  /// the op's unobserved failure, if any.
  bool claim(Status* error);
  [[nodiscard]] bool claimed_by_future() const noexcept;
  [[nodiscard]] bool claimed() const noexcept;

 private:
  void finish() noexcept;

  const bool write_;
  const std::string path_;
  const std::uint64_t offset_;
  const std::size_t nbytes_;
  Counters* const counters_;
  CompletionSignal* const signal_;

  UniqueFd owned_direct_;
  UniqueFd owned_buffered_;
  int direct_fd_ = -1;
  int buffered_fd_ = -1;      // guarded by mutex_ once workers run
  int borrowed_source_ = -1;  // caller's descriptor, for reopening without O_DIRECT
  int device_ = -1;
  LockedRegion region_;

  std::atomic<int> remaining_{0};
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;               // guarded by mutex_
  Status error_;                    // guarded by mutex_
  bool error_observed_ = false;     // guarded by mutex_
  bool claimed_ = false;            // guarded by mutex_
  bool future_claimed_ = false;     // guarded by mutex_
};

}  // namespace deepio::detail
