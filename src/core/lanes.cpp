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
  return free.slots > reserve || l.inflight < newcomer_depth(reserve);
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

void charge(LaneLoad& l, std::uint64_t bytes, bool bounced) noexcept {
  ++l.inflight;
  l.inflight_bytes += bytes;
  l.deficit -= static_cast<std::int64_t>(bytes);
  if (bounced) ++l.bounces;
}

void discharge(LaneLoad& l, std::uint64_t bytes, bool bounced) noexcept {
  --l.inflight;
  l.inflight_bytes -= bytes;
  if (bounced) --l.bounces;
}

}  // namespace deepio::detail
