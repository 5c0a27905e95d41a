// How the engine recognises device (GPU) memory and makes stagers for it.
//
// The default comes from the GPU layer (run-time loaded CUDA driver) when it is built and a
// driver is present; otherwise no pointer is device memory. Tests replace it with a host
// imitation to exercise the staging pipeline without a GPU.
#pragma once

#include <functional>

#include "core/stager.hpp"

namespace deepio::detail {

struct DeviceSupport {
  /// The device ordinal that owns `p`, or -1 for host memory. Must be cheap and thread-safe.
  /// Not asked about memory of allocate_locked() (host memory; the engine's registry says so).
  std::function<int(const void* p)> classify;
  StagerFactory make_stager;
  /// For ops with OpOptions::stream on device memory; empty: the stream is not used (no
  /// driver that can order copies, e.g. a test's host imitation).
  FenceFactory make_fence;
};

/// The support handles use; read once per handle at construction.
DeviceSupport device_support();
/// Test hook: replaces the process-wide support (an empty classify restores the default).
void set_device_support(DeviceSupport support);

}  // namespace deepio::detail
