// "Nothing lost, nothing hung": a failure nobody collected reaches the UnobservedFailureHandler
// exactly once (never silently, never twice), and a handle used in a forked child refuses at
// once instead of hanging. The failures are real (RLIMIT_FSIZE: EFBIG) or injected (EIO);
// the forked children are real fork()s.
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "platform/fault.hpp"
#include "common/support.hpp"
#include "engine/binding.hpp"

namespace deepio {
namespace {

#if defined(__SANITIZE_THREAD__)
// TSan kills a child that starts threads after a fork of a multi-threaded process
// (die_after_fork): the part of the fork test that makes a new handle in the child is left out.
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

using detail::FaultPoint;
using detail::FaultSite;
using test::in_child;
using test::pattern;

// What the handler received; the handler is a plain function, so the record is global.
std::mutex g_mutex;
std::vector<Error> g_reports;  // guarded by g_mutex

void record(const Error& e) noexcept {
  std::lock_guard lock(g_mutex);
  g_reports.push_back(e);
}

std::vector<Error> reports() {
  std::lock_guard lock(g_mutex);
  return g_reports;
}

class Observed : public test::BackendTest {
 protected:
  void SetUp() override {
    test::BackendTest::SetUp();
    if (IsSkipped()) return;
    {
      std::lock_guard lock(g_mutex);
      g_reports.clear();
    }
    previous_ = set_unobserved_failure_handler(&record);
  }
  void TearDown() override {
    set_unobserved_failure_handler(previous_);
    test::BackendTest::TearDown();
  }

  // Every write fails with EIO (after reaching the disk: the kernel's answer is replaced).
  static void fail_writes() {
    detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
      if (s.point == FaultPoint::Write) return -EIO;
      return std::nullopt;
    });
  }

  UnobservedFailureHandler previous_ = nullptr;
};

// A write as the binding submits a Future's operation (engine/binding.hpp): detached, so that
// it belongs to its Future alone.
Future detached_write(Handle& h, const std::vector<std::byte>& data, const std::string& path, std::uint64_t offset) {
  return detail::submit(h, true, const_cast<std::byte*>(data.data()), data.size(), &path, -1, offset, {},
                        {.keep_alive = nullptr, .detached = true});
}

TEST_P(Observed, DroppedFutureOfFailedDetachedOpIsReportedOnce) {
  fail_writes();
  Handle h(opts());
  const auto data = pattern(64 << 10, 1);
  const std::string path = dir_.file("f");
  {
    Future f = detached_write(h, data, path, 4096);
    Future copy = f;  // the last copy, not the first, makes it unobservable
    f.wait();
    { Future gone = std::move(f); }
    EXPECT_TRUE(reports().empty()) << "a copy of the Future is still held";
  }
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].errnum(), EIO);
  EXPECT_EQ(r[0].path(), path);
  EXPECT_NE(std::string(r[0].what()).find(path), std::string::npos) << r[0].what();
  EXPECT_EQ(h.wait(), 0u) << "detached: wait() neither counts nor throws it";
  EXPECT_EQ(reports().size(), 1u) << "reported once, not again when reaped";
}

TEST_P(Observed, FutureDroppedWhileRunningIsReportedWhenTheOpFinishes) {
  // The write is held in the hook until the Future is gone, so the op finishes with no Future.
  std::atomic<bool> release{false};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point != FaultPoint::Write) return std::nullopt;
    while (!release.load()) std::this_thread::yield();
    return -EIO;
  });
  const auto data = pattern(8192, 2);
  const std::string path = dir_.file("f");
  {
    Handle h(opts());
    { Future f = detached_write(h, data, path, 0); }
    EXPECT_TRUE(reports().empty()) << "still running: nothing to report yet";
    release = true;
  }  // ~Handle finishes the op
  auto r = reports();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].errnum(), EIO);
  EXPECT_EQ(r[0].path(), path);
}

TEST_P(Observed, CollectedFailuresAreNotReported) {
  fail_writes();
  const auto data = pattern(8192, 3);
  {
    Handle h(opts());
    Future f = detached_write(h, data, dir_.file("a"), 0);
    EXPECT_THROW(f.get(), Error);                              // observed by get()
    h.async_pwrite(data.data(), data.size(), dir_.file("b"));  // Future dropped at once
    EXPECT_THROW(h.wait(), Error);                             // observed by wait()
    h.async_pwrite(data.data(), data.size(), dir_.file("c"));
    WaitResult w = h.collect();  // observed by collect(): the caller holds it
    EXPECT_EQ(w.errors.size(), 1u);
  }
  EXPECT_TRUE(reports().empty()) << reports().front().what();
}

TEST_P(Observed, UncollectedFailureIsReportedWhenTheHandleGoes) {
  fail_writes();
  const auto data = pattern(8192, 4);
  const std::string path = dir_.file("f");
  std::optional<Future> kept;
  {
    Handle h(opts());
    h.async_pwrite(data.data(), data.size(), path);                            // nobody waits
    kept = h.async_pwrite(data.data(), data.size(), dir_.file("kept"), 8192);  // Future outlives the handle
  }
  auto r = reports();
  ASSERT_EQ(r.size(), 1u) << "the dropped one at ~Handle; the kept one can still be asked";
  EXPECT_EQ(r[0].path(), path);
  kept.reset();  // never asked: reported now
  r = reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].path(), dir_.file("kept"));
}

TEST_P(Observed, DefaultHandlerWritesOneLineToStderr) {
  fail_writes();
  const std::string path = dir_.file("f");
  const std::string log = dir_.file("stderr.txt");
  const BackendKind kind = GetParam();
  const int code = in_child([&] {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) return 90;
    set_unobserved_failure_handler(nullptr);  // the default
    const auto data = pattern(8192, 5);
    Handle h({.backend = kind});
    Future f = detached_write(h, data, path, 0);
    f.wait();
    return 0;  // f, then h, destroyed here: one report
  });
  ASSERT_EQ(code, 0);
  const auto bytes = test::slurp(log);
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_NE(text.find("deepio: failure nobody collected"), std::string::npos) << text;
  EXPECT_NE(text.find(path), std::string::npos) << text;
}

TEST_P(Observed, HandleUsedInForkedChildRefusesAtOnceAndLeaksQuietly) {
  const auto data = pattern(1 << 20, 6);
  const std::string path = dir_.file("f");
  auto h = std::make_unique<Handle>(opts({.intra_op_parallelism = 2}));
  h->sync_pwrite(data.data(), data.size(), path);  // the parent's workers ran
  const long parent = static_cast<long>(::getpid());
  const int code = in_child([&] {
    ::alarm(20);  // a hang becomes SIGALRM (exit 214), not a stuck test
    std::vector<std::byte> buf(data.size());
    try {
      h->async_pread(buf.data(), buf.size(), path);
      return 10;
    } catch (const Error& e) {
      if (!e.forked_handle() || e.errnum() != EBADF) return 11;
      if (std::string(e.what()).find(std::to_string(parent)) == std::string::npos) return 12;
    }
    try {
      (void)h->wait();
      return 20;
    } catch (const Error& e) {
      if (!e.forked_handle()) return 21;
    }
    if (!kThreadSanitizer) {  // a new handle in the child works
      Handle mine({.backend = GetParam()});
      if (mine.sync_pread(buf.data(), buf.size(), path) != 1 || buf != data) return 30;
    }
    h.reset();  // the parent's engine: leaked, not joined
    return 0;
  });
  EXPECT_EQ(code, 0);
  // The parent's handle is untouched by what the child did.
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(h->sync_pread(back.data(), back.size(), path), 1u);
  EXPECT_EQ(back, data);
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Observed);

TEST(LiveHandles, CountsHandlesFromConstructionToDestruction) {
  const std::size_t before = live_handles();
  {
    Handle a;
    const Handle b({});
    EXPECT_EQ(live_handles(), before + 2);
  }
  EXPECT_EQ(live_handles(), before);
  // A constructor that throws leaves no count behind.
  EXPECT_THROW(Handle({.block_size = 0}), Error);
  EXPECT_EQ(live_handles(), before);
  // A forked child inherits the parent's handle and leaks it: still counted there.
  auto h = std::make_unique<Handle>();
  const int code = in_child([&] {
    h.reset();
    return live_handles() == before + 1 ? 0 : 1;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace deepio
