// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and the Python
// `crc32c` package compute it: crc32c(b"123456789") == 0xE3069283. The x86-64 SSE4.2 crc32
// instruction when cpuid says the CPU has it (checked once), a slicing-by-8 table otherwise.
// The instruction path is one dependent chain of 8-byte steps (about 8 GB/s per core at
// 3 GHz; docs/benchmarks.md has the measured figure). Pure functions, thread-safe.
#include <array>
#include <cstdint>
#include <cstring>

#include "deepio/kv.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
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

#if defined(__x86_64__)
__attribute__((target("sse4.2,crc32"))) std::uint32_t crc_sse42(const unsigned char* p, std::size_t n,
                                                                std::uint32_t crc) noexcept {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool have_sse42() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2") != 0;
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_sse42(p, nbytes, crc);
#endif
  return ~crc_table(p, nbytes, crc);
}

namespace detail {
/// The table path alone, for tests that compare both.
std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept {
  return ~crc_table(static_cast<const unsigned char*>(data), nbytes, ~crc);
}
}  // namespace detail

}  // namespace deepio::kv
