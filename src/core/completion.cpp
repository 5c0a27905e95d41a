// The completion policy of completion.hpp, branch by branch in the order it states them.
#include "core/completion.hpp"

#include <algorithm>
#include <cerrno>

namespace deepio::detail {

std::chrono::microseconds backoff(int n) noexcept {
  return std::chrono::microseconds(n >= 11 ? 1000 : std::min(1000, 1 << (n - 1)));
}

Decision decide(const SlotView& slot, std::int64_t result) {
  Decision d;
  d.retries = slot.retries;
  if (result < 0) {
    const int err = static_cast<int>(-result);
    if ((err == EINTR || err == EAGAIN) && ++d.retries < kMaxRetries) {
      d.action = err == EINTR ? Action::Resubmit : Action::Backoff;
      if (err == EAGAIN) d.delay = backoff(d.retries);
      return d;
    }
    d.action = err == EINVAL && !slot.buffered && !slot.driver_file ? Action::PageCache : Action::Fail;
    d.errnum = err;
    d.message = slot.write ? "write failed" : "read failed";
    d.backend_text = true;
    if (d.retries >= kMaxRetries) d.suffix = " (still, after " + std::to_string(kMaxRetries) + " attempts)";
    return d;
  }
  const auto got = static_cast<std::uint64_t>(result);
  if (got >= slot.len) return d;  // Done
  if (got == 0) {
    d.action = Action::Fail;
    d.errnum = slot.write ? EIO : ENODATA;
    d.message = slot.write ? "write made no progress" : "unexpected end of file";
    return d;
  }
  d.action = Action::Rest;
  d.moved = got;
  d.to_page_cache = !slot.buffered && !slot.driver_file;
  return d;
}

}  // namespace deepio::detail
