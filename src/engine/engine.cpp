#include "engine/engine.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "backends/factory.hpp"
#include "core/env.hpp"
#include "core/plan.hpp"
#include "platform/sys.hpp"

namespace deepio::detail {

namespace {
constexpr std::size_t kMaxBlock = std::size_t{1} << 30;       // one request never exceeds 1 GiB
constexpr std::size_t kBounceBudget = std::size_t{16} << 20;  // bounce memory per worker
constexpr std::size_t kMaxCount = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// A value as its caller most likely wrote it: callers that take signed integers (the Python
// binding) pass a negative number through as a huge unsigned one.
std::string as_written(std::uint64_t v) {
  return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
             ? std::to_string(static_cast<std::int64_t>(v))
             : std::to_string(v);
}

// Files whose every io_uring read or write the kernel (6.x) hands to an io-wq worker thread
// instead of running it at submission (tmpfs and ramfs: no FMODE_NOWAIT): two context
// switches per request, which at 4 KiB cost more than the copy itself (a batch of 4 KiB
// reads from /dev/shm went 2x faster with half the CPU through pread in the worker). Only
// io_uring workers are told; the other backends are synchronous or do the same themselves.
bool memory_file_system(int fd) noexcept {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) return false;
  return sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC;
}

// The one check of a count option: positive and at most `max`.
void check_count(const char* name, std::size_t value, std::size_t max) {
  if (value != 0 && value <= max) return;
  throw InvalidArgument(std::string(name) + " must be a positive integer" +
                        (max < kMaxCount ? " of at most " + std::to_string(max) : std::string()) + ", got " +
                        as_written(value));
}
}  // namespace

struct Engine::Opened {
  bool direct = false;
  bool in_memory = false;  // tmpfs/ramfs: see Segment::in_memory
  std::size_t mem_align = 1;
  std::size_t offset_align = 1;
};

// Slices of one opener's run, held back so that many small operations reach a worker with
// one lock and one wake-up instead of one each. Flushed at growing counts (the first
// requests start at once) and always before the opener opens a file: an open may wait for
// this handle's operations to finish (descriptor back-pressure), and none of them may be
// sitting here then.
struct Engine::PendingSlices {
  explicit PendingSlices(std::size_t workers) : per_worker(workers) {}
  std::vector<std::vector<SliceTask>> per_worker;
  std::size_t count = 0;  // slices held
  std::size_t limit = 8;  // flush when count reaches it; doubles up to kMaxLimit
  static constexpr std::size_t kMaxLimit = 256;
  /// Room for one more slice in every list, so that queueing an op's slices cannot throw
  /// once the op is counted as submitted.
  void reserve_one_each() {
    for (auto& v : per_worker) {
      if (v.size() == v.capacity()) v.reserve(std::max<std::size_t>(16, 2 * v.capacity()));
    }
  }
};

struct Engine::SharedFile {
  UniqueFd main;      // O_DIRECT when opened.direct
  UniqueFd buffered;  // without O_DIRECT, when main has it
  Opened opened;
  std::uint64_t size = 0;  // as the requests dispatched so far leave it
};

// Threads that open, size and plan the requests of batches, so that the submitting thread
// returns at once. Jobs run in the order posted per thread; stop() runs every job already
// posted before joining, so no request of a batch is ever dropped.
class Engine::Openers {
 public:
  explicit Openers(std::size_t n) {
    try {
      for (std::size_t i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop();  // the threads already started end (nothing was posted yet); never terminate()
      throw;
    }
  }
  ~Openers() { stop(); }
  Openers(const Openers&) = delete;
  Openers& operator=(const Openers&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return threads_.size(); }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left to run
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                   // guarded by mutex_
  std::vector<std::thread> threads_;
};

// Durable writes: each op whose blocks are all done is fdatasynced here, on one of
// kSyncThreads threads, then completed. Many files at once on purpose: a journaling file
// system (ext4, xfs) commits the metadata of every file whose sync is waiting in one journal
// transaction and one cache flush, so N concurrent syncs of fresh files cost a few commits
// instead of N. (Without a journal, as on ext4 made with -O ^has_journal, each sync writes its
// file's inode and directory blocks itself and only the parallelism is gained.) Ops of ONE
// file are grouped instead (group commit): while a sync of a file runs, the ops of that file
// that finish meanwhile wait, and one more sync, started after all of their blocks were done,
// covers them all; a batch of 1024 durable writes to one file then costs a handful of
// fdatasync calls, not 1024. The threads sleep in the kernel almost all the time (no CPU cost
// to speak of).
class Engine::Syncers final : public SyncRunner {
 public:
  explicit Syncers(std::size_t n) : pool_(n) {}
  void post(std::shared_ptr<OpState> op) noexcept override {
    struct stat st {};
    const int fd = op->failed() ? -1 : op->sync_fd();
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      run_alone(std::move(op));  // failed (nothing to sync), or no file to group it by
      return;
    }
    const Key key{st.st_dev, st.st_ino};
    bool start = false;
    try {
      std::lock_guard lock(mutex_);
      Group& g = groups_[key];
      g.waiting.push_back(op);
      start = !std::exchange(g.running, true);
    } catch (...) {
      run_alone(std::move(op));  // out of memory: not grouped; a group's own sync covers the others
      return;
    }
    if (!start) return;  // the running sync of this file takes it in its next round
    try {
      pool_.post([this, key] { drain(key); });
    } catch (...) {
      drain(key);  // could not queue it (out of memory): sync here, on the worker
    }
  }
  void stop() noexcept { pool_.stop(); }

 private:
  struct Key {
    dev_t dev;
    ino_t ino;
    bool operator<(const Key& o) const noexcept { return dev != o.dev ? dev < o.dev : ino < o.ino; }
  };
  struct Group {
    bool running = false;                           // a drain() of this file is under way
    std::vector<std::shared_ptr<OpState>> waiting;  // posted, not yet covered by a sync
  };

  void run_alone(std::shared_ptr<OpState> op) noexcept {
    try {
      pool_.post([op] { op->run_sync(); });
    } catch (...) {
      op->run_sync();  // could not queue it (out of memory): sync here, on the worker
    }
  }

  // Syncs the file of `key` for every op waiting on it, round after round, until none is
  // left. Each op was posted after its blocks were done, so before the round that takes it
  // starts its sync: that one sync covers every op of the round.
  void drain(Key key) noexcept {
    for (;;) {
      std::vector<std::shared_ptr<OpState>> round;
      {
        std::lock_guard lock(mutex_);
        auto it = groups_.find(key);
        if (it->second.waiting.empty()) {
          groups_.erase(it);
          return;
        }
        round.swap(it->second.waiting);
      }
      const int err = round.front()->sync_file();
      finish_round(round, err);
    }
  }

  // One fdatasync wrote the file back for every op of the round, but Linux reports a writeback
  // error once to each open file description, and only to those opened before it (errseq): a
  // descriptor opened after an error someone has already seen syncs "successfully" while an
  // older descriptor's pages were lost. So each other descriptor of the round is asked for the
  // errors it has not seen (OpState::unseen_error: no writeback, no cache flush), once, and
  // every op of that descriptor gets the answer.
  static void finish_round(const std::vector<std::shared_ptr<OpState>>& round, int err) noexcept {
    const int first_fd = round.front()->sync_fd();
    std::vector<std::pair<int, int>> asked;  // (descriptor, its unseen error)
    try {
      asked.reserve(round.size());
    } catch (...) {
      for (const auto& op : round) op->finish_sync(err != 0 ? err : op->sync_file());  // no memory: sync each
      return;
    }
    for (const auto& op : round) {
      int e = err;
      const int fd = op->sync_fd();
      if (e == 0 && fd >= 0 && fd != first_fd) {
        auto it = std::find_if(asked.begin(), asked.end(), [fd](const auto& a) { return a.first == fd; });
        if (it == asked.end()) it = asked.insert(asked.end(), {fd, op->unseen_error()});
        e = it->second;
      }
      op->finish_sync(e);
    }
  }

  std::mutex mutex_;
  std::map<Key, Group> groups_;  // guarded by mutex_; a file's entry lives while it has a drain()
  Openers pool_;                 // last: stopped (joined) first, while the groups and the mutex still exist
};

namespace {
constexpr std::size_t kSyncThreads = 32;
}  // namespace

Engine::Engine(const HandleOptions& options, EngineSetup setup) : options_(options), route_(std::move(setup.route)) {
  if (options_.backend == BackendKind::Auto) options_.backend = env_backend().value_or(BackendKind::Auto);
  if (options_.direct_io == DirectIo::Auto) options_.direct_io = env_direct_io().value_or(DirectIo::Auto);
  check_count("block_size", options_.block_size, kMaxCount);
  check_count("queue_depth", options_.queue_depth, 65536);
  check_count("intra_op_parallelism", options_.intra_op_parallelism, 1024);

  const std::size_t page = page_size();
  bounce_slot_bytes_ = round_up(std::clamp<std::size_t>(options_.block_size, 64 << 10, 4 << 20), page);
  device_ = setup.device.classify ? std::move(setup.device) : device_support();
  WorkerConfig wc;
  wc.stager_factory = device_.make_stager;
  wc.queue_depth = options_.queue_depth;
  wc.single_submit = options_.single_submit;
  wc.overlap_events = options_.overlap_events;
  wc.bounce_slot_bytes = bounce_slot_bytes_;
  // At least two slots so disk and copies overlap, but never more than can be in flight.
  wc.bounce_slots = std::min(std::max<std::size_t>(kBounceBudget / bounce_slot_bytes_, 2), options_.queue_depth);

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
    start_route_workers(wc);
    return;
  }
  throw_error(why.errnum, "cannot set up the " + std::string(to_string(options_.backend)) + " backend: " + why.message);
}

void Engine::start_route_workers(const WorkerConfig& wc) {
  if (!route_ || !route_->has_backend()) return;
  // As many as the host workers: a route's backend is synchronous (one request at a time per
  // worker), so intra_op_parallelism is its parallelism, as in DeepNVMe's gds_handle.
  for (std::size_t i = 0; i < options_.intra_op_parallelism; ++i) {
    route_workers_.push_back(std::make_unique<Worker>(route_->make_backend(), wc, &counters_));
  }
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

bool Engine::in_memory(int fd, std::uint64_t dev) {
  if (kind_ != BackendKind::IoUring) return false;
  {
    std::lock_guard lock(memory_devices_mutex_);
    for (const auto& [d, m] : memory_devices_) {
      if (d == dev) return m;
    }
  }
  const bool m = memory_file_system(fd);
  std::lock_guard lock(memory_devices_mutex_);
  if (memory_devices_.size() < 64) memory_devices_.emplace_back(dev, m);
  return m;
}

Status Engine::open_with_backpressure(const std::string& path, int flags, UniqueFd* fd) {
  return with_backpressure([&] { return open_file(path, flags, 0666, fd); }, fd);
}

Status Engine::reopen_with_backpressure(int source, int flags, const std::string& name, UniqueFd* fd) {
  return with_backpressure([&] { return reopen_file(source, flags, name, fd); }, fd);
}

Status Engine::with_backpressure(const std::function<Status()>& open, UniqueFd* fd) {
  for (;;) {
    Status s = open();
    if (s.ok()) reserve_descriptors(fd->get());
    if (s.ok() || (s.errnum != EMFILE && s.errnum != ENFILE)) return s;
    // Out of descriptors: if this handle's own ops hold some, wait for one to finish.
    std::unique_lock lock(signal_.mutex);
    const std::uint64_t seen = signal_.finished;
    if (submitted_.load() <= seen) return s;
    signal_.cv.wait(lock, [&] { return signal_.finished != seen; });
  }
}

Status Engine::buffered_fd(OpState& op, int* out) {
  return op.buffered_fd(
      out, [&](int source, int flags, UniqueFd* fd) { return reopen_with_backpressure(source, flags, op.path(), fd); });
}

void Engine::open_path(OpState& op, bool write, const std::string& path, std::uint64_t* size, Opened* out) {
  UniqueFd fd = open_checked(write, path, size, out);
  if (out->direct) {
    op.set_direct_fd(std::move(fd));
  } else {
    op.set_buffered_fd(std::move(fd));
  }
}

std::shared_ptr<Engine::SharedFile> Engine::open_shared(bool write, const std::string& path) {
  auto f = std::make_shared<SharedFile>();
  f->main = open_checked(write, path, &f->size, &f->opened);
  if (f->opened.direct) {
    // The unaligned heads and tails of the requests go through the page cache: one
    // descriptor without O_DIRECT for all of them too, of the same file (not of the path).
    throw_if_error(reopen_with_backpressure(f->main.get(), write ? O_WRONLY : O_RDONLY, path, &f->buffered));
  }
  return f;
}

UniqueFd Engine::open_checked(bool write, const std::string& path, std::uint64_t* size, Opened* out) {
  const int base = write ? (O_WRONLY | O_CREAT) : O_RDONLY;
  UniqueFd fd;
  bool direct = options_.direct_io != DirectIo::Off;
  Status s = open_with_backpressure(path, base | (direct ? O_DIRECT : 0), &fd);
  if (!s.ok() && s.errnum == EINVAL && direct) {
    if (options_.direct_io == DirectIo::On) {
      throw_error(EINVAL, "the file system refuses O_DIRECT (direct_io=on)", path);
    }
    counters_.direct_refused.fetch_add(1, std::memory_order_relaxed);
    direct = false;
    s = open_with_backpressure(path, base, &fd);
  }
  throw_if_error(s);
  FileFacts facts;
  throw_if_error(file_facts(fd.get(), path, &facts));
  *size = facts.sized() ? facts.size : std::numeric_limits<std::uint64_t>::max();
  out->in_memory = in_memory(fd.get(), facts.dev);
  if (direct && facts.from_statx && facts.dio_offset_align == 0) {
    // Opened with O_DIRECT but the file system says it cannot do direct I/O on this file.
    if (options_.direct_io == DirectIo::On) {
      throw_error(EINVAL, "the file system does not support direct I/O on this file (direct_io=on)", path);
    }
    counters_.direct_refused.fetch_add(1, std::memory_order_relaxed);
    // Our own open file description (no caller shares it): clearing the flag is safe here.
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_DIRECT) != 0) {
      throw_error(errno, "cannot clear O_DIRECT (fcntl)", path);
    }
    direct = false;
  }
  out->direct = direct;
  if (direct) {
    // Without statx's answer, a page is a safe superset of any logical block size.
    out->mem_align = facts.from_statx ? std::max<std::uint32_t>(1, facts.dio_mem_align) : page_size();
    out->offset_align = facts.from_statx ? facts.dio_offset_align : page_size();
  }
  return fd;
}

namespace {
std::string file_name(const std::string* path, int fd) { return path != nullptr ? *path : "fd " + std::to_string(fd); }

// The argument checks every submission gets before anything is created.
void check_request(const void* buf, std::size_t nbytes, const std::string& name, std::uint64_t file_offset) {
  if (buf == nullptr && nbytes > 0) throw InvalidArgument("null buffer", name, file_offset, nbytes);
  if (file_offset > kMaxCount) {
    throw InvalidArgument("file_offset must be non-negative, got " + as_written(file_offset), name);
  }
  if (file_offset > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - nbytes) {
    throw_error(EOVERFLOW, "file_offset + nbytes overflows a file offset", name, file_offset, nbytes);
  }
}

// Whether check_request() would accept the request (no message, no allocation).
bool request_valid(const void* buf, std::size_t nbytes, std::uint64_t file_offset) noexcept {
  return (buf != nullptr || nbytes == 0) && file_offset <= kMaxCount &&
         file_offset <= static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - nbytes;
}

// check_request() with `where` ("request 3 of the batch: ", "range 5: ") before its message.
void check_request_at(const std::string& where, const void* buf, std::size_t nbytes, const std::string& name,
                      std::uint64_t file_offset) {
  try {
    check_request(buf, nbytes, name, file_offset);
  } catch (const Error& e) {
    if (e.invalid_argument()) throw InvalidArgument(where + e.message(), e.path(), e.offset(), e.nbytes());
    throw Error(e.errnum(), where + e.message(), e.path(), e.offset(), e.nbytes());
  }
}
}  // namespace

std::shared_ptr<OpState> Engine::new_op(bool write, void* buf, std::size_t nbytes, std::string name,
                                        std::uint64_t file_offset, OpOptions op_options, std::size_t extent) {
  auto op = std::make_shared<OpState>(write, std::move(name), file_offset, nbytes, &counters_, &signal_);
  // The caller holds its own reference across the submission, so dropping the op on a throw
  // never releases the keep-alive here.
  op->set_keep_alive(std::move(op_options.keep_alive));
  op->set_detached(op_options.detached);
  if (op_options.fsync) {
    if (!write) throw InvalidArgument("fsync applies to writes only", op->path(), file_offset, nbytes);
    op->set_sync(&start_syncers());
  }
  if (nbytes > 0) op->set_device(device_.classify(buf));
  op->set_on_device(op->device() >= 0);
  // Only io_uring registers buffers; the lookup is skipped for the others.
  if (nbytes > 0 && kind_ == BackendKind::IoUring && op->device() < 0) op->set_region(find_locked_region(buf, extent));
  return op;
}

std::shared_ptr<OpState> Engine::submit(bool write, void* buf, std::size_t nbytes, const std::string* path, int fd,
                                        std::uint64_t file_offset, OpOptions op_options) {
  process_.check();
  std::string name = file_name(path, fd);
  check_request(buf, nbytes, name, file_offset);
  auto op = new_op(write, buf, nbytes, std::move(name), file_offset, std::move(op_options), nbytes);
  start(op, buf, path, fd, /*tracked=*/false);
  return op;
}

namespace {
// The checks of a ranged operation (Handle::async_pread_ranges): returns the sum of the
// ranges' sizes. Costs no allocation when the ranges come sorted by the bytes that must not
// overlap (the buffer's for a read, the file's for a write) and one sort when they do not.
std::uint64_t check_ranges(bool write, const void* buf, std::size_t buffer_bytes, const std::string& name,
                           std::span<const IoRange> ranges) {
  const auto where = [](std::size_t i) { return "range " + std::to_string(i) + ": "; };
  std::uint64_t total = 0;
  bool sorted = true;
  std::uint64_t last_end = 0;  // end of the previous non-empty range, in the checked space
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const IoRange& r = ranges[i];
    if (r.buffer_offset > buffer_bytes || r.nbytes > buffer_bytes - r.buffer_offset) {
      throw InvalidArgument(where(i) + "buffer bytes [" + as_written(r.buffer_offset) + ", +" + as_written(r.nbytes) +
                                ") lie outside the buffer of " + std::to_string(buffer_bytes) + " bytes",
                            name, r.file_offset, r.nbytes);
    }
    if (!request_valid(buf, r.nbytes, r.file_offset)) check_request_at(where(i), buf, r.nbytes, name, r.file_offset);
    if (r.nbytes > kMaxCount - total) {
      throw_error(EOVERFLOW, where(i) + "the ranges' sizes add up to more than 2^63 - 1 bytes", name, r.file_offset,
                  r.nbytes);
    }
    total += r.nbytes;
    if (r.nbytes == 0) continue;
    const std::uint64_t start = write ? r.file_offset : r.buffer_offset;
    if (start < last_end) sorted = false;
    last_end = start + r.nbytes;
  }
  if (sorted) return total;
  struct Span {
    std::uint64_t start, end;
    std::size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const IoRange& r = ranges[i];
    const std::uint64_t start = write ? r.file_offset : r.buffer_offset;
    if (r.nbytes > 0) spans.push_back({start, start + r.nbytes, i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  for (std::size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].start >= spans[k - 1].end) continue;
    const std::size_t a = std::min(spans[k - 1].index, spans[k].index);
    const std::size_t b = std::max(spans[k - 1].index, spans[k].index);
    throw InvalidArgument("ranges " + std::to_string(a) + " and " + std::to_string(b) +
                              (write ? " overlap in the file (which write lands last would be unspecified)"
                                     : " overlap in the buffer (a read would fill the same bytes twice)"),
                          name);
  }
  return total;
}
}  // namespace

std::shared_ptr<OpState> Engine::submit_ranges(bool write, void* buf, std::size_t buffer_bytes, const std::string* path,
                                               int fd, std::span<const IoRange> ranges, OpOptions op_options) {
  process_.check();
  std::string name = file_name(path, fd);
  const std::uint64_t total = check_ranges(write, buf, buffer_bytes, name, ranges);
  const std::uint64_t first = ranges.empty() ? 0 : ranges.front().file_offset;
  auto op = new_op(write, buf, total, std::move(name), first, std::move(op_options), buffer_bytes);
  Opened opened;
  std::uint64_t size = 0;
  open_op(*op, path, fd, nullptr, &opened, &size);
  if (!write) {
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const IoRange& r = ranges[i];
      if (r.nbytes == 0 || r.file_offset + r.nbytes <= size) continue;
      throw_error(ENODATA,
                  "range " + std::to_string(i) + " reads past end of file: the file holds " + std::to_string(size) +
                      " bytes, the range ends at " + std::to_string(r.file_offset + r.nbytes),
                  op->path(), r.file_offset, r.nbytes);
    }
  }
  if (write && opened.direct && op->direct_fd() >= 0 && total > options_.block_size &&
      size != std::numeric_limits<std::uint64_t>::max()) {
    // Ranges that tile one span of the file exactly (they cannot overlap, so: no gap) and
    // extend the file are allocated first, as a large single write is (see preallocate):
    // nothing is allocated that the operation does not write.
    std::uint64_t lo = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t hi = 0;
    for (const IoRange& r : ranges) {
      if (r.nbytes == 0) continue;
      lo = std::min(lo, r.file_offset);
      hi = std::max<std::uint64_t>(hi, r.file_offset + r.nbytes);
    }
    if (hi - lo == total && hi > size) preallocate(op->direct_fd(), lo, static_cast<std::size_t>(total));
  }
  // Device memory is staged (no route: a route binds one contiguous range of the buffer).
  queue(op, plan_ranges(plan_input(*op, buf, opened, Route{}), ranges), opened, Route{}, /*tracked=*/false);
  return op;
}

std::vector<std::shared_ptr<OpState>> Engine::submit_batch(std::vector<IoRequest> requests) {
  process_.check();
  // 1. Every argument first: a refused request leaves the whole batch unsubmitted.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    // The common case costs no string: the message is made only for a refused request.
    if (r.path.empty() != (r.fd < 0) && !(r.op.fsync && !r.write) && request_valid(r.buffer, r.nbytes, r.file_offset)) {
      continue;
    }
    const std::string where = "request " + std::to_string(i) + " of the batch: ";
    if (r.path.empty() == (r.fd < 0)) {
      throw InvalidArgument(where + "exactly one of path and fd must name the file");
    }
    if (r.op.fsync && !r.write) throw InvalidArgument(where + "fsync applies to writes only");
    check_request_at(where, r.buffer, r.nbytes, file_name(r.path.empty() ? nullptr : &r.path, r.fd), r.file_offset);
  }
  if (requests.empty()) return {};
  // The opener threads first: if they cannot be started, nothing is tracked and the throw
  // leaves the handle as it was.
  Openers& openers = start_openers();
  // 2. The ops, in the submission order as given (one lock for the whole batch).
  auto batch = std::make_shared<std::vector<IoRequest>>(std::move(requests));
  std::vector<std::shared_ptr<OpState>> ops;
  ops.reserve(batch->size());
  for (IoRequest& r : *batch) {
    ops.push_back(new_op(r.write, r.buffer, r.nbytes, file_name(r.path.empty() ? nullptr : &r.path, r.fd),
                         r.file_offset, std::move(r.op), r.nbytes));
  }
  {
    std::lock_guard lock(mutex_);
    while (!unclaimed_.empty() && unclaimed_.front()->claimed()) unclaimed_.pop_front();
    for (const auto& op : ops) {
      op->set_sequence(next_sequence_++);
      unclaimed_.push_back(op);
    }
  }
  // 3. Opening and planning go to the openers, in contiguous runs (at least kMinRun requests
  // each, so a small batch stays on one thread and in order).
  constexpr std::size_t kMinRun = 16;
  const std::size_t runs = std::clamp<std::size_t>(ops.size() / kMinRun, 1, openers.size());
  auto shared_ops = std::make_shared<std::vector<std::shared_ptr<OpState>>>(ops);
  for (std::size_t k = 0; k < runs; ++k) {
    const std::size_t begin = ops.size() * k / runs;
    const std::size_t end = ops.size() * (k + 1) / runs;
    try {
      openers.post([this, batch, shared_ops, begin, end] { start_run(*batch, *shared_ops, begin, end); });
    } catch (const std::exception&) {
      // Tracked already: a run that cannot be queued fails its requests (a later wait()
      // reports them) rather than leaving them pending forever.
      for (std::size_t i = begin; i < end; ++i) {
        const auto& op = ops[i];
        op->fail(Status::failure(ENOMEM, "out of memory while submitting", op->path(), op->offset(), op->nbytes()));
        submitted_.fetch_add(1);
        op->complete_now();
      }
    }
  }
  return ops;
}

void Engine::start_run(const std::vector<IoRequest>& batch, const std::vector<std::shared_ptr<OpState>>& ops,
                       std::size_t begin, std::size_t end) noexcept {
  // Consecutive requests on one path in one direction share one open of it (a file read or
  // written at many offsets costs one open, not one per request).
  // Not for device memory when a route (GDS) may serve it: the route registers the
  // descriptor with cuFile per operation, and a descriptor registered twice is refused.
  const auto same_file = [&](std::size_t a_index, std::size_t b_index) {
    const IoRequest& a = batch[a_index];
    const IoRequest& b = batch[b_index];
    if (route_ && (ops[a_index]->on_device() || ops[b_index]->on_device())) return false;
    return !a.path.empty() && a.write == b.write && a.path == b.path;
  };
  std::shared_ptr<SharedFile> shared;
  std::optional<PendingSlices> pending;
  try {
    pending.emplace(workers_.size());
  } catch (...) {
    // Out of memory: every request is queued on its own, as a single submission is.
  }
  PendingSlices* const out = pending ? &*pending : nullptr;
  for (std::size_t i = begin; i < end; ++i) {
    const IoRequest& r = batch[i];
    if (shared && !(i > begin && same_file(i - 1, i))) shared.reset();
    if (!shared && i + 1 < end && same_file(i, i + 1)) {
      if (out != nullptr) flush(*out);  // the open may wait for queued operations
      try {
        shared = open_shared(r.write, r.path);
      } catch (...) {
        shared.reset();  // the request opens the file itself and reports why it cannot
      }
    }
    if (out != nullptr && !shared && !r.path.empty()) flush(*out);  // it opens its file
    start_batched(ops[i], r, shared, out);
    if (out != nullptr && out->count >= out->limit) {
      flush(*out);
      out->limit = std::min(out->limit * 2, PendingSlices::kMaxLimit);
    }
  }
  if (out != nullptr) flush(*out);
}

void Engine::flush(PendingSlices& pending) noexcept {
  for (std::size_t w = 0; w < pending.per_worker.size(); ++w) {
    auto& tasks = pending.per_worker[w];
    try {
      workers_[w]->enqueue(tasks);
    } catch (...) {
      // Out of memory while queueing: the slices not queued end their ops as failed.
      for (auto& t : tasks) {
        if (!t.op) continue;
        t.op->fail(
            Status::failure(ENOMEM, "out of memory while submitting", t.op->path(), t.op->offset(), t.op->nbytes()));
        t.op->slice_done();
      }
      tasks.clear();
    }
  }
  pending.count = 0;
}

Engine::Openers& Engine::start_openers() {
  std::lock_guard lock(openers_mutex_);
  if (!openers_) openers_ = std::make_unique<Openers>(std::min<std::size_t>(options_.intra_op_parallelism, 8));
  return *openers_;
}

SyncRunner& Engine::start_syncers() {
  std::lock_guard lock(openers_mutex_);
  if (!syncers_) syncers_ = std::make_unique<Syncers>(kSyncThreads);
  return *syncers_;
}

void Engine::start_batched(const std::shared_ptr<OpState>& op, const IoRequest& r,
                           const std::shared_ptr<SharedFile>& shared, PendingSlices* pending) noexcept {
  Status failure;
  try {
    start(op, r.buffer, r.path.empty() ? nullptr : &r.path, r.fd, /*tracked=*/true, shared, pending);
    return;
  } catch (const Error& e) {
    // As for a single submission, an open failure names the request that was attempted.
    const bool bare = e.nbytes() == 0 && e.offset() == 0 && op->nbytes() != 0;
    failure = Status::failure(e.errnum(), e.message() + (bare ? (op->write() ? " for writing" : " for reading") : ""),
                              e.path().empty() ? op->path() : e.path(), bare ? op->offset() : e.offset(),
                              bare ? op->nbytes() : e.nbytes());
  } catch (const std::bad_alloc&) {
    failure = Status::failure(ENOMEM, "out of memory while submitting", op->path(), op->offset(), op->nbytes());
  } catch (const std::exception& e) {
    failure = Status::failure(EIO, e.what(), op->path(), op->offset(), op->nbytes());
  }
  // Failed before any slice was queued: it completes now, counted as submitted and finished
  // so the descriptor back-pressure stays balanced.
  op->fail(std::move(failure));
  submitted_.fetch_add(1);
  op->complete_now();
}

void Engine::open_op(OpState& op, const std::string* path, int fd, const std::shared_ptr<SharedFile>& shared,
                     Opened* opened, std::uint64_t* size) {
  const bool write = op.write();
  const std::string& name = op.path();
  if (path != nullptr && shared) {
    *opened = shared->opened;
    *size = shared->size;
    op.share_fds(shared, opened->direct ? shared->main.get() : -1,
                 opened->direct ? shared->buffered.get() : shared->main.get());
  } else if (path != nullptr) {
    open_path(op, write, *path, size, opened);
  } else {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) throw_error(errno, "bad file descriptor", name);
    FileFacts facts;
    throw_if_error(file_facts(fd, name, &facts));
    *size = facts.sized() ? facts.size : std::numeric_limits<std::uint64_t>::max();
    opened->in_memory = in_memory(fd, facts.dev);
    op.set_borrowed_source(fd);
    opened->direct = (flags & O_DIRECT) != 0 && options_.direct_io != DirectIo::Off;
    if (opened->direct) {
      opened->mem_align = facts.from_statx ? std::max<std::uint32_t>(1, facts.dio_mem_align) : page_size();
      opened->offset_align = facts.from_statx && facts.dio_offset_align != 0 ? facts.dio_offset_align : page_size();
      op.borrow_direct_fd(fd);
    } else if ((flags & O_DIRECT) == 0) {
      op.borrow_buffered_fd(fd);
    }  // else: direct_io=off on an O_DIRECT descriptor; queue() reopens it without O_DIRECT
  }
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
  if (op->device() >= 0 && route_) route = bind_route(*op, buf, opened);
  PlanInput in = plan_input(*op, buf, opened, route);
  queue(op, plan_request(in), opened, std::move(route), tracked, pending);
  // The next request on the shared descriptor sees the size this write leaves (only the
  // opener thread that owns `shared` reads or writes it).
  if (shared && write && size != std::numeric_limits<std::uint64_t>::max()) {
    shared->size = std::max<std::uint64_t>(size, file_offset + nbytes);
  }
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

Engine::Route Engine::bind_route(OpState& op, void* buf, const Opened& opened) {
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
  Route route;
  bool staged = true;
  throw_if_error(route_->bind(b, &staged, &route.file));
  route.direct = !staged;
  // Served by the route's backend: the device address goes to it as it is, never staged.
  if (route.direct) op.set_device(-1);
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
    op->complete_now();
    return;
  }
  op->set_slices(static_cast<int>(slices.size()));
  if (pending != nullptr) {
    for (Slice& s : slices) {
      pending->per_worker[s.worker].push_back(SliceTask{op, std::move(s.segments), route.file, route.direct});
    }
    pending->count += slices.size();
    return;
  }
  auto& workers = route.direct ? route_workers_ : workers_;
  for (Slice& s : slices) {
    workers[s.worker]->enqueue(SliceTask{op, std::move(s.segments), route.file, route.direct});
  }
}

void Engine::track(const std::shared_ptr<OpState>& op) {
  std::lock_guard lock(mutex_);
  // Ops already collected (through their Future) need no wait(): drop them. Their keep-alives
  // went to whoever collected them, so nothing of the caller's is released here.
  while (!unclaimed_.empty() && unclaimed_.front()->claimed()) unclaimed_.pop_front();
  op->set_sequence(next_sequence_++);
  unclaimed_.push_back(op);
}

std::uint64_t Engine::mark() const noexcept {
  std::lock_guard lock(mutex_);
  return next_sequence_ - 1;
}

WaitResult Engine::collect(const CollectOptions& options, const std::shared_ptr<OpState>& with) {
  process_.check();  // the parent's workers will never finish anything here
  const auto selected = [&](const std::shared_ptr<OpState>& op) {
    return op.get() == with.get() || !op->detached() || options.detached;
  };
  // 0. With a deadline (a binding waiting in slices), the newest selected op first: while it
  // runs, this returns without a snapshot of every pending op (a batch of 65 536 requests
  // was otherwise copied, and each op's lock taken, every slice while it ran).
  if (options.deadline) {
    std::shared_ptr<OpState> newest;
    {
      std::lock_guard lock(mutex_);
      const std::uint64_t through = std::min(options.through, next_sequence_ - 1);
      for (auto it = unclaimed_.rbegin(); it != unclaimed_.rend(); ++it) {
        if ((*it)->sequence() > through || (*it)->claimed() || !selected(*it)) continue;
        newest = *it;
        break;
      }
    }
    if (newest && !newest->wait_until(*options.deadline)) {
      WaitResult result;
      result.complete = false;  // nothing claimed: the ops stay pending for a later call
      return result;
    }
  }
  // 1. The snapshot, in submission order: what this call waits for and collects.
  std::vector<std::shared_ptr<OpState>> ops;
  {
    std::lock_guard lock(mutex_);
    const std::uint64_t through = std::min(options.through, next_sequence_ - 1);
    for (const auto& op : unclaimed_) {
      if (op->sequence() > through || op->claimed()) continue;
      if (selected(op)) ops.push_back(op);
    }
  }
  if (with && std::find(ops.begin(), ops.end(), with) == ops.end() && !with->claimed()) {
    ops.insert(std::upper_bound(ops.begin(), ops.end(), with,
                                [](const auto& a, const auto& b) { return a->sequence() < b->sequence(); }),
               with);
  }
  // 2. Wait, newest first: workers finish their queues in order, so once the newest op is
  // done most others are too, and the caller wakes up a few times instead of once per op.
  WaitResult result;
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (!options.deadline) {
      (*it)->wait();
    } else if (!(*it)->wait_until(*options.deadline)) {
      result.complete = false;  // nothing claimed: the ops stay pending for a later call
      return result;
    }
  }
  // 3. Claim. An op another thread collected meanwhile is skipped: each op is counted once.
  std::lock_guard lock(mutex_);
  for (const auto& op : ops) {
    Status err;
    std::shared_ptr<void> keep;
    const bool counted = op.get() == with.get() || !op->detached();  // else: the outcome stays with its Future
    if (!op->claim(&err, &keep, counted)) continue;
    if (keep) result.keep_alive.push_back(std::move(keep));
    if (!counted) continue;
    ++result.count;
    if (!err.ok()) result.errors.emplace_back(err.errnum, err.message, err.path, err.offset, err.nbytes);
  }
  // Detached ops whose every Future is gone and that are done: nobody else can collect them.
  // use_count() == 1 under mutex_ means unclaimed_ holds the only reference, and no new one
  // can be made without mutex_; transient references (a worker's, another snapshot's) only
  // postpone this to a later call. The count is read first: it costs no lock, and an op
  // somebody still holds a Future of is skipped without touching its mutex.
  bool reaped = false;
  for (const auto& op : unclaimed_) {
    if (op.use_count() != 1 || !op->detached()) continue;
    Status err;
    std::shared_ptr<void> keep;
    // Silent: a failure was reported when the last Future went (OpState::drop_future).
    if (!op->claim(&err, &keep, /*counted=*/false)) continue;
    reaped = true;
    if (keep) result.keep_alive.push_back(std::move(keep));
  }
  // Ops collected by their Future in the middle of the list go with the next call that
  // collects something; track() drops them from the front meanwhile.
  if (!ops.empty() || reaped) {
    std::erase_if(unclaimed_, [](const std::shared_ptr<OpState>& op) { return op->claimed(); });
  }
  return result;
}

std::size_t Engine::wait() {
  WaitResult r = collect(CollectOptions{}, nullptr);
  if (!r.errors.empty()) throw r.errors.front();
  return r.count;
}

std::size_t Engine::pending() const noexcept {
  std::lock_guard lock(mutex_);
  // Collected ops (through their Future) and detached ones are not waited for by wait().
  return static_cast<std::size_t>(std::count_if(unclaimed_.begin(), unclaimed_.end(),
                                                [](const auto& op) { return !op->claimed() && !op->detached(); }));
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
  return s;
}

}  // namespace deepio::detail
