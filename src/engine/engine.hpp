// Engine: what a deepio::Handle is made of. Opens files, plans requests, hands slices to
// the workers, and tracks operations until they are collected. Its members are defined by
// job: engine.cpp (construction, destruction, one request's way to the workers), open.cpp,
// submit_ranges.cpp, submit_batch.cpp, ledger.cpp (track, collect, wait, mark, pending);
// the argument checks are pure functions in checks.hpp.
//
// Invariants: every submitted op is in unclaimed_, in submission order (sequence 1, 2, ...,
// given by track()), until it is collected: by collect() (claim) or by its Future
// (take_result); collected ops are dropped from unclaimed_ by the next collect() or
// submission. An op is collected only when done, and collection moves its keep-alive to the
// collecting thread, so the engine itself never releases a keep-alive except in its
// destructor (ops nobody collected). The destructor stops the workers, and a worker stops
// only after finishing every slice queued to it, so no op is ever abandoned. Thread safety:
// all public members may be called concurrently; unclaimed_ and next_sequence_ are guarded
// by mutex_.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/device_route.hpp"
#include "core/op.hpp"
#include "core/plan.hpp"
#include "core/worker.hpp"
#include "engine/binding.hpp"
#include "engine/device.hpp"
#include "platform/process.hpp"
#include "platform/sys.hpp"
#include "deepio/handle.hpp"

namespace deepio::detail {

/// The opener threads (openers.hpp) and the sync threads (syncers.hpp).
class Openers;
class Syncers;
/// What direct I/O needs to know of an opened file, and a file opened once for many
/// operations (a batch's run, a file object): engine_parts.hpp.
struct Opened;
struct SharedFile;

/// What a handle is built with beyond its options.
struct EngineSetup {
  /// How device memory is recognised and staged; empty classify: device_support().
  DeviceSupport device;
  /// A way for device memory to reach files without staging (GdsHandle); null: make_route, or
  /// always staged.
  std::shared_ptr<DeviceRoute> route;
  /// With route null: makes the route on the first operation on device memory, once (a
  /// handle's DeviceRouteMode::Auto); a null result means "always staged". If it throws, the
  /// submission fails with that error and the next operation on device memory tries again.
  std::function<std::shared_ptr<DeviceRoute>()> make_route;
};

/// How many engines (handles of any kind) exist in this process now: diagnostics and tests
/// (one default engine per process, for the Python package). Engines a forked child inherited
/// from its parent stay counted there (they are leaked, not destroyed).
std::size_t live_engines() noexcept;

class Engine {
 public:
  explicit Engine(const HandleOptions& options, EngineSetup setup = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Exactly one of path / fd names the file (fd < 0 when path is used).
  std::shared_ptr<OpState> submit(bool write, void* buf, std::size_t nbytes, const std::string* path, int fd,
                                  std::uint64_t file_offset, OpOptions op_options = {}, BindingOp binding = {});
  /// Handle::submit_batch: checks every request, tracks them all in order, and hands the
  /// opening and planning to the opener threads. `binding`: empty, or one per request.
  std::vector<std::shared_ptr<OpState>> submit_batch(std::vector<IoRequest> requests,
                                                     std::vector<BindingOp> binding = {});
  /// Handle::async_pread_ranges / async_pwrite_ranges: one op over many ranges of one file.
  /// With `file` (a file object; then path is &file->path and fd -1), nothing is opened.
  std::shared_ptr<OpState> submit_ranges(bool write, void* buf, std::size_t buffer_bytes, const std::string* path,
                                         int fd, std::span<const IoRange> ranges, OpOptions op_options,
                                         BindingOp binding = {}, const std::shared_ptr<SharedFile>& file = nullptr);
  /// A file object (deepio::File, the binding's): `path` opened once with `flags` as open(2)
  /// takes them (O_CREAT creates with mode 0666 & ~umask), O_DIRECT as open_maybe_direct
  /// decides with `mode`, its buffered twin reopened from the same descriptor, its facts
  /// (alignment, size, device, tmpfs or not) read once. Not tied to this engine: any engine
  /// may run operations on it (a forked child's own). Throws deepio::Error naming the path.
  std::shared_ptr<SharedFile> open_object(const std::string& path, int flags, DirectIo mode);
  /// submit() on a file object: nothing is opened or inspected. Throws as submit() does, and
  /// EBADF for a read of a file opened write-only or a write of one opened read-only.
  std::shared_ptr<OpState> submit_file(bool write, void* buf, std::size_t nbytes,
                                       const std::shared_ptr<SharedFile>& file, std::uint64_t file_offset,
                                       OpOptions op_options = {}, BindingOp binding = {});
  /// submit_ranges() on a file object; EBADF as submit_file().
  std::shared_ptr<OpState> submit_file_ranges(bool write, void* buf, std::size_t buffer_bytes,
                                              const std::shared_ptr<SharedFile>& file, std::span<const IoRange> ranges,
                                              OpOptions op_options = {}, BindingOp binding = {});
  /// detail::collect (binding.hpp); `with` is the state of BindingCollect::with (or null).
  Collected collect(const BindingCollect& options, const std::shared_ptr<OpState>& with);
  std::size_t wait();
  [[nodiscard]] std::uint64_t mark() const noexcept;
  [[nodiscard]] std::size_t pending() const noexcept;
  [[nodiscard]] const HandleOptions& options() const noexcept { return options_; }
  [[nodiscard]] BackendKind backend() const noexcept { return kind_; }
  [[nodiscard]] HandleStats stats() const noexcept;
  /// The raw counters (GdsHandle reads the device ones).
  [[nodiscard]] const Counters& counters() const noexcept { return counters_; }
  /// The one supply of staging memory: the workers' bounce arenas and the binding's windows.
  [[nodiscard]] StagingPool& staging_pool() noexcept { return *pool_; }
  /// False in a process forked after the engine was made: every submission and collection
  /// there throws deepio::ForkedHandle, and the engine must be leaked, not destroyed (its
  /// threads are not in this process).
  [[nodiscard]] bool in_own_process() const noexcept { return process_.here(); }

 private:
  /// Slices of a batch's run not yet handed to the workers, one list per host worker
  /// (engine_parts.hpp).
  struct PendingSlices;
  /// How an op on device memory goes: through the route's backend (direct) or staged; file
  /// is the route's registration, kept by every slice until the op's requests are done.
  struct Route {
    bool direct = false;
    std::shared_ptr<const DriverFile> file;
  };
  /// `file`: the file object the op is on (its registration with the route is made once and
  /// kept in it), null for path and descriptor operations and batches' shared opens.
  Route bind_route(OpState& op, void* buf, const Opened& opened, SharedFile* file = nullptr);
  /// The route (made now by make_route_ the first time, with its workers), or null.
  DeviceRoute* device_route();
  /// Workers for `route`'s backend (none when it has no backend).
  std::vector<std::unique_ptr<Worker>> make_route_workers(DeviceRoute& route, const WorkerConfig& wc);
  void open_path(OpState& op, bool write, const std::string& path, std::uint64_t* size, Opened* out);
  void preallocate(int fd, std::uint64_t file_offset, std::size_t nbytes);
  /// `extent`: the bytes of `buf` the op may touch (nbytes, or a ranged op's whole buffer).
  std::shared_ptr<OpState> new_op(bool write, void* buf, std::size_t nbytes, std::string name,
                                  std::uint64_t file_offset, OpOptions op_options, BindingOp binding,
                                  std::size_t extent);
  /// Opens (or inspects) the file, checks the range and dispatches; `tracked`: the op already
  /// has its place in the submission order (a batch). Throws on failure, having queued nothing.
  /// With `shared` (a path request of a batch), its descriptors are used instead of opening.
  /// With `pending`, the slices for the host workers are collected there instead of queued.
  void start(const std::shared_ptr<OpState>& op, void* buf, const std::string* path, int fd, bool tracked,
             const std::shared_ptr<SharedFile>& shared = nullptr, PendingSlices* pending = nullptr);
  /// start() on an opener thread: a failure becomes the op's own (it completes failed).
  void start_batched(const std::shared_ptr<OpState>& op, const IoRequest& request,
                     const std::shared_ptr<SharedFile>& shared, PendingSlices* pending) noexcept;
  /// Queues what `pending` holds to the workers (one lock and one wake-up per worker).
  void flush(PendingSlices& pending) noexcept;
  /// One opener's share of a batch, requests [begin, end), in order.
  void start_run(const std::vector<IoRequest>& batch, const std::vector<std::shared_ptr<OpState>>& ops,
                 std::size_t begin, std::size_t end) noexcept;
  std::shared_ptr<SharedFile> open_shared(bool write, const std::string& path);
  /// The size a request ending at `end` is checked against: the file's known size, re-read
  /// (fstat) first for a file object when `end` lies past it (another writer may have grown
  /// the file). Throws deepio::Error if that fstat fails.
  std::uint64_t size_for(SharedFile& file, std::uint64_t end);
  /// *out from the facts of a descriptor just opened (direct: opened with O_DIRECT).
  void describe(int fd, const FileFacts& facts, bool direct, Opened* out);
  /// Opens `path` for the engine (O_DIRECT unless refused; see docs/engine.md) and sizes it.
  UniqueFd open_checked(bool write, const std::string& path, std::uint64_t* size, Opened* out);
  /// Opens `path` with `flags`, and O_DIRECT unless `mode` is Off or the file system refuses it
  /// (On: refused is an error; Auto: counted in direct_refused, opened through the page cache).
  /// *direct says which; *facts is the file as opened. Throws deepio::Error naming the path.
  UniqueFd open_maybe_direct(const std::string& path, int flags, DirectIo mode, FileFacts* facts, bool* direct);
  Openers& start_openers();
  /// The sync threads, started by the first durable write (throws if they cannot start).
  SyncRunner& start_syncers();
  /// Opens the op's file (through `shared` when given) or inspects its descriptor `fd`: the
  /// descriptors go to the op; *opened and *size say what direct I/O needs and the file's size
  /// (max() when it has none). Throws on failure.
  void open_op(OpState& op, const std::string* path, int fd, const std::shared_ptr<SharedFile>& shared, Opened* opened,
               std::uint64_t* size);
  /// What the planner needs for the op (its whole range; a ranged op overrides nothing).
  [[nodiscard]] PlanInput plan_input(const OpState& op, void* buf, const Opened& opened, const Route& route) const;
  /// Hands the op's planned slices to the workers (or to `pending`) and tracks the op unless
  /// `tracked`. Opens the buffered descriptor first if a slice needs it (throwing, with nothing
  /// queued, if it cannot).
  void queue(const std::shared_ptr<OpState>& op, std::vector<Slice> slices, const Opened& opened, Route route,
             bool tracked, PendingSlices* pending = nullptr);
  /// open_file() / reopen_file(), waiting for this handle's own ops to release descriptors
  /// when the process has none left (EMFILE/ENFILE) rather than failing.
  Status open_with_backpressure(const std::string& path, int flags, UniqueFd* fd);
  Status reopen_with_backpressure(int source, int flags, const std::string& name, UniqueFd* fd);
  Status with_backpressure(const std::function<Status()>& open, UniqueFd* fd);
  /// The op's descriptor without O_DIRECT, reopened from its own descriptor with back-pressure.
  Status buffered_fd(OpState& op, int* out);
  /// Whether io_uring workers should run this file's requests themselves (tmpfs/ramfs; see
  /// Segment::in_memory): fstatfs once per device (it costs ~1 us on ext4), then cached.
  bool in_memory(int fd, std::uint64_t dev);
  /// Gives a dispatched op its sequence number and adds it to unclaimed_ (dropping collected
  /// ops from the front on the way).
  void track(const std::shared_ptr<OpState>& op);
  /// track() for a batch's ops, in the order given, under one lock.
  void track(const std::vector<std::shared_ptr<OpState>>& ops);

  /// Counts the engines alive in the process (live_engines()) from construction to destruction.
  struct LiveCount {
    LiveCount() noexcept;
    ~LiveCount();
    LiveCount(const LiveCount&) = delete;
    LiveCount& operator=(const LiveCount&) = delete;
  };

  const ProcessStamp process_;
  const LiveCount live_;
  HandleOptions options_;
  BackendKind kind_ = BackendKind::Threads;
  std::size_t bounce_slot_bytes_ = 0;
  DeviceSupport device_;
  Counters counters_;
  // Before the workers: their bounce arenas go back to it when they are destroyed.
  std::shared_ptr<StagingPool> pool_;
  CompletionSignal signal_;
  std::atomic<std::uint64_t> submitted_{0};
  // The worker the next op too small to split goes to (PlanInput::first_worker), turned round
  // op by op.
  mutable std::atomic<std::size_t> next_worker_{0};
  // The route and its workers are set at construction, or once by device_route() (route_once_)
  // and published by route_ready_; only threads that passed device_route() or saw route_ready_
  // read them (the destructor runs when no call is in flight).
  std::shared_ptr<DeviceRoute> route_;
  std::function<std::shared_ptr<DeviceRoute>()> make_route_;
  bool may_route_ = false;  // route_ or make_route_ set at construction; never changes
  std::once_flag route_once_;
  std::atomic<bool> route_ready_{false};
  WorkerConfig route_config_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> route_workers_;  // the route's backends, if it has any

  std::mutex memory_devices_mutex_;
  std::vector<std::pair<std::uint64_t, bool>> memory_devices_;  // guarded by memory_devices_mutex_

  std::mutex openers_mutex_;
  std::unique_ptr<Openers> openers_;  // started by the first batch; guarded by openers_mutex_
  std::unique_ptr<Syncers> syncers_;  // started by the first durable write; guarded by openers_mutex_

  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<OpState>> unclaimed_;  // guarded by mutex_
  std::uint64_t next_sequence_ = 1;                 // guarded by mutex_
};

}  // namespace deepio::detail
