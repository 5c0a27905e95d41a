#include "info.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fio.hpp"
#include "format.hpp"
#include "json.hpp"
#include "process.hpp"
#include "system.hpp"
#include "table.hpp"

namespace deepio::cli {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  return line;
}

/// The value of "<key>" in /proc/self/status, or "" when absent.
std::string proc_status(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto v = line.find_first_not_of(" \t", key.size());
      return v == std::string::npos ? std::string() : line.substr(v);
    }
  }
  return {};
}

std::string memlock_text(std::uint64_t limit) { return limit == UINT64_MAX ? "unlimited" : human_bytes(limit); }

}  // namespace

std::string seccomp_mode() {
  const std::string v = proc_status("Seccomp:");
  if (v.empty()) return "unknown";
  if (v == "0") return "off";
  if (v == "1") return "strict";
  if (v == "2") return "filter (a container profile may block io_uring)";
  return v;
}

bool has_ipc_lock() {
  const std::string v = proc_status("CapEff:");
  if (v.empty()) return false;
  const unsigned long long caps = std::strtoull(v.c_str(), nullptr, 16);
  return (caps >> 14) & 1ULL;  // CAP_IPC_LOCK = 14
}

bool InfoReport::any_async() const {
  for (const auto& b : caps.backends) {
    if (b.available && b.kind != BackendKind::Threads) return true;
  }
  return false;
}

namespace {

// The Python that `deepio` belongs to: $DEEPIO_PYTHON, else a python3 beside this executable
// (the wheel's scripts folder), else python3 on PATH.
std::string find_python() {
  if (const char* env = std::getenv("DEEPIO_PYTHON"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto beside = self.parent_path() / "python3";
    if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  return find_on_path("python3");
}

// Asks `python` (inheriting our environment, so DEEPIO_DEEPSPEED counts as it would for a
// program started from here) whether DeepSpeed is installed and the switch is on.
void ask_deepspeed(InfoReport& r) {
  r.python = find_python();
  if (r.python.empty()) {
    r.deepspeed = "no python3 found (set DEEPIO_PYTHON)";
    return;
  }
  const ProcessResult p = run_process({r.python, "-c",
                                       "import deepio.deepspeed as d; s = d.status(); "
                                       "print(int(s['deepspeed_installed']), s['deepspeed_version'] or '-', "
                                       "int(s['startup_hook']), int(s['active']))"});
  unsigned installed = 0, hook = 0, active = 0;
  char version[64] = {};
  if (!p.ok() || std::sscanf(p.out.c_str(), "%u %63s %u %u", &installed, version, &hook, &active) != 4) {
    r.deepspeed = "deepio's Python package is not importable there";
    return;
  }
  r.deepspeed_installed = installed != 0;
  r.deepspeed_switch = active != 0;
  if (!r.deepspeed_installed) {
    r.deepspeed = "not installed";
  } else if (r.deepspeed_switch) {
    r.deepspeed = std::string(version) +
                  ", on deepio (DEEPIO_DEEPSPEED=1): its async_io, gds, pin_memory and utils ops are deepio's";
  } else {
    r.deepspeed = std::string(version) +
                  ", switch off (DEEPIO_DEEPSPEED=1, or deepio.deepspeed.install(), puts it on deepio)" +
                  (hook != 0 ? "" : "; deepio-deepspeed.pth is missing, so only install() works");
  }
}

}  // namespace

InfoReport gather_info(const std::string& folder) {
  InfoReport r;
  r.caps = capabilities();
  utsname un{};
  ::uname(&un);
  r.sysname = un.sysname;
  r.release = un.release;
  r.machine = un.machine;
  r.folder = folder;
  try {
    r.dio = probe_direct_io(folder);
  } catch (const std::exception& e) {
    r.dio_error = e.what();
  }
  r.free_bytes = free_disk_bytes(folder);
  r.ram_bytes = physical_memory_bytes();
  r.gpu = gpu_info();
  r.launch = detect_launch();
  r.mpi_status = mpi_plugin_status();
  r.fio = find_on_path("fio");
  r.fio_version = r.fio.empty() ? std::string() : fio_version(r.fio);
  r.uring_disabled = read_first_line("/proc/sys/kernel/io_uring_disabled");
  r.seccomp = seccomp_mode();
  r.ipc_lock = has_ipc_lock();
  ask_deepspeed(r);
  return r;
}

// ---- text --------------------------------------------------------------------------------

namespace {

std::string ds_report_lines(const InfoReport& r) {
  std::string s = "\nDeepSpeed op report (ds_report)\n";
  s += dots("op name", 24) + " installed .. compatible\n";
  s += dots("async_io", 24) + " [YES] ...... " + (r.any_async() ? "[OKAY]" : "[NO]") + "\n";
  s += dots("gds", 24) + " [YES] ...... " + (r.gds_ok() ? "[OKAY]" : "[NO]") + "\n";
  s += "  (deepio is compiled ahead of time: nothing is JIT-built; CUDA and cuFile are loaded at\n"
       "   run time when present.)\n";
  return s;
}

std::string backend_lines(const InfoReport& r) {
  std::string s = "\nbackends (auto picks " + std::string(to_string(r.caps.auto_choice)) + "):\n";
  Table t({{9}, {13}, {0}}, 2);
  for (const auto& b : r.caps.backends) {
    t.row({std::string(to_string(b.kind)),
           !b.compiled   ? "not compiled"
           : b.available ? "available"
                         : "unavailable",
           b.reason});
  }
  s += t.str();
  s += "  io_uring sysctl kernel.io_uring_disabled = " + (r.uring_disabled.empty() ? "(absent)" : r.uring_disabled) +
       "; seccomp: " + r.seccomp + "\n";
  return s;
}

std::string folder_lines(const InfoReport& r) {
  std::string s = "\nfolder " + r.folder + ":\n";
  if (!r.dio_error.empty()) {
    s += "  cannot probe: " + r.dio_error + "\n";
  } else {
    s += "  file system " + r.dio.filesystem + ", O_DIRECT " +
         (r.dio.supported ? "supported" : "NOT supported (buffered I/O)") + ", alignment: buffer " +
         std::to_string(r.dio.mem_align) + ", offset/length " + std::to_string(r.dio.offset_align) + " (" +
         r.dio.reason + ")\n";
  }
  return s + "  free space " + human_bytes(r.free_bytes) + "\n";
}

std::string memory_line(const InfoReport& r) {
  const std::uint64_t limit = r.caps.memlock_limit_bytes;
  return "\nmemory: RAM " + human_bytes(r.ram_bytes) + ", RLIMIT_MEMLOCK " + memlock_text(limit) +
         (r.ipc_lock ? " (not enforced: this process has CAP_IPC_LOCK)"
          : limit != UINT64_MAX && limit < (1ULL << 30)
              ? " (larger locked buffers are allocated unlocked; raise with ulimit -l)"
              : "") +
         "\n";
}

std::string gpu_mpi_fio_lines(const InfoReport& r) {
  const GpuInfo& g = r.gpu;
  std::string s = g.cuda_found
                      ? "\nCUDA driver (" + g.cuda_library + "): found, version " + std::to_string(g.driver_version) +
                            ", " + std::to_string(g.device_count) + " device(s)\n"
                      : "\nCUDA driver: not usable: " + g.cuda_reason + "\n";
  s += "cuFile: " + (g.cufile_found ? "found (" + g.cufile_library + ")" : "not usable: " + g.cufile_reason) + "\n";
  s += "GPU tensors / gds_handle: " + g.gds_mode + (g.gds_reason.empty() ? "" : ": ") + g.gds_reason + "\n";
  s += "MPI for `deepio bench` under mpirun: " + r.mpi_status +
       (r.launch.mpi ? ", launched by " + r.launch.launcher : std::string()) + "\n";
  s += "fio: " +
       (r.fio.empty() ? std::string("not found on PATH (bench measures the ceiling with a raw O_DIRECT loop)")
                      : r.fio + " (" + r.fio_version + ")") +
       "\n";
  s += "DeepSpeed" + (r.python.empty() ? std::string() : " (for " + r.python + ")") + ": " + r.deepspeed + "\n";
  return s;
}

}  // namespace

std::string info_text(const InfoReport& r) {
  std::string s = "deepio " + r.caps.version + "\n";
  s += "kernel: " + r.sysname + " " + r.release + " (" + r.machine + ")\n";
  return s + ds_report_lines(r) + backend_lines(r) + folder_lines(r) + memory_line(r) + gpu_mpi_fio_lines(r);
}

// ---- JSON --------------------------------------------------------------------------------

namespace {

void json_backends_and_folder(Json& j, const InfoReport& r) {
  j.begin_array("backends");
  for (const auto& b : r.caps.backends) {
    j.begin_object();
    j.value("name", to_string(b.kind));
    j.value("compiled", b.compiled);
    j.value("available", b.available);
    j.value("reason", b.reason);
    j.end_object();
  }
  j.end_array();
  j.begin_object("folder");
  j.value("path", r.folder);
  if (!r.dio_error.empty()) {
    j.value("error", r.dio_error);
  } else {
    j.value("filesystem", r.dio.filesystem);
    j.value("direct_io", r.dio.supported);
    j.value("mem_align", static_cast<std::uint64_t>(r.dio.mem_align));
    j.value("offset_align", static_cast<std::uint64_t>(r.dio.offset_align));
    j.value("alignment_from_statx", r.dio.from_statx);
    j.value("reason", r.dio.reason);
  }
  j.value("free_bytes", r.free_bytes);
  j.end_object();
}

void json_gpu(Json& j, const GpuInfo& g) {
  j.begin_object("cuda");
  j.value("library", g.cuda_library);
  j.value("found", g.cuda_found);
  j.value("detail", g.cuda_reason);
  j.value("driver_version", static_cast<std::uint64_t>(g.driver_version));
  j.value("device_count", static_cast<std::uint64_t>(g.device_count));
  j.end_object();
  j.begin_object("cufile");
  j.value("library", g.cufile_library);
  j.value("found", g.cufile_found);
  j.value("detail", g.cufile_reason);
  j.value("nvidia_fs", g.nvidia_fs_loaded);
  j.end_object();
  j.begin_object("gds");
  j.value("mode", g.gds_mode);
  j.value("reason", g.gds_reason);
  j.end_object();
}

void json_mpi_and_rest(Json& j, const InfoReport& r) {
  j.begin_object("mpi");
  j.value("plugin", r.mpi_plugin());
  j.value("detail", r.mpi_status);
  j.value("launched_by_mpi", r.launch.mpi);
  j.end_object();
  j.begin_object("ds_report");
  j.value("async_io", r.any_async());
  j.value("gds", r.gds_ok());
  j.end_object();
  if (r.fio.empty()) j.null("fio");
  else j.value("fio", r.fio_version.empty() ? r.fio : r.fio_version);
  j.begin_object("deepspeed");
  j.value("python", r.python);
  j.value("installed", r.deepspeed_installed);
  j.value("switch_on", r.deepspeed_switch);
  j.value("detail", r.deepspeed);
  j.end_object();
  j.value("io_uring_disabled_sysctl", r.uring_disabled);
  j.value("seccomp", r.seccomp);
}

}  // namespace

std::string info_json(const InfoReport& r) {
  Json j;
  j.begin_object();
  j.value("schema", "deepio.info/1");
  j.value("version", r.caps.version);
  j.value("kernel", r.sysname + " " + r.release);
  j.value("auto_backend", to_string(r.caps.auto_choice));
  json_backends_and_folder(j, r);
  j.value("memlock_limit_bytes", r.caps.memlock_limit_bytes);
  j.value("cap_ipc_lock", r.ipc_lock);
  j.value("physical_memory_bytes", r.ram_bytes);
  json_gpu(j, r.gpu);
  json_mpi_and_rest(j, r);
  j.end_object();
  return j.str();
}

}  // namespace deepio::cli
