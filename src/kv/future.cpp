#include "kv/future.hpp"

namespace deepio::kv {

void BatchFuture::State::complete(std::vector<bool> r) {
  std::vector<std::function<void()>> cbs;
  {
    std::lock_guard lk(mu);
    results = std::move(r);
    done = true;
    cbs.swap(callbacks);
  }
  cv.notify_all();
  for (auto& fn : cbs) fn();
}

namespace {
/// The state, after the fork check (before any lock: one held at the fork stays held).
BatchFuture::State& usable(const std::shared_ptr<BatchFuture::State>& s) {
  if (!s) throw InvalidArgument("kv::BatchFuture: empty future");
  s->stamp.check();
  return *s;
}
}  // namespace

bool BatchFuture::done() const {
  State& s = usable(state_);
  std::lock_guard lk(s.mu);
  return s.done;
}

void BatchFuture::wait() const {
  State& s = usable(state_);
  std::unique_lock lk(s.mu);
  s.cv.wait(lk, [&] { return s.done; });
}

bool BatchFuture::wait_for(std::chrono::nanoseconds timeout) const {
  State& s = usable(state_);
  std::unique_lock lk(s.mu);
  return s.cv.wait_for(lk, timeout, [&] { return s.done; });
}

const std::vector<bool>& BatchFuture::get() const {
  wait();
  return state_->results;  // immutable once done
}

void BatchFuture::on_done(std::function<void()> fn) const {
  State& s = usable(state_);
  {
    std::lock_guard lk(s.mu);
    if (!s.done) {
      s.callbacks.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

}  // namespace deepio::kv
