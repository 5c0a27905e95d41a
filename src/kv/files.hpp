// The store's small files: the durable replace of kv.meta and index.ckpt, whole-file reads,
// and the folder lock (kv.lock). Each function throws deepio::Error (errno, path) on failure.
// Thread-safe (no shared state but the lock registry, which has its own mutex).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deepio/handle.hpp"
#include "platform/fd.hpp"

namespace deepio::kv::internal {

/// Replaces `dir`/`name` with `bytes` so that a crash at any instant leaves either the old
/// file or the new one, whole: `name`.tmp written through the handle with OpOptions::fsync
/// (the data and the file's size on stable storage), renamed over `name`, then the folder
/// fsynced (the rename durable). The one way the store replaces a file (kv.meta, index.ckpt).
void replace_durably(Handle& handle, const std::string& dir, const std::string& name,
                     const std::vector<unsigned char>& bytes);

/// A folder's name in failed.list: its absolute path, symbolic links resolved.
std::string folder_id(const std::string& path);

/// The whole file through the handle, or nullopt when it does not exist.
std::optional<std::vector<unsigned char>> read_whole(Handle& handle, const std::string& path);

/// kv.lock of one folder, held with flock(LOCK_EX) while it is open. Two stores writing one
/// folder would hand out the same slots and overwrite each other's pages. The lock belongs to
/// the open file description, so a second store in this process is refused as one in another
/// process is, and it goes when the last descriptor of it closes.
///
/// Fork: a child inherits the descriptor, and with it the lock, which would outlive the
/// parent's close() for as long as the child lives. A FolderLock's descriptor is registered
/// in a process-wide table; a pthread_atfork child handler dup2()s /dev/null over every one,
/// so the child lets go of the lock at once, and the descriptor number stays taken (nothing
/// else of the child is closed by mistake when the child's copy of this object closes it).
/// The table's mutex is held across fork() (prepare handler), so a lock being taken or
/// released at that moment is either fully registered or fully gone in the child.
class FolderLock {
 public:
  FolderLock() = default;
  /// Takes `dir`/kv.lock (made if missing, and the folder with it) with LOCK_EX | LOCK_NB.
  /// Throws deepio::Error EBUSY naming the folder when another open file holds it.
  explicit FolderLock(const std::string& dir);
  ~FolderLock() { reset(); }
  FolderLock(FolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  [[nodiscard]] bool held() const noexcept { return fd_ >= 0; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Unregisters and closes the descriptor (the lock goes unless a forked child... cannot:
  /// a child's copy was replaced by /dev/null at the fork).
  void reset() noexcept;

 private:
  int fd_ = -1;
};

}  // namespace deepio::kv::internal
