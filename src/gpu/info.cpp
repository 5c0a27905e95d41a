#include <cerrno>
#include <new>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"

namespace deepio {

int device_of(const void* p) noexcept {
  const detail::gpu::DevicePointer d = detail::gpu::classify(p);
  return d.is_device ? d.ordinal : -1;
}

bool is_managed(const void* p) noexcept { return detail::gpu::is_managed(detail::gpu::cuda(nullptr), p); }

GpuInfo gpu_info() noexcept {
  GpuInfo info;
  try {
    detail::Status why;
    const auto* cuda_api = detail::gpu::cuda(&why);
    if (cuda_api != nullptr) {
      info.cuda_found = true;
      info.cuda_library = cuda_api->library;
      info.driver_version = cuda_api->driver_version;
      info.device_count = cuda_api->device_count;
    } else {
      info.cuda_reason = why.message;
    }
    detail::Status cufile_why;
    auto* cufile_api = detail::gpu::cufile_mutable(&cufile_why);
    if (cufile_api != nullptr) {
      info.cufile_found = true;
      info.cufile_library = cufile_api->library;
    } else {
      info.cufile_reason = cufile_why.message;
    }
    info.nvidia_fs_loaded = detail::gpu::nvidia_fs_loaded();

    if (!info.cuda_found) {
      info.gds_mode = "unavailable";
      info.gds_reason = info.cuda_reason;
      return info;
    }
    if (!info.cufile_found) {
      info.gds_mode = "compat";
      info.gds_reason = info.cufile_reason + "; device I/O is staged through host memory";
      return info;
    }
    bool direct = info.nvidia_fs_loaded;
    bool driver_open = false;
    {
      std::lock_guard lock(cufile_api->driver_mutex);
      driver_open = cufile_api->driver_refs > 0;
      if (driver_open && cufile_api->cuFileDriverGetProperties != nullptr) {
        detail::gpu::CUfileDrvProps_t props{};
        if (cufile_api->cuFileDriverGetProperties(&props).err == detail::gpu::CU_FILE_SUCCESS) {
          direct = direct || props.nvfs.major_version > 0 ||
                   (props.nvfs.dstatusflags & (1u << detail::gpu::CU_FILE_NVME_P2P_SUPPORTED_BIT)) != 0;
        }
      }
    }
    info.gds_usable = direct;
    info.gds_mode = direct ? "gds" : "compat";
    if (!direct) {
      info.gds_reason = driver_open ? "nvidia-fs not loaded and no P2PDMA support reported: cuFile "
                                      "runs in its compatibility mode"
                                    : "nvidia-fs not loaded: cuFile would run in its "
                                      "compatibility mode (P2PDMA is detected only while a "
                                      "GdsHandle holds the cuFile driver open)";
    }
  } catch (...) {
    // Only allocation can throw above; report what was gathered.
  }
  return info;
}

}  // namespace deepio
