// BatchFuture's shared state: completed once by the batch thread that ran the batch.
//
// Protocol: complete() stores the results and sets done under mu, wakes every waiter, then
// runs the callbacks registered before, on the completing thread, with no lock held. A
// callback registered after done runs at once on the registering thread. Results are
// immutable once done. Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "deepio/kv.hpp"
#include "platform/process.hpp"

namespace deepio::kv {

struct BatchFuture::State {
  explicit State(deepio::detail::ProcessStamp s) : stamp(s) {}

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<bool> results;
  std::vector<std::function<void()>> callbacks;
  /// The store's process: a forked child's calls throw deepio::ForkedHandle.
  const deepio::detail::ProcessStamp stamp;

  void complete(std::vector<bool> r);
};

}  // namespace deepio::kv
