// Failure paths through the test-only fault hook, where the system cannot produce them on
// demand: EIO failing only its own op, short transfers finished, EAGAIN and EINTR retried (with
// back-off, bounded), EINVAL from O_DIRECT redone buffered, open failures, the descriptor limit,
// reap and submit errors, a queue killed with requests in flight, a handle destroyed with work
// in flight. The Failures suite is instantiated for every backend in test_failures.cpp.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/completion.hpp"
#include "platform/fault.hpp"
#include "common/support.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::slurp;
using test::take_turn;

using Failures = test::BackendTest;

using test::in_child;

TEST_P(Failures, InjectedEIOFailsOnlyItsOpAfterAllFinish) {
  Handle h(opts({.block_size = 65536, .queue_depth = 8, .overlap_events = true}));
  const std::string bad = dir_.file("bad"), good = dir_.file("good");
  test::put(bad, pattern(1 << 20, 1));
  test::put(good, pattern(1 << 20, 2));
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Read && s.offset == 3 * 65536 && s.nbytes == 65536 && s.result > 0) {
      // Only for the file named "bad": identify it through /proc.
      if (test::fd_path(s.fd).ends_with("/bad")) return -EIO;
    }
    return std::nullopt;
  });
  std::vector<std::byte> a(1 << 20), b(1 << 20);
  h.async_pread(a.data(), a.size(), bad);
  h.async_pread(b.data(), b.size(), good);
  try {
    h.wait();
    FAIL() << "expected EIO";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), bad);
    EXPECT_EQ(e.offset(), 3u * 65536);
    EXPECT_EQ(e.nbytes(), 65536u);
  }
  EXPECT_EQ(h.pending(), 0u) << "wait() collected both";
  EXPECT_EQ(b, pattern(1 << 20, 2)) << "the good op completed";
  EXPECT_EQ(h.wait(), 0u) << "an error is reported once";
  detail::set_fault_hook({});
  EXPECT_EQ(h.sync_pread(a.data(), a.size(), bad), 1u) << "the handle stays usable";
  EXPECT_EQ(h.stats().ops_failed, 1u);
}

TEST_P(Failures, InjectedShortTransfersAreFinished) {
  std::atomic<int> shortened{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if ((s.point == FaultPoint::Read || s.point == FaultPoint::Write) && s.result > 1 &&
        take_turn(shortened, 50) >= 0) {
      return s.result / 2;
    }
    return std::nullopt;
  });
  Handle h(opts({.block_size = 65536, .queue_depth = 4, .intra_op_parallelism = 2}));
  const auto data = pattern((1 << 20) + 333, 8);
  h.sync_pwrite(data.data(), data.size(), dir_.file("s"), 100);
  std::vector<std::byte> back(data.size());
  h.sync_pread(back.data(), back.size(), dir_.file("s"), 100);
  detail::set_fault_hook({});
  EXPECT_EQ(back, data);
  EXPECT_EQ(shortened.load(), 50);
  EXPECT_EQ(h.stats().short_transfers, 50u);
}

TEST_P(Failures, InjectedEAGAINAndEINTRAreRetried) {
  std::atomic<int> n{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    const bool io = s.point == FaultPoint::Read || s.point == FaultPoint::Write;
    const int turn = io ? take_turn(n, 20) : -1;
    if (turn >= 0) return (turn + 1) % 2 == 0 ? -EAGAIN : -EINTR;
    return std::nullopt;
  });
  Handle h(opts({.block_size = 65536}));
  const auto data = pattern(1 << 20, 9);
  h.sync_pwrite(data.data(), data.size(), dir_.file("r"));
  detail::set_fault_hook({});
  EXPECT_EQ(slurp(dir_.file("r")), data);
  EXPECT_EQ(h.stats().retries, 20u);
}

TEST_P(Failures, DirectRequestRefusedWithEINVALIsRedoneBuffered) {
  const auto info = probe_direct_io(dir_.path().string());
  if (!info.supported) GTEST_SKIP() << "no O_DIRECT here";
  std::atomic<int> refused{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    char link[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", s.fd);
    if (s.point == FaultPoint::Write && (::fcntl(s.fd, F_GETFL) & O_DIRECT) != 0) {
      ++refused;
      return -EINVAL;
    }
    return std::nullopt;
  });
  Handle h(opts({.block_size = 1 << 18}));
  UniqueLockedBuffer buf(1 << 20);
  std::memset(buf.data(), 0x33, buf.size());
  h.sync_pwrite(buf.data(), buf.size(), dir_.file("e"));
  detail::set_fault_hook({});
  EXPECT_EQ(refused.load(), 4);
  EXPECT_EQ(h.stats().direct_refused, 4u);
  auto file = slurp(dir_.file("e"));
  ASSERT_EQ(file.size(), buf.size());
  EXPECT_EQ(std::memcmp(file.data(), buf.data(), buf.size()), 0);
}

TEST_P(Failures, InjectedOpenFailure) {
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    return s.point == FaultPoint::Open ? std::optional<std::int64_t>(-EMFILE) : std::nullopt;
  });
  Handle h(opts());
  std::vector<std::byte> buf(10);
  try {
    h.async_pwrite(buf.data(), buf.size(), dir_.file("o"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EMFILE) << "no op of this handle holds a descriptor: reported, not waited for";
  }
}

TEST_P(Failures, DescriptorLimitIsAbsorbedByWaitingForOwnOps) {
  // A real RLIMIT_NOFILE far below the number of files in flight: submission waits for this
  // handle's own ops to release descriptors instead of failing.
  constexpr int kFiles = 300;
  const auto data = pattern(65536, 5);
  for (int i = 0; i < kFiles; ++i) test::put(dir_.file("n" + std::to_string(i)), data);
  const BackendKind kind = GetParam();
  const std::string base = dir_.file("n");
  const int code = in_child([&] {
    {
      // The same work once before the limit: UBSan's vptr check of a type it has not seen
      // yet (std::thread's state, at the workers' start) opens a pipe to read memory, which
      // fails at the limit and is reported as an invalid object. Seen once, it is cached.
      Handle warm({.block_size = 65536, .queue_depth = 8, .backend = kind});
      std::vector<std::byte> one(65536);
      warm.async_pread(one.data(), one.size(), base + "0");
      if (warm.wait() != 1) return 89;
    }
    rlimit rl{48, 48};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 90;
    Handle h({.block_size = 65536, .queue_depth = 8, .backend = kind});
    std::vector<std::vector<std::byte>> bufs(kFiles, std::vector<std::byte>(65536));
    for (int i = 0; i < kFiles; ++i) h.async_pread(bufs[i].data(), 65536, base + std::to_string(i));
    if (h.wait() != static_cast<std::size_t>(kFiles)) return 91;
    for (const auto& b : bufs) {
      if (b != data) return 92;
    }
    return 0;
  });
  EXPECT_EQ(code, 0);
}

TEST_P(Failures, EveryBlockFailingStillCompletesTheOp) {
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    return s.point == FaultPoint::Write ? std::optional<std::int64_t>(-EIO) : std::nullopt;
  });
  Handle h(opts({.block_size = 4096, .queue_depth = 3, .intra_op_parallelism = 4}));
  const auto data = pattern(1 << 20, 1);
  for (int i = 0; i < 10; ++i) h.async_pwrite(data.data(), data.size(), dir_.file("x" + std::to_string(i)));
  EXPECT_THROW(h.wait(), Error);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.stats().ops_failed, 10u);
}

// A queue that cannot hand back completions (a reap error other than EINTR/EAGAIN/EBUSY)
// must not leave the worker spinning and wait() hanging: every request in it fails with the
// errno, wait() raises it, and later requests on the same handle fail at once the same way.
TEST_P(Failures, ReapErrorFailsEveryRequestInFlightAndWaitRaises) {
  struct statfs sfs {};
  if (GetParam() == BackendKind::IoUring && ::statfs(dir_.path().c_str(), &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << "io_uring workers run requests on tmpfs files themselves: none is in the ring to fail";
  }
  const auto data = pattern(4 << 20, 8);
  const std::string f = dir_.file("reap");
  test::put(f, data);
  std::atomic<int> reaps{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    // Let a few reaps through so that requests are really in the kernel when it fails.
    if (s.point == FaultPoint::Reap && reaps.fetch_add(1) >= 2) return -EBADF;
    return std::nullopt;
  });
  // Declared before the handle: the kernel may still finish abandoned reads into it until
  // the handle (and its rings) are gone.
  std::vector<std::byte> buf(data.size());
  Handle h(opts({.block_size = 65536, .queue_depth = 8, .overlap_events = true, .intra_op_parallelism = 2}));
  for (int i = 0; i < 4; ++i) h.async_pread(buf.data(), buf.size(), f);
  try {
    h.wait();
    ADD_FAILURE() << "wait() returned although the queue failed";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EBADF) << e.what();
    EXPECT_NE(std::string(e.what()).find("queue failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.stats().ops_failed, 4u);
  // The dead queue is not used again: a later request fails fast, it does not hang.
  h.async_pread(buf.data(), buf.size(), f);
  EXPECT_THROW(h.wait(), Error);
  detail::set_fault_hook({});
}

// A queue that dies while bounced requests are in the kernel: the queue is shut down (the
// kernel done with them) before the ops fail and the slots' bounce memory is let go; then
// the handle and the buffer are destroyed (the ASan build checks that nothing touches them).
TEST_P(Failures, QueueKilledWithBouncedRequestsInFlightFailsThemWithTheCause) {
  struct statfs sfs {};
  if (GetParam() == BackendKind::IoUring && ::statfs(dir_.path().c_str(), &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << "io_uring workers run requests on tmpfs files themselves: none is in the ring to fail";
  }
  const auto data = pattern(4 << 20, 12);
  const std::string f = dir_.file("bounced");
  test::put(f, data);
  std::atomic<int> reaps{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Reap && reaps.fetch_add(1) >= 2) return -EBADF;
    return std::nullopt;
  });
  HandleStats stats;
  {
    // Misaligned by one byte: the direct body goes through bounce slots.
    test::OffsetBuffer buf(data.size(), 1);
    Handle h(opts({.block_size = 65536, .queue_depth = 8, .overlap_events = true, .intra_op_parallelism = 2}));
    for (int i = 0; i < 4; ++i) h.async_pread(buf.data(), buf.size(), f);
    try {
      h.wait();
      ADD_FAILURE() << "wait() returned although the queue failed";
    } catch (const Error& e) {
      EXPECT_EQ(e.errnum(), EBADF) << e.what();
      EXPECT_EQ(e.path(), f);
      EXPECT_NE(std::string(e.what()).find("queue failed"), std::string::npos) << e.what();
      if (GetParam() != BackendKind::Threads) {
        EXPECT_NE(std::string(e.what()).find("once the kernel was done with them"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(h.pending(), 0u);
    stats = h.stats();
  }  // the handle, then the buffer
  detail::set_fault_hook({});
  if (stats.bytes_bounced == 0 && stats.bytes_direct + stats.bytes_buffered > 0) {
    GTEST_SKIP() << "this folder takes no O_DIRECT: nothing bounced";
  }
  EXPECT_EQ(stats.ops_failed, 4u);
}

TEST_P(Failures, EAGAINIsRetriedWithBackOffAndCounted) {
  std::atomic<int> n{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Write && take_turn(n, 30) >= 0) return -EAGAIN;
    return std::nullopt;
  });
  Handle h(opts({.block_size = 1 << 20}));
  const auto data = pattern(100000, 13);
  h.sync_pwrite(data.data(), data.size(), dir_.file("again"));
  detail::set_fault_hook({});
  EXPECT_EQ(slurp(dir_.file("again")), data);
  EXPECT_EQ(h.stats().retries, 30u);
}

// The times at which a fault point was consulted, one per call: each retry's back-off is
// checked as a lower bound between two calls (a busy machine only makes the gaps longer, so
// this never fails for load), never as an upper bound on the whole.
struct CallTimes {
  std::mutex mutex;
  std::vector<std::chrono::steady_clock::time_point> at;
  void note() {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex);
    at.push_back(now);
  }
  // The first n (1-based) whose gap to the next call is shorter than backoff(n); 0 if none.
  int first_short_gap() {
    std::lock_guard lock(mutex);
    for (std::size_t i = 1; i < at.size(); ++i) {
      if (at[i] - at[i - 1] < detail::backoff(static_cast<int>(i))) return static_cast<int>(i);
    }
    return 0;
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return at.size();
  }
};

// Generous: only a hang fails it. The back-off's own bound (about a second in all) is a property
// of the pure backoff(), checked in test_completion.cpp, not a wall-clock figure here.
constexpr auto kHangGuard = std::chrono::seconds(60);

// A request the kernel keeps refusing with EAGAIN fails, naming itself, after the bounded
// retry budget: exactly kMaxRetries attempts, each retry after at least its back-off (neither
// at once nor never). No upper bound on the time: that flaked on a loaded machine.
TEST_P(Failures, PersistentEAGAINFailsInBoundedTimeNamingTheRequest) {
  CallTimes attempts;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point != FaultPoint::Write) return std::nullopt;
    attempts.note();
    return -EAGAIN;
  });
  Handle h(opts({.block_size = 1 << 20}));
  const auto data = pattern(4096, 14);
  Future write = h.async_pwrite(data.data(), data.size(), dir_.file("never"), 8192);
  ASSERT_TRUE(write.wait_for(kHangGuard))
      << "a write refused forever is still being retried after " << attempts.count() << " attempts";
  try {
    write.get();
    ADD_FAILURE() << "a write refused forever succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EAGAIN) << e.what();
    EXPECT_EQ(e.path(), dir_.file("never"));
    EXPECT_EQ(e.offset(), 8192u);
    EXPECT_EQ(e.nbytes(), 4096u);
    EXPECT_NE(std::string(e.what()).find("1000 attempts"), std::string::npos) << e.what();
  }
  detail::set_fault_hook({});
  EXPECT_EQ(attempts.count(), static_cast<std::size_t>(detail::kMaxRetries)) << "the retry budget is bounded";
  EXPECT_EQ(h.stats().retries, static_cast<std::uint64_t>(detail::kMaxRetries - 1));
  EXPECT_EQ(attempts.first_short_gap(), 0) << "a retry came before its back-off was over";
}

// A reap that keeps failing with EAGAIN gives up the same way, and the queue fails: the same
// budget of reaps, each after its back-off.
TEST_P(Failures, PersistentReapEAGAINFailsTheQueueInBoundedTime) {
  struct statfs sfs {};
  if (GetParam() == BackendKind::IoUring && ::statfs(dir_.path().c_str(), &sfs) == 0 && sfs.f_type == TMPFS_MAGIC) {
    GTEST_SKIP() << "io_uring workers run requests on tmpfs files themselves: nothing is reaped";
  }
  CallTimes reaps;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point != FaultPoint::Reap) return std::nullopt;
    reaps.note();
    return -EAGAIN;
  });
  Handle h(opts({.block_size = 1 << 20}));
  const auto data = pattern(4096, 15);
  Future write = h.async_pwrite(data.data(), data.size(), dir_.file("reap-again"));
  ASSERT_TRUE(write.wait_for(kHangGuard))
      << "a queue that never hands back completions is still reaped after " << reaps.count() << " tries";
  try {
    write.get();
    ADD_FAILURE() << "a queue that never hands back completions succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EAGAIN) << e.what();
    EXPECT_EQ(e.path(), dir_.file("reap-again"));
    EXPECT_NE(std::string(e.what()).find("queue failed"), std::string::npos) << e.what();
  }
  detail::set_fault_hook({});
  EXPECT_EQ(reaps.count(), static_cast<std::size_t>(detail::kMaxRetries)) << "the retry budget is bounded";
  EXPECT_EQ(h.stats().retries, static_cast<std::uint64_t>(detail::kMaxRetries - 1));
  EXPECT_EQ(reaps.first_short_gap(), 0) << "a reap came before its back-off was over";
}

TEST_P(Failures, SubmitErrorFailsTheRequestAndWaitRaises) {
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    return s.point == FaultPoint::Submit ? std::optional<std::int64_t>(-ENOMEM) : std::nullopt;
  });
  Handle h(opts({.block_size = 65536, .queue_depth = 4}));
  const auto data = pattern(1 << 20, 9);
  h.async_pwrite(data.data(), data.size(), dir_.file("sub"));
  try {
    h.wait();
    ADD_FAILURE() << "wait() returned although every submission failed";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOMEM) << e.what();
  }
  detail::set_fault_hook({});
  // The queue itself is fine: the next request works.
  h.async_pwrite(data.data(), data.size(), dir_.file("sub"));
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(slurp(dir_.file("sub")), data);
}

TEST_P(Failures, HandleDestroyedWithWorkInFlightFinishesIt) {
  const auto data = pattern(8 << 20, 4);
  {
    Handle h(opts({.block_size = 65536, .queue_depth = 2}));
    for (int i = 0; i < 8; ++i) h.async_pwrite(data.data(), data.size(), dir_.file("d" + std::to_string(i)));
  }  // destroyed without wait()
  for (int i = 0; i < 8; ++i) ASSERT_EQ(slurp(dir_.file("d" + std::to_string(i))), data) << i;
}

}  // namespace
}  // namespace deepio
