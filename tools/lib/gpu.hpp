// GPU pieces of `deepio bench`: what --gpu/--use_gds need to run, device memory, copies between
// host and device, and the host-to-device / device-to-host copy ceilings.
//
// CUDA is reached through deepio's run-time loaded driver shim (src/gpu/cuda.hpp, internal
// CMake target deepio_gpu): the command never links CUDA, and without a usable driver these
// functions report the loader's reason instead of failing to start. Device memory is what
// cuMemAlloc returns on the chosen device; it is handed to deepio::Handle (staged through
// page-locked slots) and deepio::GdsHandle (cuFile, or staging where cuFile refuses) as a plain
// address, exactly as a framework's CUDA tensor would be.
//
// Contexts: the driver's calls need a current context on the calling thread (the real driver
// answers CUDA_ERROR_INVALID_CONTEXT otherwise, and so does the fake of tests/gpu). CudaDevice
// retains the device's primary context and makes it current on the thread that constructs it;
// DeviceBuffer and the copies must be used from that thread. deepio's own workers set their
// contexts themselves.
//
// Fork: the CUDA driver does not survive fork(). ds_io mode forks its worker processes, so the
// parent must not initialise CUDA first: probe_gpu(isolated = true) asks in a child process.
//
// Errors: every failing CUDA call throws deepio::Error (ENOMEM for out-of-memory, EIO otherwise)
// whose message names the call and the CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "measure.hpp"

namespace deepio::cli {

/// What the GPU layer offers this process (a copy of deepio::gpu_info()'s answer).
struct GpuProbe {
  bool cuda = false;
  std::string cuda_reason;  ///< why not, naming the library tried
  int device_count = 0;
  int driver_version = 0;
  bool cufile = false;
  std::string cufile_reason;
  std::string gds_mode = "unavailable";  ///< "gds", "compat", "unavailable"
  std::string gds_reason;
};

/// deepio::gpu_info(), asked in this process, or, with `isolated`, in a child process that
/// exits afterwards, so that this process has not initialised CUDA when it forks later. A
/// child that cannot be started or dies answers cuda = false with the reason.
[[nodiscard]] GpuProbe probe_gpu(bool isolated);

/// The command-line problems of --gpu (and --use_gds / --gds when `gds`), one line each, empty
/// when the run can go ahead: "<gpu_flag>: no usable CUDA driver: <reason>", and ds_io's rule
/// that every device id of the process-to-folder mapping exists ("<devices_flag>: device D
/// does not exist (N CUDA device(s))"). Without cuFile, --use_gds still runs: GdsHandle stages
/// then, and says so in its mode. Pure.
[[nodiscard]] std::vector<std::string> gpu_problems(const GpuProbe& g, const char* gpu_flag,
                                                    const std::vector<int>& devices, const char* devices_flag);

/// Holds device `ordinal`'s primary context (retained) current on the constructing thread;
/// restores the previous current context and releases the retain on destruction. Throws
/// deepio::Error (ENOTSUP/ENODEV: no usable driver, with the loader's reason; EIO/ENODEV for a
/// bad ordinal).
class CudaDevice {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;
  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }

 private:
  int ordinal_;
  void* previous_ = nullptr;  // CUcontext current before
};

/// nbytes of device memory (cuMemAlloc) on the device current on this thread; freed on
/// destruction. Move-only.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t nbytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// The device address, as a pointer (what a CUDA tensor's data_ptr() is).
  [[nodiscard]] void* data() const noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return nbytes_; }
  /// Synchronous copies of the first n bytes (n <= size()). Throw deepio::Error.
  void upload(const void* src, std::size_t n);
  void download(void* dst, std::size_t n) const;

 private:
  unsigned long long ptr_ = 0;  // CUdeviceptr
  std::size_t nbytes_ = 0;
};

/// Registers host memory with CUDA (cuMemHostRegister, portable) so copies from and to it are
/// DMA, as CUDA-pinned memory is; unregisters on destruction. Throws deepio::Error when the
/// driver refuses (e.g. RLIMIT_MEMLOCK).
class HostRegistration {
 public:
  HostRegistration(void* p, std::size_t nbytes);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  void* p_;
};

/// One timed copy of n bytes host -> device (to_device) or device -> host, ended by a
/// synchronisation of the default stream: the copy ceiling a staged or GDS transfer cannot
/// beat. `host` should be CUDA-registered (HostRegistration), else it measures pageable copies.
Sample timed_copy(bool to_device, DeviceBuffer& dev, void* host, std::size_t n);

}  // namespace deepio::cli
