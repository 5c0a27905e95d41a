// The MPI transport of the 1-bit compressed allreduce.
//
// Protocol of one call on a communicator of W ranks (every rank runs the same steps):
//   0. Agreement (the stage in stages.hpp that every transport runs): one MPI_Allreduce(MAX)
//      of 7 int64 carrying min/max of the three lengths and the lowest rank whose arguments
//      failed the local checks (with a reason code). Every rank decides from the same reduced
//      values, so either all ranks throw or none does; no rank can be left waiting in a
//      collective that the others skipped.
// Errors: ArgumentError from the checks and the agreement; CommError (errno EIO, the MPI error
// class and text) when an MPI call returns an error, which it does only under a non-fatal
// error handler. After a CommError the residuals and the output are unspecified.
//   1. Worker pass (one sweep): compensate, sum of squares, pack signs straight into the
//      all-to-all send buffer. Each destination block is [fp32 scale][B sign bytes], so the
//      signs and the scale travel in ONE MPI_Ialltoall (DeepSpeed uses W igathers per item
//      plus a second round for the scales).
//   2. While the all-to-all is in flight: turn worker_error from x into x - s*sgn(x), in
//      slices, calling MPI_Test between slices so that MPI progresses (Open MPI's TCP path
//      has no progress thread).
//   3. Server pass over the received blocks: average, compensate, square sums, pack into our
//      own slot of the all-gather buffer, which is then sent with MPI_IN_PLACE in ONE
//      MPI_Iallgather, again [scale][bytes] per rank.
//   4. While the all-gather is in flight: server residual, then decode our own chunk.
//   5. Decode the other W-1 chunks into the output.
// The output is written only in steps 4 and 5, after the input was last read in step 1, which
// is what makes input == output (in place) safe.
#include <deepio/comm.hpp>

#include "stages.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace deepio::comm {
namespace {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

// MPI's return code -> CommError (errno EIO) naming the call and MPI's own text.
void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  int cls = rc;
  if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;
  throw CommError(cls, std::string("deepio::comm::compressed_allreduce: ") + what + " failed: " + mpi_error_string(rc));
}

// Per-thread scratch, grown on demand and reused: the send/receive blocks of both phases.
struct Workspace {
  std::unique_ptr<std::byte[]> data;
  std::size_t capacity = 0;

  std::byte* get(std::size_t nbytes) {
    if (nbytes > capacity) {
      data.reset();  // free first: never hold old and new at once
      data = std::make_unique_for_overwrite<std::byte[]>(nbytes);
      capacity = nbytes;
    }
    return data.get();
  }
};
thread_local Workspace t_workspace;

// Slices for the overlapped passes: big enough to keep the kernels streaming, small enough
// that MPI_Test runs often (256 KiB of floats).
constexpr std::size_t kSlice = std::size_t{1} << 16;

// Runs fn(begin, end) over [0, n) in slices and drives `req` between slices.
template <class Fn>
void overlapped(std::size_t n, MPI_Request& req, bool& done, Fn&& fn) {
  for (std::size_t b = 0; b < n; b += kSlice) {
    fn(b, std::min(n, b + kSlice));
    if (!done) {
      int flag = 0;
      check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      done = flag != 0;
    }
  }
}

}  // namespace

CommError::CommError(int mpi_error_class, const std::string& message)
    : deepio::Error(EIO, message), mpi_error_class_(mpi_error_class) {}

const char* reason_name(Reason reason) noexcept {
  switch (reason) {
    case Reason::none: return "none";
    case Reason::output_size: return "output_size";
    case Reason::worker_not_multiple: return "worker_not_multiple";
    case Reason::server_size: return "server_size";
    case Reason::input_too_long: return "input_too_long";
    case Reason::output_overlap: return "output_overlap";
    case Reason::error_overlap: return "error_overlap";
    case Reason::too_large: return "too_large";
    case Reason::input_mismatch: return "input_mismatch";
    case Reason::worker_mismatch: return "worker_mismatch";
    case Reason::server_mismatch: return "server_mismatch";
  }
  return "unknown";
}

std::size_t padded_size(std::size_t n, std::size_t w) {
  if (w == 0) throw ArgumentError("deepio::comm::padded_size: w must be >= 1");
  const std::size_t m = 8 * w;
  return (n + m - 1) / m * m;
}

void compressed_allreduce(std::span<const float> input, std::span<float> output, std::span<float> worker_error,
                          std::span<float> server_error, MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized");
  if (!initialized || finalized)
    throw ArgumentError("deepio::comm::compressed_allreduce: MPI is not initialised (or already finalised)");
  if (comm == MPI_COMM_NULL) throw ArgumentError("deepio::comm::compressed_allreduce: comm is MPI_COMM_NULL");
  int inter = 0;
  check_mpi(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
  if (inter) throw ArgumentError("deepio::comm::compressed_allreduce: comm is an intercommunicator");
  int w_int = 0, rank = 0;
  check_mpi(MPI_Comm_size(comm, &w_int), "MPI_Comm_size");
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  const auto w = static_cast<std::size_t>(w_int);

  // 0. Size agreement (stages.hpp): every rank throws the same ArgumentError, or none does.
  const detail::CallArgs args{input.data(),        input.size(),        output.data(),       output.size(),
                              worker_error.data(), worker_error.size(), server_error.data(), server_error.size()};
  detail::AgreementMessage agree = detail::agreement_message(args, w, rank);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, agree.data(), static_cast<int>(agree.size()), MPI_INT64_T, MPI_MAX, comm),
            "MPI_Allreduce (size agreement)");
  detail::agreement_verdict(agree, args, w, rank, "deepio::comm::compressed_allreduce: ");
  const std::size_t n0 = input.size();
  const std::size_t n = worker_error.size();
  const std::size_t ns = server_error.size();

  if (n0 == 0) {  // DeepSpeed PR #7769: no exchange, residuals reset
    std::fill(worker_error.begin(), worker_error.end(), 0.0f);
    std::fill(server_error.begin(), server_error.end(), 0.0f);
    return;
  }

  const Kernel kernel = best_kernel();
  const std::size_t c = ns;  // elements per chunk
  const std::size_t stride = detail::block_stride(c);
  const int stride_int = static_cast<int>(stride);
  std::byte* const scratch = t_workspace.get(3 * w * stride);
  std::byte* const send1 = scratch;
  std::byte* const recv1 = scratch + w * stride;
  std::byte* const recv2 = scratch + 2 * w * stride;

  // 1. Worker pass, chunk by chunk into the send blocks.
  const float s_w = detail::worker_stage(input.data(), n0, worker_error.data(), n, w, send1, kernel);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoall(send1, stride_int, MPI_BYTE, recv1, stride_int, MPI_BYTE, comm, &req), "MPI_Ialltoall");

  // 2. Worker residual, overlapped with the all-to-all.
  bool done = false;
  overlapped(n, req, done,
             [&](std::size_t b, std::size_t e) { detail::residual_pass(worker_error.data() + b, e - b, s_w, kernel); });
  check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (all-to-all)");

  // 3. Server pass over the W received blocks, packing into our slot of the all-gather.
  const auto me = static_cast<std::size_t>(rank);
  const float s_s = detail::server_stage(recv1, w, server_error.data(), c, recv2 + me * stride, kernel);
  check_mpi(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv2, stride_int, MPI_BYTE, comm, &req),
            "MPI_Iallgather");

  // 4. Server residual and our own chunk of the output, overlapped with the all-gather.
  done = false;
  overlapped(c, req, done,
             [&](std::size_t b, std::size_t e) { detail::residual_pass(server_error.data() + b, e - b, s_s, kernel); });
  detail::decode_block(recv2, me, c, output.data(), n0, kernel);
  check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (all-gather)");

  // 5. Everyone else's chunks.
  for (std::size_t k = 0; k < w; ++k) {
    if (k != me) detail::decode_block(recv2, k, c, output.data(), n0, kernel);
  }
}

}  // namespace deepio::comm
