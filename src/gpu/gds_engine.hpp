// The engine behind deepio::GdsHandle, constructible over any CudaApi/CuFileApi (the
// process-wide ones, or fakes loaded by tests).
#pragma once

#include <memory>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "platform/status.hpp"

namespace deepio::detail::gpu {

/// Builds an engine. cuda_api null -> throws deepio::Error(cuda_why.errnum or ENOTSUP) with
/// cuda_why's message. cufile_api may be null (cufile_why says why): Auto and Compat then
/// stage through host memory, CuFile throws ENOTSUP.
std::unique_ptr<GdsEngine> make_gds_engine(const GdsOptions& options, const CudaApi* cuda_api,
                                           const Status& cuda_why, CuFileApi* cufile_api,
                                           const Status& cufile_why);

/// A GdsHandle over make_gds_engine().
GdsHandle make_gds_handle(const GdsOptions& options, const CudaApi* cuda_api,
                          const Status& cuda_why, CuFileApi* cufile_api, const Status& cufile_why);

/// Whether the nvidia-fs kernel module is loaded (/proc/driver/nvidia-fs/version).
bool nvidia_fs_loaded() noexcept;

}  // namespace deepio::detail::gpu
