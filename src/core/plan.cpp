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

// Plans one request [in.file_offset, + in.nbytes) at in.buf over `workers` workers, calling
// add(worker, from, to, mode, chunk) for each segment in worker order (some may be empty).
template <class Add>
void plan_into(const PlanInput& in, std::size_t workers, Add&& add) {
  const std::uint64_t begin = in.file_offset;
  const std::uint64_t end = in.file_offset + in.nbytes;
  std::size_t block = std::max<std::size_t>(1, in.block_size);
  if (in.any_alignment) {
    // cuFile takes any offset, but an unaligned one goes through its own bounce path, and two
    // workers writing into one 4 KiB block would each read-modify-write it. So: a short first
    // segment up to the first page boundary, then whole page-aligned chunks, with the workers'
    // shares cut at chunk multiples from that boundary. Every request after the first starts
    // page-aligned, and no page is touched by two workers.
    const std::uint64_t page = std::max<std::size_t>(1, in.page);
    const auto chunk = static_cast<std::size_t>(std::max<std::uint64_t>(page, round_down(block, page)));
    const std::uint64_t aligned = std::min(end, round_up(begin, page));
    add(0, begin, aligned, SegmentMode::Direct, chunk);
    const Cut b{aligned, end, workers, chunk};
    for (std::size_t w = 0; w < workers; ++w) add(w, b.at(w), b.at(w + 1), SegmentMode::Direct, chunk);
    return;
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
    const auto addr = reinterpret_cast<std::uintptr_t>(in.buf + (a0 - begin));
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
}

// Appends [from, to) of the request `in` to `slice`, if not empty.
void append(Slice& slice, const PlanInput& in, std::uint64_t from, std::uint64_t to, SegmentMode mode,
            std::size_t chunk) {
  if (from < to) slice.segments.push_back({from, in.buf + (from - in.file_offset), to - from, mode, chunk});
}

std::vector<Slice> worker_slices(std::size_t workers) {
  std::vector<Slice> slices(workers);
  for (std::size_t w = 0; w < workers; ++w) slices[w].worker = w;
  return slices;
}
}  // namespace

std::uint64_t split_threshold(const PlanInput& in) {
  return 2 * static_cast<std::uint64_t>(std::max<std::size_t>(1, in.block_size));
}

std::vector<Slice> plan_request(const PlanInput& in) {
  if (in.nbytes == 0) return {};
  const std::size_t workers = std::max<std::size_t>(1, in.workers);
  if (workers > 1 && !in.any_alignment && in.nbytes <= split_threshold(in)) {
    // Whole to one worker: one request per block, not one per worker.
    std::vector<Slice> one(1);
    one[0].worker = in.first_worker % workers;
    plan_into(in, 1, [&](std::size_t, std::uint64_t from, std::uint64_t to, SegmentMode mode, std::size_t chunk) {
      append(one[0], in, from, to, mode, chunk);
    });
    return one;
  }
  std::vector<Slice> slices = worker_slices(workers);
  plan_into(in, workers, [&](std::size_t w, std::uint64_t from, std::uint64_t to, SegmentMode mode, std::size_t chunk) {
    append(slices[w], in, from, to, mode, chunk);
  });
  std::erase_if(slices, [](const Slice& s) { return s.segments.empty(); });
  return slices;
}

std::vector<Slice> plan_ranges(const PlanInput& in, std::span<const IoRange> ranges) {
  const std::size_t workers = std::max<std::size_t>(1, in.workers);
  std::vector<Slice> slices = worker_slices(workers);
  std::uint64_t total = 0;
  for (const IoRange& r : ranges) total += r.nbytes;
  if (total == 0) return {};
  // Large ranges are cut across every worker, as a single request is; the others go whole to
  // the worker whose share of the total their place in the order falls in.
  const std::uint64_t split_above = split_threshold(in);
  const std::uint64_t share = (total + workers - 1) / workers;  // bytes per worker
  std::uint64_t before = 0;                                     // bytes of the ranges before this one
  for (const IoRange& r : ranges) {
    if (r.nbytes == 0) continue;
    PlanInput one = in;
    one.buf = in.buf + r.buffer_offset;
    one.nbytes = r.nbytes;
    one.file_offset = r.file_offset;
    if (workers > 1 && r.nbytes > split_above) {
      plan_into(one, workers,
                [&](std::size_t w, std::uint64_t from, std::uint64_t to, SegmentMode mode, std::size_t chunk) {
                  append(slices[w], one, from, to, mode, chunk);
                });
    } else {
      // An operation of at most two blocks in all goes whole to one worker, as a single
      // request of that size does: one wake-up and one completion (ops spread round-robin).
      const std::uint64_t place = total <= split_above ? 0 : std::min<std::uint64_t>(workers - 1, before / share);
      const std::size_t w = (in.first_worker + place) % workers;
      plan_into(one, 1, [&](std::size_t, std::uint64_t from, std::uint64_t to, SegmentMode mode, std::size_t chunk) {
        append(slices[w], one, from, to, mode, chunk);
      });
    }
    before += r.nbytes;
  }
  std::erase_if(slices, [](const Slice& s) { return s.segments.empty(); });
  return slices;
}

}  // namespace deepio::detail
