// The job threads of openers.hpp: a FIFO under one mutex, drained before the threads join.
#include "engine/openers.hpp"

#include <utility>

namespace deepio::detail {

Openers::Openers(std::size_t n) {
  try {
    for (std::size_t i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  } catch (...) {
    stop();  // the threads already started end (nothing was posted yet); never terminate()
    throw;
  }
}

void Openers::post(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Openers::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void Openers::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace deepio::detail
