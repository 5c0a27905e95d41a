// CRC-32C of deepio::kv against a bit-at-a-time reference written from the definition
// (reflected polynomial 0x82F63B78): every length around the instruction path's block joins
// (3 × 256 and 3 × 8192 bytes), unaligned starts, continued CRCs, and the table path. Also
// built for aarch64 and run under emulation by scripts/cross-aarch64.sh.
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/kv.hpp"

namespace deepio::kv::detail {
std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept;
bool crc32c_uses_instruction() noexcept;
}  // namespace deepio::kv::detail

namespace deepio::test {
namespace {

std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n, std::uint32_t crc) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) != 0 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

std::vector<unsigned char> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Where the CPU is known to have the instruction (scripts/cross-aarch64.sh under qemu's ARMv8
// with CRC32; x86-64 machines with SSE4.2), the fast path is the one under test.
TEST(KvCrc, TheInstructionPathIsTakenWhereExpected) {
  const char* want = std::getenv("DEEPIO_EXPECT_CRC_INSTRUCTION");
  if (want == nullptr) GTEST_SKIP() << "DEEPIO_EXPECT_CRC_INSTRUCTION not set";
  EXPECT_EQ(kv::detail::crc32c_uses_instruction(), std::string(want) == "1");
}

TEST(KvCrc, EveryLengthAroundTheBlockJoinsMatchesTheDefinition) {
  const auto data = random_bytes((std::size_t{3} << 14) * 2 + 4096, 7);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 3 * 256 + 64; ++n) lengths.push_back(n);
  // Around where the carry-less path (x86-64 with VPCLMULQDQ) starts: 1024 bytes, folded 256
  // at a time, the rest in the instruction's chains.
  for (std::size_t n = 1000; n <= 1800; ++n) lengths.push_back(n);
  for (std::size_t base : {std::size_t{3} * 8192, std::size_t{6} * 8192, std::size_t{3} * 8192 + 3 * 256}) {
    for (std::size_t d = 0; d <= 16; ++d) {
      lengths.push_back(base + d);
      lengths.push_back(base - d);
    }
  }
  lengths.push_back(data.size() - 7);
  for (std::size_t n : lengths) {
    for (std::size_t off : {0, 1, 3, 7}) {
      if (off + n > data.size()) continue;
      const unsigned char* p = data.data() + off;
      const std::uint32_t want = crc32c_bitwise(p, n, 0);
      ASSERT_EQ(kv::crc32c(p, n), want) << "length " << n << " offset " << off;
      ASSERT_EQ(kv::detail::crc32c_portable(p, n, 0), want) << "length " << n << " offset " << off;
    }
  }
}

TEST(KvCrc, ContinuedCrcsOfRandomPiecesEqualOnePass) {
  const auto data = random_bytes(std::size_t{1} << 20, 11);
  const std::uint32_t whole = crc32c_bitwise(data.data(), data.size(), 0);
  ASSERT_EQ(kv::crc32c(data.data(), data.size()), whole);
  std::mt19937 rng(3);
  for (int round = 0; round < 50; ++round) {
    std::uint32_t crc = 0;
    std::size_t at = 0;
    while (at < data.size()) {
      const std::size_t n = std::min<std::size_t>(data.size() - at, rng() % 70000);
      crc = kv::crc32c(data.data() + at, n, crc);
      at += n;
    }
    ASSERT_EQ(crc, whole) << "round " << round;
  }
  // A non-zero start through the three-stream path.
  const std::uint32_t seed = 0xDEADBEEFu;
  EXPECT_EQ(kv::crc32c(data.data() + 5, 100000, seed), crc32c_bitwise(data.data() + 5, 100000, seed));
}

}  // namespace
}  // namespace deepio::test
