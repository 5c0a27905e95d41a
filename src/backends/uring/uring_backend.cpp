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
// recently used replaced; a hash index finds a piece's slot in one lookup per request). Registering pins the pages
// once; without it the kernel pins and unpins every request's pages, which was the largest cost of the worker thread
// for 64 KiB reads here. A registration ends before the allocation is freed (a release listener clears the slot;
// in-flight requests keep their pages until they complete), so a freed allocation's pages are never kept or reused. A
// registration the kernel refuses (ENOMEM under RLIMIT_MEMLOCK, kernels before 5.19 without sparse tables) is
// remembered and those requests take the ordinary path. The table is guarded by fixed_mutex_
// because the listener runs on the thread that frees memory; the ring is therefore not set
// up with IORING_SETUP_SINGLE_ISSUER.
// Registered ("fixed") files, for file objects only (Request::fixed_file; the protocol is
// core/fixed_files.hpp's): each ring gets a sparse file table at setup (file_table_slots()
// entries; none where the kernel refuses one, before 5.19: every request then takes its plain
// descriptor). The first request of a file object's descriptor on this ring installs it in a
// free slot (one io_uring_register call); it and every later one go with IOSQE_FIXED_FILE, so
// the kernel neither looks the descriptor up nor counts a reference per request. The worker
// finds the slot in its own map (ids are never reused, and a slot is only freed by its file's
// removal, when no request of it can be submitted), without a lock; the table's mutex guards
// the free list against removals, which come from the thread that drops the file object
// (FileTable::remove, before its descriptors close). A full table or a refused registration:
// the plain descriptor, flagged in the completion (Completion::file_fallback). Path operations
// (one open per op, a few requests each) are not registered: a registration and a removal
// cost two system calls, more than they save there.
// Wake-ups (Backend::wake): an eventfd with a one-shot POLL_ADD on it kept armed in the ring
// (user_data kWakeData, never a request's), prepared at setup and again after each wake-up,
// reaching the kernel with the next submission. wake() writes the eventfd (one system call,
// made only while the worker waits: worker.hpp's protocol); the poll completes, which ends a
// wait for one completion; reap() reads the eventfd back to zero, re-arms the poll and stores
// no completion for it. The poll counts as a request in the kernel for shutdown(), which
// writes the eventfd first so that it completes. A kernel that refuses the poll (or no
// eventfd) makes waits without a time limit last at most kFallbackWaitUs instead.
#include "backends/uring/uring_backend.hpp"

#include <liburing.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/fixed_files.hpp"
#include "platform/process.hpp"
#include "platform/sys.hpp"

namespace deepio::detail {

namespace {

// Allocations are registered in pieces: the kernel takes at most 1 GiB per buffer, and a
// smaller piece keeps each registration short (about 3 ms for 64 MiB here) so that the first
// requests into a large fresh buffer start at once and later pieces are registered while
// earlier requests are in flight. 256 slots cover 16 GiB per ring before any replacement.
constexpr std::size_t kFixedPiece = std::size_t{64} << 20;
constexpr unsigned kFixedSlots = 256;
// In user_data above the tag (Request::tag is below 2^61): what the request went through.
constexpr std::uint64_t kFixedBit = std::uint64_t{1} << 63;      // a fixed buffer
constexpr std::uint64_t kFixedFileBit = std::uint64_t{1} << 62;  // a registered file's slot
constexpr std::uint64_t kFallbackBit = std::uint64_t{1} << 61;   // its plain fd: table full or refused
constexpr std::uint64_t kFlagBits = kFixedBit | kFixedFileBit | kFallbackBit;
// The wake-up poll's user_data: every flag bit, which no request has (a request's fixed-file
// and fallback bits exclude each other).
constexpr std::uint64_t kWakeData = ~std::uint64_t{0};
// Where wake-ups cannot be armed: the longest wait before the worker looks for new work.
constexpr std::int64_t kFallbackWaitUs = 1000;

// A ring's registered-file table, as file objects see it (core/fixed_files.hpp). Shared by
// the backend (which installs, on its worker thread) and the FixedFiles it installed (which
// remove themselves from any thread). `ring` is null once the backend shut the ring down.
class UringFileTable final : public FileTable {
 public:
  UringFileTable(io_uring* ring, unsigned slots) : ring_(ring) {
    free_.reserve(slots);
    for (unsigned i = slots; i-- > 0;) free_.push_back(i);
    free_count_.store(slots, std::memory_order_relaxed);
  }

  void remove(unsigned slot) noexcept override {
    if (!process_.here()) return;  // a forked child: the parent's ring, and maybe a lock held there
    std::lock_guard lock(mutex_);
    if (ring_ == nullptr) return;  // the ring is gone, and every registration with it
    int none = -1;
    // Cannot fail for an installed slot; if it did, the file would stay open until the ring
    // closes (and the slot is not reused).
    if (io_uring_register_files_update(ring_, slot, &none, 1) != 1) return;
    free_.push_back(slot);
    free_count_.store(free_.size(), std::memory_order_relaxed);
    count_fixed_files(-1);
  }

  [[nodiscard]] bool has_free() const noexcept { return free_count_.load(std::memory_order_relaxed) > 0; }

  // On the worker: a free slot with fd installed in it, or -1 (full, or refused).
  int install(int fd) {
    if (free_count_.load(std::memory_order_relaxed) == 0) return -1;
    std::lock_guard lock(mutex_);
    if (ring_ == nullptr || free_.empty()) return -1;
    const unsigned slot = free_.back();
    if (io_uring_register_files_update(ring_, slot, &fd, 1) != 1) return -1;
    free_.pop_back();
    free_count_.store(free_.size(), std::memory_order_relaxed);
    count_fixed_files(1);
    return static_cast<int>(slot);
  }

  // The backend's shutdown, before the ring exits (which drops what is still installed).
  void close(std::size_t slots) noexcept {
    std::lock_guard lock(mutex_);
    if (ring_ == nullptr) return;
    ring_ = nullptr;
    count_fixed_files(-static_cast<std::int64_t>(slots - free_.size()));
  }

 private:
  const ProcessStamp process_;
  std::mutex mutex_;
  io_uring* ring_;                          // guarded by mutex_
  std::vector<unsigned> free_;              // guarded by mutex_
  std::atomic<std::size_t> free_count_{0};  // free_.size(), read without the lock
};

// liburing maps and unmaps a ring with its own system calls, which ThreadSanitizer does not
// see: a new ring mapped where a closed one was looks, to it, like memory the closed ring's
// thread last wrote. This release (before a ring is unmapped) and acquire (after one is
// mapped) order every ring's teardown before any later ring's first use, as the kernel does.
std::atomic<unsigned> ring_epoch{0};

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
    if (wake_armed_) wake();  // the poll completes, so drain() need not wait for it
    quiet_ = drain();
    if (files_) files_->close(file_table_size_);
    ring_epoch.fetch_add(1, std::memory_order_release);
    io_uring_queue_exit(&ring_);  // also drops every registration
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
    return quiet_;
  }
  UringBackend(const UringBackend&) = delete;
  UringBackend& operator=(const UringBackend&) = delete;

  int init(unsigned entries) {
    int r = io_uring_queue_init(entries, &ring_, IORING_SETUP_SUBMIT_ALL);
    if (r == -EINVAL) r = io_uring_queue_init(entries, &ring_, 0);
    if (r < 0) return r;
    (void)ring_epoch.load(std::memory_order_acquire);
    exited_ = false;
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    wake_broken_ = wake_fd_ < 0;
    arm_wake();
    if (io_uring_register_buffers_sparse(&ring_, kFixedSlots) == 0) {
      fixed_.resize(kFixedSlots);
      listener_ = add_release_listener([this](std::uint64_t id) { forget(id); });
    }
    // A table the size of RLIMIT_NOFILE at most: liburing would raise the limit itself.
    const unsigned slots = file_table_slots();
    if (slots > 0 && io_uring_register_files_sparse(&ring_, slots) == 0) {
      files_ = std::make_shared<UringFileTable>(&ring_, slots);
      file_table_size_ = slots;
      slot_owner_.assign(slots, 0);
    }
    return 0;
  }

  [[nodiscard]] const char* name() const noexcept override { return "io_uring"; }

  int submit(std::span<const Request> reqs) override {
    int prepared = 0;
    for (const Request& r : reqs) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr && io_uring_submit(&ring_) >= 0) sqe = io_uring_get_sqe(&ring_);  // full: flush it
      if (sqe == nullptr) break;
      const int slot = fixed_slot(r);
      std::uint64_t flags = slot >= 0 ? kFixedBit : 0;
      int fd = r.fd;
      if (r.fixed_file != nullptr && files_) {
        const int file_slot = file_slot_for(r);
        if (file_slot >= 0) {
          fd = file_slot;
          flags |= kFixedFileBit;
        } else {
          flags |= kFallbackBit;
        }
      }
      if (slot >= 0) {
        if (r.write) {
          io_uring_prep_write_fixed(sqe, fd, r.buf, r.len, r.offset, slot);
        } else {
          io_uring_prep_read_fixed(sqe, fd, r.buf, r.len, r.offset, slot);
        }
      } else if (r.write) {
        io_uring_prep_write(sqe, fd, r.buf, r.len, r.offset);
      } else {
        io_uring_prep_read(sqe, fd, r.buf, r.len, r.offset);
      }
      if ((flags & kFixedFileBit) != 0) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
      io_uring_sqe_set_data64(sqe, r.tag | flags);
      ++prepared;
    }
    prepared_ += static_cast<std::uint64_t>(prepared);
    if (prepared == 0) return -EAGAIN;
    unflushed_ = true;
    if (eager_ && io_uring_submit(&ring_) >= 0) unflushed_ = false;  // else the next reap retries
    return prepared;
  }

  void wake() noexcept override {
    if (wake_fd_ < 0) return;
    const std::uint64_t one = 1;
    // Cannot fail but for a counter at its maximum, which is a wake-up pending anyway.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void flush() override {
    if (!exited_ && unflushed_ && io_uring_submit(&ring_) >= 0) unflushed_ = false;  // else the next reap retries
  }

  int reap(std::span<Completion> out, std::size_t min, std::int64_t max_wait_us) override {
    __kernel_timespec ts{};
    // Only where the kernel takes the timeout as an argument (5.11+): an older one would get
    // a timeout request of liburing's own in the ring, whose completion the batch peek below
    // would take for one of ours. There the wait is unbounded, as before.
    if (!wake_armed_) arm_wake();
    if (wake_broken_ && max_wait_us < 0 && min <= 1) max_wait_us = kFallbackWaitUs;
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
        if (data == kWakeData) {
          woken(cqes[i]->res);
          continue;
        }
        out[stored++] = {data & ~kFlagBits, cqes[i]->res, (data & kFixedBit) != 0, (data & kFixedFileBit) != 0,
                         (data & kFallbackBit) != 0};
      }
      io_uring_cq_advance(&ring_, n);
      reaped_ += n;
    }
    if (!wake_armed_) arm_wake();  // reaches the kernel with the next submission
    return static_cast<int>(stored);
  }

 private:
  // Prepares the wake-up poll (see the file comment); it reaches the kernel with the next
  // submission. Not armed when no SQE is free even after a flush: tried again by reap().
  void arm_wake() noexcept {
    if (wake_broken_ || wake_armed_ || exited_) return;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr && io_uring_submit(&ring_) >= 0) sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;
    io_uring_prep_poll_add(sqe, wake_fd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeData);
    ++prepared_;
    unflushed_ = true;
    wake_armed_ = true;
  }

  // The wake-up poll completed with `res`: the eventfd is read back to zero (wake-ups made
  // until now are answered by this return), and the poll is re-armed by the caller.
  void woken(int res) noexcept {
    wake_armed_ = false;
    if (res < 0 && res != -ECANCELED) {
      wake_broken_ = true;  // the kernel refuses the poll: bounded waits from now on
      return;
    }
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
  }

  struct PieceKey {
    std::uint64_t region;
    std::size_t piece;
    bool operator==(const PieceKey&) const = default;
  };
  struct PieceHash {
    std::size_t operator()(const PieceKey& k) const noexcept {
      return std::hash<std::uint64_t>{}(k.region * 0x9E3779B97F4A7C15ull ^ k.piece);
    }
  };
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
    const PieceKey key{r.region.id, piece};
    if (auto it = fixed_index_.find(key); it != fixed_index_.end()) {  // the usual case: one lookup
      fixed_[it->second].used = ++clock_;
      return static_cast<int>(it->second);
    }
    if (refused_.contains({r.region.id, piece})) return -1;
    std::size_t victim = 0;  // a new piece: the least recently used slot (empty ones have used 0)
    for (std::size_t i = 1; i < fixed_.size(); ++i) {
      if (fixed_[i].used < fixed_[victim].used) victim = i;
    }
    iovec iov{start, len};
    __u64 tag = 0;
    if (io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(victim), &iov, &tag, 1) != 1) {
      refused_.insert({r.region.id, piece});
      return -1;
    }
    if (fixed_[victim].region != 0) fixed_index_.erase({fixed_[victim].region, fixed_[victim].piece});
    fixed_[victim] = {r.region.id, piece, ++clock_};
    fixed_index_[key] = victim;
    return static_cast<int>(victim);
  }

  // The slot of r's file object descriptor in this ring's table, installing it on first use
  // (recorded in the FixedFile, which takes it out again when it goes); -1 for the plain fd.
  int file_slot_for(const Request& r) {
    FixedFile& f = *r.fixed_file;
    if (f.fd() != r.fd) return -1;
    if (auto it = file_slots_.find(f.id()); it != file_slots_.end()) return it->second;
    const int slot = files_->install(r.fd);
    if (slot < 0) {
      // Refused with slots free: remembered (as -1), so that it is not asked again for every
      // request (refusals of files long gone are dropped when they pile up). A full table is
      // asked again once a slot is free (has_free() is one atomic load).
      if (files_->has_free()) {
        if (file_slots_.size() >= 2 * std::size_t{file_table_size_}) {
          std::erase_if(file_slots_, [](const auto& kv) { return kv.second < 0; });
        }
        file_slots_.emplace(f.id(), -1);
      }
      return -1;
    }
    const auto at = static_cast<std::size_t>(slot);
    // The slot's previous file is gone: its entry here can never be asked for again.
    if (slot_owner_[at] != 0) file_slots_.erase(slot_owner_[at]);
    try {
      file_slots_.emplace(f.id(), slot);
      slot_owner_[at] = f.id();
      f.add(files_, static_cast<unsigned>(slot));
    } catch (...) {  // out of memory: an installation nobody would take out is undone now
      file_slots_.erase(f.id());
      slot_owner_[at] = 0;
      files_->remove(static_cast<unsigned>(slot));
      return -1;
    }
    return slot;
  }

  // Release listener: the region is about to be unmapped, so its registrations end now. Not
  // in a forked child: the ring is the parent's (one io_uring instance, shared across fork),
  // whose registrations the child must not end.
  void forget(std::uint64_t id) noexcept {
    if (!process_.here()) return;
    std::lock_guard lock(fixed_mutex_);
    refused_.clear();  // freed memory may leave room under RLIMIT_MEMLOCK: try again later
    for (std::size_t i = 0; i < fixed_.size(); ++i) {
      if (fixed_[i].region != id) continue;
      iovec none{nullptr, 0};
      __u64 tag = 0;
      // Cannot fail for an in-range slot and an empty buffer; if it did, the pages would stay
      // pinned until the slot is reused or the ring closes, and the slot is never used for them.
      (void)io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(i), &none, &tag, 1);
      fixed_index_.erase({fixed_[i].region, fixed_[i].piece});
      fixed_[i] = {};
    }
  }

  io_uring ring_{};
  bool eager_;
  bool unflushed_ = false;
  std::mutex fixed_mutex_;
  std::vector<Fixed> fixed_;  // guarded by fixed_mutex_; empty: no fixed buffers
  std::unordered_map<PieceKey, std::size_t, PieceHash>
      fixed_index_;                                          // (region, piece) -> its slot in fixed_; same guard
  std::set<std::pair<std::uint64_t, std::size_t>> refused_;  // guarded by fixed_mutex_
  std::uint64_t clock_ = 0;                                  // guarded by fixed_mutex_
  std::uint64_t listener_ = 0;
  const ProcessStamp process_;  // forget() does nothing in a forked child
  // Registered files (see the file comment); worker thread only, except what files_ guards.
  std::shared_ptr<UringFileTable> files_;              // null: the kernel has no sparse file tables
  unsigned file_table_size_ = 0;                       // its slots
  std::unordered_map<std::uint64_t, int> file_slots_;  // FixedFile::id -> slot, or -1: refused
  std::vector<std::uint64_t> slot_owner_;              // slot -> id of the file last installed there
  std::uint64_t prepared_ = 0;                         // SQEs prepared, ever
  std::uint64_t reaped_ = 0;                           // CQEs consumed, ever
  bool exited_ = true;                                 // no ring: not set up yet, or shut down
  bool quiet_ = true;                                  // what shutdown() found
  int wake_fd_ = -1;                                   // the wake-ups' eventfd (wake() writes it)
  bool wake_armed_ = false;                            // its poll is prepared or in the kernel
  bool wake_broken_ = false;                           // no wake-ups: bounded waits instead
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
