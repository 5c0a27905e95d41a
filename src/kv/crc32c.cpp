// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and the Python
// `crc32c` package compute it: crc32c(b"123456789") == 0xE3069283. The CPU's CRC-32C
// instruction when it has one (x86-64 SSE4.2, ARMv8 CRC32; checked once at run time), a
// slicing-by-8 table otherwise. The instruction path runs three chains of 8-byte steps side by
// side and joins them (docs/benchmarks.md has the measured figure). Pure functions, thread-safe.
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "deepio/kv.hpp"

#if defined(__x86_64__)
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

DEEPIO_CRC_TARGET std::uint32_t crc_hw(const unsigned char* p, std::size_t n, std::uint32_t crc) noexcept {
  static const ZeroShift long_shift(kLong);
  static const ZeroShift short_shift(kShort);
  std::uint32_t c = crc;
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
