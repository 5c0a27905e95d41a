// Opening files for the engine: O_DIRECT unless the file system refuses it (then through the
// page cache, counted in direct_refused; an error with direct_io=on), with descriptor
// back-pressure (an open that finds the process out of descriptors waits for this handle's
// own ops to release some), and what direct I/O needs to know of the file (Opened). Also a
// caller's descriptor inspected the same way (open_op). Everything throws deepio::Error on
// failure, having opened nothing that outlives the call. Thread safety: called from the
// submitting thread or an opener thread; memory_devices_ is guarded by its mutex, signal_ by
// its own.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <limits>

#include "engine/engine_parts.hpp"
#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
// Files whose every io_uring read or write the kernel (6.x) hands to an io-wq worker thread
// instead of running it at submission (tmpfs and ramfs: no FMODE_NOWAIT): two context
// switches per request, which at 4 KiB cost more than the copy itself (a batch of 4 KiB
// reads from /dev/shm went 2x faster with half the CPU through pread in the worker). Only
// io_uring workers are told; the other backends are synchronous or do the same themselves.
bool memory_file_system(int fd) noexcept {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) return false;
  return sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC;
}
}  // namespace

bool Engine::in_memory(int fd, std::uint64_t dev) {
  if (kind_ != BackendKind::IoUring) return false;
  {
    std::lock_guard lock(memory_devices_mutex_);
    for (const auto& [d, m] : memory_devices_) {
      if (d == dev) return m;
    }
  }
  const bool m = memory_file_system(fd);
  std::lock_guard lock(memory_devices_mutex_);
  if (memory_devices_.size() < 64) memory_devices_.emplace_back(dev, m);
  return m;
}

Status Engine::open_with_backpressure(const std::string& path, int flags, UniqueFd* fd) {
  return with_backpressure([&] { return open_file(path, flags, 0666, fd); }, fd);
}

Status Engine::reopen_with_backpressure(int source, int flags, const std::string& name, UniqueFd* fd) {
  return with_backpressure([&] { return reopen_file(source, flags, name, fd); }, fd);
}

Status Engine::with_backpressure(const std::function<Status()>& open, UniqueFd* fd) {
  for (;;) {
    Status s = open();
    if (s.ok()) reserve_descriptors(fd->get());
    if (s.ok() || (s.errnum != EMFILE && s.errnum != ENFILE)) return s;
    // Out of descriptors: if this handle's own ops hold some, wait for one to finish.
    std::unique_lock lock(signal_.mutex);
    signal_.waiters.fetch_add(1);  // before reading finished (CompletionSignal's protocol)
    const std::uint64_t seen = signal_.finished.load();
    const bool pending = submitted_.load() > seen;
    if (pending) signal_.cv.wait(lock, [&] { return signal_.finished.load() != seen; });
    signal_.waiters.fetch_sub(1);
    if (!pending) return s;
  }
}

Status Engine::buffered_fd(OpState& op, int* out) {
  return op.buffered_fd(
      out, [&](int source, int flags, UniqueFd* fd) { return reopen_with_backpressure(source, flags, op.path(), fd); });
}

void Engine::open_path(OpState& op, bool write, const std::string& path, std::uint64_t* size, Opened* out) {
  UniqueFd fd = open_checked(write, path, size, out);
  if (out->direct) {
    op.set_direct_fd(std::move(fd));
  } else {
    op.set_buffered_fd(std::move(fd));
  }
}

std::shared_ptr<SharedFile> Engine::open_shared(bool write, const std::string& path) {
  auto f = std::make_shared<SharedFile>();
  std::uint64_t size = 0;
  f->main = open_checked(write, path, &size, &f->opened);
  f->size.store(size, std::memory_order_relaxed);
  if (f->opened.direct) {
    // The unaligned heads and tails of the requests go through the page cache: one
    // descriptor without O_DIRECT for all of them too, of the same file (not of the path).
    throw_if_error(reopen_with_backpressure(f->main.get(), write ? O_WRONLY : O_RDONLY, path, &f->buffered));
  }
  return f;
}

UniqueFd Engine::open_checked(bool write, const std::string& path, std::uint64_t* size, Opened* out) {
  FileFacts facts;
  bool direct = false;
  UniqueFd fd = open_maybe_direct(path, write ? (O_WRONLY | O_CREAT) : O_RDONLY, options_.direct_io, &facts, &direct);
  *size = facts.sized() ? facts.size : std::numeric_limits<std::uint64_t>::max();
  describe(fd.get(), facts, direct, out);
  return fd;
}

void Engine::describe(int fd, const FileFacts& facts, bool direct, Opened* out) {
  out->in_memory = in_memory(fd, facts.dev);
  out->dev = facts.dev;
  out->direct = direct;
  if (direct) {
    // Without statx's answer, a page is a safe superset of any logical block size.
    out->mem_align = facts.from_statx ? std::max<std::uint32_t>(1, facts.dio_mem_align) : page_size();
    out->offset_align = facts.from_statx ? facts.dio_offset_align : page_size();
  }
}

std::shared_ptr<SharedFile> Engine::open_object(const std::string& path, int flags, DirectIo mode) {
  process_.check();
  auto f = std::make_shared<SharedFile>();
  FileFacts facts;
  bool direct = false;
  f->main = open_maybe_direct(path, flags, mode, &facts, &direct);
  describe(f->main.get(), facts, direct, &f->opened);
  f->size.store(facts.sized() ? facts.size : std::numeric_limits<std::uint64_t>::max(), std::memory_order_relaxed);
  f->object = true;
  f->path = path;
  f->access = flags & O_ACCMODE;
  f->dev = facts.dev;
  if (direct) {
    // The unaligned parts of every request go through the page cache: one descriptor without
    // O_DIRECT for all of them, of the same file (reopened from `main`, not from the path).
    throw_if_error(reopen_with_backpressure(f->main.get(), f->access, path, &f->buffered));
  }
  f->fixed_main.set_fd(f->main.get());
  f->fixed_buffered.set_fd(f->buffered.get());
  return f;
}

std::uint64_t Engine::size_for(SharedFile& file, std::uint64_t end) {
  const std::uint64_t known = file.size.load(std::memory_order_relaxed);
  if (end <= known || !file.object) return known;
  FileFacts facts;
  throw_if_error(file_facts(file.main.get(), file.path, &facts));
  if (facts.sized()) raise_size(file.size, facts.size);
  return file.size.load(std::memory_order_relaxed);
}

UniqueFd Engine::open_maybe_direct(const std::string& path, int flags, DirectIo mode, FileFacts* facts, bool* direct) {
  *direct = mode != DirectIo::Off;
  // Every refusal of direct I/O, wherever it shows: direct_io=on raises naming the file
  // (`undo` first: what this call made that must not outlive it); auto counts it and goes on
  // without O_DIRECT.
  const auto refuse = [&](const char* why, const std::function<void()>& undo = {}) {
    if (mode == DirectIo::On) {
      if (undo) undo();
      throw_error(EINVAL, why, path);
    }
    counters_.direct_refused.fetch_add(1, std::memory_order_relaxed);
    *direct = false;
  };
  constexpr const char* kRefused = "the file system refuses O_DIRECT (direct_io=on)";
  UniqueFd fd;
  Status s;
  if (*direct && (flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL)) {
    // An O_DIRECT open that the file system refuses fails only after creating the file, and
    // the retry would then find it existing (EEXIST): create it plainly, then ask for O_DIRECT.
    s = open_with_backpressure(path, flags, &fd);
    if (s.ok()) {
      const int now = ::fcntl(fd.get(), F_GETFL);
      if (now < 0) throw_error(errno, "cannot read the file's flags (fcntl)", path);
      if (::fcntl(fd.get(), F_SETFL, now | O_DIRECT) != 0) {
        if (errno != EINVAL) throw_error(errno, "cannot set O_DIRECT (fcntl)", path);
        refuse(kRefused, [&] {
          fd.reset();
          ::unlink(path.c_str());  // created by this call (O_EXCL), and of no use to anyone
        });                        // `fd` stays open, without O_DIRECT
      }
    }
  } else {
    s = open_with_backpressure(path, flags | (*direct ? O_DIRECT : 0), &fd);
    if (!s.ok() && s.errnum == EINVAL && *direct) {
      refuse(kRefused);
      s = open_with_backpressure(path, flags, &fd);
    }
  }
  throw_if_error(s);
  throw_if_error(file_facts(fd.get(), path, facts));
  if (*direct && facts->from_statx && facts->dio_offset_align == 0) {
    // Opened with O_DIRECT but the file system says it cannot do direct I/O on this file.
    refuse("the file system does not support direct I/O on this file (direct_io=on)");
    // Our own open file description (no caller shares it yet): clearing the flag is safe here.
    const int now = ::fcntl(fd.get(), F_GETFL);
    if (now < 0 || ::fcntl(fd.get(), F_SETFL, now & ~O_DIRECT) != 0) {
      throw_error(errno, "cannot clear O_DIRECT (fcntl)", path);
    }
  }
  return fd;
}

void Engine::open_op(OpState& op, const std::string* path, int fd, const std::shared_ptr<SharedFile>& shared,
                     Opened* opened, std::uint64_t* size) {
  const bool write = op.write();
  const std::string& name = op.path();
  if (path != nullptr && shared) {
    *opened = shared->opened;
    *size = shared->size;
    op.share_fds(shared, opened->direct ? shared->main.get() : -1,
                 opened->direct ? shared->buffered.get() : shared->main.get());
    // A file object's descriptors go to io_uring's registered-file tables; a batch's shared
    // open (a path operation) does not.
    if (shared->object && kind_ == BackendKind::IoUring)
      op.set_fixed_files(&shared->fixed_main, &shared->fixed_buffered);
  } else if (path != nullptr) {
    open_path(op, write, *path, size, opened);
  } else {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) throw_error(errno, "bad file descriptor", name);
    FileFacts facts;
    throw_if_error(file_facts(fd, name, &facts));
    *size = facts.sized() ? facts.size : std::numeric_limits<std::uint64_t>::max();
    opened->in_memory = in_memory(fd, facts.dev);
    opened->dev = facts.dev;
    op.set_borrowed_source(fd);
    opened->direct = (flags & O_DIRECT) != 0 && options_.direct_io != DirectIo::Off;
    if (opened->direct) {
      opened->mem_align = facts.from_statx ? std::max<std::uint32_t>(1, facts.dio_mem_align) : page_size();
      opened->offset_align = facts.from_statx && facts.dio_offset_align != 0 ? facts.dio_offset_align : page_size();
      op.borrow_direct_fd(fd);
    } else if ((flags & O_DIRECT) == 0) {
      op.borrow_buffered_fd(fd);
    }  // else: direct_io=off on an O_DIRECT descriptor; queue() reopens it without O_DIRECT
  }
}

}  // namespace deepio::detail
