// The subcommands of `deepio`. Each returns the process exit status: 0 success, 1 a run that
// failed (I/O error, validation mismatch), 2 bad command-line arguments.
#pragma once

#include <string>

#include "deepio/options.hpp"

namespace deepio::cli {

int cmd_bench(int argc, char** argv);  ///< argv[0] is "bench"
int cmd_tune(int argc, char** argv);   ///< argv[0] is "tune"
int cmd_info(int argc, char** argv);   ///< argv[0] is "info"

/// Where the bench writes when no folder is given: DEEPIO_BENCH_DIR, TMPDIR, /var/tmp, /tmp,
/// the current folder — the first that is writable and not in memory (tmpfs/ramfs).
/// Empty when none qualifies; `why` then lists what was rejected.
std::string pick_disk_folder(std::string* why);

/// Creates "<parent>/deepio-<tag>-XXXXXX"; removes it (and the files registered with
/// register_temp_file) at exit, on SIGINT/SIGTERM and by remove_temp_dir().
std::string make_temp_dir(const std::string& parent, const std::string& tag);
void register_temp_file(const std::string& path);
void remove_temp_dir();

/// One line of progress on stderr, only when stderr is a terminal ("\r" rewrites it).
class Progress {
 public:
  Progress(std::size_t total, bool enabled);
  ~Progress();
  void step(const std::string& what);
  void done();

 private:
  std::size_t total_, current_ = 0;
  bool enabled_;
};

}  // namespace deepio::cli
