// No device waits behind another, with requests really held in the kernel: a loop device over
// a file in /dev/shm, throttled by the block layer (cgroup blkio, v1 or v2) to 512 bytes/s, so
// its 64 KiB direct reads sit in the kernel until the test lifts the limit. While they do, a
// read of a file on another device (tmpfs) must complete, on every backend, with
// overlap_events on and off, whether the slow device's op fills the queue or not. Nothing is
// decided by a clock: the slow op must still be pending when the other is done (the bounds
// only end a broken run). Needs root, loop devices and blk-throttle; skips without them.
#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/support.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::eventually;
using test::pattern;

constexpr std::size_t kBlock = 64 << 10;
constexpr std::size_t kImageBytes = 4 << 20;

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.flush();
  return static_cast<bool>(f);
}

// A loop device over a file in /dev/shm holding `data`, reached through a device node made
// in `folder` (a node in /dev would be on devtmpfs, which the engine treats as memory), and
// the cgroup file that throttles it. ok() false (with why()) where any of it is missing.
class ThrottledLoop {
 public:
  ThrottledLoop(const std::string& folder, const std::vector<std::byte>& data) {
    if (::geteuid() != 0) {
      why_ = "needs root";
      return;
    }
    image_ = "/dev/shm/deepio-slowdev-" + std::to_string(::getpid()) + ".img";
    test::put(image_, data);
    const int control = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (control < 0) {
      why_ = "no /dev/loop-control";
      return;
    }
    const int backing = ::open(image_.c_str(), O_RDWR | O_CLOEXEC);
    for (int attempt = 0; attempt < 10 && loop_fd_ < 0; ++attempt) {  // another process may race
      const int n = ::ioctl(control, LOOP_CTL_GET_FREE);
      if (n < 0) break;
      const std::string dev = "/dev/loop" + std::to_string(n);
      const int fd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;
      if (::ioctl(fd, LOOP_SET_FD, backing) == 0) {
        loop_fd_ = fd;
        number_ = n;
      } else {
        ::close(fd);
      }
    }
    ::close(backing);
    ::close(control);
    if (loop_fd_ < 0) {
      why_ = "cannot attach a loop device";
      return;
    }
    node_ = folder + "/slow-dev";
    if (::mknod(node_.c_str(), S_IFBLK | 0600, ::makedev(7, static_cast<unsigned>(number_))) != 0) {
      why_ = "cannot make a device node in the test folder";
      return;
    }
    const std::string mm = "7:" + std::to_string(number_);
    const std::string v1 = "/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device";
    if (::access(v1.c_str(), W_OK) == 0) {
      throttle_file_ = v1;
      on_ = mm + " 512";
      off_ = mm + " 0";
    } else if (const std::string v2 = cgroup2_io_max(); !v2.empty()) {
      throttle_file_ = v2;
      on_ = mm + " rbps=512";
      off_ = mm + " rbps=max";
    } else {
      why_ = "no blk-throttle (cgroup v1 blkio or a v2 io.max)";
    }
  }
  ~ThrottledLoop() {
    release();
    if (!node_.empty()) ::unlink(node_.c_str());
    if (loop_fd_ >= 0) {
      ::ioctl(loop_fd_, LOOP_CLR_FD, 0);
      ::close(loop_fd_);
    }
    if (!image_.empty()) ::unlink(image_.c_str());
  }
  ThrottledLoop(const ThrottledLoop&) = delete;
  ThrottledLoop& operator=(const ThrottledLoop&) = delete;

  [[nodiscard]] bool ok() const { return why_.empty(); }
  [[nodiscard]] const std::string& why() const { return why_; }
  [[nodiscard]] const std::string& node() const { return node_; }
  bool throttle() { return throttled_ = write_file(throttle_file_, on_); }
  void release() {
    if (throttled_) write_file(throttle_file_, off_);
    throttled_ = false;
  }

 private:
  // This process's cgroup v2 io.max, where the io controller is on for it.
  static std::string cgroup2_io_max() {
    std::ifstream self("/proc/self/cgroup");
    std::string line, path;
    while (std::getline(self, line)) {
      if (line.starts_with("0::")) path = line.substr(3);
    }
    std::ifstream mounts("/proc/mounts");
    while (std::getline(mounts, line)) {
      std::istringstream in(line);
      std::string source, where, type;
      in >> source >> where >> type;
      if (type != "cgroup2") continue;
      const std::string f = where + path + "/io.max";
      if (::access(f.c_str(), W_OK) == 0) return f;
    }
    return {};
  }

  std::string why_, image_, node_, throttle_file_, on_, off_;
  int loop_fd_ = -1;
  int number_ = -1;
  bool throttled_ = false;
};

struct Case {
  BackendKind backend;
  bool overlap;
  std::size_t slow_bytes;  // 2 requests: the queue has room; 16 on a depth of 8: it is full
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << to_string(c.backend) << (c.overlap ? " overlap_events" : " batches") << ", slow op of " << c.slow_bytes
      << " bytes";
}

class SlowDevice : public testing::TestWithParam<Case> {};

TEST_P(SlowDevice, AnotherDevicesReadCompletesWhileItsRequestsAreInTheKernel) {
  const Case c = GetParam();
  std::string why;
  if (!test::backend_available(c.backend, &why)) GTEST_SKIP() << to_string(c.backend) << ": " << why;
  test::TempDir dir;
  const auto slow_data = pattern(kImageBytes, 21);
  ThrottledLoop loop(dir.path().string(), slow_data);
  if (!loop.ok()) GTEST_SKIP() << loop.why();
  const std::string fast = "/dev/shm/deepio-slowdev-" + std::to_string(::getpid()) + "-fast";
  constexpr std::size_t kFastBytes = 4 * kBlock;
  test::put(fast, pattern(kFastBytes, 22));

  Handle h({.block_size = kBlock, .queue_depth = 8, .overlap_events = c.overlap, .backend = c.backend});
  std::atomic<int> slow_submits{0};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Submit && test::fd_path(s.fd).ends_with("/slow-dev")) ++slow_submits;
    return std::nullopt;
  });
  ASSERT_TRUE(loop.throttle());
  test::OffsetBuffer a(c.slow_bytes, 0), b(kFastBytes, 0);
  Future slow = h.async_pread(a.data(), c.slow_bytes, loop.node());
  ASSERT_TRUE(eventually([&] { return slow_submits.load() > 0; }));
  // The worker goes on to wait for the slow device; the sleep only gives it the time to get
  // there (without it a broken engine could pass, never the other way round).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Future other = h.async_pread(b.data(), kFastBytes, fast);
  const bool overtook = other.wait_for(std::chrono::seconds(10));
  EXPECT_TRUE(overtook) << "the read on tmpfs waited behind the throttled device";
  EXPECT_FALSE(slow.done()) << "the throttled device's requests are still in the kernel";
  loop.release();
  ASSERT_TRUE(slow.wait_for(std::chrono::seconds(60)));
  ASSERT_TRUE(other.wait_for(std::chrono::seconds(60)));
  detail::set_fault_hook({});
  slow.get();
  other.get();
  EXPECT_EQ(a.copy(), std::vector<std::byte>(slow_data.begin(), slow_data.begin() + static_cast<long>(c.slow_bytes)));
  EXPECT_EQ(b.copy(), pattern(kFastBytes, 22));
  ::unlink(fast.c_str());
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(to_string(c.backend)) + (c.overlap ? "_overlap" : "_batch") +
         (c.slow_bytes > 8 * kBlock ? "_queue_full" : "_room_left");
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (BackendKind k : {BackendKind::IoUring, BackendKind::Libaio, BackendKind::Threads}) {
    for (bool overlap : {true, false}) {
      for (std::size_t bytes : {2 * kBlock, 16 * kBlock}) cases.push_back({k, overlap, bytes});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Backends, SlowDevice, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace deepio
