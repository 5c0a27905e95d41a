// The worker's scheduler (core/worker.hpp): every device served at once. A test's fault hook
// holds back the completions of chosen files (kFaultHold: the request stays in flight, the
// worker goes on), which is a device that has not answered yet; the tests count which
// requests are in flight and which ops finish while others are held. No clocks decide an
// outcome: the timeouts only bound how long a broken scheduler makes a test wait to fail.
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/support.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::eventually;
using test::fd_path;
using test::pattern;

constexpr std::size_t kBlock = 64 << 10;

std::uint64_t device_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_dev : 0;
}

// Holds the read completions of files whose names end with a held suffix; counts the requests
// held (distinct offsets per file) and lets them go one at a time or all at once.
class Gate {
 public:
  void hold(const std::string& suffix) {
    std::lock_guard lock(mutex_);
    held_suffixes_.insert(suffix);
  }
  // From now on `n` more held requests (any file) complete.
  void release(int n) {
    std::lock_guard lock(mutex_);
    tokens_ += n;
  }
  void release_all(const std::string& suffix) {
    std::lock_guard lock(mutex_);
    held_suffixes_.erase(suffix);
  }
  // Everything goes: what a failed assertion leaves held must not hang the handle's end.
  void open_all() {
    std::lock_guard lock(mutex_);
    held_suffixes_.clear();
    blocked_.clear();
  }
  // Opens the gate when it goes out of scope (declared after the handle: before it ends).
  struct OpenAtExit {
    Gate& gate;
    ~OpenAtExit() { gate.open_all(); }
  };
  // Requests of `suffix` being held now.
  std::size_t held(const std::string& suffix) {
    std::lock_guard lock(mutex_);
    return holding_[suffix].size();
  }
  int tokens() {
    std::lock_guard lock(mutex_);
    return tokens_;
  }

  // Submissions of requests of `suffix` wait (blocking the worker) until release_submits().
  void block_submits(const std::string& suffix) {
    std::lock_guard lock(mutex_);
    blocked_ = suffix;
  }
  void release_submits() {
    std::lock_guard lock(mutex_);
    blocked_.clear();
  }
  [[nodiscard]] bool submit_blocked() {
    std::lock_guard lock(mutex_);
    return submit_waiting_;
  }

  std::optional<std::int64_t> operator()(const FaultSite& s) {
    if (s.point == FaultPoint::Submit) {
      const std::string path = fd_path(s.fd);
      for (;;) {
        {
          std::lock_guard lock(mutex_);
          submit_waiting_ = !blocked_.empty() && path.ends_with(blocked_);
          if (!submit_waiting_) return std::nullopt;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (s.point != FaultPoint::Read) return std::nullopt;
    const std::string path = fd_path(s.fd);
    std::lock_guard lock(mutex_);
    for (const auto& suffix : all_suffixes_) {
      if (!path.ends_with(suffix)) continue;
      auto& holding = holding_[suffix];
      if (held_suffixes_.contains(suffix)) {
        if (tokens_ == 0) {
          holding.insert(s.offset);
          return detail::kFaultHold;
        }
        --tokens_;
      }
      holding.erase(s.offset);
      return std::nullopt;
    }
    return std::nullopt;
  }

  void watch(const std::string& suffix) {
    std::lock_guard lock(mutex_);
    all_suffixes_.insert(suffix);
  }

 private:
  std::mutex mutex_;
  std::set<std::string> all_suffixes_;
  std::set<std::string> held_suffixes_;
  std::map<std::string, std::set<std::uint64_t>> holding_;
  int tokens_ = 0;
  std::string blocked_;
  bool submit_waiting_ = false;
};

class Scheduler : public test::GatedBackendTest<Gate> {
 protected:
  void TearDown() override {
    detail::set_fault_hook({});
    for (const auto& p : shm_files_) ::unlink(p.c_str());
    BackendTest::TearDown();
  }
  // A file on another device than the test folder: in /dev/shm (tmpfs). Skips without one.
  std::string other_device_file(const std::string& name) {
    const std::string p = "/dev/shm/deepio-sched-" + std::to_string(::getpid()) + "-" + name;
    shm_files_.push_back(p);
    test::put(p, {});
    if (device_of(p) == 0 || device_of(p) == device_of(dir_.path().string())) {
      ADD_FAILURE() << "/dev/shm is not a device of its own here";
    }
    return p;
  }
  std::vector<std::string> shm_files_;
};

// One op takes all it may of the queue on a device that does not answer (all but the slot
// kept for a newcomer: core/lanes.hpp); an op on another device submitted after it completes
// without any request of the first coming back, and one on the same device as soon as a single
// one does (`releases`), while the first is still pending.
void second_op_overtakes_held_one(Scheduler& t, Gate& gate, Handle& h, const std::string& slow, const std::string& fast,
                                  int releases) {
  constexpr std::size_t kSlowBytes = 64 * kBlock, kFastBytes = 4 * kBlock;
  test::put(slow, pattern(kSlowBytes, 1));
  test::put(fast, pattern(kFastBytes, 2));
  gate.watch("/slow");
  gate.watch(fast.substr(fast.rfind('/')));
  gate.hold("/slow");
  Gate::OpenAtExit open_at_exit{gate};
  std::vector<std::byte> a(kSlowBytes), b(kFastBytes);
  Future first = h.async_pread(a.data(), a.size(), slow);
  ASSERT_TRUE(eventually([&] { return gate.held("/slow") == 7; })) << "the first op takes 7 of 8 slots";
  Future second = h.async_pread(b.data(), b.size(), fast);
  gate.release(releases);  // requests of the first that come back: their slots go to the second
  EXPECT_TRUE(second.wait_for(std::chrono::seconds(5))) << "the second op waited behind the first (FIFO scheduling)";
  EXPECT_FALSE(first.done()) << "the first is still held";
  EXPECT_EQ(b, pattern(kFastBytes, 2));
  gate.release_all("/slow");
  ASSERT_TRUE(first.wait_for(std::chrono::seconds(30)));
  first.get();
  second.get();
  EXPECT_EQ(a, pattern(kSlowBytes, 1));
  (void)t;
}

TEST_P(Scheduler, AnotherDevicesOpCompletesWhileOneDeviceIsHeld) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  second_op_overtakes_held_one(*this, *gate_, h, dir_.file("slow"), other_device_file("fast"), 0);
}

TEST_P(Scheduler, SameDevicesOtherOpCompletesWhileTheFirstIsHeld) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  second_op_overtakes_held_one(*this, *gate_, h, dir_.file("slow"), dir_.file("fast"), 1);
}

TEST_P(Scheduler, WithOverlapEventsToo) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .overlap_events = true, .direct_io = DirectIo::Off}));
  second_op_overtakes_held_one(*this, *gate_, h, dir_.file("slow"), other_device_file("fast"), 0);
}

// Three devices' ops arrive together: the queue is shared equally while all three have
// requests to issue (the last slot kept for a newcomer); once two are done, the third gets
// the whole queue but that slot.
TEST_P(Scheduler, DevicesShareTheQueueAndTheLastOneTakesItAll) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 12, .direct_io = DirectIo::Off}));
  constexpr std::size_t kBytes = 32 * kBlock;
  const std::string gate_file = dir_.file("gate");
  const std::string files[3] = {dir_.file("one"), other_device_file("two"), other_device_file("three")};
  // "two" and "three" are both in /dev/shm: one device. Make "three" a device of its own
  // where the machine has one more (a disk folder and tmpfs are all a test can count on).
  test::put(gate_file, pattern(kBlock, 9));
  for (int i = 0; i < 3; ++i) test::put(files[i], pattern(kBytes, 10 + static_cast<std::uint32_t>(i)));
  for (const char* s : {"/one", "-two", "-three"}) gate_->watch(s);
  for (const char* s : {"/one", "-two", "-three"}) gate_->hold(s);
  Gate::OpenAtExit open_at_exit{*gate_};
  // The worker is kept inside the submission of the gate's request while the three are
  // submitted, so it takes them in one go.
  gate_->block_submits("/gate");
  std::vector<std::byte> g(kBlock);
  Future gate = h.async_pread(g.data(), g.size(), gate_file);
  ASSERT_TRUE(eventually([&] { return gate_->submit_blocked(); }));
  std::vector<std::vector<std::byte>> out(3, std::vector<std::byte>(kBytes));
  std::vector<Future> ops;
  for (int i = 0; i < 3; ++i) ops.push_back(h.async_pread(out[i].data(), kBytes, files[i]));
  gate_->release_submits();
  ASSERT_TRUE(gate.wait_for(std::chrono::seconds(20)));
  // 12 slots over two devices (the disk folder, /dev/shm), one kept back: 6 and 5; on
  // /dev/shm "two" and "three" share theirs, 3 and 2.
  ASSERT_TRUE(eventually([&] { return gate_->held("/one") + gate_->held("-two") + gate_->held("-three") == 11; }))
      << gate_->held("/one") << " " << gate_->held("-two") << " " << gate_->held("-three");
  EXPECT_EQ(gate_->held("/one"), 6u);
  EXPECT_EQ(gate_->held("-two") + gate_->held("-three"), 5u);
  EXPECT_GE(gate_->held("-two"), 2u);
  EXPECT_GE(gate_->held("-three"), 2u);
  // The other device's ops finish: the disk's op alone takes the whole queue.
  gate_->release_all("-two");
  gate_->release_all("-three");
  ASSERT_TRUE(ops[1].wait_for(std::chrono::seconds(20)));
  ASSERT_TRUE(ops[2].wait_for(std::chrono::seconds(20)));
  EXPECT_TRUE(eventually([&] { return gate_->held("/one") == 11; })) << gate_->held("/one");
  EXPECT_FALSE(ops[0].done());
  gate_->release_all("/one");
  for (auto& op : ops) op.get();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], pattern(kBytes, 10 + static_cast<std::uint32_t>(i))) << i;
}

// One device's staged requests (a misaligned buffer read with O_DIRECT bounces) take every
// bounce slot they may (one of two: the other is kept for a newcomer) and are held: another
// device's requests, which need none, still issue and complete, and so do those of one that
// needs bounce slots too.
TEST_P(Scheduler, BounceSlotsTakenByOneDeviceDoNotStopAnother) {
  ::setenv("DEEPIO_STAGING_BYTES", "128K", 1);  // two bounce slots of 64 KiB
  Handle h(opts({.block_size = kBlock, .queue_depth = 16}));
  ::unsetenv("DEEPIO_STAGING_BYTES");
  constexpr std::size_t kBytes = 32 * kBlock;
  const std::string slow = dir_.file("slow"), fast = other_device_file("fast");
  test::put(slow, pattern(kBytes, 3));
  test::put(fast, pattern(kBytes, 4));
  gate_->watch("/slow");
  gate_->watch("-fast");
  gate_->hold("/slow");
  Gate::OpenAtExit open_at_exit{*gate_};
  {
    const int probe = ::open(slow.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (probe < 0) GTEST_SKIP() << "this folder takes no O_DIRECT: nothing bounces";
    ::close(probe);
  }
  test::OffsetBuffer a(kBytes, 8);  // not aligned for O_DIRECT: bounces
  test::OffsetBuffer b(kBytes, 0);  // aligned: never bounces, whatever /dev/shm does
  Future first = h.async_pread(a.data(), kBytes, slow);
  ASSERT_TRUE(eventually([&] { return gate_->held("/slow") == 1; })) << "one of two bounce slots, held";
  Future second = h.async_pread(b.data(), kBytes, fast);
  EXPECT_TRUE(second.wait_for(std::chrono::seconds(5))) << "the other device waited for a bounce slot";
  EXPECT_FALSE(first.done());
  EXPECT_EQ(gate_->held("/slow"), 1u);
  EXPECT_EQ(b.copy(), pattern(kBytes, 4));
  gate_->release_all("/slow");
  ASSERT_TRUE(first.wait_for(std::chrono::seconds(30)));
  first.get();
  second.get();
  EXPECT_EQ(a.copy(), pattern(kBytes, 3));
  EXPECT_GT(h.stats().bytes_bounced, 0u);
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Scheduler);

// A read of an empty pipe is a request the kernel holds for real (io_uring waits in an io-wq
// thread until data comes); a read of a file on another device submitted meanwhile must not
// wait for it. overlap_events off: the worker reaps a one-device batch whole before issuing
// more, in bounded waits; on: it waits for one completion with no time limit, and the new op
// wakes it (worker.hpp's wake protocol; this failed before it). io_uring only: libaio and the
// threads backend run a pipe read inside the submitting call (test_slow_device.cpp holds
// their requests in the kernel with a throttled block device).
class SchedulerPipe : public testing::TestWithParam<bool> {};

TEST_P(SchedulerPipe, AnotherDeviceStartsWhileAPipeReadIsInTheKernel) {
  std::string why;
  if (!test::backend_available(BackendKind::IoUring, &why)) GTEST_SKIP() << "io_uring: " << why;
  test::TempDir dir;
  Handle h({.block_size = kBlock, .queue_depth = 8, .overlap_events = GetParam(), .backend = BackendKind::IoUring});
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  std::vector<std::byte> a(kBlock), b(4 * kBlock);
  const std::string file = dir.file("file");
  test::put(file, pattern(b.size(), 5));
  std::atomic<bool> submitted{false};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Submit && s.fd == p[0]) submitted = true;
    return std::nullopt;
  });
  Future held = h.async_pread(a.data(), a.size(), p[0]);
  ASSERT_TRUE(eventually([&] { return submitted.load(); }));
  // The worker goes on to wait for the batch; the sleep only gives it the time to get there
  // (without it a broken scheduler could pass, never the other way round).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Future other = h.async_pread(b.data(), b.size(), file);
  const bool overtook = other.wait_for(std::chrono::seconds(5));
  EXPECT_TRUE(overtook) << "the read of the file waited for the pipe's batch";
  EXPECT_FALSE(held.done());
  const auto data = pattern(kBlock, 6);
  ASSERT_EQ(::write(p[1], data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ASSERT_TRUE(held.wait_for(std::chrono::seconds(30)));
  held.get();
  if (overtook) other.get();
  EXPECT_EQ(a, data);
  EXPECT_EQ(b, pattern(b.size(), 5));
  detail::set_fault_hook({});
  ::close(p[0]);
  ::close(p[1]);
}

INSTANTIATE_TEST_SUITE_P(Overlap, SchedulerPipe, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "on" : "off"; });

}  // namespace
}  // namespace deepio
