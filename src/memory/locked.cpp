// The process-wide registry of page-locked allocations.
//
// Invariants: the map holds every live allocation keyed by base address; entries never
// overlap (mmap guarantees it); all access is under g_mutex. Memory comes from anonymous
// mmap (page-aligned, no allocator header), is locked with mlock when the limit allows, and
// is returned with munmap. The registry object is deliberately leaked: allocations may be
// freed by Python finalizers that run after static destructors.
#include <sys/mman.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "deepio/memory.hpp"
#include "platform/status.hpp"
#include "platform/sys.hpp"

namespace deepio {

namespace {
struct Entry {
  std::size_t nbytes;   // what the caller asked for
  std::size_t mapped;   // what was mapped (whole pages, at least one)
  bool locked;
};
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Entry> entries;
};
Registry& registry() {
  static auto* r = new Registry;  // leaked on purpose, see above
  return *r;
}
}  // namespace

LockedBuffer allocate_locked(std::size_t nbytes) {
  const std::size_t page = detail::page_size();
  const std::size_t mapped = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) detail::throw_error(errno, "cannot allocate locked memory", {}, 0, nbytes);
  LockedBuffer buf{p, nbytes, true, 0};
  if (::mlock(p, mapped) != 0) {
    buf.locked = false;
    buf.lock_errno = errno;
  }
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries.emplace(reinterpret_cast<std::uintptr_t>(p), Entry{nbytes, mapped, buf.locked});
  return buf;
}

bool free_locked(void* data) noexcept {
  auto& r = registry();
  Entry e{};
  {
    std::lock_guard lock(r.mutex);
    auto it = r.entries.find(reinterpret_cast<std::uintptr_t>(data));
    if (it == r.entries.end()) return false;
    e = it->second;
    r.entries.erase(it);
  }
  // munmap also unlocks; munlock first keeps the accounting obvious.
  if (e.locked) ::munlock(data, e.mapped);
  ::munmap(data, e.mapped);
  return true;
}

bool is_pinned(const void* data, std::size_t nbytes) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.entries.upper_bound(p);
  if (it == r.entries.begin()) return false;
  --it;
  const std::uintptr_t base = it->first;
  const std::size_t size = it->second.nbytes == 0 ? it->second.mapped : it->second.nbytes;
  return p >= base && p - base <= size && nbytes <= size - (p - base);
}

LockedMemoryStats locked_memory_stats() noexcept {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  LockedMemoryStats s;
  for (const auto& [base, e] : r.entries) {
    ++s.allocations;
    s.bytes += e.nbytes;
    if (e.locked) s.locked_bytes += e.mapped;
  }
  return s;
}

}  // namespace deepio
