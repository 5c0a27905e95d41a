// Helpers of the KV store's tests (test_kv*.cpp): small stores in temporary folders, pages of
// known bytes, batches, and forked children with an exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <filesystem>

#include "common/support.hpp"
#include "deepio/kv.hpp"

namespace deepio::test {

inline constexpr std::size_t kPage = 8192;

inline kv::StoreOptions small_options(const std::vector<std::string>& folders, std::uint64_t pages_total = 64) {
  kv::StoreOptions o;
  o.folders = folders;
  o.page_bytes = kPage;
  o.capacity_bytes = pages_total * (4096 + kPage);
  o.batch_threads = 2;
  o.checkpoint_interval = std::chrono::milliseconds(0);
  o.handle.intra_op_parallelism = 1;
  o.handle.queue_depth = 32;
  return o;
}

inline std::vector<unsigned char> page_for(const std::string& key, std::size_t n, std::uint32_t salt = 0) {
  std::vector<unsigned char> p(n);
  std::uint64_t h = std::hash<std::string>{}(key) ^ salt;
  for (std::size_t i = 0; i < n; ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<unsigned char>(h >> 56);
  }
  return p;
}

inline std::vector<std::string> numbered_keys(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

inline std::vector<bool> put_pages(kv::Store& s, const std::vector<std::string>& keys,
                                   std::vector<std::vector<unsigned char>>& pages) {
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  std::vector<std::vector<kv::Segment>> segs;
  for (auto& p : pages) segs.push_back({kv::Segment{p.data(), p.size()}});
  return s.put(kv, segs).get();
}

inline std::vector<bool> get_pages(kv::Store& s, const std::vector<std::string>& keys,
                                   std::vector<std::vector<unsigned char>>& out) {
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  std::vector<std::vector<kv::Segment>> segs;
  for (auto& p : out) segs.push_back({kv::Segment{p.data(), p.size()}});
  return s.get(kv, segs).get();
}

/// `folder` as descriptors name it (/proc/self/fd: absolute, symbolic links resolved), with a
/// trailing slash: fault hooks match the store's own folder by prefix, never a substring of
/// an absolute path (a checkout under a folder named "bad" would match every folder).
inline std::string folder_prefix(const std::string& folder) {
  return std::filesystem::weakly_canonical(std::filesystem::absolute(folder)).string() + "/";
}

/// Whether descriptor fd is a file under the folder of `prefix` (folder_prefix()).
inline bool fd_in(int fd, const std::string& prefix) { return fd_path(fd).rfind(prefix, 0) == 0; }

/// Whether descriptor fd is one of a store's slab files (by its file name).
inline bool fd_is_slab(int fd) { return std::filesystem::path(fd_path(fd)).filename().string().rfind("slab-", 0) == 0; }

/// Waits for a forked child that ends with ::_exit (a crash: the store it opened is never
/// closed) and returns its exit code (0: every check in it passed), or -1 if it did not exit
/// (killed: an abort, or its alarm() watchdog).
inline int exit_code_of(pid_t child) {
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

/// Runs fn in a forked child under an alarm() watchdog of `seconds` and returns the child's
/// exit code: fn's return value, 100 if it threw, -1 if it hung or aborted.
inline int in_watched_child(const std::function<int()>& fn, unsigned seconds = 20) {
  const pid_t child = ::fork();
  if (child < 0) return -2;
  if (child == 0) {
    ::alarm(seconds);
    int rc = 100;
    try {
      rc = fn();
    } catch (...) {
    }
    ::_exit(rc);
  }
  return exit_code_of(child);
}

}  // namespace deepio::test
