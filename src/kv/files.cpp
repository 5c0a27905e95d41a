#include "kv/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

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
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/kv.lock";
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
  ::close(fd_);
  fd_ = -1;
}

}  // namespace deepio::kv::internal
