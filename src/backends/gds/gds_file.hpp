// What GdsRoute::bind() makes and the route's backend reads (not installed; the gds_*.cpp
// files only): a descriptor's cuFile registration (GdsRegistration) and one operation's
// binding (GdsFile). Their lifecycles are in gds_route.hpp; each class says its own below.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backends/gds/gds_route.hpp"
#include "platform/process.hpp"

namespace deepio::detail::gpu {

inline std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

inline std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// One descriptor's cuFile registration: the handle cuFileHandleRegister gave (null: Auto's
// refusal, `refused` saying why: the file is staged). A path operation owns one for itself;
// a file object's is kept in its RouteFileSlot and shared by each of its operations. The
// handle is deregistered when the last holder drops it: the operation (path) or the file
// object (SharedFile), in both cases before the descriptor closes. It holds the route, so
// cuFile's driver stays open while a file object outlives its handle.
class GdsRegistration final {
 public:
  GdsRegistration(std::shared_ptr<GdsRoute> route, int ordinal, int fd)
      : route_(std::move(route)), ordinal_(ordinal), fd_(fd) {}
  ~GdsRegistration() {
    if (!stamp_.here()) {
      // A forked child's copy: cuFile and CUDA are the parent's; leaked, as GdsHandle does.
      (void)new std::shared_ptr<GdsRoute>(std::move(route_));
      return;
    }
    route_->deregister(fh, ordinal_);
  }
  GdsRegistration(const GdsRegistration&) = delete;
  GdsRegistration& operator=(const GdsRegistration&) = delete;

  [[nodiscard]] int fd() const noexcept { return fd_; }

  CUfileHandle_t fh = nullptr;
  std::string refused;  ///< Auto's refusal (fh null): the reason, said again for every op

 private:
  std::shared_ptr<GdsRoute> route_;
  int ordinal_;         // the device whose context was current at registration
  int fd_;              // the registered descriptor (outlives this object)
  ProcessStamp stamp_;  // the process that registered it
};

// One operation's binding: the file's registration (null or without a handle when staged)
// and the pinned buffer it uses (if any). Ends its use of them when the engine drops it,
// after the operation's last request, before the operation's descriptors close. After a
// cuFile failure at I/O time (Auto), the route's backend stages the operation's remaining
// requests itself, through a descriptor without O_DIRECT made here on first use.
class GdsFile final : public DriverFile {
 public:
  GdsFile(GdsRoute* route, int ordinal, int fd) : route_(route), ordinal_(ordinal), fd_(fd) {}
  ~GdsFile() override {
    route_->release(registry, registry_key);
    registration.reset();  // a path operation's own: deregistered here
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
  }
  GdsFile(const GdsFile&) = delete;
  GdsFile& operator=(const GdsFile&) = delete;

  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }

  /// A descriptor of the file for pread/pwrite at any offset into any buffer: the engine's own
  /// when it lacks O_DIRECT, else the same file reopened without it (kept until the end).
  Status posix_fd(int* out) const {
    std::lock_guard lock(fd_mutex_);
    if (buffered_fd_ >= 0) {
      *out = buffered_fd_;
      return Status::success();
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) {
      const int e = errno;
      return Status::failure(e, std::string("fcntl(F_GETFL): ") + std::strerror(e));
    }
    if ((flags & O_DIRECT) == 0) {
      *out = fd_;
      return Status::success();
    }
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    const int fd = ::open(self.c_str(), (flags & O_ACCMODE) | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      return Status::failure(e, std::string("reopening the file without O_DIRECT: ") + std::strerror(e));
    }
    buffered_fd_ = fd;
    *out = fd;
    return Status::success();
  }

  /// The file's registration: without a handle when Auto stages the file; null without cuFile.
  std::shared_ptr<const GdsRegistration> registration;
  CUfileHandle_t fh = nullptr;
  std::uintptr_t base = 0;  ///< registered buffer base, 0: unregistered (cuFile bounces)
  BufferRegistry* registry = nullptr;
  std::uintptr_t registry_key = 0;
  /// Set by the backend when cuFile failed on this operation: its other requests are staged.
  mutable std::atomic<bool> staged_io{false};

  /// The cuFile error that made the operation staged (for the messages of staged failures).
  void set_cause(std::string why) const {
    std::lock_guard lock(fd_mutex_);
    cause_ = std::move(why);
  }
  [[nodiscard]] std::string cause() const {
    std::lock_guard lock(fd_mutex_);
    return cause_;
  }

 private:
  GdsRoute* route_;
  int ordinal_;
  int fd_;  // the engine's descriptor (outlives this object)
  mutable std::mutex fd_mutex_;
  mutable int buffered_fd_ = -1;  // guarded by fd_mutex_
  mutable std::string cause_;     // guarded by fd_mutex_
};

}  // namespace deepio::detail::gpu
