// Test-only fault injection: `_deepio._set_fault(...)` / `_deepio._clear_fault()`, and the
// power-loss simulator: `_crash_start()`, `_crash_flush(fd)`, `_crash(seed)`.
// Compiled only into test builds (CMake option DEEPIO_TEST_HOOKS, python/CMakeLists.txt), so
// no wheel carries it.
//
// Installs a process-wide engine hook (src/platform/fault.hpp) that makes the n-th matching
// open/read/write fail with an errno or come back short. The hook runs on engine worker
// threads: it touches only its own atomics, never Python. Not for production use; not
// thread-safe against I/O in flight (install and clear it between operations).
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cerrno>
#include <chrono>
#include <thread>
#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "platform/crash_sim.hpp"
#include "platform/fault.hpp"

namespace deepio::py {

namespace {

struct FaultRule {
  detail::FaultPoint point = detail::FaultPoint::Read;
  std::optional<int> err;
  std::optional<std::int64_t> short_bytes;
  std::chrono::microseconds delay{0};
  std::uint64_t after = 0;
  std::uint64_t count = 1;
  std::string path_contains;  // empty matches every call; else Open/Sync by path, Read/Write by fd
  std::atomic<std::uint64_t> seen{0};
  std::atomic<std::uint64_t> fired{0};
};

std::shared_ptr<FaultRule> g_rule;                  // GIL
std::unique_ptr<detail::CrashRecorder> g_recorder;  // GIL

std::optional<std::int64_t> apply(FaultRule& rule, const detail::FaultSite& site) {
  if (site.point != rule.point) return std::nullopt;
  if (!rule.path_contains.empty()) {
    // Open and Sync name the path; Read and Write give the descriptor, named through /proc
    // (so a test's rule never fires on another engine's I/O in the same process).
    std::string path;
    if (site.path != nullptr) {
      path = site.path;
    } else if (site.fd >= 0) {
      char link[64], target[4096];
      std::snprintf(link, sizeof link, "/proc/self/fd/%d", site.fd);
      const ssize_t n = ::readlink(link, target, sizeof target - 1);
      if (n > 0) path.assign(target, static_cast<std::size_t>(n));
    }
    if (path.find(rule.path_contains) == std::string::npos) return std::nullopt;
  }
  const std::uint64_t n = rule.seen.fetch_add(1);
  if (n < rule.after || n - rule.after >= rule.count) return std::nullopt;
  if (rule.delay.count() > 0) {
    // A slow device: the worker sits on this completion (tests of waiting and Ctrl-C).
    std::this_thread::sleep_for(rule.delay);
    if (!rule.err && !rule.short_bytes) rule.fired.fetch_add(1);
  }
  if (rule.err) {
    rule.fired.fetch_add(1);
    return -static_cast<std::int64_t>(*rule.err);
  }
  if (rule.short_bytes && site.point != detail::FaultPoint::Open && site.result > *rule.short_bytes) {
    rule.fired.fetch_add(1);
    return *rule.short_bytes;
  }
  return std::nullopt;
}

}  // namespace

void init_fault(nb::module_& m) {
  m.def(
      "_set_fault",
      [](const std::string& point, std::optional<int> err, std::optional<std::int64_t> short_bytes, std::int64_t after,
         std::int64_t count, const std::string& path_contains, double delay) {
        auto rule = std::make_shared<FaultRule>();
        if (point == "open") {
          rule->point = detail::FaultPoint::Open;
        } else if (point == "read") {
          rule->point = detail::FaultPoint::Read;
        } else if (point == "write") {
          rule->point = detail::FaultPoint::Write;
        } else if (point == "sync") {
          rule->point = detail::FaultPoint::Sync;  // the fdatasync of a write with fsync=True
        } else {
          throw nb::value_error("point must be 'open', 'read', 'write' or 'sync'");
        }
        if (err.has_value() && short_bytes.has_value()) throw nb::value_error("give errno= or short=, not both");
        if (!err && !short_bytes && delay <= 0) throw nb::value_error("give errno=, short= or delay=");
        if (delay < 0 || delay > 3600) throw nb::value_error("delay must be between 0 and 3600 seconds");
        if (err && *err <= 0) throw nb::value_error("errno must be positive");
        if (short_bytes && *short_bytes < 0) throw nb::value_error("short must be non-negative");
        if (after < 0 || count < 0) throw nb::value_error("after and count must be non-negative");
        rule->err = err;
        rule->short_bytes = short_bytes;
        rule->after = static_cast<std::uint64_t>(after);
        rule->count = static_cast<std::uint64_t>(count);
        rule->path_contains = path_contains;
        rule->delay = std::chrono::microseconds(static_cast<std::int64_t>(delay * 1e6));
        g_recorder.reset();
        g_rule = rule;
        detail::set_fault_hook([rule](const detail::FaultSite& site) { return apply(*rule, site); });
      },
      nb::arg("point"), nb::arg("errno").none() = nb::none(), nb::arg("short").none() = nb::none(),
      nb::arg("after") = 0, nb::arg("count") = 1, nb::arg("path_contains") = "", nb::arg("delay") = 0.0,
      "TESTING ONLY. Makes matching calls number after .. after+count-1 (0-based) of `point` fail with "
      "`errno`, report only `short` bytes, and/or take `delay` extra seconds (on the engine's worker).");
  m.def(
      "_clear_fault",
      [] {
        g_recorder.reset();
        detail::set_fault_hook({});
        g_rule.reset();
      },
      "TESTING ONLY. Removes the fault hook.");
  m.def(
      "_crash_start",
      [](std::size_t tear_bytes) {
        g_rule.reset();
        g_recorder.reset();
        g_recorder = std::make_unique<detail::CrashRecorder>(tear_bytes);
      },
      nb::arg("tear_bytes") = 512,
      "TESTING ONLY. Records every write and flush of the engine for a simulated power loss "
      "(src/platform/crash_sim.hpp); replaces any fault rule.");
  m.def(
      "_crash_flush",
      [](int fd) {
        if (g_recorder) g_recorder->note_flush(fd);
      },
      nb::arg("fd"), "TESTING ONLY. Tells the recorder of a flush of fd made outside the engine (before it starts).");
  m.def(
      "_crash",
      [](std::uint64_t seed) {
        if (!g_recorder) throw nb::value_error("_crash_start() first");
        detail::CrashReport r;
        {
          nb::gil_scoped_release unlocked;  // waits for the requests in flight
          r = g_recorder->crash(seed);
        }
        nb::dict d;
        d["files"] = r.files;
        d["writes_kept"] = r.writes_kept;
        d["writes_dropped"] = r.writes_dropped;
        d["writes_torn"] = r.writes_torn;
        return d;
      },
      nb::arg("seed"),
      "TESTING ONLY. The simulated power loss: the files as it could leave them. The process must end next "
      "(os._exit).");
  m.def(
      "_fault_hits", [] { return g_rule ? g_rule->fired.load() : std::uint64_t{0}; },
      "TESTING ONLY. How many calls the current rule changed.");
}

}  // namespace deepio::py
