// The transport-independent steps of one compressed allreduce, over the wire layout that every
// transport uses. Both the MPI transport (comm.cpp) and the torch.distributed transport
// (python/deepio/comm, through the _comm module) call these, so the checks, the bytes on the
// wire and the arithmetic are the same whichever transport runs. A transport supplies three
// collectives (an int64 MAX-allreduce, an all-to-all and an all-gather of byte blocks) and
// runs: agreement_message -> allreduce(MAX) -> agreement_verdict -> worker_stage ->
// all-to-all -> server_stage -> all-gather -> decode_block.
//
// Size agreement (stage 0). Every rank checks its own arguments (check_arguments) and puts
// its lengths and the verdict into 7 int64:
//     [n0, -n0, n, -n, ns, -ns, failure]
// failure = -(rank * kReasonSlots + reason) when the rank's own checks failed, else INT64_MIN.
// The transport reduces the message element-wise with MAX over all ranks, so the reduced
// message holds the max and -min of each length and the lowest failing rank with its reason.
// agreement_verdict then decides from those same values on every rank: all ranks throw an
// ArgumentError with the same reason and rank (the failing rank's text also states its own
// lengths) or none does, and no rank is left waiting in a collective the others skipped. Only
// after it returns may a transport move data.
//
// Wire layout: a "block" is [fp32 scale, native byte order][B sign bytes], B = C / 8, and is
// `stride` = B + 4 bytes long. Phase 1 sends block j of the worker buffer (W blocks) to rank
// j (an all-to-all); phase 2 gathers each rank's one server block into W blocks (an
// all-gather). Block k of either buffer starts at k * stride.
//
// Preconditions of the data stages (checked by the agreement, not by them): n % (8 * w) == 0,
// c == n / w, n0 <= n, buffers of the sizes stated, no overlaps except in == out.
#pragma once

#include "kernels.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace deepio::comm::detail {

// One rank's arguments of one call: input (n0 floats), output (n_out), worker_error (n),
// server_error (ns). Pointers are only compared, never dereferenced.
struct CallArgs {
  const float* input = nullptr;
  std::size_t n0 = 0;
  const float* output = nullptr;
  std::size_t n_out = 0;
  const float* worker_error = nullptr;
  std::size_t n = 0;
  const float* server_error = nullptr;
  std::size_t ns = 0;
};

// Reasons 1..7 (a rank's own arguments) travel in the failure slot; this is their modulus.
inline constexpr std::int64_t kReasonSlots = 8;
using AgreementMessage = std::array<std::int64_t, 7>;

// The length rules alone (reasons 1..4), for w ranks, in a fixed order so that the reported
// reason is deterministic. Reason::none when they hold.
Reason check_lengths(std::size_t n0, std::size_t n_out, std::size_t n, std::size_t ns, std::size_t w) noexcept;

// All checks of one rank's arguments (reasons 1..7): check_lengths, then overlaps, then the
// INT_MAX limit on one block (MPI counts are int).
Reason check_arguments(const CallArgs& args, std::size_t w) noexcept;

// The text of a reason for w ranks, e.g. "worker_error length is not a multiple of 8 * W (W = 4)".
std::string reason_text(Reason reason, std::size_t w);

// This rank's agreement message (runs check_arguments). w >= 1, 0 <= rank < w.
AgreementMessage agreement_message(const CallArgs& args, std::size_t w, int rank) noexcept;

// Decides from the MAX-reduced message: returns when every rank's arguments were valid and
// all lengths agree; otherwise throws ArgumentError(where + text, reason, rank) -- the same
// on every rank, except that the failing rank's own message also states its lengths.
void agreement_verdict(const AgreementMessage& reduced, const CallArgs& args, std::size_t w, int rank,
                       const std::string& where);

inline std::size_t block_stride(std::size_t c) noexcept { return c / 8 + sizeof(float); }

// Worker pass over all W chunks into the W blocks of `send` (scale headers included). Leaves
// x = in + ew in ew; returns s_w. Call residual_pass(ew, n, s_w) afterwards (it may overlap
// the exchange of `send`).
float worker_stage(const float* in, std::size_t n0, float* ew, std::size_t n, std::size_t w, std::byte* send,
                   Kernel kernel) noexcept;

// Server pass over the W received blocks of `recv` into the single block `own` (header
// included). Leaves c in es; returns s_s. Call residual_pass(es, c, s_s) afterwards.
float server_stage(const std::byte* recv, std::size_t w, float* es, std::size_t c, std::byte* own, Kernel kernel);

// Writes block k of the gathered server blocks into out[k*c, min(n0, (k+1)*c)).
void decode_block(const std::byte* gathered, std::size_t k, std::size_t c, float* out, std::size_t n0,
                  Kernel kernel) noexcept;

}  // namespace deepio::comm::detail
