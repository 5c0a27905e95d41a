// Thin wrappers over the system calls the engine uses: EINTR retried, short counts finished,
// failures returned as Status with errno and context. No exceptions below this line.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "platform/fd.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

/// open(2) with EINTR retried and the fault hook consulted. Never returns an invalid fd with
/// an ok status.
Status open_file(const std::string& path, int flags, mode_t mode, UniqueFd* out);

/// A new open file description of the file `fd` refers to, with `flags` (no O_CREAT or
/// O_TRUNC: the file exists), through /proc/self/fd/<fd>: the same inode whatever became of
/// its path since (renamed over, unlinked), and none of fd's status flags (O_DIRECT), which a
/// dup() would share. Used for the descriptor without O_DIRECT that an O_DIRECT descriptor's
/// unaligned pieces go through: a file is never opened by its path twice, so an atomic
/// replace (rename over the path) between the two opens cannot mix two files' bytes. The
/// fault hook is asked as for an Open, with `name` (the file's path as the caller gave it).
/// Errors carry errno and `name`; ENOENT then means /proc is not mounted.
Status reopen_file(int fd, int flags, const std::string& name, UniqueFd* out);

/// pread(2)/pwrite(2) until all n bytes moved. A read that hits end of file first fails with
/// ENODATA; a write that makes no progress fails with EIO. EINTR/EAGAIN are retried.
Status pread_full(int fd, void* buf, std::size_t n, std::uint64_t offset, const std::string& path);
Status pwrite_full(int fd, const void* buf, std::size_t n, std::uint64_t offset, const std::string& path);

/// What a file descriptor needs for O_DIRECT and what it holds now.
struct FileFacts {
  std::uint64_t size = 0;
  std::uint32_t dio_mem_align = 0;     ///< 0 when unknown
  std::uint32_t dio_offset_align = 0;  ///< 0 when unknown (or O_DIRECT unsupported)
  bool from_statx = false;
  bool regular = false;
  bool block_device = false;  ///< size is the device's size (BLKGETSIZE64)
  std::uint64_t dev = 0;      ///< the device holding the file (st_dev, as makedev() makes it)
  /// Whether `size` bounds what can be read (a regular file or a block device).
  [[nodiscard]] bool sized() const noexcept { return regular || block_device; }
};
Status file_facts(int fd, const std::string& path, FileFacts* out);

/// The name of the file system holding fd ("ext4", "tmpfs", ... or "0x<magic>").
std::string filesystem_name(int fd);

/// The one table of file-system names: statfs(2)'s f_type -> "ext4", "xfs", "tmpfs", "ramfs",
/// "overlayfs", ... or "0x<magic>" for a type not in it. filesystem_name() and the `deepio`
/// command (tools/lib/system.cpp, which links deepio_platform for this alone) both use it, so
/// what `deepio info` and DirectIoInfo::filesystem say cannot drift apart. Pure, thread-safe.
std::string filesystem_type_name(std::uint64_t f_type);

/// Grows the process's descriptor table ahead of need once an opened descriptor `fd` reaches
/// half of what was last reserved. The kernel grows the table by doubling, and in a
/// multi-threaded process each growth waits for an RCU grace period (expand_fdtable calls
/// synchronize_rcu): opening 8192 files one after another costs eight of them, about 60 ms
/// on our machines. Reserving 16x ahead, at least 4096 and within RLIMIT_NOFILE, makes that two.
/// Best effort and thread-safe; it opens and closes one descriptor and never fails.
void reserve_descriptors(int fd) noexcept;

std::size_t page_size() noexcept;

/// strerror_r as a std::string.
std::string errno_string(int errnum);

}  // namespace deepio::detail
