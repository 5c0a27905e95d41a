// The DeviceSupport backed by the run-time loaded CUDA driver (src/gpu/cuda.hpp).
#pragma once

#include "engine/device.hpp"

namespace deepio::detail {

/// classify: device memory according to cuPointerGetAttribute, asked only once the process
/// has loaded the driver itself (so CPU-only programs never pay for cuInit). make_stager:
/// a CudaStager. Both safe to call from any thread.
DeviceSupport cuda_device_support();

namespace gpu {
struct CudaApi;
}
/// The same over a given driver (a GdsHandle's, possibly a test's fake): classify asks it
/// directly, with no check that the process loaded it.
DeviceSupport cuda_device_support(const gpu::CudaApi* api);

}  // namespace deepio::detail
