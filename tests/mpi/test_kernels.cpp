// The packing kernels: the AVX2 path equals the scalar path bit for bit (bytes, floats and the
// fp64 square sums), on random data salted with -0.0, NaN of both signs, infinities and
// denormals, at lengths that are not multiples of 8 or 32; and the scalar path equals an
// independent formulation of numpy.packbits(bitorder='big') of (x >= 0 or NaN).
// Single process, no MPI_Init.
#include <deepio/comm.hpp>

#include "../../src/comm/kernels.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace dc = deepio::comm;
namespace dd = deepio::comm::detail;

namespace {

std::vector<float> nasty(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            1e-40f};
  std::vector<float> v(n);
  for (float& x : v) {
    const int p = pick(gen);
    x = p < 10 ? specials[p] : u(gen);
  }
  return v;
}

// Bitwise equality, except that any two NaNs are equal: which NaN payload (and NaN sign) an
// operation with two NaN operands returns depends on operand order, which the compiler may
// swap for commutative operations. NaN inputs give bit 1 and NaN results on both paths.
bool same_bits(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}
bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(double)) == 0;
}
// The whole accumulator state: the open leaf, its row count, the counter of subtrees, the total.
bool same_sums(const dd::SumSq& a, const dd::SumSq& b) {
  if (a.rows != b.rows || a.occupied != b.occupied || !same_double(a.total(), b.total())) return false;
  for (int l = 0; l < 8; ++l) {
    if (!same_double(a.lane[l], b.lane[l])) return false;
    for (int h = 0; h < 64; ++h) {
      if (((a.occupied >> h) & 1u) && !same_double(a.level[h][l], b.level[h][l])) return false;
    }
  }
  return true;
}

const std::size_t kLengths[] = {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 257, 1000, 4099, 65536 + 24};

}  // namespace

TEST(Kernels, ScalarPackMatchesNumpyConvention) {
  for (std::size_t n : kLengths) {
    const auto x = nasty(n, static_cast<unsigned>(n));
    std::vector<std::uint8_t> got((n + 7) / 8 + 1, 0xAB);
    dc::pack_signs(x, got, dc::Kernel::scalar);
    for (std::size_t k = 0; k < (n + 7) / 8; ++k) {
      unsigned want = 0;
      for (std::size_t j = 0; j < 8; ++j) {
        const std::size_t i = 8 * k + j;
        const bool one = i < n && (std::isnan(x[i]) || x[i] >= 0.0f);
        want = want * 2 + (one ? 1u : 0u);  // MSB first
      }
      ASSERT_EQ(got[k], want) << "n=" << n << " byte " << k;
    }
    EXPECT_EQ(got.back(), 0xAB) << "wrote past ceil(n/8)";
  }
  // The conventions spelled out: +0, -0, NaN -> 1; the first element is the top bit.
  const float eight[8] = {-0.0f, -1.0f, 0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), -1e-45f, 3.0f, -4.0f};
  std::uint8_t b = 0;
  dc::pack_signs(std::span<const float>(eight, 8), std::span<std::uint8_t>(&b, 1));
  EXPECT_EQ(b, 0b10101010);
}

TEST(Kernels, Avx2EqualsScalar) {
  if (!dc::kernel_available(dc::Kernel::avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (std::size_t n : kLengths) {
    const auto x = nasty(n, 1000 + static_cast<unsigned>(n));
    std::vector<std::uint8_t> a((n + 7) / 8), b((n + 7) / 8);
    dc::pack_signs(x, a, dc::Kernel::scalar);
    dc::pack_signs(x, b, dc::Kernel::avx2);
    EXPECT_EQ(a, b) << "pack n=" << n;

    for (float scale : {1.0f, 0.3f, 0.0f, std::numeric_limits<float>::quiet_NaN(), 1e-40f}) {
      std::vector<float> ua(n), ub(n);
      dc::unpack_signs(a, ua, scale, dc::Kernel::scalar);
      dc::unpack_signs(a, ub, scale, dc::Kernel::avx2);
      EXPECT_TRUE(same_bits(ua.data(), ub.data(), n)) << "unpack n=" << n;
      for (std::size_t i = 0; i < n; ++i) {
        const bool one = (a[i / 8] >> (7 - i % 8)) & 1;
        const float want = one ? scale : -scale;
        ASSERT_EQ(std::memcmp(&ua[i], &want, 4), 0) << "unpack value n=" << n << " i=" << i;
      }
    }

    std::vector<float> ra = x, rb = x;
    dd::residual_pass(ra.data(), n, 0.25f, dc::Kernel::scalar);
    dd::residual_pass(rb.data(), n, 0.25f, dc::Kernel::avx2);
    EXPECT_TRUE(same_bits(ra.data(), rb.data(), n)) << "residual n=" << n;
  }
}

TEST(Kernels, FusedPassesAvx2EqualsScalar) {
  if (!dc::kernel_available(dc::Kernel::avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (std::size_t groups : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{129}, std::size_t{1000}}) {
    const std::size_t n = 8 * groups;
    // n_in below, inside and beyond the chunk, also ending mid-byte.
    for (std::size_t n_in : {std::size_t{0}, std::size_t{5}, n / 2 + 3, n - 1, n, n + 10}) {
      const auto in = nasty(n_in, 7 + static_cast<unsigned>(n_in));
      const auto e0 = nasty(n, 11 + static_cast<unsigned>(n));
      std::vector<float> ea = e0, eb = e0;
      std::vector<std::uint8_t> pa(n / 8), pb(n / 8);
      // Accumulators carry over between chunks: start from a state with an open leaf (5 rows)
      // and one finished subtree.
      dd::SumSq sa, sb;
      {
        auto pre = nasty(8 * 21, 3);
        std::vector<std::uint8_t> pp(21);
        dd::worker_pass(nullptr, 0, pre.data(), pre.size(), pp.data(), sa, dc::Kernel::scalar);
        sb = sa;
      }
      dd::worker_pass(n_in ? in.data() : nullptr, n_in, ea.data(), n, pa.data(), sa, dc::Kernel::scalar);
      dd::worker_pass(n_in ? in.data() : nullptr, n_in, eb.data(), n, pb.data(), sb, dc::Kernel::avx2);
      EXPECT_TRUE(same_bits(ea.data(), eb.data(), n)) << "worker ew n=" << n << " n_in=" << n_in;
      EXPECT_EQ(pa, pb) << "worker bits n=" << n << " n_in=" << n_in;
      EXPECT_TRUE(same_sums(sa, sb)) << "worker sums n=" << n << " n_in=" << n_in;
    }
    for (std::size_t w : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}}) {
      std::vector<std::vector<std::uint8_t>> blocks(w, std::vector<std::uint8_t>(n / 8));
      std::vector<const std::uint8_t*> ptrs(w);
      std::vector<float> t(w);
      std::mt19937 gen(static_cast<unsigned>(w * n));
      for (std::size_t j = 0; j < w; ++j) {
        for (auto& byte : blocks[j]) byte = static_cast<std::uint8_t>(gen());
        ptrs[j] = blocks[j].data();
        t[j] = static_cast<float>(gen() % 1000) * 1e-3f / static_cast<float>(w);
      }
      const auto e0 = nasty(n, 5 + static_cast<unsigned>(w));
      std::vector<float> ea = e0, eb = e0;
      std::vector<std::uint8_t> pa(n / 8), pb(n / 8);
      dd::SumSq sa, sb;
      dd::server_pass(ptrs.data(), t.data(), w, ea.data(), n, pa.data(), sa, dc::Kernel::scalar);
      dd::server_pass(ptrs.data(), t.data(), w, eb.data(), n, pb.data(), sb, dc::Kernel::avx2);
      EXPECT_TRUE(same_bits(ea.data(), eb.data(), n)) << "server es n=" << n << " w=" << w;
      EXPECT_EQ(pa, pb) << "server bits n=" << n << " w=" << w;
      EXPECT_TRUE(same_sums(sa, sb)) << "server sums n=" << n << " w=" << w;
    }
  }
}

TEST(Kernels, ArgumentChecks) {
  std::vector<float> x(17);
  std::vector<std::uint8_t> small(2);
  EXPECT_THROW(dc::pack_signs(x, small), dc::ArgumentError);
  EXPECT_THROW(dc::unpack_signs(small, x), dc::ArgumentError);
  EXPECT_EQ(dc::padded_size(0, 4), 0u);
  EXPECT_EQ(dc::padded_size(1, 4), 32u);
  EXPECT_EQ(dc::padded_size(32, 4), 32u);
  EXPECT_EQ(dc::padded_size(100, 3), 120u);
  EXPECT_THROW(dc::padded_size(1, 0), dc::ArgumentError);
  EXPECT_TRUE(dc::kernel_available(dc::Kernel::scalar));
  EXPECT_TRUE(dc::kernel_available(dc::best_kernel()));
  // The house error type: a deepio::InvalidArgument, errno EINVAL, naming the sizes.
  try {
    dc::pack_signs(x, small);
    ADD_FAILURE() << "a 2-byte destination for 17 signs was accepted";
  } catch (const deepio::Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_TRUE(e.invalid_argument());
    EXPECT_NE(std::string(e.what()).find("packed holds 2 bytes"), std::string::npos) << e.what();
  }
}
