#include "core/lanes.hpp"

#include <algorithm>

namespace deepio::detail {

std::uint64_t byte_budget(const LaneLimits& limits) noexcept {
  if (limits.inflight_bytes != 0) return limits.inflight_bytes;
  return std::max<std::uint64_t>(1, std::uint64_t{limits.queue_depth} * limits.quantum);
}

std::size_t reserve(const LaneLimits& limits) noexcept {
  return limits.queue_depth < 2 ? 0 : std::max<std::size_t>(1, limits.queue_depth / 8);
}

std::size_t bounce_reserve(const LaneLimits& limits) noexcept {
  return limits.bounce_slots < 2 ? 0 : std::max<std::size_t>(1, limits.bounce_slots / 8);
}

std::size_t newcomer_depth(std::size_t reserve) noexcept { return std::max<std::size_t>(1, reserve / 2); }

Shares shares(const LaneLimits& limits, std::size_t demand) noexcept {
  const std::size_t qd = std::max<std::size_t>(1, limits.queue_depth);
  const std::uint64_t bytes = byte_budget(limits);
  Shares s;
  if (demand <= 1) {
    s.requests = qd - reserve(limits);
    s.bytes = bytes - bytes / 8;
    s.bounces = limits.bounce_slots - bounce_reserve(limits);
    return s;
  }
  s.requests = std::max<std::size_t>(1, (qd + demand - 1) / demand);
  s.bytes = std::max<std::uint64_t>(1, (bytes + demand - 1) / demand);
  s.bounces = std::max<std::size_t>(1, limits.bounce_slots / demand);
  return s;
}

bool may_issue(const LaneLoad& l, const Shares& s, const Free& free, std::size_t reserve) noexcept {
  if (l.waiting == 0 || l.stalled || free.slots == 0) return false;
  if (l.inflight == 0) return true;  // a newcomer: any free slot, whatever the shares
  if (l.inflight >= s.requests || l.inflight_bytes >= s.bytes) return false;
  if (free.slots <= reserve && l.inflight >= newcomer_depth(reserve)) return false;
  return pick_class(l, s) != OpClass::None;
}

Shares write_floor(const Shares& s) noexcept {
  Shares f;
  f.requests = std::max<std::size_t>(1, s.requests / 16);
  f.bytes = std::max<std::uint64_t>(1, s.bytes / 16);
  f.bounces = s.bounces;
  return f;
}

bool reads_active(const LaneLoad& l) noexcept { return l.reads_waiting > 0 || l.reads_inflight > 0 || l.read_recent; }

OpClass pick_class(const LaneLoad& l, const Shares& s) noexcept {
  const std::size_t writes_waiting = l.waiting - std::min(l.waiting, l.reads_waiting);
  const std::size_t write_inflight = l.inflight - std::min(l.inflight, l.reads_inflight);
  const std::uint64_t write_bytes = l.inflight_bytes - std::min(l.inflight_bytes, l.read_bytes);
  const Shares f = write_floor(s);
  const bool under_floor = write_inflight < f.requests && write_bytes < f.bytes;
  if (l.reads_waiting > 0) {
    // The floor's slots writes do not hold yet stay theirs while they wait.
    const std::size_t kept = writes_waiting > 0 && under_floor ? f.requests - write_inflight : 0;
    if (l.inflight == 0 || l.inflight + kept < s.requests) return OpClass::Read;
    return writes_waiting > 0 && under_floor ? OpClass::Write : OpClass::None;
  }
  if (writes_waiting == 0) return OpClass::None;
  return under_floor || !reads_active(l) ? OpClass::Write : OpClass::None;
}

bool may_bounce(const LaneLoad& l, const Shares& s, const Free& free, std::size_t bounce_reserve) noexcept {
  if (free.bounces == 0) return false;
  if (l.bounces == 0) return true;
  return l.bounces < s.bounces && free.bounces > bounce_reserve;
}

std::size_t slice_share(std::size_t lane_share, std::size_t waiting) noexcept {
  if (waiting <= 1) return SIZE_MAX;
  return std::max<std::size_t>(1, (lane_share + waiting - 1) / waiting);
}

void charge(LaneLoad& l, std::uint64_t bytes, bool bounced, bool read) noexcept {
  ++l.inflight;
  l.inflight_bytes += bytes;
  l.deficit -= static_cast<std::int64_t>(bytes);
  if (bounced) ++l.bounces;
  if (read) {
    ++l.reads_inflight;
    l.read_bytes += bytes;
  }
}

void discharge(LaneLoad& l, std::uint64_t bytes, bool bounced, bool read) noexcept {
  --l.inflight;
  l.inflight_bytes -= bytes;
  if (bounced) --l.bounces;
  if (read) {
    --l.reads_inflight;
    l.read_bytes -= bytes;
  }
}

}  // namespace deepio::detail
