// `deepio info`: what DeepSpeed's ds_report says about async_io and gds, and what deepio
// adds: every backend and why it is or is not usable, a folder's file system and direct-I/O
// alignment, the memlock limit, and whether CUDA, cuFile, MPI and fio were found.
//
// CUDA and cuFile are reported by the GPU layer (deepio::gpu_info(): the same run-time loader
// the library uses, so what info says is what a handle will get).
#include <sys/utsname.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "cli_util.hpp"
#include "commands.hpp"
#include "deepio/deepio.hpp"
#include "deepio/gpu.hpp"
#include "group.hpp"
#include "measure.hpp"

namespace deepio::cli {

namespace {

const char* const kProg = "deepio info";

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  return line;
}

std::string seccomp_mode() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Seccomp:", 0) == 0) {
      const std::string v = line.substr(line.find_first_not_of(" \t", 8));
      if (v == "0") return "off";
      if (v == "1") return "strict";
      if (v == "2") return "filter (a container profile may block io_uring)";
      return v;
    }
  }
  return "unknown";
}

/// CAP_IPC_LOCK in the effective set: mlock ignores RLIMIT_MEMLOCK (root usually has it).
bool has_ipc_lock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1ULL;  // CAP_IPC_LOCK = 14
    }
  }
  return false;
}

std::string dots(const std::string& name, std::size_t width) {
  std::string s = name + " ";
  if (s.size() < width) s.append(width - s.size(), '.');
  return s;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  ArgParser parser(kProg,
                   "Show what deepio can do on this machine: version, backends and why one is or is not\n"
                   "usable, the file system and direct-I/O alignment of a folder, the memlock limit, and\n"
                   "whether CUDA, cuFile, MPI and fio were found (ds_report's async_io/gds lines included).");
  parser.value("--folder", "FOLDER", "Folder to inspect (default: where `deepio bench` would write)");
  parser.flag("--json", "Print one JSON object instead of text");
  std::vector<std::string> errors;
  ParsedArgs a = parser.parse(argc, argv, 1, errors);
  if (a.has("--help")) {
    std::fputs(parser.help().c_str(), stdout);
    return 0;
  }
  std::string folder = a.get("--folder");
  if (a.has("--folder")) {
    if (auto problem = folder_problem(folder); !problem.empty() && problem.find("not writable") == std::string::npos) {
      errors.push_back(problem);
    }
  }
  if (!errors.empty()) return print_errors(kProg, errors);
  if (folder.empty()) {
    folder = pick_disk_folder(nullptr);
    if (folder.empty()) folder = ".";
  }

  const Capabilities caps = capabilities();
  utsname un{};
  ::uname(&un);
  DirectIoInfo dio;
  std::string dio_error;
  try {
    dio = probe_direct_io(folder);
  } catch (const std::exception& e) {
    dio_error = e.what();
  }
  const GpuInfo gpu = gpu_info();
  const bool gds_ok = gpu.gds_mode != "unavailable";  // gds_handle works (GDS proper or compat)
  const Launch launch = detect_launch();
  const std::string mpi_status = mpi_plugin_status();
  const bool mpi_plugin = mpi_status.rfind("plugin found", 0) == 0;
  const std::string fio = find_on_path("fio");
  const std::string fio_ver = fio.empty() ? std::string() : fio_version(fio);
  const std::string uring_disabled = read_first_line("/proc/sys/kernel/io_uring_disabled");
  const std::string seccomp = seccomp_mode();
  bool any_async = false;
  for (const auto& b : caps.backends) {
    if (b.available && b.kind != BackendKind::Threads) any_async = true;
  }
  const bool ipc_lock = has_ipc_lock();
  const std::string memlock = caps.memlock_limit_bytes == UINT64_MAX ? "unlimited" : human_bytes(caps.memlock_limit_bytes);

  if (a.has("--json")) {
    Json j;
    j.begin_object();
    j.value("schema", "deepio.info/1");
    j.value("version", caps.version);
    j.value("kernel", std::string(un.sysname) + " " + un.release);
    j.value("auto_backend", to_string(caps.auto_choice));
    j.begin_array("backends");
    for (const auto& b : caps.backends) {
      j.begin_object();
      j.value("name", to_string(b.kind));
      j.value("compiled", b.compiled);
      j.value("available", b.available);
      j.value("reason", b.reason);
      j.end_object();
    }
    j.end_array();
    j.begin_object("folder");
    j.value("path", folder);
    if (!dio_error.empty()) {
      j.value("error", dio_error);
    } else {
      j.value("filesystem", dio.filesystem);
      j.value("direct_io", dio.supported);
      j.value("mem_align", static_cast<std::uint64_t>(dio.mem_align));
      j.value("offset_align", static_cast<std::uint64_t>(dio.offset_align));
      j.value("alignment_from_statx", dio.from_statx);
      j.value("reason", dio.reason);
    }
    j.value("free_bytes", free_disk_bytes(folder));
    j.end_object();
    j.value("memlock_limit_bytes", caps.memlock_limit_bytes);
    j.value("cap_ipc_lock", ipc_lock);
    j.value("physical_memory_bytes", physical_memory_bytes());
    j.begin_object("cuda");
    j.value("library", gpu.cuda_library);
    j.value("found", gpu.cuda_found);
    j.value("detail", gpu.cuda_reason);
    j.value("driver_version", static_cast<std::uint64_t>(gpu.driver_version));
    j.value("device_count", static_cast<std::uint64_t>(gpu.device_count));
    j.end_object();
    j.begin_object("cufile");
    j.value("library", gpu.cufile_library);
    j.value("found", gpu.cufile_found);
    j.value("detail", gpu.cufile_reason);
    j.value("nvidia_fs", gpu.nvidia_fs_loaded);
    j.end_object();
    j.begin_object("gds");
    j.value("mode", gpu.gds_mode);
    j.value("reason", gpu.gds_reason);
    j.end_object();
    j.begin_object("mpi");
    j.value("plugin", mpi_plugin);
    j.value("detail", mpi_status);
    j.value("launched_by_mpi", launch.mpi);
    j.end_object();
    j.begin_object("ds_report");
    j.value("async_io", any_async);
    j.value("gds", gds_ok);
    j.end_object();
    if (fio.empty()) j.null("fio");
    else j.value("fio", fio_ver.empty() ? fio : fio_ver);
    j.value("io_uring_disabled_sysctl", uring_disabled);
    j.value("seccomp", seccomp);
    j.end_object();
    std::fputs(j.str().c_str(), stdout);
    return 0;
  }

  std::printf("deepio %s\n", caps.version.c_str());
  std::printf("kernel: %s %s (%s)\n", un.sysname, un.release, un.machine);
  std::printf("\nDeepSpeed op report (ds_report)\n");
  std::printf("%s installed .. compatible\n", dots("op name", 24).c_str());
  std::printf("%s [YES] ...... %s\n", dots("async_io", 24).c_str(), any_async ? "[OKAY]" : "[NO]");
  std::printf("%s [YES] ...... %s\n", dots("gds", 24).c_str(), gds_ok ? "[OKAY]" : "[NO]");
  std::printf("  (deepio is compiled ahead of time: nothing is JIT-built; CUDA and cuFile are loaded at\n"
              "   run time when present.)\n");
  std::printf("\nbackends (auto picks %s):\n", std::string(to_string(caps.auto_choice)).c_str());
  for (const auto& b : caps.backends) {
    std::printf("  %-9s %-13s %s\n", std::string(to_string(b.kind)).c_str(),
                !b.compiled ? "not compiled" : b.available ? "available" : "unavailable",
                b.reason.empty() ? "" : b.reason.c_str());
  }
  std::printf("  io_uring sysctl kernel.io_uring_disabled = %s; seccomp: %s\n",
              uring_disabled.empty() ? "(absent)" : uring_disabled.c_str(), seccomp.c_str());
  std::printf("\nfolder %s:\n", folder.c_str());
  if (!dio_error.empty()) {
    std::printf("  cannot probe: %s\n", dio_error.c_str());
  } else {
    std::printf("  file system %s, O_DIRECT %s, alignment: buffer %u, offset/length %u (%s)\n",
                dio.filesystem.c_str(), dio.supported ? "supported" : "NOT supported (buffered I/O)",
                dio.mem_align, dio.offset_align, dio.reason.c_str());
  }
  std::printf("  free space %s\n", human_bytes(free_disk_bytes(folder)).c_str());
  std::printf("\nmemory: RAM %s, RLIMIT_MEMLOCK %s%s\n", human_bytes(physical_memory_bytes()).c_str(), memlock.c_str(),
              ipc_lock ? " (not enforced: this process has CAP_IPC_LOCK)"
              : caps.memlock_limit_bytes != UINT64_MAX && caps.memlock_limit_bytes < (1ULL << 30)
                  ? " (larger pinned buffers are allocated unlocked; raise with ulimit -l)"
                  : "");
  if (gpu.cuda_found) {
    std::printf("\nCUDA driver (%s): found, version %d, %d device(s)\n", gpu.cuda_library.c_str(), gpu.driver_version,
                gpu.device_count);
  } else {
    std::printf("\nCUDA driver: not usable: %s\n", gpu.cuda_reason.c_str());
  }
  std::printf("cuFile: %s\n", gpu.cufile_found ? ("found (" + gpu.cufile_library + ")").c_str()
                                                : ("not usable: " + gpu.cufile_reason).c_str());
  std::printf("GPU tensors / gds_handle: %s%s%s\n", gpu.gds_mode.c_str(), gpu.gds_reason.empty() ? "" : ": ",
              gpu.gds_reason.c_str());
  std::printf("MPI for `deepio bench` under mpirun: %s%s\n", mpi_status.c_str(),
              launch.mpi ? (", launched by " + launch.launcher).c_str() : "");
  std::printf("fio: %s\n", fio.empty() ? "not found on PATH (bench measures the ceiling with a raw O_DIRECT loop)"
                                       : (fio + " (" + fio_ver + ")").c_str());
  return 0;
}

}  // namespace deepio::cli
