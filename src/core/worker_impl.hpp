// The worker thread's state (Worker::Impl), shared by the files that implement it:
//   worker.cpp           the thread's loop, the queue hand-over and the wake protocol, lanes
//                        and slices coming and going;
//   worker_issue.cpp     cutting requests from the lanes (core/lanes.hpp decides which) and
//                        submitting them;
//   worker_complete.cpp  what each completion leads to (core/completion.hpp decides), back-offs
//                        and holds, a queue that failed.
// Everything here runs on the worker thread only (worker.hpp's protocol).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/completion.hpp"
#include "core/device_reads.hpp"
#include "core/lanes.hpp"
#include "core/staging.hpp"
#include "core/worker.hpp"

namespace deepio::detail {

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
  bool read = false;     // a read (core/lanes.hpp's read class), from the op's direction
  bool ordered = false;  // the op's fence (if any) was honoured before this slice's first copy
  bool closed = false;
  [[nodiscard]] bool issued_all() const { return seg >= task.segments.size(); }
};

// One device's slices (see the file comment of worker.hpp); its counters are what the lane
// policy sees (core/lanes.hpp). Reads and writes are kept apart (index 0: reads, 1: writes,
// as OpClass), each in arrival order.
struct Lane {
  std::uint64_t key = 0;
  std::list<Active> run[2];                           // arrival order
  std::list<Active>::iterator cursor[2];              // first slice not closed, or run[c].end()
  LaneLoad load;                                      // load.waiting: slices not closed
  std::chrono::steady_clock::time_point last_read{};  // when a read request of it last ended
  DeviceReads* shared = nullptr;                      // the device's reads, all workers (null: table full)
  [[nodiscard]] bool empty() const { return run[0].empty() && run[1].empty(); }
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

struct Worker::Impl {
  using Clock = std::chrono::steady_clock;

  Worker& w;
  LaneLimits limits;
  std::list<Lane> lanes;           // devices with slices here; dropped when they have none
  std::list<Lane>::iterator turn;  // the lane whose turn it is, or lanes.end()
  bool fence_pending = false;      // a lane waits for a producer's fence (polled)
  bool bounce_pending = false;     // a lane waits for a bounce slot (next_request)
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
  std::vector<std::pair<Clock::time_point, std::uint32_t>> deferred;
  // Completions a test's fault hook holds back (kFaultHold): looked at again when due. Their
  // slots stay taken, as if still in the kernel.
  std::vector<std::pair<Clock::time_point, Completion>> held;
  int reap_failures = 0;  // transient reap failures in a row
  // The bounce slots and the device stagers (core/staging.hpp).
  Staging staging;
  // Last member, so destroyed first: the kernel queue is shut down (waiting for what it still
  // holds) before the bounce arena and the stagers it may be writing into are freed.
  std::unique_ptr<Backend> backend;

  explicit Impl(Worker& worker);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // worker.cpp
  void run();
  bool pull();
  Lane& lane_for(std::uint64_t key);
  [[nodiscard]] bool any_waiting() const;
  void close(Active& a);
  void retire(Active* a);
  void finish_retired();
  void release(std::uint32_t id);
  void drain(bool block);
  [[nodiscard]] bool idle_lane_waiting() const;
  [[nodiscard]] std::size_t busy_lanes() const;
  [[nodiscard]] bool writes_in_flight() const;
  [[nodiscard]] bool read_behind_writes() const;
  [[nodiscard]] bool reads_with_writes() const;
  void mark_recent_reads();
  int reap(std::size_t min, std::int64_t max_wait_us, bool wakeable, bool reads_only);

  // worker_issue.cpp
  enum class Cut : std::uint8_t { Issued, Skipped, Stalled };
  [[nodiscard]] Free free_now() const;
  bool next_request();
  Cut cut(Active& a, const Shares& sh);
  void submit_batch();
  void run_in_memory_requests();
  static Status to_buffered(Slot& s);

  // worker_complete.cpp
  void fail(std::uint32_t id, std::uint64_t tag, const Decision& d);
  void complete(const Completion& c);
  void abandon_queue(int err);
  void take_due();
  [[nodiscard]] std::optional<Clock::time_point> next_due() const;
};

}  // namespace deepio::detail
