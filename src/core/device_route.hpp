// DeviceRoute: a way for device (GPU) memory to reach files without staging through host
// memory — GPUDirect Storage. The engine asks it per operation; everything else about the
// operation (planning, workers, futures, wait(), errors, descriptor back-pressure, the end of
// file rule) is the engine's, identical for every route and for staging.
//
// Protocol:
//  * make_backend() is called once per route worker when the engine starts; each backend is
//    used only by its worker thread (core/backend.hpp).
//  * bind() runs on the submitting thread for every operation on device memory, after the
//    engine opened the file and checked the range. It either sets *staged = false and gives
//    the registration the route's backend needs (*out), or sets *staged = true: "not through
//    me" (the engine then stages the operation through host memory, as it would without a
//    route; the route records why, for its mode report; *out may still hold something the
//    route wants kept until the operation completes), or fails: a failed Status is raised
//    to the submitter and nothing is queued.
//  * The engine keeps *out until the operation's last request completed and drops it before
//    the operation completes and its descriptors close.
//  * A file object's operations (deepio::File: one descriptor for many operations) carry the
//    file object's RouteFileSlot (DeviceBinding::slot; null for path operations, which keep
//    per-operation registration). The route may keep there what it made for the descriptor
//    on the file object's first device operation (GdsRoute: the cuFile handle registration,
//    or Auto's refusal) and reuse it for every later one. The slot's state ends with the file
//    object (SharedFile): after its last operation completed (every operation holds the file
//    object) and before its descriptors close.
// Thread safety: bind() may be called from several threads at once, also for one file object:
// the slot's mutex serializes them, so its state is made once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/backend.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

class DeviceRoute;

/// A file object's per-route state (see the protocol above). Filled by DeviceRoute::bind()
/// under `mutex`; destroyed with the file object, before its descriptors close.
struct RouteFileSlot {
  std::mutex mutex;
  const DeviceRoute* route = nullptr;  ///< whose `state` it is (guarded by mutex)
  std::shared_ptr<const void> state;   ///< the route's own type; null until its first bind()
};

struct DeviceBinding {
  int fd = -1;          ///< the descriptor the engine opened (O_DIRECT where accepted)
  bool direct = false;  ///< fd has O_DIRECT
  const void* buf = nullptr;
  std::size_t nbytes = 0;
  int device = -1;  ///< CUDA ordinal owning buf
  bool write = false;
  const std::string* path = nullptr;  ///< for messages
  std::uint64_t file_offset = 0;
  /// The file object's slot when the operation is on one (fd is then its descriptor, the
  /// same for each of its operations); null for a path or descriptor operation.
  RouteFileSlot* slot = nullptr;
};

class DeviceRoute {
 public:
  virtual ~DeviceRoute() = default;
  virtual std::unique_ptr<Backend> make_backend() = 0;
  /// Whether make_backend() is needed at all (false: every operation will be staged).
  [[nodiscard]] virtual bool has_backend() const noexcept = 0;
  virtual Status bind(const DeviceBinding& what, bool* staged, std::shared_ptr<const DriverFile>* out) = 0;
  /// Of the bytes the route's backend moved, those it staged through host memory itself (a
  /// cuFile failure answered by staging): the engine's stats count them as staged.
  [[nodiscard]] virtual std::uint64_t backend_staged_bytes() const noexcept { return 0; }
};

}  // namespace deepio::detail
