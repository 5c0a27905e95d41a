#include "stages.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
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

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

constexpr std::int64_t kNoFailure = std::numeric_limits<std::int64_t>::min();

std::int64_t i64(std::size_t v) noexcept { return static_cast<std::int64_t>(v); }

}  // namespace

Reason check_lengths(std::size_t n0, std::size_t n_out, std::size_t n, std::size_t ns, std::size_t w) noexcept {
  if (n_out != n0) return Reason::output_size;
  if (n % (8 * w) != 0) return Reason::worker_not_multiple;
  if (ns * w != n) return Reason::server_size;
  if (n0 > n) return Reason::input_too_long;
  return Reason::none;
}

Reason check_arguments(const CallArgs& a, std::size_t w) noexcept {
  if (const Reason r = check_lengths(a.n0, a.n_out, a.n, a.ns, w); r != Reason::none) return r;
  constexpr std::size_t f = sizeof(float);
  if (a.output != a.input && overlaps(a.output, a.n0 * f, a.input, a.n0 * f)) return Reason::output_overlap;
  if (overlaps(a.worker_error, a.n * f, a.server_error, a.ns * f) ||
      overlaps(a.worker_error, a.n * f, a.input, a.n0 * f) || overlaps(a.worker_error, a.n * f, a.output, a.n0 * f) ||
      overlaps(a.server_error, a.ns * f, a.input, a.n0 * f) || overlaps(a.server_error, a.ns * f, a.output, a.n0 * f))
    return Reason::error_overlap;
  if (block_stride(a.ns) > static_cast<std::size_t>(INT_MAX)) return Reason::too_large;
  return Reason::none;
}

std::string reason_text(Reason reason, std::size_t w) {
  const std::string ws = std::to_string(w);
  switch (reason) {
    case Reason::none: return "no error";
    case Reason::output_size: return "output length differs from input length";
    case Reason::worker_not_multiple: return "worker_error length is not a multiple of 8 * W (W = " + ws + ")";
    case Reason::server_size: return "server_error length is not worker_error length / W (W = " + ws + ")";
    case Reason::input_too_long: return "input is longer than worker_error";
    case Reason::output_overlap: return "output partially overlaps input (it must be the same span or disjoint)";
    case Reason::error_overlap: return "worker_error or server_error overlaps another argument";
    case Reason::too_large: return "one chunk of signs exceeds INT_MAX bytes";
    case Reason::input_mismatch: return "input length differs across ranks";
    case Reason::worker_mismatch: return "worker_error length differs across ranks";
    case Reason::server_mismatch: return "server_error length differs across ranks";
  }
  return "unknown reason " + std::to_string(static_cast<int>(reason));
}

AgreementMessage agreement_message(const CallArgs& a, std::size_t w, int rank) noexcept {
  const Reason reason = check_arguments(a, w);
  const std::int64_t failure = reason == Reason::none
                                   ? kNoFailure
                                   : -(std::int64_t{rank} * kReasonSlots + static_cast<std::int64_t>(reason));
  return {i64(a.n0), -i64(a.n0), i64(a.n), -i64(a.n), i64(a.ns), -i64(a.ns), failure};
}

void agreement_verdict(const AgreementMessage& m, const CallArgs& a, std::size_t w, int rank,
                       const std::string& where) {
  if (m[6] != kNoFailure) {
    const std::int64_t code = -m[6];
    const auto bad_rank = static_cast<int>(code / kReasonSlots);
    const auto reason = static_cast<Reason>(code % kReasonSlots);
    std::string text = where + "invalid arguments on rank " + std::to_string(bad_rank) + " of " + std::to_string(w) +
                       ": " + reason_text(reason, w);
    if (bad_rank == rank) {
      text += " (input " + std::to_string(a.n0) + ", worker_error " + std::to_string(a.n) + ", server_error " +
              std::to_string(a.ns) + " elements)";
    }
    throw ArgumentError(text, reason, bad_rank);
  }
  // Each rank's own checks passed; the lengths must also be equal everywhere.
  const struct {
    Reason reason;
    const char* name;
  } lengths[] = {{Reason::input_mismatch, "input"},
                 {Reason::worker_mismatch, "worker_error"},
                 {Reason::server_mismatch, "server_error"}};
  for (std::size_t i = 0; i < 3; ++i) {
    const std::int64_t hi = m[2 * i], lo = -m[2 * i + 1];
    if (hi != lo) {
      throw ArgumentError(where + lengths[i].name + " length differs across ranks (min " + std::to_string(lo) +
                              ", max " + std::to_string(hi) + ")",
                          lengths[i].reason);
    }
  }
}

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
