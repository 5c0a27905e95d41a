// The `deepio` command: bench (DeepSpeed's ds_io and a comparison against the baselines),
// tune (ds_nvme_tune with early stopping) and info (ds_report and more).
//
// Errors: bad arguments print one line each and exit 2; failed runs exit 1; nothing escapes
// as an uncaught exception or a core dump.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "commands.hpp"
#include "deepio/version.hpp"

namespace {

const char* const kUsage =
    "usage: deepio [--version] [--help] <command> [options]\n"
    "\n"
    "commands:\n"
    "  bench   measure I/O: with no options, deepio vs a naive copy vs the device ceiling (fio);\n"
    "          with --io_size, DeepSpeed's ds_io (same flags, same output lines)\n"
    "  tune    find the best block_size, queue_depth, single_submit, overlap_events and\n"
    "          intra_op_parallelism for a folder; prints DeepSpeed's \"aio\" config section\n"
    "  info    what deepio can do here: backends, direct I/O, memlock, CUDA, cuFile, MPI;\n"
    "          --kv FOLDER: a deepio.kv store's folders, read-only\n"
    "\n"
    "Run `deepio <command> --help` for a command's options.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    // The main job: `deepio` alone is not a command; show what there is.
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "--version" || cmd == "-V" || cmd == "version") {
      std::printf("deepio %s\n", deepio::version());
      return 0;
    }
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (cmd == "bench") return deepio::cli::cmd_bench(argc - 1, argv + 1);
    if (cmd == "tune") return deepio::cli::cmd_tune(argc - 1, argv + 1);
    if (cmd == "info") return deepio::cli::cmd_info(argc - 1, argv + 1);
    std::fprintf(stderr, "deepio: error: unknown command '%s' (commands: bench, tune, info; see --help)\n",
                 cmd.c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "deepio %s: error: out of memory\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepio %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
