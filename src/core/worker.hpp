// Worker: one thread, one backend queue, and a scheduler over every device it serves.
//
// Protocol: the engine enqueue()s slices; the worker cuts each slice's segments into
// requests and keeps up to queue_depth of them in flight across all its slices (so many
// small operations still fill the device queue).
//
// Scheduling (docs/engine.md draws it): each slice goes into the lane of its file's device
// (SliceTask::device_key, the file's st_dev); a lane holds that device's slices in arrival
// order. Which lane issues into a free queue slot is core/lanes.hpp's policy: deficit
// round-robin by bytes over the lanes that may issue, each capped at its share of the queue
// slots, of the bytes in flight and of the bounce slots while several have work, and the last
// few free slots (queue and bounce) kept for a lane with nothing in flight, so a device that
// starts work while another holds the queue is issued a request at once. Within a lane the
// oldest slice goes first, reads ahead of writes (a bounded floor of the lane kept for
// writes, and writes held to it while reads are active), each capped at its share of the
// lane while several have work;
// within a slice requests are issued in order. A lane that cannot issue now (no bounce slot
// for it, its producer's fence not yet reached) yields to the next; nothing blocks the
// thread while another lane could issue.
//
// Waking (no device waits behind another): the worker waits in the kernel (Backend::reap)
// only for completions. Before a wait with no time limit it sets `blocked_` under mutex_ and
// publishes the keys of the lanes that could not issue more even with new work
// (`full_keys_`); enqueue(), under the same lock, calls Backend::wake() once when the worker
// is blocked and the new slice's device is not among them, which makes the wait return at
// once (an eventfd the ring or the aio context polls; the thread pool's condition variable).
// So a new operation is issued without waiting for any completion, and an enqueue costs no
// system call while the worker is busy or the device has no room anyway. The worker clears
// `blocked_` after the wait. Its other waits are bounded: a one-device batch (overlap_events
// off) by kBatchWaitUs, a back-off or a held completion by when it is due; with nothing in
// flight it waits on cv_, which enqueue() signals.
//
// Completions: with overlap_events, or whenever requests of more than one device are in
// flight, the worker refills as each completion arrives; otherwise it submits a batch and
// reaps the whole batch before the next (DeepNVMe's overlap_events=false).
// Every completion is checked: EINTR is resubmitted at once and EAGAIN after a back-off (1 us
// doubling to 1 ms; a request still refused after 1000 tries fails, about a second later,
// naming it); short transfers are finished by resubmitting the rest; a direct request refused
// with EINVAL is redone through the page cache; anything else fails the op (its remaining
// requests are skipped); that policy is decide() of core/completion.hpp. Ops on device memory stage every request
// through a bounce slot: device-to-host copy before a write is submitted; after a read, a host-to-device copy that must
// finish before the slot is reused or the op completes. Ops with a DriverFile (GPUDirect Storage) go to a route's
// backend with the device address as it is: never staged, never redone through the page cache. stop() lets the worker
// finish everything queued, then joins it: work is never abandoned. Teardown: a queue that fails is shut down
// (Backend::shutdown: the kernel is done with its requests) before its requests fail, and
// the worker's backend goes before the bounce arena and stagers the kernel may write into
// (core/staging.hpp).
// Thread safety: enqueue() and stop() may be called from any thread; everything else runs on
// the worker thread only.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/backend.hpp"
#include "core/op.hpp"
#include "core/plan.hpp"
#include "core/stager.hpp"
#include "memory/pool.hpp"

namespace deepio::detail {

struct WorkerConfig {
  std::size_t queue_depth = 128;
  bool single_submit = false;
  bool overlap_events = false;
  std::size_t bounce_slot_bytes = 1 << 20;  ///< size of one bounce slot
  std::size_t bounce_slots = 16;            ///< slots allocated on first use
  /// Bytes a lane may issue in one turn of the round-robin (at least the largest request).
  std::size_t quantum = 1 << 20;
  /// Bytes in flight shared among the lanes with work (0: queue_depth x quantum).
  std::size_t inflight_bytes = 0;
  StagerFactory stager_factory;       ///< for ops on device memory; empty: none possible
  std::shared_ptr<StagingPool> pool;  ///< where the bounce arena comes from (null: its own)
};

struct SliceTask {
  std::shared_ptr<OpState> op;
  std::vector<Segment> segments;
  /// For an op served by a DeviceRoute: its registration, put in every request. Each slice
  /// holds a reference; the last one is dropped when the op's last slice retires, before
  /// the op completes (so the registration ends before its descriptor closes).
  std::shared_ptr<const DriverFile> driver_file;
  /// The requests go to a route's backend with driver_file; false: driver_file (if any) is
  /// only held until the slice is done (an op the route declined and that is staged).
  bool direct_device = false;
  /// The device holding the file (its st_dev): the worker's scheduler serves each device's
  /// requests in a lane of its own, so no device waits behind another's.
  std::uint64_t device_key = 0;
};

class Worker {
 public:
  Worker(std::unique_ptr<Backend> backend, const WorkerConfig& config, Counters* counters);
  ~Worker();  // stop()s
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void enqueue(SliceTask task);
  /// Queues every task of `tasks` in order with one lock and one wake-up (a batch's many
  /// small operations), leaving `tasks` empty. If queueing throws (out of memory), the
  /// tasks not queued stay in `tasks` with their op; those queued have a null op.
  void enqueue(std::vector<SliceTask>& tasks);
  /// Runs everything queued to completion, then ends the thread. Idempotent.
  void stop() noexcept;

 private:
  struct Impl;
  void run() noexcept;
  // Under mutex_: wakes the worker if it is blocked in the kernel and a slice for `key` could
  // be issued now (the protocol above).
  void wake_for(std::uint64_t key, bool read);

  // Handed to the worker thread's state when it starts, which owns it from then on and shuts
  // it down before freeing any memory the kernel could write into.
  std::unique_ptr<Backend> backend_;
  WorkerConfig config_;
  Counters* counters_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<SliceTask> queue_;  // guarded by mutex_
  bool stopping_ = false;        // guarded by mutex_
  // The wake protocol (file comment): the worker is in an unbounded Backend::reap; waker_ is
  // its backend (set while the worker thread's state lives); full_keys_ are the devices whose
  // new work could not be issued anyway. All guarded by mutex_.
  bool blocked_ = false;
  bool wake_reads_only_ = false;  // the wait is a one-device batch of writes: reads end it
  Backend* waker_ = nullptr;
  std::vector<std::uint64_t> full_keys_;
  std::thread thread_;
};

}  // namespace deepio::detail
