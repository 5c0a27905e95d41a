// The interface every I/O backend implements: submit requests, reap completions.
//
// One Backend instance belongs to one worker thread and is only ever used by it, so
// implementations need no locking -- except wake(), which any thread may call while the
// worker waits in reap(). Results follow the kernel's convention: a completion's
// res is the byte count moved, or a negative errno. Backends do not retry, loop on short
// transfers or interpret results: the worker does that, identically for all of them.
// Teardown: shutdown() ends the kernel queue, waiting for (or cancelling) what the kernel
// still holds, before the worker fails those requests or frees the memory they point into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/fixed_files.hpp"
#include "memory/regions.hpp"

namespace deepio::detail {

/// A file as registered with a driver that moves device memory itself (GPUDirect Storage):
/// made at submission by a DeviceRoute (core/device_route.hpp), carried by every request of
/// the operation, read only by that route's backend. Opaque to the worker.
struct DriverFile {
  virtual ~DriverFile() = default;
};

struct Request {
  int fd = -1;
  void* buf = nullptr;
  std::uint32_t len = 0;
  std::uint64_t offset = 0;
  bool write = false;
  /// fd is (or may be) the O_DIRECT descriptor: a synchronous call on it waits for the device.
  /// False: the page cache's descriptor, whose requests may be answered from memory at once.
  bool direct = false;
  std::uint64_t tag = 0;  ///< returned unchanged in the completion; below 2^61
  /// The locked allocation holding buf (memory/regions.hpp), if any: a backend may register
  /// it with the kernel once and skip pinning the pages on every request. Ignored otherwise.
  LockedRegion region;
  /// Set for an operation served by a DeviceRoute's backend: buf is device memory and fd is
  /// only informative (the backend uses the registration). Null otherwise.
  const DriverFile* driver_file = nullptr;
  /// Set when fd is a file object's descriptor (core/fixed_files.hpp): a backend with a table
  /// of registered files may install it there once and use the slot instead of fd. Its fd()
  /// is fd; the backend records its installation there. Null for path and descriptor operations.
  FixedFile* fixed_file = nullptr;
};

struct Completion {
  std::uint64_t tag = 0;
  std::int64_t res = 0;
  bool fixed = false;       ///< the request went through a buffer registered with the kernel
  bool fixed_file = false;  ///< the request went through its file's slot in a registered-file table
  /// The request had a fixed_file but took the plain descriptor: the table was full or the
  /// kernel refused the registration (not set where the backend keeps no table at all).
  bool file_fallback = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual const char* name() const noexcept = 0;
  /// Queues the requests with one system call where the backend can (single_submit callers
  /// pass one at a time). Returns how many were accepted (a prefix of reqs), or a negative
  /// errno when none could be. Accepted requests each produce exactly one completion.
  virtual int submit(std::span<const Request> reqs) = 0;
  /// Waits until at least `min` completions are available (min may be 0, and is never more
  /// than the number in flight), then stores up to out.size() of them. Returns the count
  /// stored or a negative errno (EINTR is handled inside). With `max_wait_us` >= 0 the wait
  /// ends after that long even if fewer than `min` are there: what is there is stored (maybe
  /// none), and that is no error. A wake() ends a wait for min <= 1 early too, also one
  /// that came before the wait started (the wait then returns at once): none may be stored
  /// then, and that is no error either (a wait for more may count the wake-up as one of
  /// `min`; the worker relies on it only with min 1).
  virtual int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us = -1) = 0;
  /// Makes a reap() that is waiting, or the next one, return at once (the worker has new
  /// work). Thread-safe, cheap (at most one system call), never fails, and may be called at
  /// any time between the backend's creation and shutdown(). A wake-up that finds nothing to
  /// end may end the next wait early: harmless. Backends whose reap() never waits (requests
  /// complete inside submit()) need nothing.
  virtual void wake() noexcept {}
  /// Makes the kernel start every accepted request now, for a backend that would otherwise
  /// hold them until the next reap() (io_uring batches submission into its wait). The worker
  /// calls it before spending time on other things, so the device is never left idle.
  virtual void flush() {}
  /// Ends the kernel queue for good, before the worker lets go of any request's memory (a
  /// queue that failed, or the worker's end): returns once no accepted request can still
  /// read or write its buffer -- each one has completed (its completion is discarded) or was
  /// cancelled -- and true; false when that cannot be known (the queue is broken and the
  /// kernel may still finish requests). Idempotent; nothing else is called afterwards. The
  /// destructor calls it. Backends that complete requests inside submit() have nothing to do.
  virtual bool shutdown() noexcept { return true; }
  /// The backend's own words for the failed completion with this tag (e.g. the cuFile error
  /// name behind an errno), taken once; empty when it has none. Called by the worker right
  /// after reaping a negative result.
  virtual std::string take_error_text(std::uint64_t /*tag*/) { return {}; }
};

}  // namespace deepio::detail
