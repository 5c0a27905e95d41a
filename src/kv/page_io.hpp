// The I/O of a batch's host pages (batch_io.cpp): many pages per engine operation.
//
// A page costs the engine far less as one range of a ranged operation than as an operation of
// its own (no op, future, queueing, worker wake-up or io_uring_enter of its own: docs/kv.md
// "Cost per page"). PageOps gathers a batch's pages per slab into chunks of about
// `chunk_bytes` (at least one page) and starts each chunk, as soon as it is full, as one
// File::pread_ranges / pwrite_ranges over the span of memory that holds its pages' segments
// (each segment one range: its bytes at buffer_offset = its address - the span's start; the
// engine touches only the ranges). Chunks, not one operation per slab, so that the batch
// thread verifies (or checksums) the first pages while later ones are still moving: settle()
// hands back each chunk's pages as the chunk completes, in the order they were started.
//
// A page of many small segments (SGLang's layer_first: two per layer, 1 KiB each for 64 KiB
// pages of 32 layers) would be a request per segment, each too small or unaligned for direct
// I/O. Such a page is staged: it moves as one request through a contiguous piece of the batch
// thread's staging memory (deepio's locked allocations: registered buffers, huge pages),
// gathered from its segments before a write, scattered to them after a read (before settle()
// hands it back). A batch stages at most 64 MiB (what its thread keeps between batches); its
// later pages go as before, a request per segment. The rule (staged()): two or more segments, and either segments of
// under kStageBelow bytes on average or one not a whole number of 4 KiB pages in size or address.
//
// A chunk the engine refuses as a whole with InvalidArgument (two pages of a get into the
// same memory: the ranges of one read may not overlap) goes as one operation per segment
// instead, as before, so that such a batch behaves as it always did. Any other error of a
// chunk's operation is the error of each of its pages (their folder fails at the commit, as
// it would for a page's own operation). Not thread-safe: one batch thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "deepio/handle.hpp"
#include "deepio/kv.hpp"
#include "deepio/memory.hpp"
#include "kv/layout.hpp"

namespace deepio::kv::internal {

/// The I/O errors of a batch's pages: per page an errno (0: none) and its message. A page's
/// error fails its folder when the batch commits.
struct PageErrors {
  std::vector<int> err;
  std::vector<std::string> what;

  explicit PageErrors(std::size_t n) : err(n, 0), what(n) {}
  void set(std::size_t i, int e, const std::string& w) {
    err[i] = e;
    what[i] = w;
  }
  void set(std::size_t i, const Error& e);
  /// Waits for every future of page i (and drops them), keeping the page's first error.
  void settle_all(std::size_t i, std::vector<Future>& futs);
};

/// Contiguous memory for staged pages, 4 KiB-aligned pieces of blocks of locked memory. The
/// batch thread keeps up to kKeepBytes of blocks for its next batches (a new block is an mmap
/// and its page faults). Not thread-safe: one batch thread.
class Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();
  /// n bytes (rounded up to 4 KiB), valid until the Staging goes; nullptr once the batch took
  /// kKeepBytes (the rest of its pages go unstaged: no block made and dropped per batch).
  unsigned char* take(std::size_t n);
  /// The blocks' size: a take() that does not fit what is left of the last block starts a
  /// new one (the rest of the old one unused).
  static constexpr std::size_t kBlock = std::size_t{4} << 20;

 private:
  static constexpr std::size_t kKeepBytes = std::size_t{64} << 20;
  std::vector<UniqueLockedBuffer> blocks_;
  std::size_t used_ = 0;   // of the last block
  std::size_t taken_ = 0;  // by this batch
};

/// The bytes of one page: the sum of its segments.
inline std::uint64_t page_bytes_of(const std::vector<Segment>& page) noexcept {
  std::uint64_t n = 0;
  for (const Segment& s : page) n += s.nbytes;
  return n;
}

/// Whether a page with these segments is staged (see above).
[[nodiscard]] bool staged(const std::vector<Segment>& segments) noexcept;

class PageOps {
 public:
  /// `write`: pwrite_ranges (puts) rather than pread_ranges (gets).
  PageOps(bool write, std::size_t chunk_bytes) : write_(write), chunk_bytes_(chunk_bytes) {}
  PageOps(const PageOps&) = delete;
  PageOps& operator=(const PageOps&) = delete;
  ~PageOps();

  /// Page i of the batch: its segments at `file_offset` of `slab` onwards, one after another.
  /// Starts the slab's chunk once it holds chunk_bytes.
  void add(std::size_t i, File& slab, const std::vector<Segment>& segments, std::uint64_t file_offset,
           PageErrors& errs);
  /// Page i of a put, whose slot starts at `slot_offset` of `slab` (its kHeaderBytes header,
  /// then the page). A page that is staged, with its header at most half a staging block (up
  /// to 2 MiB - 4 KiB), moves with its header as one request: its segments are gathered into
  /// staging after room for the header, make_header(header, page, len) makes the page's
  /// CRC-32C there and writes the header, and true is returned. Any other page goes as add()
  /// sends it, at slot_offset + kHeaderBytes, and false is returned (its header is the
  /// caller's to write). Only for a PageOps that writes.
  template <typename Fn>
  bool add_with_header(std::size_t i, File& slab, const std::vector<Segment>& segments, std::uint64_t slot_offset,
                       PageErrors& errs, Fn&& make_header) {
    const auto len = static_cast<std::size_t>(page_bytes_of(segments));
    // Header and page in at most half a block, so that two or more share one (a 2 MiB page
    // with its header would leave most of a second block unused, and a batch would make and
    // drop blocks: such a page is staged as add() does, its header written apart).
    const bool with_header = write_ && staged(segments) && kHeaderBytes + len <= Staging::kBlock / 2;
    unsigned char* at = with_header ? staging_.take(kHeaderBytes + len) : nullptr;
    if (at == nullptr) {
      add(i, slab, segments, slot_offset + kHeaderBytes, errs);
      return false;
    }
    gather(segments, at + kHeaderBytes);
    make_header(at, static_cast<const unsigned char*>(at + kHeaderBytes), len);
    const std::size_t k = open_chunk(slab);
    Chunk& c = open_[k];
    c.pages.push_back(i);
    c.pieces.push_back(Chunk::Piece{at, slot_offset, kHeaderBytes + len, i});
    c.bytes += kHeaderBytes + len;
    ++staged_pages_;
    close_if_full(k, errs);
    return true;
  }
  /// Starts every chunk not yet started.
  void flush(PageErrors& errs);
  /// Waits for the started chunks in start order; after each, calls done(i) for each of its
  /// pages (errs holds the chunk's error for them, if any). Each page is handed back once.
  template <typename Fn>
  void settle(PageErrors& errs, Fn&& done) {
    for (; settled_ < chunks_.size(); ++settled_) {
      Chunk& c = chunks_[settled_];
      settle_chunk(c, errs);
      if (!write_) scatter(c, errs);
      for (std::size_t i : c.pages) done(i);
      c = Chunk{};
    }
  }
  /// Pages that went through staging so far.
  [[nodiscard]] std::uint64_t staged_pages() const noexcept { return staged_pages_; }
  /// Engine operations started so far (a chunk's one, or its fallback's per segment).
  [[nodiscard]] std::uint64_t ops() const noexcept { return ops_; }

 private:
  struct Chunk {
    File* slab = nullptr;
    std::vector<std::size_t> pages;
    /// The segments: memory and file offset of each (nbytes > 0 only).
    struct Piece {
      unsigned char* data;
      std::uint64_t file_offset;
      std::size_t nbytes;
      std::size_t page;
    };
    std::vector<Piece> pieces;
    /// Staged pages: the page, its segments (the caller's), its bytes in staging.
    struct Staged {
      std::size_t page;
      const std::vector<Segment>* segments;
      const unsigned char* at;
    };
    std::vector<Staged> staged;
    std::size_t bytes = 0;
    /// The operations started: the chunk's one (page kAll), or one per piece (its page).
    std::vector<std::pair<Future, std::size_t>> futs;
  };
  static constexpr std::size_t kAll = ~std::size_t{0};
  /// The index in open_ of slab's filling chunk (made if there is none).
  std::size_t open_chunk(File& slab);
  /// Starts open_[k] if it holds chunk_bytes (and drops it from open_).
  void close_if_full(std::size_t k, PageErrors& errs);
  /// Copies the segments, one after another, to `to`.
  static void gather(const std::vector<Segment>& segments, unsigned char* to);
  void start(Chunk& c, PageErrors& errs);
  void settle_chunk(Chunk& c, PageErrors& errs);
  /// Copies each staged page of a settled read chunk that has no error to its segments.
  static void scatter(const Chunk& c, const PageErrors& errs);

  bool write_;
  std::size_t chunk_bytes_;
  std::vector<Chunk> chunks_;  // started, in start order
  std::size_t settled_ = 0;    // chunks_[0, settled_) handed back
  std::vector<Chunk> open_;    // one filling chunk per slab
  std::uint64_t ops_ = 0;
  std::uint64_t staged_pages_ = 0;
  Staging staging_;  // declared last: destroyed after ~PageOps waited for every operation
};

}  // namespace deepio::kv::internal
