#include "gpu/cufile.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>

#include "gpu/loader.hpp"

namespace deepio::detail::gpu {

namespace {

const char* op_error_name(CUfileOpError e) noexcept {
  switch (e) {
    case CU_FILE_SUCCESS: return "CU_FILE_SUCCESS";
    case 5001: return "CU_FILE_DRIVER_NOT_INITIALIZED";
    case 5002: return "CU_FILE_DRIVER_INVALID_PROPS";
    case 5003: return "CU_FILE_DRIVER_UNSUPPORTED_LIMIT";
    case 5004: return "CU_FILE_DRIVER_VERSION_MISMATCH";
    case 5005: return "CU_FILE_DRIVER_VERSION_READ_ERROR";
    case 5006: return "CU_FILE_DRIVER_CLOSING";
    case 5007: return "CU_FILE_PLATFORM_NOT_SUPPORTED";
    case 5008: return "CU_FILE_IO_NOT_SUPPORTED";
    case 5009: return "CU_FILE_DEVICE_NOT_SUPPORTED";
    case 5010: return "CU_FILE_NVFS_DRIVER_ERROR";
    case 5011: return "CU_FILE_CUDA_DRIVER_ERROR";
    case 5012: return "CU_FILE_CUDA_POINTER_INVALID";
    case 5013: return "CU_FILE_CUDA_MEMORY_TYPE_INVALID";
    case 5014: return "CU_FILE_CUDA_POINTER_RANGE_ERROR";
    case 5015: return "CU_FILE_CUDA_CONTEXT_MISMATCH";
    case 5016: return "CU_FILE_INVALID_MAPPING_SIZE";
    case 5017: return "CU_FILE_INVALID_MAPPING_RANGE";
    case 5018: return "CU_FILE_INVALID_FILE_TYPE";
    case 5019: return "CU_FILE_INVALID_FILE_OPEN_FLAG";
    case 5020: return "CU_FILE_DIO_NOT_SET";
    case 5022: return "CU_FILE_INVALID_VALUE";
    case 5023: return "CU_FILE_MEMORY_ALREADY_REGISTERED";
    case 5024: return "CU_FILE_MEMORY_NOT_REGISTERED";
    case 5025: return "CU_FILE_PERMISSION_DENIED";
    case 5026: return "CU_FILE_DRIVER_ALREADY_OPEN";
    case 5027: return "CU_FILE_HANDLE_NOT_REGISTERED";
    case 5028: return "CU_FILE_HANDLE_ALREADY_REGISTERED";
    case 5029: return "CU_FILE_DEVICE_NOT_FOUND";
    case 5030: return "CU_FILE_INTERNAL_ERROR";
    case 5031: return "CU_FILE_GETNEWFD_FAILED";
    case 5033: return "CU_FILE_NVFS_SETUP_ERROR";
    case 5034: return "CU_FILE_IO_DISABLED";
    case 5035: return "CU_FILE_BATCH_SUBMIT_FAILED";
    case 5036: return "CU_FILE_GPU_MEMORY_PINNING_FAILED";
    case 5037: return "CU_FILE_BATCH_FULL";
    case 5038: return "CU_FILE_ASYNC_NOT_SUPPORTED";
    default: return nullptr;
  }
}

int op_error_errno(CUfileOpError e) noexcept {
  if (cufile_unsupported(e)) return ENOTSUP;
  switch (e) {
    case CU_FILE_PERMISSION_DENIED: return EACCES;
    case CU_FILE_INVALID_VALUE:
    case CU_FILE_CUDA_POINTER_INVALID:
    case CU_FILE_CUDA_MEMORY_TYPE_INVALID:
    case CU_FILE_CUDA_POINTER_RANGE_ERROR: return EINVAL;
    default: return EIO;
  }
}

std::unique_ptr<CuFileApi> load_from(const std::vector<std::string>& candidates, Status* why) {
  // libcufile may read where its log goes when it starts, before any parameter call can move
  // it: the environment variable it documents is set first (never overwriting the user's).
  if (const std::string log = cufile_log_path(); !log.empty()) (void)::setenv("CUFILE_LOGFILE_PATH", log.c_str(), 0);
  Library lib;
  Status st = open_library(candidates, &lib);
  if (!st.ok()) {
    if (why != nullptr) *why = Status::failure(ENOTSUP, "cuFile not found: " + st.message);
    return nullptr;
  }
  auto api = std::make_unique<CuFileApi>();
  api->library = lib.name;
  std::string missing;
  resolve(lib, "cuFileDriverOpen", &api->cuFileDriverOpen, &missing);
  // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2, the close that honours the
  // reference count; the plain name (which tears the library down) is only for old releases.
  api->cuFileDriverClose = reinterpret_cast<CUfileError_t (*)()>(find_symbol(lib, "cuFileDriverClose_v2"));
  api->close_is_v2 = api->cuFileDriverClose != nullptr;
  if (!api->close_is_v2) resolve(lib, "cuFileDriverClose", &api->cuFileDriverClose, &missing);
  resolve(lib, "cuFileHandleRegister", &api->cuFileHandleRegister, &missing);
  resolve(lib, "cuFileHandleDeregister", &api->cuFileHandleDeregister, &missing);
  resolve(lib, "cuFileBufRegister", &api->cuFileBufRegister, &missing);
  resolve(lib, "cuFileBufDeregister", &api->cuFileBufDeregister, &missing);
  resolve(lib, "cuFileRead", &api->cuFileRead, &missing);
  resolve(lib, "cuFileWrite", &api->cuFileWrite, &missing);
  if (!missing.empty()) {
    if (why != nullptr) *why = Status::failure(ENOTSUP, lib.name + " lacks " + missing);
    return nullptr;
  }
  std::string optional_missing;  // optional entry points may be absent
  resolve(lib, "cuFileDriverSetMaxDirectIOSize", &api->cuFileDriverSetMaxDirectIOSize, &optional_missing);
  resolve(lib, "cuFileDriverGetProperties", &api->cuFileDriverGetProperties, &optional_missing);
  resolve(lib, "cuFileGetVersion", &api->cuFileGetVersion, &optional_missing);
  resolve(lib, "cuFileSetParameterBool", &api->cuFileSetParameterBool, &optional_missing);
  resolve(lib, "cuFileGetParameterBool", &api->cuFileGetParameterBool, &optional_missing);
  resolve(lib, "cuFileSetParameterString", &api->cuFileSetParameterString, &optional_missing);
  if (why != nullptr) *why = Status::success();
  return api;
}

using Global = LoadedOnce<CuFileApi>;

Global& global() noexcept {
  // Built once; a failure to allocate while loading is reported as the reason.
  static Global g = load_once<CuFileApi>(cufile_library_choice, "cuFile", load_from);
  return g;
}

}  // namespace

std::string cufile_log_path() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string ours = dir + "/deepio-cufile-" + std::to_string(::getuid()) + ".log";
  const char* set = std::getenv("CUFILE_LOGFILE_PATH");
  if (set != nullptr && *set != '\0' && ours != set) return {};
  return ours;
}

bool nvidia_fs_loaded() noexcept { return ::access("/proc/driver/nvidia-fs/version", F_OK) == 0; }

bool cufile_gds_unusable(CUfileOpError err) noexcept {
  if (cufile_unsupported(err)) return true;
  switch (err) {
    case 5004:  // CU_FILE_DRIVER_VERSION_MISMATCH
    case 5005:  // CU_FILE_DRIVER_VERSION_READ_ERROR
    case 5006:  // CU_FILE_DRIVER_CLOSING
    case CU_FILE_CUDA_MEMORY_TYPE_INVALID:
    case 5016:  // CU_FILE_INVALID_MAPPING_SIZE
    case CU_FILE_PERMISSION_DENIED:
    case CU_FILE_HANDLE_NOT_REGISTERED:
    case 5029:  // CU_FILE_DEVICE_NOT_FOUND
    case CU_FILE_INTERNAL_ERROR:
    case 5031:  // CU_FILE_GETNEWFD_FAILED
    case 5033:  // CU_FILE_NVFS_SETUP_ERROR
    case 5036:  // CU_FILE_GPU_MEMORY_PINNING_FAILED
      return true;
    default: return false;
  }
}

bool cufile_unsupported(CUfileOpError err) noexcept {
  switch (err) {
    case CU_FILE_DRIVER_NOT_INITIALIZED:
    case CU_FILE_PLATFORM_NOT_SUPPORTED:
    case CU_FILE_IO_NOT_SUPPORTED:
    case CU_FILE_DEVICE_NOT_SUPPORTED:
    case CU_FILE_NVFS_DRIVER_ERROR:
    case CU_FILE_INVALID_FILE_TYPE:
    case CU_FILE_INVALID_FILE_OPEN_FLAG:
    case 5020:  // CU_FILE_DIO_NOT_SET
    case CU_FILE_IO_DISABLED: return true;
    default: return false;
  }
}

CuFileApi* cufile_mutable(Status* why) noexcept {
  Global& g = global();
  if (why != nullptr && g.api == nullptr) {
    try {
      *why = g.why;
    } catch (...) {
      why->errnum = g.why.errnum;
    }
  }
  return g.api.get();
}

const CuFileApi* cufile(Status* why) noexcept { return cufile_mutable(why); }

std::unique_ptr<CuFileApi> load_cufile(const std::string& library, Status* why) { return load_from({library}, why); }

std::string cufile_error_text(const CudaApi* cuda_api, CUfileError_t e) {
  const char* name = op_error_name(e.err);
  std::string s = name != nullptr ? std::string(name) : "cuFile error " + std::to_string(e.err);
  if (e.err == CU_FILE_CUDA_DRIVER_ERROR) s += " (" + cuda_error_text(cuda_api, e.cu_err) + ")";
  return s;
}

Status cufile_status(const CudaApi* cuda_api, CUfileError_t e, const char* what) {
  return Status::failure(op_error_errno(e.err), std::string(what) + ": " + cufile_error_text(cuda_api, e));
}

Status cufile_io_status(const CudaApi* cuda_api, ssize_t result, int saved_errno, const char* what) {
  if (result == -1) {
    const int errnum = saved_errno != 0 ? saved_errno : EIO;
    return Status::failure(errnum, std::string(what) + ": file system error (errno " + std::to_string(errnum) + ")");
  }
  const auto code = static_cast<CUfileOpError>(-result);
  return cufile_status(cuda_api, CUfileError_t{code, CUDA_SUCCESS}, what);
}

Status DriverRef::acquire(CuFileApi* api, const CudaApi* cuda_api, std::size_t max_direct_io_kib, DriverRef* out,
                          bool allow_compat) {
  if (api == nullptr) return Status::failure(ENOTSUP, "cuFile not loaded");
  std::lock_guard lock(api->driver_mutex);
  if (api->driver_refs == 0) {
    std::string note;
    if (allow_compat) {
      // Staged before the driver opens; no configuration file, no environment variable.
      if (api->cuFileSetParameterBool == nullptr) {
        note = "cuFile has no parameter API: its compatibility mode is as its configuration says";
      } else if (const CUfileError_t p = api->cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true);
                 p.err != CU_FILE_SUCCESS) {
        note = "cuFile refused to allow its compatibility mode: " + cufile_error_text(cuda_api, p);
      }
    }
    // cuFile writes cufile.log into the working directory unless told otherwise: pointed
    // elsewhere unless the user chose (CUFILE_LOGFILE_PATH). A refusal only costs the note.
    if (const std::string log = cufile_log_path(); !log.empty() && api->cuFileSetParameterString != nullptr) {
      if (const CUfileError_t p = api->cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH, log.c_str());
          p.err != CU_FILE_SUCCESS) {
        note += (note.empty() ? "" : "; ") + std::string("cuFile refused the log file ") + log + ": " +
                cufile_error_text(cuda_api, p);
      }
    }
    const CUfileError_t e = api->cuFileDriverOpen();
    if (e.err != CU_FILE_SUCCESS) return cufile_status(cuda_api, e, "cuFileDriverOpen");
    ++api->driver_opens;
    api->driver_note = note;
    if (max_direct_io_kib > 0 && api->cuFileDriverSetMaxDirectIOSize != nullptr) {
      const CUfileError_t s = api->cuFileDriverSetMaxDirectIOSize(max_direct_io_kib);
      if (s.err != CU_FILE_SUCCESS) {
        api->driver_note += (api->driver_note.empty() ? "" : "; ") + std::string("cuFileDriverSetMaxDirectIOSize(") +
                            std::to_string(max_direct_io_kib) + " KiB) refused: " + cufile_error_text(cuda_api, s);
      }
    }
  }
  ++api->driver_refs;
  out->reset();
  out->api_ = api;
  return Status::success();
}

void DriverRef::reset() noexcept {
  if (api_ == nullptr) return;
  CuFileApi* api = api_;
  api_ = nullptr;
  std::lock_guard lock(api->driver_mutex);
  if (--api->driver_refs != 0) return;
  {
    // cuFile's registrations do not survive its driver: released first, as cuFile requires.
    // The buffers stay pinned in deepio's registry (and Python keeps their tensors) until
    // unpinned: a handle made later finds them, and pin_device_buffer registers them again.
    std::lock_guard reg_lock(api->buffers.mutex);
    for (auto& [base, entry] : api->buffers.entries) {
      if (entry.cufile_registered) {
        (void)api->cuFileBufDeregister(reinterpret_cast<const void*>(base));
        entry.cufile_registered = false;
      }
    }
  }
  // A close error leaves nothing to do: the library is unusable either way.
  (void)api->cuFileDriverClose();
}

}  // namespace deepio::detail::gpu
