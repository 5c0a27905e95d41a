// `_deepio.GdsHandle`: deepio::GdsHandle (GPUDirect Storage, or its staged compatibility
// path) for CUDA device buffers; the engine behind deepio.gds_handle, whose Python layer
// sends host buffers (and descriptors) to an ordinary deepio::Handle instead.
//
// Protocol.
//  * A submission imports the buffer (CUDA memory only, confirmed by the CUDA driver deepio
//    loaded), queues it on the engine with the GIL released (open, fstat and
//    cuFileHandleRegister may block), and only then, with the GIL, appends the buffer
//    reference with the next sequence number to held_.
//  * wait() notes the last sequence number, waits with the GIL released (GdsHandle::wait
//    covers every operation submitted before it was called, so every record up to that
//    number), then drops those references and raises the first failure (an OSError
//    subclass with errno, path, offset and size). Because a record is appended only after its
//    engine submission returned, a wait() in another thread can never drop a buffer whose
//    operation it does not cover.
//  * Destroying the handle (or close()) lets the engine finish every operation (GIL released)
//    before the references are dropped.
// Ctrl-C: GdsHandle::wait() cannot be interrupted; a KeyboardInterrupt is raised when it
// returns. Thread safety: held_ and seq_ are touched only with the GIL held (common.hpp).
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <nanobind/stl/pair.h>

#include "common.hpp"
#include "deepio/gpu.hpp"

namespace deepio::py {

namespace {

GdsMode mode_from(const std::string& name) {
  if (name == "auto") return GdsMode::Auto;
  if (name == "cufile") return GdsMode::CuFile;
  if (name == "compat") return GdsMode::Compat;
  throw nb::value_error(("unknown mode '" + name + "' (expected auto, cufile or compat)").c_str());
}

std::size_t positive(std::int64_t v, const char* name) {
  if (v <= 0) throw nb::value_error((std::string(name) + " must be a positive integer, got " + std::to_string(v)).c_str());
  return static_cast<std::size_t>(v);
}

Buffer device_buffer(nb::handle obj, bool writable, const char* role) {
  Buffer b = import_buffer(obj, writable, role, /*allow_device=*/true);
  if (b.device < 0) {
    throw nb::type_error((std::string(role) + " is host memory; GDS operations take CUDA device memory").c_str());
  }
  return b;
}

}  // namespace

class PyGds {
 public:
  PyGds(std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
        std::int64_t intra_op_parallelism, const std::string& mode) {
    GdsOptions o;
    o.block_size = positive(block_size, "block_size");
    o.queue_depth = positive(queue_depth, "queue_depth");
    o.single_submit = single_submit;
    o.overlap_events = overlap_events;
    o.intra_op_parallelism = positive(intra_op_parallelism, "intra_op_parallelism");
    if (o.intra_op_parallelism > 1024) throw nb::value_error("intra_op_parallelism must be at most 1024");
    o.mode = mode_from(mode);
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;  // loads CUDA/cuFile, opens the cuFile driver
      try {
        handle_ = std::make_shared<GdsHandle>(o);
      } catch (const Error& e) {
        err.emplace(e);
      }
    }
    if (err) raise_error(*err);
  }

  ~PyGds() {
    std::shared_ptr<GdsHandle> h = std::move(handle_);
    if (h) {
      if (!interpreter_finalizing()) {
        nb::gil_scoped_release release;
        h.reset();  // finishes every operation in flight
      } else {
        h.reset();
      }
    }
    held_.clear();
  }

  PyGds(const PyGds&) = delete;
  PyGds& operator=(const PyGds&) = delete;

  std::shared_ptr<GdsHandle> engine() const {
    if (!handle_) throw nb::value_error("I/O operation on a closed handle");
    return handle_;
  }

  void submit(bool write, nb::handle buffer, nb::handle file, std::int64_t file_offset) {
    if (file_offset < 0) {
      throw nb::value_error(("file_offset must be non-negative, got " + std::to_string(file_offset)).c_str());
    }
    auto h = engine();
    Buffer buf = device_buffer(buffer, !write, "buffer");
    Target t = parse_target(file);
    if (t.fd >= 0) throw nb::type_error("GDS operations take a file name, not a descriptor");
    const auto offset = static_cast<std::uint64_t>(file_offset);
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;
      try {
        if (write) {
          h->async_pwrite(buf.data, buf.nbytes, t.path, offset);
        } else {
          h->async_pread(buf.data, buf.nbytes, t.path, offset);
        }
      } catch (const Error& e) {
        err.emplace(e);
      }
    }
    if (err) raise_error(*err);
    held_.emplace_back(++seq_, std::move(buf));
  }

  std::size_t wait() {
    auto h = engine();
    const std::uint64_t upto = seq_;
    std::size_t n = 0;
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;
      try {
        n = h->wait();
      } catch (const Error& e) {
        err.emplace(e);
      }
    }
    std::erase_if(held_, [upto](const auto& r) { return r.first <= upto; });
    if (err) raise_error(*err);
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    return n;
  }

  /// Pins (cuFileBufRegister) the tensor's memory; returns its address.
  std::uintptr_t pin(nb::handle tensor) {
    auto h = engine();
    Buffer buf = device_buffer(tensor, false, "tensor");
    if (buf.nbytes == 0) throw nb::value_error("cannot pin an empty tensor");
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;
      try {
        h->pin_device_buffer(buf.data, buf.nbytes);
      } catch (const Error& e) {
        err.emplace(e);
      }
    }
    if (err) raise_error(*err);
    return reinterpret_cast<std::uintptr_t>(buf.data);
  }

  /// Unpins a buffer pinned at exactly the tensor's address: (was it pinned, address).
  std::pair<bool, std::uintptr_t> unpin(nb::handle tensor) {
    auto h = engine();
    Buffer buf = device_buffer(tensor, false, "tensor");
    bool ok = false;
    std::optional<Error> err;
    {
      nb::gil_scoped_release release;
      try {
        ok = h->unpin_device_buffer(buf.data);
      } catch (const Error& e) {
        err.emplace(e);
      }
    }
    if (err) raise_error(*err);
    return {ok, reinterpret_cast<std::uintptr_t>(buf.data)};
  }

  void close() {
    if (!handle_) return;
    std::optional<nb::python_error> failure;
    try {
      wait();
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_KeyboardInterrupt)) throw;
      failure.emplace(std::move(e));
    }
    std::shared_ptr<GdsHandle> h = std::move(handle_);
    {
      nb::gil_scoped_release release;
      h.reset();
    }
    held_.clear();
    if (failure) {
      failure->restore();
      throw nb::python_error();
    }
  }

  bool closed() const { return !handle_; }
  std::size_t pending() const { return engine()->pending(); }
  std::string mode() const { return engine()->mode(); }
  std::string mode_reason() const { return engine()->mode_reason(); }
  const GdsOptions& options() const { return engine()->options(); }

  nb::dict stats() const {
    const GdsStats s = engine()->stats();
    nb::dict d;
    d["ops_completed"] = s.ops_completed;
    d["ops_failed"] = s.ops_failed;
    d["chunks"] = s.chunks;
    d["bytes_cufile"] = s.bytes_cufile;
    d["bytes_staged"] = s.bytes_staged;
    d["files_fallback"] = s.files_fallback;
    return d;
  }

 private:
  std::shared_ptr<GdsHandle> handle_;
  std::uint64_t seq_ = 0;                                // GIL
  std::vector<std::pair<std::uint64_t, Buffer>> held_;  // GIL: buffers of uncollected operations
};

namespace {

nb::dict gpu_info_dict() {
  GpuInfo g;
  {
    nb::gil_scoped_release release;  // loads the libraries the first time
    g = gpu_info();
  }
  nb::dict d;
  d["cuda_found"] = g.cuda_found;
  d["cuda_reason"] = g.cuda_reason;
  d["cuda_library"] = g.cuda_library;
  d["driver_version"] = g.driver_version;
  d["device_count"] = g.device_count;
  d["cufile_found"] = g.cufile_found;
  d["cufile_reason"] = g.cufile_reason;
  d["cufile_library"] = g.cufile_library;
  d["nvidia_fs_loaded"] = g.nvidia_fs_loaded;
  d["gds_usable"] = g.gds_usable;
  d["gds_mode"] = g.gds_mode;
  d["gds_reason"] = g.gds_reason;
  return d;
}

}  // namespace

void init_gds(nb::module_& m) {
  m.def("gpu_info", &gpu_info_dict,
        "What CUDA and cuFile this process can use (deepio::gpu_info()); never raises.");
  nb::class_<PyGds>(m, "GdsHandle", "deepio::GdsHandle for CUDA buffers (behind deepio.gds_handle).")
      .def(nb::init<std::int64_t, std::int64_t, bool, bool, std::int64_t, const std::string&>(),
           nb::arg("block_size") = 1 << 20, nb::arg("queue_depth") = 128, nb::arg("single_submit") = false,
           nb::arg("overlap_events") = false, nb::arg("intra_op_parallelism") = 1, nb::arg("mode") = "auto")
      .def("submit", &PyGds::submit, nb::arg("write"), nb::arg("buffer"), nb::arg("file"),
           nb::arg("file_offset") = 0, "Queues a read or write of a CUDA buffer; raises on submission failures.")
      .def("wait", &PyGds::wait, "Waits (GIL released) for every queued operation; returns how many.")
      .def("pin", &PyGds::pin, nb::arg("tensor"), "cuFileBufRegister the tensor; returns its address.")
      .def("unpin", &PyGds::unpin, nb::arg("tensor"), "Deregisters; returns (was pinned, address).")
      .def("close", &PyGds::close)
      .def_prop_ro("closed", &PyGds::closed)
      .def("pending", &PyGds::pending)
      .def("stats", &PyGds::stats)
      .def_prop_ro("mode", &PyGds::mode)
      .def_prop_ro("mode_reason", &PyGds::mode_reason)
      .def_prop_ro("block_size", [](const PyGds& h) { return h.options().block_size; })
      .def_prop_ro("queue_depth", [](const PyGds& h) { return h.options().queue_depth; })
      .def_prop_ro("single_submit", [](const PyGds& h) { return h.options().single_submit; })
      .def_prop_ro("overlap_events", [](const PyGds& h) { return h.options().overlap_events; })
      .def_prop_ro("intra_op_parallelism", [](const PyGds& h) { return h.options().intra_op_parallelism; });
}

}  // namespace deepio::py
