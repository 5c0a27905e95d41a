// What the I/O backends need from the locked-memory registry to register buffers with the
// kernel (io_uring fixed buffers): which locked allocation holds a buffer, and a call before
// an allocation's memory is unmapped.
//
// A registration pins the allocation's pages for as long as it exists, so it must end before
// free_locked() unmaps them: otherwise the kernel would keep the old pages pinned (memory that
// never comes back) and a later allocation at the same address would not be what the
// registration points at. Region ids are never reused, so a stale id can never match.
// Thread safety: all functions are thread-safe. Release listeners run on the thread that
// calls free_locked(), before the memory is unmapped; remove_release_listener() waits for a
// listener that is running. A listener must not call back into this registry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace deepio::detail {

struct LockedRegion {
  std::uint64_t id = 0;  ///< unique for the life of the process; 0: no region
  std::byte* base = nullptr;
  std::size_t size = 0;  ///< the whole mapping, in pages
  /// [data, data + nbytes) lies in a live allocation of allocate_locked(), locked or not: host
  /// memory, so the engine asks no GPU driver what it is.
  bool host = false;
};

/// The allocation made by allocate_locked() that holds [data, data + nbytes) and whose mlock
/// succeeded; id 0 when there is none (foreign memory, or the unlocked fallback, which still
/// sets `host`). The engine makes one such lookup per op.
[[nodiscard]] LockedRegion find_locked_region(const void* data, std::size_t nbytes) noexcept;

using ReleaseListener = std::function<void(std::uint64_t region_id)>;
/// Calls `listener` with the id of every region about to be freed. Returns a token for
/// remove_release_listener().
std::uint64_t add_release_listener(ReleaseListener listener);
void remove_release_listener(std::uint64_t token) noexcept;

/// Caller memory the engine may register with the kernel as if it were a locked allocation
/// (io_uring fixed buffers: no page pinning per request): [data, data + nbytes), widened to
/// whole pages, becomes a region that find_locked_region() finds (host, with an id) until
/// release_host_region(). Nothing is locked, mapped or unmapped: the caller keeps the memory
/// mapped until it has released the region (a registration pins the pages it had; memory
/// unmapped while adopted would leave them pinned, and a locked allocation made over such a
/// range drops the stale region first). Returns the region's id, or 0 where it is not adopted:
/// nbytes 0 or over kMaxAdoptedBytes (the backends' registration tables hold 16 GiB; a larger
/// region would only evict itself), or a range that overlaps a locked allocation or another
/// adopted region (that one serves it already). Thread-safe.
inline constexpr std::size_t kMaxAdoptedBytes = std::size_t{8} << 30;
[[nodiscard]] std::uint64_t adopt_host_region(void* data, std::size_t nbytes) noexcept;
/// Ends an adoption: the release listeners run (registrations end), then the region is gone.
/// A no-op for 0 or an id no longer adopted. Thread-safe.
void release_host_region(std::uint64_t id) noexcept;

/// Ends an allocation's locking before its mapping can go: its registrations end (the release
/// listeners run) and it is unlocked, but the address range stays mapped, data intact, until
/// free_locked(data) unmaps it. A retired allocation is no longer locked, found or counted.
/// For owners whose memory may still be referenced after the caller freed it (Python arrays,
/// operations in flight). False if `data` is not the base of a live, unretired allocation.
/// Thread-safe.
bool retire_locked(void* data) noexcept;

}  // namespace deepio::detail
