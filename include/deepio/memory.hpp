// Page-locked host memory and the process-wide registry of it.
//
// allocate_locked() returns page-aligned memory and tries to mlock it. Where mlock is refused
// (RLIMIT_MEMLOCK, 8 MiB by default on many machines) the allocation still succeeds as aligned,
// unlocked memory and says so in LockedBuffer::locked / lock_errno: never hidden.
// The registry is process-wide and thread-safe: memory allocated anywhere in the process is
// recognised by is_locked() everywhere, and survives the handles that allocated it.
//
// Words: deepio calls this memory "locked" (page-locked), as DeepNVMe's new_cpu_locked_tensor
// does. "Pinned" means CUDA pinning (cuMemHostRegister, torch's pin_memory()) and GDS-registered
// device buffers, never this memory. is_pinned() and PinnedBuffer are the deprecated old names.
#pragma once

#include <cstddef>
#include <cstdint>

#include "deepio/export.hpp"

namespace deepio {

struct LockedBuffer {
  void* data = nullptr;
  std::size_t nbytes = 0;
  bool locked = false;  ///< mlock succeeded
  int lock_errno = 0;   ///< why mlock failed (EPERM, ENOMEM, EAGAIN), 0 when locked
};

/// Allocates nbytes (0 allowed: a one-page allocation) page-aligned, not zeroed, and tries to
/// lock it. Allocations of 2 MiB and more ask for transparent huge pages (MADV_HUGEPAGE, best
/// effort), so that a large direct request needs few DMA segments. Throws
/// deepio::Error(ENOMEM) when no memory is available. Thread-safe.
DEEPIO_API LockedBuffer allocate_locked(std::size_t nbytes);

/// Unlocks and frees an allocation given its base address. Returns false (and does nothing)
/// for any pointer that is not the base of a live allocation (a view, foreign memory, a
/// second free). Thread-safe.
DEEPIO_API bool free_locked(void* data) noexcept;

/// True iff [data, data + nbytes) lies inside one live allocation made by allocate_locked()
/// (views and slices count; also when mlock was refused and the allocation is pageable).
/// Thread-safe.
[[nodiscard]] DEEPIO_API bool is_locked(const void* data, std::size_t nbytes) noexcept;

/// The old name of is_locked(): deepio's memory is locked, not CUDA-pinned.
[[deprecated("use deepio::is_locked")]] [[nodiscard]] DEEPIO_API bool is_pinned(const void* data,
                                                                                std::size_t nbytes) noexcept;

struct LockedMemoryStats {
  std::size_t allocations = 0;
  std::size_t bytes = 0;
  std::size_t locked_bytes = 0;
};
[[nodiscard]] DEEPIO_API LockedMemoryStats locked_memory_stats() noexcept;

/// RAII owner of one allocate_locked() allocation (the unique owner of a LockedBuffer). Move-only.
class UniqueLockedBuffer {
 public:
  UniqueLockedBuffer() = default;
  explicit UniqueLockedBuffer(std::size_t nbytes) : buf_(allocate_locked(nbytes)) {}
  ~UniqueLockedBuffer() { reset(); }
  UniqueLockedBuffer(UniqueLockedBuffer&& other) noexcept : buf_(other.buf_) { other.buf_ = {}; }
  UniqueLockedBuffer& operator=(UniqueLockedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      buf_ = other.buf_;
      other.buf_ = {};
    }
    return *this;
  }
  UniqueLockedBuffer(const UniqueLockedBuffer&) = delete;
  UniqueLockedBuffer& operator=(const UniqueLockedBuffer&) = delete;

  [[nodiscard]] void* data() const noexcept { return buf_.data; }
  [[nodiscard]] std::byte* bytes() const noexcept { return static_cast<std::byte*>(buf_.data); }
  [[nodiscard]] std::size_t size() const noexcept { return buf_.nbytes; }
  [[nodiscard]] bool locked() const noexcept { return buf_.locked; }
  void reset() noexcept {
    if (buf_.data != nullptr) free_locked(buf_.data);
    buf_ = {};
  }

 private:
  LockedBuffer buf_;
};

/// The old name of UniqueLockedBuffer: deepio's memory is locked, not CUDA-pinned.
using PinnedBuffer [[deprecated("use deepio::UniqueLockedBuffer")]] = UniqueLockedBuffer;

}  // namespace deepio
