// The processes of one `deepio bench` run (ds_io's Pool + Barrier) and how they meet.
//
// Two implementations, one interface:
//  * local: the parent forks N worker processes (before any thread or handle exists) that
//    share an anonymous mapping holding a process-shared barrier and one report slot each.
//    If a worker fails or dies, the barrier is aborted so the others stop instead of hanging.
//  * MPI: when started by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set), each
//    rank is one worker; barriers and the final gather go through MPI. MPI is not linked into
//    the `deepio` executable: a small plugin (libdeepio_cli_mpi.so, built only when CMake finds
//    MPI) is dlopen()ed at run time, so the command runs on machines without MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace deepio::cli {

/// What one worker reports back (fixed size: it crosses process boundaries as bytes).
struct ProcReport {
  double e2e_sec = 0.0;   ///< Σ main-task seconds (includes waiting at the per-iteration barrier)
  double task_sec = 0.0;  ///< Σ engine seconds
  std::uint64_t bytes = 0;
  double cpu_sec = 0.0;
  std::uint64_t bytes_direct = 0, bytes_bounced = 0, bytes_buffered = 0, direct_refused = 0;
  int backend = 0;  ///< deepio::BackendKind actually used
  /// --gpu: device memory moved through cuFile / staged (GdsStats; a plain Handle stages all),
  /// operations cuFile refused, and how the handle ran ("staged", or GdsHandle's mode: reason).
  std::uint64_t bytes_cufile = 0, bytes_staged = 0, files_fallback = 0;
  char gpu_mode[256] = {};
  int failed = 0;
  char error[256] = {};
};

class Group {
 public:
  virtual ~Group() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  /// Waits for every process. Returns false when the run was aborted (a process failed).
  virtual bool barrier() = 0;
  /// Marks the run failed so every barrier returns false.
  virtual void abort() = 0;
};

/// How this process was launched.
struct Launch {
  bool mpi = false;      ///< started by an MPI launcher with more than one rank
  int world_size = 1;    ///< from the launcher's environment
  std::string launcher;  ///< which variable said so
};
[[nodiscard]] Launch detect_launch();

/// Runs `body` in `n` forked processes (in this process when n == 1) and returns their
/// reports in rank order. A process that crashes yields a report with failed = 1.
std::vector<ProcReport> run_local(int n, const std::function<ProcReport(Group&)>& body);

/// Runs `body` once in this MPI rank and gathers all ranks' reports at rank 0 (empty on the
/// others). Throws std::runtime_error with the reason when the MPI plugin cannot be loaded.
struct MpiRun {
  int rank = 0;
  int size = 1;
  std::vector<ProcReport> reports;  ///< rank 0 only
  std::string library;              ///< MPI library version string
};
MpiRun run_mpi(int* argc, char*** argv, const std::function<ProcReport(Group&)>& body);
/// Where the plugin was looked for, and whether it loaded (for `deepio info`).
std::string mpi_plugin_status();

}  // namespace deepio::cli
