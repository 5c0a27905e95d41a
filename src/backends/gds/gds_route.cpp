#include "backends/gds/gds_route.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>

#include "backends/gds/gds_file.hpp"

namespace deepio::detail::gpu {

GdsRoute::GdsRoute(const GdsOptions& options, const CudaApi* cuda_api, CuFileApi* cufile_api, const Status& cufile_why)
    : mode_setting_(options.mode), cuda_(cuda_api) {
  std::string reason;
  if (options.mode == GdsMode::Compat) {
    reason = "compatibility mode requested: POSIX I/O staged through host memory";
  } else if (cufile_api == nullptr) {
    const std::string why = cufile_why.message.empty() ? "cuFile not loaded" : cufile_why.message;
    if (options.mode == GdsMode::CuFile) throw_error(ENOTSUP, "GdsHandle (mode CuFile): " + why);
    reason = why + "; POSIX I/O staged through host memory";
  } else {
    Status st = DriverRef::acquire(cufile_api, cuda_, options.block_size / 1024, &driver_, /*allow_compat=*/true);
    if (!st.ok()) {
      if (options.mode == GdsMode::CuFile) throw_error(st.errnum, "GdsHandle: " + st.message);
      reason = st.message + "; POSIX I/O staged through host memory";
    } else {
      cufile_ = cufile_api;
      bool direct = nvidia_fs_loaded();
      if (cufile_->cuFileDriverGetProperties != nullptr) {
        CUfileDrvProps_t props{};
        if (cufile_->cuFileDriverGetProperties(&props).err == CU_FILE_SUCCESS) {
          direct = direct || props.nvfs.major_version > 0 ||
                   (props.nvfs.dstatusflags & (1u << CU_FILE_NVME_P2P_SUPPORTED_BIT)) != 0;
        }
      }
      if (!direct) {
        reason = "nvidia-fs not loaded and no P2PDMA support reported: cuFile runs in its compatibility mode";
      }
      std::lock_guard lock(cufile_->driver_mutex);
      if (!cufile_->driver_note.empty()) reason += (reason.empty() ? "" : "; ") + cufile_->driver_note;
      gds_ = direct;
    }
  }
  mode_reason_ = reason;
}

GdsRoute::~GdsRoute() {
  // Release the driver with a context current (cuFileBufDeregister of leftover pins may need
  // one) and the destroying thread's own context restored after, then the primary contexts
  // this route retained (once each), and only those.
  {
    ScopedContext guard;
    if (!contexts_.empty()) (void)ScopedContext::enter(cuda_, contexts_.begin()->second, &guard);
    driver_.reset();
  }
  for (auto& [ordinal, ctx] : contexts_) {
    CUdevice dev = 0;
    if (cuda_->cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS) (void)cuda_->cuDevicePrimaryCtxRelease(dev);
  }
}

Status GdsRoute::context(int ordinal, CUcontext* out) {
  std::lock_guard lock(contexts_mutex_);
  auto it = contexts_.find(ordinal);
  if (it != contexts_.end()) {
    *out = it->second;
    return Status::success();
  }
  CUdevice dev = 0;
  CUresult r = cuda_->cuDeviceGet(&dev, ordinal);
  if (r != CUDA_SUCCESS) return cuda_status(cuda_, r, "cuDeviceGet");
  CUcontext ctx = nullptr;
  r = cuda_->cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS) return cuda_status(cuda_, r, "cuDevicePrimaryCtxRetain");
  contexts_.emplace(ordinal, ctx);
  *out = ctx;
  return Status::success();
}

Status GdsRoute::make_current(int ordinal) {
  CUcontext ctx = nullptr;
  Status st = context(ordinal, &ctx);
  if (!st.ok()) return st;
  const CUresult r = cuda_->cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) return cuda_status(cuda_, r, "cuCtxSetCurrent");
  return Status::success();
}

Status GdsRoute::enter(int ordinal, ScopedContext* guard) {
  CUcontext ctx = nullptr;
  Status st = context(ordinal, &ctx);
  if (!st.ok()) return st;
  return ScopedContext::enter(cuda_, ctx, guard);
}

void GdsRoute::note_pin_refused(const std::string& why) {
  pins_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string text = why + ": pinned buffers are used unregistered";
  std::lock_guard lock(mode_mutex_);
  if (mode_reason_.find(text) == std::string::npos) mode_reason_ += (mode_reason_.empty() ? "" : "; ") + text;
}

void GdsRoute::note_io_fallback(const std::string& why) {
  std::lock_guard lock(mode_mutex_);
  if (gds_ || mode_reason_.find(why) == std::string::npos) mode_reason_ += (mode_reason_.empty() ? "" : "; ") + why;
  gds_ = false;
}

void GdsRoute::note_fallback(const std::string& why) {
  files_fallback_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mode_mutex_);
  if (gds_ || mode_reason_.find(why) == std::string::npos) mode_reason_ += (mode_reason_.empty() ? "" : "; ") + why;
  gds_ = false;
}

Status GdsRoute::bind(const DeviceBinding& what, bool* staged, std::shared_ptr<const DriverFile>* out) {
  const char* verb = what.write ? "GDS write" : "GDS read";
  const std::string& path = *what.path;
  const std::uintptr_t p = address(what.buf);
  auto file = std::make_shared<GdsFile>(this, what.device, what.fd);
  *staged = true;

  // Registration lookup, range-checked (DeepNVMe only checked the base). Per operation, also
  // on a file object.
  BufferRegistry& reg = registry();
  {
    std::lock_guard lock(reg.mutex);
    auto it = reg.entries.upper_bound(p);
    if (it != reg.entries.begin()) {
      --it;
      const std::uintptr_t base = it->first;
      if (p < base + it->second.nbytes) {
        if (what.nbytes > base + it->second.nbytes - p) {
          return Status::failure(EINVAL,
                                 std::string(verb) + ": buffer " + hex(p) + " + " + std::to_string(what.nbytes) +
                                     " bytes crosses the end of pinned buffer " + hex(base) + " (" +
                                     std::to_string(it->second.nbytes) + " bytes)",
                                 path, what.file_offset, what.nbytes);
        }
        ++it->second.in_flight;
        file->registry = &reg;
        file->registry_key = base;
        if (it->second.cufile_registered) file->base = base;
      }
    }
  }
  if (cufile_ == nullptr) {
    *out = std::move(file);  // staged; the buffer stays marked in use until the op completes
    return Status::success();
  }

  std::shared_ptr<const GdsRegistration> registration;
  if (what.slot != nullptr) {
    // A file object: registered on its first device operation, under its slot's lock (two
    // first operations at once make one registration), and reused by every later one. A
    // failure (an error, not Auto's refusal) is not kept: the next operation asks again.
    std::lock_guard lock(what.slot->mutex);
    if (what.slot->route == this && what.slot->state) {
      auto known = std::static_pointer_cast<const GdsRegistration>(what.slot->state);
      if (known->fd() == what.fd) {
        registration = std::move(known);
        if (registration->fh == nullptr) {
          // Refused for this file already (Auto): staged without asking cuFile again.
          registrations_skipped_.fetch_add(1, std::memory_order_relaxed);
          note_fallback(registration->refused);
        }
      }
    }
    if (!registration && what.slot->route == nullptr) {
      Status st = register_file(what, &registration);
      if (!st.ok()) return st;
      what.slot->route = this;
      what.slot->state = registration;
    }
  }
  if (!registration) {
    Status st = register_file(what, &registration);  // a path operation's own
    if (!st.ok()) return st;
  }
  if (registration->fh != nullptr) {
    file->fh = registration->fh;
    *staged = false;
  }
  file->registration = std::move(registration);
  *out = std::move(file);
  return Status::success();
}

Status GdsRoute::register_file(const DeviceBinding& what, std::shared_ptr<const GdsRegistration>* out) {
  const char* verb = what.write ? "GDS write" : "GDS read";
  const std::string& path = *what.path;
  auto registration = std::make_shared<GdsRegistration>(shared_from_this(), what.device, what.fd);
  // A file system cuFile already refused (Auto): staged without asking cuFile again.
  struct stat sb {};
  const bool fs_known = mode_setting_ == GdsMode::Auto && ::fstat(what.fd, &sb) == 0;
  if (fs_known) {
    std::string refused;
    {
      std::lock_guard lock(refused_mutex_);
      auto it = refused_fs_.find(sb.st_dev);
      if (it != refused_fs_.end()) refused = it->second;
    }
    if (!refused.empty()) {
      registrations_skipped_.fetch_add(1, std::memory_order_relaxed);
      note_fallback(refused);
      registration->refused = std::move(refused);
      *out = std::move(registration);
      return Status::success();
    }
  }
  ScopedContext guard;
  Status st = enter(what.device, &guard);
  if (!st.ok())
    return Status::failure(st.errnum, std::string(verb) + ": " + st.message, path, what.file_offset, what.nbytes);
  CUfileDescr_t descr{};
  descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  descr.handle.fd = what.fd;
  descr.fs_ops = nullptr;
  CUfileHandle_t fh = nullptr;
  const CUfileError_t e = cufile_->cuFileHandleRegister(&fh, &descr);
  if (e.err != CU_FILE_SUCCESS) {
    const Status rs = cufile_status(cuda_, e, "cuFileHandleRegister");
    if (mode_setting_ != GdsMode::Auto || !cufile_gds_unusable(e.err)) {
      return Status::failure(rs.errnum, std::string(verb) + ": " + rs.message, path, what.file_offset, what.nbytes);
    }
    std::string why = rs.message + " for '" + path + "'";
    if (fs_known) {
      // Remembered per file system: every later file on it is staged without a registration
      // attempt (each would fail the same way, and on some drivers log the failure).
      why += ": files on its file system (device " + std::to_string(major(sb.st_dev)) + ":" +
             std::to_string(minor(sb.st_dev)) + ") are staged through host memory";
      std::lock_guard lock(refused_mutex_);
      refused_fs_.emplace(sb.st_dev, why);
    } else {
      why += ": staged through host memory";
    }
    note_fallback(why);
    registration->refused = std::move(why);
    *out = std::move(registration);
    return Status::success();
  }
  registration->fh = fh;
  *out = std::move(registration);
  return Status::success();
}

void GdsRoute::deregister(CUfileHandle_t fh, int ordinal) noexcept {
  if (fh == nullptr) return;
  ScopedContext guard;
  (void)enter(ordinal, &guard);
  cufile_->cuFileHandleDeregister(fh);
}

void GdsRoute::release(BufferRegistry* reg, std::uintptr_t key) noexcept {
  if (reg != nullptr) {
    std::lock_guard lock(reg->mutex);
    auto it = reg->entries.find(key);
    if (it != reg->entries.end() && it->second.in_flight > 0) --it->second.in_flight;
  }
}

std::string GdsRoute::mode() const {
  std::lock_guard lock(mode_mutex_);
  return gds_ ? "gds" : "compat";
}

std::string GdsRoute::mode_reason() const {
  std::lock_guard lock(mode_mutex_);
  return mode_reason_;
}

}  // namespace deepio::detail::gpu
