// Shared pieces of the `deepio._deepio` extension.
//
// Threading rule for the whole extension: every nanobind object (nb::object, nb::ndarray) is
// created, copied and destroyed only while the GIL is held. Code that releases the GIL
// (nb::gil_scoped_release) touches nothing but C++ engine objects inside that scope, and any
// container of Python references it needs afterwards is declared outside the scope. A Buffer
// handed to the engine as an operation's keep-alive (detail::BindingOp, a shared_ptr<void>) is
// released by the engine only into the collecting call's hands (detail::Collected::keep_alive,
// Future::get), which the binding makes with the GIL held; the submitting call keeps its own
// reference until it has the GIL back, so the last reference is never dropped without it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "deepio/deepio.hpp"

namespace nb = nanobind;

namespace deepio::py {

/// A caller's buffer accepted for I/O. `array` (DLPack or typed buffer protocol) or `keep`
/// (a memoryview, for buffer-protocol formats DLPack cannot describe, e.g. NumPy structured
/// dtypes) keeps the producer and its memory alive for as long as this object lives; destroy
/// it with the GIL.
struct Buffer {
  nb::ndarray<nb::ro> array;
  nb::object keep;
  void* data = nullptr;
  std::size_t nbytes = 0;
  int device = -1;  ///< CUDA device ordinal for device memory (allow_device only); -1: host
  /// Device memory: the stream the transfer is ordered after (OpOptions::stream), set by
  /// order_after_producer(); unset for host memory.
  std::optional<std::uintptr_t> stream;
};

/// Imports `obj` through DLPack or the buffer protocol without ever copying. `writable`: the
/// buffer is a read destination. Raises TypeError (not an array, not CPU memory, a dtype with
/// no byte size) or ValueError (read-only destination, non-contiguous memory) naming the
/// problem and `role` (e.g. "buffer").
/// `allow_device`: CUDA device memory (DLPack kDLCUDA, torch `is_cuda`) is accepted too, and
/// `device` says which device, once the CUDA driver deepio loads confirms that the address
/// is device memory (deepio::device_of); otherwise TypeError saying why (no usable driver, or
/// the driver does not know the address). Only for callers that hand the pointer to an engine
/// that stages device memory (deepio::Handle, deepio::GdsHandle): never dereference it.
Buffer import_buffer(nb::handle obj, bool writable, const char* role = "buffer", bool allow_device = false);

/// The ordering handshake with the producer of a device buffer (`buf` imported from `obj`;
/// nothing for host memory or an empty buffer): sets buf->stream, without waiting for anything.
/// A torch tensor: torch's current stream on its device (`cuda_stream`; 0, the legacy default
/// stream, for torch's default stream). Another DLPack producer: DLPack's stream exchange,
/// `obj.__dlpack__(stream=S)` with S = deepio::consumer_stream(device), which orders the
/// producer's pending work before S; a producer without the `stream` keyword (TypeError) is
/// taken to have ordered it before the legacy default stream, as DLPack prescribes for the
/// plain export. Raises what the producer or the driver raises.
void order_after_producer(nb::handle obj, Buffer* buf);

/// The buffers of a batch submitted without futures, one keep-alive shared by all its
/// operations (the last one collected releases them all). `views`: contiguous buffer-protocol
/// exports taken by import_view() (a deque, so an export never moves: some exporters point
/// into their Py_buffer); `others`: what import_buffer() took. Destroy it with the GIL.
struct BatchBuffers {
  BatchBuffers() = default;
  BatchBuffers(const BatchBuffers&) = delete;
  BatchBuffers& operator=(const BatchBuffers&) = delete;
  ~BatchBuffers() {
    for (Py_buffer& v : views) PyBuffer_Release(&v);
  }
  std::deque<Py_buffer> views;
  std::vector<std::shared_ptr<Buffer>> others;
};

/// A batch's cheap import: a C-contiguous buffer-protocol export of `obj` (NumPy arrays,
/// memoryview, bytearray, mmap, ...; writable when `writable`), appended to `*out`. Returns
/// false, with no error set and nothing appended, for anything else (torch tensors, DLPack-only
/// objects, read-only or strided buffers, object dtypes): import_buffer() then decides, with
/// its precise errors. Buffer-protocol memory is always host memory.
bool import_view(nb::handle obj, bool writable, std::deque<Py_buffer>* out);

/// Whether the CUDA driver is usable by deepio; `why` gets the reason when not.
bool cuda_usable(std::string* why);

/// The host memory range of `obj` with none of the checks I/O needs (any device type is
/// rejected silently): for is_locked / free lookups. False when `obj` exports no memory.
bool host_range(nb::handle obj, const void** data, std::size_t* nbytes);

/// The Python exception for a deepio::Error: an OSError subclass chosen by errno
/// (FileNotFoundError, PermissionError, ...; deepio.EndOfFileError for ENODATA;
/// deepio.InvalidArgumentError, also a ValueError, for an argument the engine's checks refused
/// (Error::invalid_argument())) with errno, strerror (the message, naming offset and size),
/// filename, and extra attributes offset and nbytes.
nb::object make_exception(const Error& e);
/// Sets the Python error indicator to make_exception(e) and throws nb::python_error.
[[noreturn]] void raise_error(const Error& e);
/// Emits deepio.UnobservedFailureWarning(message) with the GIL held, keeping any exception
/// being raised intact; nothing while the interpreter finalizes.
void warn_unobserved(const std::string& message);
/// Turns the failures the engine reported as unobservable (on any thread) into warnings.
/// GIL held. Cheap when there are none (one atomic load).
void flush_unobserved();
/// The qualified name of obj's type, for error messages.
std::string py_type_name(nb::handle obj);

/// A file argument: a path (str, bytes or os.PathLike) or an integer descriptor.
struct Target {
  std::string path;  ///< empty when fd >= 0
  int fd = -1;
  nb::object filename;  ///< what error messages report (the caller's object)
};
Target parse_target(nb::handle obj);

/// Whether the interpreter is shutting down (then the GIL must not be released).
inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

void init_errors(nb::module_& m);
void init_handle(nb::module_& m);
void init_memory(nb::module_& m);
void init_fault(nb::module_& m);
void init_gds(nb::module_& m);
void init_kv(nb::module_& m);

}  // namespace deepio::py
