// deepio::comm — 1-bit compressed allreduce with error feedback (DeepSpeed's MpiBackend
// algorithm, "DoubleSqueeze" with scaled sign as the compressor), on any MPI communicator.
//
// The algorithm, bit for bit (docs/comm.md has the long version):
//
//   N0 = buffer length, N = worker_error length (the padded length), W = ranks in comm,
//   C = N / W elements per chunk, B = C / 8 bytes of signs per chunk.
//
//   worker, rank r:  x = pad(buffer, N) + worker_error           (padding is +0.0f)
//                    s_w = ||x||_2 / sqrt(N)
//                    worker_error = x - s_w * sgn(x)
//                    send the signs of chunk j and s_w to rank j  (one all-to-all)
//   server, rank r:  c = sum_{j=0..W-1} (s_w[j] * (1/W)) * sgn_j   (left to right, fp32)
//                    c = c + server_error
//                    s_s = ||c||_2 / sqrt(C)
//                    server_error = c - s_s * sgn(c)
//                    send the signs of c and s_s to every rank    (one all-gather)
//   everyone:        buffer[i] = s_s[k] * sgn(c_k)[i - kC]  for i < N0, k = i / C
//
//   sgn(x) = +1 if x >= 0 (including -0.0 and NaN), else -1; a sign bit is 1 for +1.
//   Packing is MSB first: element 8k+j is bit (7-j) of byte k (numpy/cupy bitorder='big').
//   All arithmetic is fp32 except the sum of squares inside ||.||, which is accumulated in
//   fp64 in a fixed order (8 interleaved lanes, lane l takes the elements i with i % 8 == l;
//   within a lane, leaves of 64 consecutive terms are summed in order and the leaves by a
//   perfect binary tree; lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))); sqrt of that
//   is rounded to fp32 and divided in fp32 by (float)sqrt(n). The result is therefore
//   deterministic and identical on every rank, independent of the instruction set used, and
//   reproducible with tensor operations on a GPU (docs/comm.md, "Norms").
//
// Sizes: N must be a multiple of 8*W, server_error must have N/W elements, and N0 <= N.
// Every rank must pass the same N0 and N. A violation on any rank raises ArgumentError on
// every rank of comm, with the same reason() everywhere: the ranks agree on the sizes (and on
// whether every rank's own arguments are valid) with one small MPI_Allreduce before any data
// moves, so a mistake never hangs the job. Every transport runs this same agreement (the
// torch.distributed transport of the Python package too); the reason codes are Reason below.
//
// Empty input (N0 == 0): both error buffers are zeroed and no data is exchanged (the size
// agreement collective still runs, so that "empty here, not there" is an error, not a hang).
#pragma once

#include <deepio/error.hpp>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace deepio::comm {

// Every failure of deepio::comm is a deepio::Error (a std::system_error whose code() is an
// errno in std::generic_category()): ArgumentError (EINVAL) or CommError (EIO). The old name
// deepio::comm::Error still catches them all.
using Error = deepio::Error;

// Why the ranks' arguments were refused: the reason codes of the size agreement, the same for
// every transport (docs/comm.md lists them). Codes 1..7 are checks of one rank's own
// arguments; 8..10 are lengths that are valid on each rank but differ across ranks.
enum class Reason : int {
  none = 0,                 // not an agreement failure (e.g. an unusable communicator)
  output_size = 1,          // output length differs from input length
  worker_not_multiple = 2,  // worker_error length is not a multiple of 8 * W
  server_size = 3,          // server_error length is not worker_error length / W
  input_too_long = 4,       // input is longer than worker_error
  output_overlap = 5,       // output partially overlaps input
  error_overlap = 6,        // worker_error or server_error overlaps another argument
  too_large = 7,            // one chunk of signs exceeds INT_MAX bytes
  input_mismatch = 8,       // input length differs across ranks
  worker_mismatch = 9,      // worker_error length differs across ranks
  server_mismatch = 10,     // server_error length differs across ranks
};

// The reason's name as written above ("worker_not_multiple", ...); "unknown" for other values.
const char* reason_name(Reason reason) noexcept;

// Bad sizes, aliasing buffers, an unknown kernel, or a communicator we cannot use: a
// deepio::InvalidArgument (errno EINVAL, invalid_argument() true; Python:
// deepio.InvalidArgumentError, a ValueError). Raised on every rank of the communicator when
// the size agreement fails (reason() says why; what() names the lowest failing rank); raised
// on the calling rank only, before any communication, when comm itself is unusable
// (MPI_COMM_NULL, an intercommunicator, MPI not initialised or already finalised) or for the
// local functions (pack_signs, padded_size, ...): then reason() is Reason::none.
class ArgumentError : public InvalidArgument {
 public:
  explicit ArgumentError(const std::string& message, Reason reason = Reason::none, int rank = -1)
      : InvalidArgument(message), reason_(reason), rank_(rank) {}

  // The agreement's reason code; Reason::none when no agreement was involved.
  [[nodiscard]] Reason reason() const noexcept { return reason_; }
  // The lowest rank whose own arguments failed (reasons 1..7); -1 otherwise.
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  Reason reason_;
  int rank_;
};

// An MPI call failed: errno EIO, what() names the call and MPI's error string. Only possible
// when comm's error handler is not MPI_ERRORS_ARE_FATAL (MPI's default, under which MPI aborts
// the job itself). Python: OSError with errno EIO and the attribute mpi_error_class.
class CommError : public deepio::Error {
 public:
  CommError(int mpi_error_class, const std::string& message);

  // The MPI error class (MPI_Error_class of the code the call returned).
  [[nodiscard]] int mpi_error_class() const noexcept { return mpi_error_class_; }

 private:
  int mpi_error_class_;
};

// The packing/unpacking code paths. `best` picks AVX2 when the CPU has it (checked once at
// run time), else the portable scalar code. Both give identical bytes and floats.
enum class Kernel { best, scalar, avx2 };

// True when `kernel` can run on this CPU (best and scalar: always).
bool kernel_available(Kernel kernel) noexcept;

// The kernel that Kernel::best resolves to on this machine.
Kernel best_kernel() noexcept;

// Packs sign bits: bit = 1 iff !(x < 0) (so +0, -0 and NaN give 1), MSB first. packed must
// hold at least ceil(x.size() / 8) bytes; the unused low bits of the last byte are written 0
// (as numpy.packbits does) and bytes after ceil(x.size() / 8) are left alone.
// Throws ArgumentError if packed is too small or `kernel` is unavailable. Thread-safe (pure).
void pack_signs(std::span<const float> x, std::span<std::uint8_t> packed, Kernel kernel = Kernel::best);

// Unpacks: out[i] = bit(i) ? scale : -scale (the sign flip is exact, so -scale is bitwise
// scale with its sign bit flipped). packed must hold at least ceil(out.size() / 8) bytes.
// Throws ArgumentError if packed is too small or `kernel` is unavailable. Thread-safe (pure).
void unpack_signs(std::span<const std::uint8_t> packed, std::span<float> out, float scale = 1.0f,
                  Kernel kernel = Kernel::best);

// The 1-bit compressed allreduce described at the top of this file, writing into `output`.
//
// input          this rank's values (N0 = input.size()); only read.
// output         receives the first N0 elements of the averaged result; output.size() must
//                equal input.size(). output may be the same memory as input (exactly the same
//                span: in place); any other overlap is an ArgumentError.
// worker_error   N floats of persistent worker residual; updated in place (the same memory
//                holds the new residual, so views of it stay valid; DeepSpeed instead rebinds
//                the tensor to new storage). Must not overlap any other argument.
// server_error   N/W floats of persistent server residual for this rank's chunk; updated in
//                place. Must not overlap any other argument.
// comm           any intracommunicator (MPI_COMM_WORLD or a sub-communicator). The call is
//                collective: every rank of comm must call it, in the same order relative to
//                other collectives on comm.
//
// All ranks end with the same output bytes. Padding positions (N0..N) take part in the
// norms and keep their residual in worker_error, as in DeepSpeed.
//
// Errors: ArgumentError (see above) on every rank; CommError if an MPI call fails under a
// non-fatal error handler (then the residuals and the output are unspecified).
// Thread-safety: calls on different communicators may run concurrently if MPI was
// initialised with MPI_THREAD_MULTIPLE; calls on one communicator must not overlap. Each
// thread keeps a scratch workspace of about 3N/8 bytes that it reuses across calls and frees
// at thread exit.
// Buffer lifetimes: all spans are used only during the call; nothing is retained.
void compressed_allreduce(std::span<const float> input, std::span<float> output, std::span<float> worker_error,
                          std::span<float> server_error, MPI_Comm comm);

// In-place form: buffer is both input and output (DeepSpeed's unpadded case, N0 == N, where
// the caller's tensor ends up holding the result; here it does for any N0 <= N).
inline void compressed_allreduce(std::span<float> buffer, std::span<float> worker_error, std::span<float> server_error,
                                 MPI_Comm comm) {
  compressed_allreduce(std::span<const float>(buffer), buffer, worker_error, server_error, comm);
}

// The smallest valid worker_error length for n elements on w ranks: n rounded up to a
// multiple of 8*w (the rule DeepSpeed's tests use; its optimizers round further, to a
// multiple of w*lcm(w, 8), which is also valid). w must be >= 1.
std::size_t padded_size(std::size_t n, std::size_t w);

}  // namespace deepio::comm
