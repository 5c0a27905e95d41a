// Device (CUDA) pages of one batch thread (docs/kv.md "CUDA memory"); see the class comment.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepio/kv.hpp"
#include "deepio/memory.hpp"
#include "engine/device.hpp"

namespace deepio::kv::internal {
namespace detail = deepio::detail;

/// Device (CUDA) pages of one batch thread: the CRC-32C needs host bytes, so a device page
/// moves through one of `count` page-sized buffers of one page-locked arena (allocate_locked,
/// made on the first device page), copied by the engine's own DeviceStager for the device (the
/// CudaStager its workers use: the arena registered with cuMemHostRegister, device-to-host
/// copies synchronous, host-to-device copies queued on its non-blocking stream with an event
/// per buffer). Owned and used by one batch thread (a store's own thread, which may keep a
/// context current, as the engine's workers do). A buffer is handed out by acquire() and
/// comes back by release(), after its disk I/O settled and (gets) its copy finished (wait()).
class DeviceScratch {
 public:
  DeviceScratch(const detail::DeviceSupport* support, std::size_t count, std::size_t buf_bytes)
      : support_(support), count_(std::max<std::size_t>(1, count)), buf_bytes_(buf_bytes), busy_(count_, false) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  /// The device holding p, or -1 (host memory, managed memory, or no driver in the process).
  int device_of(const void* p) const { return support_->classify ? support_->classify(p) : -1; }
  /// Whether any segment of the page is device memory.
  bool on_device(const std::vector<Segment>& page) const {
    for (const Segment& s : page) {
      if (s.nbytes > 0 && device_of(s.data) >= 0) return true;
    }
    return false;
  }
  /// A free buffer, or -1 when all are in use.
  int acquire() {
    for (std::size_t k = 0; k < count_; ++k) {
      if (!busy_[k]) {
        busy_[k] = true;
        return static_cast<int>(k);
      }
    }
    return -1;
  }
  void release(int b) { busy_.at(static_cast<std::size_t>(b)) = false; }
  /// The buffer's memory; valid after a successful to_host()/prepare().
  unsigned char* data(int b) const {
    return static_cast<unsigned char*>(arena_.data()) + static_cast<std::size_t>(b) * buf_bytes_;
  }

  /// Makes the arena (first call); false + *why when it cannot be made.
  bool prepare(std::string* why) {
    if (arena_.data() != nullptr) return true;
    try {
      arena_ = UniqueLockedBuffer(count_ * buf_bytes_);
    } catch (const std::exception& e) {
      *why = std::string("kv: the host buffers for device pages: ") + e.what();
      return false;
    }
    return true;
  }
  /// Copies the page's segments, in order, into buffer b (device ones by the stager, host ones
  /// by memcpy). false + *why (the driver call and its error) on failure.
  bool to_host(int b, const std::vector<Segment>& page, std::string* why) {
    if (!prepare(why)) return false;
    std::size_t off = 0;
    for (const Segment& s : page) {
      if (s.nbytes == 0) continue;
      const int dev = device_of(s.data);
      if (dev < 0) {
        std::memcpy(data(b) + off, s.data, s.nbytes);
      } else {
        detail::DeviceStager* st = stager(dev, why);
        if (st == nullptr) return false;
        if (detail::Status r = st->to_staging(b, data(b) + off, static_cast<const std::byte*>(s.data), s.nbytes);
            !r.ok()) {
          *why = r.message;
          return false;
        }
      }
      off += s.nbytes;
    }
    return true;
  }
  /// Starts copying buffer b into the page's segments (host ones by memcpy, at once); wait(b)
  /// finishes them. false + *why when a copy cannot start (those started are still waited for).
  bool to_device(int b, const std::vector<Segment>& page, std::string* why) {
    std::size_t off = 0;
    for (const Segment& s : page) {
      if (s.nbytes == 0) continue;
      const int dev = device_of(s.data);
      if (dev < 0) {
        std::memcpy(s.data, data(b) + off, s.nbytes);
      } else {
        detail::DeviceStager* st = stager(dev, why);
        if (st == nullptr) return false;
        if (detail::Status r = st->from_staging(b, static_cast<std::byte*>(s.data), data(b) + off, s.nbytes); !r.ok()) {
          *why = r.message;
          return false;
        }
      }
      off += s.nbytes;
    }
    return true;
  }
  /// Every later copy to or from `dev` runs after the fence's work (the stager's stream waits
  /// for its event on the device). false + *why when that cannot be arranged.
  bool order_after(int dev, const detail::DeviceFence& fence, std::string* why) {
    if (!prepare(why)) return false;
    detail::DeviceStager* st = stager(dev, why);
    if (st == nullptr) return false;
    if (detail::Status r = st->order_after(fence); !r.ok()) {
      *why = r.message;
      return false;
    }
    return true;
  }
  /// Waits for buffer b's copies on every device; false + *why when one failed.
  bool wait(int b, std::string* why) {
    bool good = true;
    for (auto& [dev, st] : stagers_) {
      if (detail::Status r = st->wait(b); !r.ok() && good) {
        *why = r.message;
        good = false;
      }
    }
    return good;
  }

 private:
  detail::DeviceStager* stager(int dev, std::string* why) {
    auto it = stagers_.find(dev);
    if (it != stagers_.end()) return it->second.get();
    detail::Status st;
    std::unique_ptr<detail::DeviceStager> made;
    if (support_->make_stager) made = support_->make_stager(dev, count_, &st);
    if (made == nullptr) {
      *why = "kv: no copies for device " + std::to_string(dev) + ": " +
             (st.message.empty() ? std::string("no driver") : st.message);
      return nullptr;
    }
    if (detail::Status r = made->register_staging(arena_.data(), arena_.size()); !r.ok()) {
      *why = r.message;
      return nullptr;
    }
    return stagers_.emplace(dev, std::move(made)).first->second.get();
  }

  const detail::DeviceSupport* support_;
  std::size_t count_;
  std::size_t buf_bytes_;
  std::vector<bool> busy_;
  UniqueLockedBuffer arena_;  // before stagers_: they unregister it when destroyed
  std::map<int, std::unique_ptr<detail::DeviceStager>> stagers_;
};

}  // namespace deepio::kv::internal
