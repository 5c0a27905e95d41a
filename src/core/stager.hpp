// Copies between an operation's memory and the worker's host staging slots, for memory the
// kernel cannot read or write directly (GPU memory).
//
// Protocol (per worker, per device; used only by the worker thread that owns it):
//   register_staging() once for the worker's staging arena (e.g. cuMemHostRegister), then
//   writes: to_staging(slot, src)          completes before returning; the slot then goes to disk
//   reads:  from_staging(slot, dst) starts  after the slot's disk read completed;
//           done(slot) / wait(slot)         the slot is reused only after the copy is done,
//                                           and the operation completes only after all its copies.
// Ordering against the producer (issue 26): an op on device memory may carry a DeviceFence,
// recorded at submission on the caller's stream (OpOptions::stream). Before the first copy of
// an op's slice, the worker calls order_after(fence): every copy the stager starts later
// (device-to-host for writes, host-to-device for reads) runs after the work that stream had
// queued at submission. The caller's thread never waits for it.
// Errors are returned as Status (errno EIO with the driver's message).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "platform/status.hpp"

namespace deepio::detail {

/// The point of a producer's stream an op must come after (a CUDA event recorded on it at
/// submission). Shared by the op's slices; destroyed with the op. Thread-safe.
class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
  /// The driver's handle of the point (a CUevent), for stagers that order their stream on it.
  [[nodiscard]] virtual void* handle() const noexcept = 0;
  /// Blocks the calling thread until the work before the point has finished (for transfers
  /// no stream orders: cuFile, host imitations). Returns the driver's error, if any.
  virtual Status wait() const = 0;
  /// Whether the work before the point has finished, without blocking: false while it runs;
  /// true when it has (*error then holds the driver's error, if any). The default waits
  /// (imitations whose wait() does not block long); a driver's fence answers at once.
  virtual bool poll(Status* error) const {
    *error = wait();
    return true;
  }
};

class DeviceStager {
 public:
  virtual ~DeviceStager() = default;
  virtual Status register_staging(void* base, std::size_t nbytes) = 0;
  virtual Status to_staging(int slot, void* staging, const std::byte* device_src, std::size_t n) = 0;
  virtual Status from_staging(int slot, std::byte* device_dst, const void* staging, std::size_t n) = 0;
  /// True when the slot's copy has finished (or none was started). Never blocks.
  virtual bool done(int slot) = 0;
  /// Blocks until the slot's copy has finished; returns its error, if any.
  virtual Status wait(int slot) = 0;
  /// Every copy started after this call runs after the fence's work (see the file comment).
  /// A stager with a stream makes its stream wait (cuStreamWaitEvent) and returns at once;
  /// the default blocks the calling worker thread in fence.wait().
  virtual Status order_after(const DeviceFence& fence) { return fence.wait(); }
};

/// Records a fence on `stream` (a CUstream as an integer: 0 or 1 the legacy default stream,
/// 2 the per-thread default stream) of device `device`, on the calling thread. nullptr and
/// *why when the driver refuses.
using FenceFactory = std::function<std::shared_ptr<DeviceFence>(int device, std::uintptr_t stream, Status* why)>;

/// Makes the stager for memory on `device` with `slots` staging slots; nullptr + *why when it
/// cannot (no driver).
using StagerFactory = std::function<std::unique_ptr<DeviceStager>(int device, std::size_t slots, Status* why)>;

}  // namespace deepio::detail
