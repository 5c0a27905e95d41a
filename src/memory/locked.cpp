// The process-wide registry of page-locked allocations.
//
// Invariants: the map holds every live allocation keyed by base address; entries never
// overlap (mmap guarantees it); all access is under Registry::mutex. Memory comes from
// anonymous mmap (page-aligned, no allocator header; 2 MiB and more advised onto transparent
// huge pages), is locked with mlock when the limit allows, and is returned with munmap. An
// entry may be retired first (retire_locked: unlocked, invisible to lookups and stats, still
// mapped) and is then only waiting for free_locked's munmap. Each allocation has an id that
// is never reused; release listeners (memory/regions.hpp) hear of it once, at the retire or
// else before the munmap, under listener_mutex so that a listener being removed is never
// running. The registry object is deliberately leaked: allocations may be freed by Python
// finalizers that run after static destructors.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "deepio/memory.hpp"
#include "memory/regions.hpp"
#include "platform/process.hpp"
#include "platform/status.hpp"
#include "platform/sys.hpp"

namespace deepio {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;

struct Entry {
  std::size_t nbytes;  // what the caller asked for
  std::size_t mapped;  // what was mapped (whole pages, at least one)
  bool locked;
  std::uint64_t id;
  bool retired = false;  // retire_locked(): unlocked and unregistered, mapping kept until free_locked()
  bool adopted = false;  // adopt_host_region(): the caller's memory, never locked, mapped or unmapped here
};
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Entry> entries;
  std::uint64_t next_id = 1;                                                 // guarded by mutex
  std::mutex listener_mutex;                                                 // taken without `mutex` held
  std::vector<std::pair<std::uint64_t, detail::ReleaseListener>> listeners;  // guarded by listener_mutex
  std::uint64_t next_token = 1;                                              // guarded by listener_mutex
};
Registry& registry() {
  static auto* r = new Registry;  // leaked on purpose, see above
  return *r;
}

// fork() while another thread holds either mutex would leave it locked forever in the child
// (platform/process.hpp): the atfork handlers take both around every fork. listener_mutex
// first: listeners run under it and take backend locks whose holders may want `mutex`.
void lock_listeners() noexcept { registry().listener_mutex.lock(); }
void unlock_listeners() noexcept { registry().listener_mutex.unlock(); }
void lock_entries() noexcept { registry().mutex.lock(); }
void unlock_entries() noexcept { registry().mutex.unlock(); }
[[maybe_unused]] const bool g_fork_locks = detail::register_fork_lock(detail::ForkLockRank::kLockedListeners,
                                                                      {&lock_listeners, &unlock_listeners}) &&
                                           detail::register_fork_lock(detail::ForkLockRank::kLockedRegistry,
                                                                      {&lock_entries, &unlock_entries});

// The allocation holding [p, p + nbytes) when `size` of it counts, or nullptr. Caller holds r.mutex.
template <typename SizeOf>
const std::pair<const std::uintptr_t, Entry>* holder(const Registry& r, std::uintptr_t p, std::size_t nbytes,
                                                     SizeOf size_of) {
  auto it = r.entries.upper_bound(p);
  if (it == r.entries.begin()) return nullptr;
  --it;
  if (it->second.retired) return nullptr;
  const std::size_t size = size_of(it->second);
  const std::uintptr_t off = p - it->first;  // p >= base: upper_bound's predecessor
  return off <= size && nbytes <= size - off ? &*it : nullptr;
}

// Whether an entry overlaps [p, p + n). Caller holds r.mutex.
bool overlaps(const Registry& r, std::uintptr_t p, std::size_t n) {
  auto it = r.entries.lower_bound(p + n);  // the first entry starting at or after the end
  if (it == r.entries.begin()) return false;
  --it;
  return it->first + it->second.mapped > p;
}

// Removes the adopted regions overlapping [p, p + n) (memory their owner unmapped while
// adopted, now mapped again) and returns their ids for notify_release. Caller holds r.mutex.
std::vector<std::uint64_t> drop_adopted(Registry& r, std::uintptr_t p, std::size_t n) {
  std::vector<std::uint64_t> ids;
  auto it = r.entries.upper_bound(p);
  if (it != r.entries.begin()) --it;
  while (it != r.entries.end() && it->first < p + n) {
    if (it->second.adopted && it->first + it->second.mapped > p) {
      ids.push_back(it->second.id);
      it = r.entries.erase(it);
    } else {
      ++it;
    }
  }
  return ids;
}

// Tells the listeners that region `id` is going: registrations with the kernel end before
// the pages go back.
void notify_release(Registry& r, std::uint64_t id) {
  std::lock_guard lock(r.listener_mutex);
  for (const auto& [token, listener] : r.listeners) listener(id);
}
}  // namespace

LockedBuffer allocate_locked(std::size_t nbytes) {
  const std::size_t page = detail::page_size();
  const std::size_t mapped = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) detail::throw_error(errno, "cannot allocate locked memory", {}, 0, nbytes);
  LockedBuffer buf{p, nbytes, true, 0};
  // Large buffers on transparent huge pages where the system allows it (THP "madvise"): a
  // 1 MiB direct request from 2 MiB pages is one or two DMA segments instead of 256, which
  // devices with a low segment limit (virtio's 254) otherwise split. Best effort.
  if (mapped >= kHugePage) (void)::madvise(p, mapped, MADV_HUGEPAGE);
  if (::mlock(p, mapped) != 0) {
    buf.locked = false;
    buf.lock_errno = errno;
  }
  auto& r = registry();
  std::vector<std::uint64_t> stale;
  {
    std::lock_guard lock(r.mutex);
    stale = drop_adopted(r, reinterpret_cast<std::uintptr_t>(p), mapped);
    r.entries.emplace(reinterpret_cast<std::uintptr_t>(p), Entry{nbytes, mapped, buf.locked, r.next_id++});
  }
  for (std::uint64_t id : stale) notify_release(r, id);
  return buf;
}

bool free_locked(void* data) noexcept {
  auto& r = registry();
  Entry e{};
  {
    std::lock_guard lock(r.mutex);
    auto it = r.entries.find(reinterpret_cast<std::uintptr_t>(data));
    if (it == r.entries.end() || it->second.adopted) return false;
    e = it->second;
    r.entries.erase(it);
  }
  if (!e.retired) notify_release(r, e.id);  // a retired region's listeners already heard
  // munmap also unlocks; munlock first keeps the accounting obvious.
  if (e.locked && !e.retired) ::munlock(data, e.mapped);
  ::munmap(data, e.mapped);
  return true;
}

namespace detail {

bool retire_locked(void* data) noexcept {
  auto& r = registry();
  Entry e{};
  {
    std::lock_guard lock(r.mutex);
    auto it = r.entries.find(reinterpret_cast<std::uintptr_t>(data));
    if (it == r.entries.end() || it->second.retired || it->second.adopted) return false;
    it->second.retired = true;  // from now on nothing finds it: no new registration can start
    e = it->second;
  }
  notify_release(r, e.id);
  // Unlocked now; the pages stay mapped with their data so that an operation still in flight
  // on them, or an array still pointing here, sees valid memory (no crash, no data changed
  // under it) until free_locked() unmaps them.
  if (e.locked) ::munlock(data, e.mapped);
  return true;
}

}  // namespace detail

bool is_locked(const void* data, std::size_t nbytes) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  const auto* h = holder(r, p, nbytes, [](const Entry& e) { return e.nbytes == 0 ? e.mapped : e.nbytes; });
  return h != nullptr && !h->second.adopted;
}

bool is_pinned(const void* data, std::size_t nbytes) noexcept { return is_locked(data, nbytes); }

namespace detail {

LockedRegion find_locked_region(const void* data, std::size_t nbytes) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  const auto* h = holder(r, p, nbytes, [](const Entry& e) { return e.mapped; });
  if (h == nullptr) return {};
  if (!h->second.locked) return {0, nullptr, 0, true};
  return {h->second.id, reinterpret_cast<std::byte*>(h->first), h->second.mapped, true};
}

std::uint64_t adopt_host_region(void* data, std::size_t nbytes) noexcept {
  if (data == nullptr || nbytes == 0) return 0;
  const std::uintptr_t page = detail::page_size();
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(data) / page * page;
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(data) + nbytes + page - 1) / page * page;
  if (end - first > kMaxAdoptedBytes) return 0;
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (overlaps(r, first, end - first)) return 0;
  const std::uint64_t id = r.next_id++;
  Entry e{end - first, end - first, /*locked=*/true, id};  // "locked": find_locked_region gives its id
  e.adopted = true;
  r.entries.emplace(first, e);
  return id;
}

void release_host_region(std::uint64_t id) noexcept {
  if (id == 0) return;
  auto& r = registry();
  {
    std::lock_guard lock(r.mutex);
    auto it = std::find_if(r.entries.begin(), r.entries.end(),
                           [&](const auto& kv) { return kv.second.adopted && kv.second.id == id; });
    if (it == r.entries.end()) return;
    // Kept (but invisible to lookups: retired) until the listeners heard, so that no new
    // registration of it can start meanwhile.
    it->second.retired = true;
  }
  notify_release(r, id);
  std::lock_guard lock(r.mutex);
  std::erase_if(r.entries, [&](const auto& kv) { return kv.second.adopted && kv.second.id == id; });
}

std::uint64_t add_release_listener(ReleaseListener listener) {
  auto& r = registry();
  std::lock_guard lock(r.listener_mutex);
  const std::uint64_t token = r.next_token++;
  r.listeners.emplace_back(token, std::move(listener));
  return token;
}

void remove_release_listener(std::uint64_t token) noexcept {
  auto& r = registry();
  std::lock_guard lock(r.listener_mutex);
  std::erase_if(r.listeners, [&](const auto& l) { return l.first == token; });
}

}  // namespace detail

LockedMemoryStats locked_memory_stats() noexcept {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  LockedMemoryStats s;
  for (const auto& [base, e] : r.entries) {
    if (e.retired || e.adopted) continue;
    ++s.allocations;
    s.bytes += e.nbytes;
    if (e.locked) s.locked_bytes += e.mapped;
  }
  return s;
}

}  // namespace deepio
