// `_deepio.Handle` and `_deepio.Op`: a deepio::Handle that keeps every caller's buffer alive
// until the operation on it is complete and collected.
//
// Protocol.
//  * Every submitted operation becomes a Record: the engine Future, the imported Buffer (a
//    reference to the caller's object) and who collects it:
//      - Owner::Wait   an async_pread/async_pwrite: collected by the next wait() (or sync call);
//      - Owner::Sync   a synchronous call's own operation: collected by that call only;
//      - Owner::Future an Op returned to Python (deepio.File): collected by Op.result().
//    Wait and Sync records sit in pending_ until collected; Future records sit in
//    detached_ until they are done (so that dropping the Op early never frees a buffer the
//    engine is still using).
//  * Collection calls Future::get() (the engine then forgets the operation), stores the
//    outcome in the Record and drops the Buffer reference (the caller's memory is released).
//  * Waiting releases the GIL in slices of kSlice and runs PyErr_CheckSignals between slices.
//    A KeyboardInterrupt (or any exception from a signal handler) leaves every interrupted
//    operation pending: still running, buffer still referenced, and collected (with its
//    count and error) by a later wait(). Buffers are therefore never freed under a running
//    operation; a sync call that is interrupted hands its operation over to wait().
//  * Destroying the Handle (or close()) first lets the engine finish every operation, with
//    the GIL released, and only then drops the buffer references.
// Thread safety: pending_, detached_ and every Record field other than the engine Future are
// read and written only with the GIL held (see common.hpp); the engine Handle is used through
// a shared_ptr copied under the GIL, so close() from one thread never pulls it away from a
// submission running in another.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"

namespace deepio::py {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSlice = std::chrono::milliseconds(50);

enum class Owner { Wait, Sync, Future };

struct Record {
  Future fut;
  Buffer buf;
  Owner owner = Owner::Wait;
  bool write = false;
  std::uint64_t offset = 0;
  std::size_t nbytes = 0;
  bool collected = false;
  std::size_t result = 0;         // bytes, once collected without error
  std::optional<Error> error;     // the failure, once collected
};
using RecordPtr = std::shared_ptr<Record>;

// Collects a finished record (GIL held): takes the engine result and releases the buffer.
void collect(Record& r) {
  if (r.collected) return;
  r.collected = true;
  try {
    r.result = r.fut.get();
  } catch (const Error& e) {
    r.error = e;
  }
  r.buf = Buffer{};
}

// Blocks until every record is done or `deadline` passes; returns whether all are done.
// The GIL is released while blocking and signals are checked between slices; an exception
// raised by a signal handler propagates as nb::python_error with every record untouched.
bool wait_records(const std::vector<RecordPtr>& recs, std::optional<Clock::time_point> deadline) {
  std::size_t i = 0;
  for (;;) {
    bool timed_out = false;
    {
      nb::gil_scoped_release release;
      auto slice_end = Clock::now() + kSlice;
      if (deadline && *deadline < slice_end) slice_end = *deadline;
      while (i < recs.size()) {
        const auto now = Clock::now();
        if (now >= slice_end) break;
        if (!recs[i]->fut.wait_for(slice_end - now)) break;
        ++i;
      }
      if (i < recs.size() && deadline && Clock::now() >= *deadline) timed_out = true;
    }
    // A last non-blocking sweep: the slice may have ended just as the rest completed.
    while (i < recs.size() && recs[i]->fut.done()) ++i;
    if (i == recs.size()) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (timed_out) return false;
  }
}

std::optional<Clock::time_point> deadline_after(std::optional<double> timeout) {
  if (!timeout) return std::nullopt;
  if (*timeout < 0) throw nb::value_error("timeout must be non-negative");
  const double capped = std::min(*timeout, 1e9);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(capped));
}

// Raises the first failure among collected records (submission order), noting the others.
void raise_first_failure(const std::vector<RecordPtr>& recs) {
  const Error* first = nullptr;
  std::size_t failed = 0;
  nb::list others;
  for (const auto& r : recs) {
    if (!r->error) continue;
    ++failed;
    if (first == nullptr) {
      first = &*r->error;
    } else {
      others.append(make_exception(*r->error));
    }
  }
  if (first == nullptr) return;
  nb::object exc = make_exception(*first);
  exc.attr("other_errors") = others;
  if (failed > 1 && nb::hasattr(exc, "add_note")) {
    exc.attr("add_note")(std::to_string(failed - 1) + " more of the " + std::to_string(recs.size()) +
                         " operations collected by this wait failed (see .other_errors)");
  }
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

BackendKind backend_from(const std::string& name) {
  if (auto k = parse_backend(name)) return *k;
  throw nb::value_error(("unknown backend '" + name + "' (expected auto, io_uring, libaio or threads)").c_str());
}

DirectIo direct_from(const std::string& name) {
  if (auto d = parse_direct_io(name)) return *d;
  throw nb::value_error(("unknown direct_io '" + name + "' (expected auto, on or off)").c_str());
}

std::size_t positive(std::int64_t v, const char* name) {
  if (v <= 0) throw nb::value_error((std::string(name) + " must be a positive integer, got " + std::to_string(v)).c_str());
  return static_cast<std::size_t>(v);
}

}  // namespace

class Op;

class PyHandle {
 public:
  PyHandle(std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
           std::int64_t intra_op_parallelism, const std::string& backend, const std::string& direct_io) {
    HandleOptions o;
    o.block_size = positive(block_size, "block_size");
    o.queue_depth = positive(queue_depth, "queue_depth");
    o.single_submit = single_submit;
    o.overlap_events = overlap_events;
    o.intra_op_parallelism = positive(intra_op_parallelism, "intra_op_parallelism");
    if (o.queue_depth > 65536) throw nb::value_error("queue_depth must be at most 65536");
    if (o.intra_op_parallelism > 1024) throw nb::value_error("intra_op_parallelism must be at most 1024");
    o.backend = backend_from(backend);
    o.direct_io = direct_from(direct_io);
    nb::gil_scoped_release release;  // worker start-up and backend probing may block
    handle_ = std::make_shared<Handle>(o);
  }

  ~PyHandle() {
    std::shared_ptr<Handle> h = std::move(handle_);
    if (h) {
      // The engine finishes every operation still in flight before it goes away.
      if (!interpreter_finalizing()) {
        nb::gil_scoped_release release;
        h.reset();
      } else {
        h.reset();
      }
    }
    std::size_t lost = 0;
    std::string first;
    for (auto& r : pending_) {
      collect(*r);
      if (r->error && r->owner == Owner::Wait) {
        if (lost++ == 0) first = r->error->what();
      }
    }
    for (auto& r : detached_) collect(*r);  // errors stay with their Op
    pending_.clear();
    detached_.clear();
    if (lost > 0 && !interpreter_finalizing()) {
      // Nothing is silent: failures nobody waited for become a warning.
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      const std::string msg = "deepio handle destroyed with " + std::to_string(lost) +
                              " failed operation(s) never collected by wait(); first: " + first;
      if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) != 0) PyErr_WriteUnraisable(nullptr);
      PyErr_Restore(type, value, tb);
    }
  }

  PyHandle(const PyHandle&) = delete;
  PyHandle& operator=(const PyHandle&) = delete;

  std::shared_ptr<Handle> engine() const {
    if (!handle_) throw nb::value_error("I/O operation on a closed handle");
    return handle_;
  }

  /// Imports the buffer, opens the file and queues the operation; raises on submission errors.
  RecordPtr submit(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, Owner owner) {
    if (file_offset < 0) {
      throw nb::value_error(("file_offset must be non-negative, got " + std::to_string(file_offset)).c_str());
    }
    auto h = engine();
    auto rec = std::make_shared<Record>();
    rec->buf = import_buffer(buffer, !write, "buffer", /*allow_device=*/true);
    rec->owner = owner;
    rec->write = write;
    rec->offset = static_cast<std::uint64_t>(file_offset);
    rec->nbytes = rec->buf.nbytes;
    Target t = parse_target(file);
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;  // open() and fstat() may block on slow storage
      try {
        void* p = rec->buf.data;
        const std::size_t n = rec->buf.nbytes;
        if (t.fd >= 0) {
          rec->fut = write ? h->async_pwrite(p, n, t.fd, rec->offset) : h->async_pread(p, n, t.fd, rec->offset);
        } else {
          rec->fut = write ? h->async_pwrite(p, n, t.path, rec->offset) : h->async_pread(p, n, t.path, rec->offset);
        }
      } catch (const Error& e) {
        // Open failures carry no request: name the one that was attempted.
        if (e.nbytes() == 0 && e.offset() == 0 && rec->nbytes != 0) {
          err.emplace(e.errnum(), e.message() + (write ? " for writing" : " for reading"), e.path(), rec->offset,
                      rec->nbytes);
        } else {
          err.emplace(e);
        }
      }
    }
    if (err) raise_error(*err);
    prune_detached();
    if (owner == Owner::Future) {
      detached_.push_back(rec);
    } else {
      pending_.push_back(rec);
    }
    return rec;
  }

  /// DeepNVMe's wait(): every operation queued for wait() before this call. Returns the count.
  std::size_t wait() {
    std::vector<RecordPtr> snapshot;
    for (auto& r : pending_) {
      if (r->owner == Owner::Wait) snapshot.push_back(r);
    }
    return finish(snapshot, nullptr);
  }

  /// A synchronous operation: submit, then wait for it and (drain=true, DeepNVMe's sync
  /// semantics) for every operation already queued for wait(). Returns the count collected.
  std::size_t sync(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset, bool drain) {
    RecordPtr own = submit(write, buffer, file, file_offset, Owner::Sync);
    std::vector<RecordPtr> snapshot;
    if (drain) {
      for (auto& r : pending_) {
        if (r->owner == Owner::Wait) snapshot.push_back(r);
      }
    }
    snapshot.push_back(own);
    return finish(snapshot, &own);
  }

  std::shared_ptr<Op> submit_future(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset);

  void close() {
    if (!handle_) return;
    // Everything still pending is collected first so that its failures are raised here.
    std::vector<RecordPtr> snapshot;
    for (auto& r : pending_) {
      if (r->owner == Owner::Wait) snapshot.push_back(r);
    }
    std::optional<nb::python_error> failure;
    try {
      finish(snapshot, nullptr);
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_KeyboardInterrupt)) throw;
      failure.emplace(std::move(e));
    }
    std::shared_ptr<Handle> h = std::move(handle_);
    {
      nb::gil_scoped_release release;
      h.reset();
    }
    for (auto& r : detached_) collect(*r);
    detached_.clear();
    pending_.clear();
    if (failure) {
      failure->restore();
      throw nb::python_error();
    }
  }

  bool closed() const { return !handle_; }

  std::size_t pending() const {
    std::size_t n = 0;
    for (const auto& r : pending_) n += r->owner == Owner::Wait && !r->collected;
    return n;
  }

  const HandleOptions& options() const { return engine()->options(); }

  nb::dict stats() const {
    const HandleStats s = engine()->stats();
    nb::dict d;
    d["ops_completed"] = s.ops_completed;
    d["ops_failed"] = s.ops_failed;
    d["bytes_direct"] = s.bytes_direct;
    d["bytes_bounced"] = s.bytes_bounced;
    d["bytes_buffered"] = s.bytes_buffered;
    d["bytes_fixed"] = s.bytes_fixed;
    d["direct_refused"] = s.direct_refused;
    d["short_transfers"] = s.short_transfers;
    d["retries"] = s.retries;
    return d;
  }

 private:
  // Waits for `snapshot` (the GIL released, signals honoured), collects every record that
  // no other thread collected meanwhile, and raises the first failure after all finished.
  std::size_t finish(std::vector<RecordPtr>& snapshot, const RecordPtr* own) {
    try {
      wait_records(snapshot, std::nullopt);
    } catch (nb::python_error&) {
      // Interrupted: a sync call's own operation is handed over to wait().
      if (own != nullptr) (*own)->owner = Owner::Wait;
      throw;
    }
    std::vector<RecordPtr> mine;
    for (auto& r : snapshot) {
      if (r->collected) continue;  // another thread's wait() got it first
      collect(*r);
      mine.push_back(r);
    }
    std::erase_if(pending_, [](const RecordPtr& r) { return r->collected; });
    raise_first_failure(mine);
    return mine.size();
  }

  // Drops Future records that are done: nothing uses their buffers any more.
  // A record whose Op was already dropped is collected here, so that the engine forgets it.
  void prune_detached() {
    std::erase_if(detached_, [](const RecordPtr& r) {
      if (!r->collected && !r->fut.done()) return false;
      if (!r->collected && r.use_count() == 1) collect(*r);
      return true;
    });
  }

  std::shared_ptr<Handle> handle_;
  std::vector<RecordPtr> pending_;   // Wait and Sync records, in submission order (GIL)
  std::vector<RecordPtr> detached_;  // Future records not yet known to be done (GIL)
};

/// The result of one operation submitted through deepio.File (wrapped by deepio.Future).
class Op {
 public:
  explicit Op(RecordPtr rec) : rec_(std::move(rec)) {}
  ~Op() {
    // Collect so that the engine forgets the operation; its buffer is released when the
    // operation is done (the handle holds the record until then).
    if (rec_ && rec_->fut.done()) collect(*rec_);
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  bool done() const { return rec_->collected || rec_->fut.done(); }

  bool wait(std::optional<double> timeout) {
    if (rec_->collected) return true;
    return wait_records({rec_}, deadline_after(timeout));
  }

  /// Waits, then returns the bytes transferred or raises the operation's exception;
  /// TimeoutError when `timeout` passes first.
  std::size_t result(std::optional<double> timeout) {
    if (!ensure_collected(timeout)) {
      PyErr_SetString(PyExc_TimeoutError, "the operation did not finish in time");
      throw nb::python_error();
    }
    if (rec_->error) raise_error(*rec_->error);
    return rec_->result;
  }

  /// The failure as an exception object, or None (waits like result()).
  nb::object exception(std::optional<double> timeout) {
    if (!ensure_collected(timeout)) {
      PyErr_SetString(PyExc_TimeoutError, "the operation did not finish in time");
      throw nb::python_error();
    }
    return rec_->error ? make_exception(*rec_->error) : nb::none();
  }

  bool write() const { return rec_->write; }
  bool collected() const { return rec_->collected; }
  std::uint64_t offset() const { return rec_->offset; }
  std::size_t nbytes() const { return rec_->nbytes; }

 private:
  bool ensure_collected(std::optional<double> timeout) {
    if (rec_->collected) return true;
    if (!wait_records({rec_}, deadline_after(timeout))) return false;
    collect(*rec_);
    return true;
  }

  RecordPtr rec_;
};

std::shared_ptr<Op> PyHandle::submit_future(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset) {
  return std::make_shared<Op>(submit(write, buffer, file, file_offset, Owner::Future));
}

void init_handle(nb::module_& m) {
  nb::class_<Op>(m, "Op", "One operation submitted through deepio.File; wrapped by deepio.Future.")
      .def("done", &Op::done, "True once the operation finished (successfully or not). Never blocks.")
      .def("wait", &Op::wait, nb::arg("timeout").none() = nb::none(),
           "Blocks (GIL released) until done or `timeout` seconds passed; returns done().")
      .def("result", &Op::result, nb::arg("timeout").none() = nb::none(),
           "Waits, then returns the number of bytes transferred or raises the operation's OSError.")
      .def("exception", &Op::exception, nb::arg("timeout").none() = nb::none(),
           "Waits, then returns the operation's exception or None.")
      .def_prop_ro("collected", &Op::collected)
      .def_prop_ro("write", &Op::write)
      .def_prop_ro("offset", &Op::offset)
      .def_prop_ro("nbytes", &Op::nbytes);

  nb::class_<PyHandle>(m, "Handle",
                       "The engine handle behind deepio.aio_handle (keeps buffers alive until collected).")
      .def(nb::init<std::int64_t, std::int64_t, bool, bool, std::int64_t, const std::string&, const std::string&>(),
           nb::arg("block_size") = 1 << 20, nb::arg("queue_depth") = 128, nb::arg("single_submit") = false,
           nb::arg("overlap_events") = false, nb::arg("intra_op_parallelism") = 1, nb::arg("backend") = "auto",
           nb::arg("direct_io") = "auto")
      .def(
          "submit",
          [](PyHandle& h, bool write, nb::handle buffer, nb::handle file, std::int64_t offset) {
            h.submit(write, buffer, file, offset, Owner::Wait);
          },
          nb::arg("write"), nb::arg("buffer"), nb::arg("file"), nb::arg("file_offset") = 0,
          "Queues a read or write for wait(); raises on submission failures.")
      .def("sync", &PyHandle::sync, nb::arg("write"), nb::arg("buffer"), nb::arg("file"), nb::arg("file_offset") = 0,
           nb::arg("drain") = true,
           "Submits and waits (drain: also for everything queued for wait()); returns the count collected.")
      .def("submit_future", &PyHandle::submit_future, nb::arg("write"), nb::arg("buffer"), nb::arg("file"),
           nb::arg("file_offset") = 0)
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
      .def_prop_ro("direct_io", [](const PyHandle& h) { return std::string(to_string(h.options().direct_io)); });
}

}  // namespace deepio::py
