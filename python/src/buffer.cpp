// Buffers from any framework: DLPack (torch, NumPy, JAX, CuPy, ...) or the buffer protocol
// (bytearray, memoryview, mmap, array.array). Never a copy: an object that cannot be used as
// it is gets an exception naming the problem, so a read can never land in a temporary.
#include <cstdio>
#include <cstring>
#include <string>

#include "common.hpp"
#include "deepio/gpu.hpp"

namespace deepio::py {

std::string py_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__qualname__"));
}

namespace {

const char* device_name(int type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    default: return "an unknown device";
  }
}

// Host-addressable DLPack devices: plain CPU memory, CUDA/ROCm pinned host memory, and
// CUDA managed memory (migrates on access).
bool host_addressable(int type) { return type == 1 || type == 3 || type == 11 || type == 13; }

// C-contiguous: the elements tile [data, data + nbytes) in row-major order. Extents of 1
// may carry any stride (NumPy and torch both produce such strides); empty arrays qualify.
bool c_contiguous(const nb::ndarray<nb::ro>& a) {
  if (a.size() == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    const auto extent = static_cast<std::int64_t>(a.shape(i));
    if (extent != 1 && a.stride(i) != expected) return false;
    expected *= extent;
  }
  return true;
}

bool is_torch_tensor_requiring_grad(nb::handle obj) {
  if (!nb::hasattr(obj, "requires_grad") || !nb::hasattr(obj, "detach")) return false;
  nb::object rg = obj.attr("requires_grad");
  return PyBool_Check(rg.ptr()) && rg.ptr() == Py_True;
}

// Buffer-protocol objects whose element format nanobind cannot express (structured or
// exotic formats): for I/O, bytes are bytes. The memoryview holds the export.
bool import_raw(nb::handle obj, bool writable, const char* role, Buffer* out) {
  if (PyObject_CheckBuffer(obj.ptr()) == 0) return false;
  PyObject* mv = PyMemoryView_FromObject(obj.ptr());
  if (mv == nullptr) {
    PyErr_Clear();
    return false;
  }
  nb::object keep = nb::steal(mv);
  const Py_buffer* view = PyMemoryView_GET_BUFFER(mv);
  if (writable && view->readonly != 0) {
    throw nb::value_error(
        (std::string(role) + " is read-only (" + py_type_name(obj) + "): a read needs a writable destination").c_str());
  }
  if (PyBuffer_IsContiguous(view, 'C') == 0) {
    throw nb::value_error(
        (std::string(role) + " is not contiguous (" + py_type_name(obj) + " with strides); pass a contiguous buffer")
            .c_str());
  }
  out->keep = std::move(keep);
  out->data = view->buf;
  out->nbytes = static_cast<std::size_t>(view->len);
  return true;
}

// torch.Tensor, once torch has been imported by someone (never imported here). A strong
// reference kept for the life of the process.
PyObject* g_torch_strided = nullptr;  // torch.strided, set with the class below
PyObject* torch_tensor_type() {
  static PyObject* cls = nullptr;
  if (cls != nullptr) return cls;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return nullptr;
  PyObject* t = PyObject_GetAttrString(torch, "Tensor");
  PyObject* strided = PyObject_GetAttrString(torch, "strided");
  if (t == nullptr || strided == nullptr) {
    Py_XDECREF(t);
    Py_XDECREF(strided);
    PyErr_Clear();
    return nullptr;
  }
  g_torch_strided = strided;
  cls = t;
  return cls;
}

// Checks that the CUDA driver deepio loads agrees that `p` is device memory (the engine
// decides host/device with that driver: a device pointer it took for host memory would be
// dereferenced). Returns the device ordinal, or -1 for CUDA managed memory a framework calls
// CUDA memory (host-addressable: host memory to deepio, as kDLCUDAManaged is); raises
// TypeError naming the reason otherwise.
int require_device(const void* p, std::size_t nbytes, int dlpack_ordinal, const char* role) {
  if (nbytes == 0) return dlpack_ordinal < 0 ? 0 : dlpack_ordinal;  // nothing is ever touched
  int dev = -1;
  {
    nb::gil_scoped_release release;  // the first call loads and initialises the driver
    dev = device_of(p);
  }
  if (dev >= 0) return dev;
  if (is_managed(p)) return -1;
  std::string why;
  if (!cuda_usable(&why)) {
    throw nb::type_error(
        (std::string(role) + " lives in CUDA memory, but deepio cannot use the CUDA driver: " + why).c_str());
  }
  char addr[32];
  std::snprintf(addr, sizeof addr, "%p", p);
  throw nb::type_error((std::string(role) + " claims to live in CUDA memory, but the CUDA driver deepio loaded (" +
                        gpu_info().cuda_library + ") does not know address " + addr +
                        " as device memory (is DEEPIO_CUDA_LIBRARY the driver your framework uses?)")
                           .c_str());
}

// Fast path for torch tensors: torch's __dlpack__ is a Python method costing ~10 us per
// call, several plain attribute reads cost ~2 us. Keeps the tensor and its storage (so a
// resize_/set_ of the tensor cannot free the memory under the I/O). Returns false, with no
// error set, for anything unusual (sparse, meta, fake, nested tensors...), which then takes
// the DLPack route and its precise errors.
bool import_torch(nb::handle obj, const char* role, bool allow_device, Buffer* out) {
  PyObject* cls = torch_tensor_type();
  if (cls == nullptr) return false;
  const int is = PyObject_IsInstance(obj.ptr(), cls);
  if (is <= 0) {
    if (is < 0) PyErr_Clear();
    return false;
  }
  try {
    nb::object device = obj.attr("device").attr("type");
    if (!nb::isinstance<nb::str>(device)) return false;
    const std::string dev = nb::cast<std::string>(device);
    const bool cuda = dev == "cuda" && allow_device;
    if (dev != "cpu" && !cuda) {
      if (dev == "meta") return false;
      throw nb::type_error((std::string(role) + " is a " + dev + " tensor; " +
                            (dev == "cuda" ? "this call moves data between files and CPU memory only"
                                           : "deepio moves data between files and CPU or CUDA memory only"))
                               .c_str());
    }
    if (!obj.attr("layout").is(nb::handle(g_torch_strided))) return false;  // sparse, nested
    if (nb::cast<bool>(obj.attr("is_conj")()) || nb::cast<bool>(obj.attr("is_neg")())) {
      // Its memory holds the unconjugated / unnegated values: raw bytes would be wrong.
      throw nb::type_error((std::string(role) + " is a lazily conjugated or negated view; call "
                                                ".resolve_conj() / .resolve_neg() (or .clone()) first")
                               .c_str());
    }
    if (!nb::cast<bool>(obj.attr("is_contiguous")())) {
      throw nb::value_error((std::string(role) + " is not contiguous (Tensor with strides); pass a contiguous "
                                                 "tensor, e.g. .contiguous(), and copy the result back for reads")
                                .c_str());
    }
    nb::object storage = obj.attr("untyped_storage")();
    out->keep = nb::make_tuple(nb::borrow(obj), storage);
    out->data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(obj.attr("data_ptr")()));
    out->nbytes = nb::cast<std::size_t>(obj.attr("nbytes"));
    if (cuda)
      out->device = require_device(out->data, out->nbytes, nb::cast<int>(obj.attr("device").attr("index")), role);
    return true;
  } catch (nb::python_error& e) {
    e.restore();
    PyErr_Clear();
    return false;
  } catch (const nb::cast_error&) {
    PyErr_Clear();
    return false;
  }
}

}  // namespace

bool host_range(nb::handle obj, const void** data, std::size_t* nbytes) {
  nb::ndarray<nb::ro> a;
  if (nb::try_cast(obj, a, false)) {
    const int dev = a.device_type();
    if (!host_addressable(dev)) return false;
    *data = a.data();
    *nbytes = a.nbytes();
    return true;
  }
  if (is_torch_tensor_requiring_grad(obj)) return host_range(obj.attr("detach")(), data, nbytes);
  Buffer raw;
  if (!import_raw(obj, false, "buffer", &raw)) return false;
  *data = raw.data;
  *nbytes = raw.nbytes;
  return true;
}

bool cuda_usable(std::string* why) {
  GpuInfo info;
  {
    nb::gil_scoped_release release;
    info = gpu_info();
  }
  if (!info.cuda_found && why != nullptr) *why = info.cuda_reason;
  return info.cuda_found;
}

Buffer import_buffer(nb::handle obj, bool writable, const char* role, bool allow_device) {
  Buffer buf;
  if (import_torch(obj, role, allow_device, &buf)) return buf;  // torch tensors are always writable
  bool ok = false;
  if (writable) {
    nb::ndarray<> w;
    ok = nb::try_cast(obj, w, false);
    if (ok) {
      buf.array = nb::ndarray<nb::ro>(w);
    } else if (nb::ndarray<nb::ro> r; nb::try_cast(obj, r, false)) {
      throw nb::value_error(
          (std::string(role) + " is read-only (" + py_type_name(obj) + "): a read needs a writable destination")
              .c_str());
    }
  } else {
    ok = nb::try_cast(obj, buf.array, false);
  }
  if (!ok) {
    // torch refuses to export tensors that require grad; a detached view shares the memory
    // (and keeps it alive), which is all I/O needs.
    if (is_torch_tensor_requiring_grad(obj)) return import_buffer(obj.attr("detach")(), writable, role, allow_device);
    if (import_raw(obj, writable, role, &buf)) return buf;
    if (nb::hasattr(obj, "__dlpack__")) {
      // Say why the producer refused (sparse, meta, conjugate views, ...).
      std::string why = "its __dlpack__ export failed or is not CPU memory";
      try {
        obj.attr("__dlpack__")();
      } catch (nb::python_error& e) {
        PyObject* text = PyObject_Str(e.value().ptr());
        if (text != nullptr) {
          const char* utf8 = PyUnicode_AsUTF8(text);
          if (utf8 != nullptr) why = utf8;
          Py_DECREF(text);
        }
        PyErr_Clear();
      }
      throw nb::type_error((std::string(role) + " (" + py_type_name(obj) + ") cannot be used: " + why).c_str());
    }
    throw nb::type_error((std::string(role) +
                          " must be a tensor or array supporting DLPack or the buffer "
                          "protocol (torch.Tensor, numpy.ndarray, bytearray, memoryview, ...), not " +
                          py_type_name(obj))
                             .c_str());
  }
  const nb::ndarray<nb::ro>& a = buf.array;
  const bool cuda = a.device_type() == nb::device::cuda::value && allow_device;
  if (!host_addressable(a.device_type()) && !cuda) {
    throw nb::type_error(
        (std::string(role) + " lives in " + device_name(a.device_type()) + " memory; " +
         (a.device_type() == nb::device::cuda::value ? "this call moves data between files and CPU memory only"
                                                     : "deepio moves data between files and CPU or CUDA memory only"))
            .c_str());
  }
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.lanes != 1 || dt.bits == 0 || dt.bits % 8 != 0) {
    throw nb::type_error((std::string(role) + " has an element type of " + std::to_string(dt.bits) + " bits x " +
                          std::to_string(dt.lanes) + " lanes, which has no byte size")
                             .c_str());
  }
  if (!c_contiguous(a)) {
    throw nb::value_error((std::string(role) + " is not contiguous (" + py_type_name(obj) +
                           " with strides); pass a contiguous tensor, e.g. .contiguous() or "
                           "numpy.ascontiguousarray(), and copy the result back for reads")
                              .c_str());
  }
  buf.data = const_cast<void*>(static_cast<const void*>(a.data()));
  buf.nbytes = a.nbytes();
  if (cuda) buf.device = require_device(buf.data, buf.nbytes, a.device_id(), role);
  return buf;
}

void order_after_producer(nb::handle obj, Buffer* buf) {
  if (buf->device < 0 || buf->nbytes == 0) return;
  if (PyObject* cls = torch_tensor_type(); cls != nullptr && PyObject_IsInstance(obj.ptr(), cls) == 1) {
    // torch.cuda.current_stream(device).cuda_stream: a lookup, no synchronization.
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (torch != nullptr) {
      nb::object stream = nb::borrow(torch).attr("cuda").attr("current_stream")(buf->device);
      buf->stream = nb::cast<std::uintptr_t>(stream.attr("cuda_stream"));
      return;
    }
  }
  if (!nb::hasattr(obj, "__dlpack__")) return;
  std::uintptr_t s = 0;
  {
    nb::gil_scoped_release release;  // the first call makes the stream
    s = consumer_stream(buf->device);
  }
  try {
    // The capsule is dropped unconsumed (its deleter runs): only the ordering is wanted.
    obj.attr("__dlpack__")(nb::arg("stream") = s);
    buf->stream = s;
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    buf->stream = 0;  // the plain export (stream=None) orders before the legacy default stream
  }
}

bool import_view(nb::handle obj, bool writable, std::deque<Py_buffer>* out) {
  if (PyObject_CheckBuffer(obj.ptr()) == 0) return false;
  Py_buffer& v = out->emplace_back();
  if (PyObject_GetBuffer(obj.ptr(), &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0) {
    out->pop_back();
    PyErr_Clear();
    return false;
  }
  if (v.format != nullptr && std::strchr(v.format, 'O') != nullptr) {  // Python objects: never bytes
    PyBuffer_Release(&v);
    out->pop_back();
    return false;
  }
  return true;
}

Target parse_target(nb::handle obj) {
  Target t;
  if (PyBool_Check(obj.ptr())) throw nb::type_error("a file must be a path or an integer descriptor, not a bool");
  if (PyLong_Check(obj.ptr())) {
    const long fd = PyLong_AsLong(obj.ptr());
    if (fd == -1 && PyErr_Occurred()) throw nb::python_error();
    if (fd < 0 || fd > INT32_MAX) throw nb::value_error(("invalid file descriptor " + std::to_string(fd)).c_str());
    t.fd = static_cast<int>(fd);
    t.filename = nb::borrow(obj);
    return t;
  }
  PyObject* fs = PyOS_FSPath(obj.ptr());
  if (fs == nullptr) {
    PyErr_Clear();
    throw nb::type_error(
        ("a file must be a path (str, bytes, os.PathLike) or an integer descriptor, not " + py_type_name(obj)).c_str());
  }
  nb::object path = nb::steal(fs);
  if (PyUnicode_Check(fs)) {
    PyObject* encoded = PyUnicode_EncodeFSDefault(fs);
    if (encoded == nullptr) throw nb::python_error();
    nb::object b = nb::steal(encoded);
    t.path.assign(PyBytes_AS_STRING(encoded), static_cast<std::size_t>(PyBytes_GET_SIZE(encoded)));
  } else {
    t.path.assign(PyBytes_AS_STRING(fs), static_cast<std::size_t>(PyBytes_GET_SIZE(fs)));
  }
  if (t.path.empty()) throw nb::value_error("empty file name");
  if (t.path.find('\0') != std::string::npos) throw nb::value_error("file name contains a NUL byte");
  t.filename = path;
  return t;
}

}  // namespace deepio::py
