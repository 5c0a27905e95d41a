// detail::on_done (engine/binding.hpp): a binding's completion callback on an operation.
// Checked with a real file and a fault hook that holds the read until a gate opens, so "not
// done yet" is deterministic: the callback runs exactly once, on the worker that finished the
// operation, after the Future reports done (waiters woken first); at once on the caller's
// thread for a done operation; for failed operations too; several callbacks of one operation
// each once.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "engine/binding.hpp"

namespace deepio {
namespace {

using namespace std::chrono_literals;
using detail::FaultPoint;
using detail::FaultSite;

// Holds every read until open(); fails them with EIO when told to.
class Gate {
 public:
  explicit Gate(bool fail = false) {
    detail::set_fault_hook([this, fail](const FaultSite& s) -> std::optional<std::int64_t> {
      if (s.point != FaultPoint::Read) return std::nullopt;
      std::unique_lock lock(mutex_);
      ++held_;
      held_cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
      if (fail) return -EIO;
      return std::nullopt;
    });
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
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
  }
  // Blocks until a read reached the gate (the 30 s bound only keeps a broken engine from
  // hanging the suite).
  [[nodiscard]] bool wait_held() {
    std::unique_lock lock(mutex_);
    return held_cv_.wait_for(lock, 30s, [&] { return held_ > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable held_cv_;
  int held_ = 0;  // guarded by mutex_
  bool open_ = false;
};

HandleOptions threads_backend() {
  HandleOptions o;
  o.block_size = 4096;
  o.queue_depth = 4;
  o.intra_op_parallelism = 2;
  o.backend = BackendKind::Threads;
  return o;
}

// Records each call: its thread, and whether the future reported done by then.
struct Calls {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::thread::id> threads;  // guarded by mutex
  std::vector<bool> done_seen;           // guarded by mutex

  std::function<void()> make(const Future& f) {
    return [this, f] {
      const bool d = f.done();
      std::lock_guard lock(mutex);
      threads.push_back(std::this_thread::get_id());
      done_seen.push_back(d);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, 30s, [&] { return threads.size() >= n; });
  }
};

class OnDone : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("data.bin");
    const auto data = test::pattern(kFile, 3);
    Handle h;
    h.sync_pwrite(data.data(), data.size(), path_);
  }
  Future read(Handle& h, std::vector<std::byte>& buf) {
    return detail::submit(h, false, buf.data(), buf.size(), &path_, -1, 0, {},
                          {.keep_alive = nullptr, .detached = true});
  }
  static constexpr std::size_t kFile = 4 * 4096;
  test::TempDir dir_;
  std::string path_;
};

TEST_F(OnDone, RunsOnceOnTheWorkerAfterDoneEachCallback) {
  Gate gate;  // outlives the handle: its workers never wait on a gone gate
  Handle h(threads_backend());
  std::vector<std::byte> buf(kFile);
  Calls calls;
  Future f = read(h, buf);
  detail::on_done(f, calls.make(f));
  detail::on_done(f, calls.make(f));
  EXPECT_TRUE(gate.wait_held());
  {
    std::lock_guard lock(calls.mutex);
    EXPECT_TRUE(calls.threads.empty()) << "a callback ran before the operation finished";
  }
  gate.open();
  ASSERT_TRUE(calls.wait_for(2));
  EXPECT_EQ(f.get(), kFile);
  std::this_thread::sleep_for(20ms);
  std::lock_guard lock(calls.mutex);
  ASSERT_EQ(calls.threads.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_NE(calls.threads[i], std::this_thread::get_id());
    EXPECT_TRUE(calls.done_seen[i]);
  }
}

TEST_F(OnDone, RunsAtOnceOnTheCallersThreadWhenDone) {
  Handle h(threads_backend());
  std::vector<std::byte> buf(kFile);
  Future f = read(h, buf);
  f.wait();
  Calls calls;
  detail::on_done(f, calls.make(f));
  std::lock_guard lock(calls.mutex);
  ASSERT_EQ(calls.threads.size(), 1u);
  EXPECT_EQ(calls.threads[0], std::this_thread::get_id());
  EXPECT_EQ(f.get(), kFile);
}

TEST_F(OnDone, RunsForAFailedOperation) {
  Gate gate(/*fail=*/true);
  Handle h(threads_backend());
  std::vector<std::byte> buf(kFile);
  Calls calls;
  Future f = read(h, buf);
  detail::on_done(f, calls.make(f));
  EXPECT_TRUE(gate.wait_held());
  gate.open();
  ASSERT_TRUE(calls.wait_for(1));
  EXPECT_THROW(f.get(), Error);
}

TEST(OnDoneArguments, AnEmptyFutureIsAnInvalidArgument) {
  EXPECT_THROW(detail::on_done(Future{}, [] {}), InvalidArgument);
}

}  // namespace
}  // namespace deepio
