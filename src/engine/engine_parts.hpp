// The engine's private types that more than one of its files uses: what opening a file
// yields (Opened, SharedFile) and a batch's slices held back for the workers (PendingSlices).
// Included only by src/engine/*.cpp; each type's users are named with it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/worker.hpp"
#include "engine/engine.hpp"
#include "platform/fd.hpp"

namespace deepio::detail {

/// What direct I/O needs to know of an opened file (open.cpp makes it; engine.cpp plans
/// and queues with it).
struct Engine::Opened {
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

/// A file opened once for consecutive requests of a batch on the same path and direction
/// (open.cpp opens it; submit_batch.cpp shares it).
struct Engine::SharedFile {
  UniqueFd main;      // O_DIRECT when opened.direct
  UniqueFd buffered;  // without O_DIRECT, when main has it
  Opened opened;
  std::uint64_t size = 0;  // as the requests dispatched so far leave it
};

}  // namespace deepio::detail
