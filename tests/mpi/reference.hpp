// Reference simulations of the 1-bit compressed allreduce, in one process, for all W ranks.
// Deliberately plain: one byte per sign instead of packed bits, one loop per formula of onebit.md §1.4,
// no code shared with src/comm. Two of them:
//
//   simulate_spec      the algorithm exactly as specified (padding, error feedback on both
//                      sides, server average sum_j (s_j * fp32(1/W)) * m_j left to right) and
//                      with the norm order documented in include/deepio/comm.hpp. The library
//                      must match it bit for bit at every W.
//   simulate_deepspeed DeepSpeed's torch_sim from tests/onebit/test_mpi_backend.py: the
//                      compressed values are summed with a plain allreduce (here: in reverse
//                      rank order, to stand for a ring) and then multiplied by 1/W; chunk
//                      norms; zero initial errors; no padding. It equals the library only up
//                      to the tolerance scheme of onebit.md §4 for W > 2.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstddef>
#include <vector>

namespace deepio::comm::test {

struct RankState {
  std::vector<float> worker_error;  // N
  std::vector<float> server_error;  // N / W
};

inline bool sign_bit(float x) { return !(x < 0.0f); }  // x >= 0, -0.0 and NaN -> true
inline float sgn(float x) { return sign_bit(x) ? 1.0f : -1.0f; }

// ||v||_2 / sqrt(n), written independently of the streaming kernels: fp64 squares; lane
// l = i % 8; leaves of 64 rows (512 elements) summed row by row from +0.0; leaves summed by
// a perfect binary tree padded with zero leaves (recursively, halves of a power-of-two span);
// lanes combined ((0+1)+(2+3))+((4+5)+(6+7)); sqrt rounded to fp32, divided in fp32 by
// fp32(sqrt n).
inline double ref_tree(const std::vector<double>& leaves, std::size_t begin, std::size_t span) {
  if (span == 1) return begin < leaves.size() ? leaves[begin] : 0.0;
  return ref_tree(leaves, begin, span / 2) + ref_tree(leaves, begin + span / 2, span / 2);
}
inline float ref_scale(const float* v, std::size_t n) {
  const std::size_t leaf = 512;
  const std::size_t n_leaves = (n + leaf - 1) / leaf;
  std::size_t span = 1;
  while (span < n_leaves) span *= 2;
  double lane[8];
  for (std::size_t l = 0; l < 8; ++l) {
    std::vector<double> leaves(n_leaves, 0.0);
    for (std::size_t i = l; i < n; i += 8) leaves[i / leaf] += static_cast<double>(v[i]) * static_cast<double>(v[i]);
    lane[l] = n_leaves ? ref_tree(leaves, 0, span) : 0.0;
  }
  const double total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  return static_cast<float>(std::sqrt(total)) / static_cast<float>(std::sqrt(static_cast<double>(n)));
}

// One call on all ranks. inputs[r] is rank r's buffer (all the same length N0); states[r]
// are updated like the library updates worker_error/server_error. Returns the output that
// every rank must hold (length N0).
inline std::vector<float> simulate_spec(const std::vector<std::vector<float>>& inputs, std::vector<RankState>& states) {
  const std::size_t w = inputs.size();
  const std::size_t n0 = inputs[0].size();
  if (n0 == 0) {
    for (auto& s : states) {
      for (float& e : s.worker_error) e = 0.0f;
      for (float& e : s.server_error) e = 0.0f;
    }
    return {};
  }
  const std::size_t n = states[0].worker_error.size();
  const std::size_t c = n / w;

  // Worker side on every rank.
  std::vector<float> worker_scale(w);
  std::vector<std::vector<std::uint8_t>> worker_bits(w, std::vector<std::uint8_t>(n));
  for (std::size_t r = 0; r < w; ++r) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = (i < n0 ? inputs[r][i] : 0.0f) + states[r].worker_error[i];
    const float s = ref_scale(x.data(), n);
    worker_scale[r] = s;
    for (std::size_t i = 0; i < n; ++i) {
      worker_bits[r][i] = sign_bit(x[i]);
      states[r].worker_error[i] = x[i] - s * sgn(x[i]);
    }
  }

  // Server side: rank r owns chunk r.
  const float inv_w = static_cast<float>(1.0 / static_cast<double>(w));
  std::vector<float> server_scale(w);
  std::vector<std::vector<std::uint8_t>> server_bits(w, std::vector<std::uint8_t>(c));
  for (std::size_t r = 0; r < w; ++r) {
    std::vector<float> cv(c);
    for (std::size_t i = 0; i < c; ++i) {
      float sum = 0.0f;
      for (std::size_t j = 0; j < w; ++j) {
        const float term = (worker_scale[j] * inv_w) * (worker_bits[j][r * c + i] ? 1.0f : -1.0f);
        sum = j == 0 ? term : sum + term;
      }
      cv[i] = sum + states[r].server_error[i];
    }
    const float s = ref_scale(cv.data(), c);
    server_scale[r] = s;
    for (std::size_t i = 0; i < c; ++i) {
      server_bits[r][i] = sign_bit(cv[i]);
      states[r].server_error[i] = cv[i] - s * sgn(cv[i]);
    }
  }

  std::vector<float> out(n0);
  for (std::size_t i = 0; i < n0; ++i) {
    const std::size_t k = i / c;
    out[i] = server_scale[k] * (server_bits[k][i - k * c] ? 1.0f : -1.0f);
  }
  return out;
}

struct DeepSpeedSimResult {
  std::vector<float> out;                        // length N0
  std::vector<std::vector<float>> server_error;  // per rank, length N0 / W
};

// DeepSpeed's torch_sim (zero initial errors, N0 divisible by 8W).
inline DeepSpeedSimResult simulate_deepspeed(const std::vector<std::vector<float>>& inputs) {
  const std::size_t w = inputs.size();
  const std::size_t n = inputs[0].size();
  const std::size_t c = n / w;
  std::vector<std::vector<float>> q(w, std::vector<float>(n));
  for (std::size_t r = 0; r < w; ++r) {
    const float s = ref_scale(inputs[r].data(), n);
    for (std::size_t i = 0; i < n; ++i) q[r][i] = s * sgn(inputs[r][i]);
  }
  std::vector<float> avg(n);
  const float inv_w = static_cast<float>(1.0 / static_cast<double>(w));
  for (std::size_t i = 0; i < n; ++i) {
    float sum = q[w - 1][i];
    for (std::size_t j = w - 1; j-- > 0;) sum += q[j][i];
    avg[i] = sum * inv_w;
  }
  DeepSpeedSimResult res;
  res.out.resize(n);
  res.server_error.assign(w, std::vector<float>(c));
  for (std::size_t k = 0; k < w; ++k) {
    const float s = ref_scale(avg.data() + k * c, c);
    for (std::size_t i = 0; i < c; ++i) {
      const float v = avg[k * c + i];
      res.out[k * c + i] = s * sgn(v);
      res.server_error[k][i] = v - s * sgn(v);
    }
  }
  return res;
}

}  // namespace deepio::comm::test
