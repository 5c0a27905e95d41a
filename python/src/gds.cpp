// `_deepio.GdsHandle`: deepio::GdsHandle for Python. It is a `_deepio.Handle` — the same
// engine, the same binding (every I/O, wait and close method is inherited): GPUDirect Storage
// is a route inside that engine, so there is no second ledger, wait or error rule here. This
// file adds only what a GdsHandle has beyond a Handle: pinning device buffers, the mode
// report and the device-side counters.
//
// Errors: deepio::Error thrown with the GIL released propagates after the GIL is re-taken
// (gil_scoped_release's destructor) and becomes the OSError subclass through the module's
// exception translator (errors.cpp).
#include <memory>
#include <utility>

#include <nanobind/stl/pair.h>

#include "deepio/gpu.hpp"
#include "handle.hpp"

namespace deepio::py {

namespace {

GdsMode mode_from(const std::string& name) {
  if (name == "auto") return GdsMode::Auto;
  if (name == "cufile") return GdsMode::CuFile;
  if (name == "compat") return GdsMode::Compat;
  throw InvalidArgument("unknown mode '" + name + "' (expected auto, cufile or compat)");
}

// The engine of a GdsHandle is made with the GIL released: it loads the drivers and opens the
// cuFile driver the first time, and starts the workers.
std::shared_ptr<Handle> make_gds(const GdsOptions& o) {
  nb::gil_scoped_release release;
  return std::make_shared<GdsHandle>(o);
}

Buffer device_buffer(nb::handle obj) {
  Buffer b = import_buffer(obj, false, "tensor", /*allow_device=*/true);
  if (b.device < 0) throw nb::type_error("tensor is host memory; GDS pins CUDA device memory");
  return b;
}

}  // namespace

class PyGds final : public PyHandle {
 public:
  PyGds(std::int64_t block_size, std::int64_t queue_depth, bool single_submit, bool overlap_events,
        std::int64_t intra_op_parallelism, const std::string& mode, const std::string& backend,
        const std::string& direct_io)
      : PyHandle(make_gds(GdsOptions{.block_size = count_arg(block_size),
                                     .queue_depth = count_arg(queue_depth),
                                     .single_submit = single_submit,
                                     .overlap_events = overlap_events,
                                     .intra_op_parallelism = count_arg(intra_op_parallelism),
                                     .mode = mode_from(mode),
                                     .backend = backend_from(backend),
                                     .direct_io = direct_from(direct_io)})) {}

  /// Pins (cuFileBufRegister) the tensor's memory; returns its address.
  std::uintptr_t pin(nb::handle tensor) {
    auto h = gds();
    const Buffer buf = device_buffer(tensor);
    if (buf.nbytes == 0) throw nb::value_error("cannot pin an empty tensor");
    {
      nb::gil_scoped_release release;
      h->pin_device_buffer(buf.data, buf.nbytes);
    }
    return reinterpret_cast<std::uintptr_t>(buf.data);
  }

  /// Unpins a buffer pinned at exactly the tensor's address: (was it pinned, address).
  std::pair<bool, std::uintptr_t> unpin(nb::handle tensor) {
    auto h = gds();
    const Buffer buf = device_buffer(tensor);
    bool ok = false;
    {
      nb::gil_scoped_release release;
      ok = h->unpin_device_buffer(buf.data);
    }
    return {ok, reinterpret_cast<std::uintptr_t>(buf.data)};
  }

  std::string mode() const { return gds()->mode(); }
  std::string mode_reason() const { return gds()->mode_reason(); }

  nb::dict gds_stats() const {
    const GdsStats s = gds()->gds_stats();
    nb::dict d;
    d["ops_completed"] = s.ops_completed;
    d["ops_failed"] = s.ops_failed;
    d["chunks"] = s.chunks;
    d["bytes_cufile"] = s.bytes_cufile;
    d["bytes_staged"] = s.bytes_staged;
    d["files_fallback"] = s.files_fallback;
    d["pins_refused"] = s.pins_refused;
    d["registrations_skipped"] = s.registrations_skipped;
    d["io_fallbacks"] = s.io_fallbacks;
    return d;
  }

 private:
  // No reference of its own: close() must be able to drop the last one (PyHandle::shutdown).
  std::shared_ptr<GdsHandle> gds() const { return std::static_pointer_cast<GdsHandle>(engine()); }
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
  m.def("gpu_info", &gpu_info_dict, "What CUDA and cuFile this process can use (deepio::gpu_info()); never raises.");
  nb::class_<PyGds, PyHandle>(m, "GdsHandle",
                              "deepio::GdsHandle behind deepio.gds_handle: a Handle whose engine can move CUDA "
                              "memory through GPUDirect Storage.")
      .def(nb::init<std::int64_t, std::int64_t, bool, bool, std::int64_t, const std::string&, const std::string&,
                    const std::string&>(),
           nb::arg("block_size") = 1 << 20, nb::arg("queue_depth") = 128, nb::arg("single_submit") = false,
           nb::arg("overlap_events") = false, nb::arg("intra_op_parallelism") = 1, nb::arg("mode") = "auto",
           nb::arg("backend") = "auto", nb::arg("direct_io") = "auto")
      .def("pin", &PyGds::pin, nb::arg("tensor"), "cuFileBufRegister the tensor; returns its address.")
      .def("unpin", &PyGds::unpin, nb::arg("tensor"), "Deregisters; returns (was pinned, address).")
      .def("gds_stats", &PyGds::gds_stats,
           "Device-memory counters: ops, chunks, bytes through cuFile, bytes staged, files that fell back.")
      .def_prop_ro("mode", &PyGds::mode)
      .def_prop_ro("mode_reason", &PyGds::mode_reason);
}

}  // namespace deepio::py
