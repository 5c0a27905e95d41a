// GPUDirect Storage as a route of the engine: cuFile moves device memory to and from files,
// one synchronous cuFileRead/cuFileWrite per request, on the engine's own workers.
//
// Lifecycle: a GdsRoute belongs to one GdsHandle. Its constructor decides the mode: Compat
// never uses cuFile; Auto and CuFile take a DriverRef (the first one in the process opens the
// cuFile driver, the last one closes it after deregistering leftover buffers from cuFile;
// they stay pinned in the registry until unpinned, and a later pin registers them again).
// Auto falls back to staging when cuFile is missing or its driver cannot be opened; CuFile
// throws instead.
// Opening the driver first asks cuFile to allow its compatibility mode (its parameter API; no
// file written, no environment changed). bind() (DeviceRoute) runs per operation on device
// memory: it range-checks the buffer against the pinned registrations and marks the
// registration in use (per operation, always), and finds the file's cuFile registration
// (GdsRegistration): a path operation registers its descriptor with cuFileHandleRegister for
// itself; a file object (DeviceBinding::slot) registers on its first device operation, under
// its slot's lock (concurrent first operations make one registration), and every later
// operation on it reuses that handle. A refusal that means "GDS cannot serve this file here"
// (cufile_gds_unusable: CU_FILE_HANDLE_NOT_REGISTERED on a machine without nvidia-fs, among
// others) makes the operation staged in Auto mode (recorded in mode_reason() and
// files_fallback) and is an error in CuFile mode (not kept: a file object's next operation
// asks again). In Auto such a refusal is remembered for the file's file system (st_dev):
// later files there are staged without a registration attempt (registrations_skipped), and a
// file object keeps it too (its later operations are staged without asking: also counted in
// registrations_skipped). A buffer registration refused the same way is kept unregistered in
// Auto (pins_refused), an error in CuFile mode. The handle is deregistered when its last
// holder drops it: a path operation's when the engine drops the operation's GdsFile (after its
// last request, before its descriptor closes); a file object's when the file object goes
// (after its last operation, before its descriptors close). A registration holds the route,
// so the cuFile driver stays open until then; one dropped in a forked child (a file object
// inherited across fork) is not deregistered there: cuFile's state is the parent's.
//
// Backend: make_backend() gives each route worker a synchronous backend (like the thread
// pool's): submit() runs each request with the worker thread's CUDA context current for the
// buffer's device and queues the result; reap() hands the results back. Negative cuFile
// results become -errno with the cuFile error name kept for the failure message
// (take_error_text), except in Auto, where a cuFile error code (not -1 + errno) makes the
// backend stage that request and the rest of its operation itself (host bounce buffer,
// pread/pwrite on a descriptor without O_DIRECT, synchronous copies; io_fallbacks). Short
// transfers are returned as they are: the worker resubmits the rest.
//
// Contexts: worker threads are the route's own and keep a context current. Every driver or
// cuFile call on any other thread (bind, deregister, pin/unpin/new_pinned/free_pinned, the
// destructor) runs under a ScopedContext (enter()), so the caller's current context is the
// same before and after, on every path. The primary contexts are retained once per route per
// device and released, exactly those, by the destructor.
//
// Thread safety: bind(), pin/unpin and the mode accessors may be called from any thread;
// contexts_ is guarded by contexts_mutex_, the mode by mode_mutex_, registry entries by the
// registry's mutex, a file object's registration by its RouteFileSlot's mutex.
// deregister() runs on whichever thread drops the last holder (a worker finishing the
// operation that outlived its file object's close, among others), under a ScopedContext.
//
// Sources: gds_route.cpp (mode, contexts, bind and file registrations), gds_backend.cpp (the
// backend and its staged path), gds_pins.cpp (pinned buffers), gds_file.hpp (GdsRegistration
// and GdsFile, shared by them).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/device_route.hpp"
#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"

namespace deepio::detail::gpu {

class GdsRegistration;

class GdsRoute final : public DeviceRoute, public std::enable_shared_from_this<GdsRoute> {
 public:
  /// cufile_api null: cuFile is absent (cufile_why says why). Throws deepio::Error as
  /// GdsHandle's constructor documents.
  GdsRoute(const GdsOptions& options, const CudaApi* cuda_api, CuFileApi* cufile_api, const Status& cufile_why);
  ~GdsRoute() override;
  GdsRoute(const GdsRoute&) = delete;
  GdsRoute& operator=(const GdsRoute&) = delete;

  /// Whether cuFile is in use at all (else every operation is staged and no backend is needed).
  [[nodiscard]] bool has_backend() const noexcept override { return cufile_ != nullptr; }
  std::unique_ptr<Backend> make_backend() override;
  Status bind(const DeviceBinding& what, bool* staged, std::shared_ptr<const DriverFile>* out) override;

  bool pin(void* p, std::size_t nbytes);
  bool unpin(void* p);
  void* new_pinned(std::size_t nbytes, int device);
  bool free_pinned(void* p);
  [[nodiscard]] std::string mode() const;
  [[nodiscard]] std::string mode_reason() const;
  [[nodiscard]] std::uint64_t files_fallback() const noexcept { return files_fallback_.load(); }
  [[nodiscard]] std::uint64_t pins_refused() const noexcept { return pins_refused_.load(); }
  [[nodiscard]] std::uint64_t registrations_skipped() const noexcept { return registrations_skipped_.load(); }
  /// Requests staged by the backend after cuFileRead/cuFileWrite failed (Auto), and their bytes.
  [[nodiscard]] std::uint64_t io_fallbacks() const noexcept { return io_fallbacks_.load(); }
  [[nodiscard]] std::uint64_t io_fallback_bytes() const noexcept { return io_fallback_bytes_.load(); }
  [[nodiscard]] std::uint64_t backend_staged_bytes() const noexcept override { return io_fallback_bytes(); }
  /// Whether a cuFile error at I/O time is answered by staging (Auto) rather than failing.
  [[nodiscard]] bool stages_failed_io() const noexcept { return mode_setting_ == GdsMode::Auto; }
  /// Records why the backend staged requests (once per distinct reason; the mode becomes compat).
  void note_io_fallback(const std::string& why);
  void count_io_fallback(std::uint64_t nbytes) noexcept {
    io_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    io_fallback_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  }
  [[nodiscard]] const CudaApi* cuda() const noexcept { return cuda_; }

  /// Makes the primary context of `ordinal` (retained once per route) current on the calling
  /// thread and leaves it there: for the route's own worker threads only.
  Status make_current(int ordinal);
  /// Pushes the primary context of `ordinal` on the calling thread until *guard ends: for every
  /// driver call made on a caller's thread, whose own context is then restored.
  Status enter(int ordinal, ScopedContext* guard);
  /// Ends an operation's use of a pinned buffer found by bind() (its in-flight mark).
  void release(BufferRegistry* registry, std::uintptr_t key) noexcept;
  /// Deregisters a cuFile handle made by register_file() (null: nothing), under a context.
  void deregister(CUfileHandle_t fh, int ordinal) noexcept;

 private:
  BufferRegistry& registry() noexcept;
  /// Registers what.fd with cuFile (or finds its file system refused, Auto): *out has the
  /// handle, or none and the reason the file is staged. A failed Status is an error.
  Status register_file(const DeviceBinding& what, std::shared_ptr<const GdsRegistration>* out);
  Status context(int ordinal, CUcontext* out);
  void note_fallback(const std::string& why);
  void note_pin_refused(const std::string& why);

  GdsMode mode_setting_;
  const CudaApi* cuda_;
  CuFileApi* cufile_ = nullptr;  // null when cuFile is not used at all
  DriverRef driver_;

  mutable std::mutex mode_mutex_;
  bool gds_ = false;         // guarded by mode_mutex_
  std::string mode_reason_;  // guarded by mode_mutex_

  std::mutex contexts_mutex_;
  std::map<int, CUcontext> contexts_;  // retained primary contexts, guarded by contexts_mutex_

  std::mutex refused_mutex_;
  // File systems (st_dev) whose files cuFile refused in Auto, with the reason: never asked
  // again. Guarded by refused_mutex_.
  std::map<dev_t, std::string> refused_fs_;

  std::atomic<std::uint64_t> files_fallback_{0};
  std::atomic<std::uint64_t> registrations_skipped_{0};
  std::atomic<std::uint64_t> io_fallbacks_{0};
  std::atomic<std::uint64_t> io_fallback_bytes_{0};
  std::atomic<std::uint64_t> pins_refused_{0};
};

}  // namespace deepio::detail::gpu
