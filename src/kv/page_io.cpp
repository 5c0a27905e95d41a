// PageOps and PageErrors (page_io.hpp): a batch's host pages in ranged operations.
#include "kv/page_io.hpp"

#include <algorithm>
#include <cstring>

#include "kv/impl.hpp"

namespace deepio::kv::internal {

void PageErrors::set(std::size_t i, const Error& e) { set(i, errno_of(e), e.what()); }

void PageErrors::settle_all(std::size_t i, std::vector<Future>& futs) {
  for (Future& f : futs) {
    std::string w;
    const int e = settle(f, &w);
    if (e != 0 && err[i] == 0) set(i, e, w);
  }
  futs.clear();
}

PageOps::~PageOps() {
  // A batch that threw (bad_alloc) between start and settle: its operations still write into
  // (or read from) the caller's memory, so they are waited for before the pages go.
  for (Chunk& c : chunks_) {
    for (auto& [f, page] : c.futs) {
      std::string w;
      (void)internal::settle(f, &w);
    }
  }
}

namespace {
constexpr std::size_t kPage = 4096;
/// A staged page's segments average under this many bytes (see page_io.hpp).
constexpr std::size_t kStageBelow = std::size_t{256} << 10;

struct KeptBlocks {
  std::vector<UniqueLockedBuffer> blocks;
};
KeptBlocks& kept() {
  thread_local KeptBlocks k;
  return k;
}
}  // namespace

bool staged(const std::vector<Segment>& segments) noexcept {
  std::size_t count = 0, bytes = 0;
  bool aligned = true;
  for (const Segment& s : segments) {
    if (s.nbytes == 0) continue;
    ++count;
    bytes += s.nbytes;
    aligned = aligned && s.nbytes % kPage == 0 && reinterpret_cast<std::uintptr_t>(s.data) % kPage == 0;
  }
  return count >= 2 && (!aligned || bytes / count < kStageBelow);
}

Staging::~Staging() {
  KeptBlocks& k = kept();
  for (UniqueLockedBuffer& b : blocks_) {
    if (b.size() == kBlock && (k.blocks.size() + 1) * kBlock <= kKeepBytes) k.blocks.push_back(std::move(b));
  }
}

unsigned char* Staging::take(std::size_t n) {
  n = (n + kPage - 1) / kPage * kPage;
  if (taken_ + n > kKeepBytes) return nullptr;
  taken_ += n;
  if (blocks_.empty() || blocks_.back().size() - used_ < n) {
    KeptBlocks& k = kept();
    if (n <= kBlock && !k.blocks.empty()) {
      blocks_.push_back(std::move(k.blocks.back()));
      k.blocks.pop_back();
    } else {
      blocks_.emplace_back(std::max(n, kBlock));
    }
    used_ = 0;
  }
  unsigned char* p = static_cast<unsigned char*>(blocks_.back().data()) + used_;
  used_ += n;
  return p;
}

void PageOps::scatter(const Chunk& c, const PageErrors& errs) {
  for (const Chunk::Staged& st : c.staged) {
    if (errs.err[st.page] != 0) continue;
    const unsigned char* from = st.at;
    for (const Segment& s : *st.segments) {
      if (s.nbytes == 0) continue;
      std::memcpy(s.data, from, s.nbytes);
      from += s.nbytes;
    }
  }
}

std::size_t PageOps::open_chunk(File& slab) {
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Chunk& c) { return c.slab == &slab; });
  if (it != open_.end()) return static_cast<std::size_t>(it - open_.begin());
  open_.emplace_back().slab = &slab;
  return open_.size() - 1;
}

void PageOps::close_if_full(std::size_t k, PageErrors& errs) {
  if (open_[k].bytes < chunk_bytes_) return;
  start(open_[k], errs);
  open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(k));
}

void PageOps::gather(const std::vector<Segment>& segments, unsigned char* to) {
  for (const Segment& s : segments) {
    if (s.nbytes == 0) continue;
    std::memcpy(to, s.data, s.nbytes);
    to += s.nbytes;
  }
}

void PageOps::add(std::size_t i, File& slab, const std::vector<Segment>& segments, std::uint64_t file_offset,
                  PageErrors& errs) {
  const std::size_t k = open_chunk(slab);
  Chunk& c = open_[k];
  c.pages.push_back(i);
  const std::size_t len = page_bytes_of(segments);
  unsigned char* at = staged(segments) ? staging_.take(len) : nullptr;
  if (at != nullptr) {
    if (write_) gather(segments, at);
    c.pieces.push_back(Chunk::Piece{at, file_offset, len, i});
    if (!write_) c.staged.push_back(Chunk::Staged{i, &segments, at});
    c.bytes += len;
    ++staged_pages_;
  } else {
    for (const Segment& s : segments) {
      if (s.nbytes == 0) continue;
      c.pieces.push_back(Chunk::Piece{static_cast<unsigned char*>(s.data), file_offset, s.nbytes, i});
      file_offset += s.nbytes;
      c.bytes += s.nbytes;
    }
  }
  close_if_full(k, errs);
}

void PageOps::flush(PageErrors& errs) {
  for (Chunk& c : open_) start(c, errs);
  open_.clear();
}

void PageOps::start(Chunk& c, PageErrors& errs) {
  Chunk& s = chunks_.emplace_back(std::move(c));
  if (s.pieces.empty()) return;  // empty pages: nothing to move
  unsigned char* lo = s.pieces.front().data;
  unsigned char* hi = lo;
  for (const Chunk::Piece& p : s.pieces) {
    lo = std::min(lo, p.data);
    hi = std::max(hi, p.data + p.nbytes);
  }
  std::vector<IoRange> ranges;
  ranges.reserve(s.pieces.size());
  for (const Chunk::Piece& p : s.pieces) {
    ranges.push_back(IoRange{p.file_offset, static_cast<std::size_t>(p.data - lo), p.nbytes});
  }
  const auto size = static_cast<std::size_t>(hi - lo);
  try {
    s.futs.emplace_back(write_ ? s.slab->pwrite_ranges(lo, size, ranges) : s.slab->pread_ranges(lo, size, ranges),
                        kAll);
    ++ops_;
    return;
  } catch (const Error& e) {
    if (!e.invalid_argument()) {
      for (std::size_t i : s.pages) {
        if (errs.err[i] == 0) errs.set(i, e);
      }
      return;
    }
  }
  // Refused as a whole (pages over the same memory): one operation per segment, as a page's
  // own would be; a segment refused marks its page.
  for (const Chunk::Piece& p : s.pieces) {
    if (errs.err[p.page] != 0) continue;
    try {
      s.futs.emplace_back(
          write_ ? s.slab->pwrite(p.data, p.nbytes, p.file_offset) : s.slab->pread(p.data, p.nbytes, p.file_offset),
          p.page);
      ++ops_;
    } catch (const Error& e) {
      errs.set(p.page, e);
    }
  }
}

void PageOps::settle_chunk(Chunk& c, PageErrors& errs) {
  for (auto& [f, page] : c.futs) {
    std::string w;
    const int e = internal::settle(f, &w);
    if (e == 0) continue;
    if (page != kAll) {
      if (errs.err[page] == 0) errs.set(page, e, w);
      continue;
    }
    for (std::size_t i : c.pages) {
      if (errs.err[i] == 0) errs.set(i, e, w);
    }
  }
  c.futs.clear();
}

}  // namespace deepio::kv::internal
