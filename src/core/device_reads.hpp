// Read activity per device, shared by every worker of the process (core/lanes.hpp's classes).
//
// A worker holds its writes to a device down to the write floor while reads of that device
// are active, so that a read waits in the device behind a few writes, not behind the whole
// queue. The device's queue is one for every worker and every handle of the process: a read
// issued by one worker also waits behind the writes another worker keeps there. So the
// activity that holds writes back is the device's, not the lane's: each worker counts its
// read slices of the device here while they are queued or in flight, and stamps when a read
// request of it last ended; every worker's lane of that device sees both.
//
// The table is fixed (DeviceReadsTable::kMaxDevices entries, never freed: a process touches
// few devices); a device that finds it full has no entry (nullptr), and its lanes see only
// their own reads.
// Thread-safe, lock-free: relaxed atomics (a hint for the issue policy, not a synchronisation).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace deepio::detail {

struct DeviceReads {
  std::atomic<std::uint64_t> key{0};      ///< device key + 1 (0: a free entry)
  std::atomic<std::int64_t> active{0};    ///< read slices of the device queued or in flight, all workers
  std::atomic<std::int64_t> last_end{0};  ///< steady_clock nanoseconds when a read request last ended

  /// Reads active on the device: some queued or in flight, or one ended less than `linger` ago.
  [[nodiscard]] bool recent(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds linger) const noexcept {
    if (active.load(std::memory_order_relaxed) > 0) return true;
    const std::int64_t end = last_end.load(std::memory_order_relaxed);
    return end != 0 && now.time_since_epoch().count() - end < linger.count();
  }
  void ended(std::chrono::steady_clock::time_point now) noexcept {
    last_end.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
};

/// A fixed table of DeviceReads by device key (insert-only, lock-free).
class DeviceReadsTable {
 public:
  static constexpr std::size_t kMaxDevices = 256;
  /// The device's entry (made on first use), or nullptr when the table is full.
  [[nodiscard]] DeviceReads* find(std::uint64_t device_key) noexcept;

 private:
  std::array<DeviceReads, kMaxDevices> entries_;
};

/// The process's table's entry of the device (what every worker uses).
[[nodiscard]] DeviceReads* device_reads(std::uint64_t device_key) noexcept;

}  // namespace deepio::detail
