// Completions: what each request's result leads to (decide() of core/completion.hpp says;
// this applies it and counts it), back-offs and held completions coming due, and a queue that
// failed for good. Runs on the worker thread (worker_impl.hpp).
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "core/worker_impl.hpp"
#include "platform/fault.hpp"

namespace deepio::detail {

namespace {
constexpr auto kHoldRecheck = std::chrono::microseconds(200);
constexpr auto kFencePoll = std::chrono::microseconds(50);
}  // namespace

// Fails the op of slot `id` as decision `d` says, and releases the slot.
void Worker::Impl::fail(std::uint32_t id, std::uint64_t tag, const Decision& d) {
  Slot& s = slots[id];
  OpState& op = *s.owner->task.op;
  std::string text = d.backend_text ? backend->take_error_text(tag) : std::string();
  if (text.empty()) text = d.message;
  text += d.suffix;
  op.fail(Status::failure(d.errnum, std::move(text), op.path(), s.req.offset, s.req.len));
  release(id);
}

void Worker::Impl::complete(const Completion& c) {
  const auto id = static_cast<std::uint32_t>(c.tag);
  Slot& s = slots[id];
  s.in_kernel = false;
  OpState& op = *s.owner->task.op;
  std::int64_t res = c.res;
  if (!dead.ok() && res == -dead.errnum) {
    // A request refused because the queue died: not retried, reported with the cause.
    op.fail(Status::failure(dead.errnum, dead.message, op.path(), s.req.offset, s.req.len));
    release(id);
    return;
  }
  if (auto injected = consult_fault_hook(
          {op.write() ? FaultPoint::Write : FaultPoint::Read, nullptr, s.req.fd, s.req.offset, s.req.len, res})) {
    if (*injected == kFaultHold) {  // not finished yet, as far as the test is concerned
      held.emplace_back(std::chrono::steady_clock::now() + kHoldRecheck, c);
      return;
    }
    res = *injected;
  }
  if (res >= 0 && c.fixed) {
    w.counters_->bytes_fixed.fetch_add(static_cast<std::size_t>(res), std::memory_order_relaxed);
  }
  // What to do is decide()'s (core/completion.hpp); doing it, and counting it, is here.
  const Decision d = decide({op.write(), s.buffered, s.req.driver_file != nullptr, s.retries, s.req.len}, res);
  s.retries = d.retries;
  switch (d.action) {
    case Action::Done: break;
    case Action::Resubmit:
    case Action::Backoff:
      w.counters_->retries.fetch_add(1, std::memory_order_relaxed);
      if (d.action == Action::Resubmit) {
        resubmit.push_back(id);  // interrupted, not short of anything: at once
      } else {
        deferred.emplace_back(std::chrono::steady_clock::now() + d.delay, id);
      }
      return;
    case Action::PageCache:
    case Action::Fail:
      if (d.action == Action::PageCache) {
        // The file system refused this O_DIRECT request: redo it through the page cache.
        if (to_buffered(s).ok()) {
          w.counters_->direct_refused.fetch_add(1, std::memory_order_relaxed);
          resubmit.push_back(id);
          return;
        }
      }
      fail(id, c.tag, d);
      return;
    case Action::Rest: {
      // Short transfer: the rest is resubmitted. Its offset may no longer be aligned, so a
      // direct request finishes through the page cache.
      w.counters_->short_transfers.fetch_add(1, std::memory_order_relaxed);
      s.req.buf = static_cast<std::byte*>(s.req.buf) + d.moved;
      s.req.offset += d.moved;
      s.req.len -= static_cast<std::uint32_t>(d.moved);
      if (Status st = d.to_page_cache ? to_buffered(s) : Status{}; !st.ok()) {
        op.fail(std::move(st));
        release(id);
        return;
      }
      resubmit.push_back(id);
      return;
    }
  }
  auto& counter = s.req.driver_file != nullptr                     ? w.counters_->bytes_gds
                  : s.mode == SegmentMode::Bounce                  ? w.counters_->bytes_bounced
                  : (s.mode == SegmentMode::Direct && !s.buffered) ? w.counters_->bytes_direct
                                                                   : w.counters_->bytes_buffered;
  counter.fetch_add(s.len, std::memory_order_relaxed);
  if (op.device() >= 0) w.counters_->bytes_staged.fetch_add(s.len, std::memory_order_relaxed);
  if (s.bounce >= 0 && !op.write()) {
    if (op.device() >= 0) {
      // The slot stays busy (and the op open) until the host-to-device copy has finished.
      Status cs = staging.start_copy_back(id, op.device(), s.bounce, s.user, s.len);
      if (!cs.ok()) {
        cs.path = op.path();
        op.fail(std::move(cs));
        release(id);
        return;
      }
      return;
    }
    std::memcpy(s.user, staging.at(s.bounce), s.len);
  }
  release(id);
}

// The backend could not hand back completions and retrying cannot help (the ring or
// context is broken). Looping would spin at 100% CPU with wait() never returning, so every
// request in the queue fails with the errno (waking its op's waiters) and the backend is
// never used again: later requests on this worker fail at once with the same cause.
// Order matters: the kernel queue is shut down first (waiting for, or cancelling, what it
// still holds), and only then are the ops failed and the slots released. Failing an op
// lets its caller free the buffer, and a released slot's bounce memory is reused: neither
// may happen while the kernel can still write into them.
void Worker::Impl::abandon_queue(int err) {
  const bool quiet = backend->shutdown();
  dead = Status::failure(
      err, std::string("the ") + backend->name() +
               " queue failed while collecting completions; its requests were abandoned" +
               (quiet ? " once the kernel was done with them" : " and may still be completed by the kernel"));
  for (std::uint32_t id = 0; id < slots.size(); ++id) {
    Slot& s = slots[id];
    if (!s.in_kernel) continue;
    s.in_kernel = false;
    s.owner->task.op->fail(Status::failure(err, dead.message, s.owner->task.op->path(), s.req.offset, s.req.len));
    release(id);
  }
  inflight = 0;
  // The kernel may still write into the arena: leaked on purpose, never reused (a dead
  // queue cuts no more requests), rather than freed under a DMA.
  if (!quiet) staging.abandon();
}

// Deferred slots whose back-off is over go back to the resubmission list; held completions
// due for another look are handled again.
void Worker::Impl::take_due() {
  if (deferred.empty() && held.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(deferred, [&](const auto& d) {
    if (d.first > now) return false;
    resubmit.push_back(d.second);
    return true;
  });
  std::erase_if(held, [&](const auto& h) {
    if (h.first > now) return false;
    synthetic.push_back(h.second);
    return true;
  });
}

// When the thread must look again without a completion or a new slice to wake it: the
// earliest back-off or held completion, or shortly for a fence being polled.
std::optional<Worker::Impl::Clock::time_point> Worker::Impl::next_due() const {
  std::optional<std::chrono::steady_clock::time_point> due;
  const auto consider = [&](std::chrono::steady_clock::time_point t) {
    if (!due || t < *due) due = t;
  };
  for (const auto& d : deferred) consider(d.first);
  for (const auto& h : held) consider(h.first);
  if (fence_pending) consider(std::chrono::steady_clock::now() + kFencePoll);
  return due;
}

}  // namespace deepio::detail
