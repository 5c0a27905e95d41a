// Running another program (fio) and reading what it says.
//
// run_process starts argv[0] (looked up on PATH when it has no '/') with posix_spawnp — no
// shell, so arguments are never re-split or expanded — and captures its stdout and stderr
// through two pipes drained together with poll(2), so a child that fills one pipe while we
// wait on the other cannot deadlock. It waits for the child (EINTR retried) and reports how
// it ended. Thread-safe; the child inherits nothing but stdin and the two pipes (every fd this
// library opens is O_CLOEXEC).
#pragma once

#include <string>
#include <vector>

namespace deepio::cli {

struct ProcessResult {
  /// The exit status (0..255); 128 + signal number when killed by a signal; -1 when the
  /// program could not be started (then `spawn_errno` says why: ENOENT for a missing
  /// program, EACCES for one that is not executable, ...).
  int status = -1;
  int spawn_errno = 0;
  std::string out;  ///< everything it wrote on stdout
  std::string err;  ///< everything it wrote on stderr
  [[nodiscard]] bool started() const noexcept { return spawn_errno == 0; }
  [[nodiscard]] bool ok() const noexcept { return started() && status == 0; }
};

/// Runs argv to completion. An empty argv fails to start with EINVAL.
ProcessResult run_process(const std::vector<std::string>& argv);

/// Finds `name` on PATH (an empty PATH entry means the current folder); empty when absent
/// or not executable.
[[nodiscard]] std::string find_on_path(const std::string& name);

}  // namespace deepio::cli
