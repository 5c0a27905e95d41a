#include "core/worker.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <thread>

#include "core/completion.hpp"
#include "core/staging.hpp"
#include "platform/fault.hpp"

namespace deepio::detail {

namespace {

struct Active {
  SliceTask task;
  std::list<Active>::iterator self;
  std::size_t seg = 0;    // next segment to issue from
  std::uint64_t pos = 0;  // bytes of segments[seg] already issued
  std::size_t outstanding = 0;
  bool ordered = false;  // the op's fence (if any) was honoured before this slice's first copy
  [[nodiscard]] bool issued_all() const { return seg >= task.segments.size(); }
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
  std::list<Active> active;
  std::list<Active>::iterator cursor;  // first Active with unissued segments, or end
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
  int reap_failures = 0;  // transient reap failures in a row
  // The bounce slots and the device stagers (core/staging.hpp).
  Staging staging;
  // Last member, so destroyed first: the kernel queue is shut down (waiting for what it still
  // holds) before the bounce arena and the stagers it may be writing into are freed.
  std::unique_ptr<Backend> backend;

  explicit Impl(Worker& worker)
      : w(worker),
        cursor(active.end()),
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

  // Moves every queued slice into `active` (one lock for many small ops). Returns false if
  // the queue was empty.
  bool pull() {
    {
      std::lock_guard lock(w.mutex_);
      if (w.queue_.empty()) return false;
      taken.swap(w.queue_);
    }
    for (auto& task : taken) {
      active.emplace_back(Active{std::move(task), {}});
      auto it = std::prev(active.end());
      it->self = it;
      if (cursor == active.end()) cursor = it;
    }
    taken.clear();
    return true;
  }

  void retire(Active* a) {
    finished.push_back(std::move(a->task.op));
    active.erase(a->self);
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
    if (s.bounce >= 0) staging.give_back(s.bounce);
    Active* a = s.owner;
    s = Slot{};
    free_slots.push_back(id);
    if (--a->outstanding == 0 && a->issued_all() && cursor != a->self) retire(a);
  }

  // Releases slots whose host-to-device copies have finished; with `block`, waits for all.
  void drain(bool block) {
    staging.drain(block, [this](std::uint32_t id, Status err) {
      if (!err.ok()) slots[id].owner->task.op->fail(std::move(err));
      release(id);
    });
  }

  // Cuts the next request from the slice at the cursor into `batch`. Returns false when there
  // is nothing to issue now (no work, or waiting for a bounce slot).
  bool next_request() {
    for (;;) {
      if (cursor == active.end() && !pull()) return false;
      Active& a = *cursor;
      OpState& op = *a.task.op;
      if (op.failed() || a.issued_all()) {
        a.seg = a.task.segments.size();
        auto next = std::next(cursor);
        Active* done = a.outstanding == 0 ? &a : nullptr;
        cursor = next;
        if (done != nullptr) retire(done);
        continue;
      }
      const Segment& seg = a.task.segments[a.seg];
      if (!dead.ok()) {
        // The queue is gone: nothing is cut, staged or bounced for it any more.
        op.fail(Status::failure(dead.errnum, dead.message, op.path(), seg.file_offset + a.pos, seg.nbytes - a.pos));
        continue;  // the failed op is skipped at the top of the loop
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
          continue;  // the failed op is skipped at the top of the loop
        }
      } else {
        s.req.fd = op.direct_fd();
      }
      s.req.buf = s.user;
      if (a.task.direct_device) s.req.driver_file = a.task.driver_file.get();
      if (a.task.direct_device && !a.ordered && op.fence() != nullptr) {
        // A route's transfers (cuFile) follow no stream: this worker waits for the producer.
        if (Status fs = op.fence()->wait(); !fs.ok()) {
          fs.path = op.path();
          op.fail(std::move(fs));
          continue;
        }
        a.ordered = true;
      }
      if (!staged) s.req.region = op.region();
      if (op.device() >= 0 || s.req.driver_file != nullptr) {
        w.counters_->device_requests.fetch_add(1, std::memory_order_relaxed);
      }
      if (staged) {
        if (!staging.ensure()) {
          op.fail(Status::failure(ENOMEM, "cannot allocate bounce buffers", op.path(), s.req.offset, len));
          continue;
        }
        DeviceStager* st = nullptr;
        if (op.device() >= 0) {
          Status why;
          st = staging.stager(op.device(), &why);
          if (st == nullptr) {
            why.path = op.path();
            op.fail(std::move(why));
            continue;
          }
          if (!a.ordered && op.fence() != nullptr) {
            // Before this slice's first copy, either way: a write's device-to-host copy must
            // see what the producer wrote, a read's host-to-device copy must not overtake
            // what the producer still does with the destination.
            if (Status os = st->order_after(*op.fence()); !os.ok()) {
              os.path = op.path();
              op.fail(std::move(os));
              continue;
            }
            a.ordered = true;
          }
        }
        if (!staging.has_free()) {
          if (!staging.draining()) return false;  // wait for a disk request to come back
          drain(true);
        }
        s.bounce = staging.take();
        std::byte* b = staging.at(s.bounce);
        if (op.write()) {
          if (st != nullptr) {
            Status cs = st->to_staging(s.bounce, b, s.user, len);
            if (!cs.ok()) {
              staging.give_back(s.bounce);
              cs.path = op.path();
              op.fail(std::move(cs));
              continue;
            }
          } else {
            std::memcpy(b, s.user, len);
          }
        }
        s.req.buf = b;
      }
      a.pos += len;
      if (a.pos == seg.nbytes) {
        ++a.seg;
        a.pos = 0;
      }
      ++a.outstanding;
      const std::uint32_t id = free_slots.back();
      free_slots.pop_back();
      s.req.tag = id;
      slots[id] = s;
      batch.push_back(s.req);
      batch_slots.push_back(id);
      return true;
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

  int reap(std::size_t min) {
    if (auto injected = consult_fault_hook({FaultPoint::Reap, nullptr, -1, 0, 0, 0})) {
      if (*injected < 0) return static_cast<int>(*injected);
    }
    return backend->reap(completions, min);
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

  // Deferred slots whose back-off is over go back to the resubmission list.
  void take_due() {
    if (deferred.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(deferred, [&](const auto& d) {
      if (d.first > now) return false;
      resubmit.push_back(d.second);
      return true;
    });
  }

  void run() {
    const std::size_t qd = w.config_.queue_depth;
    for (;;) {
      if (staging.draining()) drain(false);
      take_due();
      while (inflight + batch.size() + deferred.size() < qd) {
        if (!resubmit.empty()) {
          const std::uint32_t id = resubmit.back();
          resubmit.pop_back();
          batch.push_back(slots[id].req);
          batch_slots.push_back(id);
          continue;
        }
        if (!next_request()) break;
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
        if (!deferred.empty()) {
          // Nothing in the kernel and nothing else could be issued: sleep out the earliest
          // back-off (a new slice wakes this early; it is looked at on the way round).
          const auto due = std::min_element(deferred.begin(), deferred.end())->first;
          std::unique_lock lock(w.mutex_);
          w.cv_.wait_until(lock, due);
          continue;
        }
        if (!resubmit.empty() || cursor != active.end()) continue;
        std::unique_lock lock(w.mutex_);
        w.cv_.wait(lock, [&] { return !w.queue_.empty() || w.stopping_; });
        if (w.queue_.empty() && w.stopping_ && active.empty()) return;
        continue;
      }
      const std::size_t min = w.config_.overlap_events ? 1 : inflight;
      const int n = reap(min);
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
      for (int i = 0; i < n; ++i) complete(completions[static_cast<std::size_t>(i)]);
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
