// CudaStager: staging copies between GPU memory and a worker's host bounce slots.
//
// Lifecycle: created on the worker thread on the first op for a device; retains that
// device's primary context, creates one non-blocking stream and one event per staging slot;
// register_staging() page-locks the worker's bounce arena with cuMemHostRegister so copies are
// real DMA. Destruction synchronizes the stream, destroys events and stream, unregisters the
// arena and releases the context (the arena outlives the stager: see Worker::Impl).
// Ordering against the producer: an op submitted with OpOptions::stream carries a CudaFence,
// an event recorded on the caller's stream, on the caller's thread, in the device's primary
// context (events come from a per-device pool, so a submission costs a record, not a create).
// Before a slice's first copy the worker calls order_after(): cuStreamWaitEvent on this
// stager's stream, so the copies wait on the device and no thread blocks; every later copy on
// the stream is ordered after the producer's work too (conservative, never wrong).
// Ordering of the copies: device→host copies (writes) are synchronous per chunk; host→device copies
// (reads) are queued on the stream with an event per slot, and the worker reuses a slot or
// completes an op only after the slot's event completed, so after wait() the bytes are in
// device memory and visible to every stream. Errors: every CUresult is checked and becomes
// a Status (EIO, ENOMEM) carrying the driver's error name.
#include "engine/cuda_stager.hpp"

#include "deepio/error.hpp"
#include "deepio/gpu.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu/cuda.hpp"
#include "gpu/loader.hpp"
#include "platform/process.hpp"

namespace deepio::detail {

namespace {

using namespace gpu;

class CudaStager final : public DeviceStager {
 public:
  CudaStager(const CudaApi* api, int device, std::size_t slots) : api_(api), device_(device), events_(slots) {}

  Status init(Status* why) {
    CUdevice dev = 0;
    if (CUresult r = api_->cuDeviceGet(&dev, device_); r != CUDA_SUCCESS)
      return *why = cuda_status(api_, r, "cuDeviceGet");
    if (CUresult r = api_->cuDevicePrimaryCtxRetain(&ctx_, dev); r != CUDA_SUCCESS) {
      return *why = cuda_status(api_, r, "cuDevicePrimaryCtxRetain");
    }
    retained_ = true;
    if (CUresult r = api_->cuCtxSetCurrent(ctx_); r != CUDA_SUCCESS)
      return *why = cuda_status(api_, r, "cuCtxSetCurrent");
    if (CUresult r = api_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
      return *why = cuda_status(api_, r, "cuStreamCreate");
    }
    for (auto& e : events_) {
      if (CUresult r = api_->cuEventCreate(&e.event, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
        return *why = cuda_status(api_, r, "cuEventCreate");
      }
    }
    return {};
  }

  ~CudaStager() override {
    if (ctx_ != nullptr) api_->cuCtxSetCurrent(ctx_);
    if (stream_ != nullptr) {
      api_->cuStreamSynchronize(stream_);
      api_->cuStreamDestroy(stream_);
    }
    for (auto& e : events_) {
      if (e.event != nullptr) api_->cuEventDestroy(e.event);
    }
    if (registered_ != nullptr) api_->cuMemHostUnregister(registered_);
    if (retained_) {
      CUdevice dev = 0;
      if (api_->cuDeviceGet(&dev, device_) == CUDA_SUCCESS) api_->cuDevicePrimaryCtxRelease(dev);
    }
  }
  CudaStager(const CudaStager&) = delete;
  CudaStager& operator=(const CudaStager&) = delete;

  Status register_staging(void* base, std::size_t nbytes) override {
    api_->cuCtxSetCurrent(ctx_);
    const CUresult r = api_->cuMemHostRegister(base, nbytes, CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) return {};
    if (r != CUDA_SUCCESS) return cuda_status(api_, r, "cuMemHostRegister of the staging buffers");
    registered_ = base;
    return {};
  }

  Status to_staging(int /*slot*/, void* staging, const std::byte* device_src, std::size_t n) override {
    api_->cuCtxSetCurrent(ctx_);
    if (CUresult r = api_->cuMemcpyDtoHAsync(staging, ptr(device_src), n, stream_); r != CUDA_SUCCESS) {
      return cuda_status(api_, r, "cuMemcpyDtoHAsync");
    }
    if (CUresult r = api_->cuStreamSynchronize(stream_); r != CUDA_SUCCESS) {
      return cuda_status(api_, r, "device-to-host copy");
    }
    return {};
  }

  Status from_staging(int slot, std::byte* device_dst, const void* staging, std::size_t n) override {
    api_->cuCtxSetCurrent(ctx_);
    Event& e = events_.at(static_cast<std::size_t>(slot));
    if (CUresult r = api_->cuMemcpyHtoDAsync(ptr(device_dst), staging, n, stream_); r != CUDA_SUCCESS) {
      return cuda_status(api_, r, "cuMemcpyHtoDAsync");
    }
    if (CUresult r = api_->cuEventRecord(e.event, stream_); r != CUDA_SUCCESS) {
      api_->cuStreamSynchronize(stream_);  // the slot must not be reused under a running copy
      return cuda_status(api_, r, "cuEventRecord");
    }
    e.pending = true;
    return {};
  }

  Status order_after(const DeviceFence& fence) override {
    api_->cuCtxSetCurrent(ctx_);
    if (CUresult r = api_->cuStreamWaitEvent(stream_, static_cast<CUevent>(fence.handle()), 0); r != CUDA_SUCCESS) {
      return cuda_status(api_, r, "cuStreamWaitEvent on the producer's event");
    }
    return {};
  }

  bool done(int slot) override {
    Event& e = events_.at(static_cast<std::size_t>(slot));
    if (!e.pending) return true;
    api_->cuCtxSetCurrent(ctx_);
    const CUresult r = api_->cuEventQuery(e.event);
    if (r == CUDA_ERROR_NOT_READY) return false;
    e.pending = false;
    if (r != CUDA_SUCCESS) e.error = cuda_status(api_, r, "host-to-device copy");
    return true;
  }

  Status wait(int slot) override {
    Event& e = events_.at(static_cast<std::size_t>(slot));
    if (e.pending) {
      api_->cuCtxSetCurrent(ctx_);
      const CUresult r = api_->cuEventSynchronize(e.event);
      e.pending = false;
      if (r != CUDA_SUCCESS) e.error = cuda_status(api_, r, "host-to-device copy");
    }
    Status err = std::move(e.error);
    e.error = {};
    return err;
  }

 private:
  struct Event {
    CUevent event = nullptr;
    bool pending = false;
    Status error;
  };
  static CUdeviceptr ptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

  const CudaApi* api_;
  int device_;
  CUcontext ctx_ = nullptr;
  bool retained_ = false;
  CUstream stream_ = nullptr;
  void* registered_ = nullptr;
  std::vector<Event> events_;
};

// Events for fences of one device of one driver, and the device's primary context they live
// in (retained once). Lives for the rest of the process once made: fences may be destroyed on
// any thread at any time, including at exit, and the driver must not be called then; the
// context reference and the events are left to the driver's teardown on purpose.
class FencePool {
 public:
  FencePool(const CudaApi& api, int device) : api_(api), device_(device) {}

  // Records a fence on `stream` on the calling thread, in the primary context, restoring
  // the thread's current context afterwards.
  std::shared_ptr<DeviceFence> record(std::uintptr_t stream, Status* why);

  // The stream deepio owns on the device for DLPack's stream exchange (deepio::consumer_stream):
  // non-blocking, made on first use, kept for the life of the process.
  CUstream consumer_stream(Status* why);

  void give_back(CUevent e) {
    std::lock_guard lock(mutex_);
    free_.push_back(e);
  }
  // For fork's handlers (fence_pool()): held across a fork, never inherited locked.
  void lock_for_fork() noexcept { mutex_.lock(); }
  void unlock_for_fork() noexcept { mutex_.unlock(); }
  const CudaApi& api() const { return api_; }
  CUcontext context() const { return ctx_; }

 private:
  const CudaApi api_;  // a copy: a test's load_cuda() object may go before the pool
  const int device_;
  std::mutex mutex_;
  CUcontext ctx_ = nullptr;      // guarded by mutex_ until set
  std::vector<CUevent> free_;    // guarded by mutex_
  CUstream consumer_ = nullptr;  // guarded by mutex_

  // Under mutex_: retains the primary context once.
  Status retain_locked();
};

class CudaFence final : public DeviceFence {
 public:
  CudaFence(FencePool* pool, CUevent event) : pool_(pool), event_(event) {}
  ~CudaFence() override { pool_->give_back(event_); }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;

  [[nodiscard]] void* handle() const noexcept override { return event_; }
  Status wait() const override {
    const CudaApi& api = pool_->api();
    CUcontext prev = nullptr;
    api.cuCtxGetCurrent(&prev);
    if (prev != pool_->context()) api.cuCtxSetCurrent(pool_->context());
    const CUresult r = api.cuEventSynchronize(event_);
    if (prev != pool_->context()) api.cuCtxSetCurrent(prev);
    if (r != CUDA_SUCCESS) return cuda_status(&api, r, "waiting for the producer's stream");
    return {};
  }
  bool poll(Status* error) const override {
    const CudaApi& api = pool_->api();
    CUcontext prev = nullptr;
    api.cuCtxGetCurrent(&prev);
    if (prev != pool_->context()) api.cuCtxSetCurrent(pool_->context());
    const CUresult r = api.cuEventQuery(event_);
    if (prev != pool_->context()) api.cuCtxSetCurrent(prev);
    if (r == CUDA_ERROR_NOT_READY) return false;
    *error = r == CUDA_SUCCESS ? Status{} : cuda_status(&api, r, "waiting for the producer's stream");
    return true;
  }

 private:
  FencePool* pool_;
  CUevent event_;
};

Status FencePool::retain_locked() {
  if (ctx_ != nullptr) return {};
  CUdevice dev = 0;
  if (CUresult r = api_.cuDeviceGet(&dev, device_); r != CUDA_SUCCESS) return cuda_status(&api_, r, "cuDeviceGet");
  if (CUresult r = api_.cuDevicePrimaryCtxRetain(&ctx_, dev); r != CUDA_SUCCESS) {
    ctx_ = nullptr;
    return cuda_status(&api_, r, "cuDevicePrimaryCtxRetain");
  }
  return {};
}

CUstream FencePool::consumer_stream(Status* why) {
  std::lock_guard lock(mutex_);
  if (consumer_ != nullptr) return consumer_;
  if (*why = retain_locked(); !why->ok()) return nullptr;
  CUcontext prev = nullptr;
  api_.cuCtxGetCurrent(&prev);
  api_.cuCtxSetCurrent(ctx_);
  CUstream s = nullptr;
  const CUresult r = api_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  api_.cuCtxSetCurrent(prev);
  if (r != CUDA_SUCCESS) {
    *why = cuda_status(&api_, r, "cuStreamCreate for DLPack's stream exchange");
    return nullptr;
  }
  consumer_ = s;
  return s;
}

std::shared_ptr<DeviceFence> FencePool::record(std::uintptr_t stream, Status* why) {
  CUevent e = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (*why = retain_locked(); !why->ok()) return nullptr;
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    }
  }
  CUcontext prev = nullptr;
  api_.cuCtxGetCurrent(&prev);
  const bool switched = prev != ctx_;
  if (switched) api_.cuCtxSetCurrent(ctx_);
  CUresult r = CUDA_SUCCESS;
  if (e == nullptr) r = api_.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) {
    *why = cuda_status(&api_, r, "cuEventCreate for the producer's stream");
  } else if (r = api_.cuEventRecord(e, reinterpret_cast<CUstream>(stream)); r != CUDA_SUCCESS) {
    *why = cuda_status(&api_, r, "cuEventRecord on the producer's stream");
  }
  if (switched) api_.cuCtxSetCurrent(prev);
  if (r != CUDA_SUCCESS) {
    if (e != nullptr) give_back(e);
    return nullptr;
  }
  try {
    return std::make_shared<CudaFence>(this, e);
  } catch (...) {
    give_back(e);
    throw;
  }
}

using FencePools = std::map<std::pair<std::uintptr_t, int>, FencePool*>;
std::mutex g_pools_mutex;
FencePools* g_pools = nullptr;  // guarded by g_pools_mutex; never freed: see FencePool

// The pool for (driver, device), made on first use. Keyed by the driver's cuInit address,
// which names the loaded library even when a test's CudaApi object has gone.
FencePool& fence_pool(const CudaApi* api, int device) {
  const auto key = std::make_pair(reinterpret_cast<std::uintptr_t>(api->cuInit), device);
  std::lock_guard lock(g_pools_mutex);
  if (g_pools == nullptr) g_pools = new FencePools();
  auto it = g_pools->find(key);
  if (it == g_pools->end()) it = g_pools->emplace(key, new FencePool(*api, device)).first;
  return *it->second;
}

// fork() while another thread holds the map's or a pool's mutex would leave it locked forever
// in the child (platform/process.hpp): the atfork handlers take the map's, then every pool's.
void lock_pools_for_fork() noexcept {
  g_pools_mutex.lock();
  if (g_pools != nullptr) {
    for (auto& [key, pool] : *g_pools) pool->lock_for_fork();
  }
}
void unlock_pools_for_fork() noexcept {
  if (g_pools != nullptr) {
    for (auto& [key, pool] : *g_pools) pool->unlock_for_fork();
  }
  g_pools_mutex.unlock();
}
[[maybe_unused]] const bool g_fork_locks = register_fork_lock(ForkLockRank::kFencePools,
                                                              {&lock_pools_for_fork, &unlock_pools_for_fork});

FenceFactory fence_factory(const CudaApi* api) {
  return [api](int device, std::uintptr_t stream, Status* why) -> std::shared_ptr<DeviceFence> {
    const CudaApi* a = api;
    if (a == nullptr) {
      a = cuda(why);
      if (a == nullptr) return nullptr;
    }
    return fence_pool(a, device).record(stream, why);
  };
}

// True once the process itself has loaded the CUDA driver: before that no pointer can be
// device memory, and deepio must not be the one to pay for cuInit. Called on every
// submission, so it must be cheap: dlopen(RTLD_NOLOAD) searches the file system (tens of
// microseconds); instead the loaded objects are scanned, and only when the loader's count of
// objects ever added (dlpi_adds) has changed since the last scan.
struct LoadedScan {
  const std::vector<std::string>* names;
  unsigned long long last_adds;
  unsigned long long adds = 0;
  bool first = true;
  bool unchanged = false;
  bool found = false;
};

int scan_object(dl_phdr_info* info, std::size_t size, void* data) {
  auto* s = static_cast<LoadedScan*>(data);
  if (s->first) {
    s->first = false;
    if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds) {
      s->adds = info->dlpi_adds;
      if (s->adds == s->last_adds) {
        s->unchanged = true;
        return 1;  // nothing was loaded since the last scan
      }
    }
  }
  const std::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const std::string_view base = name.substr(
      name.find_last_of('/') == std::string_view::npos ? 0 : name.find_last_of('/') + 1);
  for (const auto& n : *s->names) {
    if (!base.empty() && base == n) {
      s->found = true;
      return 1;
    }
  }
  return 0;
}

bool driver_in_process() {
  static std::atomic<bool> seen{false};
  static std::atomic<unsigned long long> scanned_adds{~0ull};
  if (seen.load(std::memory_order_relaxed)) return true;
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    const LibraryChoice choice = cuda_library_choice();
    if (choice.disabled) return v;
    for (const auto& c : choice.candidates)
      v.push_back(c.substr(c.find_last_of('/') == std::string::npos ? 0 : c.find_last_of('/') + 1));
    return v;
  }();
  if (names.empty()) return false;
  LoadedScan scan{&names, scanned_adds.load(std::memory_order_relaxed)};
  ::dl_iterate_phdr(scan_object, &scan);
  if (scan.found) {
    seen.store(true, std::memory_order_relaxed);
    return true;
  }
  if (!scan.unchanged) scanned_adds.store(scan.adds, std::memory_order_relaxed);
  return false;
}

}  // namespace

DeviceSupport cuda_device_support() {
  DeviceSupport s;
  s.classify = [](const void* p) -> int {
    if (!driver_in_process()) return -1;
    const DevicePointer d = classify(p);
    return d.is_device ? d.ordinal : -1;
  };
  s.make_stager = [](int device, std::size_t slots, Status* why) -> std::unique_ptr<DeviceStager> {
    const CudaApi* api = cuda(why);
    if (api == nullptr) return nullptr;
    auto st = std::make_unique<CudaStager>(api, device, slots);
    if (!st->init(why).ok()) return nullptr;
    return st;
  };
  s.make_fence = fence_factory(nullptr);
  return s;
}

DeviceSupport cuda_device_support(const CudaApi* api) {
  DeviceSupport s;
  s.classify = [api](const void* p) -> int {
    const DevicePointer d = classify(api, p);
    return d.is_device ? d.ordinal : -1;
  };
  s.make_stager = [api](int device, std::size_t slots, Status* why) -> std::unique_ptr<DeviceStager> {
    auto st = std::make_unique<CudaStager>(api, device, slots);
    if (!st->init(why).ok()) return nullptr;
    return st;
  };
  s.make_fence = fence_factory(api);
  return s;
}

}  // namespace deepio::detail

namespace deepio {

std::uintptr_t consumer_stream(int device) {
  using namespace detail;
  Status why;
  const gpu::CudaApi* api = gpu::cuda(&why);
  if (api == nullptr) throw_error(why.errnum, why.message);
  if (device < 0 || device >= api->device_count) {
    throw InvalidArgument("consumer_stream: no CUDA device " + std::to_string(device) + " (the driver has " +
                          std::to_string(api->device_count) + ")");
  }
  gpu::CUstream s = fence_pool(api, device).consumer_stream(&why);
  if (s == nullptr) throw_error(why.errnum, why.message);
  return reinterpret_cast<std::uintptr_t>(s);
}

}  // namespace deepio
