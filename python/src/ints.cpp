// Integer arguments of the ranged calls: a 1-D integer array (buffer protocol: NumPy,
// array.array, memoryview) or a sequence of Python integers, read as 64-bit values with the
// errors a Python caller expects (TypeError for a non-integer, InvalidArgument naming the item
// for a value beyond int64).
#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "handle.hpp"

namespace deepio::py {

// A Python integer as int64; one beyond int64 is refused naming it `what` (as an unsigned
// array item above 2^63 - 1 is), not with a bare OverflowError.
std::int64_t int_item(PyObject* o, const std::string& what) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow > 0) throw InvalidArgument(what + " is above 2^63 - 1");
  if (overflow < 0) throw InvalidArgument(what + " must be non-negative");
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

// A 1-D integer array (buffer protocol: NumPy, array.array, memoryview) or a sequence of
// Python integers, as 64-bit values (negative ones as Python wrote them). TypeError for
// anything else, bools included; ValueError for an array that is not 1-D.
std::vector<std::int64_t> int_values(nb::handle obj, const char* name) {
  std::vector<std::int64_t> out;
  if (PyObject_CheckBuffer(obj.ptr()) != 0 && !PyBytes_Check(obj.ptr()) && !PyByteArray_Check(obj.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) throw nb::python_error();
    struct Release {
      Py_buffer* v;
      ~Release() { PyBuffer_Release(v); }
    } release{&view};
    std::string fmt = view.format != nullptr ? view.format : "B";
    if (!fmt.empty() &&
        (fmt[0] == '@' || fmt[0] == '=' || (fmt[0] == '<' && std::endian::native == std::endian::little))) {
      fmt.erase(0, 1);
    }
    const bool is_signed = fmt == "b" || fmt == "h" || fmt == "i" || fmt == "l" || fmt == "q" || fmt == "n";
    const bool is_unsigned = fmt == "B" || fmt == "H" || fmt == "I" || fmt == "L" || fmt == "Q" || fmt == "N";
    if (!is_signed && !is_unsigned) {
      throw nb::type_error((std::string(name) + " must hold integers, not array items of format '" +
                            (view.format != nullptr ? view.format : "B") + "'")
                               .c_str());
    }
    if (view.ndim != 1) {
      throw InvalidArgument(std::string(name) + " must be one-dimensional, not " + std::to_string(view.ndim) +
                            "-dimensional");
    }
    const auto n = static_cast<std::size_t>(view.shape[0]);
    const Py_ssize_t stride = view.strides != nullptr ? view.strides[0] : view.itemsize;
    out.resize(n);
    const auto* base = static_cast<const char*>(view.buf);
    for (std::size_t i = 0; i < n; ++i) {
      const char* at = base + static_cast<Py_ssize_t>(i) * stride;
      std::int64_t v = 0;
      switch (view.itemsize) {
        case 1:
          v = is_signed ? *reinterpret_cast<const std::int8_t*>(at) : *reinterpret_cast<const std::uint8_t*>(at);
          break;
        case 2: {
          std::int16_t x;
          std::memcpy(&x, at, 2);
          v = is_signed ? x : static_cast<std::uint16_t>(x);
          break;
        }
        case 4: {
          std::int32_t x;
          std::memcpy(&x, at, 4);
          v = is_signed ? x : static_cast<std::uint32_t>(x);
          break;
        }
        case 8: {
          std::memcpy(&v, at, 8);
          if (is_unsigned && v < 0) {
            throw InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] is above 2^63 - 1");
          }
          break;
        }
        default:
          throw nb::type_error((std::string(name) + " items of " + std::to_string(view.itemsize) +
                                " bytes are not integers deepio reads")
                                   .c_str());
      }
      out[i] = v;
    }
    return out;
  }
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    throw nb::type_error(
        (std::string(name) + " must be a sequence of integers or a 1-D integer array, not " + py_type_name(obj))
            .c_str());
  }
  nb::object fast = nb::steal(PySequence_Fast(obj.ptr(), name));
  if (!fast.is_valid()) throw nb::python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  out.resize(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyIndex_Check(items[i]) || PyBool_Check(items[i])) {
      throw nb::type_error(
          (std::string(name) + "[" + std::to_string(i) + "] must be an integer, not " + py_type_name(items[i]))
              .c_str());
    }
    out[static_cast<std::size_t>(i)] = int_item(items[i], std::string(name) + "[" + std::to_string(i) + "]");
  }
  return out;
}

}  // namespace deepio::py
