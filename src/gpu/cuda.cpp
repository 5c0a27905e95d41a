#include "gpu/cuda.hpp"

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>

#include "gpu/loader.hpp"

namespace deepio::detail::gpu {

namespace {

const char* builtin_error_name(CUresult r) noexcept {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_INSUFFICIENT_DRIVER: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

// Resolves every entry point; returns the first missing symbol name, "" when all are there.
std::string resolve_all(const Library& lib, CudaApi* api) {
  std::string missing;
  resolve(lib, "cuInit", &api->cuInit, &missing);
  resolve(lib, "cuDriverGetVersion", &api->cuDriverGetVersion, &missing);
  resolve(lib, "cuDeviceGetCount", &api->cuDeviceGetCount, &missing);
  resolve(lib, "cuDeviceGet", &api->cuDeviceGet, &missing);
  resolve(lib, "cuDevicePrimaryCtxRetain", &api->cuDevicePrimaryCtxRetain, &missing);
  resolve(lib, "cuDevicePrimaryCtxRelease_v2", &api->cuDevicePrimaryCtxRelease, &missing);
  resolve(lib, "cuCtxSetCurrent", &api->cuCtxSetCurrent, &missing);
  resolve(lib, "cuCtxGetCurrent", &api->cuCtxGetCurrent, &missing);
  resolve(lib, "cuCtxPushCurrent_v2", &api->cuCtxPushCurrent, &missing);
  resolve(lib, "cuCtxPopCurrent_v2", &api->cuCtxPopCurrent, &missing);
  resolve(lib, "cuPointerGetAttribute", &api->cuPointerGetAttribute, &missing);
  resolve(lib, "cuMemcpyHtoDAsync_v2", &api->cuMemcpyHtoDAsync, &missing);
  resolve(lib, "cuMemcpyDtoHAsync_v2", &api->cuMemcpyDtoHAsync, &missing);
  resolve(lib, "cuMemcpyHtoD_v2", &api->cuMemcpyHtoD, &missing);
  resolve(lib, "cuMemcpyDtoH_v2", &api->cuMemcpyDtoH, &missing);
  resolve(lib, "cuMemAlloc_v2", &api->cuMemAlloc, &missing);
  resolve(lib, "cuMemFree_v2", &api->cuMemFree, &missing);
  resolve(lib, "cuStreamCreate", &api->cuStreamCreate, &missing);
  resolve(lib, "cuStreamDestroy_v2", &api->cuStreamDestroy, &missing);
  resolve(lib, "cuStreamSynchronize", &api->cuStreamSynchronize, &missing);
  resolve(lib, "cuEventCreate", &api->cuEventCreate, &missing);
  resolve(lib, "cuEventDestroy_v2", &api->cuEventDestroy, &missing);
  resolve(lib, "cuEventRecord", &api->cuEventRecord, &missing);
  resolve(lib, "cuEventQuery", &api->cuEventQuery, &missing);
  resolve(lib, "cuEventSynchronize", &api->cuEventSynchronize, &missing);
  resolve(lib, "cuMemHostRegister_v2", &api->cuMemHostRegister, &missing);
  resolve(lib, "cuMemHostUnregister", &api->cuMemHostUnregister, &missing);
  resolve(lib, "cuGetErrorString", &api->cuGetErrorString, &missing);
  resolve(lib, "cuGetErrorName", &api->cuGetErrorName, &missing);
  resolve(lib, "cuStreamWaitEvent", &api->cuStreamWaitEvent, &missing);
  return missing;
}

std::unique_ptr<CudaApi> load_from(const std::vector<std::string>& candidates, Status* why) {
  Status st;
  Library lib;
  st = open_library(candidates, &lib);
  if (!st.ok()) {
    st.errnum = ENOTSUP;
    st.message = "CUDA driver not found: " + st.message;
    if (why != nullptr) *why = std::move(st);
    return nullptr;
  }
  auto api = std::make_unique<CudaApi>();
  api->library = lib.name;
  const std::string missing = resolve_all(lib, api.get());
  if (!missing.empty()) {
    if (why != nullptr) {
      *why = Status::failure(ENOTSUP, lib.name + " lacks " + missing + " (driver too old, or not a CUDA driver)");
    }
    return nullptr;
  }
  CUresult r = api->cuInit(0);
  if (r != CUDA_SUCCESS) {
    if (why != nullptr) {
      *why = Status::failure(ENODEV, lib.name + ": cuInit failed: " + cuda_error_text(api.get(), r));
    }
    return nullptr;
  }
  r = api->cuDriverGetVersion(&api->driver_version);
  if (r == CUDA_SUCCESS) r = api->cuDeviceGetCount(&api->device_count);
  if (r != CUDA_SUCCESS) {
    if (why != nullptr) {
      *why = Status::failure(ENODEV, lib.name + ": cannot count devices: " + cuda_error_text(api.get(), r));
    }
    return nullptr;
  }
  if (api->device_count <= 0) {
    if (why != nullptr) *why = Status::failure(ENODEV, lib.name + ": no CUDA device");
    return nullptr;
  }
  if (why != nullptr) *why = Status::success();
  return api;
}

using Global = LoadedOnce<CudaApi>;

const Global& global() noexcept {
  // Built once; a failure to allocate while loading is reported as the reason.
  static const Global g = load_once<CudaApi>(cuda_library_choice, "CUDA", load_from);
  return g;
}

}  // namespace

const CudaApi* cuda(Status* why) noexcept {
  const Global& g = global();
  if (why != nullptr && g.api == nullptr) {
    try {
      *why = g.why;
    } catch (...) {
      why->errnum = g.why.errnum;
    }
  }
  return g.api.get();
}

std::unique_ptr<CudaApi> load_cuda(const std::string& library, Status* why) { return load_from({library}, why); }

std::string cuda_error_text(const CudaApi* api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api != nullptr) {
    if (api->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  }
  if (name == nullptr) name = builtin_error_name(r);
  std::string s = name != nullptr ? std::string(name) : "CUDA error " + std::to_string(r);
  if (text != nullptr && *text != '\0') s += std::string(" (") + text + ")";
  return s;
}

Status cuda_status(const CudaApi* api, CUresult r, const char* what) {
  const int errnum = r == CUDA_ERROR_OUT_OF_MEMORY ? ENOMEM : EIO;
  return Status::failure(errnum, std::string(what) + ": " + cuda_error_text(api, r));
}

Status cuda_status(CUresult r, const char* what) { return cuda_status(cuda(nullptr), r, what); }

DevicePointer classify(const CudaApi* api, const void* p) noexcept {
  DevicePointer out;
  if (api == nullptr || p == nullptr) return out;
  const auto address = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  unsigned int memory_type = 0;
  if (api->cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) != CUDA_SUCCESS ||
      memory_type != CU_MEMORYTYPE_DEVICE) {
    return out;
  }
  // Managed memory reports MEMORY_TYPE DEVICE but is host-addressable: host memory to deepio.
  if (is_managed(api, p)) return out;
  int ordinal = -1;
  if (api->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) != CUDA_SUCCESS) {
    return out;
  }
  out.is_device = true;
  out.ordinal = ordinal;
  return out;
}

DevicePointer classify(const void* p) noexcept { return classify(cuda(nullptr), p); }

bool is_managed(const CudaApi* api, const void* p) noexcept {
  if (api == nullptr || p == nullptr) return false;
  // IS_MANAGED is a bool: read into a zeroed int, so a driver writing one byte reads right.
  unsigned int managed = 0;
  const auto address = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  return api->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, address) == CUDA_SUCCESS && managed != 0;
}

Status ScopedContext::enter(const CudaApi* api, CUcontext ctx, ScopedContext* out) {
  out->reset();
  CUcontext current = nullptr;
  if (api->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) return Status::success();
  const CUresult r = api->cuCtxPushCurrent(ctx);
  if (r != CUDA_SUCCESS) return cuda_status(api, r, "cuCtxPushCurrent");
  out->api_ = api;
  return Status::success();
}

void ScopedContext::reset() noexcept {
  if (api_ == nullptr) return;
  CUcontext popped = nullptr;
  (void)api_->cuCtxPopCurrent(&popped);  // a failed pop leaves nothing to undo
  api_ = nullptr;
}

}  // namespace deepio::detail::gpu
