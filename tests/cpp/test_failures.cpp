// Failure paths with real failures where the system can produce them: missing files,
// permissions, end of file (of a file and of a loop block device), RLIMIT_FSIZE, a file system
// that fills up, bad descriptors, and io_uring's teardown with a request still in the kernel.
// The failures only the test-only fault hook can produce (EIO, short transfers, EAGAIN, EINVAL
// from O_DIRECT, reap and submit errors): test_failures_injected.cpp.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include "backends/factory.hpp"
#include "platform/fault.hpp"
#include "common/support.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::slurp;

using Failures = test::BackendTest;

using test::in_child;

TEST_P(Failures, MissingFileIsENOENTWithPath) {
  Handle h(opts());
  std::vector<std::byte> buf(100);
  const std::string path = dir_.file("nope");
  try {
    h.async_pread(buf.data(), buf.size(), path);
    FAIL() << "expected ENOENT";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOENT);
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.wait(), 0u);
}

TEST_P(Failures, WriteIntoMissingFolderIsENOENT) {
  Handle h(opts());
  std::vector<std::byte> buf(100);
  try {
    h.sync_pwrite(buf.data(), buf.size(), dir_.file("no/such/dir/f"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOENT);
  }
}

TEST_P(Failures, ReadPastEndOfFileNamesSizes) {
  const std::string path = dir_.file("short");
  test::put(path, pattern(1000, 1));
  Handle h(opts());
  std::vector<std::byte> buf(1001);
  try {
    h.async_pread(buf.data(), buf.size(), path);
    FAIL() << "expected an end-of-file error";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA);
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.nbytes(), 1001u);
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what();
  }
  // Offset past the end too, and exactly to the end is fine.
  EXPECT_THROW(h.async_pread(buf.data(), 1, path, 1000), Error);
  EXPECT_EQ(h.sync_pread(buf.data(), 1000, path), 1u);
  EXPECT_EQ(h.sync_pread(buf.data(), 0, path, 1000), 1u);
}

TEST_P(Failures, UnwritableFolderIsEACCESForAnUnprivilegedUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to an unprivileged user";
  std::filesystem::permissions(dir_.path(), std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                                std::filesystem::perms::group_exec |
                                                std::filesystem::perms::others_read |
                                                std::filesystem::perms::others_exec);
  // Parents must be traversable by nobody; the build tree usually is.
  const std::string path = dir_.file("denied");
  const BackendKind kind = GetParam();
  const int code = in_child([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 90;
    Handle h({.backend = kind});
    std::vector<std::byte> buf(10);
    try {
      h.sync_pwrite(buf.data(), buf.size(), path);
    } catch (const Error& e) {
      return e.errnum() == EACCES && e.path() == path ? 0 : 91;
    }
    return 92;
  });
  if (code == 91 || code == 101) GTEST_SKIP() << "folder not reachable by an unprivileged user here";
  EXPECT_EQ(code, 0);
}

TEST_P(Failures, FileSizeLimitGivesEFBIGAndKeepsWhatFits) {
  const std::string path = dir_.file("big");
  const BackendKind kind = GetParam();
  const int code = in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit rl{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 90;
    Handle h({.block_size = 256 << 10, .queue_depth = 4, .backend = kind});
    auto data = pattern(4 << 20, 3);
    try {
      h.sync_pwrite(data.data(), data.size(), path);
    } catch (const Error& e) {
      if (e.errnum() != EFBIG) return 91;
      if (e.path() != path) return 92;
      return 0;
    }
    return 93;
  });
  EXPECT_EQ(code, 0);
  auto file = slurp(path);
  EXPECT_LE(file.size(), 1u << 20);
  const auto data = pattern(4 << 20, 3);
  EXPECT_TRUE(std::equal(file.begin(), file.end(), data.begin())) << "what was written is right";
}

TEST_P(Failures, ExtendingDirectWriteIsPreallocatedBeforeItsBlocksGo) {
  const std::string path = dir_.file("fresh");
  Handle h(opts({.block_size = 1 << 20, .queue_depth = 8}));
  UniqueLockedBuffer buf(4 << 20);
  const auto data = pattern(buf.size(), 11);
  std::memcpy(buf.data(), data.data(), data.size());
  // Hold every request before it reaches the kernel: what the file looks like then is the
  // submission's own doing.
  std::atomic<bool> go{false};
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Submit) {
      while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
  });
  auto write = h.async_pwrite(buf.data(), buf.size(), path, 512 << 10);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  go = true;
  EXPECT_TRUE(write.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(h.wait(), 1u);
  detail::set_fault_hook({});
  const HandleStats stats = h.stats();
  if (stats.bytes_direct + stats.bytes_bounced == 0) GTEST_SKIP() << "this folder takes no O_DIRECT";
  {
    const int probe = ::open(dir_.file("probe").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(probe, 0);
    const bool can = ::fallocate(probe, 0, 0, 4096) == 0;
    ::close(probe);
    if (!can) GTEST_SKIP() << "this file system refuses fallocate";
  }
  EXPECT_EQ(stats.preallocated, 1u);
  EXPECT_EQ(st.st_size, (512 << 10) + (4 << 20)) << "allocated up to the write's end before any block went";
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 4u << 20);
  auto file = slurp(path);
  ASSERT_EQ(file.size(), (512u << 10) + (4u << 20)) << "exact extent";
  EXPECT_TRUE(std::all_of(file.begin(), file.begin() + (512 << 10), [](std::byte b) { return b == std::byte{0}; }));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), file.begin() + (512 << 10)));

  // An overwrite inside the file, and a single-block extension, are not preallocated.
  h.sync_pwrite(buf.data(), 2 << 20, path);
  h.sync_pwrite(buf.data(), 1 << 20, path, 5 << 20);
  EXPECT_EQ(h.stats().preallocated, 1u);
  EXPECT_EQ(slurp(path).size(), 6u << 20) << "never truncated, grown by the write only";
}

// A real file system that fills up: an 8 MiB ext4 image on a loop device.
class SmallFilesystem {
 public:
  explicit SmallFilesystem(const std::filesystem::path& where) : image_(where / "fs.img"), mount_(where / "mnt") {
    std::filesystem::create_directories(mount_);
    const std::string cmd = "truncate -s 8M " + image_.string() + " && mkfs.ext4 -q -F " + image_.string() +
                            " >/dev/null 2>&1 && mount -o loop " + image_.string() + " " + mount_.string() +
                            " 2>/dev/null";
    ok_ = ::geteuid() == 0 && std::system(cmd.c_str()) == 0;
  }
  ~SmallFilesystem() {
    if (ok_) ::umount2(mount_.c_str(), MNT_DETACH);
  }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string file(const std::string& name) const { return (mount_ / name).string(); }

 private:
  std::filesystem::path image_, mount_;
  bool ok_ = false;
};

TEST_P(Failures, FullFilesystemGivesENOSPC) {
  SmallFilesystem fs(dir_.path());
  if (!fs.ok()) GTEST_SKIP() << "needs root, mkfs.ext4 and loop devices to make a small file system";
  Handle h(opts({.block_size = 1 << 20, .queue_depth = 4}));
  UniqueLockedBuffer buf(16 << 20);
  std::memset(buf.data(), 1, buf.size());
  try {
    h.sync_pwrite(buf.data(), buf.size(), fs.file("fill"));
    FAIL() << "16 MiB cannot fit in 8 MiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOSPC) << e.what();
    EXPECT_EQ(e.path(), fs.file("fill"));
  }
  // The handle still works afterwards on the same full file system for a small read.
  std::vector<std::byte> small(100);
  EXPECT_EQ(h.sync_pread(small.data(), small.size(), fs.file("fill")), 1u);
}

// A block device: a 1 MiB image attached to a loop device (root only).
class LoopDevice {
 public:
  explicit LoopDevice(const std::filesystem::path& image) {
    if (::geteuid() != 0) return;
    const std::string cmd = "losetup --find --show " + image.string() + " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return;
    char line[256] = {};
    if (std::fgets(line, sizeof line, p) != nullptr) device_ = std::string(line, std::strcspn(line, "\n"));
    ::pclose(p);
  }
  ~LoopDevice() {
    if (!device_.empty()) (void)std::system(("losetup -d " + device_ + " 2>/dev/null").c_str());
  }
  LoopDevice(const LoopDevice&) = delete;
  LoopDevice& operator=(const LoopDevice&) = delete;
  [[nodiscard]] const std::string& device() const { return device_; }

 private:
  std::string device_;
};

TEST_P(Failures, ReadPastTheEndOfABlockDeviceIsRefusedAtSubmission) {
  const std::string image = dir_.file("disk.img");
  const auto data = pattern(1 << 20, 21);
  test::put(image, data);
  LoopDevice loop(image);
  if (loop.device().empty()) GTEST_SKIP() << "needs root and a free loop device";
  Handle h(opts({.block_size = 256 << 10}));
  UniqueLockedBuffer buf((1 << 20) + 4096);
  try {
    h.async_pread(buf.data(), buf.size(), loop.device());
    FAIL() << "read past the end of the device";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA) << e.what();
    EXPECT_NE(std::string(e.what()).find("1048576"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), loop.device());
  }
  EXPECT_EQ(h.wait(), 0u);
  // Within the device, the bytes are the image's.
  EXPECT_EQ(h.sync_pread(buf.bytes() + 4096, (1 << 20) - 8192, loop.device(), 4096), 1u);
  EXPECT_TRUE(std::equal(data.begin() + 4096, data.end() - 4096, buf.bytes() + 4096));
}

TEST_P(Failures, DescriptorErrors) {
  Handle h(opts());
  std::vector<std::byte> buf(10);
  try {
    h.async_pread(buf.data(), buf.size(), 987654);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EBADF);
  }
  EXPECT_THROW(h.async_pwrite(nullptr, 10, dir_.file("n")), Error);
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Failures);

// Closing an io_uring ring does not wait for its requests: the kernel finishes them later,
// into memory the worker may have freed. A read of an empty pipe stays in the kernel until
// someone writes; the backend destroyed meanwhile must wait for it, not return at once.
TEST(BackendTeardown, IoUringWaitsForWhatTheKernelHoldsBeforeClosingItsRing) {
  detail::Status why;
  auto backend = detail::make_backend(BackendKind::IoUring, 4, &why, false);
  if (!backend) GTEST_SKIP() << "io_uring: " << why.message;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  std::vector<char> buf(16, 0);
  detail::Request r;
  r.fd = p[0];
  r.buf = buf.data();
  r.len = 16;
  r.offset = ~std::uint64_t{0};  // the current position: a pipe has no offsets
  r.tag = 7;
  ASSERT_EQ(backend->submit({&r, 1}), 1);
  backend->flush();  // the kernel takes it now, and holds it: the pipe is empty
  std::atomic<bool> written{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    written = true;
    EXPECT_EQ(::write(p[1], "0123456789abcdef", 16), 16);
  });
  backend.reset();
  EXPECT_TRUE(written.load()) << "the ring was closed with a read still in the kernel";
  writer.join();
  EXPECT_EQ(std::string(buf.data(), buf.size()), "0123456789abcdef");
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace deepio
