// GPU support: what CUDA and cuFile this process can use, and deepio::GdsHandle, DeepNVMe's
// gds_handle done right.
//
// CUDA (libcuda.so.1) and cuFile (libcufile.so.0) are loaded at run time; deepio is built
// without them and runs where they are absent: gpu_info() then says what is missing and why,
// and constructing a GdsHandle throws deepio::Error. Device memory is a plain address
// (CUdeviceptr or void*) of CUDA device memory; deepio never links a framework.
//
// Environment (read once, the first time CUDA or cuFile is needed; see docs/gpu.md):
//   DEEPIO_CUDA_LIBRARY    library to load instead of libcuda.so.1 ("none": act as if absent)
//   DEEPIO_CUFILE_LIBRARY  library to load instead of libcufile.so.0 ("none": act as if absent)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "deepio/error.hpp"

namespace deepio {

/// What the GPU layer found. Every *_reason is empty when the thing is usable.
struct GpuInfo {
  bool cuda_found = false;    ///< driver loaded, cuInit succeeded, at least one device
  std::string cuda_reason;    ///< why not (names the library tried)
  std::string cuda_library;   ///< the library loaded
  int driver_version = 0;     ///< cuDriverGetVersion (e.g. 12040); 0 when not found
  int device_count = 0;
  bool cufile_found = false;  ///< libcufile loaded with every entry point deepio needs
  std::string cufile_reason;
  std::string cufile_library;
  bool nvidia_fs_loaded = false;  ///< /proc/driver/nvidia-fs present (GDS kernel module)
  /// true iff gds_mode == "gds": cuFile can move data between storage and GPU memory directly.
  bool gds_usable = false;
  /// "gds": GPUDirect Storage proper. "compat": device I/O works, staged through host memory
  /// (cuFile's compatibility mode, or deepio's own staging when cuFile is missing).
  /// "unavailable": no usable CUDA driver.
  std::string gds_mode = "unavailable";
  std::string gds_reason;  ///< why not "gds"
};

/// Loads (once) and inspects CUDA and cuFile. Never throws, prints or exits; thread-safe.
/// It does not open the cuFile driver: on a machine where GPUDirect Storage runs through
/// PCIe P2PDMA without nvidia-fs (CUDA >= 12.8), "gds" is reported only while a GdsHandle
/// holds the driver open. A GdsHandle's mode() is the authority for its files.
[[nodiscard]] GpuInfo gpu_info() noexcept;

/// The CUDA device ordinal that owns `p` (cuPointerGetAttribute), or -1 when `p` is not CUDA
/// device memory or no CUDA driver is usable. Loads the driver on first use. Never throws;
/// thread-safe. Bindings use it to check that a buffer a framework calls device memory is
/// what deepio::Handle will stage as device memory.
[[nodiscard]] int device_of(const void* p) noexcept;

/// How a GdsHandle moves data.
enum class GdsMode {
  Auto,    ///< cuFile where it accepts the file; else (no cuFile, driver refuses, file system
           ///< unsupported) deepio's POSIX path staged through host memory, reported by mode()
  CuFile,  ///< cuFile only (its own compatibility mode allowed); an error where cuFile refuses
  Compat,  ///< never cuFile: POSIX reads/writes staged through page-locked host memory
};

/// Options of a GdsHandle; the first five are DeepNVMe's gds_handle constructor parameters.
struct GdsOptions {
  /// Size of the chunks a request is cut into; each chunk is one cuFileRead/cuFileWrite (or
  /// one staged pread/pwrite). Also given to cuFileDriverSetMaxDirectIOSize when this handle
  /// opens the driver. Must be > 0.
  std::size_t block_size = 1 << 20;
  /// Accepted for DeepNVMe compatibility. cuFile calls are synchronous, so a worker has one
  /// chunk in flight; parallelism comes from intra_op_parallelism. Must be > 0.
  std::size_t queue_depth = 128;
  bool single_submit = false;   ///< accepted, no effect (as in DeepNVMe's gds_handle)
  bool overlap_events = false;  ///< accepted, no effect (as in DeepNVMe's gds_handle)
  /// Worker threads; the chunks of every request are spread over them. Must be > 0.
  std::size_t intra_op_parallelism = 1;
  GdsMode mode = GdsMode::Auto;
};

struct GdsStats {
  std::uint64_t ops_completed = 0;
  std::uint64_t ops_failed = 0;
  std::uint64_t chunks = 0;          ///< chunks run (cuFile or staged)
  std::uint64_t bytes_cufile = 0;    ///< moved by cuFileRead/cuFileWrite
  std::uint64_t bytes_staged = 0;    ///< moved by pread/pwrite + host<->device copies
  std::uint64_t files_fallback = 0;  ///< operations cuFile refused and Auto staged instead
};

namespace detail::gpu {
class GdsEngine;
}

/// DeepNVMe's gds_handle: reads and writes between files and CUDA device memory.
///
/// Lifecycle: the first GdsHandle of the process opens the cuFile driver and the last one
/// closes it (after deregistering every buffer still pinned); nothing is written to the
/// working directory and nothing exits the process. Each operation opens its file (O_DIRECT
/// where accepted), registers it with cuFileHandleRegister, cuts the request into block_size
/// chunks run in parallel by the workers, and deregisters and closes when the last chunk is
/// done. Reads that reach end of file, short transfers that make no progress, and every
/// cuFile/CUDA error are reported as deepio::Error with path, offset and size.
///
/// Thread safety: every member function may be called from several threads at once.
/// Buffer lifetime: device memory passed to async_pread/async_pwrite stays allocated and
/// untouched until a wait() that started after the submission returns (or the handle is
/// destroyed). cuFile transfers are not ordered with CUDA streams: finish kernels writing a
/// source buffer before submitting it, and read results only after wait().
class GdsHandle {
 public:
  /// Uses the process-wide CUDA and cuFile. Throws deepio::Error: EINVAL for a zero
  /// block_size, queue_depth or intra_op_parallelism; ENOTSUP when the CUDA driver library is
  /// missing (or disabled), or when mode is CuFile and cuFile is missing or its driver cannot
  /// be opened; ENODEV when CUDA loads but has no usable device. The message says why.
  explicit GdsHandle(const GdsOptions& options = {});
  /// Internal: a handle over a given engine (tests build engines over fake drivers).
  explicit GdsHandle(std::unique_ptr<detail::gpu::GdsEngine> engine) noexcept;
  /// Finishes every operation in flight (never abandons a write), stops the workers, releases
  /// the driver reference. Errors nobody waited for are dropped. Never throws.
  ~GdsHandle();
  GdsHandle(const GdsHandle&) = delete;
  GdsHandle& operator=(const GdsHandle&) = delete;
  GdsHandle(GdsHandle&&) noexcept;
  GdsHandle& operator=(GdsHandle&&) noexcept;

  /// Reads nbytes at file_offset of `path` into device memory at `device_ptr`. Returns at once.
  /// Throws at submission: EINVAL when device_ptr is not CUDA device memory or the range
  /// crosses the end of a pinned buffer it starts in; ENOENT/EACCES/... when the file cannot
  /// be opened; ENODATA when file_offset + nbytes lies past its end; the cuFile error when
  /// cuFile refuses the file and the mode does not allow staging. Transfer errors surface in
  /// wait().
  void async_pread(void* device_ptr, std::size_t nbytes, const std::string& path,
                   std::uint64_t file_offset = 0);
  /// Writes nbytes from device memory at file_offset of `path`, creating the file (mode 0666
  /// & ~umask) and never truncating it. Same errors as async_pread, minus ENODATA.
  void async_pwrite(const void* device_ptr, std::size_t nbytes, const std::string& path,
                    std::uint64_t file_offset = 0);
  /// Submit, then wait() for everything pending. Returns wait()'s count (this op included).
  std::size_t sync_pread(void* device_ptr, std::size_t nbytes, const std::string& path,
                         std::uint64_t file_offset = 0);
  std::size_t sync_pwrite(const void* device_ptr, std::size_t nbytes, const std::string& path,
                          std::uint64_t file_offset = 0);
  /// Blocks until every operation submitted before the call has completed; returns how many
  /// this call collected (0 when none). Throws the first failure after all have completed.
  std::size_t wait();
  [[nodiscard]] std::size_t pending() const noexcept;

  /// Registers [device_ptr, device_ptr + nbytes) with cuFileBufRegister (when cuFile is in
  /// use) and records it process-wide, so that I/O on it or on any view inside it goes
  /// through the registration (base + offset). Returns true; pinning the same base with the
  /// same size again is a no-op returning true. Throws EINVAL (not device memory, nbytes 0),
  /// EEXIST (overlaps another pinned buffer), or the cuFile error.
  bool pin_device_buffer(void* device_ptr, std::size_t nbytes);
  /// Deregisters a buffer pinned at exactly this base. false when it is not pinned. Throws
  /// EBUSY while operations on it are in flight.
  bool unpin_device_buffer(void* device_ptr);
  /// cuMemAlloc on `device`, then pin. Throws ENOMEM/EIO with the CUDA error, or as pin.
  void* new_pinned_device_buffer(std::size_t nbytes, int device = 0);
  /// Unpin, then cuMemFree. false when device_ptr is not a pinned buffer base.
  bool free_pinned_device_buffer(void* device_ptr);

  /// "gds" or "compat" (see GpuInfo::gds_mode); becomes "compat" once a file was staged.
  [[nodiscard]] std::string mode() const;
  /// Why the mode is not "gds" (empty when it is), including cuFile notes.
  [[nodiscard]] std::string mode_reason() const;
  [[nodiscard]] const GdsOptions& options() const noexcept;
  [[nodiscard]] GdsStats stats() const noexcept;

 private:
  std::unique_ptr<detail::gpu::GdsEngine> engine_;
};

}  // namespace deepio
