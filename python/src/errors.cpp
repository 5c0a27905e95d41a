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
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

#include "common.hpp"

namespace deepio::py {

namespace {
// A strong reference that is never dropped, so that no static nb::object is destroyed
// after the interpreter.
PyObject* g_eof_error = nullptr;
PyObject* g_invalid_argument_error = nullptr;
PyObject* g_forked_handle_error = nullptr;
PyObject* g_unobserved_warning = nullptr;

// Failures the engine reported as unobservable (deepio::set_unobserved_failure_handler), on
// whatever thread, without the GIL: kept here until flush_unobserved() turns them into
// warnings with the GIL held.
std::mutex g_unobserved_mutex;
std::vector<Error> g_unobserved;  // guarded by g_unobserved_mutex
std::atomic<bool> g_has_unobserved{false};

void queue_unobserved(const Error& e) noexcept {
  try {
    std::lock_guard lock(g_unobserved_mutex);
    g_unobserved.push_back(e);
    g_has_unobserved.store(true, std::memory_order_release);
  } catch (...) {  // no memory for the record: the engine's default line at least
    const std::string line = std::string("deepio: failure nobody collected: ") + e.what() + "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
}

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
  } else if (e.forked_handle() && g_forked_handle_error != nullptr) {
    cls = g_forked_handle_error;
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

void warn_unobserved(const std::string& message) {
  if (interpreter_finalizing() || g_unobserved_warning == nullptr) return;
  // May run in a destructor while an exception is being raised: keep that one intact.
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (PyErr_WarnEx(g_unobserved_warning, message.c_str(), 1) != 0) PyErr_WriteUnraisable(nullptr);
  PyErr_Restore(type, value, tb);
}

void flush_unobserved() {
  if (!g_has_unobserved.load(std::memory_order_acquire)) return;
  std::vector<Error> errors;
  {
    std::lock_guard lock(g_unobserved_mutex);
    errors.swap(g_unobserved);
    g_has_unobserved.store(false, std::memory_order_relaxed);
  }
  for (const Error& e : errors) {
    warn_unobserved(std::string("deepio: an operation failed and nobody collected the failure (its futures were "
                                "dropped, or its handle destroyed, before result()): ") +
                    e.what());
  }
}

void raise_error(const Error& e) {
  nb::object exc = make_exception(e);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

namespace {
// A class deriving from OSError and `also`, named deepio.<name>. One deliberate leak: errors
// may be raised while the module is being torn down, so the reference is never dropped.
PyObject* define_class(nb::module_& m, const char* name, nb::tuple bases, const char* doc) {
  nb::dict ns;
  ns["__module__"] = "deepio";
  ns["__doc__"] = doc;
  nb::object type = nb::module_::import_("builtins").attr("type");
  nb::object cls = type(name, bases, ns);
  m.attr(name) = cls;
  return cls.release().ptr();
}

PyObject* define_error(nb::module_& m, const char* name, PyObject* also, const char* doc) {
  return define_class(m, name, nb::make_tuple(nb::handle(PyExc_OSError), nb::handle(also)), doc);
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

  g_forked_handle_error = define_error(
      m, "ForkedHandleError", PyExc_RuntimeError,
      "A deepio handle (or a deepio.File opened on one) made in another process was used in a\n"
      "child made by fork(): its worker threads stayed in the parent, so the call refuses at\n"
      "once (errno EBADF) instead of hanging. Make a new handle in the child. Both an OSError\n"
      "and a RuntimeError. The library's own default engine is made anew in a child.");
  // A RuntimeWarning, not a ResourceWarning: Python ignores ResourceWarning by default, and a
  // lost write must be seen (docs/errors.md).
  g_unobserved_warning = define_class(
      m, "UnobservedFailureWarning", nb::make_tuple(nb::handle(PyExc_RuntimeWarning)),
      "An operation failed and nobody could collect the failure any more: a deepio.Future\n"
      "dropped before result()/exception() was called, a handle destroyed with failed\n"
      "operations never waited for, or a finalizer (File/Writer garbage-collected unclosed)\n"
      "whose close() failed. The message names the file, the offset and the error.");
  deepio::set_unobserved_failure_handler(&queue_unobserved);
  m.def("flush_unobserved", &flush_unobserved,
        "Turns the failures the engine reported as unobservable into UnobservedFailureWarnings.");

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
