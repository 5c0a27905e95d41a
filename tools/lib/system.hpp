// What the `deepio` command asks of the machine: clocks and CPU time, free space and memory,
// a folder's file system (the platform's one name table, src/platform/sys.hpp), whether a
// folder is usable, where to write when no folder is given, temporary folders removed on
// every way out, a progress line, and why a GPU run cannot happen here.
//
// Nothing here throws on a machine's answer except make_temp_dir (std::runtime_error);
// Progress prints on stderr only when it is a terminal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace deepio::cli {

[[nodiscard]] double now_seconds() noexcept;           ///< steady clock
[[nodiscard]] double process_cpu_seconds() noexcept;   ///< getrusage(SELF) user + system
[[nodiscard]] double children_cpu_seconds() noexcept;  ///< getrusage(CHILDREN) user + system

/// fsync()s the file and asks the kernel to drop its pages (posix_fadvise DONTNEED), so the
/// next read comes from the device. Returns false if the file cannot be opened.
bool drop_page_cache(const std::string& path) noexcept;
/// Free bytes for unprivileged users on the filesystem holding `path`; 0 on error.
[[nodiscard]] std::uint64_t free_disk_bytes(const std::string& path) noexcept;
/// Physical memory in bytes; 0 on error.
[[nodiscard]] std::uint64_t physical_memory_bytes() noexcept;
/// The file system holding `path`, named by the platform's table (the name DirectIoInfo
/// gives): "ext4", "xfs", "tmpfs", ..., "0x<magic>", or "unknown" when statfs fails.
[[nodiscard]] std::string filesystem_of(const std::string& path);
/// True when the folder lives in memory (tmpfs, ramfs): no device to measure there.
[[nodiscard]] bool is_memory_filesystem(const std::string& path);
/// True when stderr is a terminal (progress output goes there only then).
[[nodiscard]] bool stderr_is_tty() noexcept;

/// Checks that `folder` exists, is a directory and is writable (by creating a file there);
/// returns the problem as one sentence, or "".
[[nodiscard]] std::string folder_problem(const std::string& folder);
/// Several folders measured at once (`flag` names them in messages, e.g. "--folder"): each
/// one's folder_problem, and a folder given twice (the same directory by st_dev and st_ino, so
/// "/a" and "/a/." are one). Every problem is one sentence naming the folder.
[[nodiscard]] std::vector<std::string> folder_set_problems(const std::vector<std::string>& folders,
                                                           const std::string& flag);
/// When two of `folders` live on one file system (the same st_dev): one sentence saying which
/// and that an aggregate over them is not a sum of drives; "" otherwise (or when one cannot be
/// read). Not an error: partitions of one drive are a legitimate, if unusual, set.
[[nodiscard]] std::string same_device_note(const std::vector<std::string>& folders);

/// Where the bench writes when no folder is given: DEEPIO_BENCH_DIR, TMPDIR, /var/tmp, /tmp,
/// the current folder — the first that is writable and not in memory (tmpfs/ramfs).
/// Empty when none qualifies; `why` (when given) then lists what was rejected.
std::string pick_disk_folder(std::string* why);

/// Creates "<parent>/deepio-<tag>-XXXXXX"; removes it (and the files registered with
/// register_temp_file) at exit, on SIGINT/SIGTERM/SIGHUP and by remove_temp_dir(). At most 16
/// folders and 64 files per process. Throws std::runtime_error when it cannot.
std::string make_temp_dir(const std::string& parent, const std::string& tag);
void register_temp_file(const std::string& path);
void remove_temp_dir();
/// --keep: forgets the folders and files registered so far, so that no way out removes them
/// (huge pages added for the run are still given back).
void keep_temp_files() noexcept;
/// `pages` huge pages were added to vm.nr_hugepages for this run (ceiling.hpp's HugePageLoan):
/// give_back_hugepages_now(), exit and SIGINT/SIGTERM/SIGHUP subtract them again (once).
void register_hugepages_added(std::uint64_t pages);
void give_back_hugepages_now() noexcept;
/// deepio's lock on changes of vm.nr_hugepages, across processes, held for the object's life:
/// an flock on /run/lock/deepio-nr_hugepages.lock (/tmp/... where /run/lock is not writable).
/// HugePageLoan takes it around its read-modify-write of the pool and give_back_hugepages_now
/// around its own, so two runs reserving at once cannot lose each other's update. Do not call
/// give_back_hugepages_now() while holding one (it would wait for itself).
class HugePagePoolLock {
 public:
  HugePagePoolLock() noexcept;  ///< waits for the lock; without it (file not creatable) it holds nothing
  ~HugePagePoolLock();
  HugePagePoolLock(const HugePagePoolLock&) = delete;
  HugePagePoolLock& operator=(const HugePagePoolLock&) = delete;
  [[nodiscard]] bool held() const noexcept { return fd_ >= 0; }

 private:
  int fd_;
};

/// Why `deepio tune --gpu` (and `--gds` when `gds`) cannot run here, as one line naming the
/// flag and the cause (no usable CUDA driver, no cuFile); tune's GPU sweep is not written yet,
/// so with CUDA present it says that and points at `deepio bench --gpu` (lib/gpu.hpp).
[[nodiscard]] std::string gpu_problem(const char* gpu_flag, const char* gds_flag, bool gds);

/// One line of progress on stderr, only when stderr is a terminal ("\r" rewrites it).
class Progress {
 public:
  Progress(std::size_t total, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void step(const std::string& what);
  void done();

 private:
  std::size_t total_, current_ = 0;
  bool enabled_;
};

}  // namespace deepio::cli
