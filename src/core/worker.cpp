#include "core/worker.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <optional>
#include <thread>

#include "core/completion.hpp"
#include "core/staging.hpp"
#include "platform/fault.hpp"

namespace deepio::detail {

namespace {

constexpr auto kHoldRecheck = std::chrono::microseconds(200);
constexpr auto kFencePoll = std::chrono::microseconds(50);
// The longest wait for a one-device batch (overlap_events off) before looking for new work.
constexpr std::int64_t kBatchWaitUs = 1000;

struct Lane;

// One slice in its lane. `closed`: nothing more is issued from it (all cut, or its op failed);
// it is retired once its last request is released too.
struct Active {
  SliceTask task;
  Lane* lane = nullptr;
  std::list<Active>::iterator self;
  std::size_t seg = 0;    // next segment to issue from
  std::uint64_t pos = 0;  // bytes of segments[seg] already issued
  std::size_t outstanding = 0;
  bool ordered = false;  // the op's fence (if any) was honoured before this slice's first copy
  bool closed = false;
  [[nodiscard]] bool issued_all() const { return seg >= task.segments.size(); }
};

// One device's slices (see the file comment of worker.hpp).
struct Lane {
  std::uint64_t key = 0;
  std::list<Active> run;               // arrival order
  std::list<Active>::iterator cursor;  // first slice not closed, or run.end()
  std::size_t waiting = 0;             // slices not closed
  std::size_t inflight = 0;            // queue slots held by its requests
  std::uint64_t inflight_bytes = 0;    // their bytes
  std::size_t bounces = 0;             // bounce slots held by its requests
  std::int64_t deficit = 0;            // bytes left of its turn (deficit round-robin)
  bool stalled = false;                // cannot issue in this pass (bounce slot, fence)
};

struct Slot {
  Active* owner = nullptr;
  Request req;  // what is (re)submitted next
  SegmentMode mode = SegmentMode::Buffered;
  bool buffered = false;      // req.fd is the buffered descriptor
  std::byte* user = nullptr;  // caller's memory for the whole original request
  std::size_t len = 0;        // original length
  int bounce = -1;            // bounce slot index, or -1
  int retries = 0;
  bool in_kernel = false;  // accepted by the backend, completion not yet reaped
  bool in_memory = false;  // run here with pread/pwrite, not by the backend (Segment::in_memory)
};

// One request on a file in memory, run synchronously: the byte count or a negative errno,
// as a backend's completion would carry it.
std::int64_t run_in_memory(const Request& r) noexcept {
  const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                            : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
  return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
}

}  // namespace

struct Worker::Impl {
  Worker& w;
  std::list<Lane> lanes;           // devices with slices here; dropped when they have none
  std::list<Lane>::iterator turn;  // the lane whose turn it is, or lanes.end()
  bool fence_pending = false;      // a lane waits for a producer's fence (polled)
  bool batch_open = false;         // part of a one-device batch is still out (run())
  std::vector<Slot> slots;
  std::vector<std::uint32_t> free_slots;
  std::vector<std::uint32_t> resubmit;  // slots to submit again (retry, short, fallback)
  std::vector<Request> batch;
  std::vector<std::uint32_t> batch_slots;
  std::vector<Completion> completions;
  std::vector<Completion> synthetic;  // submission failures, handled like completions
  std::size_t inflight = 0;
  // Set when the backend's queue failed in a way that cannot be retried (a reap error other
  // than EINTR/EAGAIN/EBUSY): every request that was in it has failed, and every later one
  // fails at once with this status instead of going to a queue that no longer works.
  Status dead;
  std::deque<SliceTask> taken;  // scratch for pull()
  // Slices whose requests have all finished: their ops are told (slice_done, which may close
  // files and wake waiters) only after the next requests are on their way to the device.
  std::vector<std::shared_ptr<OpState>> finished;
  // Slots waiting out their EAGAIN back-off: (when to resubmit, slot). Held out of the queue
  // depth like in-flight ones.
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::uint32_t>> deferred;
  // Completions a test's fault hook holds back (kFaultHold): looked at again when due. Their
  // slots stay taken, as if still in the kernel.
  std::vector<std::pair<std::chrono::steady_clock::time_point, Completion>> held;
  int reap_failures = 0;  // transient reap failures in a row
  // The bounce slots and the device stagers (core/staging.hpp).
  Staging staging;
  // Last member, so destroyed first: the kernel queue is shut down (waiting for what it still
  // holds) before the bounce arena and the stagers it may be writing into are freed.
  std::unique_ptr<Backend> backend;

  explicit Impl(Worker& worker)
      : w(worker),
        turn(lanes.end()),
        staging(w.config_.bounce_slot_bytes, w.config_.bounce_slots, w.config_.stager_factory, w.config_.pool),
        backend(std::move(worker.backend_)) {
    const std::size_t qd = w.config_.queue_depth;
    slots.resize(qd);
    free_slots.reserve(qd);
    for (std::size_t i = qd; i-- > 0;) free_slots.push_back(static_cast<std::uint32_t>(i));
    resubmit.reserve(qd);
    batch.reserve(qd);
    batch_slots.reserve(qd);
    completions.resize(qd);
    synthetic.reserve(qd);
  }

  // Moves every queued slice into its device's lane (one lock for many small ops). Returns
  // false if the queue was empty.
  bool pull() {
    {
      std::lock_guard lock(w.mutex_);
      if (w.queue_.empty()) return false;
      taken.swap(w.queue_);
    }
    Lane* last = nullptr;
    for (auto& task : taken) {
      if (last == nullptr || last->key != task.device_key) last = &lane_for(task.device_key);
      Lane& l = *last;
      l.run.emplace_back(Active{std::move(task), &l, {}});
      auto it = std::prev(l.run.end());
      it->self = it;
      ++l.waiting;
      if (l.cursor == l.run.end()) l.cursor = it;
    }
    taken.clear();
    return true;
  }

  Lane& lane_for(std::uint64_t key) {
    for (Lane& l : lanes) {
      if (l.key == key) return l;
    }
    Lane& l = lanes.emplace_back();
    l.key = key;
    l.cursor = l.run.end();
    if (turn == lanes.end()) turn = std::prev(lanes.end());
    return l;
  }

  [[nodiscard]] bool any_waiting() const {
    return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) { return l.waiting > 0; });
  }

  // Nothing more is issued from slice `a`; retired now if none of its requests is out.
  void close(Active& a) {
    if (a.closed) return;
    a.closed = true;
    a.seg = a.task.segments.size();
    Lane& l = *a.lane;
    --l.waiting;
    if (l.cursor == a.self) {
      auto it = std::next(a.self);
      while (it != l.run.end() && it->closed) ++it;
      l.cursor = it;
    }
    if (a.outstanding == 0) retire(&a);
  }

  void retire(Active* a) {
    finished.push_back(std::move(a->task.op));
    Lane* l = a->lane;
    l->run.erase(a->self);
    if (!l->run.empty()) return;
    for (auto it = lanes.begin(); it != lanes.end(); ++it) {
      if (&*it != l) continue;
      if (turn == it) turn = std::next(it);
      lanes.erase(it);
      break;
    }
    if (turn == lanes.end()) turn = lanes.begin();
  }

  // Completes the retired slices' ops. Closing a file costs about as much as reading 64 KiB
  // from it here, so this runs after the refill has reached the kernel.
  void finish_retired() {
    if (finished.empty()) return;
    if (dead.ok()) backend->flush();
    for (auto& op : finished) op->slice_done();
    finished.clear();
  }

  void release(std::uint32_t id) {
    Slot& s = slots[id];
    Active* a = s.owner;
    Lane& l = *a->lane;
    --l.inflight;
    l.inflight_bytes -= s.len;
    if (s.bounce >= 0) {
      staging.give_back(s.bounce);
      --l.bounces;
    }
    s = Slot{};
    free_slots.push_back(id);
    if (--a->outstanding == 0 && a->closed) retire(a);
  }

  // Releases slots whose host-to-device copies have finished; with `block`, waits for all.
  void drain(bool block) {
    staging.drain(block, [this](std::uint32_t id, Status err) {
      if (!err.ok()) slots[id].owner->task.op->fail(std::move(err));
      release(id);
    });
  }

  // The shares of the lanes while `demand` of them have requests left to issue.
  struct Caps {
    std::size_t requests = 0;  // queue_depth with one lane
    std::uint64_t bytes = UINT64_MAX;
    std::size_t bounces = SIZE_MAX;
  };
  [[nodiscard]] Caps caps(std::size_t demand) const {
    Caps c;
    const std::size_t qd = w.config_.queue_depth;
    c.requests = qd;
    if (demand <= 1) return c;
    const std::uint64_t bytes = w.config_.inflight_bytes != 0 ? w.config_.inflight_bytes
                                                              : std::uint64_t{qd} * w.config_.quantum;
    c.requests = std::max<std::size_t>(1, (qd + demand - 1) / demand);
    c.bytes = std::max<std::uint64_t>(1, (bytes + demand - 1) / demand);
    c.bounces = std::max<std::size_t>(1, staging.slot_count() / demand);
    return c;
  }

  [[nodiscard]] static bool eligible(const Lane& l, const Caps& c) {
    return l.waiting > 0 && !l.stalled && l.inflight < c.requests && (l.inflight == 0 || l.inflight_bytes < c.bytes);
  }

  // The oldest slice of lane `l` under its share of the lane (`lane_cap` requests), or null.
  static Active* pick_slice(Lane& l, std::size_t lane_cap) {
    const std::size_t cap = l.waiting <= 1 ? SIZE_MAX
                                           : std::max<std::size_t>(1, (lane_cap + l.waiting - 1) / l.waiting);
    for (auto it = l.cursor; it != l.run.end(); ++it) {
      if (it->closed) continue;
      if (it->outstanding < cap || it->task.op->failed()) return &*it;
    }
    return nullptr;
  }

  // The lane whose turn it is (deficit round-robin by bytes over the eligible lanes), or null.
  Lane* pick_lane(const Caps& c) {
    if (lanes.empty()) return nullptr;
    if (turn == lanes.end()) turn = lanes.begin();
    const auto quantum = static_cast<std::int64_t>(w.config_.quantum);
    // Two rounds at most: the first gives every eligible lane a quantum, so the second finds
    // one with bytes left (a request is never larger than a quantum).
    for (std::size_t visits = 0; visits <= 2 * lanes.size(); ++visits) {
      Lane& l = *turn;
      if (eligible(l, c)) {
        if (l.deficit > 0) return &l;
        l.deficit += quantum;  // its turn is over: the next one starts with a quantum
      } else if (l.waiting == 0) {
        l.deficit = 0;  // no backlog, no credit kept
      }
      if (++turn == lanes.end()) turn = lanes.begin();
    }
    return nullptr;
  }

  enum class Cut : std::uint8_t { Issued, Skipped, Stalled };

  // Cuts the next request into `batch`, from the lane whose turn it is. Returns false when
  // nothing can be issued now (no work, every lane at its share, or waiting for a bounce
  // slot or a fence).
  bool next_request() {
    bool pulled = false;
    for (;;) {
      std::size_t demand = 0;
      for (const Lane& l : lanes) demand += l.waiting > 0 ? 1 : 0;
      const Caps c = caps(demand);
      Lane* l = pick_lane(c);
      Active* a = l != nullptr ? pick_slice(*l, c.requests) : nullptr;
      if (l != nullptr && a == nullptr) {
        l->stalled = true;  // every slice at its share of the lane: the next lane's turn
        continue;
      }
      if (a != nullptr) {
        switch (cut(*a, c)) {
          case Cut::Issued: return true;
          case Cut::Skipped: continue;
          case Cut::Stalled: l->stalled = true; continue;
        }
      }
      if (!pulled && pull()) {
        pulled = true;
        continue;
      }
      // Only a bounce slot is missing, and copies back to the device hold some: wait for the
      // oldest rather than for the disk.
      const bool bounce_bound = std::any_of(lanes.begin(), lanes.end(), [](const Lane& ln) { return ln.stalled; });
      if (bounce_bound && !fence_pending && staging.draining() && !staging.has_free()) {
        drain(true);
        for (Lane& ln : lanes) ln.stalled = false;
        continue;
      }
      return false;
    }
  }

  // Cuts one request of slice `a` into `batch`.
  Cut cut(Active& a, const Caps& c) {
    {
      OpState& op = *a.task.op;
      if (op.failed() || a.issued_all()) {
        close(a);
        return Cut::Skipped;
      }
      const Segment& seg = a.task.segments[a.seg];
      if (!dead.ok()) {
        // The queue is gone: nothing is cut, staged or bounced for it any more.
        op.fail(Status::failure(dead.errnum, dead.message, op.path(), seg.file_offset + a.pos, seg.nbytes - a.pos));
        close(a);
        return Cut::Skipped;
      }
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(seg.chunk, seg.nbytes - a.pos));
      Slot s;
      s.owner = &a;
      s.mode = seg.mode;
      s.user = seg.buf + a.pos;
      s.len = len;
      s.req.len = static_cast<std::uint32_t>(len);
      s.req.offset = seg.file_offset + a.pos;
      s.req.write = op.write();
      s.in_memory = seg.in_memory;
      const bool staged = seg.mode == SegmentMode::Bounce || op.device() >= 0;
      if (seg.mode == SegmentMode::Buffered) {
        if (Status st = to_buffered(s); !st.ok()) {
          op.fail(std::move(st));
          close(a);
          return Cut::Skipped;
        }
      } else {
        s.req.fd = op.direct_fd();
      }
      s.req.buf = s.user;
      if (a.task.direct_device) s.req.driver_file = a.task.driver_file.get();
      if (a.task.direct_device && !a.ordered && op.fence() != nullptr) {
        // A route's transfers (cuFile) follow no stream: they wait for the producer, and the
        // worker serves other slices meanwhile (the fence is polled).
        Status fs;
        if (!op.fence()->poll(&fs)) {
          fence_pending = true;
          return Cut::Stalled;
        }
        if (!fs.ok()) {
          fs.path = op.path();
          op.fail(std::move(fs));
          close(a);
          return Cut::Skipped;
        }
        a.ordered = true;
      }
      if (!staged) s.req.region = op.region();
      if (staged) {
        if (!staging.ensure()) {
          op.fail(Status::failure(ENOMEM, "cannot allocate bounce buffers", op.path(), s.req.offset, len));
          close(a);
          return Cut::Skipped;
        }
        DeviceStager* st = nullptr;
        if (op.device() >= 0) {
          Status why;
          st = staging.stager(op.device(), &why);
          if (st == nullptr) {
            why.path = op.path();
            op.fail(std::move(why));
            close(a);
            return Cut::Skipped;
          }
          if (!a.ordered && op.fence() != nullptr) {
            // Before this slice's first copy, either way: a write's device-to-host copy must
            // see what the producer wrote, a read's host-to-device copy must not overtake
            // what the producer still does with the destination.
            if (Status os = st->order_after(*op.fence()); !os.ok()) {
              os.path = op.path();
              op.fail(std::move(os));
              close(a);
              return Cut::Skipped;
            }
            a.ordered = true;
          }
        }
        // Its share of the bounce slots, or none free: the next lane's turn (next_request
        // waits for a copy back to the device only when no lane can issue).
        if (a.lane->bounces >= c.bounces || !staging.has_free()) return Cut::Stalled;
        s.bounce = staging.take();
        ++a.lane->bounces;
        std::byte* b = staging.at(s.bounce);
        if (op.write()) {
          if (st != nullptr) {
            Status cs = st->to_staging(s.bounce, b, s.user, len);
            if (!cs.ok()) {
              staging.give_back(s.bounce);
              --a.lane->bounces;
              cs.path = op.path();
              op.fail(std::move(cs));
              close(a);
              return Cut::Skipped;
            }
          } else {
            std::memcpy(b, s.user, len);
          }
        }
        s.req.buf = b;
      }
      if (op.device() >= 0 || s.req.driver_file != nullptr) {
        w.counters_->device_requests.fetch_add(1, std::memory_order_relaxed);
      }
      const std::uint64_t seg_bytes = seg.nbytes;
      a.pos += len;
      if (a.pos == seg_bytes) {
        ++a.seg;
        a.pos = 0;
      }
      ++a.outstanding;
      Lane& l = *a.lane;
      ++l.inflight;
      l.inflight_bytes += len;
      l.deficit -= static_cast<std::int64_t>(len);
      const std::uint32_t id = free_slots.back();
      free_slots.pop_back();
      s.req.tag = id;
      slots[id] = s;
      batch.push_back(s.req);
      batch_slots.push_back(id);
      if (a.issued_all()) close(a);
      return Cut::Issued;
    }
  }

  void submit_batch() {
    run_in_memory_requests();
    std::size_t i = 0;
    while (i < batch.size()) {
      const std::size_t n = w.config_.single_submit ? 1 : batch.size() - i;
      int r = 0;
      if (!dead.ok()) {
        r = -dead.errnum;
      } else if (auto injected = consult_fault_hook(
                     {FaultPoint::Submit, nullptr, batch[i].fd, batch[i].offset, batch[i].len, 0})) {
        r = static_cast<int>(*injected);
      } else {
        r = backend->submit(std::span<const Request>(batch).subspan(i, n));
      }
      if (r > 0) {
        for (std::size_t k = i; k < i + static_cast<std::size_t>(r); ++k) slots[batch_slots[k]].in_kernel = true;
        inflight += static_cast<std::size_t>(r);
        i += static_cast<std::size_t>(r);
      } else {
        // Nothing accepted: report the first request as failed with the submission's errno
        // (EAGAIN is retried by the completion logic), then try the rest.
        synthetic.push_back({batch[i].tag, r < 0 ? r : -EIO});
        ++i;
      }
    }
    batch.clear();
    batch_slots.clear();
  }

  // Requests on files in memory are run here, now; their results are handled like the
  // backend's completions (retries, short transfers, failures), through `synthetic`. The
  // rest stay in `batch`, in order, for the backend.
  void run_in_memory_requests() {
    if (!dead.ok()) return;  // a dead queue fails everything, as documented
    std::size_t kept = 0;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      if (!slots[batch_slots[k]].in_memory) {
        batch[kept] = batch[k];
        batch_slots[kept] = batch_slots[k];
        ++kept;
        continue;
      }
      const Request& r = batch[k];
      std::int64_t res = 0;
      if (auto injected = consult_fault_hook({FaultPoint::Submit, nullptr, r.fd, r.offset, r.len, 0});
          injected && *injected <= 0) {
        res = *injected < 0 ? *injected : -EIO;
      } else {
        res = run_in_memory(r);
      }
      synthetic.push_back({r.tag, res});
    }
    batch.resize(kept);
    batch_slots.resize(kept);
    // A file object's descriptor: the backend may send it through its registered-file table.
    for (std::size_t k = 0; k < batch.size(); ++k) {
      batch[k].fixed_file = slots[batch_slots[k]].owner->task.op->fixed_file(batch[k].fd);
    }
  }

  // Moves slot `s` to its op's descriptor without O_DIRECT (made from the op's own on first
  // use); on failure the slot is unchanged.
  static Status to_buffered(Slot& s) {
    int fd = -1;
    Status st = s.owner->task.op->buffered_fd(&fd);
    if (st.ok()) {
      s.req.fd = fd;
      s.buffered = true;
    }
    return st;
  }

  // Fails the op of slot `id` as decision `d` says, and releases the slot.
  void fail(std::uint32_t id, std::uint64_t tag, const Decision& d) {
    Slot& s = slots[id];
    OpState& op = *s.owner->task.op;
    std::string text = d.backend_text ? backend->take_error_text(tag) : std::string();
    if (text.empty()) text = d.message;
    text += d.suffix;
    op.fail(Status::failure(d.errnum, std::move(text), op.path(), s.req.offset, s.req.len));
    release(id);
  }

  void complete(const Completion& c) {
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

  int reap(std::size_t min, std::int64_t max_wait_us) {
    if (auto injected = consult_fault_hook({FaultPoint::Reap, nullptr, -1, 0, 0, 0})) {
      if (*injected < 0) return static_cast<int>(*injected);
    }
    return backend->reap(completions, min, max_wait_us);
  }

  // The backend could not hand back completions and retrying cannot help (the ring or
  // context is broken). Looping would spin at 100% CPU with wait() never returning, so every
  // request in the queue fails with the errno (waking its op's waiters) and the backend is
  // never used again: later requests on this worker fail at once with the same cause.
  // Order matters: the kernel queue is shut down first (waiting for, or cancelling, what it
  // still holds), and only then are the ops failed and the slots released. Failing an op
  // lets its caller free the buffer, and a released slot's bounce memory is reused: neither
  // may happen while the kernel can still write into them.
  void abandon_queue(int err) {
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
  void take_due() {
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
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> next_due() const {
    std::optional<std::chrono::steady_clock::time_point> due;
    const auto consider = [&](std::chrono::steady_clock::time_point t) {
      if (!due || t < *due) due = t;
    };
    for (const auto& d : deferred) consider(d.first);
    for (const auto& h : held) consider(h.first);
    if (fence_pending) consider(std::chrono::steady_clock::now() + kFencePoll);
    return due;
  }

  // A lane with requests to issue and none in flight: a device that has work and is idle.
  [[nodiscard]] bool idle_lane_waiting() const {
    return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) { return l.waiting > 0 && l.inflight == 0; });
  }

  // Lanes with requests of theirs in the kernel.
  [[nodiscard]] std::size_t busy_lanes() const {
    std::size_t n = 0;
    for (const Lane& l : lanes) n += l.inflight > 0 ? 1 : 0;
    return n;
  }

  void run() {
    for (;;) {
      if (staging.draining()) drain(false);
      take_due();
      pull();
      for (Lane& l : lanes) l.stalled = false;
      fence_pending = false;
      // A batch of one device is being reaped (overlap_events off): nothing more is issued
      // until it is all back, unless another device has work and nothing in flight.
      const bool hold = batch_open && inflight > 0 && !idle_lane_waiting();
      for (; !hold;) {
        if (!resubmit.empty()) {
          const std::uint32_t id = resubmit.back();
          resubmit.pop_back();
          batch.push_back(slots[id].req);
          batch_slots.push_back(id);
          continue;
        }
        if (free_slots.empty() || !next_request()) break;
      }
      if (!batch.empty()) submit_batch();
      finish_retired();

      if (!synthetic.empty()) {
        std::vector<Completion> now;
        now.swap(synthetic);
        for (const auto& c : now) complete(c);
        continue;
      }
      if (inflight == 0) {
        if (staging.draining()) {
          drain(true);
          continue;
        }
        if (auto due = next_due()) {
          // Nothing in the kernel and nothing else could be issued: sleep out the earliest
          // back-off or hold, or a fence's poll (a new slice wakes this early; it is looked
          // at on the way round).
          std::unique_lock lock(w.mutex_);
          w.cv_.wait_until(lock, *due);
          continue;
        }
        if (!resubmit.empty() || any_waiting()) continue;
        std::unique_lock lock(w.mutex_);
        w.cv_.wait(lock, [&] { return !w.queue_.empty() || w.stopping_; });
        if (w.queue_.empty() && w.stopping_ && lanes.empty()) return;
        continue;
      }
      // overlap_events off with one device in flight: the whole batch is reaped before more is
      // issued, in waits of at most kBatchWaitUs so that work for another device, arriving
      // meanwhile, starts at once. Several devices in flight: each completion is taken as it
      // comes (a batch would wait for its slowest device).
      const bool one_batch = !w.config_.overlap_events && busy_lanes() <= 1;
      const int n = reap(one_batch ? inflight : 1, one_batch ? kBatchWaitUs : -1);
      if (n < 0) {
        const bool transient = n == -EINTR || n == -EAGAIN || n == -EBUSY;
        if (transient && ++reap_failures < kMaxRetries) {  // reap again, after a back-off
          w.counters_->retries.fetch_add(1, std::memory_order_relaxed);
          if (n != -EINTR) std::this_thread::sleep_for(backoff(reap_failures));
          continue;
        }
        reap_failures = 0;
        abandon_queue(-n);
        continue;
      }
      reap_failures = 0;
      inflight -= static_cast<std::size_t>(n);
      for (int i = 0; i < n; ++i) {
        const Completion& c = completions[static_cast<std::size_t>(i)];
        if (c.fixed_file) w.counters_->fixed_file_requests.fetch_add(1, std::memory_order_relaxed);
        if (c.file_fallback) w.counters_->fixed_file_fallbacks.fetch_add(1, std::memory_order_relaxed);
        complete(c);
      }
      batch_open = one_batch && inflight > 0;
    }
  }
};

Worker::Worker(std::unique_ptr<Backend> backend, const WorkerConfig& config, Counters* counters)
    : backend_(std::move(backend)), config_(config), counters_(counters) {
  config_.queue_depth = std::max<std::size_t>(1, config_.queue_depth);
  config_.bounce_slots = std::clamp<std::size_t>(config_.bounce_slots, 1, config_.queue_depth);
  thread_ = std::thread([this] { run(); });
}

Worker::~Worker() { stop(); }

void Worker::enqueue(SliceTask task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Worker::enqueue(std::vector<SliceTask>& tasks) {
  if (tasks.empty()) return;
  struct Wake {  // also when a push throws: the tasks queued before it must run
    std::condition_variable& cv;
    ~Wake() { cv.notify_one(); }
  } wake{cv_};
  {
    std::lock_guard lock(mutex_);
    for (auto& t : tasks) queue_.push_back(std::move(t));
  }
  tasks.clear();
}

void Worker::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Worker::run() noexcept {
  Impl impl(*this);
  impl.run();
}

}  // namespace deepio::detail
