// Scalar and AVX2 versions of the fused passes declared in kernels.hpp. The AVX2 functions
// carry target attributes and run only after __builtin_cpu_supports("avx2") said yes, so the
// library builds for baseline x86-64 and still uses AVX2 where the CPU has it.
//
// Bitwise equality of the two paths rests on three facts: (1) the fp32 operations are the
// same operations in the same order (x = in + e; c = t0 (+) t1 (+) ... (+) es; e = x - v),
// (2) a sign flip is exact, so "bit ? s : -s" equals "s XOR signmask", and (3) a float squared
// is exact in fp64, so each SumSq lane sees the same fp64 additions in the same order.
#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DEEPIO_COMM_X86 1
#else
#define DEEPIO_COMM_X86 0
#endif

namespace deepio::comm::detail {
namespace {

inline std::uint8_t bit_of(float x) noexcept { return x < 0.0f ? 0 : 1; }

// kPackFromNeg[m]: the packed byte for 8 floats whose "x < 0" mask is m (bit j = lane j).
constexpr std::array<std::uint8_t, 256> make_pack_table() {
  std::array<std::uint8_t, 256> t{};
  for (unsigned m = 0; m < 256; ++m) {
    unsigned b = 0;
    for (unsigned j = 0; j < 8; ++j) {
      if (((m >> j) & 1u) == 0) b |= 1u << (7 - j);
    }
    t[m] = static_cast<std::uint8_t>(b);
  }
  return t;
}
constexpr std::array<std::uint8_t, 256> kPackFromNeg = make_pack_table();

// kSignMask[b][j]: 0x80000000 where bit 7-j of byte b is 0 (value -s), else 0 (value +s).
struct SignMaskTable {
  alignas(32) std::uint32_t m[256][8];
};
constexpr SignMaskTable make_sign_table() {
  SignMaskTable t{};
  for (unsigned b = 0; b < 256; ++b) {
    for (unsigned j = 0; j < 8; ++j) t.m[b][j] = ((b >> (7 - j)) & 1u) ? 0u : 0x80000000u;
  }
  return t;
}
constexpr SignMaskTable kSignMask = make_sign_table();

// ---- scalar -------------------------------------------------------------------------------

void pack_scalar(const float* x, std::size_t n, std::uint8_t* out) noexcept {
  const std::size_t full = n / 8;
  for (std::size_t k = 0; k < full; ++k) {
    unsigned b = 0;
    for (unsigned j = 0; j < 8; ++j) b |= static_cast<unsigned>(bit_of(x[8 * k + j])) << (7 - j);
    out[k] = static_cast<std::uint8_t>(b);
  }
  if (const std::size_t rem = n % 8; rem != 0) {
    unsigned b = 0;
    for (std::size_t j = 0; j < rem; ++j) b |= static_cast<unsigned>(bit_of(x[8 * full + j])) << (7 - j);
    out[full] = static_cast<std::uint8_t>(b);
  }
}

// s with its sign bit flipped where kSignMask says so: exactly "bit ? s : -s", branch-free.
inline float signed_scale(std::uint32_t s_bits, std::uint8_t byte, unsigned j) noexcept {
  const std::uint32_t v = s_bits ^ kSignMask.m[byte][j];
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}

inline std::uint32_t bits_of(float s) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &s, sizeof b);
  return b;
}

void unpack_scalar(const std::uint8_t* p, std::size_t begin, std::size_t n, float* out, float s) noexcept {
  const std::uint32_t sb = bits_of(s);
  std::size_t i = begin;
  for (; i < n && (i & 7) != 0; ++i) out[i] = ((p[i >> 3] >> (7 - (i & 7))) & 1u) ? s : -s;
  for (; i + 8 <= n; i += 8) {
    const std::uint8_t byte = p[i >> 3];
    for (unsigned j = 0; j < 8; ++j) out[i + j] = signed_scale(sb, byte, j);
  }
  for (; i < n; ++i) out[i] = ((p[i >> 3] >> (7 - (i & 7))) & 1u) ? s : -s;
}

// One group of 8 worker elements starting at element g (used for every group by the scalar
// kernel and for the group that straddles the end of the input by the AVX2 kernel).
inline void worker_group(const float* in, std::size_t n_in, float* ew, std::size_t g, std::uint8_t* packed,
                         SumSq& acc) noexcept {
  unsigned b = 0;
  for (unsigned j = 0; j < 8; ++j) {
    const std::size_t i = g + j;
    const float x = (i < n_in ? in[i] : 0.0f) + ew[i];
    ew[i] = x;
    acc.lane[j] += static_cast<double>(x) * static_cast<double>(x);
    b |= static_cast<unsigned>(bit_of(x)) << (7 - j);
  }
  packed[g / 8] = static_cast<std::uint8_t>(b);
  acc.end_row();
}

void worker_scalar(const float* in, std::size_t n_in, float* ew, std::size_t n, std::uint8_t* packed,
                   SumSq& acc) noexcept {
  for (std::size_t g = 0; g < n; g += 8) worker_group(in, n_in, ew, g, packed, acc);
}

void residual_scalar(float* e, std::size_t begin, std::size_t n, float s) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    const float x = e[i];
    e[i] = x - (bit_of(x) ? s : -s);
  }
}

void server_scalar(const std::uint8_t* const* blocks, const float* t, std::size_t w, float* es, std::size_t n,
                   std::uint8_t* packed, SumSq& acc) noexcept {
  std::vector<std::uint32_t> tb(w);
  for (std::size_t j = 0; j < w; ++j) tb[j] = bits_of(t[j]);
  for (std::size_t k = 0; k < n / 8; ++k) {
    float c[8];
    for (unsigned jj = 0; jj < 8; ++jj) c[jj] = signed_scale(tb[0], blocks[0][k], jj);
    for (std::size_t j = 1; j < w; ++j) {
      const std::uint8_t byte = blocks[j][k];
      for (unsigned jj = 0; jj < 8; ++jj) c[jj] = c[jj] + signed_scale(tb[j], byte, jj);
    }
    unsigned b = 0;
    for (unsigned jj = 0; jj < 8; ++jj) {
      const std::size_t i = 8 * k + jj;
      const float v = c[jj] + es[i];
      es[i] = v;
      acc.lane[jj] += static_cast<double>(v) * static_cast<double>(v);
      b |= static_cast<unsigned>(bit_of(v)) << (7 - jj);
    }
    packed[k] = static_cast<std::uint8_t>(b);
    acc.end_row();
  }
}

// ---- AVX2 ---------------------------------------------------------------------------------

#if DEEPIO_COMM_X86
#define DEEPIO_AVX2 __attribute__((target("avx2")))

DEEPIO_AVX2 inline std::uint8_t pack8_avx2(__m256 x) noexcept {
  const int neg = _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  return kPackFromNeg[static_cast<unsigned>(neg)];
}

DEEPIO_AVX2 inline __m256 sign_mask_avx2(std::uint8_t byte) noexcept {
  return _mm256_load_ps(reinterpret_cast<const float*>(kSignMask.m[byte]));
}

// lo/hi hold SumSq lanes 0-3 and 4-7.
DEEPIO_AVX2 inline void square_add_avx2(__m256 x, __m256d& lo, __m256d& hi) noexcept {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
  hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
}

// Counts the row just added to lo/hi and, when the leaf is full, adds it to the counter of
// subtrees (SumSq::push_leaf in registers: the h lowest set bits of `occupied` are merged,
// then occupied + 1 clears them and sets bit h). The count lives in a local (`rows`, written
// back to acc.rows by the caller): acc.rows in memory would be reloaded after every byte
// store to `packed`, which may alias it.
DEEPIO_AVX2 inline void end_row_avx2(SumSq& acc, unsigned& rows, __m256d& lo, __m256d& hi) noexcept {
  if (++rows != SumSq::kLeafRows) return;
  const unsigned h = static_cast<unsigned>(std::countr_one(acc.occupied));
  for (unsigned i = 0; i < h; ++i) {
    lo = _mm256_add_pd(_mm256_loadu_pd(acc.level[i]), lo);
    hi = _mm256_add_pd(_mm256_loadu_pd(acc.level[i] + 4), hi);
  }
  _mm256_storeu_pd(acc.level[h], lo);
  _mm256_storeu_pd(acc.level[h] + 4, hi);
  acc.occupied += 1;
  rows = 0;
  lo = _mm256_setzero_pd();
  hi = _mm256_setzero_pd();
}

DEEPIO_AVX2 void pack_avx2(const float* x, std::size_t n, std::uint8_t* out) noexcept {
  const std::size_t full = n / 8;
  std::size_t k = 0;
  for (; k + 4 <= full; k += 4) {
    const std::uint32_t word = static_cast<std::uint32_t>(pack8_avx2(_mm256_loadu_ps(x + 8 * k))) |
                               static_cast<std::uint32_t>(pack8_avx2(_mm256_loadu_ps(x + 8 * k + 8))) << 8 |
                               static_cast<std::uint32_t>(pack8_avx2(_mm256_loadu_ps(x + 8 * k + 16))) << 16 |
                               static_cast<std::uint32_t>(pack8_avx2(_mm256_loadu_ps(x + 8 * k + 24))) << 24;
    std::memcpy(out + k, &word, 4);  // little-endian: byte k first
  }
  for (; k < full; ++k) out[k] = pack8_avx2(_mm256_loadu_ps(x + 8 * k));
  if (n % 8 != 0) pack_scalar(x + 8 * full, n % 8, out + full);
}

DEEPIO_AVX2 void unpack_avx2(const std::uint8_t* p, std::size_t n, float* out, float s) noexcept {
  const __m256 sv = _mm256_set1_ps(s);
  const std::size_t full = n / 8;
  for (std::size_t k = 0; k < full; ++k) _mm256_storeu_ps(out + 8 * k, _mm256_xor_ps(sv, sign_mask_avx2(p[k])));
  unpack_scalar(p, 8 * full, n, out, s);
}

DEEPIO_AVX2 void worker_avx2(const float* in, std::size_t n_in, float* ew, std::size_t n, std::uint8_t* packed,
                             SumSq& acc) noexcept {
  const std::size_t groups = n / 8;
  const std::size_t in_groups = std::min(n_in, n) / 8;  // groups fully covered by the input
  __m256d lo = _mm256_loadu_pd(acc.lane);
  __m256d hi = _mm256_loadu_pd(acc.lane + 4);
  unsigned rows = acc.rows;
  std::size_t k = 0;
  for (; k < in_groups; ++k) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(in + 8 * k), _mm256_loadu_ps(ew + 8 * k));
    _mm256_storeu_ps(ew + 8 * k, x);
    square_add_avx2(x, lo, hi);
    packed[k] = pack8_avx2(x);
    end_row_avx2(acc, rows, lo, hi);
  }
  if (k < groups && 8 * k < n_in) {  // the group where the input ends mid-byte
    _mm256_storeu_pd(acc.lane, lo);
    _mm256_storeu_pd(acc.lane + 4, hi);
    acc.rows = rows;
    worker_group(in, n_in, ew, 8 * k, packed, acc);
    lo = _mm256_loadu_pd(acc.lane);
    hi = _mm256_loadu_pd(acc.lane + 4);
    rows = acc.rows;
    ++k;
  }
  const __m256 zero = _mm256_setzero_ps();
  for (; k < groups; ++k) {  // padding: x = 0.0f + ew
    const __m256 x = _mm256_add_ps(zero, _mm256_loadu_ps(ew + 8 * k));
    _mm256_storeu_ps(ew + 8 * k, x);
    square_add_avx2(x, lo, hi);
    packed[k] = pack8_avx2(x);
    end_row_avx2(acc, rows, lo, hi);
  }
  _mm256_storeu_pd(acc.lane, lo);
  _mm256_storeu_pd(acc.lane + 4, hi);
  acc.rows = rows;
}

DEEPIO_AVX2 void residual_avx2(float* e, std::size_t n, float s) noexcept {
  const __m256 sv = _mm256_set1_ps(s);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 zero = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(e + i);
    const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), sign);
    _mm256_storeu_ps(e + i, _mm256_sub_ps(x, _mm256_xor_ps(sv, neg)));
  }
  residual_scalar(e, i, n, s);
}

DEEPIO_AVX2 void server_avx2(const std::uint8_t* const* blocks, const float* t, std::size_t w, float* es, std::size_t n,
                             std::uint8_t* packed, SumSq& acc) noexcept {
  __m256d lo = _mm256_loadu_pd(acc.lane);
  __m256d hi = _mm256_loadu_pd(acc.lane + 4);
  const __m256 t0 = _mm256_set1_ps(t[0]);
  unsigned rows = acc.rows;
  for (std::size_t k = 0; k < n / 8; ++k) {
    __m256 c = _mm256_xor_ps(t0, sign_mask_avx2(blocks[0][k]));
    for (std::size_t j = 1; j < w; ++j)
      c = _mm256_add_ps(c, _mm256_xor_ps(_mm256_broadcast_ss(t + j), sign_mask_avx2(blocks[j][k])));
    c = _mm256_add_ps(c, _mm256_loadu_ps(es + 8 * k));
    _mm256_storeu_ps(es + 8 * k, c);
    square_add_avx2(c, lo, hi);
    packed[k] = pack8_avx2(c);
    end_row_avx2(acc, rows, lo, hi);
  }
  _mm256_storeu_pd(acc.lane, lo);
  _mm256_storeu_pd(acc.lane + 4, hi);
  acc.rows = rows;
}
#endif  // DEEPIO_COMM_X86

bool cpu_has_avx2() noexcept {
#if DEEPIO_COMM_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace

void SumSq::push_leaf() noexcept {
  double carry[8];
  std::memcpy(carry, lane, sizeof carry);
  // The h lowest bits are set: merge those subtrees (earlier leaves on the left); then
  // occupied + 1 clears them and sets bit h (a binary counter).
  const auto h = static_cast<unsigned>(std::countr_one(occupied));
  for (unsigned i = 0; i < h; ++i) {
    for (unsigned l = 0; l < 8; ++l) carry[l] = level[i][l] + carry[l];
  }
  std::memcpy(level[h], carry, sizeof carry);
  occupied += 1;
  std::fill(std::begin(lane), std::end(lane), 0.0);
  rows = 0;
}

double SumSq::total() const noexcept {
  // The perfect tree over the leaves padded with zero leaves: at each level the node on the
  // path of the last (partial) leaf is (full left subtree) + (node below), or (node below) + 0,
  // which is exact. Hence the fold from the lowest level up.
  double acc[8];
  bool any = rows != 0;
  std::memcpy(acc, lane, sizeof acc);
  for (unsigned h = 0; h < 64; ++h) {
    if (!((occupied >> h) & 1u)) continue;
    for (unsigned l = 0; l < 8; ++l) acc[l] = any ? level[h][l] + acc[l] : level[h][l];
    any = true;
  }
  if (!any) return 0.0;
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float scale_of(const SumSq& acc, std::size_t n) noexcept {
  const float norm = static_cast<float>(std::sqrt(acc.total()));
  return norm / static_cast<float>(std::sqrt(static_cast<double>(n)));
}

Kernel resolve(Kernel kernel) {
  if (kernel == Kernel::best) return best_kernel();
  if (!kernel_available(kernel)) throw ArgumentError("deepio::comm: the AVX2 kernel is not available on this CPU");
  return kernel;
}

void worker_pass(const float* in, std::size_t n_in, float* ew, std::size_t n, std::uint8_t* packed, SumSq& acc,
                 Kernel kernel) noexcept {
#if DEEPIO_COMM_X86
  if (kernel == Kernel::avx2) return worker_avx2(in, n_in, ew, n, packed, acc);
#endif
  (void)kernel;
  worker_scalar(in, n_in, ew, n, packed, acc);
}

void residual_pass(float* e, std::size_t n, float s, Kernel kernel) noexcept {
#if DEEPIO_COMM_X86
  if (kernel == Kernel::avx2) return residual_avx2(e, n, s);
#endif
  (void)kernel;
  residual_scalar(e, 0, n, s);
}

void server_pass(const std::uint8_t* const* blocks, const float* t, std::size_t w, float* es, std::size_t n,
                 std::uint8_t* packed, SumSq& acc, Kernel kernel) noexcept {
#if DEEPIO_COMM_X86
  if (kernel == Kernel::avx2) return server_avx2(blocks, t, w, es, n, packed, acc);
#endif
  (void)kernel;
  server_scalar(blocks, t, w, es, n, packed, acc);
}

void pack(const float* x, std::size_t n, std::uint8_t* packed, Kernel kernel) noexcept {
#if DEEPIO_COMM_X86
  if (kernel == Kernel::avx2) return pack_avx2(x, n, packed);
#endif
  (void)kernel;
  pack_scalar(x, n, packed);
}

void unpack(const std::uint8_t* packed, std::size_t n, float* out, float scale, Kernel kernel) noexcept {
#if DEEPIO_COMM_X86
  if (kernel == Kernel::avx2) return unpack_avx2(packed, n, out, scale);
#endif
  (void)kernel;
  unpack_scalar(packed, 0, n, out, scale);
}

}  // namespace deepio::comm::detail

namespace deepio::comm {

bool kernel_available(Kernel kernel) noexcept {
  switch (kernel) {
    case Kernel::best:
    case Kernel::scalar: return true;
    case Kernel::avx2: return detail::cpu_has_avx2();
  }
  return false;
}

Kernel best_kernel() noexcept { return detail::cpu_has_avx2() ? Kernel::avx2 : Kernel::scalar; }

void pack_signs(std::span<const float> x, std::span<std::uint8_t> packed, Kernel kernel) {
  const Kernel k = detail::resolve(kernel);
  if (packed.size() < (x.size() + 7) / 8)
    throw ArgumentError("deepio::comm::pack_signs: packed holds " + std::to_string(packed.size()) + " bytes, " +
                        std::to_string((x.size() + 7) / 8) + " needed");
  detail::pack(x.data(), x.size(), packed.data(), k);
}

void unpack_signs(std::span<const std::uint8_t> packed, std::span<float> out, float scale, Kernel kernel) {
  const Kernel k = detail::resolve(kernel);
  if (packed.size() < (out.size() + 7) / 8)
    throw ArgumentError("deepio::comm::unpack_signs: packed holds " + std::to_string(packed.size()) + " bytes, " +
                        std::to_string((out.size() + 7) / 8) + " needed");
  detail::unpack(packed.data(), out.size(), out.data(), scale, k);
}

}  // namespace deepio::comm
