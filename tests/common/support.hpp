// Shared test helpers: temporary folders on a real disk, patterned buffers, file readers.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/deepio.hpp"
#include "platform/fault.hpp"

namespace deepio::test {

/// A fresh folder under $DEEPIO_TEST_DIR (default: the build tree, on the real disk, not
/// tmpfs), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    const char* env = std::getenv("DEEPIO_TEST_DIR");
    std::filesystem::path base = env != nullptr && *env != '\0' ? env : DEEPIO_TEST_DEFAULT_DIR;
    std::filesystem::create_directories(base);
    std::string templ = (base / "deepio-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + base.string());
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Numbers the first `limit` calls, from any number of threads at once: 0 .. limit - 1 for
/// exactly `limit` of them, -1 for the others. Fault hooks run on every worker thread, and a
/// check of the count followed by an increment lets two threads both take the last turn.
inline int take_turn(std::atomic<int>& taken, int limit) {
  int n = taken.load();
  while (n < limit && !taken.compare_exchange_weak(n, n + 1)) {
  }
  return n < limit ? n : -1;
}

/// The path an open descriptor names, through /proc ("" if it cannot be read).
inline std::string fd_path(int fd) {
  char link[64], target[4096];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string();
}

/// Deterministic bytes that differ per (seed, index), so misplaced bytes are caught.
inline std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

/// Whether the kernel has sparse registered-buffer tables (IORING_RSRC_REGISTER_SPARSE, Linux 5.19).
inline bool kernel_has_sparse_buffers() {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 19);
}

/// Pages pinned by this process through io_uring registrations (and RDMA), in KiB; -1 when
/// /proc/self/status has no VmPin.
inline long vm_pin_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmPin:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kib;
}

/// The whole file as plain read() sees it.
inline std::vector<std::byte> slurp(const std::string& path) {
  std::vector<std::byte> out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat st {};
  ::fstat(fd, &st);
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

/// Runs fn in a child process (for process-wide limits and identities); returns its exit code
/// (101 if it threw, 200 + the signal if it was killed).
template <typename Fn>
int in_child(Fn fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 100;
    try {
      code = fn();
    } catch (...) {
      code = 101;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

/// Writes bytes with plain pwrite (creating the file).
inline void put(const std::string& path, const std::vector<std::byte>& data, std::uint64_t offset = 0) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t r = ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    ASSERT_GT(r, 0);
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
}

/// A buffer whose data() is `misalign` bytes past a page boundary.
class OffsetBuffer {
 public:
  OffsetBuffer(std::size_t n, std::size_t misalign) : storage_(n + 2 * 4096 + misalign), n_(n) {
    auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    auto aligned = (base + 4095) / 4096 * 4096;
    data_ = storage_.data() + (aligned - base) + misalign;
  }
  [[nodiscard]] std::byte* data() { return data_; }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] std::vector<std::byte> copy() const { return {data_, data_ + n_}; }
  void fill(const std::vector<std::byte>& v) { std::copy(v.begin(), v.end(), data_); }

 private:
  std::vector<std::byte> storage_;
  std::byte* data_;
  std::size_t n_;
};

/// Backends usable here; an unavailable one is reported through GTEST_SKIP by the caller.
inline bool backend_available(BackendKind kind, std::string* why) {
  for (const auto& b : capabilities().backends) {
    if (b.kind == kind) {
      *why = b.reason;
      return b.available;
    }
  }
  *why = "unknown backend";
  return false;
}

/// Fixture of the suites that run once per backend: skips (with the reason) where the
/// backend cannot be set up, gives each test a fresh folder, and clears the fault hook.
class BackendTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    std::string why;
    if (!backend_available(GetParam(), &why)) GTEST_SKIP() << to_string(GetParam()) << ": " << why;
  }
  void TearDown() override { detail::set_fault_hook({}); }
  /// `o` with this test's backend.
  [[nodiscard]] HandleOptions opts(HandleOptions o = {}) const {
    o.backend = GetParam();
    return o;
  }
  TempDir dir_;
};

/// A BackendTest whose engine fault hook is a fresh G for each test (a suite's gate: a
/// callable taking the FaultSite), installed after SetUp and removed at TearDown.
template <typename G>
class GatedBackendTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    gate_ = std::make_shared<G>();
    detail::set_fault_hook([g = gate_](const detail::FaultSite& s) { return (*g)(s); });
  }
  std::shared_ptr<G> gate_;
};

/// Test names "io_uring", "libaio", "threads" for INSTANTIATE_TEST_SUITE_P.
inline std::string backend_param_name(const testing::TestParamInfo<BackendKind>& info) {
  return std::string(to_string(info.param));
}

#define DEEPIO_INSTANTIATE_FOR_BACKENDS(suite)                                                               \
  INSTANTIATE_TEST_SUITE_P(Backends, suite,                                                                  \
                           testing::Values(BackendKind::IoUring, BackendKind::Libaio, BackendKind::Threads), \
                           ::deepio::test::backend_param_name)

// Waits (bounded, 20 s) until pred() holds, looking every 200 us; the bound only ends a test
// that would otherwise hang.
template <typename Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace deepio::test
