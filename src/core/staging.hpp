// Staging: one worker's bounce slots and the stagers that copy between them and device memory.
//
// The bounce slots are one page-aligned host arena of `slots` x `slot_bytes`, borrowed from
// the engine's StagingPool on first use (ensure(); memory/pool.hpp) and cut into numbered slots taken and given back by
// the worker: for requests whose memory the kernel may not use directly (SegmentMode::Bounce) and for every request of
// an op on device memory. For each device, a DeviceStager (core/stager.hpp) is made on first use with the whole arena
// registered to it; after a read its host-to-device copy may still run, so the slot is "draining" (drain()) until the
// copy is done, and only then given back and its op told.
//
// Errors: ensure() says false when the arena cannot be allocated; stager() returns the
// factory's or registration's Status; drain() hands each copy's Status to the worker.
// Teardown: the stagers go before the arena (they unregister it; the arena then goes back to
// the pool), and abandon() leaks the arena on purpose where a dead kernel queue may still
// write into it. The worker's backend is
// destroyed before its Staging (worker.cpp), so no kernel request outlives the arena.
// Thread safety: none; used only by the worker thread that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/stager.hpp"
#include "memory/pool.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

class Staging {
 public:
  /// `slots` bounce slots of `slot_bytes` each, borrowed from `pool` (nothing yet; null: a
  /// pool of this Staging's own); `factory` makes the stager of a device (empty: device
  /// memory cannot be staged).
  Staging(std::size_t slot_bytes, std::size_t slots, StagerFactory factory, std::shared_ptr<StagingPool> pool)
      : slot_bytes_(slot_bytes),
        slots_(slots),
        factory_(std::move(factory)),
        pool_(pool ? std::move(pool) : std::make_shared<StagingPool>(0)) {}

  /// Allocates the arena on first use and makes every slot free. False when it cannot be
  /// allocated (nothing changes then).
  bool ensure();
  /// The stager for `device`, made on first use with the arena registered to it (call after
  /// ensure()). nullptr and *why when there is no factory or it or the registration fails.
  DeviceStager* stager(int device, Status* why);

  [[nodiscard]] bool has_free() const noexcept { return !free_.empty(); }
  /// How many slots are free now (none before ensure()).
  [[nodiscard]] std::size_t free_count() const noexcept { return free_.size(); }
  /// How many slots there are in all (free or not; the arena may not exist yet).
  [[nodiscard]] std::size_t slot_count() const noexcept { return slots_; }
  /// A free slot's index (has_free() must hold).
  int take() noexcept;
  /// Gives slot `slot` back (taken before).
  void give_back(int slot) { free_.push_back(slot); }
  /// The host memory of slot `slot`.
  [[nodiscard]] std::byte* at(int slot) const noexcept {
    return arena_.data() + static_cast<std::size_t>(slot) * slot_bytes_;
  }

  /// Starts the host-to-device copy of a finished read: n bytes of bounce slot `slot` to
  /// `dst` on `device` (its stager exists). The worker's slot `id` drains until the copy is
  /// done. Returns the stager's error (then nothing drains).
  Status start_copy_back(std::uint32_t id, int device, int slot, std::byte* dst, std::size_t n);
  [[nodiscard]] bool draining() const noexcept { return !draining_.empty(); }
  /// Ends the copies that are done, oldest first (they finish in order on one stream), calling
  /// `done(id, status)` for each; with `block`, waits for every one.
  void drain(bool block, const std::function<void(std::uint32_t id, Status status)>& done);

  /// The kernel may still write into the arena (a dead queue): leaked on purpose, never
  /// reused, rather than freed under a DMA. No slot is free afterwards; slots given back later
  /// are never taken again (a dead queue cuts no more requests).
  void abandon();

 private:
  struct Draining {
    std::uint32_t id;  // the worker's slot
    int device;
    int slot;  // bounce slot
  };
  std::size_t slot_bytes_, slots_;
  StagerFactory factory_;
  std::shared_ptr<StagingPool> pool_;
  // The arena before the stagers: they are destroyed first, unregistering it.
  StagingPool::Lease arena_;
  std::vector<int> free_;
  std::map<int, std::unique_ptr<DeviceStager>> stagers_;  // by device ordinal
  std::deque<Draining> draining_;                         // copies back to device that may still run
};

}  // namespace deepio::detail
