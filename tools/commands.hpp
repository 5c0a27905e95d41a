// The subcommands of `deepio`: thin commands that read the command line, call tools/lib and
// print. Each returns the process exit status: 0 success, 1 a run that failed (I/O error,
// validation mismatch), 2 bad command-line arguments.
#pragma once

namespace deepio::cli {

int cmd_bench(int argc, char** argv);  ///< argv[0] is "bench"
int cmd_tune(int argc, char** argv);   ///< argv[0] is "tune"
int cmd_info(int argc, char** argv);   ///< argv[0] is "info"

}  // namespace deepio::cli
