// io_uring backend (liburing): one ring per worker, sized to the worker's queue depth.
// Lifecycle: io_uring_queue_init at creation (IORING_SETUP_SUBMIT_ALL where the kernel has
// it, so one bad request becomes an error completion instead of stalling the rest),
// io_uring_queue_exit at destruction; the worker only destroys it with nothing in flight.
// Errors: setup failures are reported with the reason (EPERM: kernel.io_uring_disabled or a
// seccomp filter; ENOSYS: kernel without io_uring). Each request's result arrives in its CQE.
// Submission: prepared SQEs are always accepted. Without single_submit they reach the kernel
// in the next reap(), whose io_uring_submit_and_wait submits and waits in one system call
// (the worker always reaps after submitting); with single_submit each submit() enters the
// kernel at once. SQEs the kernel could not take (EAGAIN/EBUSY/EINTR) stay in the SQ and are
// flushed by the next reap.
// Not used yet: registered buffers and files (no measurable gain at 1 MiB blocks here).
#include "backends/uring/uring_backend.hpp"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
class UringBackend final : public Backend {
 public:
  explicit UringBackend(bool single_submit) : eager_(single_submit) {}
  ~UringBackend() override { io_uring_queue_exit(&ring_); }
  UringBackend(const UringBackend&) = delete;
  UringBackend& operator=(const UringBackend&) = delete;

  int init(unsigned entries) {
    int r = io_uring_queue_init(entries, &ring_, IORING_SETUP_SUBMIT_ALL);
    if (r == -EINVAL) r = io_uring_queue_init(entries, &ring_, 0);
    return r;
  }

  [[nodiscard]] const char* name() const noexcept override { return "io_uring"; }

  int submit(std::span<const Request> reqs) override {
    int prepared = 0;
    for (const Request& r : reqs) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      if (r.write) {
        io_uring_prep_write(sqe, r.fd, r.buf, r.len, r.offset);
      } else {
        io_uring_prep_read(sqe, r.fd, r.buf, r.len, r.offset);
      }
      io_uring_sqe_set_data64(sqe, r.tag);
      ++prepared;
    }
    if (prepared == 0) return -EAGAIN;
    unflushed_ = true;
    if (eager_ && io_uring_submit(&ring_) >= 0) unflushed_ = false;  // else the next reap retries
    return prepared;
  }

  int reap(std::span<Completion> out, std::size_t min) override {
    for (;;) {
      int r = 0;
      if (unflushed_) {
        r = io_uring_submit_and_wait(&ring_, static_cast<unsigned>(min));
        if (r >= 0) unflushed_ = false;
      } else if (min > 0) {
        io_uring_cqe* cqe = nullptr;
        r = io_uring_wait_cqe_nr(&ring_, &cqe, static_cast<unsigned>(min));
      }
      if (r == -EINTR || r == -EAGAIN || r == -EBUSY) {
        if (io_uring_cq_ready(&ring_) == 0) continue;
      } else if (r < 0) {
        return r;
      }
      break;
    }
    io_uring_cqe* cqes[256];
    std::size_t stored = 0;
    while (stored < out.size()) {
      const unsigned want = static_cast<unsigned>(std::min<std::size_t>(256, out.size() - stored));
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, want);
      if (n == 0) break;
      for (unsigned i = 0; i < n; ++i) {
        out[stored++] = {io_uring_cqe_get_data64(cqes[i]), cqes[i]->res};
      }
      io_uring_cq_advance(&ring_, n);
    }
    return static_cast<int>(stored);
  }

 private:
  io_uring ring_{};
  bool eager_;
  bool unflushed_ = false;
};
}  // namespace

std::unique_ptr<Backend> make_uring_backend(std::size_t queue_depth, bool single_submit, Status* why) {
  auto b = std::make_unique<UringBackend>(single_submit);
  const unsigned entries = static_cast<unsigned>(std::clamp<std::size_t>(queue_depth, 1, 32768));
  const int r = b->init(entries);
  if (r < 0) {
    std::string msg = "io_uring_queue_init failed: " + errno_string(-r);
    if (r == -EPERM) msg += " (io_uring disabled by kernel.io_uring_disabled or a seccomp filter)";
    if (r == -ENOSYS) msg += " (kernel built without io_uring)";
    if (r == -ENOMEM) msg += " (locked-memory limit too low for the ring)";
    *why = Status::failure(-r, msg);
    return nullptr;
  }
  return b;
}

}  // namespace deepio::detail
