#include "tune_dsio.hpp"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <stdexcept>

#include "format.hpp"
#include "system.hpp"

namespace deepio::cli {

DsIoPlan DsIoTuneMeasure::plan(const TuneRun& run) const {
  DsIoPlan p;
  p.folders = folders_;
  p.io_size = run.io_size;
  p.read = run.read;
  p.loops = run.loops;
  p.warmup = 1;
  p.handle.block_size = static_cast<std::size_t>(run.cfg.block_size);
  p.handle.queue_depth = static_cast<std::size_t>(run.cfg.queue_depth);
  p.handle.single_submit = run.cfg.single_submit;
  p.handle.overlap_events = run.cfg.overlap_events;
  p.handle.intra_op_parallelism = static_cast<std::size_t>(run.cfg.io_parallel);
  return p;
}

double DsIoTuneMeasure::operator()(const TuneRun& run) {
  const DsIoPlan p = plan(run);
  if (flush_ && run.read) {
    for (std::size_t t = 0; t < folders_.size(); ++t)
      drop_page_cache(ds_io_file(p, static_cast<int>(t), 0, folders_[t]));
  }
  if (progress_ != nullptr) progress_->step(std::string(run.read ? "read " : "write ") + run.cfg.label());
  const DsIoTotals t = ds_io_run(p);
  if (!t.ok) throw std::runtime_error(t.error);
  gib_moved_ += t.gib() * static_cast<double>(run.loops + 1) / static_cast<double>(run.loops);
  backend_ = t.backend;
  if (!log_dir_.empty()) write_log(run, t);
  return t.e2e_speed();
}

std::string ds_io_log_text(bool read, const DsIoTotals& t) {
  const std::string op = read ? "Read" : "Write";
  return "Task " + op + " Latency = " + py_float(t.task_latency) + " sec\n" + "Task " + op +
         " Speed = " + py_float(t.task_speed()) + " GB/sec\n" + "E2E " + op + " Latency = " + py_float(t.e2e_latency) +
         " sec\n" + "E2E " + op + " Speed = " + py_float(t.e2e_speed()) + " GB/sec\n";
}

void DsIoTuneMeasure::write_log(const TuneRun& run, const DsIoTotals& t) const {
  const std::string op = run.read ? "read" : "write";
  const std::string sub = log_dir_ + "/_aio_bench_" + op + "_logs";
  ::mkdir(log_dir_.c_str(), 0755);
  ::mkdir(sub.c_str(), 0755);
  std::ofstream out(sub + "/" + run.cfg.log_name(op, folders_.size()));
  out << ds_io_log_text(run.read, t);
}

void register_tune_files(const TuneSpace& space, std::uint64_t io_size, const std::vector<std::string>& work) {
  const StageSizes st = stage_sizes(space, io_size);
  for (auto s : std::set<std::uint64_t>{st.screen, st.confirm, st.full})
    for (bool rd : {true, false})
      for (std::size_t t = 0; t < work.size(); ++t) {
        DsIoPlan p;
        p.io_size = s;
        p.read = rd;
        register_temp_file(ds_io_file(p, static_cast<int>(t), 0, work[t]));
      }
}

}  // namespace deepio::cli
