// deepio::Handle: asynchronous reads and writes between files and host or CUDA device memory
// (device memory by GPUDirect Storage or staged through host memory: HandleOptions::device_route).
//
// A handle owns `intra_op_parallelism` worker threads, each with its own kernel queue
// (an io_uring ring, a libaio context, or nothing for the threads backend). A request of at
// most two blocks (2 x block_size) goes whole to one worker (the next in turn); a larger one is
// cut into one slice per worker at alignment boundaries; each worker cuts its slice into
// block_size requests and keeps at most queue_depth of them in flight, across all the
// requests queued to it. Any size, any file offset, any buffer address: the aligned middle
// goes through O_DIRECT (through an aligned bounce buffer when the caller's buffer is not
// aligned), the unaligned head and tail through buffered I/O, so the bytes on disk and in
// memory are exactly those plain pread/pwrite would give.
//
// Thread safety: every member function may be called from several threads at once.
// Fork: a handle belongs to the process that made it. In a child made by fork() (which
// inherits no worker threads) every submission and wait throws deepio::ForkedHandle at once
// instead of hanging, and the destructor leaks the engine instead of joining threads that
// are not there.
// Buffer lifetime: the caller keeps `buffer` valid and untouched (readable for writes,
// unaliased for reads) until the operation is complete: its Future reports done, or a
// wait() that started after the submission returned, or the handle was destroyed.
//
// Collection. Every operation is collected exactly once: by the wait()/collect() that covers
// it, or by Future::get(), whichever comes first. Only collection counts an operation and
// reports its failure, and it never happens before the operation is done. A failure is never
// dropped silently: an operation whose Futures were all dropped is still collected, counted
// and reported by the next wait()/collect(), and one nobody collected before the handle was
// destroyed goes to the process's UnobservedFailureHandler (deepio/error.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepio/error.hpp"
#include "deepio/export.hpp"
#include "deepio/options.hpp"

namespace deepio {

class GdsHandle;
class File;

namespace detail {
class OpState;
class Engine;
struct SharedFile;
struct HandleAccess;  // the binding's way in (src/engine/binding.hpp); nothing a user calls
}  // namespace detail

/// Completion of one asynchronous operation. Copyable; all copies share the state. Dropping
/// every copy neither cancels nor detaches the operation: wait() still collects it.
class DEEPIO_API Future {
 public:
  /// An empty Future (valid() false); every Future a Handle returns is valid.
  Future() = default;
  Future(const Future& other) noexcept;
  Future(Future&& other) noexcept = default;
  Future& operator=(const Future& other) noexcept;
  Future& operator=(Future&& other) noexcept;
  ~Future();

  /// False for a default-constructed Future.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  // Fork: a Future belongs to the process whose handle made it. In a child made by fork()
  // (where the operation's workers are not) done(), wait(), wait_for() and get() throw
  // deepio::ForkedHandle at once, whatever the operation's state; copying and destroying the
  // Future there are safe and do nothing else.

  /// True once every byte of the operation moved or it failed. Never blocks; throws only
  /// deepio::ForkedHandle (in a forked child).
  [[nodiscard]] bool done() const;
  /// Blocks until done(). Throws only deepio::ForkedHandle (in a forked child).
  void wait() const;
  /// Blocks until done() or the timeout; returns done(). Throws only deepio::ForkedHandle.
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds timeout) const;
  /// Blocks until done(); returns the number of bytes transferred or throws the operation's
  /// deepio::Error (deepio::InvalidArgument for an empty Future, deepio::ForkedHandle in a
  /// forked child). The first get() collects the operation if no wait() did (it is then not
  /// counted or reported by wait()); later calls return or throw the same again.
  std::size_t get();

 private:
  friend class Handle;
  friend struct detail::HandleAccess;
  explicit Future(std::shared_ptr<detail::OpState> state) noexcept;
  std::shared_ptr<detail::OpState> state_;
};

/// Per-operation options of the async_* calls.
struct OpOptions {
  /// Writes only (a read with it is refused: deepio::InvalidArgument): the operation
  /// completes only once its data is on stable storage. After every block of the write
  /// completed, the engine calls fdatasync(2) on the file (the data, and the size and
  /// allocation needed to read it back; not timestamps), on its own sync threads so that
  /// many files' syncs run at once and the file system can commit them together; the
  /// caller's thread never blocks for it. A sync failure (EIO, ENOSPC, ...) fails the
  /// operation with that errno and the file's name; the write itself may then be partly on
  /// disk. Not done when the write itself failed. HandleStats::synced counts the syncs.
  bool fsync = false;
  /// Device (GPU) memory only; ignored for host memory. The CUDA stream whose work, queued
  /// before this call, produces a write's source or still uses a read's destination: a
  /// CUstream as an integer, 0 (or 1, CU_STREAM_LEGACY) for the legacy default stream, 2 for
  /// the per-thread default stream; it must belong to the device's primary context (as torch,
  /// CuPy and JAX streams do). At submission, on the calling thread, the engine records an
  /// event on that stream; its copies wait for the event on their own stream
  /// (cuStreamWaitEvent) before the device-to-host copies of a write and the host-to-device
  /// copies of a read. The caller never waits: work queued on the stream after the call may
  /// run concurrently with the transfer (do not touch the buffer there until it completes).
  /// A failure to record the event throws deepio::Error (EIO, the driver's error name) at
  /// submission. Unset: no ordering; the caller finishes the producer's work first.
  std::optional<std::uintptr_t> stream;
};

/// What collect() collected.
struct WaitResult {
  /// false: the deadline passed before every operation in the collection was done, and
  /// nothing was collected (call again).
  bool complete = true;
  /// Operations collected (each operation is counted by exactly one caller).
  std::size_t count = 0;
  /// Failures of the collected operations, in submission order. wait() throws the first.
  std::vector<Error> errors;
};

/// Options of Handle::collect().
struct CollectOptions {
  /// Give up at this point (returning complete == false and collecting nothing) if some
  /// operation is still running, so that a caller can wait in slices and do other work in
  /// between. Unset: wait as long as it takes.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

/// Counters of what a handle actually did; they make benchmarks and fallbacks visible.
struct HandleStats {
  std::uint64_t ops_completed = 0;
  std::uint64_t ops_failed = 0;
  std::uint64_t bytes_direct = 0;    ///< moved with O_DIRECT straight to/from the caller's buffer
  std::uint64_t bytes_bounced = 0;   ///< moved with O_DIRECT through an aligned bounce buffer
  std::uint64_t bytes_buffered = 0;  ///< moved through the page cache
  /// Of the bytes above, those moved through an io_uring registered ("fixed") buffer: memory
  /// from allocate_locked()/UniqueLockedBuffer whose pages the kernel pinned once instead of on
  /// every request. io_uring only; a registration the kernel refuses (RLIMIT_MEMLOCK for an
  /// unprivileged user) just leaves these bytes on the ordinary path.
  std::uint64_t bytes_fixed = 0;
  std::uint64_t direct_refused = 0;  ///< files or requests that refused O_DIRECT and went buffered
  /// Direct writes of more than one block that extended their file and whose range was
  /// allocated first (fallocate), so that their blocks ran in parallel as overwrites.
  std::uint64_t preallocated = 0;
  std::uint64_t short_transfers = 0;  ///< partial completions that were resubmitted
  std::uint64_t retries = 0;          ///< EINTR/EAGAIN completions that were resubmitted
  std::uint64_t synced = 0;           ///< writes with OpOptions::fsync whose fdatasync succeeded
  /// io_uring only: requests of File operations (Handle::open) that went through the file's
  /// slot in the worker's registered-file table (IOSQE_FIXED_FILE) instead of its descriptor,
  /// and those that took the descriptor because the table was full or the kernel refused the
  /// registration. Both stay 0 where the kernel has no sparse file tables (before Linux 5.19),
  /// and for path operations, which are never registered. Retried requests count again.
  std::uint64_t fixed_file_requests = 0;
  std::uint64_t fixed_file_fallbacks = 0;
  /// Operations on CUDA device memory (of ops_completed and ops_failed), by the route they
  /// took (HandleOptions::device_route): GPUDirect Storage (cuFile) or staged through host
  /// memory. An operation cuFile served counts as cuFile even where cuFile failed a request
  /// and the rest was staged (GdsHandle's io_fallbacks); its bytes are split as they moved.
  std::uint64_t device_ops_completed = 0;
  std::uint64_t device_ops_failed = 0;
  std::uint64_t device_ops_cufile = 0;    ///< operations served by cuFile
  std::uint64_t device_ops_staged = 0;    ///< operations staged through host memory
  std::uint64_t device_bytes_cufile = 0;  ///< moved by cuFileRead/cuFileWrite
  std::uint64_t device_bytes_staged = 0;  ///< moved between files and device memory through host staging
  /// The handle's staging memory (the workers' bounce arenas and the binding's Writer/Reader
  /// windows, lent from one pool): blocks mapped, borrows served by a block given back
  /// earlier, and the bytes lent out and kept for the next borrower now.
  std::uint64_t staging_allocations = 0;
  std::uint64_t staging_reuses = 0;
  std::uint64_t staging_lent_bytes = 0;
  std::uint64_t staging_kept_bytes = 0;
};

/// One read or write of a batch (Handle::submit_batch). Exactly one of `path` (non-empty) and
/// `fd` (>= 0) names the file. `op.fsync` makes a write durable before it completes.
struct IoRequest {
  bool write = false;
  void* buffer = nullptr;  ///< read into, or written from (never written through for a write)
  std::size_t nbytes = 0;
  std::string path{};
  int fd = -1;
  std::uint64_t file_offset = 0;
  OpOptions op{};
};

/// One piece of a ranged read or write (Handle::async_pread_ranges): `nbytes` bytes at
/// `file_offset` of the file, into or from `buffer_offset` of the operation's buffer.
struct IoRange {
  std::uint64_t file_offset = 0;
  std::size_t buffer_offset = 0;
  std::size_t nbytes = 0;
};

class DEEPIO_API Handle {
 public:
  /// Starts the workers. Throws deepio::InvalidArgument (EINVAL) for a block_size,
  /// queue_depth or intra_op_parallelism that is zero, above its bound (queue_depth 65536,
  /// intra_op_parallelism 1024) or above 2^63 (a negative number cast to size_t), and
  /// deepio::Error with the reason when the requested backend cannot be set up (Auto never
  /// fails for that reason: it falls back down to threads). options.device_route: Auto (the
  /// default) and Staged never fail, load nothing and open no driver here (Auto looks for
  /// CUDA and cuFile on the first operation on device memory); Gds throws deepio::Error
  /// ENOTSUP (ENODEV: CUDA without a usable device) naming what is missing when the CUDA
  /// driver or cuFile is missing or cuFile's driver cannot be opened (docs/gpu.md).
  explicit Handle(const HandleOptions& options = {});
  /// Finishes every operation still in flight (never abandons a write), then stops the
  /// workers. Failures of operations nobody collected go to the UnobservedFailureHandler
  /// (deepio/error.hpp), once no Future refers to them. Never throws. In a process forked
  /// after the handle was made, touches nothing and leaks the engine (its threads, rings and
  /// locks are the parent's).
  ~Handle();
  // Neither copyable nor movable. Deleted with a non-const reference on purpose: a deleted
  // `Handle(const Handle&)` would be a candidate for `Handle h({})` (an empty list makes a
  // Handle too) and make that ambiguous; `Handle&` cannot bind the temporary, so `{}` means
  // the options.
  Handle(Handle&) = delete;
  Handle& operator=(Handle&) = delete;

  /// Reads nbytes at file_offset of `path` into buffer. Returns at once.
  /// Throws deepio::Error at submission when the file cannot be opened (ENOENT, EACCES, ...)
  /// or file_offset + nbytes lies past its end (ENODATA), deepio::InvalidArgument for a
  /// file_offset above 2^63 - 1 (a negative offset cast) or a null buffer with nbytes > 0,
  /// EOVERFLOW when file_offset + nbytes overflows; failures during the transfer are
  /// reported by the Future and by wait().
  Future async_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset = 0,
                     OpOptions op = {});
  /// Writes nbytes from buffer at file_offset of `path`, creating the file (mode 0666 & ~umask)
  /// if needed and never truncating it. Returns at once. Throws deepio::Error at submission
  /// when the file cannot be opened or created, and as async_pread for bad arguments.
  Future async_pwrite(const void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset = 0,
                      OpOptions op = {});
  /// As above on a descriptor the caller owns and keeps open until the operation completes;
  /// deepio never closes it. O_DIRECT is used only if the descriptor was opened with it.
  Future async_pread(void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset = 0, OpOptions op = {});
  Future async_pwrite(const void* buffer, std::size_t nbytes, int fd, std::uint64_t file_offset = 0, OpOptions op = {});

  /// Opens `path` once for many operations (File): `flags` as open(2) takes them (O_RDONLY,
  /// O_WRONLY or O_RDWR, with O_CREAT, O_TRUNC, O_EXCL, ...; O_CLOEXEC is added; a created
  /// file gets mode 0666 & ~umask). O_DIRECT is added as for every file the handle opens
  /// (`direct_io`, unset: the handle's option; Auto falls back to the page cache where the
  /// file system refuses it, counted in HandleStats::direct_refused; On makes that an error).
  /// Throws deepio::Error naming the path (ENOENT, EACCES, EEXIST, ...). Thread-safe.
  File open(const std::string& path, int flags, std::optional<DirectIo> direct_io = std::nullopt);

  /// Submits many reads and writes in one call: their arguments are checked first (nothing is
  /// submitted if one is refused: deepio::InvalidArgument naming the request's index), then
  /// every request enters the submission order, in the order given, and the call returns.
  /// The files are opened, sized and planned off the calling thread (up to
  /// min(intra_op_parallelism, 8) opener threads), so the first requests' I/O runs while later
  /// files are still being opened. Unlike async_pread/async_pwrite, a failure to open a file
  /// or a read past its end is not thrown here: it is that request's failure, reported by its
  /// Future and by the wait()/collect() that collects it. Returns one Future per request.
  std::vector<Future> submit_batch(std::vector<IoRequest> requests);

  /// One operation over many ranges of one file: reads each range's bytes of the file into
  /// `buffer` (buffer_bytes long) at its buffer offset — a gather of rows, pages or records,
  /// at a fraction of the cost of one operation per range (one Future, one file open, one
  /// completion; the ranges' requests go to the workers as one slice each and fill their
  /// queues as a large request does). Ranges may come in any order and may have any size,
  /// offset and alignment (unaligned parts go through the page cache as for any request);
  /// empty ranges are skipped. Throws at submission, having queued nothing:
  /// deepio::InvalidArgument naming the range's index for a range outside the buffer, a file
  /// offset above 2^63 - 1 or a null buffer with bytes to move, and for two ranges whose
  /// buffer bytes overlap (they would be read into twice); EOVERFLOW for a range whose end
  /// overflows a file offset; as async_pread when the file cannot be opened, and ENODATA naming
  /// the range when one lies past the end of the file. The operation fails as a whole: its
  /// Future and wait() report the first failure (errno, the file, the failing request's
  /// offset), and the buffer's contents are then unspecified. Future::get() returns the sum of
  /// the ranges' sizes. Device (GPU) memory is staged through host memory, never GPUDirect
  /// Storage.
  Future async_pread_ranges(void* buffer, std::size_t buffer_bytes, const std::string& path,
                            std::span<const IoRange> ranges, OpOptions op = {});
  /// The write form: each range's bytes of `buffer` go to its place in the file (created if
  /// needed, never truncated). Refused as above, and for two ranges whose *file* bytes overlap
  /// (which would win would be unspecified); buffer bytes may be shared. With OpOptions::fsync
  /// the file is synced once, after every range is written. Ranges that tile one span of the
  /// file without a gap and extend it are allocated first (fallocate), as a large single
  /// write is; ranges with gaps are not (the holes stay holes).
  Future async_pwrite_ranges(const void* buffer, std::size_t buffer_bytes, const std::string& path,
                             std::span<const IoRange> ranges, OpOptions op = {});
  /// As above on a descriptor the caller owns and keeps open until the operation completes.
  Future async_pread_ranges(void* buffer, std::size_t buffer_bytes, int fd, std::span<const IoRange> ranges,
                            OpOptions op = {});
  Future async_pwrite_ranges(const void* buffer, std::size_t buffer_bytes, int fd, std::span<const IoRange> ranges,
                             OpOptions op = {});

  /// Submits, then waits for this operation alone and returns 1 (DeepNVMe's count when
  /// nothing else is pending). Throws this operation's failure only, as async_pread does at
  /// submission and Future::get() after. Operations submitted before it are neither waited
  /// for nor collected: they keep running, and their count and failures stay with their
  /// Futures and the next wait()/collect() (a wait() in another thread, likewise, never takes
  /// this call's operation). DeepNVMe's sync calls also waited for and counted every pending
  /// operation; call wait() first for that.
  std::size_t sync_pread(void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t file_offset = 0);
  /// fsync: as OpOptions::fsync (this write completes once its data is durable).
  std::size_t sync_pwrite(const void* buffer, std::size_t nbytes, const std::string& path,
                          std::uint64_t file_offset = 0, bool fsync = false);

  /// Blocks until every operation submitted to this handle before the call has completed.
  /// Returns how many operations this call collected (0 when none was pending; when several
  /// threads wait at once each operation is counted by exactly one of them). If any of them
  /// failed, throws the first failure (in submission order) after all of them have
  /// completed. collect() is the same without the throw.
  std::size_t wait();

  /// wait() without the throw: collects every operation submitted before the call once all
  /// of them are done, and returns the count and every failure, in submission order. With a
  /// deadline it returns complete == false, collecting nothing, if that passes first, so a
  /// caller can wait in slices and do other work (check for signals) in between; the
  /// operations then stay pending for a later call. Never throws except std::bad_alloc (and
  /// ForkedHandle, as every call in a forked child). Thread-safe; each operation is collected
  /// once.
  WaitResult collect(const CollectOptions& options = {});

  /// Operations submitted and not yet collected (by wait(), collect() or their Future).
  [[nodiscard]] std::size_t pending() const noexcept;
  [[nodiscard]] const HandleOptions& options() const noexcept;
  /// The backend the workers really use (never Auto).
  [[nodiscard]] BackendKind backend() const noexcept;
  [[nodiscard]] HandleStats stats() const noexcept;

 private:
  friend class GdsHandle;
  friend struct detail::HandleAccess;
  /// For GdsHandle, which adds a route to the engine: a handle over a prepared engine. The tag
  /// keeps it out of overload resolution for `Handle h({})` (one argument: the options), which
  /// happens before access is checked.
  struct PreparedEngine {};
  Handle(PreparedEngine, std::unique_ptr<detail::Engine> engine) noexcept;
  [[nodiscard]] detail::Engine& engine() const noexcept { return *engine_; }

  std::unique_ptr<detail::Engine> engine_;
};

/// A file opened once (Handle::open) for many operations, as kvikio's FileHandle: the path is
/// resolved, the file opened (with O_DIRECT where it can be, and its twin without O_DIRECT
/// reopened from that descriptor) and inspected (size, direct-I/O alignment, file system)
/// once; each operation then goes to the handle's workers without an open, a stat or a close.
/// Operations are the handle's like any other: Futures, wait(), collect() and the handle's
/// stats count them, and they take the same arguments, checks and errors as the Handle call
/// of the same name with the path (naming the path opened).
///
/// The file, not the path: an operation reads and writes the file that was opened, even if
/// the path has since been renamed over or unlinked. Size: a read past the end is refused at
/// submission (ENODATA) against the size the open saw, raised by the writes submitted
/// through this File and re-read (fstat) before refusing; a file another process shortened
/// fails such a read when it runs instead (ENODATA, "unexpected end of file").
///
/// Lifetime: the Handle must outlive every call on the File. Closing or destroying the File
/// never waits and never cuts an operation short: its descriptors stay open until the last
/// operation submitted through it finishes, then close. io_uring: each worker registers the
/// descriptors in its ring's file table on the first request of this File it runs, and uses
/// the registration for every later one (HandleStats::fixed_file_requests; a full table: the
/// plain descriptor, fixed_file_fallbacks); when the descriptors close, every ring's
/// registration has ended first, so an unlinked file is freed then as without registration.
/// Device memory through GPUDirect Storage (the handle's device route): the descriptor is
/// registered with cuFile once, by the first such operation, and deregistered just before the
/// descriptors close. Movable, not copyable.
/// Thread safety: every member function except close(), the move assignment and the
/// destructor may be called from several threads at once.
class DEEPIO_API File {
 public:
  /// A File that is not open (is_open() false); every other call on it throws
  /// deepio::InvalidArgument.
  File() noexcept;
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  [[nodiscard]] bool is_open() const noexcept { return file_ != nullptr; }
  /// The path it was opened with (empty when not open).
  [[nodiscard]] const std::string& path() const noexcept;
  /// Its descriptor (with O_DIRECT when direct()), for calls of the caller's own (fstat,
  /// fsync); deepio closes it. -1 when not open.
  [[nodiscard]] int fd() const noexcept;
  /// Whether it was opened with O_DIRECT.
  [[nodiscard]] bool direct() const noexcept;

  /// As Handle::async_pread / async_pwrite on the path, without opening it; EBADF for a read
  /// of a file opened O_WRONLY or a write of one opened O_RDONLY.
  Future pread(void* buffer, std::size_t nbytes, std::uint64_t file_offset = 0, OpOptions op = {});
  Future pwrite(const void* buffer, std::size_t nbytes, std::uint64_t file_offset = 0, OpOptions op = {});
  /// As Handle::async_pread_ranges / async_pwrite_ranges on the path, without opening it.
  Future pread_ranges(void* buffer, std::size_t buffer_bytes, std::span<const IoRange> ranges, OpOptions op = {});
  Future pwrite_ranges(const void* buffer, std::size_t buffer_bytes, std::span<const IoRange> ranges,
                       OpOptions op = {});

  /// The file's size now (fstat). Throws deepio::Error.
  [[nodiscard]] std::uint64_t size() const;
  /// Gives up this File's hold on the descriptors (see Lifetime); is_open() is false after.
  /// Never throws, never waits.
  void close() noexcept;

 private:
  friend class Handle;
  File(detail::Engine* engine, std::shared_ptr<detail::SharedFile> file) noexcept;
  /// Throws deepio::InvalidArgument when not open.
  void check_open() const;

  detail::Engine* engine_ = nullptr;
  std::shared_ptr<detail::SharedFile> file_;
};

/// How many handles (Handle, GdsHandle) exist in this process right now, counting those a
/// forked child inherited (they are never destroyed there). Diagnostics: the Python package
/// keeps one default engine per process, and its tests count. Thread-safe, lock-free.
[[nodiscard]] DEEPIO_API std::size_t live_handles() noexcept;

}  // namespace deepio
