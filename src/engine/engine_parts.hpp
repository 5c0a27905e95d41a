// The engine's private types that more than one of its files uses: what opening a file
// yields (Opened, SharedFile) and a batch's slices held back for the workers (PendingSlices).
// Included only by src/engine/*.cpp; each type's users are named with it. (SharedFile is also
// what deepio::File and the binding's file objects hold, through engine.hpp's declaration.)
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device_route.hpp"
#include "core/fixed_files.hpp"
#include "core/worker.hpp"
#include "engine/engine.hpp"
#include "platform/fd.hpp"

namespace deepio::detail {

/// What direct I/O needs to know of an opened file (open.cpp makes it; engine.cpp plans
/// and queues with it).
struct Opened {
  bool direct = false;
  bool in_memory = false;  // tmpfs/ramfs: see Segment::in_memory
  std::uint64_t dev = 0;   // the device holding the file (st_dev): the workers' lane (SliceTask::device_key)
  std::size_t mem_align = 1;
  std::size_t offset_align = 1;
};

// Slices of one opener's run, held back so that many small operations reach a worker with
// one lock and one wake-up instead of one each. Flushed at growing counts (the first
// requests start at once) and always before the opener opens a file: an open may wait for
// this handle's operations to finish (descriptor back-pressure), and none of them may be
// sitting here then. (submit_batch.cpp fills and flushes it; Engine::queue adds to it.)
struct Engine::PendingSlices {
  explicit PendingSlices(std::size_t workers) : per_worker(workers) {}
  std::vector<std::vector<SliceTask>> per_worker;
  std::size_t count = 0;  // slices held
  std::size_t limit = 8;  // flush when count reaches it; doubles up to kMaxLimit
  static constexpr std::size_t kMaxLimit = 256;
  /// Room for one more slice in every list, so that queueing an op's slices cannot throw
  /// once the op is counted as submitted.
  void reserve_one_each() {
    for (auto& v : per_worker) {
      if (v.size() == v.capacity()) v.reserve(std::max<std::size_t>(16, 2 * v.capacity()));
    }
  }
};

/// A file opened once for many operations: consecutive requests of a batch on the same path
/// and direction (open.cpp opens it with open_shared; submit_batch.cpp shares it), or a file
/// object (deepio::File, the binding's: open_object). Every op on it holds it (OpState::
/// share_fds) until the op finishes, so the descriptors outlive whoever opened it while any
/// op still uses them; they close with the last holder. The descriptors and `opened` never
/// change after opening; `size` is atomic because a file object's ops are submitted from
/// many threads at once. A file object's registration with the engine's device route (its
/// cuFile handle) lives in `route_slot`: made on its first device operation, ended when the
/// SharedFile goes, before the descriptors close (route_slot is declared after them, so it
/// is destroyed first). So are a file object's registrations with the io_uring rings
/// (fixed_main, fixed_buffered).
struct SharedFile {
  UniqueFd main;      // O_DIRECT when opened.direct
  UniqueFd buffered;  // without O_DIRECT (reopened from `main`, never by path), when main has it
  Opened opened;
  /// The file's size as far as the engine knows it: what the open saw, raised by the writes
  /// dispatched on it since (a file object re-reads it with fstat before refusing a read past
  /// it: Engine::size_for). max() when the file has no size (a pipe, a device).
  std::atomic<std::uint64_t> size{0};
  /// File objects only: the path opened (what errors name), the access mode (O_RDONLY,
  /// O_WRONLY or O_RDWR; checked at submission) and the device (st_dev).
  bool object = false;
  std::string path;
  int access = 0;
  std::uint64_t dev = 0;
  /// File objects only: `main` and `buffered` as the io_uring workers' registered-file tables
  /// know them (core/fixed_files.hpp): installed by a worker on its first request of the
  /// descriptor, taken out of every table when the SharedFile goes, before the descriptors
  /// close (declared after them, so destroyed first).
  FixedFile fixed_main;
  FixedFile fixed_buffered;
  /// File objects only: the device route's state for this file (Engine::bind_route). Last
  /// member: destroyed first, while `main` and `buffered` are still open.
  RouteFileSlot route_slot;
};

/// Raises `size` to at least `end` (a write dispatched on a shared file). Thread-safe.
inline void raise_size(std::atomic<std::uint64_t>& size, std::uint64_t end) noexcept {
  std::uint64_t now = size.load(std::memory_order_relaxed);
  while (now < end && !size.compare_exchange_weak(now, end, std::memory_order_relaxed)) {
  }
}

}  // namespace deepio::detail
