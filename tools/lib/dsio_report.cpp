#include "dsio_report.hpp"

#include <cstdio>

#include "format.hpp"
#include "json.hpp"

namespace deepio::cli {

namespace {

std::string namespace_line(const DsIoRequest& r) {
  const DsIoPlan& p = r.plan;
  std::string ns = "args = Namespace(folder=" + (r.folder ? py_str(*r.folder) : "None") +
                   ", folder_to_device_mapping=[";
  for (std::size_t i = 0; i < r.mapping_args.size(); ++i) ns += (i ? ", " : "") + py_str(r.mapping_args[i]);
  ns += "], io_size=" + std::to_string(p.io_size) + ", read=" + py_bool(p.read) + ", multi_process=" + r.multi_process +
        ", block_size=" + std::to_string(p.handle.block_size) +
        ", queue_depth=" + std::to_string(p.handle.queue_depth) + ", single_submit=" + py_bool(p.handle.single_submit) +
        ", sequential_requests=" + py_bool(!p.handle.overlap_events) + ", validate=" + py_bool(p.validate) +
        ", engine='aio_handle', loops=" + std::to_string(p.loops) + ", io_parallel=" + r.io_parallel.value_or("None") +
        ", gpu=" + py_bool(p.gpu) + ", use_gds=" + py_bool(p.use_gds) + ", warmup_loops=" + std::to_string(p.warmup) +
        ", include_warmup_time=" + py_bool(p.include_warmup) +
        ", different_file_each_iteration=" + py_bool(p.different_files) + ", backend='" +
        std::string(to_string(p.handle.backend)) + "')";
  return ns + "\n";
}

std::string settings_line(const DsIoPlan& p) {
  char line[512];
  std::snprintf(line, sizeof line,
                "tid 0: %s %s per process, %zu loop(s) after %zu warm-up, block_size %s, queue_depth %zu, "
                "overlap_events %s, single_submit %s, intra_op_parallelism %zu\n",
                p.read ? "read" : "write", size_label(p.io_size).c_str(), p.loops, p.warmup,
                size_label(p.handle.block_size).c_str(), p.handle.queue_depth,
                p.handle.overlap_events ? "true" : "false", p.handle.single_submit ? "true" : "false",
                p.handle.intra_op_parallelism);
  return line;
}

}  // namespace

std::string ds_io_header(const DsIoRequest& r, int processes, bool mpi) {
  std::string out = namespace_line(r) + "Successful validation of command line arguments\n";
  const std::string unit = r.plan.gpu ? "gpu" : "process";  // ds_io's words
  out += "Configuring " + std::to_string(processes) + " " + unit + " to folder mapping\n";
  for (int i = 0; i < processes && !r.mapping.empty(); ++i) {
    const auto& m = r.mapping[static_cast<std::size_t>(i) % r.mapping.size()];
    out += "[" + std::to_string(i) + "]: " + unit + " " + (mpi && !r.plan.gpu ? std::to_string(i) : m.second) +
           " <----> " + m.first + "\n";
  }
  return out + settings_line(r.plan);
}

namespace {

std::string io_summary(const DsIoTotals& t) {
  if (t.bytes_direct + t.bytes_bounced + t.bytes_buffered == 0 && t.bytes_cufile != 0) return "no host-side I/O";
  return io_path(t.bytes_direct, t.bytes_bounced, t.bytes_buffered, t.direct_refused);
}

double cpu_per_gib(const DsIoTotals& t) { return t.gib() > 0 ? t.cpu_sec / t.gib() : 0.0; }

}  // namespace

std::string gpu_summary(const DsIoPlan& p, const DsIoTotals& t) {
  if (!p.gpu) return {};
  if (!p.use_gds) return "GPU memory staged through page-locked slots (aio_handle)";
  const std::uint64_t all = t.bytes_cufile + t.bytes_staged;
  const double cufile = all ? 100.0 * static_cast<double>(t.bytes_cufile) / static_cast<double>(all) : 0.0;
  return "gds_handle " + t.gpu_mode + "; cuFile " + fixed(cufile, 0) + "%, staged " +
         fixed(all ? 100.0 - cufile : 0.0, 0) + "%, files cuFile refused " + std::to_string(t.files_fallback);
}

std::string ds_io_result_text(const DsIoRequest& r, const DsIoTotals& t, const std::string& mpi_library) {
  const std::string op = r.plan.read ? "Read" : "Write";
  const std::string gpu = gpu_summary(r.plan, t);
  std::string out = "tid 0: backend " + std::string(to_string(t.backend)) + ", " + io_summary(t) + ", " +
                    fixed(cpu_per_gib(t), 3) + " CPU s/GiB" + (mpi_library.empty() ? "" : ", MPI: ") + mpi_library +
                    "\n";
  if (!gpu.empty()) out += "tid 0: " + gpu + "\n";
  out += "Task " + op + " Latency = " + py_float(t.task_latency) + " sec\n";
  out += "Task " + op + " Speed = " + py_float(t.task_speed()) + " GB/sec\n";
  out += "E2E " + op + " Latency = " + py_float(t.e2e_latency) + " sec\n";
  out += "E2E " + op + " Speed = " + py_float(t.e2e_speed()) + " GB/sec\n";
  return out;
}

void handle_json_members(Json& j, const HandleOptions& h) {
  j.value("block_size", static_cast<std::uint64_t>(h.block_size));
  j.value("queue_depth", static_cast<std::uint64_t>(h.queue_depth));
  j.value("single_submit", h.single_submit);
  j.value("overlap_events", h.overlap_events);
  j.value("intra_op_parallelism", static_cast<std::uint64_t>(h.intra_op_parallelism));
}

namespace {

void config_object(Json& j, const HandleOptions& h, const DsIoTotals& t) {
  j.begin_object("config");
  handle_json_members(j, h);
  j.value("backend", to_string(t.backend));
  j.value("direct_io", to_string(h.direct_io));
  j.end_object();
}

void io_object(Json& j, const DsIoTotals& t) {
  j.begin_object("io");
  j.value("bytes_direct", t.bytes_direct);
  j.value("bytes_bounced", t.bytes_bounced);
  j.value("bytes_buffered", t.bytes_buffered);
  j.value("direct_refused", t.direct_refused);
  j.value("summary", io_summary(t));
  j.end_object();
}

}  // namespace

std::string ds_io_json(const DsIoRequest& r, const DsIoTotals& t, const std::vector<ProcReport>& reports, int processes,
                       bool mpi, const std::string& version) {
  const DsIoPlan& p = r.plan;
  Json j;
  j.begin_object();
  j.value("schema", "deepio.bench.ds_io/1");
  j.value("version", version);
  j.value("op", p.read ? "read" : "write");
  j.value("io_size", p.io_size);
  j.value("processes", processes);
  j.value("mpi", mpi);
  j.value("loops", static_cast<std::uint64_t>(p.loops));
  j.value("warmup_loops", static_cast<std::uint64_t>(p.warmup));
  config_object(j, p.handle, t);
  j.value("task_latency_sec", t.task_latency);
  j.value("task_gib_per_sec", t.task_speed());
  j.value("e2e_latency_sec", t.e2e_latency);
  j.value("e2e_gib_per_sec", t.e2e_speed());
  j.value("bytes", t.bytes);
  j.value("cpu_sec_per_gib", cpu_per_gib(t));
  io_object(j, t);
  j.begin_object("gpu");
  j.value("enabled", p.gpu);
  j.value("use_gds", p.use_gds);
  j.value("mode", t.gpu_mode);
  j.value("bytes_cufile", t.bytes_cufile);
  j.value("bytes_staged", t.bytes_staged);
  j.value("files_fallback", t.files_fallback);
  j.value("summary", gpu_summary(p, t));
  j.end_object();
  j.begin_array("processes_detail");
  for (const auto& pr : reports) {
    j.begin_object();
    j.value("task_sec", pr.task_sec);
    j.value("e2e_sec", pr.e2e_sec);
    j.value("bytes", pr.bytes);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace deepio::cli
