// A power-loss simulator for tests (issue 47): what a crash of the machine, not only of the
// process, can leave of the files the engine wrote. A process crash keeps every write the
// process issued (the page cache survives it); a power loss keeps only what a completed flush
// covered, and any part of what came after.
//
// A CrashRecorder installs the engine's fault hook (platform/fault.hpp; it replaces any other
// hook) and records, per file (by device and inode, so renames do not matter):
//   - at a write's submission, the sectors it will cover as they were before (the "base": the
//     content as of the file's last flush, taken once per sector until the next flush);
//   - at a write's completion, the bytes it wrote, read back from the file, in completion order;
//   - at a flush (the engine's fdatasync of a durable write, FaultPoint::Sync), everything of
//     the file completed before it becomes durable: its writes and bases are forgotten (the
//     base of a sector a write still in flight covers becomes the newest completed bytes).
// crash(seed) then stops every new request (submissions fail with EIO), waits for the requests
// in flight, and rewrites each recorded file as a power loss could leave it: every sector back
// to its base, then each completed write since the last flush, in order, kept, dropped, or torn
// (each `tear_bytes` piece kept or not on its own), chosen by a generator seeded with `seed`
// and the order in which the recorder first saw the file, so a seed replays the same outcome. A file's size becomes its
// size at the last flush or the end of the last kept piece past it, whichever is larger.
//
// Not modelled here: directory operations (a rename or a new file is kept at once; the Python
// tests' PowerLoss, tests/python/crash_support.py, undoes renames no folder flush covered)
// and writes that do not go through the engine (kept at once). After crash() the process
// must end (::_exit): the engine's state no longer matches the files.
//
// Thread safety: the hook runs on worker threads; every member is guarded by one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepio::detail {

struct CrashReport {
  std::size_t files = 0;        ///< files with writes after their last flush
  std::size_t writes_kept = 0;  ///< whole
  std::size_t writes_dropped = 0;
  std::size_t writes_torn = 0;  ///< some pieces kept, some not
  std::size_t sectors_restored = 0;
};

class CrashRecorder {
 public:
  /// `tear_bytes`: the piece a torn write keeps or loses (512 or 4096; a power of two >= 512).
  explicit CrashRecorder(std::size_t tear_bytes = 512);
  ~CrashRecorder();  ///< removes the hook
  CrashRecorder(const CrashRecorder&) = delete;
  CrashRecorder& operator=(const CrashRecorder&) = delete;

  /// The simulated power loss (see above). Throws std::runtime_error if requests are still in
  /// flight after 20 s or a file cannot be rewritten.
  CrashReport crash(std::uint64_t seed);

  /// Writes completed since their file's last flush, over all files (for tests of the tests).
  [[nodiscard]] std::size_t unflushed_writes() const;

  /// A flush the engine does not make (a caller's own fsync/fdatasync of descriptor fd), told
  /// before it starts: as a FaultPoint::Sync of that file. Ignored after crash().
  void note_flush(int fd);
  /// A drive that fails, for the fuzzer's failed folders: while set, every read, write and
  /// flush of a file under `folder` (an absolute path, or empty: none) completes with EIO. A
  /// write still lands (as after a device error reported late); a flush does not happen.
  void fail_under(std::string folder);

 private:
  struct File;
  std::optional<std::int64_t> on_site(const struct FaultSite& site);
  File& file_of(int fd);
  [[nodiscard]] bool failing(const struct FaultSite& site) const;  // mu_ held
  void flushed(File& f);                                           // mu_ held

  std::size_t tear_;
  mutable std::mutex mu_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::unique_ptr<File>> files_;  // (dev, ino)
  std::size_t inflight_ = 0;
  bool frozen_ = false;
  std::string fail_prefix_;  // with a trailing '/'
};

}  // namespace deepio::detail
