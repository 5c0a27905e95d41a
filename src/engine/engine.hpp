// Engine: what a deepio::Handle is made of. Opens files, plans requests, hands slices to
// the workers, and tracks operations until wait() collects them.
//
// Invariants: every submitted op is in unclaimed_ until a wait() claims it (or, for ops
// whose Future::get() observed them, until they are pruned); an op leaves unclaimed_ only
// when done. The destructor stops the workers, and a worker stops only after finishing
// every slice queued to it, so no op is ever abandoned. Thread safety: all public members
// may be called concurrently; unclaimed_ is guarded by mutex_.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/op.hpp"
#include "core/worker.hpp"
#include "engine/device.hpp"
#include "deepio/handle.hpp"

namespace deepio::detail {

class Engine {
 public:
  explicit Engine(const HandleOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Exactly one of path / fd names the file (fd < 0 when path is used).
  std::shared_ptr<OpState> submit(bool write, void* buf, std::size_t nbytes, const std::string* path,
                                  int fd, std::uint64_t file_offset);
  std::size_t wait();
  [[nodiscard]] std::size_t pending() const noexcept;
  [[nodiscard]] const HandleOptions& options() const noexcept { return options_; }
  [[nodiscard]] BackendKind backend() const noexcept { return kind_; }
  [[nodiscard]] HandleStats stats() const noexcept;

 private:
  struct Opened;
  void open_path(OpState& op, bool write, const std::string& path, std::uint64_t* size, Opened* out);
  void dispatch(const std::shared_ptr<OpState>& op, void* buf, std::size_t nbytes, std::uint64_t file_offset,
                const Opened& opened);
  Status open_with_backpressure(const std::string& path, int flags, UniqueFd* fd);

  HandleOptions options_;
  BackendKind kind_ = BackendKind::Threads;
  std::size_t bounce_slot_bytes_ = 0;
  DeviceSupport device_;
  Counters counters_;
  CompletionSignal signal_;
  std::atomic<std::uint64_t> submitted_{0};
  std::vector<std::unique_ptr<Worker>> workers_;

  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<OpState>> unclaimed_;  // guarded by mutex_
};

}  // namespace deepio::detail
