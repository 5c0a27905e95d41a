#include "core/plan.hpp"

#include <algorithm>

namespace deepio::detail {

namespace {
constexpr std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }
constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Cuts [begin, end) into `parts` pieces at multiples of `unit` (relative to begin), as equal
// as the unit allows: piece i is [at(i), at(i + 1)) (some pieces may be empty). Computed on
// demand, so planning a request allocates nothing but its slices.
struct Cut {
  std::uint64_t begin, end;
  std::size_t parts;
  std::uint64_t unit;
  [[nodiscard]] std::uint64_t at(std::size_t i) const {
    if (i >= parts) return end;
    const std::uint64_t units = (end - begin + unit - 1) / unit;
    return std::min(end, begin + units * i / parts * unit);
  }
};
}  // namespace

std::vector<Slice> plan_request(const PlanInput& in) {
  std::vector<Slice> slices;
  if (in.nbytes == 0) return slices;
  const std::size_t workers = std::max<std::size_t>(1, in.workers);
  slices.resize(workers);
  for (std::size_t w = 0; w < workers; ++w) slices[w].worker = w;

  const std::uint64_t begin = in.file_offset;
  const std::uint64_t end = in.file_offset + in.nbytes;
  auto buf_at = [&](std::uint64_t file_pos) { return in.buf + (file_pos - begin); };
  auto add = [&](std::size_t w, std::uint64_t from, std::uint64_t to, SegmentMode mode, std::size_t chunk) {
    if (from < to) slices[w].segments.push_back({from, buf_at(from), to - from, mode, chunk});
  };

  std::size_t block = std::max<std::size_t>(1, in.block_size);
  if (in.any_alignment) {
    const Cut b{begin, end, workers, block};
    for (std::size_t w = 0; w < workers; ++w) add(w, b.at(w), b.at(w + 1), SegmentMode::Direct, block);
    std::erase_if(slices, [](const Slice& s) { return s.segments.empty(); });
    return slices;
  }
  if (in.staged) block = std::min(block, std::max<std::size_t>(1, in.bounce_bytes));
  const std::uint64_t unit = std::max<std::uint64_t>(std::max<std::size_t>(1, in.offset_align), in.page);
  std::uint64_t a0 = round_up(begin, unit);
  std::uint64_t a1 = round_down(end, unit);
  bool direct = in.direct && a0 < a1;
  SegmentMode body_mode = SegmentMode::Direct;
  std::size_t chunk = block;
  if (direct) {
    chunk = static_cast<std::size_t>(std::max<std::uint64_t>(unit, round_down(block, unit)));
    const auto addr = reinterpret_cast<std::uintptr_t>(buf_at(a0));
    if (in.staged || addr % std::max<std::size_t>(1, in.mem_align) != 0) {
      // The caller's buffer cannot take O_DIRECT: bounce through aligned slots, if a slot
      // can hold at least one unit; otherwise the page cache is the only way.
      if (in.bounce_bytes >= unit) {
        body_mode = SegmentMode::Bounce;
        chunk = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, round_down(in.bounce_bytes, unit)));
      } else {
        direct = false;
      }
    }
  }

  if (!direct) {
    // Everything through the page cache, cut at page multiples across workers.
    const Cut b{begin, end, workers, in.page};
    for (std::size_t w = 0; w < workers; ++w) add(w, b.at(w), b.at(w + 1), SegmentMode::Buffered, block);
  } else {
    add(0, begin, a0, SegmentMode::Buffered, block);
    const Cut b{a0, a1, workers, unit};
    for (std::size_t w = 0; w < workers; ++w) add(w, b.at(w), b.at(w + 1), body_mode, chunk);
    add(workers - 1, a1, end, SegmentMode::Buffered, block);
  }

  std::erase_if(slices, [](const Slice& s) { return s.segments.empty(); });
  return slices;
}

}  // namespace deepio::detail
