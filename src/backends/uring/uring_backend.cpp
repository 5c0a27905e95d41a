// io_uring backend (liburing): one ring per worker, sized to the worker's queue depth.
// Lifecycle: io_uring_queue_init at creation (IORING_SETUP_SUBMIT_ALL where the kernel has
// it, so one bad request becomes an error completion instead of stalling the rest),
// io_uring_queue_exit at shutdown() (a failed queue) or destruction, after waiting for the
// requests the kernel took (closing a ring does not wait for them).
// Errors: setup failures are reported with the reason (EPERM: kernel.io_uring_disabled or a
// seccomp filter; ENOSYS: kernel without io_uring). Each request's result arrives in its CQE.
// Submission: prepared SQEs are always accepted. Without single_submit they reach the kernel
// in the next reap(), whose io_uring_submit_and_wait submits and waits in one system call
// (the worker always reaps after submitting); with single_submit each submit() enters the
// kernel at once. SQEs the kernel could not take (EAGAIN/EBUSY/EINTR) stay in the SQ and are
// flushed by the next reap.
// Registered ("fixed") buffers: a request whose buffer lies in a locked allocation
// (Request::region) uses READ_FIXED/WRITE_FIXED on a registration of the 64 MiB piece of that
// allocation it falls in, made on first use in a sparse table of kFixedSlots entries (least
// recently used replaced). Registering pins the pages once; without
// it the kernel pins and unpins every request's pages, which was the largest cost of the
// worker thread for 64 KiB reads here. A registration ends before the allocation is freed
// (a release listener clears the slot; in-flight requests keep their pages until they
// complete), so a freed allocation's pages are never kept or reused. A registration the
// kernel refuses (ENOMEM under RLIMIT_MEMLOCK, kernels before 5.19 without sparse tables) is
// remembered and those requests take the ordinary path. The table is guarded by fixed_mutex_
// because the listener runs on the thread that frees memory; the ring is therefore not set
// up with IORING_SETUP_SINGLE_ISSUER. Registered files are not used: with one open per file
// and a few requests each they cost a system call and save little.
#include "backends/uring/uring_backend.hpp"

#include <liburing.h>

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "platform/sys.hpp"

namespace deepio::detail {

namespace {

// Allocations are registered in pieces: the kernel takes at most 1 GiB per buffer, and a
// smaller piece keeps each registration short (about 3 ms for 64 MiB here) so that the first
// requests into a large fresh buffer start at once and later pieces are registered while
// earlier requests are in flight. 256 slots cover 16 GiB per ring before any replacement.
constexpr std::size_t kFixedPiece = std::size_t{64} << 20;
constexpr unsigned kFixedSlots = 256;
constexpr std::uint64_t kFixedBit = std::uint64_t{1} << 63;  // in user_data: the request used a fixed buffer

class UringBackend final : public Backend {
 public:
  explicit UringBackend(bool single_submit) : eager_(single_submit) {}
  ~UringBackend() override { shutdown(); }

  // Closing a ring does not wait for its requests: the kernel finishes them later, into
  // buffers the worker may have freed by then. So the requests the kernel took are waited
  // for first (their completions discarded), for at most kDrainLimit; requests still only in
  // the submission queue never reach the kernel and are dropped with the ring.
  bool shutdown() noexcept override {
    if (exited_) return quiet_;
    exited_ = true;
    if (listener_ != 0) remove_release_listener(listener_);  // waits for a running one
    listener_ = 0;
    quiet_ = drain();
    io_uring_queue_exit(&ring_);  // also drops every registration
    return quiet_;
  }
  UringBackend(const UringBackend&) = delete;
  UringBackend& operator=(const UringBackend&) = delete;

  int init(unsigned entries) {
    int r = io_uring_queue_init(entries, &ring_, IORING_SETUP_SUBMIT_ALL);
    if (r == -EINVAL) r = io_uring_queue_init(entries, &ring_, 0);
    if (r < 0) return r;
    exited_ = false;
    if (io_uring_register_buffers_sparse(&ring_, kFixedSlots) == 0) {
      fixed_.resize(kFixedSlots);
      listener_ = add_release_listener([this](std::uint64_t id) { forget(id); });
    }
    return 0;
  }

  [[nodiscard]] const char* name() const noexcept override { return "io_uring"; }

  int submit(std::span<const Request> reqs) override {
    int prepared = 0;
    for (const Request& r : reqs) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      const int slot = fixed_slot(r);
      if (slot >= 0) {
        if (r.write) {
          io_uring_prep_write_fixed(sqe, r.fd, r.buf, r.len, r.offset, slot);
        } else {
          io_uring_prep_read_fixed(sqe, r.fd, r.buf, r.len, r.offset, slot);
        }
      } else if (r.write) {
        io_uring_prep_write(sqe, r.fd, r.buf, r.len, r.offset);
      } else {
        io_uring_prep_read(sqe, r.fd, r.buf, r.len, r.offset);
      }
      io_uring_sqe_set_data64(sqe, slot >= 0 ? (r.tag | kFixedBit) : r.tag);
      ++prepared;
    }
    prepared_ += static_cast<std::uint64_t>(prepared);
    if (prepared == 0) return -EAGAIN;
    unflushed_ = true;
    if (eager_ && io_uring_submit(&ring_) >= 0) unflushed_ = false;  // else the next reap retries
    return prepared;
  }

  void flush() override {
    if (!exited_ && unflushed_ && io_uring_submit(&ring_) >= 0) unflushed_ = false;  // else the next reap retries
  }

  int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us) override {
    __kernel_timespec ts{};
    // Only where the kernel takes the timeout as an argument (5.11+): an older one would get
    // a timeout request of liburing's own in the ring, whose completion the batch peek below
    // would take for one of ours. There the wait is unbounded, as before.
    if ((ring_.features & IORING_FEAT_EXT_ARG) == 0) max_wait_us = -1;
    if (max_wait_us >= 0) {
      ts.tv_sec = max_wait_us / 1000000;
      ts.tv_nsec = (max_wait_us % 1000000) * 1000;
    }
    for (;;) {
      int r = 0;
      io_uring_cqe* cqe = nullptr;
      if (unflushed_) {
        r = max_wait_us >= 0 && min > 0
                ? io_uring_submit_and_wait_timeout(&ring_, &cqe, static_cast<unsigned>(min), &ts, nullptr)
                : io_uring_submit_and_wait(&ring_, static_cast<unsigned>(min));
        if (r >= 0 || r == -ETIME) unflushed_ = false;
      } else if (min > 0) {
        r = max_wait_us >= 0 ? io_uring_wait_cqes(&ring_, &cqe, static_cast<unsigned>(min), &ts, nullptr)
                             : io_uring_wait_cqe_nr(&ring_, &cqe, static_cast<unsigned>(min));
      }
      if (r == -ETIME) break;  // the time is up: what has come is taken below
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
        const std::uint64_t data = io_uring_cqe_get_data64(cqes[i]);
        out[stored++] = {data & ~kFixedBit, cqes[i]->res, (data & kFixedBit) != 0};
      }
      io_uring_cq_advance(&ring_, n);
      reaped_ += n;
    }
    return static_cast<int>(stored);
  }

 private:
  struct Fixed {
    std::uint64_t region = 0;  // 0: the slot is empty
    std::size_t piece = 0;
    std::uint64_t used = 0;  // for least-recently-used replacement
  };

  // The registered-buffer slot for r, registering its piece of the region on first use;
  // -1 for the ordinary path.
  // Requests the kernel took and has not completed: prepared, minus those still waiting in
  // the submission queue, minus the completions seen.
  [[nodiscard]] std::uint64_t in_kernel() const noexcept { return prepared_ - io_uring_sq_ready(&ring_) - reaped_; }

  // Waits until the kernel has completed every request it took (true), or gives up after
  // kDrainLimit or on an error of the ring itself (false).
  bool drain() noexcept {
    constexpr auto kDrainLimit = std::chrono::seconds(10);
    const auto deadline = std::chrono::steady_clock::now() + kDrainLimit;
    while (in_kernel() > 0) {
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec ts{0, 100'000'000};
      const int r = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
      const unsigned ready = io_uring_cq_ready(&ring_);
      if (ready > 0) {
        io_uring_cq_advance(&ring_, ready);
        reaped_ += ready;
        continue;
      }
      if (r != 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY) return false;
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    return true;
  }

  int fixed_slot(const Request& r) {
    if (r.region.id == 0 || fixed_.empty()) return -1;
    const auto* p = static_cast<const std::byte*>(r.buf);
    const std::size_t piece = static_cast<std::size_t>(p - r.region.base) / kFixedPiece;
    std::byte* const start = r.region.base + piece * kFixedPiece;
    const std::size_t len = std::min(kFixedPiece, r.region.size - piece * kFixedPiece);
    if (p + r.len > start + len) return -1;  // crosses into the next piece
    std::lock_guard lock(fixed_mutex_);
    std::size_t victim = 0;
    for (std::size_t i = 0; i < fixed_.size(); ++i) {
      if (fixed_[i].region == r.region.id && fixed_[i].piece == piece) {
        fixed_[i].used = ++clock_;
        return static_cast<int>(i);
      }
      if (fixed_[i].used < fixed_[victim].used) victim = i;
    }
    if (refused_.contains({r.region.id, piece})) return -1;
    iovec iov{start, len};
    __u64 tag = 0;
    if (io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(victim), &iov, &tag, 1) != 1) {
      refused_.insert({r.region.id, piece});
      return -1;
    }
    fixed_[victim] = {r.region.id, piece, ++clock_};
    return static_cast<int>(victim);
  }

  // Release listener: the region is about to be unmapped, so its registrations end now.
  void forget(std::uint64_t id) noexcept {
    std::lock_guard lock(fixed_mutex_);
    refused_.clear();  // freed memory may leave room under RLIMIT_MEMLOCK: try again later
    for (std::size_t i = 0; i < fixed_.size(); ++i) {
      if (fixed_[i].region != id) continue;
      iovec none{nullptr, 0};
      __u64 tag = 0;
      // Cannot fail for an in-range slot and an empty buffer; if it did, the pages would stay
      // pinned until the slot is reused or the ring closes, and the slot is never used for them.
      (void)io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(i), &none, &tag, 1);
      fixed_[i] = {};
    }
  }

  io_uring ring_{};
  bool eager_;
  bool unflushed_ = false;
  std::mutex fixed_mutex_;
  std::vector<Fixed> fixed_;                                 // guarded by fixed_mutex_; empty: no fixed buffers
  std::set<std::pair<std::uint64_t, std::size_t>> refused_;  // guarded by fixed_mutex_
  std::uint64_t clock_ = 0;                                  // guarded by fixed_mutex_
  std::uint64_t listener_ = 0;
  std::uint64_t prepared_ = 0;  // SQEs prepared, ever
  std::uint64_t reaped_ = 0;    // CQEs consumed, ever
  bool exited_ = true;          // no ring: not set up yet, or shut down
  bool quiet_ = true;           // what shutdown() found
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
