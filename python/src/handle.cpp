// `_deepio.Handle` and `_deepio.Op`: a deepio::Handle for Python (Handle.submit_batch is in
// handle_batch.cpp).
//
// The engine keeps the ledger; this file adds buffer import, GIL release and signal polling,
// through the binding's protocol with the engine (src/engine/binding.hpp, not public API).
//  * Every submission imports the caller's buffer into a Buffer (a reference to the caller's
//    object) and hands it to the engine as the operation's keep-alive. The engine holds it
//    until the operation is collected and then gives it back to the collecting call
//    (Collected::keep_alive, or Future::get()), which drops it with the GIL held. Until then
//    the caller's memory stays referenced, so no I/O ever runs into freed memory. The
//    submitting call keeps its own reference across the GIL-released submission, so a
//    submission that throws never drops the last one without the GIL.
//  * async_* operations are ordinary engine operations, collected by wait(). A synchronous
//    call's own operation and deepio.File's operations are detached: wait() in another
//    thread never takes them. The synchronous call collects its own and nothing else
//    (BindingCollect::with, through 0): what was queued before stays for wait(), failures
//    included; an Op (deepio.Future) collects its own with Future::get(), or when it is
//    destroyed after the operation is done.
//  * Waiting releases the GIL in slices of kSlice (detail::collect with a deadline, which
//    collects nothing unless everything it covers is done) and runs PyErr_CheckSignals
//    between slices. A KeyboardInterrupt (or any exception from a signal handler) leaves
//    every interrupted operation pending: still running, buffer still referenced, and
//    collected (with its count and error) by a later wait(). An interrupted synchronous
//    call hands its operation over to wait() (detail::give_to_wait).
//  * The "first failure" rule is the engine's: Collected::errors in submission order; the
//    first is raised, the others are attached as `other_errors` (and a note).
//  * Destroying the Handle (or close()) waits, with the GIL released, for every operation,
//    takes back every keep-alive, drops them with the GIL, and only then destroys the engine.
//    Failures of async operations nobody waited for become a RuntimeWarning. A handle whose
//    last reference goes in a done callback of one of its own operations (on its worker:
//    t_in_op_callback) is shut down so on a thread of its own, never by the worker itself.
// Thread safety: the engine Handle is used through a shared_ptr copied under the GIL, so
// close() from one thread never pulls it away from a call running in another; every
// Collected and Buffer is created and destroyed with the GIL held (see common.hpp).
#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/binding.hpp"
#include "handle.hpp"
#include "op.hpp"

namespace deepio::py {

namespace {

using detail::BindingCollect;
using detail::BindingOp;
using detail::Collected;
using Clock = std::chrono::steady_clock;
constexpr auto kSlice = std::chrono::milliseconds(50);

// Collects what `options` selects, waiting in slices with the GIL released and checking for
// signals between them. An exception raised by a signal handler propagates as
// nb::python_error with nothing collected; `own` (a synchronous call's operation) is then
// handed over to wait(). The result holds Python references: keep it with the GIL.
Collected collect_interruptibly(Handle& h, BindingCollect options, const Future* own) {
  for (;;) {
    Collected r;
    {
      nb::gil_scoped_release release;
      options.deadline = Clock::now() + kSlice;
      r = detail::collect(h, options);  // r was empty: nothing is released without the GIL
    }
    if (r.complete) return r;
    if (PyErr_CheckSignals() != 0) {
      if (own != nullptr) detail::give_to_wait(*own);
      throw nb::python_error();
    }
  }
}

// Releases the keep-alives (GIL held), then raises the first failure with the others in
// `other_errors` and a note; returns the count when nothing failed.
std::size_t finish(Collected& r) {
  r.keep_alive.clear();
  if (r.errors.empty()) return r.count;
  nb::object exc = make_exception(r.errors.front());
  nb::list others;
  for (std::size_t i = 1; i < r.errors.size(); ++i) others.append(make_exception(r.errors[i]));
  exc.attr("other_errors") = others;
  if (r.errors.size() > 1 && nb::hasattr(exc, "add_note")) {
    exc.attr("add_note")(std::to_string(r.errors.size() - 1) + " more of the " + std::to_string(r.count) +
                         " operations collected by this wait failed (see .other_errors)");
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

// The request an open failure is named with (an error that names none: the file could not be
// opened, so no request had started).
struct Request {
  std::uint64_t offset;
  std::size_t nbytes;
};

// Calls `submit` (returning a Future) with the GIL released (open() and fstat() may block on
// slow storage) and raises the deepio::Error it throws once the GIL is back. An open failure
// gets "for reading"/"for writing", and with `request` its offset and size; without `request`
// the wording is added only when `name_way`.
template <class Submit>
Future submit_released(bool write, std::optional<Request> request, Submit&& submit, bool name_way = false) {
  Future fut;
  std::optional<Error> err;
  {
    nb::gil_scoped_release release;
    try {
      fut = submit();
    } catch (const Error& e) {
      const bool open_failure = !e.invalid_argument() && !e.forked_handle() && e.nbytes() == 0 && e.offset() == 0;
      if (open_failure && request) {
        err.emplace(e.errnum(), e.message() + (write ? " for writing" : " for reading"), e.path(), request->offset,
                    request->nbytes);
      } else if (open_failure && name_way) {
        err.emplace(e.errnum(), e.message() + (write ? " for writing" : " for reading"), e.path());
      } else {
        err.emplace(e);
      }
    }
  }
  if (err) raise_error(*err);
  return fut;
}

// Imports the buffer, opens the file and queues the operation with the buffer as its
// keep-alive; raises on submission errors (bad arguments, open failures, end of file).
// *nbytes (if given) gets the request's size.
Future submit_op(Handle& h, bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool detached,
                 std::size_t* nbytes = nullptr, bool fsync = false) {
  auto buf = std::make_shared<Buffer>(import_buffer(buffer, !write, "buffer", /*allow_device=*/true));
  // A file object: nothing to open, so no failure to name "for reading"/"for writing".
  std::shared_ptr<detail::SharedFile> object;
  if (nb::isinstance<PyFile>(file)) object = nb::cast<const PyFile&>(file).get();
  const Target t = object ? Target{} : parse_target(file);
  order_after_producer(buffer, buf.get());
  // A negative offset arrives as a huge one, which the engine refuses naming the value.
  const auto offset = static_cast<std::uint64_t>(file_offset);
  OpOptions op;
  op.fsync = fsync;
  op.stream = buf->stream;
  BindingOp binding{.keep_alive = buf, .detached = detached};  // `buf` stays referenced here until the GIL is back
  void* p = buf->data;
  const std::size_t n = buf->nbytes;
  Future fut = submit_released(
      write, n != 0 && !object ? std::optional<Request>(Request{offset, n}) : std::nullopt, [&] {
        if (object) return detail::submit_file(h, write, p, n, object, offset, std::move(op), std::move(binding));
        return detail::submit(h, write, p, n, t.fd >= 0 ? nullptr : &t.path, t.fd, offset, std::move(op),
                              std::move(binding));
      });
  if (nbytes != nullptr) *nbytes = buf->nbytes;
  return fut;
}

void warn_uncollected(const Collected& r) {
  if (r.errors.empty() || interpreter_finalizing()) return;
  // Nothing is silent: failures nobody waited for become a warning.
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  const std::string msg = "deepio handle destroyed with " + std::to_string(r.errors.size()) +
                          " failed operation(s) never collected by wait(); first: " + r.errors.front().what();
  if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) != 0) PyErr_WriteUnraisable(nullptr);
  PyErr_Restore(type, value, tb);
}

}  // namespace

BackendKind backend_from(const std::string& name) {
  if (auto k = parse_backend(name)) return *k;
  throw InvalidArgument("unknown backend '" + name + "' (expected auto, io_uring, libaio or threads)");
}

DirectIo direct_from(const std::string& name) {
  if (auto d = parse_direct_io(name)) return *d;
  throw InvalidArgument("unknown direct_io '" + name + "' (expected auto, on or off)");
}

DeviceRouteMode route_from(const std::string& name) {
  if (auto r = parse_device_route(name)) return *r;
  throw InvalidArgument("unknown device_route '" + name + "' (expected auto, staged or gds)");
}

PyHandle::PyHandle(std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
                   std::int64_t intra_op_parallelism, const std::string& backend, const std::string& direct_io,
                   const std::string& device_route) {
  HandleOptions o;
  o.block_size = count_arg(block_size);
  o.queue_depth = count_arg(queue_depth);
  o.single_submit = single_submit;
  o.overlap_events = overlap_events;
  o.intra_op_parallelism = count_arg(intra_op_parallelism);
  o.backend = backend_from(backend);
  o.direct_io = direct_from(direct_io);
  o.device_route = route_from(device_route);
  nb::gil_scoped_release release;  // worker start-up and backend probing may block
  handle_ = std::make_shared<Handle>(o);
}

PyHandle::~PyHandle() { shutdown(std::move(handle_)); }

std::shared_ptr<Handle> PyHandle::engine() const {
  if (!handle_) throw nb::value_error("I/O operation on a closed handle");
  return handle_;
}

void PyHandle::submit(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool fsync) {
  auto h = engine();
  submit_op(*h, write, buffer, file, file_offset, /*detached=*/false, nullptr, fsync);
}

std::size_t PyHandle::wait() {
  auto h = engine();
  BindingCollect options;
  options.through = detail::mark(*h);
  Collected r = collect_interruptibly(*h, options, nullptr);
  flush_unobserved();
  return finish(r);
}

std::size_t PyHandle::sync(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool fsync) {
  auto h = engine();
  const Future own = submit_op(*h, write, buffer, file, file_offset, /*detached=*/true, nullptr, fsync);
  BindingCollect options;
  options.through = 0;  // nothing submitted before: its count and failures stay for wait()
  options.with = &own;
  Collected r = collect_interruptibly(*h, options, &own);
  flush_unobserved();
  return finish(r);
}

void PyHandle::close() {
  if (!handle_) return;
  std::shared_ptr<Handle> h = handle_;
  // Everything queued for wait() is collected first so that its failures are raised here;
  // a KeyboardInterrupt leaves the handle open and the operations pending.
  BindingCollect options;
  options.through = detail::mark(*h);
  Collected r = collect_interruptibly(*h, options, nullptr);
  if (handle_ == h) handle_.reset();  // (another thread's close() may have been first)
  shutdown(std::move(h));
  flush_unobserved();
  finish(r);
}

nb::dict PyHandle::stats() const {
  const HandleStats s = engine()->stats();
  nb::dict d;
  d["ops_completed"] = s.ops_completed;
  d["ops_failed"] = s.ops_failed;
  d["bytes_direct"] = s.bytes_direct;
  d["bytes_bounced"] = s.bytes_bounced;
  d["bytes_buffered"] = s.bytes_buffered;
  d["bytes_fixed"] = s.bytes_fixed;
  d["direct_refused"] = s.direct_refused;
  d["preallocated"] = s.preallocated;
  d["short_transfers"] = s.short_transfers;
  d["retries"] = s.retries;
  d["synced"] = s.synced;
  d["fixed_file_requests"] = s.fixed_file_requests;
  d["fixed_file_fallbacks"] = s.fixed_file_fallbacks;
  d["staging_allocations"] = s.staging_allocations;
  d["staging_reuses"] = s.staging_reuses;
  d["staging_lent_bytes"] = s.staging_lent_bytes;
  d["staging_kept_bytes"] = s.staging_kept_bytes;
  d["device_ops_completed"] = s.device_ops_completed;
  d["device_ops_failed"] = s.device_ops_failed;
  d["device_ops_cufile"] = s.device_ops_cufile;
  d["device_ops_staged"] = s.device_ops_staged;
  d["device_bytes_cufile"] = s.device_bytes_cufile;
  d["device_bytes_staged"] = s.device_bytes_staged;
  return d;
}

// Waits (GIL released) for every operation, takes back every keep-alive, drops them with
// the GIL, then destroys the engine with the GIL released. If another thread still holds
// the engine (a call racing with close()), that thread's last reference destroys it, with
// the GIL held, later.
void PyHandle::shutdown(std::shared_ptr<Handle> h) {
  if (!h) return;
  if (h.use_count() > 1) return;  // not the last holder: see above
  if (t_in_op_callback && !interpreter_finalizing()) {
    // A done callback on one of the engine's threads dropped the handle: that thread cannot
    // wait for itself to finish or join itself. The shutdown runs on a thread of its own.
    std::thread([h = std::move(h)]() mutable {
      nb::gil_scoped_acquire gil;
      try {
        shutdown(std::move(h));
      } catch (const std::exception& e) {  // nobody is left to raise it to
        warn_unobserved(std::string("deepio: shutting down a handle dropped in a done callback failed: ") + e.what());
      }
    }).detach();
    return;
  }
  BindingCollect everything;
  everything.detached = true;
  Collected r;
  try {
    if (interpreter_finalizing()) {  // the GIL must not be released any more
      r = detail::collect(*h, everything);
      r.keep_alive.clear();
      h.reset();
      return;
    }
    nb::gil_scoped_release release;
    r = detail::collect(*h, everything);
  } catch (const Error& e) {
    if (!e.forked_handle()) throw;
    // A forked child: the parent's operations never finish here. ~Handle leaks the engine,
    // and with it the references to the parent's buffers (this process's copies of them).
    h.reset();
    return;
  }
  r.keep_alive.clear();
  warn_uncollected(r);
  {
    nb::gil_scoped_release release;
    h.reset();  // holds no keep-alive any more: every operation was collected above
  }
  flush_unobserved();  // failures of dropped futures reported while the engine wound down
}

Future PyHandle::submit_detached(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset,
                                 std::size_t* nbytes) {
  auto h = engine();
  flush_unobserved();  // earlier dropped futures' failures: warned about before more work
  return submit_op(*h, write, buffer, file, file_offset, /*detached=*/true, nbytes);
}

std::shared_ptr<Op> PyHandle::submit_future(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset) {
  std::size_t nbytes = 0;
  Future fut = submit_detached(write, buffer, file, file_offset, &nbytes);
  // No reaping of abandoned operations here: a collect() scans every pending operation,
  // which per submission made many outstanding futures quadratic. deepio.File keeps each Op
  // until it is done (so ~Op collects it); an Op dropped while running is collected by the
  // next wait(), synchronous call or close() on this handle.
  return std::make_shared<Op>(std::move(fut), write, static_cast<std::uint64_t>(file_offset), nbytes);
}

nb::object PyHandle::submit_ranges(bool write, nb::handle buffer, nb::handle file, nb::handle file_offsets,
                                   nb::handle sizes, nb::handle buffer_offsets, bool fsync, bool future) {
  auto h = engine();
  auto buf = std::make_shared<Buffer>(import_buffer(buffer, !write, "buffer", /*allow_device=*/true));
  std::shared_ptr<detail::SharedFile> object;  // a file object: nothing to open
  if (nb::isinstance<PyFile>(file)) object = nb::cast<const PyFile&>(file).get();
  const Target t = object ? Target{} : parse_target(file);
  const std::vector<std::int64_t> offs = int_values(file_offsets, "file_offsets");
  const std::size_t n = offs.size();
  std::vector<IoRange> ranges(n);
  if (PyLong_Check(sizes.ptr()) && !PyBool_Check(sizes.ptr())) {
    const std::int64_t v = int_item(sizes.ptr(), "sizes");
    if (v < 0) throw InvalidArgument("sizes must be non-negative, got " + std::to_string(v));
    for (auto& r : ranges) r.nbytes = static_cast<std::size_t>(v);
  } else {
    const std::vector<std::int64_t> sz = int_values(sizes, "sizes");
    if (sz.size() != n) {
      throw InvalidArgument("sizes has " + std::to_string(sz.size()) + " items for " + std::to_string(n) +
                            " file_offsets");
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (sz[i] < 0) {
        throw InvalidArgument("sizes[" + std::to_string(i) + "] must be non-negative, got " + std::to_string(sz[i]));
      }
      ranges[i].nbytes = static_cast<std::size_t>(sz[i]);
    }
  }
  if (buffer_offsets.is_none()) {
    // Packed: each range right after the previous one. A total beyond the buffer is refused
    // by the engine, naming the first range that does not fit.
    std::size_t at = 0;
    for (auto& r : ranges) {
      r.buffer_offset = at;
      at = r.nbytes > std::numeric_limits<std::size_t>::max() - at ? std::numeric_limits<std::size_t>::max()
                                                                   : at + r.nbytes;
    }
  } else {
    const std::vector<std::int64_t> bo = int_values(buffer_offsets, "buffer_offsets");
    if (bo.size() != n) {
      throw InvalidArgument("buffer_offsets has " + std::to_string(bo.size()) + " items for " + std::to_string(n) +
                            " file_offsets");
    }
    // A negative one arrives as a huge one, which the engine refuses naming the value.
    for (std::size_t i = 0; i < n; ++i) ranges[i].buffer_offset = static_cast<std::size_t>(bo[i]);
  }
  // A negative file offset arrives as a huge one, which the engine refuses naming the value.
  for (std::size_t i = 0; i < n; ++i) ranges[i].file_offset = static_cast<std::uint64_t>(offs[i]);
  order_after_producer(buffer, buf.get());
  OpOptions op;
  op.fsync = fsync;
  op.stream = buf->stream;
  BindingOp binding{.keep_alive = buf, .detached = future};  // `buf` stays referenced here until the GIL is back
  void* p = buf->data;
  const std::size_t nb = buf->nbytes;
  Future fut = submit_released(
      write, std::nullopt,
      [&] {
        if (object)
          return detail::submit_file_ranges(*h, write, p, nb, object, ranges, std::move(op), std::move(binding));
        return detail::submit_ranges(*h, write, p, nb, t.fd >= 0 ? nullptr : &t.path, t.fd, ranges, std::move(op),
                                     std::move(binding));
      },
      /*name_way=*/!object);
  std::uint64_t total = 0;
  for (const auto& r : ranges) total += r.nbytes;
  if (!future) return nb::int_(total);
  return nb::cast(std::make_shared<Op>(std::move(fut), write, n > 0 ? ranges.front().file_offset : 0,
                                       static_cast<std::size_t>(total)));
}

std::shared_ptr<PyFile> PyHandle::open_file(nb::handle path, int flags, const std::string& direct_io) const {
  const Target t = parse_target(path);
  if (t.fd >= 0) throw nb::type_error("open_file takes a path, not a descriptor");
  const DirectIo mode = direct_from(direct_io);
  auto h = engine();
  std::shared_ptr<detail::SharedFile> f;
  std::optional<Error> err;
  {
    nb::gil_scoped_release release;  // an open may wait for this handle's ops to free descriptors
    try {
      f = detail::open_file(*h, t.path, flags, mode);
    } catch (const Error& e) {
      err.emplace(e);  // raised with the GIL back, naming the file as OSError.filename
    }
  }
  if (err) raise_error(*err);
  return std::make_shared<PyFile>(std::move(f));
}

void init_handle(nb::module_& m) {
  init_op(m);

  init_file(m);

  nb::class_<PyHandle>(m, "Handle", "The engine handle behind deepio.aio_handle (keeps buffers alive until collected).")
      .def(nb::init<std::int64_t, std::int64_t, bool, bool, std::int64_t, const std::string&, const std::string&,
                    const std::string&>(),
           nb::arg("block_size") = 1 << 20, nb::arg("queue_depth") = 128, nb::arg("single_submit") = false,
           nb::arg("overlap_events") = false, nb::arg("intra_op_parallelism") = 1, nb::arg("backend") = "auto",
           nb::arg("direct_io") = "auto", nb::arg("device_route") = "auto")
      .def("submit", &PyHandle::submit, nb::arg("write"), nb::arg("buffer"), nb::arg("file"),
           nb::arg("file_offset") = 0, nb::arg("fsync") = false,
           "Queues a read or write for wait(); raises on submission failures. fsync (writes): the operation "
           "completes once fdatasync made it durable.")
      .def("sync", &PyHandle::sync, nb::arg("write"), nb::arg("buffer"), nb::arg("file"), nb::arg("file_offset") = 0,
           nb::arg("fsync") = false,
           "Submits and waits for this operation alone (raising only its failure); returns 1. What was "
           "queued for wait() before stays queued. fsync as for submit().")
      .def("submit_future", &PyHandle::submit_future, nb::arg("write"), nb::arg("buffer"), nb::arg("file"),
           nb::arg("file_offset") = 0)
      .def("submit_batch", &PyHandle::submit_batch, nb::arg("write"), nb::arg("buffers"), nb::arg("files"),
           nb::arg("offsets").none() = nb::none(), nb::arg("futures") = false, nb::arg("fsync") = false,
           "Submits many reads or writes in one call; files are opened off the calling thread. "
           "Returns the count (queued for wait()) or, with futures=True, a list of Op. "
           "fsync (writes): each completes once fdatasync made it durable.")
      .def("submit_ranges", &PyHandle::submit_ranges, nb::arg("write"), nb::arg("buffer"), nb::arg("file"),
           nb::arg("file_offsets"), nb::arg("sizes"), nb::arg("buffer_offsets").none() = nb::none(),
           nb::arg("fsync") = false, nb::arg("future") = false,
           "Queues one operation over many ranges of one file for wait(); returns the bytes it moves "
           "(future=True: an Op of its own instead). buffer_offsets None: the ranges packed one after "
           "another in the buffer.")
      .def("open_file", &PyHandle::open_file, nb::arg("path"), nb::arg("flags"), nb::arg("direct_io") = "auto",
           "Opens path once with the os.open flags the way the engine opens its own files (O_DIRECT unless "
           "direct_io='off' or the file system refuses it; 'on' makes that an error); returns a File for "
           "submit_future and submit_ranges, usable through any handle.")
      .def("wait", &PyHandle::wait, "Waits for every queued operation; returns how many were collected.")
      .def("close", &PyHandle::close)
      .def_prop_ro("closed", &PyHandle::closed)
      .def("pending", &PyHandle::pending)
      .def("stats", &PyHandle::stats)
      .def_prop_ro("block_size", [](const PyHandle& h) { return h.options().block_size; })
      .def_prop_ro("queue_depth", [](const PyHandle& h) { return h.options().queue_depth; })
      .def_prop_ro("single_submit", [](const PyHandle& h) { return h.options().single_submit; })
      .def_prop_ro("overlap_events", [](const PyHandle& h) { return h.options().overlap_events; })
      .def_prop_ro("intra_op_parallelism", [](const PyHandle& h) { return h.options().intra_op_parallelism; })
      .def_prop_ro("backend", [](const PyHandle& h) { return std::string(to_string(h.engine()->backend())); })
      .def_prop_ro("device_route", [](const PyHandle& h) { return std::string(to_string(h.options().device_route)); })
      .def_prop_ro("direct_io", [](const PyHandle& h) { return std::string(to_string(h.options().direct_io)); });
}

}  // namespace deepio::py
