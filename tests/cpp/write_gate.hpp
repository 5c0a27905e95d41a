// A test's fault hook (detail::set_fault_hook) that plays a drive busy with writes: it holds the
// completions of writes to files whose names contain "/w-" (kFaultHold: each request keeps its
// queue slot) until released, a token per write, or opened; counts the writes seen before the
// first read of an "/r-" file came back; and holds the completions of reads of "/rh-" files
// (a read in flight) until reads_open(). test_read_priority.cpp and test_device_reads.cpp.
#pragma once

#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "common/support.hpp"

namespace deepio::test {

class WriteGate {
 public:
  std::optional<std::int64_t> operator()(const detail::FaultSite& s) {
    if (s.point != detail::FaultPoint::Write && s.point != detail::FaultPoint::Read) return std::nullopt;
    const std::string path = fd_path(s.fd);
    std::lock_guard lock(mutex_);
    if (s.point == detail::FaultPoint::Read) {
      if (path.find("/rh-") != std::string::npos && !reads_open_) {
        reads_held_ = true;
        return detail::kFaultHold;
      }
      if (path.find("/r-") != std::string::npos && writes_before_read_ < 0) {
        writes_before_read_ = static_cast<int>(seen_.size());
      }
      return std::nullopt;
    }
    if (path.find("/w-") == std::string::npos) return std::nullopt;
    const auto key = std::make_pair(path, s.offset);
    seen_.insert(key);
    if (open_ || tokens_ > 0) {
      if (!open_ && held_.contains(key)) --tokens_;
      held_.erase(key);
      return std::nullopt;
    }
    held_.insert(key);
    return detail::kFaultHold;
  }
  void release(int n) {
    std::lock_guard lock(mutex_);
    tokens_ += n;
  }
  /// Nothing is held from now on, writes or reads.
  void open() {
    std::lock_guard lock(mutex_);
    open_ = reads_open_ = true;
  }
  void reads_open() {
    std::lock_guard lock(mutex_);
    reads_open_ = true;
  }
  std::size_t held() {
    std::lock_guard lock(mutex_);
    return held_.size();
  }
  /// Release tokens not yet spent on a held write.
  int tokens() {
    std::lock_guard lock(mutex_);
    return tokens_;
  }
  /// A read of an "/rh-" file was held.
  bool reads_held() {
    std::lock_guard lock(mutex_);
    return reads_held_;
  }
  // Write requests that had come back (held or not) when the first read came back; -1 before.
  int writes_before_read() {
    std::lock_guard lock(mutex_);
    return writes_before_read_;
  }
  struct OpenAtExit {
    WriteGate& gate;
    ~OpenAtExit() { gate.open(); }
  };

 private:
  std::mutex mutex_;
  std::set<std::pair<std::string, std::uint64_t>> held_, seen_;
  int writes_before_read_ = -1;
  int tokens_ = 0;
  bool open_ = false, reads_open_ = false, reads_held_ = false;
};

}  // namespace deepio::test
