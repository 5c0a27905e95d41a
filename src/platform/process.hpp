// Which process an object belongs to, and the process-wide locks that fork() must not copy
// while held.
//
// fork() copies a process's memory but only the calling thread: an engine made before a fork
// has, in the child, no worker, opener or sync threads, and mutexes that another parent
// thread held stay locked forever. Such an object must neither be used nor torn down in the
// child (joining threads that do not exist hangs).
//
// ProcessStamp records the process at construction; here() is one relaxed atomic load (a
// counter that a pthread_atfork child handler bumps), cheap enough for every submission.
// Thread-safe.
//
// Process-wide locks (those of no engine: the locked-memory registry, the CUDA fence pools,
// the device support, the fault hook) are registered with register_fork_lock(), one per
// ForkLockRank. A pthread_atfork prepare handler takes them all, in rank order, on the forking
// thread, so no other thread holds one (half way through changing what it guards) at the
// fork; the parent and child handlers release them, in reverse order. A lock whose holder
// calls out to code that takes another registered lock must rank before it.
#pragma once

#include <cstdint>

namespace deepio::detail {

class ProcessStamp {
 public:
  ProcessStamp() noexcept;
  /// True in the process that made this stamp (false in a forked child).
  [[nodiscard]] bool here() const noexcept;
  /// The id of the process that made this stamp.
  [[nodiscard]] long pid() const noexcept { return pid_; }
  /// Throws deepio::ForkedHandle unless here().
  void check() const;

 private:
  std::uint64_t generation_;
  long pid_;
};

/// The order in which fork's prepare handler takes the process-wide locks (lowest first).
enum class ForkLockRank : int {
  kDeviceSupport = 0,    // engine/device.cpp
  kFencePools = 1,       // engine/cuda_stager.cpp: the pool map, then each pool
  kLockedListeners = 2,  // memory/locked.cpp: held while listeners run (they take backend locks)
  kLockedRegistry = 3,   // memory/locked.cpp
  kFaultHook = 4,        // platform/fault.cpp
  kCount = 5,
};

/// Takes (lock) and releases (unlock) one rank's locks. Plain functions: called from the
/// atfork handlers, where nothing may allocate.
struct ForkLock {
  void (*lock)() noexcept;
  void (*unlock)() noexcept;
};

/// Registers `fns` for `rank` (one registration per rank; a later one replaces it) and the
/// atfork handlers on first use. Meant for namespace-scope initialisers, so that the lock is
/// known before any thread can take it. Returns true.
bool register_fork_lock(ForkLockRank rank, ForkLock fns) noexcept;

/// For tests: what is registered for `rank` (null functions when nothing is).
[[nodiscard]] ForkLock registered_fork_lock(ForkLockRank rank) noexcept;

}  // namespace deepio::detail
