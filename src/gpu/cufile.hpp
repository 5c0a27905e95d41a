// Run-time shim for libcufile (GPUDirect Storage): vendored ABI types, typed function pointers,
// error formatting, and the process-wide driver reference count.
//
// cufile() loads libcufile.so.0 (then libcufile.so, or DEEPIO_CUFILE_LIBRARY) once per
// process; it does NOT open the cuFile driver. The driver is opened by the first
// DriverRef and closed when the last one goes (cuFileDriverClose_v2, the reference-counting
// close, where the library exports it). Nothing here writes a configuration file, prints or
// exits. cuFile's own log (cufile.log, in the working directory by default) is pointed at
// $TMPDIR/deepio-cufile-<uid>.log (/tmp without TMPDIR) unless the user set
// CUFILE_LOGFILE_PATH, twice over: the process-wide loader sets CUFILE_LOGFILE_PATH to it
// before libcufile is opened (setenv without overwriting: the one environment change deepio
// makes, because on the H100 machine of 2026-11-26 the parameter API alone left cufile.log in
// the working directory), and the first DriverRef passes it to cuFileSetParameterString
// before the driver opens.
//
// Error conventions of cuFile: control calls return CUfileError_t {err, cu_err}; err is 0 or
// 5000 + n (CUfileOpError), and cu_err carries the CUDA result when err is
// CU_FILE_CUDA_DRIVER_ERROR. cuFileRead/cuFileWrite return the byte count, -1 with errno set
// for a file system error, or -(CUfileOpError) for a cuFile error.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "gpu/cuda.hpp"
#include "platform/status.hpp"

namespace deepio::detail::gpu {

// ---- vendored ABI (cufile.h) ----
using CUfileOpError = int;
inline constexpr CUfileOpError CU_FILE_SUCCESS = 0;
inline constexpr CUfileOpError CUFILEOP_BASE_ERR = 5000;
inline constexpr CUfileOpError CU_FILE_DRIVER_NOT_INITIALIZED = 5001;
inline constexpr CUfileOpError CU_FILE_DRIVER_UNSUPPORTED_LIMIT = 5003;
inline constexpr CUfileOpError CU_FILE_PLATFORM_NOT_SUPPORTED = 5007;
inline constexpr CUfileOpError CU_FILE_IO_NOT_SUPPORTED = 5008;
inline constexpr CUfileOpError CU_FILE_DEVICE_NOT_SUPPORTED = 5009;
inline constexpr CUfileOpError CU_FILE_NVFS_DRIVER_ERROR = 5010;
inline constexpr CUfileOpError CU_FILE_CUDA_DRIVER_ERROR = 5011;
inline constexpr CUfileOpError CU_FILE_CUDA_POINTER_INVALID = 5012;
inline constexpr CUfileOpError CU_FILE_CUDA_MEMORY_TYPE_INVALID = 5013;
inline constexpr CUfileOpError CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014;
inline constexpr CUfileOpError CU_FILE_INVALID_FILE_TYPE = 5018;
inline constexpr CUfileOpError CU_FILE_INVALID_FILE_OPEN_FLAG = 5019;
inline constexpr CUfileOpError CU_FILE_INVALID_VALUE = 5022;
inline constexpr CUfileOpError CU_FILE_MEMORY_ALREADY_REGISTERED = 5023;
inline constexpr CUfileOpError CU_FILE_MEMORY_NOT_REGISTERED = 5024;
inline constexpr CUfileOpError CU_FILE_PERMISSION_DENIED = 5025;
inline constexpr CUfileOpError CU_FILE_HANDLE_NOT_REGISTERED = 5027;
inline constexpr CUfileOpError CU_FILE_INTERNAL_ERROR = 5030;
inline constexpr CUfileOpError CU_FILE_IO_DISABLED = 5034;

struct CUfileError_t {
  CUfileOpError err;  // enum CUfileOpError (int-sized)
  CUresult cu_err;    // enum cudaError_enum (int-sized)
};

inline constexpr int CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1;

struct CUfileDescr_t {
  int type;  // enum CUfileFileHandleType
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // const CUfileFSOps_t*; nullptr for kernel file systems
};

using CUfileHandle_t = void*;

// Driver properties (cuFileDriverGetProperties). Only nvfs.major/minor_version and
// nvfs.dstatusflags are read.
struct CUfileDrvProps_t {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};
inline constexpr unsigned int CU_FILE_NVME_P2P_SUPPORTED_BIT = 11;  // dstatusflags bit
// CUFileBoolConfigParameter_t values used here.
inline constexpr int CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = 1;
// CUFileStringConfigParameter_t values used here: the log file (what CUFILE_LOGFILE_PATH sets).
inline constexpr int CUFILE_PARAM_ENV_LOGFILE_PATH = 1;

/// Device buffers pinned for GPUDirect Storage (cuFileBufRegister), keyed by base address.
/// The lookup is a range check: a view inside a registration resolves to its base and offset.
struct BufferRegistry {
  struct Entry {
    std::size_t nbytes = 0;
    int ordinal = -1;
    bool cufile_registered = false;  ///< cuFileBufRegister succeeded (false without cuFile)
    std::size_t in_flight = 0;       ///< operations using the registration right now
  };
  std::mutex mutex;
  std::map<std::uintptr_t, Entry> entries;  ///< guarded by mutex
};

/// The libcufile entry points. The required ones are non-null in a loaded object; the
/// optional ones (marked) may be null with older libraries.
struct CuFileApi {
  CUfileError_t (*cuFileDriverOpen)() = nullptr;
  CUfileError_t (*cuFileDriverClose)() = nullptr;  ///< _v2 when exported, else the plain name
  CUfileError_t (*cuFileHandleRegister)(CUfileHandle_t* fh, CUfileDescr_t* descr) = nullptr;
  void (*cuFileHandleDeregister)(CUfileHandle_t fh) = nullptr;
  CUfileError_t (*cuFileBufRegister)(const void* base, std::size_t nbytes, int flags) = nullptr;
  CUfileError_t (*cuFileBufDeregister)(const void* base) = nullptr;
  ssize_t (*cuFileRead)(CUfileHandle_t fh, void* base, std::size_t nbytes, off_t file_offset,
                        off_t base_offset) = nullptr;
  ssize_t (*cuFileWrite)(CUfileHandle_t fh, const void* base, std::size_t nbytes, off_t file_offset,
                         off_t base_offset) = nullptr;
  CUfileError_t (*cuFileDriverSetMaxDirectIOSize)(std::size_t kib) = nullptr;     // optional
  CUfileError_t (*cuFileDriverGetProperties)(CUfileDrvProps_t* props) = nullptr;  // optional
  CUfileError_t (*cuFileGetVersion)(int* version) = nullptr;                      // optional
  /// cuFile's parameter API (libcufile >= 1.7): parameters are staged before the driver opens.
  CUfileError_t (*cuFileSetParameterBool)(int param, bool value) = nullptr;           // optional
  CUfileError_t (*cuFileGetParameterBool)(int param, bool* value) = nullptr;          // optional
  CUfileError_t (*cuFileSetParameterString)(int param, const char* value) = nullptr;  // optional

  std::string library;
  bool close_is_v2 = false;  ///< cuFileDriverClose_v2 found (reference-counting close)

  /// Driver reference count; see DriverRef. Guarded by driver_mutex.
  std::mutex driver_mutex;
  std::size_t driver_refs = 0;
  std::size_t driver_opens = 0;  ///< times cuFileDriverOpen was called (diagnostics, tests)
  std::string driver_note;       ///< e.g. why cuFileDriverSetMaxDirectIOSize was refused
  /// Buffers registered with this library; deregistered when the driver closes.
  BufferRegistry buffers;
};

/// The process-wide libcufile, loaded once. nullptr with *why (ENOTSUP, naming the libraries
/// tried) when absent or incomplete. Thread-safe; the answer never changes.
const CuFileApi* cufile(Status* why) noexcept;

/// Loads `library` afresh, apart from the process-wide one (tests, tools).
std::unique_ptr<CuFileApi> load_cufile(const std::string& library, Status* why);

/// "CU_FILE_IO_NOT_SUPPORTED (...)" for a cuFile error, with the CUDA error text for
/// CU_FILE_CUDA_DRIVER_ERROR.
std::string cufile_error_text(const CudaApi* cuda_api, CUfileError_t e);

/// Failed Status for a cuFile control call: EIO, except EACCES for PERMISSION_DENIED, EINVAL
/// for INVALID_VALUE, ENOTSUP for the "not supported" family.
Status cufile_status(const CudaApi* cuda_api, CUfileError_t e, const char* what);

/// Failed Status for a negative cuFileRead/cuFileWrite result (`saved_errno` is errno right
/// after the call, used when result == -1).
Status cufile_io_status(const CudaApi* cuda_api, ssize_t result, int saved_errno, const char* what);

/// True for the "not supported" family of errors (mapped to ENOTSUP).
bool cufile_unsupported(CUfileOpError err) noexcept;

/// True for every refusal, at driver open, file handle registration or buffer registration,
/// that means "GPUDirect Storage cannot serve this file or buffer here" rather than a bad
/// argument or a failed transfer: the "not supported" family, plus what cuFile answers on
/// machines without nvidia-fs or with GDS disabled (CU_FILE_HANDLE_NOT_REGISTERED,
/// CU_FILE_PERMISSION_DENIED, CU_FILE_DEVICE_NOT_FOUND, CU_FILE_NVFS_SETUP_ERROR,
/// CU_FILE_DRIVER_VERSION_*, CU_FILE_GETNEWFD_FAILED, CU_FILE_INTERNAL_ERROR,
/// CU_FILE_CUDA_MEMORY_TYPE_INVALID, CU_FILE_INVALID_MAPPING_SIZE,
/// CU_FILE_GPU_MEMORY_PINNING_FAILED). Staging through host memory works in all these cases,
/// so GdsHandle in Auto falls back on them; nothing has been transferred when they occur.
bool cufile_gds_unusable(CUfileOpError err) noexcept;

/// One reference to the opened cuFile driver. The first reference opens it (and, if
/// max_direct_io_kib > 0, sets the maximum direct I/O size, tolerating refusal); the last one
/// deregisters from cuFile every buffer still in api->buffers (the entries stay, marked
/// unregistered, until unpinned), then closes it. Move-only; thread-safe.
class DriverRef {
 public:
  DriverRef() = default;
  /// Opens (or shares) the driver of `api`. On failure returns a Status with the cuFile error.
  /// The opening reference may first ask cuFile to allow its compatibility mode
  /// (cuFileSetParameterBool, where the library has it); the answer goes to driver_note. It
  /// also points cuFile's log out of the working directory (cufile_log_path()).
  static Status acquire(CuFileApi* api, const CudaApi* cuda_api, std::size_t max_direct_io_kib, DriverRef* out,
                        bool allow_compat = false);
  ~DriverRef() { reset(); }
  DriverRef(DriverRef&& other) noexcept : api_(other.api_) { other.api_ = nullptr; }
  DriverRef& operator=(DriverRef&& other) noexcept {
    if (this != &other) {
      reset();
      api_ = other.api_;
      other.api_ = nullptr;
    }
    return *this;
  }
  DriverRef(const DriverRef&) = delete;
  DriverRef& operator=(const DriverRef&) = delete;

  [[nodiscard]] bool valid() const noexcept { return api_ != nullptr; }
  void reset() noexcept;

 private:
  CuFileApi* api_ = nullptr;
};

/// Where deepio points cuFile's log when the user has not: $TMPDIR/deepio-cufile-<uid>.log
/// (/tmp when TMPDIR is unset or empty); "" when CUFILE_LOGFILE_PATH is set (non-empty) to
/// anything else (the user's choice).
std::string cufile_log_path();

/// Whether the nvidia-fs kernel module is loaded (/proc/driver/nvidia-fs/version).
bool nvidia_fs_loaded() noexcept;

/// The process-wide CuFileApi as a mutable object for DriverRef (same object as cufile()).
CuFileApi* cufile_mutable(Status* why) noexcept;

}  // namespace deepio::detail::gpu
