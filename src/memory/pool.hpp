// StagingPool: an engine's one supply of host staging memory, lent out in blocks and taken
// back for the next borrower.
//
// Who borrows: each worker's bounce arena (core/staging.hpp: its slots for unaligned and
// device memory, one lease for the worker's life) and the windows of deepio.Writer and
// deepio.Reader (a lease per buffer, for a file's life). A lease given back is kept for the
// next borrower of the same size while the blocks kept total at most `keep_bytes`; beyond
// that, or when the pool goes, it is freed. So a process that saves many files one after
// another maps, faults in and locks its staging memory once, not once per file, and io_uring's
// and CUDA's registrations of that memory outlive each file.
//
// Memory: allocate_locked() (page-aligned, locked when RLIMIT_MEMLOCK allows, transparent huge
// pages from 2 MiB; is_locked() knows it), sizes rounded up to whole pages.
//
// Lifetime: a Lease holds the pool's shared state, so it may outlive the pool's owner (the
// Python object of a window may outlive its handle); the block is then freed when the lease
// goes. Lease::abandon() leaks the block on purpose (a dead kernel queue may still write into
// it); Lease::retire() frees it instead of keeping it (a borrower that cannot prove that no
// request still uses it must not hand it to the next one: it is freed only when no view of it
// is left, which the borrower guarantees by holding the lease until then).
//
// Errors: take() throws deepio::Error(ENOMEM) when no memory is available. Thread-safe: any
// thread may take and give back; the kept blocks are under one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "deepio/memory.hpp"

namespace deepio::detail {

class StagingPool {
  struct State;

 public:
  /// What the pool has done so far.
  struct Stats {
    std::uint64_t allocations = 0;  ///< blocks mapped (a take() that found none kept)
    std::uint64_t reuses = 0;       ///< take()s served by a kept block
    std::size_t lent_bytes = 0;     ///< bytes of the leases out now
    std::size_t kept_bytes = 0;     ///< bytes kept for the next borrower
  };

  /// One block lent out. Move-only; destroying it gives the block back (kept or freed).
  class Lease {
   public:
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { give_back(); }

    [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(buf_.data); }
    /// The block's size: what was asked for, rounded up to a whole page.
    [[nodiscard]] std::size_t size() const noexcept { return buf_.nbytes; }
    [[nodiscard]] bool locked() const noexcept { return buf_.locked; }
    [[nodiscard]] int lock_errno() const noexcept { return buf_.lock_errno; }
    /// Gives the block back now (kept for the next borrower or freed). Idempotent.
    void give_back() noexcept;
    /// Frees the block now, never handing it to another borrower. Idempotent.
    void retire() noexcept;
    /// Leaks the block: never freed, never reused (something may still write into it).
    void abandon() noexcept;

   private:
    friend class StagingPool;
    Lease(std::shared_ptr<State> pool, LockedBuffer buf) : pool_(std::move(pool)), buf_(buf) {}
    std::shared_ptr<State> pool_;
    LockedBuffer buf_;
  };

  /// A pool keeping at most `keep_bytes` of given-back blocks for reuse.
  explicit StagingPool(std::size_t keep_bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  /// A block of at least `nbytes` (0: one page), a kept block of that rounded size when there
  /// is one, else a fresh allocation. Throws deepio::Error(ENOMEM).
  [[nodiscard]] Lease take(std::size_t nbytes);
  [[nodiscard]] Stats stats() const;
  /// Frees every kept block (leases out are not affected).
  void trim() noexcept;
  /// Blocks of every pool in the process, lent or kept: the locked allocations that are
  /// staging memory (not leaks of anyone's), for accounting such as a test's leak check.
  [[nodiscard]] static std::uint64_t live_blocks() noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace deepio::detail
