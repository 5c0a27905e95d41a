#include "system.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "deepio/gpu.hpp"
#include "platform/sys.hpp"  // the one internal function tools/ uses: filesystem_type_name

namespace deepio::cli {

// ---- clocks, CPU, memory, disks ----------------------------------------------------------

double now_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
double rusage_seconds(int who) noexcept {
  rusage ru{};
  if (::getrusage(who, &ru) != 0) return 0.0;
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}
}  // namespace

double process_cpu_seconds() noexcept { return rusage_seconds(RUSAGE_SELF); }
double children_cpu_seconds() noexcept { return rusage_seconds(RUSAGE_CHILDREN); }

bool drop_page_cache(const std::string& path) noexcept {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return true;
}

std::uint64_t free_disk_bytes(const std::string& path) noexcept {
  struct statvfs sv {};
  if (::statvfs(path.c_str(), &sv) != 0) return 0;
  return static_cast<std::uint64_t>(sv.f_bavail) * sv.f_frsize;
}

std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

std::string filesystem_of(const std::string& path) {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return "unknown";
  return detail::filesystem_type_name(static_cast<std::uint64_t>(sf.f_type));
}

bool is_memory_filesystem(const std::string& path) {
  const std::string fs = filesystem_of(path);
  return fs == "tmpfs" || fs == "ramfs";
}

bool stderr_is_tty() noexcept { return ::isatty(STDERR_FILENO) == 1; }

// ---- folders -----------------------------------------------------------------------------

std::string folder_problem(const std::string& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) {
    return "folder '" + folder + "' " +
           (errno == ENOENT ? std::string("does not exist") : std::string(std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return "'" + folder + "' is not a folder";
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return "folder '" + folder + "' is not writable (" + std::strerror(errno) + ")";
  }
  // access() says yes to root everywhere; creating a file is the real test (read-only
  // mounts, /proc, quota, ...).
  const std::string probe = folder + "/.deepio-write-test-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "folder '" + folder + "' is not writable (" + std::strerror(errno) + ")";
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

std::vector<std::string> folder_set_problems(const std::vector<std::string>& folders, const std::string& flag) {
  std::vector<std::string> problems;
  std::vector<std::pair<dev_t, ino_t>> seen;
  std::vector<std::string> names;  // names[i] was seen[i]
  for (std::size_t i = 0; i < folders.size(); ++i) {
    if (auto problem = folder_problem(folders[i]); !problem.empty()) {
      problems.push_back(std::move(problem));
      continue;
    }
    struct stat st {};
    if (::stat(folders[i].c_str(), &st) != 0) continue;
    const auto id = std::make_pair(st.st_dev, st.st_ino);
    const auto it = std::find(seen.begin(), seen.end(), id);
    if (it != seen.end()) {
      problems.push_back(flag + ": folder '" + folders[i] + "' is given twice (the same folder as '" +
                         names[static_cast<std::size_t>(it - seen.begin())] + "')");
      continue;
    }
    seen.push_back(id);
    names.push_back(folders[i]);
  }
  return problems;
}

std::string same_device_note(const std::vector<std::string>& folders) {
  std::vector<dev_t> devs;
  for (const auto& f : folders) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) return {};
    devs.push_back(st.st_dev);
  }
  for (std::size_t i = 0; i < devs.size(); ++i) {
    for (std::size_t k = i + 1; k < devs.size(); ++k) {
      if (devs[i] == devs[k]) {
        return "'" + folders[i] + "' and '" + folders[k] +
               "' are on the same file system (one device): the aggregate is not a sum of drives";
      }
    }
  }
  return {};
}

std::string pick_disk_folder(std::string* why) {
  std::vector<std::string> candidates;
  for (const char* var : {"DEEPIO_BENCH_DIR", "TMPDIR"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') candidates.emplace_back(v);
  }
  candidates.insert(candidates.end(), {"/var/tmp", "/tmp", "."});
  std::string rejected;
  for (const auto& c : candidates) {
    std::string problem = folder_problem(c);
    if (problem.empty() && is_memory_filesystem(c)) problem = c + " is " + filesystem_of(c) + " (in memory)";
    if (problem.empty()) return c;
    rejected += (rejected.empty() ? "" : "; ") + problem;
  }
  if (why != nullptr) *why = rejected;
  return {};
}

// ---- temporary files, removed on every way out -------------------------------------------
// The signal handler may only call async-signal-safe functions, so the paths live in fixed
// arrays written before any I/O starts.

namespace {
constexpr int kMaxTemp = 64;
char g_temp_files[kMaxTemp][1024];
volatile sig_atomic_t g_temp_count = 0;
constexpr int kMaxDirs = 16;
char g_temp_dirs[kMaxDirs][1024];
volatile sig_atomic_t g_dir_count = 0;
bool g_handlers_installed = false;

// Huge pages a HugePageLoan (ceiling.hpp) added to vm.nr_hugepages: taken away again here on
// the ways out that skip its destructor (exit(), signals), with signal-safe calls only.
volatile sig_atomic_t g_hugepages_added = 0;
const char kNrHugepages[] = "/proc/sys/vm/nr_hugepages";

// Every deepio process changes vm.nr_hugepages under one flock, so that two runs reserving or
// giving back at once cannot lose each other's update (read N, read N, write N+a, write N+b:
// a pages lost, and the pool left b pages below where it started after both give back).
// (access() is async-signal-safe; no function-local static, whose guard is not.)
const char* hugepage_lock_path() noexcept {
  return ::access("/run/lock", W_OK) == 0 ? "/run/lock/deepio-nr_hugepages.lock" : "/tmp/deepio-nr_hugepages.lock";
}

// Signal-safe (open, flock, nanosleep): blocks, or with `patient_ms` >= 0 tries for that long and
// then goes on without the lock (a signal handler must not wait forever on a lock its own
// process may hold). -1 when the file cannot be opened or the lock was not had.
int lock_hugepage_pool_fd(int patient_ms) noexcept {
  const int fd = ::open(hugepage_lock_path(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  if (patient_ms < 0) {
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) break;
    }
    return fd;
  }
  for (int waited = 0;; waited += 10) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (waited >= patient_ms) break;
    const timespec ten_ms{0, 10 * 1000 * 1000};
    ::nanosleep(&ten_ms, nullptr);
  }
  ::close(fd);
  return -1;
}

// Subtracts `added` from vm.nr_hugepages (the caller holds the pool lock where it can).
void give_back_locked(long added) noexcept {
  char buf[32] = {};
  int fd = ::open(kNrHugepages, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0 || buf[0] < '0' || buf[0] > '9') return;  // unreadable: never write a guess
  long now = 0;
  for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) now = now * 10 + (buf[i] - '0');
  long left = now > added ? now - added : 0;
  char out[32];
  int len = 0;
  do {
    out[sizeof out - 1 - static_cast<std::size_t>(len++)] = static_cast<char>('0' + left % 10);
    left /= 10;
  } while (left > 0);
  fd = ::open(kNrHugepages, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)!::write(fd, out + sizeof out - static_cast<std::size_t>(len), static_cast<std::size_t>(len));
  ::close(fd);
}

// `patient_ms` as lock_hugepage_pool_fd's: -1 (wait) from a HugePageLoan, 2 s on the ways out.
void give_back_hugepages(int patient_ms) noexcept {
  const long added = g_hugepages_added;
  if (added <= 0) return;
  g_hugepages_added = 0;
  const int lock = lock_hugepage_pool_fd(patient_ms);
  give_back_locked(added);
  if (lock >= 0) ::close(lock);  // closing the last descriptor releases the flock
}

void remove_all() noexcept {
  for (int i = 0; i < g_temp_count; ++i) ::unlink(g_temp_files[i]);
  for (int i = 0; i < g_dir_count; ++i) ::rmdir(g_temp_dirs[i]);
  give_back_hugepages(2000);
}

extern "C" void on_signal(int sig) {
  remove_all();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_cleanup_handlers() {
  if (g_handlers_installed) return;
  g_handlers_installed = true;
  std::atexit(remove_all);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // Every signal whose default ends the process, crashes (and abort(), std::terminate)
  // included: a reservation of huge pages must never outlive the run.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
    ::sigaction(sig, &sa, nullptr);
  }
}
}  // namespace

std::string make_temp_dir(const std::string& parent, const std::string& tag) {
  std::string tmpl = parent + "/deepio-" + tag + "-XXXXXX";
  if (tmpl.size() >= sizeof g_temp_dirs[0] - 64) throw std::runtime_error("folder path too long: " + parent);
  if (g_dir_count >= kMaxDirs) throw std::runtime_error("too many folders (at most 16)");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("cannot create a folder in " + parent + ": " + std::strerror(errno));
  }
  std::snprintf(g_temp_dirs[g_dir_count], sizeof g_temp_dirs[0], "%s", tmpl.c_str());
  g_dir_count = g_dir_count + 1;
  install_cleanup_handlers();
  return tmpl;
}

void register_temp_file(const std::string& path) {
  if (g_temp_count >= kMaxTemp || path.size() >= sizeof g_temp_files[0]) return;
  std::snprintf(g_temp_files[g_temp_count], sizeof g_temp_files[0], "%s", path.c_str());
  g_temp_count = g_temp_count + 1;
}

void keep_temp_files() noexcept {
  g_temp_count = 0;
  g_dir_count = 0;
}

void register_hugepages_added(std::uint64_t pages) {
  install_cleanup_handlers();
  g_hugepages_added = static_cast<sig_atomic_t>(pages);
}

void give_back_hugepages_now() noexcept { give_back_hugepages(-1); }

HugePagePoolLock::HugePagePoolLock() noexcept : fd_(lock_hugepage_pool_fd(-1)) {}

HugePagePoolLock::~HugePagePoolLock() {
  if (fd_ >= 0) ::close(fd_);
}

void remove_temp_dir() {
  remove_all();
  g_temp_count = 0;
  g_dir_count = 0;
}

// ---- GPU ---------------------------------------------------------------------------------

std::string gpu_problem(const char* gpu_flag, const char* gds_flag, bool gds) {
  const GpuInfo g = gpu_info();
  if (!g.cuda_found) return std::string(gpu_flag) + ": no usable CUDA driver: " + g.cuda_reason;
  if (gds && !g.cufile_found) return std::string(gds_flag) + ": no cuFile: " + g.cufile_reason;
  return std::string(gpu_flag) + ": GPU runs are not in deepio tune yet (CUDA " + std::to_string(g.driver_version) +
         ", " + std::to_string(g.device_count) + " device(s), GDS mode " + g.gds_mode +
         "); measure one configuration with deepio bench --io_size ... --gpu [--use_gds]";
}

// ---- progress ----------------------------------------------------------------------------

Progress::Progress(std::size_t total, bool enabled) : total_(total), enabled_(enabled && stderr_is_tty()) {}

Progress::~Progress() { done(); }

void Progress::step(const std::string& what) {
  ++current_;
  if (!enabled_) return;
  constexpr std::size_t kWidth = 24;
  const std::size_t filled = total_ ? std::min(kWidth, current_ * kWidth / total_) : kWidth;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s", bar.c_str(), current_, total_, what.c_str());
  std::fflush(stderr);
}

void Progress::done() {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace deepio::cli
