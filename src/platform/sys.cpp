#include "platform/sys.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <linux/stat.h>

#include "platform/fault.hpp"

namespace deepio::detail {

std::string errno_string(int errnum) {
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* msg = ::strerror_r(errnum, buf, sizeof buf);
  return msg;
}

std::size_t page_size() noexcept {
  static const std::size_t size = [] {
    const long v = ::sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<std::size_t>(v) : std::size_t{4096};
  }();
  return size;
}

void reserve_descriptors(int fd) noexcept {
  static std::atomic<long> reserved{64};  // the table every process starts with
  long have = reserved.load(std::memory_order_relaxed);
  if (fd < have / 2) return;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const long limit = rl.rlim_cur == RLIM_INFINITY ? (1L << 20) : static_cast<long>(rl.rlim_cur);
  const long want = std::min(limit, std::max(4096L, 16L * fd));
  if (want <= have || !reserved.compare_exchange_strong(have, want)) return;  // done, or another thread does it
  // F_DUPFD takes the lowest free descriptor >= want - 1, which makes the kernel size the
  // table for it; closing it keeps the table. Failure (EMFILE, EINVAL) only means no reservation.
  const int probe = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(want - 1));
  if (probe >= 0) ::close(probe);
}

Status open_file(const std::string& path, int flags, mode_t mode, UniqueFd* out) {
  if (auto injected = consult_fault_hook({FaultPoint::Open, path.c_str(), -1, 0, 0, 0, flags});
      injected && *injected < 0) {
    return Status::failure(static_cast<int>(-*injected), "cannot open", path);
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::failure(errno, "cannot open", path);
  out->reset(fd);
  return Status::success();
}

Status reopen_file(int fd, int flags, const std::string& name, UniqueFd* out) {
  flags &= ~(O_CREAT | O_TRUNC | O_EXCL);
  if (auto injected = consult_fault_hook({FaultPoint::Open, name.c_str(), fd, 0, 0, 0, flags});
      injected && *injected < 0) {
    return Status::failure(static_cast<int>(-*injected), "cannot reopen (through /proc/self/fd) without O_DIRECT",
                           name);
  }
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  int r;
  do {
    r = ::open(link.c_str(), flags | O_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    const int err = errno;
    return Status::failure(err,
                           "cannot reopen descriptor " + std::to_string(fd) + " without O_DIRECT through " + link +
                               (err == ENOENT ? " (is /proc mounted?)" : ""),
                           name);
  }
  out->reset(r);
  return Status::success();
}

Status pread_full(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::failure(errno, "read failed", path, offset + done, n - done);
    }
    if (r == 0) {
      return Status::failure(ENODATA, "unexpected end of file", path, offset + done, n - done);
    }
    done += static_cast<std::size_t>(r);
  }
  return Status::success();
}

Status pwrite_full(int fd, const void* buf, std::size_t n, std::uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::failure(errno, "write failed", path, offset + done, n - done);
    }
    if (r == 0) return Status::failure(EIO, "write made no progress", path, offset + done, n - done);
    done += static_cast<std::size_t>(r);
  }
  return Status::success();
}

Status file_facts(int fd, const std::string& path, FileFacts* out) {
  struct statx stx {};
  const long r = ::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE | STATX_DIOALIGN, &stx);
  mode_t mode = 0;
  // A file system may leave out fields it was asked for: size and type are needed, so
  // without them fstat() answers (the alignment stays optional).
  constexpr unsigned kNeeded = STATX_TYPE | STATX_SIZE;
  if (r == 0 && (stx.stx_mask & kNeeded) == kNeeded) {
    out->size = stx.stx_size;
    out->dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    mode = stx.stx_mode;
  } else {
    if (r != 0 && errno != ENOSYS) return Status::failure(errno, "cannot stat", path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::failure(errno, "cannot stat", path);
    out->size = static_cast<std::uint64_t>(st.st_size);
    out->dev = static_cast<std::uint64_t>(st.st_dev);
    mode = st.st_mode;
  }
  if (r == 0 && (stx.stx_mask & STATX_DIOALIGN) != 0U) {
    out->from_statx = true;
    out->dio_mem_align = stx.stx_dio_mem_align;
    out->dio_offset_align = stx.stx_dio_offset_align;
  }
  out->regular = S_ISREG(mode);
  if (S_ISBLK(mode)) {
    // stat reports no size for a block device; the device knows it.
    std::uint64_t bytes = 0;
    if (::ioctl(fd, BLKGETSIZE64, &bytes) == 0) {
      out->size = bytes;
      out->block_device = true;
    }
  }
  return Status::success();
}

std::string filesystem_name(int fd) {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) return "unknown";
  return filesystem_type_name(static_cast<std::uint64_t>(sfs.f_type));
}

std::string filesystem_type_name(std::uint64_t f_type) {
  // f_type is a signed word on some ABIs: a magic with the top bit set (0xf2f52010) may come
  // back sign-extended, so only the low 32 bits are compared (every magic fits in them).
  static constexpr struct {
    std::uint32_t magic;
    const char* name;
  } kNames[] = {
      {EXT4_SUPER_MAGIC, "ext4"},  // ext2/3/4 share the magic
      {XFS_SUPER_MAGIC, "xfs"},
      {BTRFS_SUPER_MAGIC, "btrfs"},
      {TMPFS_MAGIC, "tmpfs"},
      {RAMFS_MAGIC, "ramfs"},
      {0x65735546U, "fuse"},
      {NFS_SUPER_MAGIC, "nfs"},
      {OVERLAYFS_SUPER_MAGIC, "overlayfs"},
      {0x2fc12fc1U, "zfs"},
      {F2FS_SUPER_MAGIC, "f2fs"},
      {V9FS_MAGIC, "9p"},
      {0x0bd00bd0U, "lustre"},
      {0x47504653U, "gpfs"},
      {SQUASHFS_MAGIC, "squashfs"},
      {MSDOS_SUPER_MAGIC, "vfat"},
  };
  const auto magic = static_cast<std::uint32_t>(f_type & 0xffffffffU);
  for (const auto& n : kNames) {
    if (n.magic == magic) return n.name;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(magic));
  return buf;
}

}  // namespace deepio::detail
