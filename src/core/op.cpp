#include "core/op.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "platform/fault.hpp"
#include "platform/sys.hpp"

namespace deepio::detail {

Status OpState::buffered_fd(int* out, const Reopener& reopen) {
  std::lock_guard lock(mutex_);
  if (buffered_fd_ < 0) {
    // The op's own open descriptor of the file: its O_DIRECT one, or the caller's (an
    // O_DIRECT descriptor used with direct_io=off). Reopening it, never the path, keeps the
    // file's identity (see reopen_file).
    const int source = direct_fd_ >= 0 ? direct_fd_ : borrowed_source_;
    if (source < 0) return Status::failure(EBADF, "no open descriptor to reopen without O_DIRECT", path_);
    UniqueFd fd;
    const int flags = write_ ? O_WRONLY : O_RDONLY;  // never O_CREAT/O_TRUNC: the file is open
    Status s = reopen ? reopen(source, flags, &fd) : reopen_file(source, flags, path_, &fd);
    if (!s.ok()) return s;
    owned_buffered_ = std::move(fd);
    buffered_fd_ = owned_buffered_.get();
  }
  *out = buffered_fd_;
  return Status::success();
}

void OpState::fail(Status status) {
  std::lock_guard lock(mutex_);
  if (error_.ok()) error_ = std::move(status);
  failed_.store(true, std::memory_order_relaxed);
}

void OpState::slice_done() noexcept {
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) slices_finished();
}

void OpState::complete_now() noexcept { slices_finished(); }

void OpState::slices_finished() noexcept {
  if (sync_ == nullptr || failed()) {
    finish();
    return;
  }
  // The op is still referenced by the engine's list of uncollected ops (it is not done, so
  // nobody can have collected it), so shared_from_this() always finds an owner.
  sync_->post(shared_from_this());
}

int OpState::sync_fd() const noexcept {
  std::lock_guard lock(mutex_);
  // Any descriptor of the file will do: fdatasync covers the whole file, whichever
  // descriptor (direct or not) its blocks went through.
  return direct_fd_ >= 0 ? direct_fd_ : buffered_fd_ >= 0 ? buffered_fd_ : borrowed_source_;
}

int OpState::sync_file() const noexcept {
  const int fd = sync_fd();
  if (auto injected = consult_fault_hook({FaultPoint::Sync, path_.c_str(), fd, offset_, nbytes_, 0})) {
    return *injected < 0 ? static_cast<int>(-*injected) : 0;
  }
  int r;
  do {
    r = ::fdatasync(fd);
  } while (r != 0 && errno == EINTR);
  return r != 0 ? errno : 0;
}

int OpState::unseen_error() const noexcept {
  const int fd = sync_fd();
  int r;
  do {
    // Waits for writeback still in flight (none, after the other descriptor's fdatasync) and
    // returns the writeback errors this descriptor has not reported yet.
    r = ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_AFTER);
  } while (r != 0 && errno == EINTR);
  if (r == 0) return 0;
  if (errno == EINVAL || errno == ENOSYS || errno == ESPIPE) return sync_file();  // cannot ask: sync it
  return errno;
}

void OpState::finish_sync(int err) noexcept {
  if (err != 0) {
    fail(Status::failure(err, "the write completed but may not be on stable storage: fdatasync failed on", path_,
                         offset_, nbytes_));
  } else if (counters_ != nullptr) {
    counters_->synced.fetch_add(1, std::memory_order_relaxed);
  }
  finish();
}

void OpState::run_sync() noexcept {
  if (failed()) {
    finish();
    return;
  }
  finish_sync(sync_file());
}

void OpState::finish() noexcept {
  bool failed;
  {
    std::lock_guard lock(mutex_);
    // Close what deepio opened before anyone can observe completion: a caller who waits
    // and then reopens or unlinks the file sees no stray descriptor, and an open() waiting
    // for a free descriptor (EMFILE back-pressure) finds one.
    owned_direct_.reset();
    owned_buffered_.reset();
    shared_fds_.reset();
    failed = !error_.ok();
  }
  // Engine-owned objects are touched before done_ is published, so an engine that waits for
  // its ops and is then destroyed never races with this function.
  if (counters_ != nullptr) {
    (failed ? counters_->ops_failed : counters_->ops_completed).fetch_add(1, std::memory_order_relaxed);
    if (on_device_) {
      (failed ? counters_->device_ops_failed : counters_->device_ops_completed).fetch_add(1, std::memory_order_relaxed);
      if (routed_) counters_->device_ops_routed.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (signal_ != nullptr) signal_->notify();
  Status unreported;
  bool report;
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    report = take_unreported(&unreported);
    callbacks.swap(on_done_);
  }
  cv_.notify_all();
  if (report) report_unobserved(unreported);
  for (auto& fn : callbacks) fn();
}

void OpState::on_done(std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!done_) {
      on_done_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

bool OpState::take_unreported(Status* out) noexcept {
  if (!done_ || error_.ok() || observed_ || !orphaned_ || !(detached_ || abandoned_)) return false;
  observed_ = true;
  try {
    *out = error_;
  } catch (...) {  // std::bad_alloc copying the message: the errno alone
    out->errnum = error_.errnum;
  }
  return true;
}

void OpState::add_future() noexcept {
  std::lock_guard lock(mutex_);
  ++futures_;
}

void OpState::drop_future() noexcept {
  Status unreported;
  bool report = false;
  {
    std::lock_guard lock(mutex_);
    if (--futures_ == 0) {
      orphaned_ = true;
      report = take_unreported(&unreported);
    }
  }
  if (report) report_unobserved(unreported);
}

void OpState::abandon() noexcept {
  Status unreported;
  bool report;
  {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
    report = take_unreported(&unreported);
  }
  if (report) report_unobserved(unreported);
}

bool OpState::done() const noexcept {
  std::lock_guard lock(mutex_);
  return done_;
}

void OpState::wait() const noexcept {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
}

bool OpState::wait_for(std::chrono::nanoseconds timeout) const noexcept {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

bool OpState::wait_until(std::chrono::steady_clock::time_point deadline) const noexcept {
  std::unique_lock lock(mutex_);
  return cv_.wait_until(lock, deadline, [&] { return done_; });
}

void OpState::set_keep_alive(std::shared_ptr<void> keep_alive) noexcept {
  std::lock_guard lock(mutex_);
  keep_alive_ = std::move(keep_alive);
}

bool OpState::detached() const noexcept {
  std::lock_guard lock(mutex_);
  return detached_;
}

void OpState::set_detached(bool detached) noexcept {
  std::lock_guard lock(mutex_);
  detached_ = detached;
}

Status OpState::take_result(std::shared_ptr<void>* keep_alive) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (!claimed_) {
    claimed_ = true;
    *keep_alive = std::move(keep_alive_);
  }
  observed_ = true;
  return error_;
}

bool OpState::claim(Status* error, std::shared_ptr<void>* keep_alive, bool counted) {
  std::lock_guard lock(mutex_);
  if (claimed_ || !done_) return false;
  claimed_ = true;
  if (counted) observed_ = true;
  *error = error_;
  *keep_alive = std::move(keep_alive_);
  return true;
}

bool OpState::claimed() const noexcept {
  std::lock_guard lock(mutex_);
  return claimed_;
}

}  // namespace deepio::detail
