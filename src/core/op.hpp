// OpState: the shared state of one read or write, from submission to collection.
//
// Lifecycle: the submitting thread creates it, opens the file, plans the slices and hands one
// to each involved worker (remaining_ = number of slices). Each worker calls slice_done()
// when its slice has fully completed or failed; the last call closes the descriptors deepio
// opened, marks the op done and wakes waiters. Failures are recorded with fail(): the first
// one is kept, later ones are dropped, and workers skip the unsubmitted blocks of a failed op.
//
// Durable writes (OpOptions::fsync): an op given a SyncRunner does not finish when its last
// slice is done; the runner takes it over and, on another thread, fdatasyncs the file
// (descriptors still open) and then finishes the op: run_sync(), or sync_file() once for
// several ops of one file and finish_sync() for each. A failed op skips the sync and
// finishes at once.
//
// Collection: a done op is collected exactly once, by claim() (a Handle::collect/wait) or by
// take_result() (Future::get), whichever comes first. Collection hands the caller's
// keep-alive (an opaque owner of the buffer, e.g. a Python object) to the collecting thread,
// so it is never released on a worker thread and never before the op is done; a keep-alive
// is only ever destroyed by whoever collects it, or with the OpState itself when nobody did.
// A detached op (OpOptions::detached) is skipped by waits that do not name it.
//
// Observation: a failure is observed when it is handed to someone who reports it: get()
// (take_result), or a collect() that counts the op (its WaitResult::errors). A failure that
// can no longer reach anyone is given to report_unobserved() exactly once, by whichever
// thread makes it so: the last Future of a detached op dropped (drop_future), such an op
// finishing with no Future left (finish), or the engine destroyed without collecting an op
// that no Future refers to any more (abandon). The thread reports after releasing mutex_.
//
// Thread safety: all mutable fields are guarded by mutex_, except remaining_ and failed_
// which are atomics; descriptors are immutable after submission except the lazily opened
// buffered one, which is created under mutex_ (by reopening the direct one, never by path); sequence_ is written once,
// by the engine, before the op is published to other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/fixed_files.hpp"
#include "core/stager.hpp"
#include "memory/regions.hpp"
#include "platform/fd.hpp"
#include "platform/process.hpp"
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
  std::atomic<std::uint64_t> bytes_gds{0};             ///< moved by a DeviceRoute's backend (cuFile)
  std::atomic<std::uint64_t> bytes_staged{0};          ///< device memory moved through host staging
  std::atomic<std::uint64_t> device_requests{0};       ///< requests cut for ops on device memory
  std::atomic<std::uint64_t> device_ops_completed{0};  ///< of ops_completed, those on device memory
  std::atomic<std::uint64_t> device_ops_failed{0};     ///< of ops_failed, those on device memory
  /// Of device_ops_completed + device_ops_failed, those a DeviceRoute's backend served (cuFile).
  std::atomic<std::uint64_t> device_ops_routed{0};
  std::atomic<std::uint64_t> direct_refused{0};
  std::atomic<std::uint64_t> preallocated{0};  ///< extending direct writes whose range was fallocate()d first
  std::atomic<std::uint64_t> short_transfers{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> synced{0};                ///< ops whose fdatasync (OpOptions::fsync) succeeded
  std::atomic<std::uint64_t> fixed_file_requests{0};   ///< requests through a registered file's slot
  std::atomic<std::uint64_t> fixed_file_fallbacks{0};  ///< file object requests on the plain fd (table full)
};

/// Something waiting for "any op finished" (the engine, for fd back-pressure). Finishing an
/// op costs one atomic increment and one load: the lock and notify_all only while someone
/// waits. A waiter, under mutex: ++waiters, then reads finished, then waits on cv with a
/// predicate on finished, then --waiters. The finisher increments finished, then reads
/// waiters (both sequentially consistent): either the waiter sees the new count, or the
/// finisher sees the waiter and notifies under mutex (so never before the waiter sleeps).
struct CompletionSignal {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<std::uint64_t> finished{0};
  std::atomic<std::uint32_t> waiters{0};  ///< changed under mutex
  void notify() noexcept {
    finished.fetch_add(1);
    if (waiters.load() == 0) return;
    { std::lock_guard lock(mutex); }
    cv.notify_all();
  }
};

class OpState;

/// Runs the durability step of ops with OpOptions::fsync off the worker threads (the engine's
/// sync threads). post() takes the op over: it must complete it exactly once, by run_sync() or
/// by finish_sync() with the result of a sync_file() (of this op or of another op of the same
/// file) that started after post() was called.
class SyncRunner {
 public:
  virtual ~SyncRunner() = default;
  virtual void post(std::shared_ptr<OpState> op) noexcept = 0;

 protected:
  SyncRunner() = default;
  SyncRunner(const SyncRunner&) = default;
  SyncRunner& operator=(const SyncRunner&) = default;
};

class OpState : public std::enable_shared_from_this<OpState> {
 public:
  OpState(bool write, std::string path, std::uint64_t offset, std::size_t nbytes, Counters* counters,
          CompletionSignal* signal)
      : write_(write), path_(std::move(path)), offset_(offset), nbytes_(nbytes), counters_(counters), signal_(signal) {}

  [[nodiscard]] bool write() const noexcept { return write_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The process that made the op: its workers, and every thread that may hold mutex_, are
  /// there (Future refuses to wait on it anywhere else).
  [[nodiscard]] const ProcessStamp& stamp() const noexcept { return stamp_; }
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::size_t nbytes() const noexcept { return nbytes_; }
  /// The GPU whose memory the buffer is in, or -1 for host memory. Set before dispatch.
  [[nodiscard]] int device() const noexcept { return device_; }
  void set_device(int device) noexcept { device_ = device; }
  /// The buffer is device memory, whichever way it moves (staged, or by a route with
  /// device() reset to -1). Set before dispatch; counted in the device_ops_* counters.
  [[nodiscard]] bool on_device() const noexcept { return on_device_; }
  void set_on_device(bool on) noexcept { on_device_ = on; }
  /// Served by a DeviceRoute's backend (set before dispatch); counted in device_ops_routed.
  [[nodiscard]] bool routed() const noexcept { return routed_; }
  void set_routed(bool routed) noexcept { routed_ = routed; }
  /// What the op's device copies must come after (OpOptions::stream), or null. Set before
  /// dispatch; held until the op is destroyed, so every slice's worker can order on it.
  [[nodiscard]] const DeviceFence* fence() const noexcept { return fence_.get(); }
  void set_fence(std::shared_ptr<DeviceFence> fence) noexcept { fence_ = std::move(fence); }
  /// The locked allocation holding the whole buffer (id 0: none). Set before dispatch.
  [[nodiscard]] const LockedRegion& region() const noexcept { return region_; }
  void set_region(const LockedRegion& region) noexcept { region_ = region; }

  // --- descriptors (set before the op is handed to workers) ---
  void set_direct_fd(UniqueFd fd) noexcept {
    owned_direct_ = std::move(fd);
    direct_fd_ = owned_direct_.get();
  }
  void borrow_direct_fd(int fd) noexcept { direct_fd_ = fd; }
  void set_buffered_fd(UniqueFd fd) noexcept {
    owned_buffered_ = std::move(fd);
    buffered_fd_ = owned_buffered_.get();
  }
  void borrow_buffered_fd(int fd) noexcept { buffered_fd_ = fd; }
  void set_borrowed_source(int fd) noexcept { borrowed_source_ = fd; }
  /// Descriptors owned by `owner` and shared with other ops (a batch's requests on one file):
  /// kept open until this op finishes. -1 for one it does not provide.
  void share_fds(std::shared_ptr<void> owner, int direct_fd, int buffered_fd) noexcept {
    shared_fds_ = std::move(owner);
    direct_fd_ = direct_fd;
    buffered_fd_ = buffered_fd;
  }
  /// A file object's registration records of the descriptors given to share_fds (null for
  /// one it lacks): the worker hands the one of each request's descriptor to the backend
  /// (Request::fixed_file). Set before dispatch, after share_fds.
  void set_fixed_files(FixedFile* direct, FixedFile* buffered) noexcept {
    fixed_direct_ = direct;
    fixed_buffered_ = buffered;
  }
  /// The registration record of descriptor `fd` of the op's file object, or null.
  [[nodiscard]] FixedFile* fixed_file(int fd) const noexcept {
    if (fixed_direct_ != nullptr && fixed_direct_->fd() == fd) return fixed_direct_;
    if (fixed_buffered_ != nullptr && fixed_buffered_->fd() == fd) return fixed_buffered_;
    return nullptr;
  }
  [[nodiscard]] int direct_fd() const noexcept { return direct_fd_; }
  /// Reopens one of the op's own descriptors: (fd, flags, out) -> status. The engine's adds
  /// descriptor back-pressure; by default reopen_file() (platform/sys.hpp).
  using Reopener = std::function<Status(int fd, int flags, UniqueFd* out)>;
  /// The descriptor without O_DIRECT, made on first use by reopening the op's own open
  /// descriptor (its O_DIRECT one, or the caller's) through /proc/self/fd/N: never by path,
  /// so it is the same file as the direct one even if the path was renamed over meanwhile.
  /// The engine makes it at submission when the plan needs it; a worker makes it later only
  /// for a short transfer or an EINVAL fallback of a direct request. Thread-safe.
  Status buffered_fd(int* out, const Reopener& reopen = {});

  /// The op is a durable write: when its slices are done, `runner` runs run_sync() before it
  /// completes. Set before dispatch; the runner outlives the op's completion.
  void set_sync(SyncRunner* runner) noexcept { sync_ = runner; }
  [[nodiscard]] bool syncs() const noexcept { return sync_ != nullptr; }
  /// On the runner's thread: fdatasync of the file unless the op failed (a failure of it
  /// fails the op, naming the file), then completes the op. The same as finish_sync(sync_file())
  /// for an op that has not failed.
  void run_sync() noexcept;
  /// The descriptor a sync of the op's file goes through (-1 if it has none).
  [[nodiscard]] int sync_fd() const noexcept;
  /// fdatasync of the op's file (the Sync fault point first): 0 or the errno. Does not
  /// complete the op; one call may stand for several ops of one file (a runner's group).
  [[nodiscard]] int sync_file() const noexcept;
  /// After a sync_file() of ANOTHER op of the same file through another descriptor: the
  /// writeback errors this op's descriptor has not reported yet (Linux reports each to every
  /// open file description once), without writing anything back: 0 or the errno
  /// (sync_file_range with SYNC_FILE_RANGE_WAIT_AFTER; a file system refusing it is synced).
  [[nodiscard]] int unseen_error() const noexcept;
  /// Completes an op whose blocks are done and whose file a sync_file() that started after
  /// them returned `err` for: fails it with err (naming its file) or counts it synced.
  void finish_sync(int err) noexcept;

  // --- progress ---
  void set_slices(int n) noexcept { remaining_.store(n, std::memory_order_relaxed); }
  void fail(Status status);
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  /// Called once per slice by the worker that ran it; the last call completes the op (or,
  /// for a durable write, hands it to its SyncRunner).
  void slice_done() noexcept;
  /// Completes an op that has no slices (nbytes == 0; a durable one is synced first) or
  /// failed before any was queued.
  void complete_now() noexcept;

  // --- collection bookkeeping (set before the op is published) ---
  void set_keep_alive(std::shared_ptr<void> keep_alive) noexcept;
  /// Position in the engine's submission order (1, 2, ...); 0 until the engine tracks it.
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_; }
  void set_sequence(std::uint64_t sequence) noexcept { sequence_ = sequence; }
  /// Detached ops are collected only by their Future or by a collect() that names them.
  [[nodiscard]] bool detached() const noexcept;
  void set_detached(bool detached) noexcept;

  // --- waiting and collection ---
  [[nodiscard]] bool done() const noexcept;
  void wait() const noexcept;
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds timeout) const noexcept;
  [[nodiscard]] bool wait_until(std::chrono::steady_clock::time_point deadline) const noexcept;
  /// Calls fn once, when done: at once on this thread if already done, else on the thread
  /// that completes the op (a worker or sync thread), after waiters were woken and with no
  /// lock of the op held. fn must not throw and should be short (it delays that thread's
  /// next request). For a binding's completion callbacks (detail::on_done).
  void on_done(std::function<void()> fn);
  /// For Future::get(): waits until done, collects the op if nobody did (moving its keep-alive
  /// into *keep_alive) and returns its error or success. Every call returns the same outcome.
  Status take_result(std::shared_ptr<void>* keep_alive);
  /// For Handle::collect(): collects a done op once; returns false if it was already
  /// collected. Sets *error to the op's failure and moves its keep-alive into *keep_alive.
  /// `counted`: the caller reports the failure (it is then observed); false for a collect()
  /// that only takes the keep-alive (an abandoned or shut-down detached op).
  bool claim(Status* error, std::shared_ptr<void>* keep_alive, bool counted);
  [[nodiscard]] bool claimed() const noexcept;

  // --- observation (see the file comment) ---
  /// A Future began referring to the op.
  void add_future() noexcept;
  /// A Future stopped referring to it; the last one of a detached op reports a failure
  /// nobody took (at once if done, else when the op finishes).
  void drop_future() noexcept;
  /// The engine is destroyed without having collected the op: a failure nobody observed is
  /// reported once no Future refers to it.
  void abandon() noexcept;

 private:
  void finish() noexcept;
  /// Under mutex_: whether the failure is now unobservable and unreported; if so marks it
  /// reported and copies it to *out (for report_unobserved() once mutex_ is released).
  bool take_unreported(Status* out) noexcept;
  /// All slices done: finish, or hand a durable write that has not failed to its runner.
  void slices_finished() noexcept;

  const ProcessStamp stamp_;
  const bool write_;
  const std::string path_;
  const std::uint64_t offset_;
  const std::size_t nbytes_;
  Counters* const counters_;
  CompletionSignal* const signal_;

  UniqueFd owned_direct_;
  UniqueFd owned_buffered_;
  std::shared_ptr<void> shared_fds_;  // released (with the others) when the op finishes
  int direct_fd_ = -1;
  int buffered_fd_ = -1;                 // guarded by mutex_ once workers run
  FixedFile* fixed_direct_ = nullptr;    // owned by shared_fds_ (a file object)
  FixedFile* fixed_buffered_ = nullptr;  // owned by shared_fds_
  int borrowed_source_ = -1;             // caller's descriptor, reopened without O_DIRECT when needed
  int device_ = -1;
  bool on_device_ = false;
  bool routed_ = false;
  std::shared_ptr<DeviceFence> fence_;
  SyncRunner* sync_ = nullptr;
  LockedRegion region_;

  std::atomic<int> remaining_{0};
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::uint64_t sequence_ = 0;
  bool done_ = false;                 // guarded by mutex_
  Status error_;                      // guarded by mutex_
  bool claimed_ = false;              // guarded by mutex_
  bool detached_ = false;             // guarded by mutex_
  std::shared_ptr<void> keep_alive_;  // guarded by mutex_; empty once claimed
  int futures_ = 0;                   // guarded by mutex_: live Futures of the op
  bool orphaned_ = false;             // guarded by mutex_: its last Future is gone
  bool abandoned_ = false;            // guarded by mutex_: its engine is gone
  bool observed_ = false;             // guarded by mutex_: the failure reached someone
  // Guarded by mutex_: the on_done() callbacks, run once (and emptied) by finish().
  std::vector<std::function<void()>> on_done_;
};

}  // namespace deepio::detail
