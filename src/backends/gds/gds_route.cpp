#include "backends/gds/gds_route.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "backends/sync_backend.hpp"

namespace deepio::detail::gpu {

namespace {

// Registrations made while cuFile is absent (staging only): same bookkeeping, no cuFile
// calls. Process-wide like cuFile's own.
BufferRegistry& staging_registry() {
  static BufferRegistry registry;
  return registry;
}

std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// One descriptor's cuFile registration: the handle cuFileHandleRegister gave (null: Auto's
// refusal, `refused` saying why: the file is staged). A path operation owns one for itself;
// a file object's is kept in its RouteFileSlot and shared by each of its operations. The
// handle is deregistered when the last holder drops it: the operation (path) or the file
// object (SharedFile), in both cases before the descriptor closes. It holds the route, so
// cuFile's driver stays open while a file object outlives its handle.
class GdsRegistration final {
 public:
  GdsRegistration(std::shared_ptr<GdsRoute> route, int ordinal, int fd)
      : route_(std::move(route)), ordinal_(ordinal), fd_(fd), pid_(::getpid()) {}
  ~GdsRegistration() {
    if (::getpid() != pid_) {
      // A forked child's copy: cuFile and CUDA are the parent's; leaked, as GdsHandle does.
      (void)new std::shared_ptr<GdsRoute>(std::move(route_));
      return;
    }
    route_->deregister(fh, ordinal_);
  }
  GdsRegistration(const GdsRegistration&) = delete;
  GdsRegistration& operator=(const GdsRegistration&) = delete;

  [[nodiscard]] int fd() const noexcept { return fd_; }

  CUfileHandle_t fh = nullptr;
  std::string refused;  ///< Auto's refusal (fh null): the reason, said again for every op

 private:
  std::shared_ptr<GdsRoute> route_;
  int ordinal_;  // the device whose context was current at registration
  int fd_;       // the registered descriptor (outlives this object)
  pid_t pid_;    // the process that registered it
};

namespace {

// One operation's binding: the file's registration (null or without a handle when staged)
// and the pinned buffer it uses (if any). Ends its use of them when the engine drops it,
// after the operation's last request, before the operation's descriptors close. After a
// cuFile failure at I/O time (Auto), the route's backend stages the operation's remaining
// requests itself, through a descriptor without O_DIRECT made here on first use.
class GdsFile final : public DriverFile {
 public:
  GdsFile(GdsRoute* route, int ordinal, int fd) : route_(route), ordinal_(ordinal), fd_(fd) {}
  ~GdsFile() override {
    route_->release(registry, registry_key);
    registration.reset();  // a path operation's own: deregistered here
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
  }
  GdsFile(const GdsFile&) = delete;
  GdsFile& operator=(const GdsFile&) = delete;

  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }

  /// A descriptor of the file for pread/pwrite at any offset into any buffer: the engine's own
  /// when it lacks O_DIRECT, else the same file reopened without it (kept until the end).
  Status posix_fd(int* out) const {
    std::lock_guard lock(fd_mutex_);
    if (buffered_fd_ >= 0) {
      *out = buffered_fd_;
      return Status::success();
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) {
      const int e = errno;
      return Status::failure(e, std::string("fcntl(F_GETFL): ") + std::strerror(e));
    }
    if ((flags & O_DIRECT) == 0) {
      *out = fd_;
      return Status::success();
    }
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    const int fd = ::open(self.c_str(), (flags & O_ACCMODE) | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      return Status::failure(e, std::string("reopening the file without O_DIRECT: ") + std::strerror(e));
    }
    buffered_fd_ = fd;
    *out = fd;
    return Status::success();
  }

  /// The file's registration: without a handle when Auto stages the file; null without cuFile.
  std::shared_ptr<const GdsRegistration> registration;
  CUfileHandle_t fh = nullptr;
  std::uintptr_t base = 0;  ///< registered buffer base, 0: unregistered (cuFile bounces)
  BufferRegistry* registry = nullptr;
  std::uintptr_t registry_key = 0;
  /// Set by the backend when cuFile failed on this operation: its other requests are staged.
  mutable std::atomic<bool> staged_io{false};

  /// The cuFile error that made the operation staged (for the messages of staged failures).
  void set_cause(std::string why) const {
    std::lock_guard lock(fd_mutex_);
    cause_ = std::move(why);
  }
  [[nodiscard]] std::string cause() const {
    std::lock_guard lock(fd_mutex_);
    return cause_;
  }

 private:
  GdsRoute* route_;
  int ordinal_;
  int fd_;  // the engine's descriptor (outlives this object)
  mutable std::mutex fd_mutex_;
  mutable int buffered_fd_ = -1;  // guarded by fd_mutex_
  mutable std::string cause_;     // guarded by fd_mutex_
};

// The synchronous cuFile backend of one route worker.
class GdsBackend final : public SyncBackend {
 public:
  GdsBackend(std::shared_ptr<GdsRoute> route, CuFileApi* api) : route_(std::move(route)), api_(api) {}

  [[nodiscard]] const char* name() const noexcept override { return "cufile"; }

  std::string take_error_text(std::uint64_t tag) override {
    auto it = errors_.find(tag);
    if (it == errors_.end()) return {};
    std::string text = std::move(it->second);
    errors_.erase(it);
    return text;
  }

 private:
  std::int64_t fail(const Request& r, Status st) {
    errors_[r.tag] = std::move(st.message);
    return -static_cast<std::int64_t>(st.errnum != 0 ? st.errnum : EIO);
  }

  std::int64_t run(const Request& r) override {
    const auto& f = static_cast<const GdsFile&>(*r.driver_file);
    if (f.ordinal() != current_) {
      Status st = route_->make_current(f.ordinal());
      if (!st.ok()) return fail(r, std::move(st));
      current_ = f.ordinal();
    }
    if (f.staged_io.load(std::memory_order_relaxed)) return staged(r, f);
    const std::uintptr_t p = address(r.buf);
    const std::uintptr_t base = f.base != 0 ? f.base : p;
    const auto base_offset = static_cast<off_t>(p - base);
    const auto file_offset = static_cast<off_t>(r.offset);
    errno = 0;
    const ssize_t n = r.write ? api_->cuFileWrite(f.fh, reinterpret_cast<const void*>(base), r.len, file_offset,
                                                  base_offset)
                              : api_->cuFileRead(f.fh, reinterpret_cast<void*>(base), r.len, file_offset, base_offset);
    const int saved = errno;
    if (n >= 0) return n;
    Status st = cufile_io_status(route_->cuda(), n, saved, r.write ? "cuFileWrite" : "cuFileRead");
    // A cuFile error (not a file system errno) in Auto: this request, and the rest of its
    // operation, are staged through host memory instead of failing the operation. A failure
    // of the staged request is reported as such, naming the cuFile error that led to it.
    if (n != -1 && route_->stages_failed_io()) {
      f.set_cause(st.message);
      f.staged_io.store(true, std::memory_order_relaxed);
      route_->note_io_fallback(st.message + ": requests staged through host memory");
      return staged(r, f);
    }
    return fail(r, std::move(st));
  }

  // One request through host memory, on this worker thread (whose context is the buffer's):
  // device -> host copy and pwrite, or pread and host -> device copy. Returns the byte count
  // (short counts go back to the worker, which resubmits the rest) or -errno.
  std::int64_t staged(const Request& r, const GdsFile& f) {
    const char* verb = r.write ? "staged pwrite" : "staged pread";
    const std::string cause = f.cause();
    const std::string after = cause.empty() ? std::string() : " (after " + cause + ")";
    int fd = -1;
    Status st = f.posix_fd(&fd);
    if (!st.ok()) return fail(r, Status::failure(st.errnum, std::string(verb) + ": " + st.message + after));
    if (bounce_.size() < r.len) {
      try {
        bounce_.resize(r.len);
      } catch (const std::bad_alloc&) {
        return fail(r, Status::failure(ENOMEM, std::string(verb) + ": no memory for a staging buffer" + after));
      }
    }
    const CudaApi* cu = route_->cuda();
    const auto dev = static_cast<CUdeviceptr>(address(r.buf));
    ssize_t n = 0;
    if (r.write) {
      if (const CUresult c = cu->cuMemcpyDtoH(bounce_.data(), dev, r.len); c != CUDA_SUCCESS) {
        Status cs = cuda_status(cu, c, "cuMemcpyDtoH (staged write)");
        cs.message += after;
        return fail(r, std::move(cs));
      }
      n = ::pwrite(fd, bounce_.data(), r.len, static_cast<off_t>(r.offset));
    } else {
      n = ::pread(fd, bounce_.data(), r.len, static_cast<off_t>(r.offset));
    }
    if (n < 0) {
      const int e = errno;
      return fail(r, Status::failure(e, std::string(verb) + ": " + std::strerror(e) + after));
    }
    if (!r.write && n > 0) {
      if (const CUresult c = cu->cuMemcpyHtoD(dev, bounce_.data(), static_cast<std::size_t>(n)); c != CUDA_SUCCESS) {
        Status cs = cuda_status(cu, c, "cuMemcpyHtoD (staged read)");
        cs.message += after;
        return fail(r, std::move(cs));
      }
    }
    route_->count_io_fallback(static_cast<std::uint64_t>(n));
    return n;
  }

  std::shared_ptr<GdsRoute> route_;
  CuFileApi* api_;
  int current_ = -1;  // device whose context is current on this worker thread
  std::unordered_map<std::uint64_t, std::string> errors_;
  std::vector<std::byte> bounce_;  // host memory for staged requests, grown on first use
};

}  // namespace

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

std::unique_ptr<Backend> GdsRoute::make_backend() { return std::make_unique<GdsBackend>(shared_from_this(), cufile_); }

BufferRegistry& GdsRoute::registry() noexcept { return cufile_ != nullptr ? cufile_->buffers : staging_registry(); }

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

bool GdsRoute::pin(void* p, std::size_t nbytes) {
  const std::uintptr_t a = address(p);
  if (nbytes == 0) throw_error(EINVAL, "pin_device_buffer: nbytes is 0");
  const DevicePointer where = classify(cuda_, p);
  if (!where.is_device) throw_error(EINVAL, "pin_device_buffer: " + hex(a) + " is not CUDA device memory");
  BufferRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto next = reg.entries.lower_bound(a);
  if (next != reg.entries.end() && next->first == a && next->second.nbytes == nbytes) {
    // Pinned already. Kept from before the cuFile driver last closed, it is registered again.
    if (cufile_ != nullptr && !next->second.cufile_registered && next->second.in_flight == 0) {
      ScopedContext guard;
      if (enter(where.ordinal, &guard).ok() && cufile_->cuFileBufRegister(p, nbytes, 0).err == CU_FILE_SUCCESS) {
        next->second.cufile_registered = true;
      }
    }
    return true;
  }
  if (next != reg.entries.end() && next->first < a + nbytes) {
    throw_error(EEXIST, "pin_device_buffer: " + hex(a) + " overlaps pinned buffer " + hex(next->first));
  }
  if (next != reg.entries.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.nbytes > a) {
      throw_error(EEXIST, "pin_device_buffer: " + hex(a) + " overlaps pinned buffer " + hex(prev->first));
    }
  }
  BufferRegistry::Entry entry;
  entry.nbytes = nbytes;
  entry.ordinal = where.ordinal;
  if (cufile_ != nullptr) {
    ScopedContext guard;
    Status st = enter(where.ordinal, &guard);
    if (!st.ok()) throw_error(st.errnum, "pin_device_buffer: " + st.message);
    const CUfileError_t e = cufile_->cuFileBufRegister(p, nbytes, 0);
    if (e.err == CU_FILE_SUCCESS) {
      entry.cufile_registered = true;
    } else {
      st = cufile_status(cuda_, e, "cuFileBufRegister");
      if (mode_setting_ != GdsMode::Auto || !cufile_gds_unusable(e.err)) {
        throw_error(st.errnum, "pin_device_buffer: " + st.message, {}, 0, nbytes);
      }
      // Recorded unregistered: I/O on it still works (cuFile's own bounce buffers, or staging).
      note_pin_refused(st.message);
    }
  }
  reg.entries.emplace(a, entry);
  return true;
}

bool GdsRoute::unpin(void* p) {
  BufferRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.entries.find(address(p));
  if (it == reg.entries.end()) return false;
  if (it->second.in_flight != 0) {
    throw_error(EBUSY, "unpin_device_buffer: " + std::to_string(it->second.in_flight) + " operation(s) on " +
                           hex(it->first) + " still in flight");
  }
  if (it->second.cufile_registered) {
    ScopedContext guard;
    Status st = enter(it->second.ordinal, &guard);
    if (!st.ok()) throw_error(st.errnum, "unpin_device_buffer: " + st.message);
    const CUfileError_t e = cufile_->cuFileBufDeregister(p);
    if (e.err != CU_FILE_SUCCESS) {
      st = cufile_status(cuda_, e, "cuFileBufDeregister");
      throw_error(st.errnum, "unpin_device_buffer: " + st.message);
    }
  }
  reg.entries.erase(it);
  return true;
}

void* GdsRoute::new_pinned(std::size_t nbytes, int device) {
  if (nbytes == 0) throw_error(EINVAL, "new_pinned_device_buffer: nbytes is 0");
  ScopedContext guard;
  Status st = enter(device, &guard);
  if (!st.ok()) throw_error(st.errnum, "new_pinned_device_buffer: " + st.message);
  CUdeviceptr ptr = 0;
  const CUresult r = cuda_->cuMemAlloc(&ptr, nbytes);
  if (r != CUDA_SUCCESS) {
    st = cuda_status(cuda_, r, "cuMemAlloc");
    throw_error(st.errnum, "new_pinned_device_buffer: " + st.message, {}, 0, nbytes);
  }
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
  try {
    pin(p, nbytes);
  } catch (...) {
    (void)cuda_->cuMemFree(ptr);
    throw;
  }
  return p;
}

bool GdsRoute::free_pinned(void* p) {
  const DevicePointer where = classify(cuda_, p);
  if (!unpin(p)) return false;
  ScopedContext guard;
  if (where.is_device) (void)enter(where.ordinal, &guard);
  const CUresult r = cuda_->cuMemFree(static_cast<CUdeviceptr>(address(p)));
  if (r != CUDA_SUCCESS) {
    const Status st = cuda_status(cuda_, r, "cuMemFree");
    throw_error(st.errnum, "free_pinned_device_buffer: " + st.message);
  }
  return true;
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
