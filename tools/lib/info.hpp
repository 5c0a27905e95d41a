// `deepio info`: what DeepSpeed's ds_report says about async_io and gds, and what deepio
// adds: every backend and why it is or is not usable, a folder's file system and direct-I/O
// alignment, the memlock limit, and whether CUDA, cuFile, MPI and fio were found.
//
// CUDA and cuFile are reported by the GPU layer (deepio::gpu_info(): the same run-time loader
// the library uses, so what info says is what a handle will get). gather_info never throws:
// a folder that cannot be probed is reported in `dio_error`.
#pragma once

#include <cstdint>
#include <string>

#include "deepio/deepio.hpp"
#include "deepio/gpu.hpp"
#include "group.hpp"

namespace deepio::cli {

struct InfoReport {
  Capabilities caps;
  std::string sysname, release, machine;  ///< uname(2)
  std::string folder;
  DirectIoInfo dio;
  std::string dio_error;  ///< not empty: the folder could not be probed
  std::uint64_t free_bytes = 0, ram_bytes = 0;
  bool ipc_lock = false;  ///< CAP_IPC_LOCK: RLIMIT_MEMLOCK does not apply
  GpuInfo gpu;
  Launch launch;
  std::string mpi_status;  ///< "plugin found (...)" or why not
  std::string fio, fio_version;
  std::string uring_disabled;  ///< kernel.io_uring_disabled, "" when absent
  std::string seccomp;
  std::string python;     ///< the interpreter asked about DeepSpeed ("" when none was found)
  std::string deepspeed;  ///< what that interpreter says (deepio.deepspeed.status()), or why nothing
  bool deepspeed_installed = false, deepspeed_switch = false;
  [[nodiscard]] bool any_async() const;  ///< ds_report's async_io: a backend other than threads works
  [[nodiscard]] bool gds_ok() const { return gpu.gds_mode != "unavailable"; }  ///< gds_handle works
  [[nodiscard]] bool mpi_plugin() const { return mpi_status.rfind("plugin found", 0) == 0; }
};

/// Inspects this machine and `folder`.
InfoReport gather_info(const std::string& folder);
/// The text report (ds_report's lines first).
[[nodiscard]] std::string info_text(const InfoReport& r);
/// The --json document (schema deepio.info/1).
[[nodiscard]] std::string info_json(const InfoReport& r);

/// "/proc/self/status"'s Seccomp line in words: off, strict, filter (...), or "unknown".
[[nodiscard]] std::string seccomp_mode();
/// CAP_IPC_LOCK in the effective set (mlock then ignores RLIMIT_MEMLOCK; root usually has it).
[[nodiscard]] bool has_ipc_lock();

}  // namespace deepio::cli
