#include "kv/files.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <mutex>

#include "deepio/error.hpp"

namespace deepio::kv::internal {

namespace {

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(errno, "kv: cannot open the folder to sync it", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(err, "kv: cannot sync the folder", dir);
}

// The registry of lock descriptors a forked child must let go of. A fixed table, so that the
// atfork child handler neither allocates nor takes a lock another thread could hold.
constexpr std::size_t kMaxLocks = 4096;
std::mutex g_locks_mu;                    // taken by the prepare handler: fork sees no half-made change
std::array<int, kMaxLocks> g_lock_fds{};  // 0: empty slot (descriptor 0 is never a lock file here), else fd + 1
std::size_t g_lock_count = 0;             // slots [0, count) may be used

void on_fork_prepare() noexcept { g_locks_mu.lock(); }
void on_fork_parent() noexcept { g_locks_mu.unlock(); }
void on_fork_child() noexcept {
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (std::size_t i = 0; i < g_lock_count; ++i) {
    const int fd = g_lock_fds[i] - 1;
    if (fd < 0) continue;
    // The child's reference to the locked file goes; the number stays open (on /dev/null).
    // Without /dev/null it is closed (never flock(LOCK_UN): that would unlock the parent too).
    if (null < 0 || ::dup3(null, fd, O_CLOEXEC) < 0) ::close(fd);
  }
  if (null >= 0) ::close(null);
  g_locks_mu.unlock();
}

void install_handlers() {
  static const bool installed = ::pthread_atfork(&on_fork_prepare, &on_fork_parent, &on_fork_child) == 0;
  if (!installed) throw Error(ENOMEM, "kv: cannot register the fork handler of the folder locks");
}

}  // namespace

void replace_durably(Handle& handle, const std::string& dir, const std::string& name,
                     const std::vector<unsigned char>& bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  const std::string path = dir + "/" + name;
  ::unlink(tmp.c_str());
  handle.sync_pwrite(bytes.data(), bytes.size(), tmp, 0, true);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw Error(errno, "kv: cannot rename " + tmp, path);
  fsync_dir(dir);
}

std::optional<std::vector<unsigned char>> read_whole(Handle& handle, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error(errno, "kv: cannot stat", path);
  }
  std::vector<unsigned char> out(static_cast<std::size_t>(st.st_size));
  if (!out.empty()) handle.sync_pread(out.data(), out.size(), path, 0);
  return out;
}

FolderLock::FolderLock(const std::string& dir) {
  install_handlers();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/kv.lock";
  std::lock_guard lk(g_locks_mu);  // open and register as one step with respect to fork()
  std::size_t slot = 0;
  while (slot < g_lock_count && g_lock_fds[slot] != 0) ++slot;
  if (slot == kMaxLocks) throw Error(EMFILE, "kv: too many folders open at once", dir);
  deepio::detail::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (!fd.valid()) throw Error(errno, "kv: cannot open the folder's lock file", path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      throw Error(EBUSY,
                  "kv: the folder is in use by another deepio.kv store (in this process or another); "
                  "close that one first",
                  dir);
    }
    throw Error(e, "kv: cannot lock the folder", path);
  }
  fd_ = fd.release();
  g_lock_fds[slot] = fd_ + 1;
  if (slot == g_lock_count) ++g_lock_count;
}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void FolderLock::reset() noexcept {
  if (fd_ < 0) return;
  std::lock_guard lk(g_locks_mu);  // unregister and close as one step with respect to fork()
  for (std::size_t i = 0; i < g_lock_count; ++i) {
    if (g_lock_fds[i] == fd_ + 1) {
      g_lock_fds[i] = 0;
      break;
    }
  }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace deepio::kv::internal
