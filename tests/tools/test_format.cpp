// Sizes and numbers as the command prints them (ds_io prints Python's float repr).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "format.hpp"

namespace deepio::cli {
namespace {

TEST(Format, PythonFloatRepr) {
  // Each pair checked against CPython's repr().
  const std::pair<double, const char*> cases[] = {
      {1.0, "1.0"},
      {0.1, "0.1"},
      {-2.5, "-2.5"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789.0, "123456789.0"},
      {0.1 + 0.2, "0.30000000000000004"},
      {1.5e300, "1.5e+300"},
      {-1.25e-7, "-1.25e-07"},
      {3.4400000000000004, "3.4400000000000004"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
  };
  for (const auto& [v, text] : cases) EXPECT_EQ(py_float(v), text) << text;
  EXPECT_EQ(py_float(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(py_float(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(py_float(std::nan("")), "nan");
}

TEST(Format, PythonFloatReprRoundTrips) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(-10.0, 10.0);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int i = 0; i < 2000; ++i) {
    const double v = mantissa(rng) * std::pow(10.0, exponent(rng));
    const std::string s = py_float(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
    EXPECT_TRUE(s.find('.') != std::string::npos || s.find('e') != std::string::npos) << s;  // always a float
  }
}

TEST(Format, FixedAndMedian) {
  EXPECT_EQ(fixed(3.14159, 2), "3.14");
  EXPECT_EQ(fixed(2.5, 0), "2");  // printf rounds half to even
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

TEST(Format, SizeLabelsAndHumanBytes) {
  EXPECT_EQ(size_label(1ULL << 30), "1G");
  EXPECT_EQ(size_label(512ULL << 20), "512M");
  EXPECT_EQ(size_label(1536ULL << 10), "1536K");
  EXPECT_EQ(size_label(1000), "1000");
  EXPECT_EQ(size_label(0), "0");
  EXPECT_EQ(size_label(3ULL << 40), "3T");
  for (std::uint64_t v : {1ULL, 4096ULL, 1ULL << 20, 400ULL << 20, 12345ULL, 7ULL << 40}) {
    EXPECT_EQ(parse_size(size_label(v)), v);
  }
  EXPECT_EQ(human_bytes(100), "100 B");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(512ULL << 20), "512 MiB");
  EXPECT_EQ(human_bytes(3ULL << 29), "1.50 GiB");
}

TEST(Format, PythonBoolAndStr) {
  EXPECT_EQ(py_bool(true), "True");
  EXPECT_EQ(py_bool(false), "False");
  EXPECT_EQ(py_str("/mnt/nvme"), "'/mnt/nvme'");
}

}  // namespace
}  // namespace deepio::cli
