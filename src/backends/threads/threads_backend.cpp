// The portable backend: each request is one pread(2) or pwrite(2) call, run by a thread of
// the backend's own pool, so that the worker thread never waits inside a request (a slow
// drive holds only the pool threads running its requests, never the worker's other work).
// Lifecycle: no threads at creation; submit() starts one more whenever a request finds every
// pool thread busy, up to queue_depth (the most requests a worker has in flight), so a worker
// that keeps one request in flight has one thread. Threads stay until shutdown(), which lets
// each finish the request it runs, drops the requests not started (their buffers are never
// touched: the worker fails them), and joins them.
// Errors: the call's -errno becomes the completion result; short counts are passed through
// for the worker to finish. A thread that cannot be started (EAGAIN from the system) is not
// retried: the requests wait for a running one; with none at all, submit() runs the request
// itself.
// Thread safety: one mutex guards the queues; the pool waits on `work_`, reap() on `done_`,
// which wake() also signals (Backend::wake).
#include "backends/threads/threads_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace deepio::detail {

namespace {

std::int64_t run_request(const Request& r) noexcept {
  const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                            : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
  return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
}

class ThreadsBackend final : public Backend {
 public:
  explicit ThreadsBackend(std::size_t queue_depth) : max_threads_(std::max<std::size_t>(1, queue_depth)) {}
  ~ThreadsBackend() override { shutdown(); }
  ThreadsBackend(const ThreadsBackend&) = delete;
  ThreadsBackend& operator=(const ThreadsBackend&) = delete;

  [[nodiscard]] const char* name() const noexcept override { return "threads"; }

  int submit(std::span<const Request> reqs) override {
    std::unique_lock lock(mutex_);
    if (stopping_) return -ESHUTDOWN;
    for (const Request& r : reqs) todo_.push_back(r);
    while (todo_.size() > idle_ && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { serve(); });
      } catch (const std::system_error&) {
        break;  // the requests wait for a running thread
      }
      ++idle_;  // counted idle until it takes a request
    }
    if (threads_.empty()) {
      // No thread could be started at all: run them here, as the worker's own calls.
      while (!todo_.empty()) {
        const Request r = todo_.front();
        todo_.pop_front();
        done_.push_back({r.tag, run_request(r)});
      }
      return static_cast<int>(reqs.size());
    }
    lock.unlock();
    if (reqs.size() == 1) {
      work_.notify_one();
    } else {
      work_.notify_all();
    }
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us) override {
    std::unique_lock lock(mutex_);
    const auto ready = [&] { return done_.size() >= min || woken_; };
    if (max_wait_us < 0) {
      reaper_.wait(lock, ready);
    } else {
      reaper_.wait_for(lock, std::chrono::microseconds(max_wait_us), ready);
    }
    woken_ = false;
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return static_cast<int>(n);
  }

  void wake() noexcept override {
    {
      std::lock_guard lock(mutex_);
      woken_ = true;
    }
    reaper_.notify_one();
  }

  bool shutdown() noexcept override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && threads_.empty()) return true;
      stopping_ = true;
      todo_.clear();  // never started: their memory is not touched
      threads.swap(threads_);
    }
    work_.notify_all();
    for (auto& t : threads) t.join();
    return true;
  }

 private:
  void serve() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !todo_.empty(); });
      if (stopping_) return;
      const Request r = todo_.front();
      todo_.pop_front();
      --idle_;
      lock.unlock();
      const std::int64_t res = run_request(r);
      lock.lock();
      ++idle_;
      done_.push_back({r.tag, res});
      reaper_.notify_one();
    }
  }

  const std::size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable work_;    // the pool: todo_ or stopping_
  std::condition_variable reaper_;  // the worker in reap(): done_ or woken_
  std::deque<Request> todo_;        // guarded by mutex_
  std::deque<Completion> done_;     // guarded by mutex_
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;   // guarded by mutex_: threads not running a request
  bool woken_ = false;     // guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_
};

}  // namespace

std::unique_ptr<Backend> make_threads_backend(std::size_t queue_depth) {
  return std::make_unique<ThreadsBackend>(queue_depth);
}

}  // namespace deepio::detail
