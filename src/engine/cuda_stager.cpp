// CudaStager: staging copies between GPU memory and a worker's host bounce slots.
//
// Lifecycle: created on the worker thread on the first op for a device; retains that
// device's primary context, creates one non-blocking stream and one event per staging slot;
// register_staging() page-locks the worker's bounce arena with cuMemHostRegister so copies are
// real DMA. Destruction synchronizes the stream, destroys events and stream, unregisters the
// arena and releases the context (the arena outlives the stager: see Worker::Impl).
// Ordering: device→host copies (writes) are synchronous per chunk; host→device copies
// (reads) are queued on the stream with an event per slot, and the worker reuses a slot or
// completes an op only after the slot's event completed, so after wait() the bytes are in
// device memory and visible to every stream. Errors: every CUresult is checked and becomes
// a Status (EIO, ENOMEM) carrying the driver's error name.
#include "engine/cuda_stager.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <string_view>
#include <atomic>
#include <vector>

#include "gpu/cuda.hpp"
#include "gpu/loader.hpp"

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
  return s;
}

}  // namespace deepio::detail
