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
#include "deepio/export.hpp"
#include "deepio/handle.hpp"
#include "deepio/options.hpp"

namespace deepio {

/// What the GPU layer found. Every *_reason is empty when the thing is usable.
struct GpuInfo {
  bool cuda_found = false;   ///< driver loaded, cuInit succeeded, at least one device
  std::string cuda_reason;   ///< why not (names the library tried)
  std::string cuda_library;  ///< the library loaded
  int driver_version = 0;    ///< cuDriverGetVersion (e.g. 12040); 0 when not found
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
[[nodiscard]] DEEPIO_API GpuInfo gpu_info() noexcept;

/// The CUDA device ordinal that owns `p` (cuPointerGetAttribute), or -1 when `p` is not CUDA
/// device memory (managed memory is not: see is_managed) or no CUDA driver is usable. Loads
/// the driver on first use. Never throws; thread-safe. Bindings use it to check that a buffer
/// a framework calls device memory is what deepio::Handle will stage as device memory.
[[nodiscard]] DEEPIO_API int device_of(const void* p) noexcept;

/// A CUDA stream deepio owns on `device` (non-blocking, in the device's primary context; made
/// on first use, kept for the life of the process), for DLPack's stream exchange: give it to
/// a producer's `__dlpack__(stream=...)`, which orders the producer's pending work before it,
/// then pass it as OpOptions::stream. Throws deepio::Error (ENOTSUP or ENODEV without a usable
/// driver, EIO when the driver refuses) and deepio::InvalidArgument for a device the driver
/// does not have. Thread-safe.
[[nodiscard]] DEEPIO_API std::uintptr_t consumer_stream(int device);

/// Whether `p` is CUDA managed memory (cuMemAllocManaged / cudaMallocManaged). Managed memory
/// is host-addressable, and deepio reads and writes it as host memory (never staged, never
/// cuFile), whatever a framework calls it. false without a usable driver. Never throws;
/// thread-safe.
[[nodiscard]] DEEPIO_API bool is_managed(const void* p) noexcept;

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
  /// As Handle's for host memory and staged device memory. cuFile calls are synchronous, so a
  /// cuFile worker has one chunk in flight; its parallelism is intra_op_parallelism. Must be > 0.
  std::size_t queue_depth = 128;
  bool single_submit = false;   ///< as Handle's (host memory and staging); no effect on cuFile
  bool overlap_events = false;  ///< as Handle's (host memory and staging); no effect on cuFile
  /// Worker threads; the chunks of every request are spread over them. Must be > 0.
  std::size_t intra_op_parallelism = 1;
  GdsMode mode = GdsMode::Auto;
  /// As Handle's, for host memory and staged device memory (never cuFile's).
  BackendKind backend = BackendKind::Auto;
  DirectIo direct_io = DirectIo::Auto;
};

/// The GdsMode of a device route: Auto -> Auto, Gds -> CuFile, Staged -> Compat.
[[nodiscard]] constexpr GdsMode gds_mode(DeviceRouteMode route) noexcept {
  return route == DeviceRouteMode::Gds      ? GdsMode::CuFile
         : route == DeviceRouteMode::Staged ? GdsMode::Compat
                                            : GdsMode::Auto;
}
/// The device route of a GdsMode: Auto -> Auto, CuFile -> Gds, Compat -> Staged.
[[nodiscard]] constexpr DeviceRouteMode device_route(GdsMode mode) noexcept {
  return mode == GdsMode::CuFile   ? DeviceRouteMode::Gds
         : mode == GdsMode::Compat ? DeviceRouteMode::Staged
                                   : DeviceRouteMode::Auto;
}

/// GdsOptions with the engine settings of `h` (block size, queue depth, submission modes,
/// parallelism, backend, direct I/O) and the given mode.
[[nodiscard]] inline GdsOptions gds_options(const HandleOptions& h, GdsMode mode) {
  GdsOptions o;
  o.block_size = h.block_size;
  o.queue_depth = h.queue_depth;
  o.single_submit = h.single_submit;
  o.overlap_events = h.overlap_events;
  o.intra_op_parallelism = h.intra_op_parallelism;
  o.mode = mode;
  o.backend = h.backend;
  o.direct_io = h.direct_io;
  return o;
}
/// GdsOptions with every setting of `h`, its device_route as the mode (gds_mode()).
[[nodiscard]] inline GdsOptions gds_options(const HandleOptions& h) { return gds_options(h, gds_mode(h.device_route)); }

/// The HandleOptions of a GdsHandle: `o`'s settings, its mode as the device route.
[[nodiscard]] inline HandleOptions handle_options(const GdsOptions& o) {
  HandleOptions h;
  h.block_size = o.block_size;
  h.queue_depth = o.queue_depth;
  h.single_submit = o.single_submit;
  h.overlap_events = o.overlap_events;
  h.intra_op_parallelism = o.intra_op_parallelism;
  h.backend = o.backend;
  h.direct_io = o.direct_io;
  h.device_route = device_route(o.mode);
  return h;
}

/// What a GdsHandle did with device memory (Handle::stats() has the rest).
struct GdsStats {
  std::uint64_t ops_completed = 0;   ///< operations on device memory (Handle::stats() counts all)
  std::uint64_t ops_failed = 0;      ///< of those, the failed ones
  std::uint64_t chunks = 0;          ///< requests cut for operations on device memory (cuFile or staged)
  std::uint64_t bytes_cufile = 0;    ///< moved by cuFileRead/cuFileWrite
  std::uint64_t bytes_staged = 0;    ///< moved by pread/pwrite + host<->device copies (io_fallbacks' too)
  std::uint64_t files_fallback = 0;  ///< operations cuFile refused and Auto staged instead
  /// Of files_fallback, those on a file system cuFile had refused before: staged without a
  /// cuFileHandleRegister call (one refusal per file system and handle), or on a File cuFile
  /// had refused before.
  std::uint64_t registrations_skipped = 0;
  /// Requests whose cuFileRead/cuFileWrite failed with a cuFile error and that Auto staged
  /// instead (with the rest of their operation): the operation succeeds if staging does.
  std::uint64_t io_fallbacks = 0;
  std::uint64_t pins_refused = 0;  ///< pin_device_buffer calls cuFile refused and Auto kept unregistered
};

namespace detail {
class Engine;
namespace gpu {
class GdsRoute;
struct GdsParts;
}  // namespace gpu
}  // namespace detail

/// DeepNVMe's gds_handle: a deepio::Handle whose operations on CUDA device memory may go
/// through GPUDirect Storage (cuFile) instead of being staged through host memory.
///
/// It is the same engine as Handle, with one more way for device memory to reach a file:
/// every operation, on host or device memory, by path or descriptor, has Handle's futures,
/// wait(), errors, end-of-file rule and descriptor back-pressure. Host memory takes Handle's
/// path. Device memory, per operation: the file is opened (O_DIRECT where accepted) and
/// registered with cuFileHandleRegister; the request is cut into block_size chunks spread over
/// intra_op_parallelism workers, one cuFileRead/cuFileWrite each; the registration ends when
/// the last chunk is done. A File (Handle::open) is registered once, by its first operation on
/// device memory, and deregistered when it is closed or destroyed (after its last operation,
/// before its descriptors close). Where cuFile is not used (mode Compat, cuFile missing or its driver
/// refused in Auto, or a file cuFile refuses in Auto), the operation goes through the engine's
/// staging pipeline, as on a plain Handle; mode() and mode_reason() say so.
///
/// Lifecycle: the first GdsHandle of the process that uses cuFile opens the cuFile driver and
/// the last one closes it (after deregistering every buffer still pinned); nothing is written
/// to the working directory and nothing exits the process.
///
/// Thread safety: every member function may be called from several threads at once. No call
/// changes the calling thread's current CUDA context: what needs one pushes the buffer's
/// device's primary context and pops it before returning (or throwing).
/// Buffer lifetime: as Handle's. cuFile transfers are not ordered with CUDA streams: finish
/// kernels writing a source buffer before submitting it, and read results only after the
/// operation completed.
class DEEPIO_API GdsHandle : public Handle {
 public:
  /// Uses the process-wide CUDA and cuFile. Throws deepio::Error: EINVAL for a zero
  /// block_size, queue_depth or intra_op_parallelism; ENOTSUP when the CUDA driver library is
  /// missing (or disabled), or when mode is CuFile and cuFile is missing or its driver cannot
  /// be opened; ENODEV when CUDA loads but has no usable device. The message says why.
  explicit GdsHandle(const GdsOptions& options = {});
  /// As Handle's: finishes every operation in flight, then releases the driver reference.
  ~GdsHandle();

  // Submission, wait() and pending() are Handle's. Submitting device memory additionally
  // throws EINVAL when the range crosses the end of a pinned buffer it starts in, and the
  // cuFile error when cuFile refuses the file and the mode does not allow staging.

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
  /// The options as given (Handle::options() has the engine's view of them).
  [[nodiscard]] const GdsOptions& options_as_given() const noexcept { return gds_options_; }
  /// The device side of what the handle did: what went through cuFile and what was staged
  /// (Handle::stats() has the host side).
  [[nodiscard]] GdsStats gds_stats() const noexcept;

 private:
  friend struct detail::HandleAccess;
  /// A handle over a prepared engine and route (tests build them over fake drivers).
  GdsHandle(const GdsOptions& options, detail::gpu::GdsParts&& parts) noexcept;

  GdsOptions gds_options_;
  std::shared_ptr<detail::gpu::GdsRoute> route_;
};

}  // namespace deepio
