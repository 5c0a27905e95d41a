// Run-time shim for the CUDA driver API (libcuda.so.1): vendored ABI types, typed function
// pointers resolved with dlsym under their versioned names, and error formatting.
//
// Nothing here needs CUDA headers or libraries to build. cuda() loads the driver once per
// process (thread-safe) and answers nullptr with the reason when it is unusable (library
// missing, symbol missing, cuInit failed, no device). Every function pointer of a returned
// CudaApi is non-null. Which library is opened is chosen by DEEPIO_CUDA_LIBRARY (see
// loader.hpp); tests point it at a fake driver with host-memory semantics.
//
// ABI notes: the names resolved are those cuda.h maps the API to when neither
// CUDA_API_PER_THREAD_DEFAULT_STREAM nor an old API version is requested: `_v2` for
// cuMemAlloc, cuMemFree, cuMemcpy{HtoD,DtoH}[Async], cuMemHostRegister, cuStreamDestroy,
// cuEventDestroy, cuDevicePrimaryCtxRelease and cuCtx{Push,Pop}Current; the plain name elsewhere.
// Copies on a stream use the legacy default-stream semantics of those names.
//
// Contexts: deepio never leaves a context current on a thread it does not own. A driver call
// made on a caller's thread that needs one runs under a ScopedContext, which pushes the
// context (cuCtxPushCurrent_v2) and pops it again on every path; deepio's own worker threads
// keep a context current between requests.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "platform/status.hpp"

namespace deepio::detail::gpu {

// ---- vendored ABI (cuda.h, driver API) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUstream_st;
using CUstream = CUstream_st*;
struct CUevent_st;
using CUevent = CUevent_st*;
using CUpointer_attribute = int;  // enum CUpointer_attribute_enum

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_INSUFFICIENT_DRIVER = 35;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_CONTEXT = 1;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;     // data: unsigned int
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_IS_MANAGED = 8;      // data: bool
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;  // data: int

inline constexpr unsigned int CU_MEMORYTYPE_HOST = 1;
inline constexpr unsigned int CU_MEMORYTYPE_DEVICE = 2;
inline constexpr unsigned int CU_MEMORYTYPE_ARRAY = 3;
inline constexpr unsigned int CU_MEMORYTYPE_UNIFIED = 4;

inline constexpr unsigned int CU_MEMHOSTREGISTER_PORTABLE = 0x01;
inline constexpr unsigned int CU_MEMHOSTREGISTER_DEVICEMAP = 0x02;
inline constexpr unsigned int CU_STREAM_DEFAULT = 0x0;
inline constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned int CU_EVENT_DEFAULT = 0x0;
inline constexpr unsigned int CU_EVENT_BLOCKING_SYNC = 0x1;
inline constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;

/// The driver entry points deepio uses. All non-null in an object returned by cuda() or
/// load_cuda(). Plain data after loading: safe to read from any thread.
struct CudaApi {
  CUresult (*cuInit)(unsigned int flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice device) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device) = nullptr;  // _v2
  CUresult (*cuCtxSetCurrent)(CUcontext ctx) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext ctx) = nullptr;  // _v2
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx) = nullptr;  // _v2
  CUresult (*cuPointerGetAttribute)(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, std::size_t nbytes,
                                CUstream stream) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, std::size_t nbytes,
                                CUstream stream) = nullptr;                                  // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, std::size_t nbytes) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, std::size_t nbytes) = nullptr;        // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, std::size_t nbytes) = nullptr;                    // _v2
  CUresult (*cuMemFree)(CUdeviceptr ptr) = nullptr;                                          // _v2
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned int flags) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream stream) = nullptr;  // _v2
  CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
  CUresult (*cuEventCreate)(CUevent* event, unsigned int flags) = nullptr;
  CUresult (*cuEventDestroy)(CUevent event) = nullptr;  // _v2
  CUresult (*cuEventRecord)(CUevent event, CUstream stream) = nullptr;
  CUresult (*cuEventQuery)(CUevent event) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent event) = nullptr;
  CUresult (*cuMemHostRegister)(void* p, std::size_t nbytes, unsigned int flags) = nullptr;  // _v2
  CUresult (*cuMemHostUnregister)(void* p) = nullptr;
  CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;
  CUresult (*cuGetErrorName)(CUresult error, const char** name) = nullptr;
  // Added for stream-ordered staging (issue 26): keep new entry points at the end.
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags) = nullptr;

  std::string library;     ///< the file dlopen() accepted
  int driver_version = 0;  ///< cuDriverGetVersion, e.g. 12040
  int device_count = 0;    ///< > 0 in a loaded API
};

/// The process-wide driver, loaded on first call from DEEPIO_CUDA_LIBRARY or libcuda.so.1,
/// with cuInit(0) done. nullptr when unusable; then *why (if given) says why, naming the
/// library: errno ENOTSUP when the library or a symbol is missing or the user disabled it,
/// ENODEV when cuInit fails or no device is present. The answer is computed once and never
/// changes. Thread-safe.
const CudaApi* cuda(Status* why) noexcept;

/// Loads a driver from `library` afresh (dlopen, resolve, cuInit, count devices) without
/// touching the process-wide one. For tests and tools; same errors as cuda(). The library
/// stays mapped after the CudaApi is destroyed.
std::unique_ptr<CudaApi> load_cuda(const std::string& library, Status* why);

/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)": the driver's name and description when the
/// driver is loaded, a built-in name for common codes otherwise.
std::string cuda_error_text(const CudaApi* api, CUresult r);

/// A failed Status for a CUDA call: errno ENOMEM for CUDA_ERROR_OUT_OF_MEMORY, EIO for every
/// other code; message "what: CUDA_ERROR_X (description)". Uses the process-wide driver's
/// names if it is loaded.
Status cuda_status(CUresult r, const char* what);
Status cuda_status(const CudaApi* api, CUresult r, const char* what);

struct DevicePointer {
  bool is_device = false;
  int ordinal = -1;  ///< the device holding the memory; -1 when not device memory
};

/// Whether p is CUDA device memory (cuPointerGetAttribute MEMORY_TYPE == DEVICE) and on which
/// device. {false, -1} for host memory, unknown pointers, or when no driver is loaded. Managed
/// memory (cuMemAllocManaged; IS_MANAGED) is host-addressable, so it is host memory here:
/// plain pread/pwrite, never staged, never cuFile. Never throws; thread-safe.
DevicePointer classify(const void* p) noexcept;
DevicePointer classify(const CudaApi* api, const void* p) noexcept;

/// Whether p is CUDA managed memory (IS_MANAGED). false when unknown or without a driver.
bool is_managed(const CudaApi* api, const void* p) noexcept;

/// Makes a context current on the calling thread for the guard's lifetime: enter() pushes it
/// (cuCtxPushCurrent_v2) unless it is current already, and the destructor (or reset()) pops it
/// (cuCtxPopCurrent_v2), so the thread's own context, or none, is current again afterwards, on
/// every path. Move-only; use on one thread. Nested guards restore in reverse order.
class ScopedContext {
 public:
  ScopedContext() = default;
  /// Pushes ctx on the calling thread. A failed push leaves the thread as it was.
  static Status enter(const CudaApi* api, CUcontext ctx, ScopedContext* out);
  ~ScopedContext() { reset(); }
  ScopedContext(ScopedContext&& other) noexcept : api_(other.api_) { other.api_ = nullptr; }
  ScopedContext& operator=(ScopedContext&& other) noexcept {
    if (this != &other) {
      reset();
      api_ = other.api_;
      other.api_ = nullptr;
    }
    return *this;
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  /// Restores the thread's previous context now (nothing when nothing was pushed).
  void reset() noexcept;

 private:
  const CudaApi* api_ = nullptr;  // set while a push is to be undone
};

}  // namespace deepio::detail::gpu
