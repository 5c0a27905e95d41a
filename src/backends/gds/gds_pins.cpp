// Pinned device buffers of a route: the registry that bind() range-checks against, with
// their cuFile buffer registrations (pin/unpin, new_pinned/free_pinned; see gds_route.hpp).
#include <cerrno>
#include <iterator>

#include "backends/gds/gds_file.hpp"
#include "backends/gds/gds_route.hpp"

namespace deepio::detail::gpu {

namespace {

// Registrations made while cuFile is absent (staging only): same bookkeeping, no cuFile
// calls. Process-wide like cuFile's own.
BufferRegistry& staging_registry() {
  static BufferRegistry registry;
  return registry;
}

}  // namespace

BufferRegistry& GdsRoute::registry() noexcept { return cufile_ != nullptr ? cufile_->buffers : staging_registry(); }

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

}  // namespace deepio::detail::gpu
