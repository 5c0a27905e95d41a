// libaio backend: Linux native AIO, one context per worker.
// Lifecycle: io_setup(queue_depth) at creation, io_destroy at shutdown() (a failed queue) or
// destruction; io_destroy waits for the requests still in flight. Errors: io_setup's EAGAIN means
// /proc/sys/fs/aio-max-nr is exhausted and is reported as such. io_submit returns how many iocbs it took; each taken
// iocb completes with its own result in io_event.res (a byte count or -errno), which the worker checks. Request tags
// index a per-context iocb array, so tags must be below queue_depth. Buffered (non O_DIRECT) requests are legal but
// complete synchronously inside io_submit.
#include "backends/aio/aio_backend.hpp"

#include <libaio.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
class AioBackend final : public Backend {
 public:
  explicit AioBackend(std::size_t queue_depth) : iocbs_(queue_depth), ptrs_(queue_depth), events_(queue_depth) {}
  ~AioBackend() override { shutdown(); }

  // io_destroy cancels what it can and blocks until every other request of the context has
  // completed (the kernel keeps using the buffers until then), so afterwards none can.
  bool shutdown() noexcept override {
    if (ctx_ == nullptr) return quiet_;
    const int r = io_destroy(ctx_);
    ctx_ = nullptr;
    quiet_ = r == 0;
    return quiet_;
  }
  AioBackend(const AioBackend&) = delete;
  AioBackend& operator=(const AioBackend&) = delete;

  int init() { return io_setup(static_cast<int>(iocbs_.size()), &ctx_); }

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
    const std::size_t max = std::min(out.size(), events_.size());
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
    for (int i = 0; i < r; ++i) {
      const io_event& ev = events_[static_cast<std::size_t>(i)];
      out[static_cast<std::size_t>(i)] = {static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ev.data)),
                                          static_cast<std::int64_t>(static_cast<long>(ev.res))};
    }
    return r;
  }

 private:
  io_context_t ctx_ = nullptr;
  bool quiet_ = true;  // what shutdown() found
  std::vector<iocb> iocbs_;
  std::vector<iocb*> ptrs_;
  std::vector<io_event> events_;
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
