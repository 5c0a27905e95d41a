#include "compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <optional>

#include "deepio/gpu.hpp"
#include "dsio.hpp"
#include "fio.hpp"
#include "format.hpp"
#include "process.hpp"
#include "system.hpp"

namespace deepio::cli {

SizeChoice choose_size(std::optional<std::uint64_t> requested, std::uint64_t free_disk, std::uint64_t ram,
                       std::size_t block_size, const std::string& parent, int files) {
  SizeChoice c;
  if (requested) {
    c = {*requested, "--size", {}};
  } else {
    c = {1ULL << 30, "1 GiB", {}};
    if (free_disk / 8 < c.nbytes) c = {free_disk / 8, "1/8 of free disk", {}};
    if (ram / 8 < c.nbytes) c = {ram / 8, "1/8 of RAM", {}};
    c.nbytes -= c.nbytes % std::max<std::uint64_t>(block_size, 1 << 20);
    if (c.nbytes < (16ULL << 20)) {
      c.error = "not enough room for a meaningful run in " + parent + " (" + human_bytes(free_disk) + " free disk, " +
                human_bytes(ram) + " RAM); give --size";
      return c;
    }
  }
  if (c.nbytes % 4096 != 0) c.nbytes += 4096 - c.nbytes % 4096;  // the raw ceiling loop needs whole O_DIRECT blocks
  const std::uint64_t nfiles = static_cast<std::uint64_t>(files > 0 ? files : 1);
  if (nfiles * c.nbytes > free_disk) {
    c.error = "not enough free space in " + parent + ": need " + human_bytes(nfiles * c.nbytes) + " for " +
              std::to_string(nfiles) + " files, " + human_bytes(free_disk) + " free";
  }
  return c;
}

CompareSetup prepare_compare(const std::string& parent) {
  CompareSetup s;
  s.dir = make_temp_dir(parent, "bench");
  s.dinfo = probe_direct_io(s.dir);
  s.f_deepio = s.dir + "/deepio.bin";
  s.f_naive = s.dir + "/naive.bin";
  s.f_ceiling = s.dir + "/ceiling.bin";
  s.f_gpu = s.dir + "/gpu.bin";
  for (const auto& f : {s.f_deepio, s.f_naive, s.f_ceiling, s.f_gpu}) register_temp_file(f);
  return s;
}

namespace {

enum Engine : std::size_t { kDeepio = 0, kNaive = 1, kCeiling = 2, kGpuStaged = 3, kGpuGds = 4, kCopy = 5 };
enum Op : std::size_t { kWrite = 0, kOverwrite = 1, kRead = 2, kOps = 3 };
const char* const kOpNames[kOps] = {"write", "overwrite", "read"};

/// The GPU side of a comparison: the device (context current on this thread), one device
/// buffer, a CUDA-registered host buffer for the copy ceilings, and the two handles. Members
/// are destroyed in reverse order: handles (which finish their work) before the memory they
/// use, the context last.
struct GpuRows {
  GpuRows(int device, std::size_t n, const HandleOptions& ho)
      // Mode Auto: cuFile where it accepts the file, staging (visibly) elsewhere.
      : cuda(device),
        dev(n),
        host(n),
        reg(host.data(), n),
        staged(staged_options(ho)),
        gds(gds_options(ho, GdsMode::Auto)) {}
  static HandleOptions staged_options(HandleOptions ho) {
    ho.device_route = DeviceRouteMode::Staged;  // the staged row never goes through cuFile
    return ho;
  }
  CudaDevice cuda;
  DeviceBuffer dev;
  UniqueLockedBuffer host;
  HostRegistration reg;
  Handle staged;
  GdsHandle gds;
};

/// One comparison in progress: the buffers, the handle, the ceiling's state, the results.
class CompareRun {
 public:
  CompareRun(const CompareRequest& req, CompareReport& rep)
      : req_(req),
        rep_(rep),
        n_(static_cast<std::size_t>(rep.size.nbytes)),
        nf_(std::max<std::size_t>(rep.folders.size(), 1)),
        src_(n_),
        dst_(n_),
        h_(req.handle) {
    rep_.locked = src_.locked() && dst_.locked();
    fill_pattern(src_.data(), n_, 42);
    touch_pages(dst_.data(), n_);
    for (std::size_t i = 1; i < nf_; ++i) {
      more_dst_.push_back(std::make_unique<UniqueLockedBuffer>(n_));
      rep_.locked = rep_.locked && more_dst_.back()->locked();
      touch_pages(more_dst_.back()->data(), n_);
    }
    rep_.backend = h_.backend();
    if (req.gpu) start_gpu();
  }
  void plan_ceiling();
  void measure_all();

 private:
  void start_gpu();
  void init_results();
  void plan_fio_buffers();
  void use_raw_buffers();
  void measure_op(std::size_t op, Progress& progress);
  Sample sample(std::size_t op, std::size_t e, bool first);
  Sample gpu_sample(bool write, std::size_t e, bool first);
  void verify_gpu(std::size_t op, std::size_t e);
  void finish_gpu_rows(std::size_t op);
  Sample ceiling_sample(std::size_t op);
  Sample multi_sample(std::size_t op, std::size_t e, bool first);
  Sample multi_ceiling_sample(std::size_t op, bool preallocate);
  /// Adds one deepio run's handle counters (s1 - s0) to this op's totals; a fresh-file write
  /// that allocated any of its files first counts as one preallocated run.
  void account(std::size_t op, const HandleStats& s0, const HandleStats& s1);
  /// The read buffer of folder i.
  [[nodiscard]] void* dst(std::size_t i) const noexcept { return i == 0 ? dst_.data() : more_dst_[i - 1]->data(); }
  /// Every folder's file of engine e (write targets) or deepio's files (what every engine reads).
  [[nodiscard]] std::vector<std::string> files(std::size_t e) const;
  [[nodiscard]] bool all_direct() const noexcept {
    return std::all_of(rep_.folders.begin(), rep_.folders.end(),
                       [](const CompareSetup& f) { return f.dinfo.supported; });
  }
  /// The GPU rows write fresh files and read; they have no overwrite row.
  [[nodiscard]] std::size_t engines(std::size_t op) const noexcept { return gpu_ && op != kOverwrite ? 6 : 3; }
  [[nodiscard]] std::string raw_desc() const {
    return "raw O_DIRECT pread/pwrite loop, " + std::to_string(raw_threads_) + " threads x " +
           size_label(req_.handle.block_size) +
           (nf_ > 1 ? ", in each of " + std::to_string(nf_) + " folders at once" : std::string());
  }
  const CompareRequest& req_;
  CompareReport& rep_;
  std::size_t n_;
  std::size_t nf_;  // folders, measured at once
  UniqueLockedBuffer src_, dst_;
  std::vector<std::unique_ptr<UniqueLockedBuffer>> more_dst_;  // read buffers of folders 1..nf_-1
  std::vector<std::uint64_t> folder_bytes_;                    // of the last sample, per folder
  Handle h_;
  std::optional<GpuRows> gpu_;
  std::string fio_path_, fio_engine_;
  HugePageLoan loan_;  // hugetlb pages for fio's buffers, held (and reserved pages given back) with the run
  std::size_t raw_threads_ = 1;
  bool use_fio_ = false, fio_failed_ = false;
  std::uint64_t acc_[4] = {};       // this op's handle stats deltas: direct, bounced, buffered, refused
  std::uint64_t gacc_[4] = {};      // the same for the GPU staged handle
  std::uint64_t preallocated_ = 0;  // deepio's fresh-file writes that allocated the file first
  GdsStats gds0_;                   // the GdsHandle's counters when this op began
  EngineResult res_[kOps][6];       // [write, overwrite, read][deepio, naive, ceiling, gpu staged, gpu gds, copy]
};

void CompareRun::plan_ceiling() {
  const HandleOptions& ho = req_.handle;
  rep_.queue = queue_limits_of(rep_.setup.dir);
  rep_.buffers_thp = n_ > 0 ? static_cast<double>(thp_bytes(src_.data(), n_) + thp_bytes(dst_.data(), n_)) /
                                  static_cast<double>(2 * n_)
                            : 0.0;
  fio_path_ = req_.no_fio ? std::string() : find_on_path("fio");
  const std::string fio_ver = fio_path_.empty() ? std::string() : fio_version(fio_path_);
  fio_engine_ = fio_engine_for(rep_.backend);
  raw_threads_ = std::min<std::size_t>(ho.queue_depth * ho.intra_op_parallelism, 64);
  use_fio_ = !fio_path_.empty() && !rep_.memory_fs && all_direct();
  if (!fio_path_.empty() && !use_fio_) {
    rep_.ceiling_note = nf_ == 1         ? "fio skipped: the folder does not support O_DIRECT"
                        : rep_.memory_fs ? "fio skipped: a folder is in memory"
                                         : "fio skipped: a folder does not support O_DIRECT";
  }
  if (fio_path_.empty() && !req_.no_fio) rep_.ceiling_note = "fio not found on PATH";
  if (use_fio_) plan_fio_buffers();
  if (!use_fio_) use_raw_buffers();
  rep_.ceiling_desc = use_fio_ ? fio_ver + " --ioengine=" + fio_engine_ + " --bs=" + size_label(ho.block_size) +
                                     " --iodepth=" + std::to_string(ho.queue_depth) +
                                     " --numjobs=" + std::to_string(ho.intra_op_parallelism) + " --direct=1" +
                                     (loan_.ok() ? " --mem=shmhuge" : "") +
                                     (nf_ > 1 ? ", one job per folder, " + std::to_string(nf_) + " folders at once"
                                              : std::string())
                               : raw_desc();
  init_results();
}

/// fio's buffers: hugetlb pages (free ones, or reserved for the run); without them, its own
/// 4 KiB-page buffers only where the device does not split a request of them, else the raw loop.
void CompareRun::plan_fio_buffers() {
  const HandleOptions& ho = req_.handle;
  const HugePagePool pool = read_hugepage_pool();
  loan_ = HugePageLoan::obtain(
      fio_huge_pages_needed(ho.block_size, ho.queue_depth, ho.intra_op_parallelism * nf_, pool.page_bytes),
      req_.may_reserve_hugepages);
  if (loan_.ok()) {
    rep_.ceiling_buffers = "hugetlb";
    rep_.ceiling_buffers_detail = "fio --mem=shmhuge: " + loan_.description();
    rep_.hugepages_reserved = loan_.added();
    return;
  }
  if (splits_small_pages(rep_.queue, ho.block_size)) {
    use_fio_ = false;
    rep_.ceiling_note = "fio not used: its 4 KiB-page buffers would have " + rep_.queue.device + " split every " +
                        size_label(ho.block_size) + " request (max_segments " +
                        std::to_string(rep_.queue.max_segments) + "), and no huge pages for it: " + loan_.description();
    return;
  }
  rep_.ceiling_buffers = "pages";
  rep_.ceiling_buffers_detail = "fio's own buffers, 4 KiB pages (" +
                                (rep_.queue.max_segments > 0
                                     ? "a " + size_label(ho.block_size) + " request fits " + rep_.queue.device +
                                           "'s max_segments " + std::to_string(rep_.queue.max_segments)
                                     : std::string("the device's segment limit is unknown")) +
                                "); no huge pages: " + loan_.description();
}

/// The raw loop's buffers are deepio's: page-locked where the limit allows, THP-advised.
void CompareRun::use_raw_buffers() {
  rep_.ceiling_buffers = rep_.buffers_thp >= 0.9 ? "thp" : "pages";
  rep_.ceiling_buffers_detail = std::string("deepio's buffers (") + (rep_.locked ? "page-locked" : "not page-locked") +
                                "), " + fixed(100.0 * rep_.buffers_thp, 0) + "% on transparent huge pages";
}

void CompareRun::init_results() {
  const std::string naive_label = "naive 1-thread buffered copy";
  const std::string ceil_label = use_fio_ ? "fio (device ceiling)" : "raw O_DIRECT (ceiling)";
  for (std::size_t op = 0; op < kOps; ++op) {
    const char* name = kOpNames[op];
    res_[op][kDeepio] = {name, "deepio", "deepio", {}, {}, {}, {}};
    res_[op][kNaive] = {name, "naive", naive_label, {}, "buffered read(2)/write(2) + memcpy", {}, {}};
    res_[op][kCeiling] = {name, "ceiling", ceil_label, {}, all_direct() ? "O_DIRECT" : "buffered", {}, {}};
  }
  res_[kRead][kNaive].path = "buffered read(2) + memcpy";
  res_[kWrite][kNaive].path = "memcpy + buffered write(2)";
  res_[kOverwrite][kNaive].path = "memcpy + buffered write(2) in place";
  if (!gpu_) return;
  for (std::size_t op : {kWrite, kRead}) {
    const char* name = kOpNames[op];
    res_[op][kGpuStaged] = {name, "gpu_staged", "GPU staged (aio_handle)", {}, {}, {}, {}};
    res_[op][kGpuGds] = {name, "gpu_gds", "GPU gds", {}, {}, {}, {}};
  }
  res_[kWrite][kCopy] = {
      "write", "d2h", "device->host copy (ceiling)", {}, "cuMemcpyDtoH into CUDA-registered host memory", {}, {}};
  res_[kRead][kCopy] = {
      "read", "h2d", "host->device copy (ceiling)", {}, "cuMemcpyHtoD from CUDA-registered host memory", {}, {}};
}

/// The GPU rows' device, memory and handles. Where CUDA loaded but they cannot be set up (out of
/// device memory, cuMemHostRegister refused), the table goes on without them and says why;
/// with --gpu that is the run's failure.
void CompareRun::start_gpu() {
  try {
    gpu_.emplace(req_.device, n_, req_.handle);
    gpu_->dev.upload(src_.data(), n_);  // what the GPU rows write
    std::memcpy(gpu_->host.data(), src_.data(), n_);
  } catch (const std::exception& e) {
    gpu_.reset();
    if (req_.gpu_required) throw;
    rep_.gpu_error = std::string("GPU set-up failed: ") + e.what();
    return;
  }
  rep_.gpu_rows = true;
  rep_.gpu_device = req_.device;
}

/// One timed transfer of a GPU row: the device buffer to/from a file with the staged Handle or
/// the GdsHandle (writes to a fresh file, reads after a dropped page cache, as every engine),
/// or the copy ceiling.
Sample CompareRun::gpu_sample(bool write, std::size_t e, bool first) {
  GpuRows& g = *gpu_;
  const CompareSetup& f = rep_.setup;
  if (e == kCopy) return timed_copy(!write, g.dev, g.host.data(), n_);
  if (write) {
    ::unlink(f.f_gpu.c_str());
  } else {
    drop_page_cache(f.f_deepio);
    if (first) {
      std::memset(dst_.data(), 0, n_);
      g.dev.upload(dst_.data(), n_);  // so a read that moves nothing cannot pass verification
    }
  }
  Handle& h = e == kGpuGds ? static_cast<Handle&>(g.gds) : g.staged;
  const HandleStats s0 = g.staged.stats();
  const Sample s = write ? deepio_write(h, g.dev.data(), n_, f.f_gpu) : deepio_read(h, g.dev.data(), n_, f.f_deepio);
  if (e == kGpuStaged) {
    const HandleStats s1 = g.staged.stats();
    gacc_[0] += s1.bytes_direct - s0.bytes_direct;
    gacc_[1] += s1.bytes_bounced - s0.bytes_bounced;
    gacc_[2] += s1.bytes_buffered - s0.bytes_buffered;
    gacc_[3] += s1.direct_refused - s0.direct_refused;
  }
  return s;
}

/// After the first sample of a GPU disk row: a write's file, or a read's device buffer (copied
/// back), compared with the pattern; outside the timed region.
void CompareRun::verify_gpu(std::size_t op, std::size_t e) {
  EngineResult& r = res_[op][e];
  bool same = false;
  if (op != kRead) {
    same = compare_with_file(src_.data(), n_, rep_.setup.f_gpu).empty();
  } else {
    gpu_->dev.download(dst_.data(), n_);
    same = std::memcmp(dst_.data(), src_.data(), n_) == 0;
  }
  r.verified = same ? "yes" : "MISMATCH";
  if (!same) rep_.mismatch = true;
}

/// The GPU rows' labels and paths once the op's runs are done: the GdsHandle's mode (it turns
/// "compat" once a file was staged) and what went through cuFile.
void CompareRun::finish_gpu_rows(std::size_t op) {
  GpuRows& g = *gpu_;
  res_[op][kGpuStaged].path = "staged via page-locked slots, " + std::string(to_string(g.staged.backend())) + ", " +
                              io_path(gacc_[0], gacc_[1], gacc_[2], gacc_[3]);
  const GdsStats s = g.gds.gds_stats();
  const std::uint64_t cufile = s.bytes_cufile - gds0_.bytes_cufile, staged = s.bytes_staged - gds0_.bytes_staged;
  const std::string mode = g.gds.mode(), why = g.gds.mode_reason();
  rep_.gds_mode = mode + (why.empty() ? "" : ": " + why);
  res_[op][kGpuGds].label = "GPU gds (" + mode + ")";
  res_[op][kGpuGds].path = "gds_handle " + rep_.gds_mode + "; cuFile " + human_bytes(cufile) + ", staged " +
                           human_bytes(staged) + ", files cuFile refused " +
                           std::to_string(s.files_fallback - gds0_.files_fallback);
}

Sample CompareRun::ceiling_sample(std::size_t op) {
  const CompareSetup& f = rep_.setup;
  const bool write = op != kRead;
  // A fresh-file write allocates the file first where deepio's did (deepio's first write
  // always runs before the ceiling's: the rotation starts with it), so both run one workload.
  const bool preallocate = op == kWrite && preallocated_ > 0;
  if (op == kWrite) rep_.ceiling_preallocated = preallocate;
  if (use_fio_ && !fio_failed_) {
    const HandleOptions& ho = req_.handle;
    FioJob job{write ? f.f_ceiling : f.f_deepio, write,       n_,   ho.block_size, ho.queue_depth,
               ho.intra_op_parallelism,          fio_engine_, true, preallocate};
    if (loan_.ok()) {
      job.mem = "shmhuge";
      job.hugepage_bytes = loan_.page_bytes();
    }
    FioResult fr = run_fio(fio_path_, job);
    (write ? rep_.fio_command_write : rep_.fio_command_read) = fr.command;
    if (fr.ok) return fr.sample;
    // Fall back to the raw loop for this and every later ceiling sample.
    fio_failed_ = true;
    rep_.ceiling_note = fr.error + "; ceiling measured with the raw O_DIRECT loop instead";
  }
  return raw_direct(write, write ? src_.data() : dst_.data(), n_, req_.handle.block_size, raw_threads_,
                    write ? f.f_ceiling : f.f_deepio, preallocate);
}

std::vector<std::string> CompareRun::files(std::size_t e) const {
  std::vector<std::string> v;
  for (const auto& f : rep_.folders) v.push_back(e == kDeepio ? f.f_deepio : e == kNaive ? f.f_naive : f.f_ceiling);
  return v;
}

/// Several folders: fio with one job per folder in one run, else the raw loop in each at once.
Sample CompareRun::multi_ceiling_sample(std::size_t op, bool preallocate) {
  const bool write = op != kRead;
  const std::vector<std::string> paths = files(write ? kCeiling : kDeepio);
  if (use_fio_ && !fio_failed_) {
    const HandleOptions& ho = req_.handle;
    FioJob job{paths[0],    write, n_,         ho.block_size, ho.queue_depth, ho.intra_op_parallelism,
               fio_engine_, true,  preallocate};
    job.extra_paths.assign(paths.begin() + 1, paths.end());
    if (loan_.ok()) {
      job.mem = "shmhuge";
      job.hugepage_bytes = loan_.page_bytes();
    }
    FioResult fr = run_fio(fio_path_, job);
    (write ? rep_.fio_command_write : rep_.fio_command_read) = fr.command;
    if (fr.ok) {
      folder_bytes_ = fr.file_bytes;
      return fr.sample;
    }
    fio_failed_ = true;
    rep_.ceiling_note = fr.error + "; ceiling measured with the raw O_DIRECT loop instead";
  }
  std::vector<std::function<Sample()>> jobs;
  for (std::size_t i = 0; i < nf_; ++i) {
    void* buf = write ? src_.data() : dst(i);
    jobs.emplace_back([this, write, buf, path = paths[i], preallocate] {
      return raw_direct(write, buf, n_, req_.handle.block_size, raw_threads_, path, preallocate);
    });
  }
  std::vector<Sample> each;
  const Sample s = run_together(jobs, &each);
  for (const auto& x : each) folder_bytes_.push_back(x.nbytes);
  return s;
}

/// One timed transfer of engine `e` over every folder at once (sample() for several folders):
/// the same preparation per folder, then one aggregate sample.
Sample CompareRun::multi_sample(std::size_t op, std::size_t e, bool first) {
  const bool write = op != kRead;
  const std::vector<std::string> targets = files(e), reads = files(kDeepio);
  for (std::size_t i = 0; i < nf_; ++i) {
    if (op == kWrite) {
      ::unlink(targets[i].c_str());
    } else if (op == kOverwrite) {
      drop_page_cache(targets[i]);
    } else {
      drop_page_cache(reads[i]);
      if (first && e != kCeiling) std::memset(dst(i), 0, n_);
    }
  }
  folder_bytes_.clear();
  if (e == kCeiling) {
    const bool preallocate = op == kWrite && preallocated_ > 0;
    if (op == kWrite) rep_.ceiling_preallocated = preallocate;
    return multi_ceiling_sample(op, preallocate);
  }
  if (e == kNaive) {
    std::vector<std::function<Sample()>> jobs;
    for (std::size_t i = 0; i < nf_; ++i) {
      jobs.emplace_back([this, op, write, i, &targets, &reads] {
        return write ? naive_write(src_.data(), n_, targets[i], op == kOverwrite) : naive_read(dst(i), n_, reads[i]);
      });
    }
    std::vector<Sample> each;
    const Sample s = run_together(jobs, &each);
    for (const auto& x : each) folder_bytes_.push_back(x.nbytes);
    return s;
  }
  // One handle with its own queue depth, one operation per file: its workers share the queue
  // among the folders' devices (core/worker.hpp).
  std::vector<void*> bufs;
  for (std::size_t i = 0; i < nf_; ++i) bufs.push_back(dst(i));
  const HandleStats s0 = h_.stats();
  const Sample s = write ? deepio_write_files(h_, src_.data(), n_, targets) : deepio_read_files(h_, bufs, n_, reads);
  account(op, s0, h_.stats());
  folder_bytes_.assign(nf_, n_);
  return s;
}

void CompareRun::account(std::size_t op, const HandleStats& s0, const HandleStats& s1) {
  acc_[0] += s1.bytes_direct - s0.bytes_direct;
  acc_[1] += s1.bytes_bounced - s0.bytes_bounced;
  acc_[2] += s1.bytes_buffered - s0.bytes_buffered;
  acc_[3] += s1.direct_refused - s0.direct_refused;
  if (op == kWrite) {
    preallocated_ += s1.preallocated > s0.preallocated ? 1 : 0;
    rep_.deepio_preallocated = preallocated_;
  }
}

/// One timed transfer of engine `e`; a write goes to a fresh file, an overwrite over the file
/// the writes left (its cached pages dropped first), a read starts from a dropped page cache
/// (and the first one into a zeroed buffer, to be verified).
Sample CompareRun::sample(std::size_t op, std::size_t e, bool first) {
  if (nf_ > 1) return multi_sample(op, e, first);
  const bool write = op != kRead;
  const CompareSetup& f = rep_.setup;
  const std::string& target = e == kDeepio ? f.f_deepio : e == kNaive ? f.f_naive : f.f_ceiling;
  if (op == kWrite) {
    if (e < kGpuStaged) ::unlink(target.c_str());
  } else if (op == kOverwrite) {
    drop_page_cache(target);
  } else {
    drop_page_cache(f.f_deepio);
    if (first && e != kCeiling) std::memset(dst_.data(), 0, n_);
  }
  if (e >= kGpuStaged) return gpu_sample(write, e, first);
  if (e == kNaive) {
    return write ? naive_write(src_.data(), n_, f.f_naive, op == kOverwrite) : naive_read(dst_.data(), n_, f.f_deepio);
  }
  if (e == kCeiling) return ceiling_sample(op);
  const HandleStats s0 = h_.stats();
  const Sample s = write ? deepio_write(h_, src_.data(), n_, f.f_deepio) : deepio_read(h_, dst_.data(), n_, f.f_deepio);
  account(op, s0, h_.stats());
  return s;
}

void CompareRun::measure_op(std::size_t op, Progress& progress) {
  std::fill(std::begin(acc_), std::end(acc_), 0);
  std::fill(std::begin(gacc_), std::end(gacc_), 0);
  if (gpu_) gds0_ = gpu_->gds.gds_stats();
  const std::size_t ne = engines(op);
  for (std::size_t r = 0; r < req_.runs; ++r) {
    for (std::size_t k = 0; k < ne; ++k) {
      const std::size_t e = (r + k) % ne;  // rotate the order: A B C, B C A, C A B
      progress.step(std::string(kOpNames[op]) + " " + res_[op][e].engine + ", run " + std::to_string(r + 1) + "/" +
                    std::to_string(req_.runs));
      folder_bytes_.clear();
      res_[op][e].samples.push_back(sample(op, e, r == 0));
      res_[op][e].folder_bytes = folder_bytes_.empty() ? std::vector<std::uint64_t>{res_[op][e].samples.back().nbytes}
                                                       : folder_bytes_;
      if (r == 0 && (e == kGpuStaged || e == kGpuGds)) {
        verify_gpu(op, e);
      } else if (op == kRead && r == 0 && e < kCeiling) {
        bool same = true;
        for (std::size_t i = 0; i < nf_; ++i) same = same && std::memcmp(dst(i), src_.data(), n_) == 0;
        res_[op][e].verified = same ? "yes" : "MISMATCH";
        if (!same) rep_.mismatch = true;
      }
    }
  }
  res_[op][kDeepio].path = std::string(to_string(rep_.backend)) + ", " + io_path(acc_[0], acc_[1], acc_[2], acc_[3]);
  if (fio_failed_) {
    res_[op][kCeiling].label = "raw O_DIRECT (ceiling)";
    rep_.ceiling_desc = raw_desc();
    use_raw_buffers();
  }
  if (gpu_ && op != kOverwrite) finish_gpu_rows(op);
}

void CompareRun::measure_all() {
  Progress progress(req_.runs * (engines(kWrite) + engines(kOverwrite) + engines(kRead)), req_.progress);
  for (std::size_t op = 0; op < kOps; ++op) measure_op(op, progress);
  progress.done();
  loan_.give_back();
  for (std::size_t op = 0; op < kOps; ++op) {
    for (std::size_t e = 0; e < engines(op); ++e) rep_.results.push_back(std::move(res_[op][e]));
  }
  flag_results(rep_);
}

}  // namespace

CompareReport run_compare(const CompareRequest& req, const SizeChoice& size, const CompareSetup& setup,
                          std::uint64_t free_disk, std::uint64_t ram) {
  return run_compare(req, size, std::vector<CompareSetup>{setup}, {}, free_disk, ram);
}

CompareReport run_compare(const CompareRequest& req, const SizeChoice& size, const std::vector<CompareSetup>& setups,
                          const std::vector<std::string>& parents, std::uint64_t free_disk, std::uint64_t ram) {
  if (setups.empty()) throw std::invalid_argument("run_compare: no folder");
  if (setups.size() > 1 && req.gpu) throw std::invalid_argument("run_compare: the GPU rows take one folder");
  CompareReport rep;
  rep.setup = setups.front();
  rep.folders = setups;
  rep.parents = parents;
  for (const auto& p : parents) rep.folder_free.push_back(free_disk_bytes(p));
  for (const auto& f : setups) rep.folder_devices.push_back(queue_limits_of(f.dir).device);
  if (parents.size() > 1) rep.same_device_note = same_device_note(parents);
  if (setups.size() > 1 && req.gpu_probe.cuda) rep.gpu_error = "the GPU rows are measured with one folder only";
  rep.size = size;
  rep.free_disk = free_disk;
  rep.ram = ram;
  rep.runs = req.runs;
  rep.handle = req.handle;
  for (const auto& f : setups) rep.folder_in_memory.push_back(is_memory_filesystem(f.dir));
  rep.memory_fs = std::find(rep.folder_in_memory.begin(), rep.folder_in_memory.end(), true) !=
                  rep.folder_in_memory.end();
  rep.gpu = req.gpu_probe;
  {
    CompareRun run(req, rep);
    run.plan_ceiling();
    run.measure_all();
  }
  rep.memlock = capabilities().memlock_limit_bytes;
  return rep;
}

}  // namespace deepio::cli
