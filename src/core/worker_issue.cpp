// Issuing: which lane's request goes into a free queue slot (core/lanes.hpp decides), cutting
// it from the lane's oldest slice under its share (staging it through a bounce slot where
// needed), and handing the batch to the backend. Runs on the worker thread (worker_impl.hpp).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/worker_impl.hpp"
#include "platform/fault.hpp"

namespace deepio::detail {

namespace {

// One request on a file in memory, run synchronously: the byte count or a negative errno,
// as a backend's completion would carry it.
std::int64_t run_in_memory(const Request& r) noexcept {
  const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                            : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
  return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
}

// The oldest slice of class `c` in lane `l` under its share of the lane (`lane_share`
// requests), or null.
Active* pick_slice(Lane& l, std::size_t lane_share, OpClass c) {
  if (c == OpClass::None) return nullptr;
  const auto k = static_cast<std::size_t>(c);
  const std::size_t n = c == OpClass::Read ? l.load.reads_waiting : l.load.waiting - l.load.reads_waiting;
  const std::size_t cap = slice_share(lane_share, n);
  for (auto it = l.cursor[k]; it != l.run[k].end(); ++it) {
    if (it->closed) continue;
    if (it->outstanding < cap || it->task.op->failed()) return &*it;
  }
  return nullptr;
}

}  // namespace

Free Worker::Impl::free_now() const { return {free_slots.size(), staging.free_count()}; }

// Cuts the next request into `batch`, from the lane whose turn it is. Returns false when
// nothing can be issued now (no work, every lane at its share, or waiting for a bounce slot
// or a fence).
bool Worker::Impl::next_request() {
  bool pulled = false;
  const std::size_t kept = reserve(limits);
  for (;;) {
    std::size_t demand = 0;
    for (const Lane& l : lanes) demand += l.load.waiting > 0 ? 1 : 0;
    const Shares sh = shares(limits, demand);
    const auto it = pick_lane(lanes.begin(), lanes.end(), turn, sh, free_now(), kept, limits.quantum,
                              [](Lane& l) -> LaneLoad& { return l.load; });
    Lane* l = it != lanes.end() ? &*it : nullptr;
    Active* a = l != nullptr ? pick_slice(*l, sh.requests, pick_class(l->load, sh)) : nullptr;
    if (l != nullptr && a == nullptr) {
      l->load.stalled = true;  // every slice at its share of the lane: the next lane's turn
      continue;
    }
    if (a != nullptr) {
      switch (cut(*a, sh)) {
        case Cut::Issued: return true;
        case Cut::Skipped: continue;
        case Cut::Stalled: l->load.stalled = true; continue;
      }
    }
    if (!pulled && pull()) {
      pulled = true;
      continue;
    }
    // A lane waits for a bounce slot, and copies back to the device hold some: wait for
    // them rather than for the disk.
    if (bounce_pending && staging.draining()) {
      bounce_pending = false;
      drain(true);
      for (Lane& ln : lanes) ln.load.stalled = false;
      continue;
    }
    return false;
  }
}

// Cuts one request of slice `a` into `batch`.
Worker::Impl::Cut Worker::Impl::cut(Active& a, const Shares& sh) {
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
      s.req.direct = true;
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
      // Its share of the bounce slots, or none it may take: the next lane's turn
      // (next_request waits for a copy back to the device only when no lane can issue).
      if (!may_bounce(a.lane->load, sh, free_now(), bounce_reserve(limits))) {
        bounce_pending = true;
        return Cut::Stalled;
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
    charge(a.lane->load, len, s.bounce >= 0, a.read);
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

void Worker::Impl::submit_batch() {
  for (const Request& r : batch) {
    (void)consult_fault_hook({FaultPoint::Issue, nullptr, r.fd, r.offset, r.len, 0, 0, r.write});
  }
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
void Worker::Impl::run_in_memory_requests() {
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
Status Worker::Impl::to_buffered(Slot& s) {
  int fd = -1;
  Status st = s.owner->task.op->buffered_fd(&fd);
  if (st.ok()) {
    s.req.fd = fd;
    s.req.direct = false;
    s.buffered = true;
  }
  return st;
}

}  // namespace deepio::detail
