// The KV store cannot take its process down (issue 45, item 3): the last reference dropped, or
// close() called, from a done-callback (which runs on the store's own batch thread) closes the
// store later, on that thread's way out, never by joining itself; in a forked child every
// call throws deepio::ForkedHandle without taking a lock, destroying the store returns at once,
// and the child does not keep the parent's folder lock. Each scenario runs in a forked child
// (an abort or a hang there fails the test instead of the test binary), with alarm() as its
// watchdog.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv_support.hpp"
#include "platform/fault.hpp"

namespace deepio::test {
namespace {

using kv::BatchFuture;
using kv::Segment;
using kv::Store;

/// Holds the writes of the folder's slab files until release(): a put issued while held
/// completes on a batch thread, after the test registered its callback.
class HeldWrites {
 public:
  HeldWrites() {
    auto released = released_;
    deepio::detail::set_fault_hook([released](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
      if (site.point != deepio::detail::FaultPoint::Write || released->load()) return std::nullopt;
      if (!fd_is_slab(site.fd)) return std::nullopt;
      return deepio::detail::kFaultHold;
    });
  }
  ~HeldWrites() { release(); }
  HeldWrites(const HeldWrites&) = delete;
  HeldWrites& operator=(const HeldWrites&) = delete;
  void release() { released_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> released_ = std::make_shared<std::atomic<bool>>(false);
};

/// Opens a store on `folder`, retrying while another store's deferred close still holds it;
/// false after 20 s.
bool opens_again(const std::string& folder) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    try {
      Store again(small_options({folder}));
      return again.stats().recovered_pages == 1;
    } catch (const Error& e) {
      if (e.errnum() != EBUSY || std::chrono::steady_clock::now() > deadline) return false;
    }
    std::this_thread::yield();
  }
}

/// A put of one page whose completion callback `cb` runs on the store's batch thread.
struct CallbackScenario {
  std::vector<unsigned char> page = page_for("cb", 1000);
  std::vector<std::string_view> keys{"cb"};
  std::vector<std::vector<Segment>> segs{{Segment{page.data(), page.size()}}};
};

// The done-callback holds the last reference (as the LMCache and vLLM backends capture self):
// ~Store runs on the batch thread. Before: std::terminate (the thread joined itself). Now the
// close finishes once that thread is out: its checkpoint is written and the folder unlocked.
TEST(KvLifetime, DroppingTheLastReferenceInADoneCallbackClosesTheStoreLater) {
  TempDir dir;
  const std::string folder = dir.file("a");
  const int rc = in_watched_child([&] {
    CallbackScenario sc;
    std::mutex m;
    std::condition_variable cv;
    bool ran = false;
    {
      auto store = std::make_shared<Store>(small_options({folder}));  // before the hold: open writes its slab
      HeldWrites held;
      BatchFuture f = store->put(sc.keys, sc.segs);
      f.on_done([keep = store, &m, &cv, &ran]() mutable {
        keep.reset();  // the last reference: ~Store on this batch thread
        std::lock_guard lk(m);
        ran = true;
        cv.notify_all();
      });
      store.reset();
      held.release();
      std::unique_lock lk(m);
      cv.wait(lk, [&] { return ran; });
    }
    deepio::detail::set_fault_hook({});
    if (!opens_again(folder)) return 2;                              // unlocked, and the page is there
    if (!std::filesystem::exists(folder + "/index.ckpt")) return 3;  // written by the close alone
    return 0;
  });
  EXPECT_EQ(rc, 0) << "-1: the process aborted (a batch thread joined itself) or hung";
}

// close() itself from the callback: returns at once; later calls see a closed store; the
// store's destruction on the test thread then waits for the deferred close to finish.
TEST(KvLifetime, CloseFromADoneCallbackIsDeferred) {
  TempDir dir;
  const std::string folder = dir.file("a");
  const int rc = in_watched_child([&] {
    CallbackScenario sc;
    std::atomic<int> closed{0};
    {
      Store store(small_options({folder}));  // before the hold: open writes its slab
      HeldWrites held;
      BatchFuture f = store.put(sc.keys, sc.segs);
      f.on_done([&] {
        store.close();
        closed = 1;
      });
      held.release();
      f.wait();
      while (closed.load() == 0) std::this_thread::yield();
      try {
        (void)store.exists(sc.keys);
        return 4;
      } catch (const InvalidArgument&) {
      }
    }  // ~Store: waits for the deferred close
    deepio::detail::set_fault_hook({});
    try {
      Store again(small_options({folder}));
      if (again.stats().recovered_pages != 1) return 5;
    } catch (const Error&) {
      return 6;  // still locked: the destructor did not wait for the close to finish
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << "-1: the process aborted (a batch thread joined itself) or hung";
}

/// Expects `call` to throw deepio::ForkedHandle; adds 1 to *bad otherwise.
template <typename F>
void expect_forked(F&& call, int* bad) {
  try {
    call();
    ++*bad;
  } catch (const ForkedHandle&) {
  } catch (...) {
    ++*bad;
  }
}

// Every call of a store (and of its futures) made in the parent throws ForkedHandle in a
// child, before any lock (a lock another parent thread held at the fork stays held in the
// child forever), and destroying the store there returns at once.
TEST(KvLifetime, EveryCallInAForkedChildThrowsForkedHandle) {
  TempDir dir;
  auto store = std::make_unique<Store>(small_options({dir.file("a")}));
  std::vector<std::vector<unsigned char>> pages{page_for("k", 100)};
  ASSERT_TRUE(put_pages(*store, {"k"}, pages)[0]);
  CallbackScenario sc;
  BatchFuture done = store->put(sc.keys, sc.segs);
  done.wait();
  const int rc = in_watched_child([&] {
    int bad = 0;
    Store& s = *store;
    expect_forked([&] { (void)s.stats(); }, &bad);
    expect_forked([&] { (void)s.take_warnings(); }, &bad);
    expect_forked([&] { (void)s.put(sc.keys, sc.segs); }, &bad);
    expect_forked([&] { (void)s.get(sc.keys, sc.segs); }, &bad);
    expect_forked([&] { (void)s.exists(sc.keys); }, &bad);
    expect_forked([&] { (void)s.contains(sc.keys); }, &bad);
    expect_forked([&] { (void)s.remove(sc.keys); }, &bad);
    expect_forked([&] { (void)s.clear(); }, &bad);
    expect_forked([&] { s.checkpoint(); }, &bad);
    expect_forked([&] { (void)s.retry_failed(); }, &bad);
    expect_forked([&] { done.on_done([] {}); }, &bad);
    expect_forked([&] { (void)done.done(); }, &bad);
    expect_forked([&] { done.wait(); }, &bad);
    expect_forked([&] { s.close(); }, &bad);
    store.reset();  // ~Store in the child: frees nothing of the parent's, never blocks
    return bad;
  });
  EXPECT_EQ(rc, 0) << "calls that did not throw ForkedHandle (-1: the child hung or aborted)";
  EXPECT_EQ(store->stats().pages, 2u);  // the parent's store is untouched
}

// flock belongs to the open file: a child's inherited descriptor of kv.lock kept the folder
// locked after the parent closed its store, for as long as the child lived. The child lets
// go of it at the fork.
TEST(KvLifetime, AForkedChildDoesNotKeepTheFolderLocked) {
  TempDir dir;
  const std::string folder = dir.file("a");
  std::optional<Store> store(std::in_place, small_options({folder}));
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);
    ::close(gate[1]);
    char c = 0;
    (void)!::read(gate[0], &c, 1);  // alive until the parent is done
    ::_exit(0);
  }
  ::close(gate[0]);
  store->close();
  bool reopened = false;
  try {
    Store again(small_options({folder}));
    reopened = true;
  } catch (const Error& e) {
    ADD_FAILURE() << "the folder is still locked while the child lives: " << e.what();
  }
  ::close(gate[1]);
  EXPECT_EQ(exit_code_of(child), 0);
  EXPECT_TRUE(reopened);
}

}  // namespace
}  // namespace deepio::test
