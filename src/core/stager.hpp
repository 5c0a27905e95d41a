// Copies between an operation's memory and the worker's host staging slots, for memory the
// kernel cannot read or write directly (GPU memory).
//
// Protocol (per worker, per device; used only by the worker thread that owns it):
//   register_staging() once for the worker's staging arena (e.g. cuMemHostRegister), then
//   writes: to_staging(slot, src)          completes before returning; the slot then goes to disk
//   reads:  from_staging(slot, dst) starts  after the slot's disk read completed;
//           done(slot) / wait(slot)         the slot is reused only after the copy is done,
//                                           and the operation completes only after all its copies.
// Errors are returned as Status (errno EIO with the driver's message).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "platform/status.hpp"

namespace deepio::detail {

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
};

/// Makes the stager for memory on `device` with `slots` staging slots; nullptr + *why when it
/// cannot (no driver).
using StagerFactory = std::function<std::unique_ptr<DeviceStager>(int device, std::size_t slots, Status* why)>;

}  // namespace deepio::detail
