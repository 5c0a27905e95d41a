// deepio._comm: thin nanobind bindings of deepio::comm for python/deepio/comm.
//
// Buffers arrive as nb::ndarray (NumPy through the buffer protocol or DLPack, torch CPU
// tensors through DLPack). Destinations are marked noconvert, so a result never lands in a
// silent temporary copy; everything must be 1-D, C-contiguous and on the CPU (the Python layer
// flattens views first). Every call that does real work releases the GIL. Communicators come
// in as the integer from mpi4py's MPI._handleof(comm): for Open MPI that is the MPI_Comm
// pointer value, for MPICH-ABI MPIs the MPI_Comm integer. mpi4py is not linked.
//
// Errors: comm's own errors (deepio::comm::ArgumentError, CommError) become the exceptions
// deepio's I/O calls raise for their kind (python/src/errors.cpp): deepio.InvalidArgumentError
// (an OSError and a ValueError, errno EINVAL) for an argument deepio refused, else
// OSError(errno, message), which Python turns into the subclass for that errno (plain OSError
// for EIO). Every other deepio::Error is left to _deepio's translator: translators are shared by
// every nanobind module of the process and the last registered is asked first, so catching them
// all here would turn the I/O calls' own classes (ForkedHandleError, EndOfFileError, filename)
// into plain OSErrors from the moment deepio.comm is imported. The classes are deepio's own, looked up
// once at import (this extension cannot call into _deepio's C++ code), so comm and I/O share
// one family of exceptions. Each carries `offset` and `nbytes` (0 here) like the I/O ones, and
// comm adds: `reason` (the agreement's reason code, an int; 0 when none), `reason_name` and
// `rank` (the lowest failing rank or -1) for deepio::comm::ArgumentError; `mpi_error_class`
// for deepio::comm::CommError (an MPI failure, errno EIO).
#include <deepio/comm.hpp>

#include "../../src/comm/stages.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

namespace nb = nanobind;
namespace dc = deepio::comm;
namespace dd = deepio::comm::detail;

namespace {

using F32In = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// Any device: the agreement only compares addresses and lengths (never dereferences), so CUDA
// tensors of the torch-ops path are checked by the same C++ rules.
using F32Any = nb::ndarray<const float, nb::ndim<1>, nb::c_contig>;
using U8In = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8Out = nb::ndarray<std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Message =
    nb::ndarray<std::int64_t, nb::shape<std::tuple_size_v<dd::AgreementMessage>>, nb::c_contig, nb::device::cpu>;

// deepio.InvalidArgumentError, from deepio._deepio. A strong reference that is never dropped
// (errors may be raised while the interpreter tears modules down).
PyObject* g_invalid_argument_error = nullptr;

// The Python exception for a deepio::Error (see the top of this file).
nb::object make_exception(const deepio::Error& e) {
  nb::handle cls = e.invalid_argument() ? nb::handle(g_invalid_argument_error) : nb::handle(PyExc_OSError);
  nb::object exc = cls(e.errnum(), e.message());
  exc.attr("offset") = e.offset();
  exc.attr("nbytes") = e.nbytes();
  if (const auto* a = dynamic_cast<const dc::ArgumentError*>(&e)) {
    exc.attr("reason") = static_cast<int>(a->reason());
    exc.attr("reason_name") = dc::reason_name(a->reason());
    exc.attr("rank") = a->rank();
  } else if (const auto* c = dynamic_cast<const dc::CommError*>(&e)) {
    exc.attr("mpi_error_class") = c->mpi_error_class();
  }
  return exc;
}

void set_exception(const deepio::Error& e) {
  try {
    nb::object exc = make_exception(e);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (nb::python_error& pe) {
    pe.restore();
  }
}

// A template so that only the branch for this MPI's handle type is instantiated.
template <class Comm>
Comm comm_cast(std::uintptr_t handle) {
  if constexpr (std::is_pointer_v<Comm>) {
    return reinterpret_cast<Comm>(handle);
  } else {
    return static_cast<Comm>(handle);
  }
}
MPI_Comm comm_from_handle(std::uintptr_t handle) { return comm_cast<MPI_Comm>(handle); }

std::span<const float> in_span(const F32In& a) { return {a.data(), a.shape(0)}; }
std::span<float> out_span(F32Out& a) { return {a.data(), a.shape(0)}; }

dc::Kernel kernel_from(const std::string& name) {
  if (name == "best") return dc::Kernel::best;
  if (name == "scalar") return dc::Kernel::scalar;
  if (name == "avx2") return dc::Kernel::avx2;
  throw dc::ArgumentError("unknown kernel '" + name + "' (best, scalar, avx2)");
}

void require(bool ok, const std::string& what) {
  if (!ok) throw dc::ArgumentError(what);
}

// The length rules of the agreement (stages.hpp), for the stage functions called one by one.
void check_layout(std::size_t n0, std::size_t n, std::size_t w) {
  require(w >= 1, "world size must be >= 1");
  if (const dc::Reason r = dd::check_lengths(n0, n0, n, n / w, w); r != dc::Reason::none)
    throw dc::ArgumentError(dd::reason_text(r, w), r);
}

dd::CallArgs call_args(const F32Any& input, const F32Any& output, const F32Any& worker_error,
                       const F32Any& server_error) {
  return {input.data(),        input.shape(0),        output.data(),       output.shape(0),
          worker_error.data(), worker_error.shape(0), server_error.data(), server_error.shape(0)};
}

void check_rank(std::size_t w, int rank) {
  require(w >= 1 && rank >= 0 && static_cast<std::size_t>(rank) < w,
          "rank " + std::to_string(rank) + " is not in [0, world_size = " + std::to_string(w) + ")");
}

}  // namespace

NB_MODULE(_comm, m) {
  m.doc() = "deepio 1-bit compressed allreduce (C++ core); use deepio.comm instead of this module";

  g_invalid_argument_error =
      nb::object(nb::module_::import_("deepio._deepio").attr("InvalidArgumentError")).release().ptr();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dc::ArgumentError& e) {
      set_exception(e);
    } catch (const dc::CommError& e) {
      set_exception(e);
    }  // anything else goes on to the next translator (_deepio's)
  });

  m.def("best_kernel", [] { return dc::best_kernel() == dc::Kernel::avx2 ? "avx2" : "scalar"; });
  m.def("kernel_available", [](const std::string& k) { return dc::kernel_available(kernel_from(k)); });
  m.def("padded_size", &dc::padded_size, nb::arg("n"), nb::arg("world_size"));

  m.def(
      "compressed_allreduce",
      [](F32In input, F32Out output, F32Out worker_error, F32Out server_error, std::uintptr_t comm) {
        dc::compressed_allreduce(in_span(input), out_span(output), out_span(worker_error), out_span(server_error),
                                 comm_from_handle(comm));
      },
      nb::arg("input"), nb::arg("output").noconvert(), nb::arg("worker_error").noconvert(),
      nb::arg("server_error").noconvert(), nb::arg("comm_handle"), nb::call_guard<nb::gil_scoped_release>(),
      "MPI compressed allreduce of input into output (which may be the same array). Collective.");

  m.def(
      "pack_signs",
      [](F32In x, U8Out packed, const std::string& kernel) {
        dc::pack_signs(in_span(x), {packed.data(), packed.shape(0)}, kernel_from(kernel));
      },
      nb::arg("x"), nb::arg("packed").noconvert(), nb::arg("kernel") = "best",
      nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "unpack_signs",
      [](U8In packed, F32Out out, float scale, const std::string& kernel) {
        dc::unpack_signs({packed.data(), packed.shape(0)}, out_span(out), scale, kernel_from(kernel));
      },
      nb::arg("packed"), nb::arg("out").noconvert(), nb::arg("scale") = 1.0f, nb::arg("kernel") = "best",
      nb::call_guard<nb::gil_scoped_release>());

  // The stages of the torch.distributed transport (same agreement and wire layout as MPI).
  m.def(
      "agreement_message",
      [](F32Any input, F32Any output, F32Any worker_error, F32Any server_error, std::size_t w, int rank,
         Message message) {
        check_rank(w, rank);
        const dd::AgreementMessage msg = dd::agreement_message(call_args(input, output, worker_error, server_error), w,
                                                               rank);
        std::copy(msg.begin(), msg.end(), message.data());
      },
      nb::arg("input"), nb::arg("output"), nb::arg("worker_error"), nb::arg("server_error"), nb::arg("world_size"),
      nb::arg("rank"), nb::arg("message").noconvert(),
      "Size agreement, step 1: this rank's checks and lengths into message (7 int64), to be reduced with MAX "
      "over all ranks.");
  m.def(
      "agreement_verdict",
      [](Message reduced, F32Any input, F32Any output, F32Any worker_error, F32Any server_error, std::size_t w,
         int rank, const std::string& where) {
        check_rank(w, rank);
        dd::AgreementMessage msg;
        std::copy(reduced.data(), reduced.data() + msg.size(), msg.begin());
        dd::agreement_verdict(msg, call_args(input, output, worker_error, server_error), w, rank, where);
      },
      nb::arg("reduced"), nb::arg("input"), nb::arg("output"), nb::arg("worker_error"), nb::arg("server_error"),
      nb::arg("world_size"), nb::arg("rank"), nb::arg("where"),
      "Size agreement, step 2: raises deepio.InvalidArgumentError on every rank (or on none) from the reduced "
      "message.");
  m.def(
      "block_stride", [](std::size_t chunk) { return dd::block_stride(chunk); }, nb::arg("chunk"));
  m.def(
      "worker_stage",
      [](F32In input, F32Out worker_error, std::size_t w, U8Out send) {
        const std::size_t n = worker_error.shape(0);
        check_layout(input.shape(0), n, w);
        require(send.shape(0) == w * dd::block_stride(n / w), "send buffer must hold W * block_stride bytes");
        const dc::Kernel k = dc::best_kernel();
        auto* bytes = reinterpret_cast<std::byte*>(send.data());
        const float s = dd::worker_stage(input.data(), input.shape(0), worker_error.data(), n, w, bytes, k);
        dd::residual_pass(worker_error.data(), n, s, k);
        return s;
      },
      nb::arg("input"), nb::arg("worker_error").noconvert(), nb::arg("world_size"), nb::arg("send").noconvert(),
      nb::call_guard<nb::gil_scoped_release>(),
      "Worker side: compensate, scale, residual, pack W blocks into send. Returns the worker scale.");
  m.def(
      "server_stage",
      [](U8In recv, F32Out server_error, std::size_t w, U8Out own) {
        const std::size_t c = server_error.shape(0);
        require(w >= 1 && c % 8 == 0, "server_error length must be a multiple of 8");
        require(recv.shape(0) == w * dd::block_stride(c), "recv buffer must hold W * block_stride bytes");
        require(own.shape(0) == dd::block_stride(c), "own block must hold block_stride bytes");
        const dc::Kernel k = dc::best_kernel();
        const float s = dd::server_stage(reinterpret_cast<const std::byte*>(recv.data()), w, server_error.data(), c,
                                         reinterpret_cast<std::byte*>(own.data()), k);
        dd::residual_pass(server_error.data(), c, s, k);
        return s;
      },
      nb::arg("recv"), nb::arg("server_error").noconvert(), nb::arg("world_size"), nb::arg("own").noconvert(),
      nb::call_guard<nb::gil_scoped_release>(),
      "Server side: average the W received blocks, compensate, residual, pack into own. Returns the server scale.");
  m.def(
      "decode",
      [](U8In gathered, std::size_t w, std::size_t chunk, F32Out out) {
        require(w >= 1 && chunk % 8 == 0, "chunk must be a multiple of 8");
        require(gathered.shape(0) == w * dd::block_stride(chunk), "gathered must hold W * block_stride bytes");
        require(out.shape(0) <= w * chunk, "out is longer than W * chunk");
        const dc::Kernel k = dc::best_kernel();
        for (std::size_t b = 0; b < w; ++b)
          dd::decode_block(reinterpret_cast<const std::byte*>(gathered.data()), b, chunk, out.data(), out.shape(0), k);
      },
      nb::arg("gathered"), nb::arg("world_size"), nb::arg("chunk"), nb::arg("out").noconvert(),
      nb::call_guard<nb::gil_scoped_release>(), "Decode the W gathered server blocks into out.");
}
