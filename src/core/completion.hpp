// The worker's completion policy: what to do with one request's result. A pure function of
// the request's state and the result, so every branch is tested by a table
// (tests/cpp/test_completion.cpp); the worker (worker.cpp) applies the decision: it moves the
// slot, resubmits it, defers it, reopens the descriptor or fails the op, and bumps counters.
//
// decide(slot, result), where result is what the backend (or a fault hook) reported: the
// bytes moved, or a negative errno.
//   -EINTR, -EAGAIN, while the slot's retries after this one stay under kMaxRetries:
//       Resubmit (EINTR: interrupted, short of nothing: at once) or Backoff (EAGAIN: after
//       backoff(retries)); the worker counts a retry. `retries` is the slot's new count.
//   -EINVAL on a direct request (not on the buffered descriptor, not a driver file's):
//       PageCache: redo the whole request through the page cache (the worker counts
//       direct_refused); if the op has no buffered descriptor to give, the worker fails the
//       op with the error fields of this decision instead.
//   any other negative result (and EINTR/EAGAIN once the budget is spent): Fail with that
//       errno; the message is the backend's own text for the request if it has one, else
//       `message` ("read failed" / "write failed"), followed by `suffix` (" (still, after
//       1000 attempts)" when the retry budget is what ran out, else empty).
//   0 of a non-empty request: Fail, EIO "write made no progress" for a write, ENODATA
//       "unexpected end of file" for a read (never the backend's text).
//   0 < result < len: Rest, a short transfer: `moved` bytes are done and the rest is
//       resubmitted at once; a direct request (neither buffered nor a driver file's) goes on
//       through the page cache (`to_page_cache`), since the rest's offset may no longer be
//       aligned. The worker counts a short transfer.
//   result >= len: Done.
// Never throws (except std::bad_alloc making a message); thread-safe (no state).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace deepio::detail {

/// EINTR/EAGAIN resubmissions of one request before giving up.
inline constexpr int kMaxRetries = 1000;

/// The wait before the n-th resubmission (n >= 1) of a request the kernel answered EAGAIN
/// (out of resources for now), and before reaping again after the n-th transient reap
/// failure in a row: 1 us doubling up to 1 ms, so kMaxRetries of them take about one second
/// in all before the request fails, instead of a thousand resubmissions in a busy loop.
std::chrono::microseconds backoff(int n) noexcept;

/// What decide() needs to know of the request in flight.
struct SlotView {
  bool write = false;
  bool buffered = false;     ///< on the buffered descriptor (no O_DIRECT)
  bool driver_file = false;  ///< a route's request (GPUDirect Storage): never through the page cache
  int retries = 0;           ///< EINTR/EAGAIN resubmissions so far
  std::uint32_t len = 0;     ///< bytes this submission asked for
};

enum class Action {
  Done,       ///< every byte moved
  Resubmit,   ///< submit the same request again, at once
  Backoff,    ///< submit the same request again after `delay`
  PageCache,  ///< redo the request on the buffered descriptor (or fail as below if none)
  Rest,       ///< short transfer: skip `moved` bytes and submit the rest at once
  Fail,       ///< fail the op with errnum and the message
};

struct Decision {
  Action action = Action::Done;
  int retries = 0;                     ///< the slot's retry count from now on
  std::chrono::microseconds delay{0};  ///< Backoff
  std::uint64_t moved = 0;             ///< Rest
  bool to_page_cache = false;          ///< Rest: continue on the buffered descriptor
  int errnum = 0;                      ///< Fail, and PageCache when it cannot be done
  std::string message;                 ///< Fail: the text when the backend has none
  bool backend_text = false;           ///< Fail: the backend's text, if any, replaces message
  std::string suffix;                  ///< Fail: appended to the text
};

Decision decide(const SlotView& slot, std::int64_t result);

}  // namespace deepio::detail
