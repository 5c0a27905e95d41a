// Engine: what a deepio::Handle is made of. Opens files, plans requests, hands slices to
// the workers, and tracks operations until they are collected.
//
// Invariants: every submitted op is in unclaimed_, in submission order (sequence 1, 2, ...,
// given by track()), until it is collected: by collect() (claim) or by its Future
// (take_result); collected ops are dropped from unclaimed_ by the next collect() or
// submission. An op is collected only when done, and collection moves its keep-alive to the
// collecting thread, so the engine itself never releases a keep-alive except in its
// destructor (ops nobody collected). The destructor stops the workers, and a worker stops
// only after finishing every slice queued to it, so no op is ever abandoned. Thread safety:
// all public members may be called concurrently; unclaimed_ and next_sequence_ are guarded
// by mutex_.
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
                                  int fd, std::uint64_t file_offset, OpOptions op_options = {});
  /// Handle::collect; `with` is the state of CollectOptions::with (or null).
  WaitResult collect(const CollectOptions& options, const std::shared_ptr<OpState>& with);
  std::size_t wait();
  [[nodiscard]] std::uint64_t mark() const noexcept;
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
  /// Gives a dispatched op its sequence number and adds it to unclaimed_ (dropping collected
  /// ops from the front on the way).
  void track(const std::shared_ptr<OpState>& op);

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
  std::uint64_t next_sequence_ = 1;                  // guarded by mutex_
};

}  // namespace deepio::detail
