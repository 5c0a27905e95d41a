// GdsEngine: DeepNVMe's gds_handle without its process-fatal paths.
//
// Lifecycle: the constructor validates options, takes a DriverRef (first one in the process
// opens the cuFile driver), decides the initial mode, and starts intra_op_parallelism
// workers. An operation is prepared on the submitting thread (classify the pointer, resolve
// a pinned registration with a range check, open the file, register it with cuFile or fall
// back to staging), cut into block_size chunks, and queued. Workers run chunks in any order;
// the worker finishing an operation's last chunk deregisters its cuFile handle, releases the
// buffer registration and closes the file, then marks it done.
//
// Errors: submission errors throw at once; chunk errors are recorded per operation (first
// one kept, with path, file offset and size of the chunk) and thrown by wait(). Partial
// transfers are continued until the chunk is complete; a read returning 0 is an unexpected
// end of file (ENODATA), a write returning 0 is EIO.
//
// Thread safety: ops_mutex_ guards pending_; queue_mutex_ guards queue_ and stop_; each Op's
// mutex guards its error and done flag; contexts_mutex_ guards contexts_; registry entries are
// guarded by their registry's mutex. Stats are relaxed atomics.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/gds_engine.hpp"
#include "memory/aligned.hpp"
#include "platform/fd.hpp"
#include "platform/sys.hpp"

namespace deepio::detail::gpu {

namespace {

// Registrations made while cuFile is absent (deepio's staging path): same bookkeeping, no
// cuFile calls. Process-wide like cuFile's own.
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

bool nvidia_fs_loaded() noexcept { return ::access("/proc/driver/nvidia-fs/version", F_OK) == 0; }

class GdsEngine {
 public:
  GdsEngine(const GdsOptions& options, const CudaApi* cuda_api, CuFileApi* cufile_api,
            const Status& cufile_why);
  ~GdsEngine();
  GdsEngine(const GdsEngine&) = delete;
  GdsEngine& operator=(const GdsEngine&) = delete;

  void submit(bool write, std::uintptr_t device, std::size_t nbytes, const std::string& path,
              std::uint64_t file_offset);
  std::size_t wait();
  std::size_t pending() const noexcept;
  bool pin(void* p, std::size_t nbytes);
  bool unpin(void* p);
  void* new_pinned(std::size_t nbytes, int device);
  bool free_pinned(void* p);
  std::string mode() const;
  std::string mode_reason() const;
  const GdsOptions& options() const noexcept { return options_; }
  GdsStats stats() const noexcept;

 private:
  struct Op {
    bool write = false;
    std::uintptr_t device = 0;  // caller's pointer
    std::size_t nbytes = 0;
    std::string path;
    std::uint64_t file_offset = 0;
    int ordinal = 0;
    UniqueFd fd;
    CUfileHandle_t fh = nullptr;       // null: staged path
    std::uintptr_t base = 0;           // cuFile buffer base (registration base or device)
    std::uintptr_t base_offset = 0;    // device - base
    BufferRegistry* registry = nullptr;  // registration in use, released at finish
    std::uintptr_t registry_key = 0;
    std::atomic<std::size_t> chunks_left{0};

    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;  // guarded by mutex
    Status error;       // guarded by mutex; first failure
  };
  struct Chunk {
    std::shared_ptr<Op> op;
    std::uint64_t rel = 0;  // offset inside the op
    std::size_t nbytes = 0;
  };
  struct Staging {  // one worker's host buffer for the staged path
    AlignedBuffer buffer;
    bool registered = false;  // cuMemHostRegister succeeded
  };

  BufferRegistry& registry() noexcept { return cufile_ != nullptr ? cufile_->buffers : staging_registry(); }
  Status context_for(int ordinal, CUcontext* out);
  Status make_current(int ordinal);
  void worker_main();
  Status run_cufile(const Chunk& c);
  Status run_staged(const Chunk& c, Staging* staging);
  void finish_chunk(const Chunk& c, Status st);
  void release(Op& op) noexcept;
  void finish_op(Op& op) noexcept;
  void note_fallback(const std::string& why);

  GdsOptions options_;
  const CudaApi* cuda_;
  CuFileApi* cufile_;  // null when cuFile is not used at all
  DriverRef driver_;

  mutable std::mutex mode_mutex_;
  bool gds_ = false;          // guarded by mode_mutex_
  std::string mode_reason_;   // guarded by mode_mutex_

  std::mutex contexts_mutex_;
  std::map<int, CUcontext> contexts_;  // retained primary contexts, guarded

  mutable std::mutex ops_mutex_;
  std::vector<std::shared_ptr<Op>> pending_;  // guarded by ops_mutex_

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Chunk> queue_;  // guarded by queue_mutex_
  bool stop_ = false;        // guarded by queue_mutex_
  std::vector<std::thread> workers_;

  std::atomic<std::uint64_t> ops_completed_{0}, ops_failed_{0}, chunks_{0}, bytes_cufile_{0},
      bytes_staged_{0}, files_fallback_{0};
};

GdsEngine::GdsEngine(const GdsOptions& options, const CudaApi* cuda_api, CuFileApi* cufile_api,
                     const Status& cufile_why)
    : options_(options), cuda_(cuda_api), cufile_(nullptr) {
  if (options.block_size == 0 || options.queue_depth == 0 || options.intra_op_parallelism == 0) {
    throw_error(EINVAL, "GdsHandle: block_size, queue_depth and intra_op_parallelism must be > 0");
  }
  std::string reason;
  if (options.mode == GdsMode::Compat) {
    reason = "compatibility mode requested: POSIX I/O staged through host memory";
  } else if (cufile_api == nullptr) {
    const std::string why = cufile_why.message.empty() ? "cuFile not loaded" : cufile_why.message;
    if (options.mode == GdsMode::CuFile) throw_error(ENOTSUP, "GdsHandle (mode CuFile): " + why);
    reason = why + "; POSIX I/O staged through host memory";
  } else {
    Status st = DriverRef::acquire(cufile_api, cuda_, options.block_size / 1024, &driver_);
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
        reason = "nvidia-fs not loaded and no P2PDMA support reported: cuFile runs in its "
                 "compatibility mode";
      }
      std::lock_guard lock(cufile_->driver_mutex);
      if (!cufile_->driver_note.empty()) {
        reason += (reason.empty() ? "" : "; ") + cufile_->driver_note;
      }
      gds_ = direct;
    }
  }
  mode_reason_ = reason;
  workers_.reserve(options.intra_op_parallelism);
  try {
    for (std::size_t i = 0; i < options.intra_op_parallelism; ++i) {
      workers_.emplace_back([this] { worker_main(); });
    }
  } catch (...) {
    {
      std::lock_guard lock(queue_mutex_);
      stop_ = true;
    }
    queue_cv_.notify_all();
    for (auto& t : workers_) t.join();
    throw;
  }
}

GdsEngine::~GdsEngine() {
  // Drain: every queued chunk runs (writes are never abandoned), then the workers stop.
  {
    std::lock_guard lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  for (auto& t : workers_) t.join();
  std::vector<std::shared_ptr<Op>> left;
  {
    std::lock_guard lock(ops_mutex_);
    left.swap(pending_);
  }
  left.clear();
  // Release the driver with a context current (cuFileBufDeregister of leftover pins may need
  // one), then the retained primary contexts.
  if (!contexts_.empty()) (void)cuda_->cuCtxSetCurrent(contexts_.begin()->second);
  driver_.reset();
  for (auto& [ordinal, ctx] : contexts_) {
    CUdevice dev = 0;
    if (cuda_->cuDeviceGet(&dev, ordinal) == CUDA_SUCCESS) (void)cuda_->cuDevicePrimaryCtxRelease(dev);
  }
}

Status GdsEngine::context_for(int ordinal, CUcontext* out) {
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

Status GdsEngine::make_current(int ordinal) {
  CUcontext ctx = nullptr;
  Status st = context_for(ordinal, &ctx);
  if (!st.ok()) return st;
  const CUresult r = cuda_->cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) return cuda_status(cuda_, r, "cuCtxSetCurrent");
  return Status::success();
}

void GdsEngine::note_fallback(const std::string& why) {
  files_fallback_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mode_mutex_);
  if (gds_ || mode_reason_.find(why) == std::string::npos) {
    mode_reason_ += (mode_reason_.empty() ? "" : "; ") + why;
  }
  gds_ = false;
}

void GdsEngine::submit(bool write, std::uintptr_t device, std::size_t nbytes,
                       const std::string& path, std::uint64_t file_offset) {
  auto op = std::make_shared<Op>();
  op->write = write;
  op->device = device;
  op->nbytes = nbytes;
  op->path = path;
  op->file_offset = file_offset;
  const char* verb = write ? "GDS write" : "GDS read";
  if (nbytes == 0) {
    op->done = true;
    ops_completed_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(ops_mutex_);
    pending_.push_back(std::move(op));
    return;
  }
  const DevicePointer where = classify(cuda_, reinterpret_cast<const void*>(device));
  if (!where.is_device) {
    throw_error(EINVAL, std::string(verb) + ": buffer " + hex(device) + " is not CUDA device memory",
                path, file_offset, nbytes);
  }
  op->ordinal = where.ordinal;

  // Registration lookup, range-checked (DeepNVMe only checked the base).
  BufferRegistry& reg = registry();
  {
    std::lock_guard lock(reg.mutex);
    auto it = reg.entries.upper_bound(device);
    if (it != reg.entries.begin()) {
      --it;
      const std::uintptr_t base = it->first;
      if (device < base + it->second.nbytes) {
        if (nbytes > base + it->second.nbytes - device) {
          throw_error(EINVAL, std::string(verb) + ": buffer " + hex(device) + " + " +
                                  std::to_string(nbytes) + " bytes crosses the end of pinned buffer " +
                                  hex(base) + " (" + std::to_string(it->second.nbytes) + " bytes)",
                      path, file_offset, nbytes);
        }
        ++it->second.in_flight;
        op->registry = &reg;
        op->registry_key = base;
        if (it->second.cufile_registered) {
          op->base = base;
          op->base_offset = device - base;
        }
      }
    }
  }
  if (op->base == 0) op->base = device;  // unregistered: cuFile uses its own bounce buffers

  // From here on the op owns resources; finish_op() releases them on every path.
  struct Guard {
    GdsEngine* self;
    Op* op;
    bool armed = true;
    ~Guard() {
      if (armed) self->release(*op);
    }
  } guard{this, op.get()};

  Status st = make_current(op->ordinal);
  if (!st.ok()) throw_error(st.errnum, std::string(verb) + ": " + st.message, path, file_offset, nbytes);

  const int access = write ? (O_WRONLY | O_CREAT) : O_RDONLY;
  bool try_cufile = cufile_ != nullptr;
  if (try_cufile) {
    st = open_file(path, access | O_CLOEXEC | O_DIRECT, 0666, &op->fd);
    if (!st.ok() && st.errnum == EINVAL) st = open_file(path, access | O_CLOEXEC, 0666, &op->fd);
  } else {
    st = open_file(path, access | O_CLOEXEC, 0666, &op->fd);
  }
  if (!st.ok()) throw_error(st.errnum, std::string(verb) + ": cannot open", path, file_offset, nbytes);
  if (!write) {
    struct stat sb {};
    if (::fstat(op->fd.get(), &sb) != 0) {
      throw_error(errno, std::string(verb) + ": fstat failed", path, file_offset, nbytes);
    }
    const auto size = static_cast<std::uint64_t>(sb.st_size);
    if (file_offset > size || nbytes > size - file_offset) {
      throw_error(ENODATA, std::string(verb) + ": range lies past the end of the file (" +
                               std::to_string(size) + " bytes)",
                  path, file_offset, nbytes);
    }
  }
  if (try_cufile) {
    CUfileDescr_t descr{};
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    descr.handle.fd = op->fd.get();
    descr.fs_ops = nullptr;
    CUfileHandle_t fh = nullptr;
    const CUfileError_t e = cufile_->cuFileHandleRegister(&fh, &descr);
    if (e.err == CU_FILE_SUCCESS) {
      op->fh = fh;
    } else {
      const Status rs = cufile_status(cuda_, e, "cuFileHandleRegister");
      if (options_.mode != GdsMode::Auto || !cufile_unsupported(e.err)) {
        throw_error(rs.errnum, std::string(verb) + ": " + rs.message, path, file_offset, nbytes);
      }
      note_fallback(rs.message + " for '" + path + "': staged through host memory");
      // The staged path uses buffered I/O: reopen without O_DIRECT.
      UniqueFd plain;
      st = open_file(path, (write ? O_WRONLY : O_RDONLY) | O_CLOEXEC, 0666, &plain);
      if (!st.ok()) throw_error(st.errnum, std::string(verb) + ": cannot open", path, file_offset, nbytes);
      op->fd = std::move(plain);
    }
  }

  const std::size_t bs = options_.block_size;
  const std::size_t count = nbytes / bs + (nbytes % bs != 0 ? 1 : 0);
  op->chunks_left.store(count, std::memory_order_relaxed);
  std::deque<Chunk> chunks;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t rel = static_cast<std::uint64_t>(i) * bs;
    chunks.push_back(Chunk{op, rel, static_cast<std::size_t>(std::min<std::uint64_t>(bs, nbytes - rel))});
  }
  {
    std::lock_guard lock(ops_mutex_);
    pending_.push_back(op);
  }
  guard.armed = false;
  {
    std::lock_guard lock(queue_mutex_);
    for (auto& c : chunks) queue_.push_back(std::move(c));
  }
  queue_cv_.notify_all();
}

void GdsEngine::worker_main() {
  Staging staging;
  for (;;) {
    Chunk chunk;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stop_ and drained
      chunk = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = make_current(chunk.op->ordinal);
    if (st.ok()) st = chunk.op->fh != nullptr ? run_cufile(chunk) : run_staged(chunk, &staging);
    finish_chunk(chunk, std::move(st));
  }
  if (staging.registered) (void)cuda_->cuMemHostUnregister(staging.buffer.data());
}

Status GdsEngine::run_cufile(const Chunk& c) {
  const Op& op = *c.op;
  std::uint64_t done = 0;
  while (done < c.nbytes) {
    const std::uint64_t rel = c.rel + done;
    const std::size_t n = c.nbytes - static_cast<std::size_t>(done);
    const auto file_off = static_cast<off_t>(op.file_offset + rel);
    const auto buf_off = static_cast<off_t>(op.base_offset + rel);
    errno = 0;
    const ssize_t r = op.write
                          ? cufile_->cuFileWrite(op.fh, reinterpret_cast<const void*>(op.base), n, file_off, buf_off)
                          : cufile_->cuFileRead(op.fh, reinterpret_cast<void*>(op.base), n, file_off, buf_off);
    const int saved = errno;
    if (r < 0) {
      Status st = cufile_io_status(cuda_, r, saved, op.write ? "cuFileWrite" : "cuFileRead");
      st.offset = op.file_offset + rel;
      st.nbytes = n;
      return st;
    }
    if (r == 0) {
      return Status::failure(op.write ? EIO : ENODATA,
                             op.write ? "cuFileWrite made no progress" : "cuFileRead: unexpected end of file",
                             {}, op.file_offset + rel, n);
    }
    done += static_cast<std::uint64_t>(r);
    bytes_cufile_.fetch_add(static_cast<std::uint64_t>(r), std::memory_order_relaxed);
  }
  return Status::success();
}

Status GdsEngine::run_staged(const Chunk& c, Staging* staging) {
  const Op& op = *c.op;
  if (staging->buffer.data() == nullptr) {
    try {
      staging->buffer = AlignedBuffer(options_.block_size, page_size());
    } catch (const Error& e) {
      return Status::failure(e.errnum(), "cannot allocate a staging buffer", {}, 0, options_.block_size);
    }
    // Page-locked staging makes the copies DMA; refusal (RLIMIT_MEMLOCK) only slows them.
    staging->registered = cuda_->cuMemHostRegister(staging->buffer.data(), options_.block_size,
                                                   CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
  }
  std::byte* host = staging->buffer.data();
  const CUdeviceptr dev = op.device + c.rel;
  const std::uint64_t file_off = op.file_offset + c.rel;
  Status st;
  if (op.write) {
    const CUresult r = cuda_->cuMemcpyDtoH(host, dev, c.nbytes);
    if (r != CUDA_SUCCESS) st = cuda_status(cuda_, r, "cuMemcpyDtoH");
    else st = pwrite_full(op.fd.get(), host, c.nbytes, file_off, op.path);
  } else {
    st = pread_full(op.fd.get(), host, c.nbytes, file_off, op.path);
    if (st.ok()) {
      const CUresult r = cuda_->cuMemcpyHtoD(dev, host, c.nbytes);
      if (r != CUDA_SUCCESS) st = cuda_status(cuda_, r, "cuMemcpyHtoD");
    }
  }
  if (!st.ok()) {
    st.offset = file_off;
    st.nbytes = c.nbytes;
    return st;
  }
  bytes_staged_.fetch_add(c.nbytes, std::memory_order_relaxed);
  return st;
}

void GdsEngine::finish_chunk(const Chunk& c, Status st) {
  chunks_.fetch_add(1, std::memory_order_relaxed);
  Op& op = *c.op;
  if (!st.ok()) {
    st.path = op.path;
    std::lock_guard lock(op.mutex);
    if (op.error.ok()) op.error = std::move(st);
  }
  if (op.chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_op(op);
}

void GdsEngine::finish_op(Op& op) noexcept {
  release(op);
  {
    std::lock_guard lock(op.mutex);
    // Counted before done is published, so stats() after wait() includes this op.
    (op.error.ok() ? ops_completed_ : ops_failed_).fetch_add(1, std::memory_order_relaxed);
    op.done = true;
  }
  op.cv.notify_all();
}

void GdsEngine::release(Op& op) noexcept {
  if (op.fh != nullptr) {
    cufile_->cuFileHandleDeregister(op.fh);
    op.fh = nullptr;
  }
  if (op.registry != nullptr) {
    std::lock_guard lock(op.registry->mutex);
    auto it = op.registry->entries.find(op.registry_key);
    if (it != op.registry->entries.end() && it->second.in_flight > 0) --it->second.in_flight;
    op.registry = nullptr;
  }
  op.fd.reset();
}

std::size_t GdsEngine::wait() {
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard lock(ops_mutex_);
    ops.swap(pending_);
  }
  Status first;
  for (auto& op : ops) {
    std::unique_lock lock(op->mutex);
    op->cv.wait(lock, [&] { return op->done; });
    if (first.ok() && !op->error.ok()) first = op->error;
  }
  if (!first.ok()) {
    throw_error(first.errnum, first.message, first.path, first.offset, first.nbytes);
  }
  return ops.size();
}

std::size_t GdsEngine::pending() const noexcept {
  std::lock_guard lock(ops_mutex_);
  return pending_.size();
}

bool GdsEngine::pin(void* p, std::size_t nbytes) {
  const std::uintptr_t a = address(p);
  if (nbytes == 0) throw_error(EINVAL, "pin_device_buffer: nbytes is 0");
  const DevicePointer where = classify(cuda_, p);
  if (!where.is_device) throw_error(EINVAL, "pin_device_buffer: " + hex(a) + " is not CUDA device memory");
  BufferRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto next = reg.entries.lower_bound(a);
  if (next != reg.entries.end() && next->first == a && next->second.nbytes == nbytes) return true;
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
    Status st = make_current(where.ordinal);
    if (!st.ok()) throw_error(st.errnum, "pin_device_buffer: " + st.message);
    const CUfileError_t e = cufile_->cuFileBufRegister(p, nbytes, 0);
    if (e.err != CU_FILE_SUCCESS) {
      st = cufile_status(cuda_, e, "cuFileBufRegister");
      throw_error(st.errnum, "pin_device_buffer: " + st.message, {}, 0, nbytes);
    }
    entry.cufile_registered = true;
  }
  reg.entries.emplace(a, entry);
  return true;
}

bool GdsEngine::unpin(void* p) {
  BufferRegistry& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.entries.find(address(p));
  if (it == reg.entries.end()) return false;
  if (it->second.in_flight != 0) {
    throw_error(EBUSY, "unpin_device_buffer: " + std::to_string(it->second.in_flight) +
                           " operation(s) on " + hex(it->first) + " still in flight");
  }
  if (it->second.cufile_registered) {
    Status st = make_current(it->second.ordinal);
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

void* GdsEngine::new_pinned(std::size_t nbytes, int device) {
  if (nbytes == 0) throw_error(EINVAL, "new_pinned_device_buffer: nbytes is 0");
  Status st = make_current(device);
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

bool GdsEngine::free_pinned(void* p) {
  const DevicePointer where = classify(cuda_, p);
  if (!unpin(p)) return false;
  if (where.is_device) (void)make_current(where.ordinal);
  const CUresult r = cuda_->cuMemFree(static_cast<CUdeviceptr>(address(p)));
  if (r != CUDA_SUCCESS) {
    const Status st = cuda_status(cuda_, r, "cuMemFree");
    throw_error(st.errnum, "free_pinned_device_buffer: " + st.message);
  }
  return true;
}

std::string GdsEngine::mode() const {
  std::lock_guard lock(mode_mutex_);
  return gds_ ? "gds" : "compat";
}

std::string GdsEngine::mode_reason() const {
  std::lock_guard lock(mode_mutex_);
  return mode_reason_;
}

GdsStats GdsEngine::stats() const noexcept {
  GdsStats s;
  s.ops_completed = ops_completed_.load(std::memory_order_relaxed);
  s.ops_failed = ops_failed_.load(std::memory_order_relaxed);
  s.chunks = chunks_.load(std::memory_order_relaxed);
  s.bytes_cufile = bytes_cufile_.load(std::memory_order_relaxed);
  s.bytes_staged = bytes_staged_.load(std::memory_order_relaxed);
  s.files_fallback = files_fallback_.load(std::memory_order_relaxed);
  return s;
}

std::unique_ptr<GdsEngine> make_gds_engine(const GdsOptions& options, const CudaApi* cuda_api,
                                           const Status& cuda_why, CuFileApi* cufile_api,
                                           const Status& cufile_why) {
  if (cuda_api == nullptr) {
    const int errnum = cuda_why.errnum != 0 ? cuda_why.errnum : ENOTSUP;
    throw_error(errnum, "GdsHandle needs the CUDA driver: " +
                            (cuda_why.message.empty() ? std::string("not loaded") : cuda_why.message));
  }
  return std::make_unique<GdsEngine>(options, cuda_api, cufile_api, cufile_why);
}

GdsHandle make_gds_handle(const GdsOptions& options, const CudaApi* cuda_api,
                          const Status& cuda_why, CuFileApi* cufile_api, const Status& cufile_why) {
  return GdsHandle(make_gds_engine(options, cuda_api, cuda_why, cufile_api, cufile_why));
}

}  // namespace deepio::detail::gpu

namespace deepio {

using detail::gpu::GdsEngine;

namespace {
std::unique_ptr<GdsEngine> default_engine(const GdsOptions& options) {
  detail::Status cuda_why;
  detail::Status cufile_why;
  const auto* cuda_api = detail::gpu::cuda(&cuda_why);
  auto* cufile_api = cuda_api != nullptr && options.mode != GdsMode::Compat
                         ? detail::gpu::cufile_mutable(&cufile_why)
                         : nullptr;
  return detail::gpu::make_gds_engine(options, cuda_api, cuda_why, cufile_api, cufile_why);
}
}  // namespace

GdsHandle::GdsHandle(const GdsOptions& options) : engine_(default_engine(options)) {}
GdsHandle::GdsHandle(std::unique_ptr<GdsEngine> engine) noexcept : engine_(std::move(engine)) {}
GdsHandle::~GdsHandle() = default;
GdsHandle::GdsHandle(GdsHandle&&) noexcept = default;
GdsHandle& GdsHandle::operator=(GdsHandle&&) noexcept = default;

void GdsHandle::async_pread(void* device_ptr, std::size_t nbytes, const std::string& path,
                            std::uint64_t file_offset) {
  engine_->submit(false, reinterpret_cast<std::uintptr_t>(device_ptr), nbytes, path, file_offset);
}
void GdsHandle::async_pwrite(const void* device_ptr, std::size_t nbytes, const std::string& path,
                             std::uint64_t file_offset) {
  engine_->submit(true, reinterpret_cast<std::uintptr_t>(device_ptr), nbytes, path, file_offset);
}
std::size_t GdsHandle::sync_pread(void* device_ptr, std::size_t nbytes, const std::string& path,
                                  std::uint64_t file_offset) {
  async_pread(device_ptr, nbytes, path, file_offset);
  return wait();
}
std::size_t GdsHandle::sync_pwrite(const void* device_ptr, std::size_t nbytes,
                                   const std::string& path, std::uint64_t file_offset) {
  async_pwrite(device_ptr, nbytes, path, file_offset);
  return wait();
}
std::size_t GdsHandle::wait() { return engine_->wait(); }
std::size_t GdsHandle::pending() const noexcept { return engine_->pending(); }
bool GdsHandle::pin_device_buffer(void* device_ptr, std::size_t nbytes) {
  return engine_->pin(device_ptr, nbytes);
}
bool GdsHandle::unpin_device_buffer(void* device_ptr) { return engine_->unpin(device_ptr); }
void* GdsHandle::new_pinned_device_buffer(std::size_t nbytes, int device) {
  return engine_->new_pinned(nbytes, device);
}
bool GdsHandle::free_pinned_device_buffer(void* device_ptr) { return engine_->free_pinned(device_ptr); }
std::string GdsHandle::mode() const { return engine_->mode(); }
std::string GdsHandle::mode_reason() const { return engine_->mode_reason(); }
const GdsOptions& GdsHandle::options() const noexcept { return engine_->options(); }
GdsStats GdsHandle::stats() const noexcept { return engine_->stats(); }

}  // namespace deepio
