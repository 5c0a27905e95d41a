#include "memory/pool.hpp"

#include <atomic>
#include <utility>
#include <vector>

#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
std::atomic<std::uint64_t> g_live_blocks{0};

void free_block(const LockedBuffer& b) noexcept {
  free_locked(b.data);
  g_live_blocks.fetch_sub(1, std::memory_order_relaxed);
}
}  // namespace

std::uint64_t StagingPool::live_blocks() noexcept { return g_live_blocks.load(std::memory_order_relaxed); }

struct StagingPool::State {
  explicit State(std::size_t keep) : keep_bytes(keep) {}
  ~State() {
    for (auto& [size, buf] : kept) free_block(buf);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  const std::size_t keep_bytes;
  mutable std::mutex mutex;
  std::multimap<std::size_t, LockedBuffer> kept;  // by size; guarded by mutex
  bool open = true;                               // false once the owner went: nothing is kept
  Stats stats;                                    // guarded by mutex
};

StagingPool::StagingPool(std::size_t keep_bytes) : state_(std::make_shared<State>(keep_bytes)) {}

StagingPool::~StagingPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->open = false;  // leases given back from now on are freed, never kept
  }
  trim();
}

StagingPool::Lease StagingPool::take(std::size_t nbytes) {
  const std::size_t page = page_size();
  const std::size_t size = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->kept.find(size);
    if (it != state_->kept.end()) {
      LockedBuffer b = it->second;
      state_->kept.erase(it);
      state_->stats.kept_bytes -= size;
      state_->stats.lent_bytes += size;
      ++state_->stats.reuses;
      return {state_, b};
    }
  }
  LockedBuffer b = allocate_locked(size);  // throws Error(ENOMEM); outside the lock: it faults pages in
  g_live_blocks.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(state_->mutex);
  state_->stats.lent_bytes += size;
  ++state_->stats.allocations;
  return {state_, b};
}

StagingPool::Stats StagingPool::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

void StagingPool::trim() noexcept {
  std::vector<LockedBuffer> freed;
  {
    std::lock_guard lock(state_->mutex);
    for (auto& [size, buf] : state_->kept) freed.push_back(buf);
    state_->kept.clear();
    state_->stats.kept_bytes = 0;
  }
  for (auto& b : freed) free_block(b);
}

StagingPool::Lease& StagingPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    give_back();
    pool_ = std::move(o.pool_);
    buf_ = std::exchange(o.buf_, LockedBuffer{});
  }
  return *this;
}

void StagingPool::Lease::give_back() noexcept {
  if (buf_.data == nullptr) return;
  const LockedBuffer b = std::exchange(buf_, LockedBuffer{});
  bool keep = false;
  {
    std::lock_guard lock(pool_->mutex);
    pool_->stats.lent_bytes -= b.nbytes;
    if (pool_->open && pool_->stats.kept_bytes + b.nbytes <= pool_->keep_bytes) {
      pool_->kept.emplace(b.nbytes, b);
      pool_->stats.kept_bytes += b.nbytes;
      keep = true;
    }
  }
  pool_.reset();
  if (!keep) free_block(b);
}

void StagingPool::Lease::retire() noexcept {
  if (buf_.data == nullptr) return;
  const LockedBuffer b = std::exchange(buf_, LockedBuffer{});
  {
    std::lock_guard lock(pool_->mutex);
    pool_->stats.lent_bytes -= b.nbytes;
  }
  pool_.reset();
  free_block(b);
}

void StagingPool::Lease::abandon() noexcept {
  if (buf_.data == nullptr) return;
  const std::size_t n = std::exchange(buf_, LockedBuffer{}).nbytes;  // never freed
  g_live_blocks.fetch_sub(1, std::memory_order_relaxed);             // nor the pool's any more
  {
    std::lock_guard lock(pool_->mutex);
    pool_->stats.lent_bytes -= n;
  }
  pool_.reset();
}

}  // namespace deepio::detail
