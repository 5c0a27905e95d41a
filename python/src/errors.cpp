// deepio::Error -> Python OSError subclasses.
//
// OSError(errno, strerror, filename) already maps errno to FileNotFoundError, PermissionError,
// IsADirectoryError, ... ; ENODATA (a read past the end of the file) becomes
// deepio.EndOfFileError, which is both an OSError and an EOFError so that `except EOFError`
// and `except OSError` both catch it. Every exception also carries `offset` and `nbytes`:
// the file offset and size of the part of the request that failed.
#include <cerrno>
#include <string>

#include "common.hpp"

namespace deepio::py {

namespace {
// A strong reference that is never dropped, so that no static nb::object is destroyed
// after the interpreter.
PyObject* g_eof_error = nullptr;

std::string with_location(const Error& e) {
  std::string msg = e.message();
  if (e.nbytes() != 0 || e.offset() != 0) {
    msg += " (offset " + std::to_string(e.offset()) + ", " + std::to_string(e.nbytes()) + " bytes)";
  }
  return msg;
}
}  // namespace

nb::object make_exception(const Error& e) {
  nb::handle cls = e.errnum() == ENODATA && g_eof_error != nullptr ? nb::handle(g_eof_error)
                                                                    : nb::handle(PyExc_OSError);
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

void init_errors(nb::module_& m) {
  nb::dict ns;
  ns["__module__"] = "deepio";
  ns["__doc__"] =
      "A read reached the end of the file before the requested range (errno ENODATA).\n"
      "Both an OSError (errno, filename, offset, nbytes) and an EOFError.";
  nb::object type = nb::module_::import_("builtins").attr("type");
  nb::object cls = type("EndOfFileError", nb::make_tuple(nb::handle(PyExc_OSError), nb::handle(PyExc_EOFError)), ns);
  m.attr("EndOfFileError") = cls;
  // One deliberate leak: errors may be raised while the module is being torn down.
  g_eof_error = cls.release().ptr();

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
