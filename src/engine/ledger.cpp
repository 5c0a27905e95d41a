// The engine's ledger: every submitted op in submission order (unclaimed_, numbered by
// next_sequence_) until it is collected, and the calls that read it: collect(), wait(),
// mark(), pending(). See engine.hpp for the invariants; everything here holds mutex_ while it
// touches unclaimed_ or next_sequence_, and waits on ops without it.
#include <algorithm>

#include "engine/engine.hpp"

namespace deepio::detail {

void Engine::track(const std::shared_ptr<OpState>& op) {
  std::lock_guard lock(mutex_);
  // Ops already collected (through their Future) need no wait(): drop them. Their keep-alives
  // went to whoever collected them, so nothing of the caller's is released here.
  while (!unclaimed_.empty() && unclaimed_.front()->claimed()) unclaimed_.pop_front();
  op->set_sequence(next_sequence_++);
  unclaimed_.push_back(op);
}

void Engine::track(const std::vector<std::shared_ptr<OpState>>& ops) {
  std::lock_guard lock(mutex_);
  while (!unclaimed_.empty() && unclaimed_.front()->claimed()) unclaimed_.pop_front();
  for (const auto& op : ops) {
    op->set_sequence(next_sequence_++);
    unclaimed_.push_back(op);
  }
}

std::uint64_t Engine::mark() const noexcept {
  std::lock_guard lock(mutex_);
  return next_sequence_ - 1;
}

Collected Engine::collect(const BindingCollect& options, const std::shared_ptr<OpState>& with) {
  process_.check();  // the parent's workers will never finish anything here
  const auto selected = [&](const std::shared_ptr<OpState>& op) {
    return op.get() == with.get() || !op->detached() || options.detached;
  };
  // 0. With a deadline (a binding waiting in slices), the newest selected op first: while it
  // runs, this returns without a snapshot of every pending op (a batch of 65 536 requests
  // was otherwise copied, and each op's lock taken, every slice while it ran).
  if (options.deadline) {
    std::shared_ptr<OpState> newest;
    {
      std::lock_guard lock(mutex_);
      const std::uint64_t through = std::min(options.through, next_sequence_ - 1);
      for (auto it = unclaimed_.rbegin(); it != unclaimed_.rend(); ++it) {
        if ((*it)->sequence() > through || (*it)->claimed() || !selected(*it)) continue;
        newest = *it;
        break;
      }
    }
    if (newest && !newest->wait_until(*options.deadline)) {
      Collected result;
      result.complete = false;  // nothing claimed: the ops stay pending for a later call
      return result;
    }
  }
  // 1. The snapshot, in submission order: what this call waits for and collects.
  std::vector<std::shared_ptr<OpState>> ops;
  {
    std::lock_guard lock(mutex_);
    const std::uint64_t through = std::min(options.through, next_sequence_ - 1);
    for (const auto& op : unclaimed_) {
      if (op->sequence() > through || op->claimed()) continue;
      if (selected(op)) ops.push_back(op);
    }
  }
  if (with && std::find(ops.begin(), ops.end(), with) == ops.end() && !with->claimed()) {
    ops.insert(std::upper_bound(ops.begin(), ops.end(), with,
                                [](const auto& a, const auto& b) { return a->sequence() < b->sequence(); }),
               with);
  }
  // 2. Wait, newest first: workers finish their queues in order, so once the newest op is
  // done most others are too, and the caller wakes up a few times instead of once per op.
  Collected result;
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (!options.deadline) {
      (*it)->wait();
    } else if (!(*it)->wait_until(*options.deadline)) {
      result.complete = false;  // nothing claimed: the ops stay pending for a later call
      return result;
    }
  }
  // 3. Claim. An op another thread collected meanwhile is skipped: each op is counted once.
  std::lock_guard lock(mutex_);
  for (const auto& op : ops) {
    Status err;
    std::shared_ptr<void> keep;
    const bool counted = op.get() == with.get() || !op->detached();  // else: the outcome stays with its Future
    if (!op->claim(&err, &keep, counted)) continue;
    if (keep) result.keep_alive.push_back(std::move(keep));
    if (!counted) continue;
    ++result.count;
    if (!err.ok()) result.errors.emplace_back(err.errnum, err.message, err.path, err.offset, err.nbytes);
  }
  // Detached ops whose every Future is gone and that are done: nobody else can collect them.
  // use_count() == 1 under mutex_ means unclaimed_ holds the only reference, and no new one
  // can be made without mutex_; transient references (a worker's, another snapshot's) only
  // postpone this to a later call. The count is read first: it costs no lock, and an op
  // somebody still holds a Future of is skipped without touching its mutex.
  bool reaped = false;
  for (const auto& op : unclaimed_) {
    if (op.use_count() != 1 || !op->detached()) continue;
    Status err;
    std::shared_ptr<void> keep;
    // Silent: a failure was reported when the last Future went (OpState::drop_future).
    if (!op->claim(&err, &keep, /*counted=*/false)) continue;
    reaped = true;
    if (keep) result.keep_alive.push_back(std::move(keep));
  }
  // Ops collected by their Future in the middle of the list go with the next call that
  // collects something; track() drops them from the front meanwhile.
  if (!ops.empty() || reaped) {
    std::erase_if(unclaimed_, [](const std::shared_ptr<OpState>& op) { return op->claimed(); });
  }
  return result;
}

std::size_t Engine::wait() {
  Collected r = collect(BindingCollect{}, nullptr);
  if (!r.errors.empty()) throw r.errors.front();
  return r.count;
}

std::size_t Engine::pending() const noexcept {
  std::lock_guard lock(mutex_);
  // Collected ops (through their Future) and detached ones are not waited for by wait().
  return static_cast<std::size_t>(std::count_if(unclaimed_.begin(), unclaimed_.end(),
                                                [](const auto& op) { return !op->claimed() && !op->detached(); }));
}

}  // namespace deepio::detail
