// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and the Python
// `crc32c` package compute it: crc32c(b"123456789") == 0xE3069283. The CPU's CRC-32C
// instruction when it has one (x86-64 SSE4.2, ARMv8 CRC32; checked once at run time), a
// slicing-by-8 table otherwise. The instruction path runs three chains of 8-byte steps side by
// side and joins them (docs/benchmarks.md has the measured figure); on x86-64 with AVX-512
// VPCLMULQDQ, 1 KiB and more are first folded 256 bytes at a time (crc_fold). Pure functions, thread-safe.
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "deepio/kv.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace deepio::kv {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;

struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (std::size_t i = 0; i < 256; ++i) {
      for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    }
  }
};
constexpr Tables kTables{};

std::uint32_t crc_table(const unsigned char* p, std::size_t n, std::uint32_t crc) noexcept {
  const auto& t = kTables.t;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
          t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
  return crc;
}

// The raw register after n zero bytes, as a map on the register: linear over GF(2), so it is
// tabulated a byte of the register at a time. It joins CRCs computed side by side: with R(x, D)
// the raw register after D starting from x, R(x, A||B) = Z_|B|(R(x, A)) ^ R(0, B).
struct ZeroShift {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  explicit ZeroShift(std::size_t n) {
    const std::vector<unsigned char> zeros(n, 0);
    std::array<std::uint32_t, 32> bit{};
    for (int k = 0; k < 32; ++k) bit[k] = crc_table(zeros.data(), n, std::uint32_t{1} << k);
    for (int b = 0; b < 4; ++b) {
      for (std::uint32_t v = 0; v < 256; ++v) {
        std::uint32_t r = 0;
        for (int k = 0; k < 8; ++k) {
          if ((v >> k & 1u) != 0) r ^= bit[b * 8 + k];
        }
        t[b][v] = r;
      }
    }
  }
  [[nodiscard]] std::uint32_t operator()(std::uint32_t x) const noexcept {
    return t[0][x & 0xFFu] ^ t[1][(x >> 8) & 0xFFu] ^ t[2][(x >> 16) & 0xFFu] ^ t[3][x >> 24];
  }
};

// The CPU's CRC-32C instruction, where there is one: x86-64 SSE4.2 `crc32` (cpuid), ARMv8
// `crc32c[bd]` (HWCAP_CRC32 from the auxiliary vector). Each is detected once at run time;
// the table above is the fallback. The code around the two steps is shared.
#if defined(__x86_64__)
#define DEEPIO_CRC_HW 1
#define DEEPIO_CRC_TARGET __attribute__((target("sse4.2,crc32")))
DEEPIO_CRC_TARGET inline std::uint32_t hw_step8(std::uint32_t c, std::uint64_t v) noexcept {
  return static_cast<std::uint32_t>(_mm_crc32_u64(c, v));
}
DEEPIO_CRC_TARGET inline std::uint32_t hw_step1(std::uint32_t c, unsigned char b) noexcept {
  return _mm_crc32_u8(c, b);
}
bool have_hw() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2") != 0;
  return yes;
}
#elif defined(__aarch64__)
#define DEEPIO_CRC_HW 1
#define DEEPIO_CRC_TARGET __attribute__((target("+crc")))
DEEPIO_CRC_TARGET inline std::uint32_t hw_step8(std::uint32_t c, std::uint64_t v) noexcept { return __crc32cd(c, v); }
DEEPIO_CRC_TARGET inline std::uint32_t hw_step1(std::uint32_t c, unsigned char b) noexcept { return __crc32cb(c, b); }
bool have_hw() noexcept {
  static const bool yes = (::getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
  return yes;
}
#endif

#if defined(DEEPIO_CRC_HW)
// Three streams side by side: the instruction takes about 3 cycles and starts one a cycle
// (x86-64 and Arm Neoverse alike), so one dependent chain uses a third of it. A run of 3
// blocks of kLong (then of kShort) bytes is taken as three CRCs at once, joined by two shifts;
// what is left goes in one chain.
constexpr std::size_t kLong = 8192;
constexpr std::size_t kShort = 256;
/// Below this, the carry-less path (x86-64 with VPCLMULQDQ) is not worth its set-up.
constexpr std::size_t kFoldMin = 1024;

DEEPIO_CRC_TARGET std::uint32_t crc_hw_3way(const unsigned char*& p, std::size_t& n, std::uint32_t c0,
                                            std::size_t block, const ZeroShift& shift) noexcept {
  while (n >= 3 * block) {
    std::uint32_t c1 = 0;
    std::uint32_t c2 = 0;
    const unsigned char* const end = p + block;
    do {
      std::uint64_t a;
      std::uint64_t b;
      std::uint64_t c;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + block, 8);
      std::memcpy(&c, p + 2 * block, 8);
      c0 = hw_step8(c0, a);
      c1 = hw_step8(c1, b);
      c2 = hw_step8(c2, c);
      p += 8;
    } while (p < end);
    c0 = shift(c0) ^ c1;
    c0 = shift(c0) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

#if defined(__x86_64__)
// Carry-less multiplication, 512 bits at a time (AVX-512 VPCLMULQDQ, where the CPU has it):
// four times the CRC instruction's 8 bytes a cycle. The raw register of the bytes is kept as
// four 512-bit accumulators, each 128-bit lane a block of the message that stands for every
// byte before it (mod P); each step folds a lane 2048 bits forward (its CRC is unchanged) and
// adds the next block. The four are then folded into one 128-bit block, whose CRC (16 bytes
// through the instruction) continues into the rest.
//
// Folding a block X (bytes b0..b15 loaded little endian: lane q0 holds the high-degree half H,
// q1 the low half L, bit-reversed) forward by F bits: X x^F = H x^(64+F) + L x^F; with the
// constants rev64(x^(F+63) mod P) and rev64(x^(F-1) mod P), a carry-less product of
// bit-reversed operands being rev128(x A B), q0 * k0 ^ q1 * k1 is that block (degree < 96).
struct FoldConstants {
  std::uint64_t k[3][2]{};   // [F = 2048, 512, 128]: {for q0, for q1}
  std::uint64_t k4[2][8]{};  // k[0] and k[1] in each 128-bit lane of a 512-bit register
  FoldConstants() {
    // x^n mod P, P = x^32 + 0x1EDC6F41 (normal bit order: bit j is x^j).
    const auto xpow = [](std::size_t n) {
      std::uint32_t r = 1;
      for (std::size_t i = 0; i < n; ++i) r = (r & 0x80000000u) != 0 ? (r << 1) ^ 0x1EDC6F41u : r << 1;
      return r;
    };
    const auto rev64 = [](std::uint32_t v) {  // x^j at bit 63 - j
      std::uint64_t r = 0;
      for (int j = 0; j < 32; ++j) r |= static_cast<std::uint64_t>(v >> j & 1u) << (63 - j);
      return r;
    };
    const std::size_t dist[3] = {2048, 512, 128};
    for (int i = 0; i < 3; ++i) {
      k[i][0] = rev64(xpow(dist[i] + 63));
      k[i][1] = rev64(xpow(dist[i] - 1));
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 8; ++j) k4[i][j] = k[i][j % 2];
    }
  }
};

#define DEEPIO_CRC_FOLD_TARGET __attribute__((target("sse4.2,crc32,avx512f,avx512vl,pclmul,vpclmulqdq")))
bool have_fold() noexcept {
  static const bool yes = __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512vl") != 0 &&
                          __builtin_cpu_supports("vpclmulqdq") != 0 && __builtin_cpu_supports("pclmul") != 0 &&
                          __builtin_cpu_supports("sse4.2") != 0;
  return yes;
}

DEEPIO_CRC_FOLD_TARGET inline __m512i fold512(__m512i x, __m512i k, __m512i next) noexcept {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                   0x96);
}
DEEPIO_CRC_FOLD_TARGET inline __m128i fold128(__m128i x, __m128i k, __m128i next) noexcept {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

/// Takes the largest multiple of 256 bytes of [p, p + n) (n >= 256), advancing p and n.
DEEPIO_CRC_FOLD_TARGET std::uint32_t crc_fold(const unsigned char*& p, std::size_t& n, std::uint32_t c) noexcept {
  static const FoldConstants kc;
  const __m512i k2048 = _mm512_loadu_si512(kc.k4[0]);
  const __m512i k512 = _mm512_loadu_si512(kc.k4[1]);
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(c))));
  __m512i x1 = _mm512_loadu_si512(p + 64);
  __m512i x2 = _mm512_loadu_si512(p + 128);
  __m512i x3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    x0 = fold512(x0, k2048, _mm512_loadu_si512(p));
    x1 = fold512(x1, k2048, _mm512_loadu_si512(p + 64));
    x2 = fold512(x2, k2048, _mm512_loadu_si512(p + 128));
    x3 = fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  x1 = fold512(x0, k512, x1);
  x2 = fold512(x1, k512, x2);
  x3 = fold512(x2, k512, x3);
  const __m128i k128 = _mm_set_epi64x(static_cast<long long>(kc.k[2][1]), static_cast<long long>(kc.k[2][0]));
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, x3);
  __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(lanes));
  for (int i = 1; i < 4; ++i) a = fold128(a, k128, _mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 2 * i)));
  std::uint32_t r = static_cast<std::uint32_t>(_mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(a))));
  return static_cast<std::uint32_t>(_mm_crc32_u64(r, static_cast<std::uint64_t>(_mm_extract_epi64(a, 1))));
}
#endif

DEEPIO_CRC_TARGET std::uint32_t crc_hw(const unsigned char* p, std::size_t n, std::uint32_t crc) noexcept {
  static const ZeroShift long_shift(kLong);
  static const ZeroShift short_shift(kShort);
  std::uint32_t c = crc;
#if defined(__x86_64__)
  if (n >= kFoldMin && have_fold()) c = crc_fold(p, n, c);
#endif
  c = crc_hw_3way(p, n, c, kLong, long_shift);
  c = crc_hw_3way(p, n, c, kShort, short_shift);
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = hw_step8(c, v);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = hw_step1(c, *p++);
  return c;
}
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(DEEPIO_CRC_HW)
  if (have_hw()) return ~crc_hw(p, nbytes, crc);
#endif
  return ~crc_table(p, nbytes, crc);
}

namespace detail {
/// The table path alone, for tests that compare both.
std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  return ~crc_table(static_cast<const unsigned char*>(data), nbytes, ~crc);
}
/// Whether crc32c() takes the instruction path on this CPU (for tests).
bool crc32c_uses_instruction() noexcept {
#if defined(DEEPIO_CRC_HW)
  return have_hw();
#else
  return false;
#endif
}
}  // namespace detail

}  // namespace deepio::kv
