// libaio backend: Linux native AIO, one context per worker.
// Lifecycle: io_setup(queue_depth) at creation, io_destroy at shutdown() (a failed queue) or
// destruction; io_destroy waits for the requests still in flight. Errors: io_setup's EAGAIN means
// /proc/sys/fs/aio-max-nr is exhausted and is reported as such. io_submit returns how many iocbs it took; each taken
// iocb completes with its own result in io_event.res (a byte count or -errno), which the worker checks. Request tags
// index a per-context iocb array, so tags must be below queue_depth. Buffered (non O_DIRECT) requests are legal but
// complete synchronously inside io_submit (so a buffered request on a slow drive holds the
// worker in io_submit: the engine's reads are direct wherever the file system takes it).
// Wake-ups (Backend::wake): the context has one slot more than the queue depth, for an
// IOCB_CMD_POLL on an eventfd (Linux 4.18+; data kWakeData, never a request's tag), armed at
// setup and again by the first reap() after each wake-up (one io_submit). wake() writes the
// eventfd; the poll completes, which ends an io_getevents waiting for one event; reap() reads
// the eventfd back to zero and stores no completion for it. io_destroy cancels the poll. A
// kernel that refuses the poll makes waits without a time limit last at most kFallbackWaitUs.
#include "backends/aio/aio_backend.hpp"

#include <libaio.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "platform/sys.hpp"

namespace deepio::detail {

namespace {

constexpr std::uintptr_t kWakeData = UINTPTR_MAX;  // the wake-up poll's data: no tag is that large
// Where wake-ups cannot be armed: the longest wait before the worker looks for new work.
constexpr std::int64_t kFallbackWaitUs = 1000;

class AioBackend final : public Backend {
 public:
  explicit AioBackend(std::size_t queue_depth) : iocbs_(queue_depth), ptrs_(queue_depth), events_(queue_depth + 1) {}
  ~AioBackend() override { shutdown(); }

  // io_destroy cancels what it can and blocks until every other request of the context has
  // completed (the kernel keeps using the buffers until then), so afterwards none can.
  bool shutdown() noexcept override {
    if (ctx_ == nullptr) return quiet_;
    const int r = io_destroy(ctx_);
    ctx_ = nullptr;
    quiet_ = r == 0;
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
    return quiet_;
  }
  AioBackend(const AioBackend&) = delete;
  AioBackend& operator=(const AioBackend&) = delete;

  int init() {
    const int r = io_setup(static_cast<int>(iocbs_.size() + 1), &ctx_);
    if (r < 0) return r;
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    wake_broken_ = wake_fd_ < 0;
    arm_wake();
    return 0;
  }

  void wake() noexcept override {
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    // Cannot fail but for a counter at its maximum, which is a wake-up pending anyway.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  [[nodiscard]] const char* name() const noexcept override { return "libaio"; }

  int submit(std::span<const Request> reqs) override {
    std::size_t n = 0;
    for (const Request& r : reqs) {
      iocb& cb = iocbs_[r.tag];
      if (r.write) {
        io_prep_pwrite(&cb, r.fd, r.buf, r.len, static_cast<long long>(r.offset));
      } else {
        io_prep_pread(&cb, r.fd, r.buf, r.len, static_cast<long long>(r.offset));
      }
      cb.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(r.tag));
      ptrs_[n++] = &cb;
    }
    int r;
    do {
      r = io_submit(ctx_, static_cast<long>(n), ptrs_.data());
    } while (r == -EINTR);
    return r;
  }

  int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us) override {
    if (!wake_armed_) arm_wake();
    if (wake_broken_ && max_wait_us < 0 && min <= 1) max_wait_us = kFallbackWaitUs;
    const std::size_t max = std::min(out.size() + 1, events_.size());
    timespec ts{};
    if (max_wait_us >= 0) {
      ts.tv_sec = static_cast<time_t>(max_wait_us / 1000000);
      ts.tv_nsec = static_cast<long>(max_wait_us % 1000000) * 1000;
    }
    int r;
    do {
      // A timeout that ends early returns what has come (maybe nothing): no error.
      r = io_getevents(ctx_, static_cast<long>(min), static_cast<long>(max), events_.data(),
                       max_wait_us >= 0 ? &ts : nullptr);
    } while (r == -EINTR);
    if (r < 0) return r;
    std::size_t stored = 0;
    for (int i = 0; i < r; ++i) {
      const io_event& ev = events_[static_cast<std::size_t>(i)];
      const auto data = reinterpret_cast<std::uintptr_t>(ev.data);
      if (data == kWakeData) {
        woken(static_cast<long>(ev.res));
        continue;
      }
      // One more event than out holds can only be the wake-up's: a worker never has more
      // requests in flight than completions it can take.
      out[stored++] = {static_cast<std::uint64_t>(data), static_cast<std::int64_t>(static_cast<long>(ev.res))};
    }
    return static_cast<int>(stored);
  }

 private:
  // Submits the wake-up poll (see the file comment).
  void arm_wake() noexcept {
    if (wake_broken_ || wake_armed_ || ctx_ == nullptr) return;
    io_prep_poll(&wake_cb_, wake_fd_, POLLIN);
    wake_cb_.data = reinterpret_cast<void*>(kWakeData);
    iocb* p = &wake_cb_;
    int r;
    do {
      r = io_submit(ctx_, 1, &p);
    } while (r == -EINTR);
    if (r == 1) {
      wake_armed_ = true;
    } else if (r != -EAGAIN) {
      wake_broken_ = true;  // EINVAL: a kernel without aio poll
    }
  }

  // The wake-up poll completed with `res`: the eventfd is read back to zero (the wake-ups
  // made until now are answered by this return); the next reap() re-arms the poll.
  void woken(long res) noexcept {
    wake_armed_ = false;
    if (res < 0) {
      wake_broken_ = true;
      return;
    }
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
  }

  io_context_t ctx_ = nullptr;
  bool quiet_ = true;  // what shutdown() found
  std::vector<iocb> iocbs_;
  std::vector<iocb*> ptrs_;
  std::vector<io_event> events_;
  iocb wake_cb_{};
  int wake_fd_ = -1;
  bool wake_armed_ = false;
  bool wake_broken_ = false;
};
}  // namespace

std::unique_ptr<Backend> make_aio_backend(std::size_t queue_depth, Status* why) {
  auto b = std::make_unique<AioBackend>(std::max<std::size_t>(1, queue_depth));
  const int r = b->init();
  if (r < 0) {
    std::string msg = "io_setup failed: " + errno_string(-r);
    if (r == -EAGAIN) msg += " (fs.aio-max-nr exhausted: raise /proc/sys/fs/aio-max-nr or lower queue_depth)";
    if (r == -ENOSYS) msg += " (kernel built without AIO)";
    if (r == -EPERM) msg += " (blocked by a seccomp filter)";
    *why = Status::failure(-r, msg);
    return nullptr;
  }
  return b;
}

}  // namespace deepio::detail
