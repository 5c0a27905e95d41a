// Openers: a small pool of threads that run posted jobs: the engine's batch openers (open,
// size and plan the requests of a batch so that the submitting thread returns at once) and
// the sync threads' pool (Syncers).
//
// Protocol: jobs run in the order posted per thread; stop() runs every job already posted
// before joining, so no posted job is ever dropped. A constructor that cannot start every
// thread stops the ones it started and throws (never std::terminate). Thread safety: post()
// and stop() may be called from any thread; stop() is idempotent.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepio::detail {

class Openers {
 public:
  explicit Openers(std::size_t n);
  ~Openers() { stop(); }
  Openers(const Openers&) = delete;
  Openers& operator=(const Openers&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return threads_.size(); }
  /// Queues `job` for one of the threads (throws only if it cannot be queued: out of memory).
  void post(std::function<void()> job);
  /// Runs every job posted so far, then joins the threads.
  void stop() noexcept;

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                   // guarded by mutex_
  std::vector<std::thread> threads_;
};

}  // namespace deepio::detail
