// The MPI transport of the 1-bit compressed allreduce.
//
// Protocol of one call on a communicator of W ranks (every rank runs the same steps):
//   0. Agreement: one MPI_Allreduce(MAX) of 7 int64 carrying min/max of the three lengths and
//      the lowest rank whose arguments failed the local checks (with a reason code). Every rank
//      decides from the same reduced values, so either all ranks throw or none does; no rank
//      can be left waiting in a collective that the others skipped.
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
#include <climits>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace deepio::comm {
namespace {

class MpiCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "mpi"; }
  std::string message(int code) const override {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<std::size_t>(len));
  }
};

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  throw Error(std::error_code(cls, mpi_category()), std::string("deepio::comm::compressed_allreduce: ") + what);
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

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// Reasons a rank's own arguments fail; the code travels in the agreement collective.
enum Reason : int {
  kOk = 0,
  kOutputSize,
  kWorkerNotMultiple,
  kServerSize,
  kInputTooLong,
  kOutputOverlap,
  kErrorOverlap,
  kTooLarge,
  kReasonCount
};

std::string reason_text(int reason, int w) {
  const std::string ws = std::to_string(w);
  switch (reason) {
    case kOutputSize:
      return "output length differs from input length";
    case kWorkerNotMultiple:
      return "worker_error length is not a multiple of 8 * W (W = " + ws + ")";
    case kServerSize:
      return "server_error length is not worker_error length / W (W = " + ws + ")";
    case kInputTooLong:
      return "input is longer than worker_error";
    case kOutputOverlap:
      return "output partially overlaps input (it must be the same span or disjoint)";
    case kErrorOverlap:
      return "worker_error or server_error overlaps another argument";
    case kTooLarge:
      return "one chunk of signs exceeds INT_MAX bytes";
    default:
      return "unknown";
  }
}

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

const std::error_category& mpi_category() noexcept {
  static const MpiCategory category;
  return category;
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

  const std::size_t n0 = input.size();
  const std::size_t n = worker_error.size();
  const std::size_t ns = server_error.size();
  const std::size_t f = sizeof(float);

  // Local checks, in a fixed order so that the reported reason is deterministic.
  int reason = kOk;
  if (output.size() != n0) reason = kOutputSize;
  else if (n % (8 * w) != 0) reason = kWorkerNotMultiple;
  else if (ns * w != n) reason = kServerSize;
  else if (n0 > n) reason = kInputTooLong;
  else if (output.data() != input.data() && overlaps(output.data(), n0 * f, input.data(), n0 * f))
    reason = kOutputOverlap;
  else if (overlaps(worker_error.data(), n * f, server_error.data(), ns * f) ||
           overlaps(worker_error.data(), n * f, input.data(), n0 * f) ||
           overlaps(worker_error.data(), n * f, output.data(), n0 * f) ||
           overlaps(server_error.data(), ns * f, input.data(), n0 * f) ||
           overlaps(server_error.data(), ns * f, output.data(), n0 * f))
    reason = kErrorOverlap;
  else if (ns / 8 + sizeof(float) > static_cast<std::size_t>(INT_MAX)) reason = kTooLarge;

  // Agreement. MAX of -x is -min(x); the failure slot holds -(rank * kReasonCount + reason)
  // so that MAX picks the lowest failing rank together with its reason.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  std::int64_t agree[7] = {i64(n0),
                           -i64(n0),
                           i64(n),
                           -i64(n),
                           i64(ns),
                           -i64(ns),
                           reason == kOk ? kNone : -(std::int64_t{rank} * kReasonCount + reason)};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, agree, 7, MPI_INT64_T, MPI_MAX, comm), "MPI_Allreduce (size agreement)");
  const std::string where = "deepio::comm::compressed_allreduce: ";
  if (agree[6] != kNone) {
    const std::int64_t code = -agree[6];
    const auto bad_rank = static_cast<int>(code / kReasonCount);
    const auto bad_reason = static_cast<int>(code % kReasonCount);
    throw ArgumentError(where + "invalid arguments on rank " + std::to_string(bad_rank) + " of " + std::to_string(w) +
                        ": " + reason_text(bad_reason, w_int) +
                        (bad_rank == rank ? " (input " + std::to_string(n0) + ", worker_error " + std::to_string(n) +
                                                ", server_error " + std::to_string(ns) + " elements)"
                                          : std::string()));
  }
  const auto mismatch = [&](const char* what, std::int64_t hi, std::int64_t lo) {
    return ArgumentError(where + what + " length differs across ranks (min " + std::to_string(lo) + ", max " +
                         std::to_string(hi) + ")");
  };
  if (agree[0] != -agree[1]) throw mismatch("input", agree[0], -agree[1]);
  if (agree[2] != -agree[3]) throw mismatch("worker_error", agree[2], -agree[3]);
  if (agree[4] != -agree[5]) throw mismatch("server_error", agree[4], -agree[5]);

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
