// deepio::Error -> Python OSError subclasses.
//
// OSError(errno, strerror, filename) already maps errno to FileNotFoundError, PermissionError,
// IsADirectoryError, ... ; ENODATA (a read past the end of the file) becomes
// deepio.EndOfFileError, which is both an OSError and an EOFError so that `except EOFError`
// and `except OSError` both catch it. An argument deepio's own checks refused
// (deepio::InvalidArgument: errno EINVAL, invalid_argument() true) becomes
// deepio.InvalidArgumentError, both an OSError and a ValueError, so that `except ValueError`
// catches bad options and offsets as Python code expects; EINVAL from the kernel or a file
// system stays a plain OSError. Every exception also carries `offset` and `nbytes`: the file
// offset and size of the part of the request that failed.
#include <cerrno>
#include <string>

#include "common.hpp"

namespace deepio::py {

namespace {
// A strong reference that is never dropped, so that no static nb::object is destroyed
// after the interpreter.
PyObject* g_eof_error = nullptr;
PyObject* g_invalid_argument_error = nullptr;

std::string with_location(const Error& e) {
  std::string msg = e.message();
  if (e.nbytes() != 0 || e.offset() != 0) {
    msg += " (offset " + std::to_string(e.offset()) + ", " + std::to_string(e.nbytes()) + " bytes)";
  }
  return msg;
}
}  // namespace

nb::object make_exception(const Error& e) {
  nb::handle cls = PyExc_OSError;
  if (e.invalid_argument() && g_invalid_argument_error != nullptr) {
    cls = g_invalid_argument_error;
  } else if (e.errnum() == ENODATA && g_eof_error != nullptr) {
    cls = g_eof_error;
  }
  std::string msg = with_location(e);
  nb::object filename = nb::none();
  const std::string& path = e.path();
  if (path.rfind("fd ", 0) == 0) {
    // A descriptor the caller passed: name it in the message, not as a file name.
    msg = path + ": " + msg;
  } else if (!path.empty()) {
    filename = nb::steal(PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size())));
    if (!filename.is_valid()) throw nb::python_error();
  }
  nb::object exc = cls(e.errnum(), msg, filename);
  exc.attr("offset") = e.offset();
  exc.attr("nbytes") = e.nbytes();
  return exc;
}

void raise_error(const Error& e) {
  nb::object exc = make_exception(e);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

namespace {
// A class deriving from OSError and `also`, named deepio.<name>. One deliberate leak: errors
// may be raised while the module is being torn down, so the reference is never dropped.
PyObject* define_error(nb::module_& m, const char* name, PyObject* also, const char* doc) {
  nb::dict ns;
  ns["__module__"] = "deepio";
  ns["__doc__"] = doc;
  nb::object type = nb::module_::import_("builtins").attr("type");
  nb::object cls = type(name, nb::make_tuple(nb::handle(PyExc_OSError), nb::handle(also)), ns);
  m.attr(name) = cls;
  return cls.release().ptr();
}
}  // namespace

void init_errors(nb::module_& m) {
  g_eof_error = define_error(m, "EndOfFileError", PyExc_EOFError,
                             "A read reached the end of the file before the requested range (errno ENODATA).\n"
                             "Both an OSError (errno, filename, offset, nbytes) and an EOFError.");
  g_invalid_argument_error = define_error(
      m, "InvalidArgumentError", PyExc_ValueError,
      "deepio refused an argument before doing any I/O (errno EINVAL): a bad block_size,\n"
      "queue_depth, intra_op_parallelism, backend or direct_io, a negative file_offset.\n"
      "Both an OSError (errno EINVAL) and a ValueError; the message names the parameter.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        nb::object exc = make_exception(e);
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (nb::python_error& pe) {
        pe.restore();
      }
    }
  });
}

}  // namespace deepio::py
