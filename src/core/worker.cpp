// The worker thread's loop, the hand-over of queued slices and the wake protocol (worker.hpp),
// and the lanes' slices coming and going. Issuing is worker_issue.cpp's, completions are
// worker_complete.cpp's.
#include "core/worker.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "core/worker_impl.hpp"
#include "platform/fault.hpp"

namespace deepio::detail {

namespace {
// The longest wait for a one-device batch (overlap_events off) before looking for new work.
constexpr std::int64_t kBatchWaitUs = 1000;
// How long after a lane's last read request its writes stay held to their floor
// (core/lanes.hpp): longer than a caller's pause between two loads.
constexpr std::int64_t kReadLingerUs = 5000;
}  // namespace

Worker::Impl::Impl(Worker& worker)
    : w(worker),
      turn(lanes.end()),
      staging(w.config_.bounce_slot_bytes, w.config_.bounce_slots, w.config_.stager_factory, w.config_.pool),
      backend(std::move(worker.backend_)) {
  const std::size_t qd = w.config_.queue_depth;
  limits = {qd, w.config_.inflight_bytes, w.config_.quantum, w.config_.bounce_slots};
  slots.resize(qd);
  free_slots.reserve(qd);
  for (std::size_t i = qd; i-- > 0;) free_slots.push_back(static_cast<std::uint32_t>(i));
  resubmit.reserve(qd);
  batch.reserve(qd);
  batch_slots.reserve(qd);
  completions.resize(qd);
  synthetic.reserve(qd);
  std::lock_guard lock(w.mutex_);
  w.waker_ = backend.get();
}

Worker::Impl::~Impl() {
  // Read slices never retired (a worker ended with work left) no longer hold the device's
  // writes back in other workers.
  for (Lane& l : lanes) {
    if (l.shared != nullptr)
      l.shared->active.fetch_sub(static_cast<std::int64_t>(l.run[0].size()), std::memory_order_relaxed);
  }
  // Before the backend goes: enqueue() never wakes it afterwards.
  std::lock_guard lock(w.mutex_);
  w.waker_ = nullptr;
  w.blocked_ = false;
}

// Moves every queued slice into its device's lane (one lock for many small ops). Returns
// false if the queue was empty.
bool Worker::Impl::pull() {
  {
    std::lock_guard lock(w.mutex_);
    if (w.queue_.empty()) return false;
    taken.swap(w.queue_);
  }
  Lane* last = nullptr;
  for (auto& task : taken) {
    if (last == nullptr || last->key != task.device_key) last = &lane_for(task.device_key);
    Lane& l = *last;
    const bool read = !task.op->write();
    const std::size_t k = read ? 0 : 1;
    l.run[k].emplace_back(Active{std::move(task), &l, {}});
    auto it = std::prev(l.run[k].end());
    it->self = it;
    it->read = read;
    ++l.load.waiting;
    if (read) {
      ++l.load.reads_waiting;
      if (l.shared != nullptr) l.shared->active.fetch_add(1, std::memory_order_relaxed);
    }
    if (l.cursor[k] == l.run[k].end()) l.cursor[k] = it;
  }
  taken.clear();
  return true;
}

Lane& Worker::Impl::lane_for(std::uint64_t key) {
  for (Lane& l : lanes) {
    if (l.key == key) return l;
  }
  Lane& l = lanes.emplace_back();
  l.key = key;
  l.shared = device_reads(key);
  l.cursor[0] = l.run[0].end();
  l.cursor[1] = l.run[1].end();
  if (turn == lanes.end()) turn = std::prev(lanes.end());
  return l;
}

bool Worker::Impl::any_waiting() const {
  return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) { return l.load.waiting > 0; });
}

// Nothing more is issued from slice `a`; retired now if none of its requests is out.
void Worker::Impl::close(Active& a) {
  if (a.closed) return;
  a.closed = true;
  a.seg = a.task.segments.size();
  Lane& l = *a.lane;
  const std::size_t k = a.read ? 0 : 1;
  --l.load.waiting;
  if (a.read) --l.load.reads_waiting;
  if (l.cursor[k] == a.self) {
    auto it = std::next(a.self);
    while (it != l.run[k].end() && it->closed) ++it;
    l.cursor[k] = it;
  }
  if (a.outstanding == 0) retire(&a);
}

void Worker::Impl::retire(Active* a) {
  finished.push_back(std::move(a->task.op));
  Lane* l = a->lane;
  if (a->read && l->shared != nullptr) l->shared->active.fetch_sub(1, std::memory_order_relaxed);
  l->run[a->read ? 0 : 1].erase(a->self);
  if (!l->empty()) return;
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
void Worker::Impl::finish_retired() {
  if (finished.empty()) return;
  if (dead.ok()) backend->flush();
  for (auto& op : finished) op->slice_done();
  finished.clear();
}

void Worker::Impl::release(std::uint32_t id) {
  Slot& s = slots[id];
  Active* a = s.owner;
  discharge(a->lane->load, s.len, s.bounce >= 0, a->read);
  if (a->read) {
    a->lane->last_read = Clock::now();
    if (a->lane->shared != nullptr) a->lane->shared->ended(a->lane->last_read);
  }
  if (s.bounce >= 0) staging.give_back(s.bounce);
  s = Slot{};
  free_slots.push_back(id);
  if (--a->outstanding == 0 && a->closed) retire(a);
}

// Releases slots whose host-to-device copies have finished; with `block`, waits for all.
void Worker::Impl::drain(bool block) {
  staging.drain(block, [this](std::uint32_t id, Status err) {
    if (!err.ok()) slots[id].owner->task.op->fail(std::move(err));
    release(id);
  });
}

// A lane with requests to issue and none in flight: a device that has work and is idle.
bool Worker::Impl::idle_lane_waiting() const {
  return std::any_of(lanes.begin(), lanes.end(),
                     [](const Lane& l) { return l.load.waiting > 0 && l.load.inflight == 0; });
}

// Lanes with requests of theirs in the kernel.
std::size_t Worker::Impl::busy_lanes() const {
  std::size_t n = 0;
  for (const Lane& l : lanes) n += l.load.inflight > 0 ? 1 : 0;
  return n;
}

// A lane with writes in flight.
bool Worker::Impl::writes_in_flight() const {
  return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) { return l.load.inflight > l.load.reads_inflight; });
}

// A lane with a read to issue and writes in flight.
bool Worker::Impl::read_behind_writes() const {
  return std::any_of(lanes.begin(), lanes.end(),
                     [](const Lane& l) { return l.load.reads_waiting > 0 && l.load.inflight > l.load.reads_inflight; });
}

// A lane with reads to issue or in flight and writes in flight: its reads are not to wait
// for a whole batch of writes (overlap_events off reaps such a mix request by request).
bool Worker::Impl::reads_with_writes() const {
  return std::any_of(lanes.begin(), lanes.end(), [](const Lane& l) {
    return (l.load.reads_waiting > 0 || l.load.reads_inflight > 0) && l.load.inflight > l.load.reads_inflight;
  });
}

// Sets each lane's read_recent: a read request of it ended within kReadLingerUs, or, through
// any worker of the process, reads of its device are queued, in flight or ended that recently
// (core/device_reads.hpp: the device's queue is every worker's).
void Worker::Impl::mark_recent_reads() {
  if (lanes.empty()) return;
  const Clock::time_point none{};
  const auto now = Clock::now();
  const auto linger = std::chrono::microseconds(kReadLingerUs);
  for (Lane& l : lanes) {
    l.load.read_recent = (l.last_read != none && now - l.last_read < linger) ||
                         (l.shared != nullptr && l.shared->recent(now, linger));
  }
}

// Waits for completions (Backend::reap). `wakeable`: enqueue() may end the wait early (the
// wake protocol of worker.hpp); then a slice queued meanwhile returns 0 at once. With
// `reads_only`, only a read's enqueue ends it (a one-device batch of writes).
int Worker::Impl::reap(std::size_t min, std::int64_t max_wait_us, bool wakeable, bool reads_only) {
  if (auto injected = consult_fault_hook({FaultPoint::Reap, nullptr, -1, 0, 0, 0})) {
    if (*injected < 0) return static_cast<int>(*injected);
  }
  // A queue with no free slot takes nothing new: a completion must come first anyway.
  wakeable = wakeable && !free_slots.empty();
  if (wakeable) {
    const Free free = {free_slots.size(), staging.free_count()};
    std::size_t demand = 0;
    for (const Lane& l : lanes) demand += l.load.waiting > 0 ? 1 : 0;
    const Shares sh = shares(limits, std::max<std::size_t>(demand, 1));
    const std::size_t kept = detail::reserve(limits);
    std::lock_guard lock(w.mutex_);
    if (!w.queue_.empty()) return 0;  // new work already: look at it first
    // Devices whose new work could not be issued either: no wake for them (core/lanes.hpp:
    // a lane in flight at its share, or with only reserved slots left, stays so as more
    // lanes arrive, since shares only shrink).
    w.full_keys_.clear();
    for (const Lane& l : lanes) {
      LaneLoad more = l.load;  // with a read waiting: the class that may issue the most
      more.waiting = 1;
      more.reads_waiting = 1;
      more.stalled = false;
      if (!may_issue(more, sh, free, kept)) w.full_keys_.push_back(l.key);
    }
    w.wake_reads_only_ = reads_only;
    w.blocked_ = true;
  }
  const int n = backend->reap(completions, min, max_wait_us);
  if (wakeable) {
    std::lock_guard lock(w.mutex_);
    w.blocked_ = false;
  }
  return n;
}

void Worker::Impl::run() {
  for (;;) {
    if (staging.draining()) drain(false);
    take_due();
    pull();
    for (Lane& l : lanes) l.load.stalled = false;
    mark_recent_reads();
    fence_pending = false;
    bounce_pending = false;
    // A batch of one device is being reaped (overlap_events off): nothing more is issued
    // until it is all back, unless another device has work and nothing in flight, or a read
    // waits behind a batch of writes (reads do not wait behind writes, core/lanes.hpp).
    const bool hold = batch_open && inflight > 0 && !idle_lane_waiting() && !read_behind_writes();
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
    const auto due = next_due();
    if (inflight == 0) {
      if (staging.draining()) {
        drain(true);
        continue;
      }
      if (due) {
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
    // meanwhile, starts at once. Otherwise each completion is taken as it comes (a batch
    // would wait for its slowest device), in a wait that a new slice ends (wake protocol).
    // Either wait ends when a back-off or a held completion is due.
    // Reads among writes are reaped as they come, so that they complete without waiting for
    // the writes; a read enqueued during a batch of writes ends its wait (reads_only).
    const bool one_batch = !w.config_.overlap_events && busy_lanes() <= 1 && !reads_with_writes();
    std::int64_t wait_us = one_batch ? kBatchWaitUs : -1;
    if (due) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(*due - Clock::now()).count();
      const std::int64_t bound = std::max<std::int64_t>(0, left);
      wait_us = wait_us < 0 ? bound : std::min(wait_us, bound);
    }
    const bool batch_of_writes = one_batch && writes_in_flight();
    const int n = reap(one_batch ? inflight : 1, wait_us, (!one_batch && wait_us < 0) || batch_of_writes,
                       one_batch && batch_of_writes);
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

Worker::Worker(std::unique_ptr<Backend> backend, const WorkerConfig& config, Counters* counters)
    : backend_(std::move(backend)), config_(config), counters_(counters) {
  config_.queue_depth = std::max<std::size_t>(1, config_.queue_depth);
  config_.bounce_slots = std::clamp<std::size_t>(config_.bounce_slots, 1, config_.queue_depth);
  thread_ = std::thread([this] { run(); });
}

Worker::~Worker() { stop(); }

void Worker::wake_for(std::uint64_t key, bool read) {
  if (!blocked_ || waker_ == nullptr) return;
  if (wake_reads_only_ && !read) return;
  if (std::find(full_keys_.begin(), full_keys_.end(), key) != full_keys_.end()) return;
  blocked_ = false;  // one wake-up per wait
  waker_->wake();
}

void Worker::enqueue(SliceTask task) {
  {
    std::lock_guard lock(mutex_);
    const std::uint64_t key = task.device_key;
    const bool read = task.op != nullptr && !task.op->write();
    queue_.push_back(std::move(task));
    wake_for(key, read);
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
    for (auto& t : tasks) {
      const std::uint64_t key = t.device_key;
      const bool read = t.op != nullptr && !t.op->write();
      queue_.push_back(std::move(t));
      wake_for(key, read);  // one load of blocked_ once the worker is woken (or was not waiting)
    }
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
