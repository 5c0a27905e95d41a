#include "core/fixed_files.hpp"

#include <sys/resource.h>

#include <algorithm>

namespace deepio::detail {

namespace {
std::atomic<std::uint64_t> g_next_id{1};
std::atomic<unsigned> g_table_slots{0};
std::atomic<std::int64_t> g_installed{0};
constexpr unsigned kDefaultSlots = 1024;
}  // namespace

FixedFile::FixedFile() noexcept : id_(g_next_id.fetch_add(1, std::memory_order_relaxed)) {}

FixedFile::~FixedFile() {
  Entry* e = entries_.exchange(nullptr, std::memory_order_acquire);
  while (e != nullptr) {
    if (auto table = e->table.lock()) table->remove(e->slot);
    Entry* next = e->next;
    delete e;
    e = next;
  }
}

void FixedFile::add(std::shared_ptr<FileTable> table, unsigned slot) {
  auto* e = new Entry{std::move(table), slot, entries_.load(std::memory_order_relaxed)};
  while (!entries_.compare_exchange_weak(e->next, e, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void set_file_table_slots(unsigned slots) noexcept { g_table_slots.store(slots, std::memory_order_relaxed); }

unsigned file_table_slots() noexcept {
  if (const unsigned n = g_table_slots.load(std::memory_order_relaxed); n != 0) return n;
  // The kernel refuses a table larger than RLIMIT_NOFILE (EMFILE), and liburing would then
  // raise the process's limit on its own: stay under it instead.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    return static_cast<unsigned>(std::min<rlim_t>(kDefaultSlots, rl.rlim_cur));
  }
  return kDefaultSlots;
}

std::int64_t fixed_files_installed() noexcept { return g_installed.load(std::memory_order_relaxed); }
void count_fixed_files(std::int64_t delta) noexcept { g_installed.fetch_add(delta, std::memory_order_relaxed); }

}  // namespace deepio::detail
