// `_deepio.Handle`: a deepio::Handle for Python (see handle.cpp for the protocol), and the
// base of `_deepio.GdsHandle` (gds.cpp), which is the same engine with the GDS route.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "engine/binding.hpp"
#include "file.hpp"

namespace deepio::py {

class Op;

class PyHandle {
 public:
  PyHandle(std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
           std::int64_t intra_op_parallelism, const std::string& backend, const std::string& direct_io,
           const std::string& device_route);
  virtual ~PyHandle();
  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  /// The engine; ValueError once closed.
  std::shared_ptr<Handle> engine() const;
  /// Queues a read or write for wait().
  /// fsync (writes): the operation completes once its data is durable (OpOptions::fsync).
  void submit(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool fsync = false);
  /// DeepNVMe's wait(): every operation queued for wait() before this call. Returns the count.
  std::size_t wait();
  /// A synchronous operation: submit, then wait for it alone and raise only its failure.
  /// Operations already queued for wait() stay queued (count and failures). Returns 1.
  std::size_t sync(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool fsync = false);
  /// `file`: a path, a descriptor or a _deepio.File (then nothing is opened).
  std::shared_ptr<Op> submit_future(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset);
  /// submit_future's submission without the Op: the detached operation's Future, and in
  /// *nbytes its size (for _deepio.File, which makes the Op in place).
  Future submit_detached(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, std::size_t* nbytes);
  /// Opens a file object (detail::open_file) with the GIL released.
  std::shared_ptr<PyFile> open_file(nb::handle path, int flags, const std::string& direct_io) const;
  /// Many reads or writes in one call (Handle::submit_batch): buffers imported with the GIL,
  /// one GIL release for the submission. `files`: one path/descriptor for all, or one per
  /// buffer; `offsets`: None (all 0) or one per buffer. futures: returns a list of Op (each
  /// collected by its own result()); otherwise the ops are queued for wait() and the count
  /// is returned.
  nb::object submit_batch(bool write, nb::handle buffers, nb::handle files, nb::handle offsets, bool futures,
                          bool fsync = false);
  /// One operation over many ranges of one file (Handle::async_pread_ranges): `file_offsets`,
  /// `sizes` (or one int for all) and `buffer_offsets` (None: packed one after another) are
  /// sequences of integers or 1-D integer arrays (buffer protocol). Queued for wait(), returning
  /// the number of bytes it moves; with future=True, detached and returned as an Op (collected
  /// by its own result(), as submit_future's).
  nb::object submit_ranges(bool write, nb::handle buffer, nb::handle file, nb::handle file_offsets, nb::handle sizes,
                           nb::handle buffer_offsets, bool fsync = false, bool future = false);
  void close();
  bool closed() const { return !handle_; }
  std::size_t pending() const { return engine()->pending(); }
  const HandleOptions& options() const { return engine()->options(); }
  nb::dict stats() const;

 protected:
  /// A handle over an engine made by a subclass (GdsHandle). Call with the GIL released
  /// if making the engine may block.
  explicit PyHandle(std::shared_ptr<Handle> handle) noexcept : handle_(std::move(handle)) {}

 private:
  static void shutdown(std::shared_ptr<Handle> h);

  std::shared_ptr<Handle> handle_;
};

/// Option parsers shared by the handle constructors (InvalidArgument on a bad name).
BackendKind backend_from(const std::string& name);
DirectIo direct_from(const std::string& name);
DeviceRouteMode route_from(const std::string& name);
/// A Python integer passed through to the engine's checks: a negative one arrives as a huge
/// size_t, which the engine reports as the negative number it was.
inline std::size_t count_arg(std::int64_t v) { return static_cast<std::size_t>(v); }

/// A Python integer as int64; one beyond int64 is refused naming it `what` (ints.cpp).
std::int64_t int_item(PyObject* o, const std::string& what);
/// A 1-D integer array (buffer protocol) or a sequence of Python integers, as 64-bit values
/// (negative ones as Python wrote them). TypeError for anything else, bools included;
/// InvalidArgument for an array that is not 1-D or an item beyond int64 (ints.cpp).
std::vector<std::int64_t> int_values(nb::handle obj, const char* name);

}  // namespace deepio::py
