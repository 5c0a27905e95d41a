#include "fio.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "format.hpp"
#include "json.hpp"
#include "process.hpp"

namespace deepio::cli {

std::string fio_engine_for(BackendKind kind) {
  switch (kind) {
    case BackendKind::IoUring: return "io_uring";
    case BackendKind::Libaio: return "libaio";
    default: return "psync";
  }
}

std::string fio_version(const std::string& fio_path) {
  ProcessResult p = run_process({fio_path, "--version"});
  if (!p.ok()) return {};
  while (!p.out.empty() && (p.out.back() == '\n' || p.out.back() == '\r')) p.out.pop_back();
  return p.out;
}

std::vector<std::string> fio_argv(const std::string& fio_path, const FioJob& job) {
  const std::uint64_t per_job = job.nbytes / job.numjobs;
  std::vector<std::string> argv = {fio_path,
                                   "--name=deepio-ceiling",
                                   "--filename=" + job.path,
                                   std::string("--rw=") + (job.write ? "write" : "read"),
                                   "--bs=" + std::to_string(job.block_size),
                                   "--iodepth=" + std::to_string(job.iodepth),
                                   "--ioengine=" + job.ioengine,
                                   std::string("--direct=") + (job.direct ? "1" : "0"),
                                   "--size=" + std::to_string(per_job),
                                   "--numjobs=" + std::to_string(job.numjobs),
                                   "--group_reporting",
                                   "--thread",
                                   std::string("--fallocate=") + (job.preallocate ? "native" : "none"),
                                   "--invalidate=1",
                                   "--output-format=json"};
  if (job.numjobs > 1) argv.push_back("--offset_increment=" + std::to_string(per_job));
  if (job.write) argv.push_back("--end_fsync=1");
  if (!job.mem.empty()) argv.push_back("--mem=" + job.mem);
  if (job.hugepage_bytes != 0) argv.push_back("--hugepage-size=" + std::to_string(job.hugepage_bytes));
  if (job.extra_paths.empty()) return argv;
  // Several files: the common options become fio's global section; one job per file after it.
  std::vector<std::string> multi = {fio_path};
  for (std::size_t i = 3; i < argv.size(); ++i) {
    if (argv[i] != "--group_reporting") multi.push_back(argv[i]);
  }
  for (std::size_t i = 0; i <= job.extra_paths.size(); ++i) {
    multi.push_back("--name=deepio-ceiling-" + std::to_string(i));
    multi.push_back("--filename=" + (i == 0 ? job.path : job.extra_paths[i - 1]));
  }
  return multi;
}

FioResult parse_fio_report_files(std::string_view out, bool write, std::size_t files) {
  FioResult r;
  const auto brace = out.find('{');
  std::string perr;
  auto doc = brace == std::string_view::npos ? std::nullopt : parse_json(out.substr(brace), &perr);
  const JsonValue* jobs = doc ? doc->get("jobs") : nullptr;
  if (jobs == nullptr || jobs->at(0) == nullptr) {
    r.error = "cannot parse fio's JSON output" + (perr.empty() ? "" : ": " + perr);
    return r;
  }
  r.file_bytes.assign(files, 0);
  double runtime_ms = 0, cpu = 0;
  for (std::size_t k = 0; const JsonValue* j = jobs->at(k); ++k) {
    const JsonValue* name = j->get("jobname");
    const JsonValue* side = j->get(write ? "write" : "read");
    const std::string prefix = "deepio-ceiling-";
    const std::string n = name != nullptr ? name->string : std::string();
    if (side == nullptr || n.rfind(prefix, 0) != 0) continue;
    const auto i = parse_uint(n.substr(prefix.size()));
    if (!i || *i >= files) continue;
    r.file_bytes[*i] += static_cast<std::uint64_t>(side->num("io_bytes"));
    runtime_ms = std::max(runtime_ms, side->num("runtime"));
    cpu += (j->num("usr_cpu") + j->num("sys_cpu")) / 100.0 * j->num("job_runtime", side->num("runtime")) / 1000.0;
  }
  for (std::size_t i = 0; i < files; ++i) {
    if (r.file_bytes[i] == 0) {
      r.error = "fio reported no I/O for file " + std::to_string(i);
      return r;
    }
    r.sample.nbytes += r.file_bytes[i];
  }
  if (runtime_ms <= 0) {
    r.error = "fio reported no I/O";
    return r;
  }
  r.sample.seconds = runtime_ms / 1000.0;
  r.sample.cpu_seconds = cpu;
  r.ok = true;
  return r;
}

FioResult parse_fio_report(std::string_view out, bool write) {
  FioResult r;
  const auto brace = out.find('{');
  std::string perr;
  auto doc = brace == std::string_view::npos ? std::nullopt : parse_json(out.substr(brace), &perr);
  const JsonValue* jobs = doc ? doc->get("jobs") : nullptr;
  const JsonValue* j0 = jobs ? jobs->at(0) : nullptr;
  const JsonValue* side = j0 ? j0->get(write ? "write" : "read") : nullptr;
  if (side == nullptr) {
    r.error = "cannot parse fio's JSON output" + (perr.empty() ? "" : ": " + perr);
    return r;
  }
  const double io_bytes = side->num("io_bytes");
  const double runtime_ms = side->num("runtime");
  if (io_bytes <= 0 || runtime_ms <= 0) {
    r.error = "fio reported no I/O";
    return r;
  }
  // usr_cpu/sys_cpu are percentages of job_runtime for the (group-reported) job.
  const double cpu_pct = j0->num("usr_cpu") + j0->num("sys_cpu");
  const double job_runtime_ms = j0->num("job_runtime", runtime_ms);
  r.sample.nbytes = static_cast<std::uint64_t>(io_bytes);
  r.sample.seconds = runtime_ms / 1000.0;
  r.sample.cpu_seconds = cpu_pct / 100.0 * job_runtime_ms / 1000.0;
  r.ok = true;
  return r;
}

FioResult run_fio(const std::string& fio_path, const FioJob& job) {
  const std::vector<std::string> argv = fio_argv(fio_path, job);
  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
  const ProcessResult p = run_process(argv);
  FioResult r;
  if (p.ok()) {
    r = job.extra_paths.empty() ? parse_fio_report(p.out, job.write)
                                : parse_fio_report_files(p.out, job.write, job.extra_paths.size() + 1);
  }
  r.command = command;
  if (!p.started()) {
    r.error = "cannot run " + fio_path + ": " + std::strerror(p.spawn_errno);
  } else if (!p.ok()) {
    const std::string line = p.err.substr(0, p.err.find('\n'));
    r.error = "fio exited with status " + std::to_string(p.status) + (line.empty() ? "" : ": " + line);
  }
  return r;
}

}  // namespace deepio::cli
