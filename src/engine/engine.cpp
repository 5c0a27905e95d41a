// The engine's core: construction (options checked, the first backend that can be set up
// for every worker, in auto's order io_uring, libaio, threads), destruction (openers, then
// workers, then sync threads, so no op is abandoned: see engine.hpp), and one request's way
// from its checked arguments to the workers: new_op, submit, start, bind_route, plan_input,
// queue. A file object's route registration is made once (bind_route hands the route its
// RouteFileSlot); an op's binding leaves the submitter with its last slice, so it ends before
// the op's descriptors close. The other jobs have their own files: checks.cpp (arguments),
// open.cpp (opening), submit_ranges.cpp, submit_batch.cpp, ledger.cpp (tracking and
// collecting), openers.cpp and syncers.cpp (threads).
#include "engine/engine.hpp"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include "backends/factory.hpp"
#include "core/env.hpp"
#include "core/plan.hpp"
#include "engine/checks.hpp"
#include "engine/engine_parts.hpp"
#include "engine/openers.hpp"
#include "engine/syncers.hpp"
#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
constexpr std::size_t kMaxBlock = std::size_t{1} << 30;       // one request never exceeds 1 GiB
constexpr std::size_t kBounceBudget = std::size_t{16} << 20;  // bounce memory per worker (DEEPIO_STAGING_BYTES)
// Staging memory given back and kept for the next borrower: two of deepio.Writer's default
// rings (4 x 16 MiB), so saving file after file maps and locks its staging once.
constexpr std::size_t kKeptStaging = std::size_t{128} << 20;

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

namespace {
std::atomic<std::size_t> g_live_engines{0};
}  // namespace

std::size_t live_engines() noexcept { return g_live_engines.load(std::memory_order_relaxed); }
Engine::LiveCount::LiveCount() noexcept { g_live_engines.fetch_add(1, std::memory_order_relaxed); }
Engine::LiveCount::~LiveCount() { g_live_engines.fetch_sub(1, std::memory_order_relaxed); }

Engine::Engine(const HandleOptions& options, EngineSetup setup)
    : options_(options), route_(std::move(setup.route)), make_route_(std::move(setup.make_route)) {
  may_route_ = route_ != nullptr || static_cast<bool>(make_route_);
  if (options_.backend == BackendKind::Auto) options_.backend = env_backend().value_or(BackendKind::Auto);
  if (options_.direct_io == DirectIo::Auto) options_.direct_io = env_direct_io().value_or(DirectIo::Auto);
  check_count("block_size", options_.block_size, kMaxCount);
  check_count("queue_depth", options_.queue_depth, 65536);
  check_count("intra_op_parallelism", options_.intra_op_parallelism, 1024);
  pool_ = std::make_shared<StagingPool>(kKeptStaging);

  const std::size_t page = page_size();
  bounce_slot_bytes_ = round_up(std::clamp<std::size_t>(options_.block_size, 64 << 10, 4 << 20), page);
  device_ = setup.device.classify ? std::move(setup.device) : device_support();
  WorkerConfig wc;
  wc.stager_factory = device_.make_stager;
  wc.queue_depth = options_.queue_depth;
  wc.single_submit = options_.single_submit;
  wc.overlap_events = options_.overlap_events;
  wc.bounce_slot_bytes = bounce_slot_bytes_;
  // A device's turn: one request of the largest size it can have.
  wc.quantum = std::max(std::min(options_.block_size, kMaxBlock), bounce_slot_bytes_);
  wc.pool = pool_;
  // At least two slots so disk and copies overlap, but never more than can be in flight.
  const std::size_t budget = env_staging_bytes().value_or(kBounceBudget);
  wc.bounce_slots = std::min(std::max<std::size_t>(budget / bounce_slot_bytes_, 2), options_.queue_depth);

  std::vector<BackendKind> order;
  if (options_.backend == BackendKind::Auto) {
    order = {BackendKind::IoUring, BackendKind::Libaio, BackendKind::Threads};
  } else {
    order = {options_.backend};
  }
  Status why;
  for (BackendKind kind : order) {
    std::vector<std::unique_ptr<Backend>> backends;
    for (std::size_t i = 0; i < options_.intra_op_parallelism; ++i) {
      auto b = make_backend(kind, options_.queue_depth, &why, options_.single_submit);
      if (!b) break;
      backends.push_back(std::move(b));
    }
    if (backends.size() != options_.intra_op_parallelism) continue;
    kind_ = kind;
    for (auto& b : backends) workers_.push_back(std::make_unique<Worker>(std::move(b), wc, &counters_));
    route_config_ = wc;
    if (route_) {
      route_workers_ = make_route_workers(*route_, wc);
      route_ready_.store(true, std::memory_order_release);
    }
    return;
  }
  throw_error(why.errnum, "cannot set up the " + std::string(to_string(options_.backend)) + " backend: " + why.message);
}

std::vector<std::unique_ptr<Worker>> Engine::make_route_workers(DeviceRoute& route, const WorkerConfig& wc) {
  std::vector<std::unique_ptr<Worker>> workers;
  if (!route.has_backend()) return workers;
  // As many as the host workers: a route's backend is synchronous (one request at a time per
  // worker), so intra_op_parallelism is its parallelism, as in DeepNVMe's gds_handle.
  for (std::size_t i = 0; i < options_.intra_op_parallelism; ++i) {
    workers.push_back(std::make_unique<Worker>(route.make_backend(), wc, &counters_));
  }
  return workers;
}

DeviceRoute* Engine::device_route() {
  if (make_route_) {
    // Once per engine, on the first operation on device memory (DeviceRouteMode::Auto: the
    // route may open the cuFile driver, which a handle that never sees device memory must
    // not do). A throw leaves the flag unset: the next operation tries again.
    std::call_once(route_once_, [this] {
      std::shared_ptr<DeviceRoute> route = make_route_();
      std::vector<std::unique_ptr<Worker>> workers;
      if (route) workers = make_route_workers(*route, route_config_);
      route_ = std::move(route);
      route_workers_ = std::move(workers);
      route_ready_.store(true, std::memory_order_release);
    });
  }
  return route_.get();
}

Engine::~Engine() {
  // Batches still being opened are dispatched first; then the workers finish everything
  // queued before they stop: in-flight writes are never dropped.
  {
    std::lock_guard lock(openers_mutex_);
    if (openers_) openers_->stop();
  }
  for (auto& w : workers_) w->stop();
  for (auto& w : route_workers_) w->stop();
  // Last: the workers' final completions hand durable writes to the sync threads, which
  // finish every one of them before they stop.
  {
    std::lock_guard lock(openers_mutex_);
    if (syncers_) syncers_->stop();
  }
  // Every op is done now. Failures nobody collected, of ops no Future refers to, are reported
  // (a Future still held reports when it goes, if its owner never calls get()).
  std::lock_guard lock(mutex_);
  for (const auto& op : unclaimed_) op->abandon();
}

std::shared_ptr<OpState> Engine::new_op(bool write, void* buf, std::size_t nbytes, std::string name,
                                        std::uint64_t file_offset, OpOptions op_options, BindingOp binding,
                                        std::size_t extent) {
  auto op = std::make_shared<OpState>(write, std::move(name), file_offset, nbytes, &counters_, &signal_);
  // The caller holds its own reference across the submission, so dropping the op on a throw
  // never releases the keep-alive here.
  op->set_keep_alive(std::move(binding.keep_alive));
  op->set_detached(binding.detached);
  if (op_options.fsync) {
    if (!write) throw InvalidArgument("fsync applies to writes only", op->path(), file_offset, nbytes);
    op->set_sync(&start_syncers());
  }
  // Memory of allocate_locked() is host memory: no GPU driver query for it (in a CUDA process
  // classify() costs a cuPointerGetAttribute per op). The same lookup finds the locked region
  // whose pages io_uring registers.
  const LockedRegion region = nbytes > 0 ? find_locked_region(buf, extent) : LockedRegion{};
  if (nbytes > 0 && !region.host) op->set_device(device_.classify(buf));
  op->set_on_device(op->device() >= 0);
  if (op->on_device() && op_options.stream && device_.make_fence) {
    // The handshake with the producer (OpOptions::stream): an event recorded here, on the
    // caller's thread, that the workers' copies wait for on their own streams.
    Status why;
    auto fence = device_.make_fence(op->device(), *op_options.stream, &why);
    if (!fence) throw_error(why.errnum, why.message, op->path(), file_offset, nbytes);
    op->set_fence(std::move(fence));
  }
  // Only io_uring registers buffers.
  if (region.id != 0 && kind_ == BackendKind::IoUring) op->set_region(region);
  return op;
}

std::shared_ptr<OpState> Engine::submit(bool write, void* buf, std::size_t nbytes, const std::string* path, int fd,
                                        std::uint64_t file_offset, OpOptions op_options, BindingOp binding) {
  process_.check();
  std::string name = file_name(path, fd);
  check_request(buf, nbytes, name, file_offset);
  auto op = new_op(write, buf, nbytes, std::move(name), file_offset, std::move(op_options), std::move(binding), nbytes);
  start(op, buf, path, fd, /*tracked=*/false);
  return op;
}

SyncRunner& Engine::start_syncers() {
  std::lock_guard lock(openers_mutex_);
  if (!syncers_) syncers_ = std::make_unique<Syncers>(kSyncThreads);
  return *syncers_;
}

void Engine::start(const std::shared_ptr<OpState>& op, void* buf, const std::string* path, int fd, bool tracked,
                   const std::shared_ptr<SharedFile>& shared, PendingSlices* pending) {
  const bool write = op->write();
  const std::uint64_t file_offset = op->offset();
  const std::size_t nbytes = op->nbytes();
  const std::string& name = op->path();
  Opened opened;
  std::uint64_t size = 0;
  open_op(*op, path, fd, shared, &opened, &size);
  if (!write && file_offset + nbytes > size && shared) size = size_for(*shared, file_offset + nbytes);
  if (!write && file_offset + nbytes > size) {
    throw_error(ENODATA,
                "read past end of file: the file holds " + std::to_string(size) + " bytes, the read ends at " +
                    std::to_string(file_offset + nbytes),
                name, file_offset, nbytes);
  }
  if (write && opened.direct && op->direct_fd() >= 0 && nbytes > options_.block_size &&
      size != std::numeric_limits<std::uint64_t>::max() && file_offset + nbytes > size) {
    preallocate(op->direct_fd(), file_offset, nbytes);
  }
  Route route;
  if (op->device() >= 0 && may_route_ && device_route() != nullptr) {
    // A file object registers with the route once (its slot); everything else per op.
    route = bind_route(*op, buf, opened, shared && shared->object ? shared.get() : nullptr);
  }
  PlanInput in = plan_input(*op, buf, opened, route);
  queue(op, plan_request(in), opened, std::move(route), tracked, pending);
  // The next request on the shared descriptor sees the size this write leaves.
  if (shared && write && size != std::numeric_limits<std::uint64_t>::max())
    raise_size(shared->size, file_offset + nbytes);
}

void Engine::preallocate(int fd, std::uint64_t file_offset, std::size_t nbytes) {
  // A direct write split into several blocks that extends the file: each block would be an
  // extending write, which ext4 and xfs run one at a time under the inode's exclusive lock
  // (and io_uring then hands to a kernel worker). Allocating the range first (mode 0: the
  // size grows to the write's end; nothing is ever truncated) makes the blocks overwrites
  // of allocated space, issued in parallel. Best effort: where the file system refuses
  // (EOPNOTSUPP on tmpfs-like or FUSE file systems, EFBIG past RLIMIT_FSIZE, ENOSPC) the
  // writes go as they are and report the error themselves. SIGXFSZ is the caller's as for
  // any write past the limit.
  if (::fallocate(fd, 0, static_cast<off_t>(file_offset), static_cast<off_t>(nbytes)) == 0) {
    counters_.preallocated.fetch_add(1, std::memory_order_relaxed);
  }
}

Engine::Route Engine::bind_route(OpState& op, void* buf, const Opened& opened, SharedFile* file) {
  DeviceBinding b;
  b.direct = opened.direct && op.direct_fd() >= 0;
  b.fd = op.direct_fd();
  if (!b.direct) throw_if_error(buffered_fd(op, &b.fd));
  b.buf = buf;
  b.nbytes = op.nbytes();
  b.device = op.device();
  b.write = op.write();
  b.path = &op.path();
  b.file_offset = op.offset();
  if (file != nullptr) b.slot = &file->route_slot;
  Route route;
  bool staged = true;
  throw_if_error(route_->bind(b, &staged, &route.file));
  route.direct = !staged;
  // Served by the route's backend: the device address goes to it as it is, never staged.
  if (route.direct) {
    op.set_device(-1);
    op.set_routed(true);
  }
  return route;
}

PlanInput Engine::plan_input(const OpState& op, void* buf, const Opened& opened, const Route& route) const {
  PlanInput in;
  in.buf = static_cast<std::byte*>(buf);
  in.nbytes = op.nbytes();
  in.file_offset = op.offset();
  in.direct = opened.direct;
  in.mem_align = opened.mem_align;
  in.offset_align = opened.offset_align;
  in.page = page_size();
  in.block_size = std::min(options_.block_size, kMaxBlock);
  in.workers = route.direct ? route_workers_.size() : workers_.size();
  if (in.workers > 1) in.first_worker = next_worker_.fetch_add(1, std::memory_order_relaxed);
  in.bounce_bytes = bounce_slot_bytes_;
  in.staged = op.device() >= 0;
  in.any_alignment = route.direct;
  return in;
}

void Engine::queue(const std::shared_ptr<OpState>& op, std::vector<Slice> slices, const Opened& opened, Route route,
                   bool tracked, PendingSlices* pending) {
  if (opened.in_memory && !route.direct && op->device() < 0) {
    for (Slice& s : slices) {
      for (Segment& g : s.segments) g.in_memory = true;
    }
  }

  // Make the buffered descriptor now if the plan needs one and the op has none (an O_DIRECT
  // open, or a caller's O_DIRECT descriptor with direct_io=off), so that a failure reaches
  // the submitter and no worker opens anything. An op whose plan is all direct gets one only
  // if a short transfer or an EINVAL needs it, from its own descriptor too (OpState): an
  // extra open per op would cost every small aligned request.
  if (!route.direct) {
    const bool needs_buffered = std::any_of(slices.begin(), slices.end(), [](const Slice& s) {
      return std::any_of(s.segments.begin(), s.segments.end(),
                         [](const Segment& g) { return g.mode == SegmentMode::Buffered; });
    });
    int unused = -1;
    if (needs_buffered) throw_if_error(buffered_fd(*op, &unused));
  }

  // A batch's host slices are collected (room made first: nothing below may throw then).
  if (route.direct) pending = nullptr;
  if (pending != nullptr) pending->reserve_one_each();
  submitted_.fetch_add(1);
  if (!tracked) track(op);
  if (slices.empty()) {
    route.file.reset();  // the route's registration ends before the op completes
    op->complete_now();
    return;
  }
  op->set_slices(static_cast<int>(slices.size()));
  // The route's registration goes to the slices, the last one taking this call's reference:
  // none stays with the submitter, whose return may come after the op completed (its last
  // holder must be a slice, so that it ends before the op's descriptors close).
  const auto file_for = [&](const Slice& s) -> std::shared_ptr<const DriverFile> {
    if (&s == &slices.back()) return std::move(route.file);
    return route.file;
  };
  if (pending != nullptr) {
    for (Slice& s : slices) {
      pending->per_worker[s.worker].push_back(
          SliceTask{op, std::move(s.segments), file_for(s), route.direct, opened.dev});
    }
    pending->count += slices.size();
    return;
  }
  auto& workers = route.direct ? route_workers_ : workers_;
  for (Slice& s : slices) {
    workers[s.worker]->enqueue(SliceTask{op, std::move(s.segments), file_for(s), route.direct, opened.dev});
  }
}

HandleStats Engine::stats() const noexcept {
  HandleStats s;
  s.ops_completed = counters_.ops_completed.load();
  s.ops_failed = counters_.ops_failed.load();
  s.bytes_direct = counters_.bytes_direct.load();
  s.bytes_bounced = counters_.bytes_bounced.load();
  s.bytes_buffered = counters_.bytes_buffered.load();
  s.bytes_fixed = counters_.bytes_fixed.load();
  s.direct_refused = counters_.direct_refused.load();
  s.preallocated = counters_.preallocated.load();
  s.short_transfers = counters_.short_transfers.load();
  s.retries = counters_.retries.load();
  s.synced = counters_.synced.load();
  s.fixed_file_requests = counters_.fixed_file_requests.load();
  s.fixed_file_fallbacks = counters_.fixed_file_fallbacks.load();
  s.device_ops_completed = counters_.device_ops_completed.load();
  s.device_ops_failed = counters_.device_ops_failed.load();
  const std::uint64_t device_ops = s.device_ops_completed + s.device_ops_failed;
  s.device_ops_cufile = std::min(counters_.device_ops_routed.load(), device_ops);
  s.device_ops_staged = device_ops - s.device_ops_cufile;
  // What the route's backend moved counts as cuFile's, except what it staged itself after a
  // cuFile failure (DeviceRoute::backend_staged_bytes).
  const std::uint64_t io_staged = route_ready_.load(std::memory_order_acquire) && route_
                                      ? route_->backend_staged_bytes()
                                      : 0;
  const std::uint64_t by_route = counters_.bytes_gds.load();
  s.device_bytes_cufile = by_route > io_staged ? by_route - io_staged : 0;
  s.device_bytes_staged = counters_.bytes_staged.load() + (by_route - s.device_bytes_cufile);
  const StagingPool::Stats pool = pool_->stats();
  s.staging_allocations = pool.allocations;
  s.staging_reuses = pool.reuses;
  s.staging_lent_bytes = pool.lent_bytes;
  s.staging_kept_bytes = pool.kept_bytes;
  return s;
}

}  // namespace deepio::detail
