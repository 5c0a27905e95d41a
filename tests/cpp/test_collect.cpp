// Collection: Handle::collect / wait / Future::get, and the binding's protocol over them
// (engine/binding.hpp: keep-alives, detached operations, marks), own the ledger of operations.
// Checked with real files and a fault hook that holds every read until a gate opens, so "not
// done yet" is deterministic: keep-alives are released exactly once, only at collection,
// never before the operation is done and never on a worker thread; a collect() with a
// deadline claims nothing unless everything it covers is done; racing waiters count each
// operation once; detached operations belong to their Future. Also the one validation of
// arguments (InvalidArgument).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "engine/binding.hpp"

namespace deepio {
namespace {

using namespace std::chrono_literals;
using detail::BindingCollect;
using detail::BindingOp;
using detail::Collected;
using detail::FaultPoint;
using detail::FaultSite;

// Removes the fault hook a test installed.
struct HookGuard {
  HookGuard() = default;
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;
  ~HookGuard() { detail::set_fault_hook({}); }
};

// Holds every read completion until open() (the hook runs on the worker thread).
class Gate {
 public:
  Gate() {
    detail::set_fault_hook([this](const FaultSite& s) -> std::optional<std::int64_t> {
      if (s.point == FaultPoint::Read) {
        std::unique_lock lock(mutex_);
        ++held_;
        held_cv_.notify_all();
        cv_.wait(lock, [&] { return open_; });
        if (fail_offsets_.count(s.offset) != 0) return -EIO;
      }
      return std::nullopt;
    });
  }
  ~Gate() {
    open();
    detail::set_fault_hook({});
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
    opened_.store(true);
  }
  [[nodiscard]] bool is_open() const { return opened_.load(); }
  // Blocks until `n` reads have reached the gate (each holds its worker there until open()).
  // The 30 s bound only keeps a broken engine from hanging the suite.
  [[nodiscard]] bool wait_held(int n) {
    std::unique_lock lock(mutex_);
    return held_cv_.wait_for(lock, 30s, [&] { return held_ >= n; });
  }
  void fail_at(std::uint64_t offset) { fail_offsets_.insert(offset); }  // before any I/O

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable held_cv_;
  int held_ = 0;  // reads that reached the gate; guarded by mutex_
  bool open_ = false;
  std::atomic<bool> opened_{false};
  std::set<std::uint64_t> fail_offsets_;
};

// Keep-alives that count their releases and record where and when they happened.
struct Tracker {
  std::atomic<int> released{0};
  std::atomic<int> released_while_gate_closed{0};
  std::mutex mutex;
  std::vector<std::thread::id> threads;  // guarded by mutex
  const Gate* gate = nullptr;

  std::shared_ptr<void> make() {
    return std::shared_ptr<void>(new int(0), [this](int* p) {
      delete p;
      if (gate != nullptr && !gate->is_open()) released_while_gate_closed.fetch_add(1);
      {
        std::lock_guard lock(mutex);
        threads.push_back(std::this_thread::get_id());
      }
      released.fetch_add(1);
    });
  }
};

BindingOp keep(Tracker& t, bool detached = false) { return {.keep_alive = t.make(), .detached = detached}; }

// A read as the binding submits it: with a keep-alive, perhaps detached.
Future read(Handle& h, void* buffer, std::size_t nbytes, const std::string& path, std::uint64_t offset,
            BindingOp binding) {
  return detail::submit(h, false, buffer, nbytes, &path, -1, offset, {}, std::move(binding));
}

// A collect() with a short deadline while some covered operation still runs, the binding's
// and the public one: it claims nothing and hands nothing back.
void expect_collects_nothing(Handle& h) {
  BindingCollect soon;
  soon.deadline = std::chrono::steady_clock::now() + 20ms;
  const Collected r = detail::collect(h, soon);
  EXPECT_FALSE(r.complete);
  EXPECT_EQ(r.count, 0u);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.keep_alive.empty());
  const WaitResult w = h.collect({.deadline = std::chrono::steady_clock::now() + 20ms});
  EXPECT_FALSE(w.complete);
  EXPECT_EQ(w.count, 0u);
  EXPECT_TRUE(w.errors.empty());
}

HandleOptions threads_backend(std::size_t workers = 2) {
  HandleOptions o;
  o.block_size = 4096;
  o.queue_depth = 4;
  o.intra_op_parallelism = workers;
  o.backend = BackendKind::Threads;
  return o;
}

class Collect : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("data.bin");
    const auto data = test::pattern(kFile, 7);
    Handle h;
    h.sync_pwrite(data.data(), data.size(), path_);
  }
  static constexpr std::size_t kFile = 16 * 4096;
  test::TempDir dir_;
  std::string path_;
};

TEST_F(Collect, KeepAliveReleasedOnlyWhenCollectedAndOnTheCollectingThread) {
  Tracker t;
  std::vector<std::vector<std::byte>> bufs(6, std::vector<std::byte>(4096));
  {
    Gate gate;
    t.gate = &gate;
    Handle h(threads_backend());
    std::vector<Future> futs;
    for (std::size_t i = 0; i < bufs.size(); ++i)
      futs.push_back(read(h, bufs[i].data(), 4096, path_, i * 4096, keep(t)));
    EXPECT_EQ(h.pending(), bufs.size());
    expect_collects_nothing(h);  // not done
    EXPECT_EQ(h.pending(), bufs.size());
    EXPECT_EQ(t.released.load(), 0);

    gate.open();
    for (auto& f : futs) f.wait();
    // Done but not collected: the handle still holds every keep-alive.
    EXPECT_EQ(t.released.load(), 0);
    Collected r = detail::collect(h);
    EXPECT_TRUE(r.complete);
    EXPECT_EQ(r.count, bufs.size());
    EXPECT_TRUE(r.errors.empty());
    ASSERT_EQ(r.keep_alive.size(), bufs.size());
    EXPECT_EQ(t.released.load(), 0);  // handed back, not released
    r.keep_alive.clear();
    EXPECT_EQ(t.released.load(), static_cast<int>(bufs.size()));
    EXPECT_EQ(h.pending(), 0u);
    EXPECT_EQ(h.wait(), 0u);
  }
  EXPECT_EQ(t.released.load(), static_cast<int>(bufs.size()));  // exactly once each
  EXPECT_EQ(t.released_while_gate_closed.load(), 0);
  for (auto id : t.threads) EXPECT_EQ(id, std::this_thread::get_id());
}

TEST_F(Collect, DeadlineCollectClaimsNothingUnlessAllDone) {
  Tracker t;
  std::vector<std::byte> a(4096), b(4096);
  Gate gate;
  t.gate = &gate;
  Handle h(threads_backend(1));
  // The first op finishes at once (a zero-byte op needs no read); the second is held.
  Future first = read(h, a.data(), 0, path_, 0, keep(t));
  first.wait();
  const std::uint64_t after_first = detail::mark(h);
  Future second = read(h, b.data(), 4096, path_, 0, keep(t));
  expect_collects_nothing(h);
  EXPECT_EQ(h.pending(), 2u);  // the finished one was not claimed either
  EXPECT_EQ(t.released.load(), 0);
  // A mark before the second op covers only the first, which is done.
  BindingCollect first_only;
  first_only.through = after_first;
  first_only.deadline = std::chrono::steady_clock::now() + 20ms;
  Collected r = detail::collect(h, first_only);
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.count, 1u);
  EXPECT_EQ(r.keep_alive.size(), 1u);
  r = Collected{};
  EXPECT_EQ(t.released.load(), 1);
  gate.open();
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(t.released.load(), 2);
}

TEST_F(Collect, RacingWaitersCountEachOpOnceAndReleaseEachKeepAliveOnce) {
  constexpr int kOps = 64;
  constexpr int kWaiters = 4;
  Tracker t;
  std::vector<std::vector<std::byte>> bufs(kOps, std::vector<std::byte>(4096));
  std::set<std::thread::id> waiter_ids;
  {
    Gate gate;
    t.gate = &gate;
    Handle h(threads_backend(2));
    for (int i = 0; i < kOps; ++i) read(h, bufs[i].data(), 4096, path_, (i % 16) * 4096, keep(t));
    std::atomic<std::size_t> total{0};
    std::atomic<int> returned_while_gate_closed{0};
    std::mutex ids_mutex;
    std::vector<std::thread> waiters;
    for (int w = 0; w < kWaiters; ++w) {
      waiters.emplace_back([&] {
        {
          std::lock_guard lock(ids_mutex);
          waiter_ids.insert(std::this_thread::get_id());
        }
        total += h.wait();
        if (!gate.is_open()) returned_while_gate_closed.fetch_add(1);
      });
    }
    // A worker is held in the gate with a read (every read stops there): nothing can be done,
    // so nothing may be released and no wait() may return. The counters below record any
    // release or return while the gate was closed, whenever it happened, instead of sampling
    // after a sleep. (EXPECT, not ASSERT: returning here would leave the waiters joinable.)
    EXPECT_TRUE(gate.wait_held(1)) << "no read reached the gate";
    EXPECT_EQ(t.released.load(), 0);
    EXPECT_EQ(h.pending(), static_cast<std::size_t>(kOps));
    gate.open();
    for (auto& th : waiters) th.join();
    EXPECT_EQ(total.load(), static_cast<std::size_t>(kOps));
    EXPECT_EQ(returned_while_gate_closed.load(), 0);
    EXPECT_EQ(t.released.load(), kOps);
    EXPECT_EQ(h.wait(), 0u);
  }
  EXPECT_EQ(t.released.load(), kOps);
  EXPECT_EQ(t.released_while_gate_closed.load(), 0);
  for (auto id : t.threads) EXPECT_EQ(waiter_ids.count(id), 1u) << "released off a waiter thread";
  const auto data = test::pattern(kFile, 7);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(bufs[i].data(), data.data() + (i % 16) * 4096, 4096), 0) << i;
  }
}

TEST_F(Collect, FailuresInSubmissionOrderAndFirstThrownByWait) {
  Gate gate;
  gate.fail_at(3 * 4096);
  gate.fail_at(1 * 4096);
  Handle h(threads_backend(1));
  std::vector<std::vector<std::byte>> bufs(5, std::vector<std::byte>(4096));
  for (std::size_t i = 0; i < bufs.size(); ++i) h.async_pread(bufs[i].data(), 4096, path_, i * 4096);
  gate.open();
  WaitResult r = h.collect();
  EXPECT_EQ(r.count, 5u);
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].offset(), 1 * 4096u);
  EXPECT_EQ(r.errors[1].offset(), 3 * 4096u);
  EXPECT_EQ(r.errors[0].errnum(), EIO);
  EXPECT_FALSE(r.errors[0].invalid_argument());
  for (std::size_t i = 0; i < 2; ++i) h.async_pread(bufs[i].data(), 4096, path_, (3 - 2 * i) * 4096);
  try {
    h.wait();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.offset(), 3 * 4096u);  // the first submitted of the two failures
  }
  EXPECT_EQ(h.pending(), 0u);
}

TEST_F(Collect, FutureGetCollectsItsOpAndReleasesTheKeepAlive) {
  Tracker t;
  Handle h(threads_backend());
  std::vector<std::byte> a(4096), b(4096);
  Future fa = read(h, a.data(), 4096, path_, 0, keep(t));
  read(h, b.data(), 4096, path_, 4096, keep(t));
  EXPECT_EQ(fa.get(), 4096u);
  EXPECT_EQ(t.released.load(), 1);
  EXPECT_EQ(fa.get(), 4096u);  // the same again, nothing released twice
  EXPECT_EQ(t.released.load(), 1);
  EXPECT_EQ(h.pending(), 1u);
  EXPECT_EQ(h.wait(), 1u);  // only the other one
  EXPECT_EQ(t.released.load(), 2);
}

TEST_F(Collect, DetachedOpsBelongToTheirFuture) {
  Tracker t;
  std::vector<std::byte> a(4096), b(4096), c(4096);
  {
    Gate gate;
    t.gate = &gate;
    Handle h(threads_backend());
    Future mine = read(h, a.data(), 4096, path_, 0, keep(t, /*detached=*/true));
    EXPECT_EQ(h.pending(), 0u);
    EXPECT_EQ(h.wait(), 0u);  // neither waited for nor counted
    EXPECT_FALSE(mine.done());
    // Named in `with`, it is collected and counted with the others.
    read(h, b.data(), 4096, path_, 4096, keep(t));
    gate.open();
    BindingCollect o;
    o.with = &mine;
    Collected r = detail::collect(h, o);
    EXPECT_EQ(r.count, 2u);
    EXPECT_EQ(r.keep_alive.size(), 2u);
    r = Collected{};
    EXPECT_EQ(t.released.load(), 2);
    EXPECT_EQ(mine.get(), 4096u);  // the outcome is still there for the Future

    // give_to_wait: an ordinary op from then on.
    Future handed = read(h, c.data(), 4096, path_, 0, keep(t, true));
    detail::give_to_wait(handed);
    EXPECT_EQ(h.pending(), 1u);
    EXPECT_EQ(h.wait(), 1u);
    EXPECT_EQ(t.released.load(), 3);
  }
  EXPECT_EQ(t.released.load(), 3);
}

TEST_F(Collect, AbandonedDetachedOpReleasedByALaterCollectOnlyWhenDone) {
  Tracker t;
  std::vector<std::byte> a(4096);
  Gate gate;
  t.gate = &gate;
  Handle h(threads_backend(1));
  { (void)read(h, a.data(), 4096, path_, 0, keep(t, true)); }  // every Future dropped
  BindingCollect poll;
  poll.through = 0;
  Collected r = detail::collect(h, poll);
  EXPECT_TRUE(r.keep_alive.empty());  // still running
  ASSERT_TRUE(gate.wait_held(1));
  r = detail::collect(h, poll);
  EXPECT_TRUE(r.keep_alive.empty());  // held in the gate: certainly not done
  gate.open();
  // Polls until the op is done; the 30 s bound is only a hang guard, not what is asserted.
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (r.keep_alive.empty() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
    r = detail::collect(h, poll);
  }
  EXPECT_EQ(r.keep_alive.size(), 1u);
  EXPECT_EQ(r.count, 0u);  // abandoned ops are not counted
  EXPECT_EQ(t.released.load(), 0);
  r = Collected{};
  EXPECT_EQ(t.released.load(), 1);
  EXPECT_EQ(t.released_while_gate_closed.load(), 0);
}

TEST_F(Collect, SyncCallCountsItsOwnOpWhileOthersWait) {
  Handle h(threads_backend(2));
  std::vector<std::byte> buf(4096);
  std::atomic<bool> stop{false};
  std::thread waiter([&] {
    while (!stop.load()) (void)h.wait();
  });
  for (int i = 0; i < 200; ++i) ASSERT_GE(h.sync_pread(buf.data(), 4096, path_, 0), 1u) << i;
  stop = true;
  waiter.join();
}

// A synchronous call waits for its own operation and raises only its own failure (issue 38):
// an earlier asynchronous read that failed keeps its failure for its Future or the next
// wait(), and the synchronous read returns its bytes.
TEST_F(Collect, SyncReadReturnsItsBytesWhileAnEarlierAsyncOpHasFailed) {
  HookGuard guard;
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Read && s.offset == 8192) return -EIO;
    return std::nullopt;
  });
  const auto data = test::pattern(kFile, 7);
  for (const bool keep_future : {true, false}) {
    SCOPED_TRACE(keep_future ? "the Future kept" : "the Future dropped");
    Handle h(threads_backend(1));
    std::vector<std::byte> failing(4096);
    std::vector<std::byte> mine(4096);
    Future earlier = h.async_pread(failing.data(), 4096, path_, 8192);
    earlier.wait();  // failed, and not collected by anyone
    EXPECT_EQ(h.sync_pread(mine.data(), 4096, path_, 4096), 1u);
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), data.begin() + 4096));
    EXPECT_EQ(h.pending(), 1u);  // the failed one is still the next wait()'s
    if (keep_future) {
      try {
        earlier.get();
        ADD_FAILURE() << "expected EIO from the earlier op's Future";
      } catch (const Error& e) {
        EXPECT_EQ(e.errnum(), EIO);
        EXPECT_EQ(e.offset(), 8192u);
      }
      EXPECT_EQ(h.wait(), 0u);  // collected by its Future: not counted twice
    } else {
      earlier = Future();
      const WaitResult r = h.collect();
      EXPECT_EQ(r.count, 1u);  // the async op; the sync call's own is not counted again
      ASSERT_EQ(r.errors.size(), 1u);
      EXPECT_EQ(r.errors[0].errnum(), EIO);
      EXPECT_EQ(r.errors[0].path(), path_);
      EXPECT_EQ(r.errors[0].offset(), 8192u);
    }
    EXPECT_EQ(h.wait(), 0u);
  }
}

// ... and its own failure is the only one it raises, even with an earlier one pending.
TEST_F(Collect, SyncCallRaisesOnlyItsOwnFailure) {
  HookGuard guard;
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Read && (s.offset == 8192 || s.offset == 12288))
      return s.offset == 8192 ? -EIO : -ENOSPC;
    return std::nullopt;
  });
  Handle h(threads_backend(1));
  std::vector<std::byte> a(4096), b(4096);
  h.async_pread(a.data(), 4096, path_, 8192).wait();
  try {
    h.sync_pread(b.data(), 4096, path_, 12288);
    ADD_FAILURE() << "expected the sync read's own failure";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOSPC);
    EXPECT_EQ(e.offset(), 12288u);
  }
  try {
    h.wait();
    ADD_FAILURE() << "expected the async read's failure at wait()";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.offset(), 8192u);
  }
  EXPECT_EQ(h.wait(), 0u);
}

// A synchronous call does not wait for what was submitted before it: with an earlier read
// held on the one worker, a synchronous call whose own operation is done returns (a
// zero-byte read needs no worker). Draining the handle would wait for the gate forever.
TEST_F(Collect, SyncCallDoesNotWaitForEarlierOps) {
  Gate gate;
  Handle h(threads_backend(1));
  std::vector<std::byte> a(4096), b(16);
  h.async_pread(a.data(), 4096, path_, 0);
  ASSERT_TRUE(gate.wait_held(1));
  EXPECT_EQ(h.sync_pread(b.data(), 0, path_, 0), 1u);
  EXPECT_EQ(h.pending(), 1u);
  gate.open();
  EXPECT_EQ(h.wait(), 1u);
}

TEST_F(Collect, HandleDestroyedWithUncollectedOpsReleasesTheirKeepAlives) {
  Tracker t;
  std::vector<std::byte> a(4096);
  {
    Handle h(threads_backend());
    read(h, a.data(), 4096, path_, 0, keep(t));
    read(h, a.data(), 4096, path_, 0, keep(t, true));
  }
  EXPECT_EQ(t.released.load(), 2);
}

// ----------------------------------------------------------------------- one validation

template <typename F>
InvalidArgument invalid(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e;
  }
  ADD_FAILURE() << "no InvalidArgument";
  return InvalidArgument("none");
}

TEST(Validation, BadOptionsAreInvalidArgumentsNamingTheParameter) {
  HandleOptions o;
  o.block_size = 0;
  InvalidArgument e = invalid([&] { Handle h(o); });
  EXPECT_EQ(e.errnum(), EINVAL);
  EXPECT_TRUE(e.invalid_argument());
  EXPECT_NE(e.message().find("block_size"), std::string::npos) << e.message();
  o = {};
  o.queue_depth = static_cast<std::size_t>(-1);  // what a binding passes for -1
  e = invalid([&] { Handle h(o); });
  EXPECT_NE(e.message().find("queue_depth"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("got -1"), std::string::npos) << e.message();
  o = {};
  o.queue_depth = 65537;
  e = invalid([&] { Handle h(o); });
  EXPECT_NE(e.message().find("65536"), std::string::npos) << e.message();
  o = {};
  o.intra_op_parallelism = 1025;
  e = invalid([&] { Handle h(o); });
  EXPECT_NE(e.message().find("intra_op_parallelism"), std::string::npos) << e.message();
  o = {};
  o.block_size = static_cast<std::size_t>(-4096);
  e = invalid([&] { Handle h(o); });
  EXPECT_NE(e.message().find("got -4096"), std::string::npos) << e.message();
  // The bounds themselves are accepted.
  o = {};
  o.queue_depth = 65536;
  o.intra_op_parallelism = 1;
  o.backend = BackendKind::Threads;
  EXPECT_NO_THROW(Handle h(o));
}

TEST(Validation, NegativeOffsetIsAnInvalidArgumentOverflowIsNot) {
  test::TempDir dir;
  const std::string path = dir.file("v.bin");
  Handle h;
  std::vector<std::byte> buf(16);
  h.sync_pwrite(buf.data(), buf.size(), path);
  InvalidArgument e = invalid([&] { h.async_pread(buf.data(), 16, path, static_cast<std::uint64_t>(-5)); });
  EXPECT_NE(e.message().find("file_offset"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("got -5"), std::string::npos) << e.message();
  EXPECT_EQ(e.path(), path);
  e = invalid([&] { h.async_pwrite(nullptr, 16, path, 0); });
  EXPECT_EQ(e.errnum(), EINVAL);
  try {
    h.async_pwrite(buf.data(), 16, path, static_cast<std::uint64_t>(INT64_MAX) - 4);
    FAIL() << "no EOVERFLOW";
  } catch (const Error& err) {
    EXPECT_EQ(err.errnum(), EOVERFLOW);
    EXPECT_FALSE(err.invalid_argument());
  }
  EXPECT_EQ(h.pending(), 0u);
}

TEST(Validation, EinvalFromTheFileSystemIsNotAnInvalidArgument) {
  // A file system that refuses O_DIRECT (tmpfs on older kernels, some FUSE) answers open()
  // with EINVAL; with direct_io=on that reaches the caller as the file system's error.
  test::TempDir dir;
  const std::string path = dir.file("refuses_direct.bin");
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Open && (s.flags & O_DIRECT) != 0) return -EINVAL;
    return std::nullopt;
  });
  HandleOptions o;
  o.direct_io = DirectIo::On;
  Handle h(o);
  std::vector<std::byte> buf(4096);
  try {
    h.async_pwrite(buf.data(), buf.size(), path, 0);
    ADD_FAILURE() << "no EINVAL";
  } catch (const InvalidArgument&) {
    ADD_FAILURE() << "the file system's EINVAL was taken for a bad argument";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_FALSE(e.invalid_argument());
  }
  detail::set_fault_hook({});
}

}  // namespace
}  // namespace deepio
