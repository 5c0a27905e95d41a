// deepio::Handle: asynchronous reads and writes between files and host memory.
//
// A handle owns `intra_op_parallelism` worker threads, each with its own kernel queue
// (an io_uring ring, a libaio context, or nothing for the threads backend). A request is cut
// into one slice per worker at alignment boundaries; each worker cuts its slice into
// block_size requests and keeps at most queue_depth of them in flight, across all the
// requests queued to it. Any size, any file offset, any buffer address: the aligned middle
// goes through O_DIRECT (through an aligned bounce buffer when the caller's buffer is not
// aligned), the unaligned head and tail through buffered I/O, so the bytes on disk and in
// memory are exactly those plain pread/pwrite would give.
//
// Thread safety: every member function may be called from several threads at once.
// Buffer lifetime: the caller keeps `buffer` valid and untouched (readable for writes,
// unaliased for reads) until the operation is complete: its Future reports done, or a
// wait() that started after the submission returned, or the handle was destroyed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "deepio/error.hpp"
#include "deepio/options.hpp"

namespace deepio {

namespace detail {
class OpState;
class Engine;
}  // namespace detail

/// Completion of one asynchronous operation. Copyable; all copies share the state.
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::OpState> state) noexcept;

  /// False for a default-constructed Future.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// True once every byte of the operation moved or it failed. Never blocks.
  [[nodiscard]] bool done() const noexcept;
  /// Blocks until done(). Never throws.
  void wait() const noexcept;
  /// Blocks until done() or the timeout; returns done().
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds timeout) const noexcept;
  /// Blocks until done(); returns the number of bytes transferred or throws the operation's
  /// deepio::Error. An error retrieved here is not reported again by Handle::wait().
  std::size_t get();

 private:
  std::shared_ptr<detail::OpState> state_;
};

/// Counters of what a handle actually did; they make benchmarks and fallbacks visible.
struct HandleStats {
  std::uint64_t ops_completed = 0;
  std::uint64_t ops_failed = 0;
  std::uint64_t bytes_direct = 0;     ///< moved with O_DIRECT straight to/from the caller's buffer
  std::uint64_t bytes_bounced = 0;    ///< moved with O_DIRECT through an aligned bounce buffer
  std::uint64_t bytes_buffered = 0;   ///< moved through the page cache
  /// Of the bytes above, those moved through an io_uring registered ("fixed") buffer: memory
  /// from allocate_locked()/PinnedBuffer whose pages the kernel pinned once instead of on every
  /// request. io_uring only; a registration the kernel refuses (RLIMIT_MEMLOCK for an
  /// unprivileged user) just leaves these bytes on the ordinary path.
  std::uint64_t bytes_fixed = 0;
  std::uint64_t direct_refused = 0;   ///< files or requests that refused O_DIRECT and went buffered
  std::uint64_t short_transfers = 0;  ///< partial completions that were resubmitted
  std::uint64_t retries = 0;          ///< EINTR/EAGAIN completions that were resubmitted
};

class Handle {
 public:
  /// Starts the workers. Throws deepio::Error(EINVAL) for a zero block_size, queue_depth or
  /// intra_op_parallelism, and deepio::Error with the reason when the requested backend
  /// cannot be set up (Auto never fails for that reason: it falls back down to threads).
  explicit Handle(const HandleOptions& options = {});
  /// Finishes every operation still in flight (never abandons a write), then stops the
  /// workers. Errors of operations nobody waited for are dropped. Never throws.
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  /// Reads nbytes at file_offset of `path` into buffer. Returns at once.
  /// Throws deepio::Error at submission when the file cannot be opened (ENOENT, EACCES, ...)
  /// or file_offset + nbytes lies past its end (ENODATA); failures during the transfer are
  /// reported by the Future and by wait().
  Future async_pread(void* buffer, std::size_t nbytes, const std::string& path,
                     std::uint64_t file_offset = 0);
  /// Writes nbytes from buffer at file_offset of `path`, creating the file (mode 0666 & ~umask)
  /// if needed and never truncating it. Returns at once. Throws deepio::Error at submission
  /// when the file cannot be opened or created.
  Future async_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                      std::uint64_t file_offset = 0);
  /// As above on a descriptor the caller owns and keeps open until the operation completes;
  /// deepio never closes it. O_DIRECT is used only if the descriptor was opened with it.
  Future async_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset = 0);
  Future async_pwrite(const void* buffer, std::size_t nbytes, int fd,
                      std::uint64_t file_offset = 0);

  /// Submits, then wait()s for every pending operation of the handle (DeepNVMe semantics).
  /// Returns the number of operations completed (this one included). Throws as wait() does.
  std::size_t sync_pread(void* buffer, std::size_t nbytes, const std::string& path,
                         std::uint64_t file_offset = 0);
  std::size_t sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                          std::uint64_t file_offset = 0);

  /// Blocks until every operation submitted to this handle before the call has completed.
  /// Returns how many operations this call collected (0 when none was pending; when several
  /// threads wait at once each operation is counted by exactly one of them). If any of them
  /// failed, throws the first failure's deepio::Error after all of them have completed.
  std::size_t wait();

  /// Operations submitted and collected neither by wait() nor through their Future.
  [[nodiscard]] std::size_t pending() const noexcept;
  [[nodiscard]] const HandleOptions& options() const noexcept;
  /// The backend the workers really use (never Auto).
  [[nodiscard]] BackendKind backend() const noexcept;
  [[nodiscard]] HandleStats stats() const noexcept;

 private:
  std::unique_ptr<detail::Engine> engine_;
};

}  // namespace deepio
