// Request planning: how one read or write is cut into per-worker slices of segments.
//
// Given the file's direct-I/O alignment, a request [offset, offset + nbytes) becomes
//   head  [offset, A0)   buffered (not a whole alignment unit)
//   body  [A0, A1)       direct: straight to the caller's buffer when its address is aligned,
//                         through an aligned bounce buffer when it is not
//   tail  [A1, end)      buffered
// where A0/A1 round inward to the unit G = max(offset alignment, page size). Using whole
// pages (not just the device's 512-byte sectors) keeps buffered head/tail pages and direct
// body pages disjoint, so the page cache and direct writes never race over one page.
// A request of at most two blocks (2 x block_size) goes whole to one worker (first_worker):
// cutting a 64 KiB read in two 32 KiB requests on two workers doubles the requests and the
// per-request cost and gains nothing when many ops are in flight, which is the only case
// where small requests matter. A larger request's body is divided among the workers at
// multiples of G; the head goes to the first worker and the tail to the last. Without
// direct I/O the whole request is buffered and is divided at page multiples. For memory the kernel cannot address
// (GPU), every segment is staged through bounce slots, so chunks never exceed a slot. A backend that takes any
// alignment (GPUDirect Storage) gets the whole request as Direct segments: a short first
// one up to the first page boundary, then page-aligned chunks (block_size rounded down to
// pages) shared among the workers at chunk multiples, so no page is written by two workers.
// Many ranges of one file can be planned as one operation (plan_ranges). Pure functions: no
// I/O, unit-tested directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "deepio/handle.hpp"

namespace deepio::detail {

enum class SegmentMode : std::uint8_t { Direct, Bounce, Buffered };

struct Segment {
  std::uint64_t file_offset = 0;
  std::byte* buf = nullptr;
  std::size_t nbytes = 0;
  SegmentMode mode = SegmentMode::Buffered;
  std::size_t chunk = 0;  ///< largest request to cut from this segment
  /// Set by the engine, not the planner: the file lives in memory (tmpfs), where io_uring
  /// would hand every request to a kernel worker thread; the worker runs its requests with
  /// pread/pwrite itself instead (same checks, same retries, same results).
  bool in_memory = false;
};

struct Slice {
  std::size_t worker = 0;
  std::vector<Segment> segments;
};

struct PlanInput {
  std::byte* buf = nullptr;
  std::size_t nbytes = 0;
  std::uint64_t file_offset = 0;
  bool direct = false;           ///< an O_DIRECT descriptor is available
  std::size_t mem_align = 1;     ///< buffer alignment O_DIRECT needs
  std::size_t offset_align = 1;  ///< file offset/length alignment O_DIRECT needs
  std::size_t page = 4096;
  std::size_t block_size = 1 << 20;
  std::size_t workers = 1;
  std::size_t bounce_bytes = 1 << 20;  ///< size of one bounce slot; 0: no bouncing possible
  /// The buffer is not host memory (GPU): the body always bounces, and no segment's chunk
  /// exceeds a bounce slot, because every byte is staged through host memory.
  bool staged = false;
  /// The backend takes any offset, length and address (GPUDirect Storage): the whole request
  /// is Direct; a first segment runs to the first page boundary, the rest is cut among the
  /// workers at multiples of the chunk (block_size rounded down to whole pages, at least one
  /// page) counted from that boundary, so every request after the first starts page-aligned
  /// and every one but the last of each segment is exactly one chunk.
  bool any_alignment = false;
  /// The worker a request too small to split goes to (taken modulo workers): the engine
  /// turns it round op by op, so small ops spread evenly over the workers.
  std::size_t first_worker = 0;
};

/// Slices in worker order; workers with nothing to do get no slice. Empty for nbytes == 0.
/// Unless in.any_alignment, a request of at most 2 x block_size is one slice, for worker
/// first_worker % workers (split_threshold()).
std::vector<Slice> plan_request(const PlanInput& in);

/// Requests (and ranges) of more bytes than this are cut across the workers: two blocks.
[[nodiscard]] std::uint64_t split_threshold(const PlanInput& in);

/// One operation over many ranges of one file (Handle::async_pread_ranges): each range is
/// planned as a request of its own (in.buf is the start of the buffer, the ranges' buffer
/// offsets count from it; in.nbytes and in.file_offset are ignored), and all their segments go
/// into one slice per worker, in the ranges' order. A range larger than two blocks is cut
/// across every worker as a single request is; a smaller one goes whole to the worker whose
/// share of the total bytes its place in the order falls in (consecutive ranges to the same
/// worker; many small ranges end up evenly spread; the shares are counted from worker
/// first_worker, so one-range operations spread too). An operation of at most two blocks in
/// all goes whole to worker first_worker (as a single request of that size does). Empty when
/// no range has bytes.
std::vector<Slice> plan_ranges(const PlanInput& in, std::span<const IoRange> ranges);

}  // namespace deepio::detail
