// The transport-independent steps of one compressed allreduce, over the wire layout that every
// transport uses. Both the MPI transport (comm.cpp) and the torch.distributed transport
// (python/deepio/comm, through the _comm module) call these, so the bytes on the wire and the
// arithmetic are the same whichever transport runs.
//
// Wire layout: a "block" is [fp32 scale, native byte order][B sign bytes], B = C / 8, and is
// `stride` = B + 4 bytes long. Phase 1 sends block j of the worker buffer (W blocks) to rank
// j (an all-to-all); phase 2 gathers each rank's one server block into W blocks (an
// all-gather). Block k of either buffer starts at k * stride.
//
// Preconditions (checked by the callers, not here): n % (8 * w) == 0, c == n / w, n0 <= n,
// buffers of the sizes stated, no overlaps except in == out.
#pragma once

#include "kernels.hpp"

#include <cstddef>

namespace deepio::comm::detail {

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
