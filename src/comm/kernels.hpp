// The arithmetic of the 1-bit compressed allreduce, without any transport: each pass is one
// sweep over memory, fused so that every float is read and written at most once per pass.
// The MPI transport (comm.cpp) and the torch.distributed transport (python/deepio/comm) both
// drive these passes, so they compute the same bits.
//
// Invariants shared by every pass:
//   - bit(x) = !(x < 0): +0, -0 and NaN give 1. Bits are packed MSB first (element 8k+j is
//     bit 7-j of byte k).
//   - Sums of squares go into SumSq, in an order that is fixed by the index alone, so that any
//     implementation (these kernels, the torch-ops path of python/deepio/comm/_torchops.py on
//     a CPU or a GPU) computes the same fp64 bits: element i (counted from the start of the
//     vector whose norm is taken; chunks start at multiples of 8) is in row i / 8, lane i % 8.
//     Rows are grouped into leaves of kLeafRows consecutive rows; within a leaf, lane l sums
//     x*x (exact in fp64) row by row in increasing order, starting from +0.0. The leaves are
//     summed by a perfect binary tree over leaf indices (zero leaves pad it to a power of
//     two; adding +0.0 to a sum of squares changes nothing), lane by lane, and the 8 lanes
//     are combined ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). A stream builds the tree with a
//     binary counter (one full subtree per set bit), which is why SumSq carries a stack.
//     Every kernel honours this order, so scalar, AVX2 and torch results are bitwise identical.
//   - Lengths passed as `n` to the fused passes are multiples of 8 (whole bytes).
// Thread-safety: all functions are pure over their arguments.
#pragma once

#include <deepio/comm.hpp>

#include <cstddef>
#include <cstdint>

namespace deepio::comm::detail {

struct SumSq {
  static constexpr unsigned kLeafRows = 64;  // rows of 8 elements per leaf (512 elements)

  double lane[8] = {};         // the current leaf: lane l summed over its rows so far
  unsigned rows = 0;           // rows in the current leaf, < kLeafRows between calls
  std::uint64_t occupied = 0;  // bit h set: level[h] holds a full subtree of 2^h leaves
  double level[64][8] = {};    // the binary counter of finished subtrees

  // Call after a row's 8 squares were added to lane[]: closes the leaf after kLeafRows rows.
  void end_row() noexcept {
    if (++rows == kLeafRows) push_leaf();
  }
  // Adds the current leaf to the counter (merging equal subtrees) and starts a new leaf.
  void push_leaf() noexcept;
  // The fp64 sum of squares: the pending leaf and the subtrees folded from the lowest level
  // up (the zero-padded perfect tree), then the lanes combined as stated above.
  double total() const noexcept;
};

// ||v|| / sqrt(n) as documented in comm.hpp: (float)sqrt(total) / (float)sqrt((double)n).
float scale_of(const SumSq& acc, std::size_t n) noexcept;

// Resolves Kernel::best and checks availability; throws ArgumentError for an unavailable one.
Kernel resolve(Kernel kernel);

// Worker pass over n elements (n % 8 == 0): x[i] = (i < n_in ? in[i] : 0.0f) + ew[i];
// ew[i] = x[i] (the compensated value, turned into the residual later by residual_pass);
// acc += x[i]^2; packed[i / 8] gets bit(x[i]). in may be null when n_in == 0. n_in may be
// anything (also > n: only the first n are read).
void worker_pass(const float* in, std::size_t n_in, float* ew, std::size_t n, std::uint8_t* packed, SumSq& acc,
                 Kernel kernel) noexcept;

// Residual: e[i] = e[i] - (bit(e[i]) ? s : -s), for any n.
void residual_pass(float* e, std::size_t n, float s, Kernel kernel) noexcept;

// Server pass over n elements (n % 8 == 0) of the chunk this rank owns. blocks[j] points at
// the n/8 sign bytes received from rank j, t[j] = s_w[j] * (float)(1.0 / w).
//   c[i] = sum over j = 0..w-1, left to right, of (bit_j(i) ? t[j] : -t[j])   (fp32;
//          the sum starts from the j = 0 term itself)
//   c[i] = c[i] + es[i];  es[i] = c[i];  acc += c[i]^2;  packed[i / 8] gets bit(c[i]).
void server_pass(const std::uint8_t* const* blocks, const float* t, std::size_t w, float* es, std::size_t n,
                 std::uint8_t* packed, SumSq& acc, Kernel kernel) noexcept;

// Unchecked forms of pack_signs/unpack_signs (any n; kernel already resolved).
void pack(const float* x, std::size_t n, std::uint8_t* packed, Kernel kernel) noexcept;
void unpack(const std::uint8_t* packed, std::size_t n, float* out, float scale, Kernel kernel) noexcept;

}  // namespace deepio::comm::detail
