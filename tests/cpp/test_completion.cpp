// The worker's completion policy (core/completion.hpp), one row per branch: a request's state
// and its result in, the decision out. The worker's application of it (resubmission, the page
// cache descriptor, counters) is exercised end to end by test_failures.cpp.
#include <cerrno>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/completion.hpp"

namespace deepio::detail {
namespace {

using std::chrono::microseconds;

struct Row {
  const char* what;
  SlotView slot;
  std::int64_t result;
  Decision expected;
};

SlotView slot(bool write, bool buffered, bool driver, int retries, std::uint32_t len) {
  return SlotView{write, buffered, driver, retries, len};
}

Decision act(Action a, int retries) {
  Decision d;
  d.action = a;
  d.retries = retries;
  return d;
}
Decision backoff_after(int retries) {
  Decision d = act(Action::Backoff, retries);
  d.delay = backoff(retries);
  return d;
}
Decision rest(std::uint64_t moved, bool to_page_cache, int retries = 0) {
  Decision d = act(Action::Rest, retries);
  d.moved = moved;
  d.to_page_cache = to_page_cache;
  return d;
}
Decision fail(Action a, int err, const char* message, bool backend_text, std::string suffix, int retries) {
  Decision d = act(a, retries);
  d.errnum = err;
  d.message = message;
  d.backend_text = backend_text;
  d.suffix = std::move(suffix);
  return d;
}
const std::string kSpent = " (still, after 1000 attempts)";

TEST(Completion, EveryBranch) {
  const std::vector<Row> rows = {
      {"whole read", slot(false, false, false, 0, 4096), 4096, act(Action::Done, 0)},
      {"whole buffered write", slot(true, true, false, 3, 100), 100, act(Action::Done, 3)},
      {"more than asked is done", slot(false, false, false, 0, 10), 11, act(Action::Done, 0)},
      {"empty request, zero bytes", slot(false, false, false, 0, 0), 0, act(Action::Done, 0)},
      {"EINTR: at once", slot(false, false, false, 0, 4096), -EINTR, act(Action::Resubmit, 1)},
      {"EINTR counts on", slot(true, true, false, 5, 4096), -EINTR, act(Action::Resubmit, 6)},
      {"EAGAIN: backs off 1 us", slot(false, false, false, 0, 4096), -EAGAIN, backoff_after(1)},
      {"EAGAIN: 4 us on the 3rd", slot(false, false, false, 2, 4096), -EAGAIN, backoff_after(3)},
      {"EAGAIN: last try", slot(false, false, false, 998, 4096), -EAGAIN, backoff_after(999)},
      {"EAGAIN: budget spent", slot(false, false, false, 999, 4096), -EAGAIN,
       fail(Action::Fail, EAGAIN, "read failed", true, kSpent, 1000)},
      {"EINTR: budget spent", slot(true, false, false, 999, 4096), -EINTR,
       fail(Action::Fail, EINTR, "write failed", true, kSpent, 1000)},
      {"EINVAL direct: page cache", slot(false, false, false, 0, 4096), -EINVAL,
       fail(Action::PageCache, EINVAL, "read failed", true, "", 0)},
      {"EINVAL direct write: page cache", slot(true, false, false, 2, 4096), -EINVAL,
       fail(Action::PageCache, EINVAL, "write failed", true, "", 2)},
      {"EINVAL buffered: fails", slot(false, true, false, 0, 4096), -EINVAL,
       fail(Action::Fail, EINVAL, "read failed", true, "", 0)},
      {"EINVAL driver file: fails", slot(true, false, true, 0, 4096), -EINVAL,
       fail(Action::Fail, EINVAL, "write failed", true, "", 0)},
      {"EIO fails", slot(false, false, false, 0, 4096), -EIO, fail(Action::Fail, EIO, "read failed", true, "", 0)},
      {"ENOSPC fails", slot(true, true, false, 7, 4096), -ENOSPC,
       fail(Action::Fail, ENOSPC, "write failed", true, "", 7)},
      {"zero-byte read: end of file", slot(false, false, false, 0, 4096), 0,
       fail(Action::Fail, ENODATA, "unexpected end of file", false, "", 0)},
      {"zero-byte write: no progress", slot(true, true, false, 1, 4096), 0,
       fail(Action::Fail, EIO, "write made no progress", false, "", 1)},
      {"short direct read: rest via page cache", slot(false, false, false, 0, 4096), 512, rest(512, true)},
      {"short buffered write: rest as is", slot(true, true, false, 0, 4096), 4095, rest(4095, false)},
      {"short driver read: rest as is", slot(false, false, true, 2, 8192), 4096, rest(4096, false, 2)},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    const Decision d = decide(r.slot, r.result);
    EXPECT_EQ(d.action, r.expected.action);
    EXPECT_EQ(d.retries, r.expected.retries);
    EXPECT_EQ(d.delay, r.expected.delay);
    EXPECT_EQ(d.moved, r.expected.moved);
    EXPECT_EQ(d.to_page_cache, r.expected.to_page_cache);
    EXPECT_EQ(d.errnum, r.expected.errnum);
    EXPECT_EQ(d.message, r.expected.message);
    EXPECT_EQ(d.backend_text, r.expected.backend_text);
    EXPECT_EQ(d.suffix, r.expected.suffix);
  }
}

TEST(Completion, BackoffDoublesToOneMillisecond) {
  EXPECT_EQ(backoff(1), microseconds(1));
  EXPECT_EQ(backoff(2), microseconds(2));
  EXPECT_EQ(backoff(10), microseconds(512));
  EXPECT_EQ(backoff(11), microseconds(1000));
  EXPECT_EQ(backoff(kMaxRetries), microseconds(1000));
  microseconds total{0};
  for (int n = 1; n < kMaxRetries; ++n) total += backoff(n);
  EXPECT_GT(total, microseconds(900'000)) << "the retry budget lasts about a second";
  EXPECT_LT(total, microseconds(1'100'000));
}

}  // namespace
}  // namespace deepio::detail
