// The portable backend: each request is one pread(2) or pwrite(2) call, run by a thread of
// the backend's own pool, so that the worker thread never waits inside a request (a slow
// drive holds only the pool threads running its requests, never the worker's other work).
// Answered at once: a request on the page cache's descriptor (Request::direct false) is first
// tried on the worker with preadv2/pwritev2(RWF_NOWAIT), which moves the bytes only where no
// wait is needed (cached pages, room for dirty ones) and fails with EAGAIN otherwise; a whole
// transfer completes there and then, without a hand-off (a small cached read costs less than
// waking a pool thread). Files in memory (tmpfs, ramfs: fstatfs, once per descriptor per
// submit() call), direct or not, are read and written on the worker (the io_uring workers do
// the same). Anything else -- a direct request, a miss, a partial transfer (redone whole:
// rereading or rewriting the same bytes is harmless) -- goes to the pool.
// Lifecycle: no threads at creation; submit() starts one more whenever a request finds every
// pool thread busy, up to queue_depth (the most requests a worker has in flight), so a worker
// that keeps one request in flight has one thread. Threads stay until shutdown(), which lets
// each finish the request it runs, drops the requests not started (their buffers are never
// touched: the worker fails them), and joins them.
// Errors: the call's -errno becomes the completion result; short counts are passed through
// for the worker to finish. A thread that cannot be started (EAGAIN from the system) is not
// retried: the requests wait for a running one; with none at all, submit() runs the request
// itself.
// Thread safety: one mutex guards the queues; the pool waits on `work_`, reap() on `done_`,
// which wake() also signals (Backend::wake).
#include "backends/threads/threads_backend.hpp"

#include <linux/magic.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace deepio::detail {

namespace {

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer's dynamic annotations (libtsan): see DeviceAccess.
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

// Around a pool thread's pread/pwrite: under ThreadSanitizer its accesses to the caller's
// buffer are not checked, as those of the kernel (io_uring, libaio) and of a device are not:
// the pool stands in for the device. What orders them is checked as ever (the hand-over of
// the request and of its completion under mutex_). Without it, every caller that reads one
// file into one buffer with two operations at once (harmless, and invisible with the other
// backends) is reported.
struct DeviceAccess {
#if defined(__SANITIZE_THREAD__)
  DeviceAccess() noexcept {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~DeviceAccess() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#endif
};

std::int64_t run_request(const Request& r) noexcept {
  const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                            : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
  return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
}

// RWF_NOWAIT (linux/fs.h); glibc's headers define it only from 2.26.
constexpr int kRwfNowait = 0x00000008;
static_assert(sizeof(long) == 8, "try_now() passes a file offset in one word");

// The transfer if it needs no wait (RWF_NOWAIT), else -errno (-EAGAIN: it would wait; ENOSYS
// or EOPNOTSUPP on a kernel older than 4.14: the pool runs it). The system calls themselves,
// not glibc's preadv2/pwritev2: those arrived in glibc 2.26, and the wheel runs on 2.17. The
// offset goes as (low, high) words, as the kernel's pos_from_hilo() takes it; on a 64-bit
// build the high word is shifted out whole.
std::int64_t try_now(const Request& r) noexcept {
  iovec iov{r.buf, r.len};
  const auto off = static_cast<unsigned long>(r.offset);
  const long n = ::syscall(r.write ? SYS_pwritev2 : SYS_preadv2, r.fd, &iov, 1UL, off, 0UL, kRwfNowait);
  return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
}

bool memory_file_system(int fd) noexcept {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) return false;
  return sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC;
}

class ThreadsBackend final : public Backend {
 public:
  explicit ThreadsBackend(std::size_t queue_depth) : max_threads_(std::max<std::size_t>(1, queue_depth)) {}
  ~ThreadsBackend() override { shutdown(); }
  ThreadsBackend(const ThreadsBackend&) = delete;
  ThreadsBackend& operator=(const ThreadsBackend&) = delete;

  [[nodiscard]] const char* name() const noexcept override { return "threads"; }

  int submit(std::span<const Request> reqs) override {
    // First what needs no wait, on this thread, without the lock (see the file comment).
    now_.clear();
    later_.clear();
    memory_.clear();  // this call's answers of fstatfs (its descriptors stay open meanwhile)
    for (const Request& r : reqs) {
      if (in_memory(r.fd)) {
        now_.push_back({r.tag, run_request(r)});
        continue;
      }
      if (!r.direct) {
        const std::int64_t res = try_now(r);
        if (res == static_cast<std::int64_t>(r.len)) {
          now_.push_back({r.tag, res});
          continue;
        }
      }
      later_.push_back(&r);
    }
    std::unique_lock lock(mutex_);
    if (stopping_) return -ESHUTDOWN;
    for (const Completion& c : now_) done_.push_back(c);
    if (later_.empty()) return static_cast<int>(reqs.size());
    for (const Request* r : later_) todo_.push_back(*r);
    while (todo_.size() > idle_ && threads_.size() < max_threads_) {
      try {
        threads_.emplace_back([this] { serve(); });
      } catch (const std::system_error&) {
        break;  // the requests wait for a running thread
      }
      ++idle_;  // counted idle until it takes a request
    }
    if (threads_.empty()) {
      // No thread could be started at all: run them here, as the worker's own calls.
      while (!todo_.empty()) {
        const Request r = todo_.front();
        todo_.pop_front();
        done_.push_back({r.tag, run_request(r)});
      }
      return static_cast<int>(reqs.size());
    }
    lock.unlock();
    if (later_.size() == 1) {
      work_.notify_one();
    } else {
      work_.notify_all();
    }
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us) override {
    std::unique_lock lock(mutex_);
    const auto ready = [&] { return done_.size() >= min || woken_; };
    if (max_wait_us < 0) {
      reaper_.wait(lock, ready);
    } else {
      reaper_.wait_for(lock, std::chrono::microseconds(max_wait_us), ready);
    }
    woken_ = false;
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return static_cast<int>(n);
  }

  void wake() noexcept override {
    {
      std::lock_guard lock(mutex_);
      woken_ = true;
    }
    reaper_.notify_one();
  }

  bool shutdown() noexcept override {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && threads_.empty()) return true;
      stopping_ = true;
      todo_.clear();  // never started: their memory is not touched
      threads.swap(threads_);
    }
    work_.notify_all();
    for (auto& t : threads) t.join();
    return true;
  }

 private:
  void serve() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !todo_.empty(); });
      if (stopping_) return;
      const Request r = todo_.front();
      todo_.pop_front();
      --idle_;
      lock.unlock();
      std::int64_t res = 0;
      {
        [[maybe_unused]] const DeviceAccess device;
        res = run_request(r);
      }
      lock.lock();
      ++idle_;
      done_.push_back({r.tag, res});
      reaper_.notify_one();
    }
  }

  // Whether fd's file lives in memory (tmpfs, ramfs), asked once per descriptor per submit().
  bool in_memory(int fd) {
    for (const auto& [f, m] : memory_) {
      if (f == fd) return m;
    }
    const bool m = memory_file_system(fd);
    memory_.emplace_back(fd, m);
    return m;
  }

  const std::size_t max_threads_;
  std::vector<std::pair<int, bool>> memory_;  // submit()'s scratch: in_memory()'s answers
  std::vector<Completion> now_;               // submit()'s scratch: answered on the worker
  std::vector<const Request*> later_;         // submit()'s scratch: for the pool
  std::mutex mutex_;
  std::condition_variable work_;    // the pool: todo_ or stopping_
  std::condition_variable reaper_;  // the worker in reap(): done_ or woken_
  std::deque<Request> todo_;        // guarded by mutex_
  std::deque<Completion> done_;     // guarded by mutex_
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;   // guarded by mutex_: threads not running a request
  bool woken_ = false;     // guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_
};

}  // namespace

std::unique_ptr<Backend> make_threads_backend(std::size_t queue_depth) {
  return std::make_unique<ThreadsBackend>(queue_depth);
}

}  // namespace deepio::detail
