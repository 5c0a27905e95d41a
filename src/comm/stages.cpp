#include "stages.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace deepio::comm::detail {
namespace {

std::uint8_t* sign_bytes(std::byte* block) noexcept { return reinterpret_cast<std::uint8_t*>(block + sizeof(float)); }
const std::uint8_t* sign_bytes(const std::byte* block) noexcept {
  return reinterpret_cast<const std::uint8_t*>(block + sizeof(float));
}
float block_scale(const std::byte* block) noexcept {
  float s;
  std::memcpy(&s, block, sizeof s);
  return s;
}

}  // namespace

float worker_stage(const float* in, std::size_t n0, float* ew, std::size_t n, std::size_t w, std::byte* send,
                   Kernel kernel) noexcept {
  const std::size_t c = n / w;
  const std::size_t stride = block_stride(c);
  SumSq acc;
  for (std::size_t j = 0; j < w; ++j) {
    const std::size_t begin = j * c;
    const std::size_t n_in = n0 > begin ? n0 - begin : 0;
    worker_pass(n_in ? in + begin : nullptr, n_in, ew + begin, c, sign_bytes(send + j * stride), acc, kernel);
  }
  const float s = scale_of(acc, n);
  for (std::size_t j = 0; j < w; ++j) std::memcpy(send + j * stride, &s, sizeof s);
  return s;
}

float server_stage(const std::byte* recv, std::size_t w, float* es, std::size_t c, std::byte* own, Kernel kernel) {
  const std::size_t stride = block_stride(c);
  std::vector<const std::uint8_t*> blocks(w);
  std::vector<float> t(w);
  const auto inv_w = static_cast<float>(1.0 / static_cast<double>(w));  // torch: fp32(1/W)
  for (std::size_t j = 0; j < w; ++j) {
    blocks[j] = sign_bytes(recv + j * stride);
    t[j] = block_scale(recv + j * stride) * inv_w;
  }
  SumSq acc;
  server_pass(blocks.data(), t.data(), w, es, c, sign_bytes(own), acc, kernel);
  const float s = scale_of(acc, c);
  std::memcpy(own, &s, sizeof s);
  return s;
}

void decode_block(const std::byte* gathered, std::size_t k, std::size_t c, float* out, std::size_t n0,
                  Kernel kernel) noexcept {
  const std::size_t begin = k * c;
  if (begin >= n0) return;
  const std::byte* block = gathered + k * block_stride(c);
  unpack(sign_bytes(block), std::min(c, n0 - begin), out + begin, block_scale(block), kernel);
}

}  // namespace deepio::comm::detail
