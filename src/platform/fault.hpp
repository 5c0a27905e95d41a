// Test-only fault injection. Production code never sets a hook; when none is set the cost is
// one relaxed atomic load per call site.
//
// Protocol: before an open, and after every read/write completion (any backend, before the
// engine looks at the result), the engine asks the hook. The hook returns std::nullopt to
// leave things alone, or a replacement result: a negative errno to fail the call, or a byte
// count smaller than the real one to simulate a short transfer (which the engine must finish
// by resubmitting the rest). Reap and Submit are asked before a worker collects completions
// from (or hands requests to) its backend: a negative errno replaces the backend's answer
// without calling it, which is how tests make a kernel queue fail. Sync is asked before the
// fdatasync of a durable write (path and fd set): a negative errno replaces its result. Issue
// is told of every request (fd, offset, nbytes, write) once, when the worker queues it for the
// backend (a retry or the rest of a short transfer is queued again), before anything of it
// reaches the kernel; its answer is ignored: how a test sees every write before it happens
// (platform/crash_sim.hpp). Hooks run on worker threads and must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

namespace deepio::detail {

enum class FaultPoint { Open, Read, Write, Reap, Submit, Sync, Issue };

struct FaultSite {
  FaultPoint point;
  const char* path;  ///< for Open and Sync; nullptr otherwise
  int fd;            ///< for Read/Write
  std::uint64_t offset;
  std::size_t nbytes;   ///< requested
  std::int64_t result;  ///< what the kernel returned (Read/Write); 0 for Open
  int flags = 0;        ///< open(2) flags, for Open
  bool write = false;   ///< for Issue: the request writes
};

using FaultHook = std::function<std::optional<std::int64_t>(const FaultSite&)>;

/// A hook's answer at Read/Write: the completion is held back, as if the device had not
/// finished the request yet. The worker keeps the request in flight (its queue slot, its
/// device's share) and asks the hook again about 0.2 ms later, serving other requests
/// meanwhile: how tests make one file's device slow without blocking a thread.
inline constexpr std::int64_t kFaultHold = INT64_MIN;

/// Installs (or, with an empty function, removes) the process-wide hook. Not to be called
/// while I/O is in flight.
void set_fault_hook(FaultHook hook);

/// Asks the hook, if any. Returns the result to use instead of site.result.
std::optional<std::int64_t> consult_fault_hook(const FaultSite& site);

}  // namespace deepio::detail
