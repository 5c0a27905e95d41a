// The worker's lane policy: which device's request goes into a free queue slot next. Pure
// functions of the lanes' counters and the worker's limits, so every rule is tested by tables
// without threads (tests/cpp/test_lanes.cpp); the worker (worker.hpp) keeps the lanes and their
// slices, asks these functions, and applies the answers.
//
// A lane is one device's work (SliceTask::device_key, the file's st_dev). LaneLoad is what the
// policy sees of it: slices with requests left to issue (`waiting`), queue slots held
// (`inflight`: requests in the kernel, backing off or being copied back), their bytes, bounce
// slots held, and its deficit-round-robin credit. `demand` is the number of lanes with
// waiting > 0.
//
// Shares (shares()): with one lane or none in demand, that lane may hold queue_depth -
// reserve slots, B - B/8 bytes (B: inflight_bytes, or queue_depth x quantum when 0) and
// bounce_slots - bounce_reserve bounce slots. With d >= 2 lanes in demand each may hold
// ceil(queue_depth/d) slots, ceil(B/d) bytes and max(1, bounce_slots/d) bounce slots.
//
// The reserve (reserve(), bounce_reserve()): the last max(1, queue_depth/8) free queue slots
// (none when queue_depth is 1) go only to a lane holding fewer than newcomer_depth() =
// max(1, reserve/2) requests, and the last max(1, bounce_slots/8) free bounce slots (none when
// there is only one) only to a lane holding no bounce slot. So a device that starts work
// while others fill the queue (a slow drive holding every request it was given) is issued
// requests at once, without waiting for any completion: the first newcomer up to
// newcomer_depth of them (2 of a depth of 32, 8 of 128), the next what is left of the
// reserve, each at least one until it is spent. A lone lane gives up that many slots of depth
// (4 of 32, 16 of 128); the slots a slow drive's completions free go to the newcomers until
// the shares are even (a lane over its share issues nothing).
//
// Eligibility (may_issue()): a lane may issue a request when it has slices waiting, was not
// stalled in this pass (no bounce slot for it, a producer's fence not reached), a slot is
// free, and either it holds nothing in flight (any free slot, whatever the shares) or it is
// under its share of slots and of bytes and either more than `reserve` slots are free or it
// holds fewer than newcomer_depth requests; and one of its classes may issue (pick_class()).
// A lane over its share (it issued while it was alone) issues nothing until completions bring
// it under.
// may_bounce(): a staged request of the lane takes a bounce slot if one is free and the lane
// either holds none or is under its share with more than bounce_reserve free.
//
// Classes (pick_class()): each lane's slices are reads or writes (the op's direction). Reads
// are what a caller waits on to load; writes (puts, backups, checkpoints) can wait. Within a
// lane a read goes ahead of every write, with one bound for the writes: while the lane has
// writes waiting, write_floor() = max(1, share/16) of its slots (and bytes) are theirs,
// whatever reads want (so writes always progress: at least that many are in flight while they
// wait, table-tested as "no starvation"). A read may issue while the lane's requests plus the
// part of that floor writes do not hold yet stay under the share (or the lane holds nothing).
// While reads are active on the lane (waiting, in flight, or done within the worker's linger
// of 5 ms; or, through another worker of the process, on the lane's device: both are
// LaneLoad::read_recent, core/device_reads.hpp) writes hold at most write_floor() of the lane, otherwise
// the whole share. So a read issued under saturating writes waits in the device behind at
// most write_floor() writes, not behind the whole queue; the writes above the floor are not
// refilled until the reads have been quiet for the linger.
//
// Order (pick_lane()): deficit round-robin by bytes over the eligible lanes, from `turn`: a lane
// whose deficit is positive issues (each request's bytes are charged to it, charge()); one
// whose deficit is spent gets `quantum` more and the turn passes on; a lane with nothing
// waiting keeps no credit. Two rounds at most, since a request is never larger than a quantum.
// slice_share(): within a lane, the oldest slice goes first, each slice capped at
// ceil(lane share / waiting slices) requests while several wait (no cap for a lone slice).
//
// Thread safety: no state; LaneLoad belongs to the worker thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepio::detail {

struct LaneLimits {
  std::size_t queue_depth = 128;
  std::uint64_t inflight_bytes = 0;  ///< 0: queue_depth x quantum
  std::uint64_t quantum = 1 << 20;   ///< bytes of a lane's turn (at least the largest request)
  std::size_t bounce_slots = 16;
};

struct LaneLoad {
  std::size_t waiting = 0;           ///< slices with requests left to issue
  std::size_t inflight = 0;          ///< queue slots held by its requests
  std::uint64_t inflight_bytes = 0;  ///< their bytes
  std::size_t bounces = 0;           ///< bounce slots held by its requests
  std::int64_t deficit = 0;          ///< bytes left of its turn
  bool stalled = false;              ///< cannot issue in this pass (bounce slot, fence)
  // The classes (see the file comment); with these at zero every slice is a write and the
  // rules above are all there is.
  std::size_t reads_waiting = 0;   ///< of `waiting`, slices of reads
  std::size_t reads_inflight = 0;  ///< of `inflight`, requests of reads
  std::uint64_t read_bytes = 0;    ///< their bytes
  bool read_recent = false;        ///< a read of the lane finished within the linger
};

/// A lane's class of work: what a caller waits on to load, or what may wait.
enum class OpClass : std::uint8_t { Read = 0, Write = 1, None = 2 };

struct Shares {
  std::size_t requests = 0;
  std::uint64_t bytes = 0;
  std::size_t bounces = 0;
};

/// What the worker has free now: queue slots and bounce slots not held by any lane.
struct Free {
  std::size_t slots = 0;
  std::size_t bounces = 0;
};

/// The byte budget: inflight_bytes, or queue_depth x quantum when that is 0.
[[nodiscard]] std::uint64_t byte_budget(const LaneLimits& limits) noexcept;
/// Queue slots kept for a lane with nothing in flight: max(1, queue_depth/8), 0 for depth 1.
[[nodiscard]] std::size_t reserve(const LaneLimits& limits) noexcept;
/// Requests a lane may hold from the reserved slots: max(1, reserve/2).
[[nodiscard]] std::size_t newcomer_depth(std::size_t reserve) noexcept;
/// Bounce slots kept for a lane holding none: max(1, bounce_slots/8), 0 with one slot.
[[nodiscard]] std::size_t bounce_reserve(const LaneLimits& limits) noexcept;
/// Each lane's share while `demand` lanes have requests to issue.
[[nodiscard]] Shares shares(const LaneLimits& limits, std::size_t demand) noexcept;
/// Whether lane `l` may issue a request now (see the file comment).
[[nodiscard]] bool may_issue(const LaneLoad& l, const Shares& s, const Free& free, std::size_t reserve) noexcept;
/// Whether a staged request of lane `l` may take a bounce slot now.
[[nodiscard]] bool may_bounce(const LaneLoad& l, const Shares& s, const Free& free,
                              std::size_t bounce_reserve) noexcept;
/// What writes may always hold of a lane's share `s` while reads are active: max(1,
/// requests/16) requests and max(1, bytes/16) bytes.
[[nodiscard]] Shares write_floor(const Shares& s) noexcept;
/// Whether reads are active on lane `l`: waiting, in flight, or recently done.
[[nodiscard]] bool reads_active(const LaneLoad& l) noexcept;
/// The class lane `l` issues next within its share `s` (see the file comment), or None. The
/// lane-wide rules (may_issue()) are checked apart.
[[nodiscard]] OpClass pick_class(const LaneLoad& l, const Shares& s) noexcept;
/// The most requests one of `waiting` slices of a lane may hold, of the lane's `lane_share`.
[[nodiscard]] std::size_t slice_share(std::size_t lane_share, std::size_t waiting) noexcept;
/// Books a request of `bytes` issued by lane `l` (with a bounce slot or not; a read or not).
void charge(LaneLoad& l, std::uint64_t bytes, bool bounced, bool read = false) noexcept;
/// Books the end of such a request (its slot released).
void discharge(LaneLoad& l, std::uint64_t bytes, bool bounced, bool read = false) noexcept;

/// The lane whose turn it is among [first, last) (deficit round-robin, see the file comment),
/// or `last` when none may issue. `turn` is where the round stands (kept between calls; moved
/// past the lanes whose turn ended); `load(lane)` gives a lane's LaneLoad&.
template <typename It, typename Load>
It pick_lane(It first, It last, It& turn, const Shares& s, const Free& free, std::size_t reserve, std::uint64_t quantum,
             Load load) {
  if (first == last) return last;
  std::size_t n = 0;
  for (It it = first; it != last; ++it) ++n;
  if (turn == last) turn = first;
  for (std::size_t visits = 0; visits <= 2 * n; ++visits) {
    LaneLoad& l = load(*turn);
    if (may_issue(l, s, free, reserve)) {
      if (l.deficit > 0) return turn;
      l.deficit += static_cast<std::int64_t>(quantum);  // its turn is over: the next starts with a quantum
    } else if (l.waiting == 0) {
      l.deficit = 0;  // no backlog, no credit kept
    }
    if (++turn == last) turn = first;
  }
  return last;
}

}  // namespace deepio::detail
