// The power-loss simulator (platform/crash_sim.hpp, issue 47). The crash-point fuzzer of
// deepio.kv on it is test_kv_crash_fuzz.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/handle.hpp"
#include "deepio/kv.hpp"
#include "kv_support.hpp"
#include "platform/crash_sim.hpp"

namespace deepio::test {
namespace {

using detail::CrashRecorder;
using detail::CrashReport;

std::vector<unsigned char> bytes_of(const std::string& path) {
  std::vector<unsigned char> out;
  for (std::byte b : slurp(path)) out.push_back(static_cast<unsigned char>(b));
  return out;
}

constexpr std::size_t kK = 1024;

/// In a child: A = [0, 64K) written durably, then B = [64K, 128K) and C = [0, 4K) without a
/// flush, then the simulated power loss with `seed`. Returns the report (through a pipe).
std::optional<CrashReport> crash_after_writes(const std::string& path, std::uint64_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const int rc = in_watched_child([&]() -> int {
    ::close(fds[0]);
    CrashRecorder rec(512);
    Handle h(HandleOptions{});
    auto a = page_for("A", 64 * kK), b = page_for("B", 64 * kK), c = page_for("C", 4 * kK);
    h.sync_pwrite(a.data(), a.size(), path, 0, true);
    h.sync_pwrite(b.data(), b.size(), path, 64 * kK, false);
    h.sync_pwrite(c.data(), c.size(), path, 0, false);
    if (rec.unflushed_writes() != 2) return 3;
    CrashReport r = rec.crash(seed);
    if (::write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) return 4;
    ::_exit(0);
  });
  ::close(fds[1]);
  CrashReport r;
  const bool got = ::read(fds[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
  ::close(fds[0]);
  if (rc != 0 || !got) return std::nullopt;
  return r;
}

TEST(CrashSim, FlushedWritesStayAndLaterOnesAreKeptDroppedOrTornBySector) {
  TempDir dir;
  const auto a = page_for("A", 64 * kK), b = page_for("B", 64 * kK), c = page_for("C", 4 * kK);
  std::size_t kept = 0, dropped = 0, torn = 0;
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    const std::string path = dir.file("f" + std::to_string(seed));
    auto r = crash_after_writes(path, seed);
    ASSERT_TRUE(r) << "seed " << seed;
    kept += r->writes_kept;
    dropped += r->writes_dropped;
    torn += r->writes_torn;
    const auto got = bytes_of(path);
    ASSERT_GE(got.size(), 64 * kK) << "seed " << seed << ": the flushed write was cut";
    ASSERT_LE(got.size(), 128 * kK) << "seed " << seed;
    for (std::size_t s = 0; s < got.size() / 512; ++s) {
      const std::size_t o = s * 512;
      auto sector_is = [&](const std::vector<unsigned char>& v, std::size_t at) {
        return std::equal(got.begin() + static_cast<std::ptrdiff_t>(o),
                          got.begin() + static_cast<std::ptrdiff_t>(o + 512),
                          v.begin() + static_cast<std::ptrdiff_t>(at));
      };
      if (o < 4 * kK) {
        EXPECT_TRUE(sector_is(a, o) || sector_is(c, o)) << "seed " << seed << " sector " << s;
      } else if (o < 64 * kK) {
        EXPECT_TRUE(sector_is(a, o)) << "seed " << seed << " sector " << s << ": flushed bytes changed";
      } else {
        const std::vector<unsigned char> zeros(512, 0);
        EXPECT_TRUE(sector_is(b, o - 64 * kK) || sector_is(zeros, 0)) << "seed " << seed << " sector " << s;
      }
    }
  }
  // Over 16 seeds each fate happened (the outcome is really random, not "keep everything").
  EXPECT_GT(kept, 0u);
  EXPECT_GT(dropped, 0u);
  EXPECT_GT(torn, 0u);
  // A seed replays its outcome.
  ASSERT_TRUE(crash_after_writes(dir.file("again1"), 5));
  ASSERT_TRUE(crash_after_writes(dir.file("again2"), 5));
  EXPECT_EQ(bytes_of(dir.file("again1")), bytes_of(dir.file("again2")));
}

}  // namespace
}  // namespace deepio::test
