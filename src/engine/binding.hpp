// The language binding's protocol with the engine: what python/src needs beyond the public
// deepio::Handle API, kept out of include/deepio (never installed, never exported: the Python
// extension and the tests link the engine's static layers, deepio_internal).
//
// A binding cannot keep its caller's buffer valid by promise, as a C++ user does: it hands the
// engine an owner of the buffer (BindingOp::keep_alive, e.g. the Python object exporting it),
// which the engine holds until the operation is collected and then gives back to the
// collecting caller, never to a worker thread, so that the binding drops it in its own
// context (with its interpreter lock held).
//
// Collection. Every operation is collected exactly once: by the wait()/collect() that covers
// it, or by Future::get(), whichever comes first. Only collection counts an operation,
// reports its failure to a waiter and releases its keep-alive, and it never happens before
// the operation is done. Handle::wait() and Future::get() release the keep-alives they
// collect on their own thread; collect() below hands them to its caller instead.
//
// Detached operations (BindingOp::detached) belong to their Future: Handle::wait(),
// Handle::pending() and collect() neither wait for them, count them nor report their
// failure, unless a collect() names one (BindingCollect::with); Future::get() collects it. If
// every copy of such a Future is destroyed and nobody called get(), its failure goes to the
// process's UnobservedFailureHandler (deepio/error.hpp), when the last copy goes or when the
// operation finishes, whichever is later, and the next collect() after it is done collects
// it silently (its keep-alive returned, not counted).
//
// Thread safety: as deepio::Handle's; every function may be called from several threads at
// once. Each throws what the Handle call it mirrors throws (and ForkedHandle in a forked child).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepio/handle.hpp"
#include "memory/pool.hpp"

namespace deepio::detail {

/// What a binding adds to one operation's OpOptions.
struct BindingOp {
  /// Opaque owner of whatever must outlive the transfer (the Python object exporting the
  /// buffer). The engine holds it until the operation is collected (never shorter than the
  /// transfer) and then gives it to the collecting caller: collect() returns it,
  /// Handle::wait() and Future::get() release it on their own thread. Never touched by a
  /// worker thread. On a throw at submission the engine keeps nothing: the submitting caller
  /// holds its own reference across the call, so the last one is never dropped there.
  std::shared_ptr<void> keep_alive;
  /// true: the operation belongs to its Future (see "Detached operations" above).
  bool detached = false;
};

/// Which operations collect() takes.
struct BindingCollect {
  /// Collect the operations submitted up to this mark (mark()); operations submitted later are
  /// left alone. Default (and any later mark): everything submitted before the call.
  std::uint64_t through = std::numeric_limits<std::uint64_t>::max();
  /// Also collect this detached operation, counted and reported in its submission order (a
  /// synchronous call's own operation). Must be an operation of this handle.
  const Future* with = nullptr;
  /// Also wait for every detached operation and take its keep-alive (a binding's shutdown).
  /// Their outcomes stay with their Futures: they are not counted or reported here.
  bool detached = false;
  /// Give up at this point (returning complete == false and collecting nothing) if some
  /// operation is still running. Unset: wait as long as it takes.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

/// What collect() took over: WaitResult's count and failures, and the keep-alives of the
/// collected operations (and of abandoned detached ones) for the caller to release in its own
/// context.
struct Collected : WaitResult {
  std::vector<std::shared_ptr<void>> keep_alive;
};

/// Handle::async_pread/async_pwrite with a BindingOp. Exactly one of `path` (non-null) and
/// `fd` (>= 0) names the file.
Future submit(Handle& h, bool write, void* buffer, std::size_t nbytes, const std::string* path, int fd,
              std::uint64_t file_offset, OpOptions op, BindingOp binding);
/// Handle::async_pread_ranges/async_pwrite_ranges with a BindingOp; `path`/`fd` as submit().
Future submit_ranges(Handle& h, bool write, void* buffer, std::size_t buffer_bytes, const std::string* path, int fd,
                     std::span<const IoRange> ranges, OpOptions op, BindingOp binding);
/// Handle::submit_batch with one BindingOp per request (`binding` empty: none at all).
/// Throws deepio::InvalidArgument, submitting nothing, when `binding` is neither empty nor as
/// long as `requests`.
std::vector<Future> submit_batch(Handle& h, std::vector<IoRequest> requests, std::vector<BindingOp> binding);

/// A file object for a binding's file (deepio.File), as Handle::open makes for deepio::File:
/// `path` opened once, the way the engine opens its own files (`flags` as open(2) takes them,
/// O_CLOEXEC added, O_DIRECT unless `direct_io` is Off or the file system refuses it: On makes
/// that an error, Auto counts it in HandleStats::direct_refused), its buffered twin reopened
/// from the same descriptor and its facts read once. Not tied to `h`: operations on it may go
/// through any handle of the process (a forked child's own default engine). The descriptors
/// close when the last holder lets go: the binding, or an operation still running on it.
/// Throws deepio::Error naming the path (and ForkedHandle in a forked child).
std::shared_ptr<SharedFile> open_file(Handle& h, const std::string& path, int flags, DirectIo direct_io);
/// The file object's main descriptor (with O_DIRECT when file_direct()); the object owns it.
[[nodiscard]] int file_fd(const SharedFile& file) noexcept;
[[nodiscard]] bool file_direct(const SharedFile& file) noexcept;
/// submit() / submit_ranges() on a file object (nothing opened or inspected per operation);
/// EBADF for a read of a file opened write-only or a write of one opened read-only.
Future submit_file(Handle& h, bool write, void* buffer, std::size_t nbytes, const std::shared_ptr<SharedFile>& file,
                   std::uint64_t file_offset, OpOptions op, BindingOp binding);
Future submit_file_ranges(Handle& h, bool write, void* buffer, std::size_t buffer_bytes,
                          const std::shared_ptr<SharedFile>& file, std::span<const IoRange> ranges, OpOptions op,
                          BindingOp binding);

/// A block of at least `nbytes` of the handle's staging memory (page-aligned, locked where
/// RLIMIT_MEMLOCK allows), for a binding's file window (deepio.Writer, deepio.Reader): the
/// pool the workers' bounce arenas come from. Destroying the lease gives it back for the next
/// borrower; the caller must first be sure no request still uses it. Throws deepio::Error
/// (ENOMEM).
StagingPool::Lease lend_staging(Handle& h, std::size_t nbytes);

/// Handle::collect with the binding's selection, handing the keep-alives to the caller.
/// Never throws except std::bad_alloc (and ForkedHandle).
Collected collect(Handle& h, const BindingCollect& options = {});

/// The current end of the submission order, for BindingCollect::through: a collect() with
/// this mark leaves alone every operation submitted after mark() returned.
[[nodiscard]] std::uint64_t mark(const Handle& h) noexcept;

/// For a detached operation whose owner gives up waiting for it (a synchronous call
/// interrupted by a signal): from now on it is an ordinary operation that the next
/// wait()/collect() collects, counts and reports. No effect once collected.
void give_to_wait(const Future& f) noexcept;

/// Calls fn once, when the operation of `f` is done: at once on this thread if it already
/// is, else on the engine thread that completes it (a worker or sync thread), after its
/// waiters were woken, with no lock of the engine held. fn must not throw and should be
/// short: it delays that thread's next request. Throws ForkedHandle in a forked child (fn is
/// not kept), InvalidArgument for an empty Future.
void on_done(const Future& f, std::function<void()> fn);

}  // namespace deepio::detail
