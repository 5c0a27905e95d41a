// Which process an object belongs to. fork() copies a process's memory but only the calling
// thread: an engine made before a fork has, in the child, no worker, opener or sync threads,
// and mutexes that another parent thread held stay locked forever. Such an object must
// neither be used nor torn down in the child (joining threads that do not exist hangs).
//
// ProcessStamp records the process at construction; here() is one relaxed atomic load (a
// counter that a pthread_atfork child handler bumps), cheap enough for every submission.
// Thread-safe.
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

}  // namespace deepio::detail
