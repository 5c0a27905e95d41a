// The slot journal (journal.hpp): a put batch's records, the ring's bookkeeping, and open from
// a format-2 checkpoint plus the journal.
#include "kv/journal.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_set>

#include "kv/impl.hpp"

namespace deepio::kv {

using internal::aligned_buf;
using internal::AlignedBuf;
using internal::decode_header;
using internal::JournalBlock;
using internal::kHeaderBytes;
using internal::kJournalBlock;
using internal::kJournalRecordsPerBlock;

namespace {
/// Reads in flight of an open from the journal, each of adjacent slots (header and page) of
/// at most kRunBytes (one slot if larger).
constexpr std::size_t kSuspectInFlight = 32;
constexpr std::uint64_t kRunBytes = std::uint64_t{1} << 20;
/// How far above the highest generation it knows an open from the journal restarts the
/// counter (impl.hpp): more than the puts a crash can cut in flight.
constexpr std::uint64_t kJournalGenGap = std::uint64_t{1} << 32;
}  // namespace

namespace internal {

std::uint32_t journal_blocks_for(std::uint64_t per_slab) {
  const std::uint64_t ring = std::clamp<std::uint64_t>((per_slab + 63) / 64, 64, 4096);
  return static_cast<std::uint32_t>(ring + 1);
}

void JournalWrites::finish(std::vector<int>& err, std::vector<std::string>& what) {
  for (Write& w : writes_) {
    int e = w.err;
    std::string why = w.what;
    if (e == 0 && w.fut.valid()) e = settle(w.fut, &why);
    if (e == 0) continue;
    for (std::size_t i : w.pages) {
      if (err[i] == 0) {
        err[i] = e;
        what[i] = why;
      }
    }
  }
  writes_.clear();
}

}  // namespace internal

void Store::Impl::journal_write(internal::JournalWrites& jw) {
  using Page = internal::JournalWrites::Page;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<const Page*>> groups;  // per (folder, slab)
  for (const Page& p : jw.pages_) {
    const Folder& f = folders[p.folder];
    if (f.has_journal()) groups[{p.folder, p.slot / f.per_slab}].push_back(&p);
  }
  if (groups.empty()) return;
  struct Plan {
    std::uint32_t fi = 0;
    std::uint64_t slab = 0;
    const std::vector<const Page*>* pages = nullptr;
    bool head = false, scan = false;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> blocks{};  // ring position, sequence number
  };
  std::vector<Plan> plans;
  {
    std::lock_guard lk(mu);
    for (auto& [where, pages] : groups) {
      Folder& f = folders[where.first];
      internal::SlabJournal& j = f.journal[where.second];
      Plan pl{where.first, where.second, &pages};
      std::uint64_t newest = 0;
      for (const Page* p : pages) newest = std::max(newest, p->gen);
      const std::size_t need = (pages.size() + kJournalRecordsPerBlock - 1) / kJournalRecordsPerBlock;
      if (!j.scan) {
        bool room = need <= j.ring;
        for (std::size_t b = 0; b < need && room; ++b) room = j.max_gen[(j.cursor + b) % j.ring] <= f.durable_bound;
        if (room) {
          for (std::size_t b = 0; b < need; ++b) {
            const std::uint32_t pos = (j.cursor + static_cast<std::uint32_t>(b)) % j.ring;
            std::uint64_t mg = 0;
            const std::size_t end = std::min(pages.size(), (b + 1) * kJournalRecordsPerBlock);
            for (std::size_t k = b * kJournalRecordsPerBlock; k < end; ++k) mg = std::max(mg, pages[k]->gen);
            j.max_gen[pos] = mg;
            ++j.used;
            pl.blocks.emplace_back(pos, j.next_seq++);
          }
          j.cursor = static_cast<std::uint32_t>((j.cursor + need) % j.ring);
          pl.head = std::exchange(j.head_pending, false);
        } else {
          j.scan = true;  // a record the last checkpoint does not cover would be overwritten
          j.head_pending = false;
        }
      }
      if (j.scan) {
        j.scan_max_gen = std::max(j.scan_max_gen, newest);
        pl.head = pl.scan = true;
      }
      if (j.scan || j.used * 2 >= j.ring) journal_wants_ckpt = true;
      plans.push_back(std::move(pl));
    }
  }
  for (const Plan& pl : plans) {
    Folder& f = folders[pl.fi];
    File& slab = f.slabs[pl.slab];
    const std::uint64_t base = f.journal_offset(pl.slab, slot_bytes);
    std::vector<std::size_t> pages;
    for (const Page* p : *pl.pages) pages.push_back(p->page);
    auto start = [&](const JournalBlock& blk, std::uint64_t off) {
      internal::JournalWrites::Write w{pages, aligned_buf(kJournalBlock), {}, 0, {}};
      internal::encode_journal_block(w.buf.get(), blk);
      try {
        w.fut = slab.pwrite(w.buf.get(), kJournalBlock, off);
        ++jw.ops_;
      } catch (const Error& e) {
        w.err = internal::errno_of(e);
        w.what = e.what();
      }
      jw.writes_.push_back(std::move(w));
    };
    if (pl.head) start(JournalBlock{true, pl.scan, 0, {}}, base);
    for (std::size_t b = 0; b < pl.blocks.size(); ++b) {
      JournalBlock blk{false, false, pl.blocks[b].second, {}};
      const std::size_t end = std::min(pl.pages->size(), (b + 1) * kJournalRecordsPerBlock);
      for (std::size_t k = b * kJournalRecordsPerBlock; k < end; ++k) {
        blk.records.push_back(internal::JournalRecord{(*pl.pages)[k]->slot, (*pl.pages)[k]->gen});
      }
      start(blk, base + (std::uint64_t{pl.blocks[b].first} + 1) * kJournalBlock);
    }
  }
}

void Store::Impl::journal_checkpointed(std::uint32_t fi, std::uint64_t bound) {
  Folder& f = folders[fi];
  if (!f.has_journal()) return;
  f.durable_bound = std::max(f.durable_bound, bound);
  for (internal::SlabJournal& j : f.journal) {
    j.used = static_cast<std::uint32_t>(
        std::count_if(j.max_gen.begin(), j.max_gen.end(), [&](std::uint64_t g) { return g > f.durable_bound; }));
    if (j.scan && j.scan_max_gen <= f.durable_bound) {
      j.scan = false;
      j.head_pending = true;
    }
  }
}

void Store::Impl::journal_reset(std::uint32_t fi, bool scan, std::uint64_t upto) {
  Folder& f = folders[fi];
  f.journal.assign(f.has_journal() ? f.slabs.size() : 0, internal::SlabJournal{});
  for (internal::SlabJournal& j : f.journal) {
    j.ring = f.meta.journal_blocks - 1;
    j.max_gen.assign(j.ring, 0);
    j.scan = scan;
    j.scan_max_gen = upto;
  }
  if (scan && f.has_journal()) journal_wants_ckpt = true;
}

void Store::Impl::journal_create(std::uint32_t fi) {
  Folder& f = folders[fi];
  const AlignedBuf head = aligned_buf(kJournalBlock);
  internal::encode_journal_block(head.get(), JournalBlock{true, false, 0, {}});
  std::vector<Future> futs;
  for (std::uint64_t s = 0; s < f.slabs.size(); ++s) {
    futs.push_back(f.slabs[s].pwrite(head.get(), kJournalBlock, f.journal_offset(s, slot_bytes),
                                     OpOptions{.fsync = true, .stream = std::nullopt}));
  }
  for (Future& fut : futs) fut.get();
}

void Store::Impl::journal_close() noexcept {
  try {
    const AlignedBuf head = aligned_buf(kJournalBlock);
    internal::encode_journal_block(head.get(), JournalBlock{true, false, 0, {}});
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      Folder& f = folders[fi];
      for (std::uint64_t s = 0; s < f.journal.size(); ++s) {
        {
          std::lock_guard lk(mu);
          if (model.failed(fi) || !std::exchange(f.journal[s].head_pending, false)) continue;
        }
        try {
          f.slabs[s]
              .pwrite(head.get(), kJournalBlock, f.journal_offset(s, slot_bytes),
                      OpOptions{.fsync = true, .stream = std::nullopt})
              .get();
        } catch (const Error&) {
          // "scan" stays on the drive: the next open scans this slab's folder
        }
      }
    }
  } catch (...) {
  }
}

bool Store::Impl::journal_open(std::uint32_t fi, internal::Ckpt& ck,
                               std::unordered_map<std::string, std::vector<Candidate>>* found) {
  Folder& f = folders[fi];
  const std::uint64_t jbytes = std::uint64_t{f.meta.journal_blocks} * kJournalBlock;
  const std::uint64_t bound = ck.bound;
  std::vector<AlignedBuf> bufs;
  std::vector<Future> reads;
  for (std::uint64_t s = 0; s < f.slabs.size(); ++s) {
    bufs.push_back(aligned_buf(jbytes));
    reads.push_back(f.slabs[s].pread(bufs.back().get(), jbytes, f.journal_offset(s, slot_bytes)));
  }
  for (Future& r : reads) r.get();
  journal_reset(fi, false, 0);
  std::uint64_t known = bound;  // the highest generation this open knows was handed out
  std::vector<std::uint32_t> suspects;
  for (std::uint64_t s = 0; s < f.slabs.size(); ++s) {
    const auto head = internal::decode_journal_block(bufs[s].get());
    if (!head || !head->head || head->scan) return false;  // the ring may miss records
    internal::SlabJournal& j = f.journal[s];
    std::uint64_t best = 0;
    for (std::uint32_t pos = 0; pos < j.ring; ++pos) {
      const auto blk = internal::decode_journal_block(bufs[s].get() + (std::uint64_t{pos} + 1) * kJournalBlock);
      if (!blk || blk->head) continue;
      if (blk->seq >= best) {
        best = blk->seq;
        j.cursor = (pos + 1) % j.ring;
      }
      std::uint64_t mg = 0;
      for (const internal::JournalRecord& r : blk->records) {
        if (r.slot >= f.slots || r.slot / f.per_slab != s) continue;
        mg = std::max(mg, r.gen);
        if (r.gen > bound) suspects.push_back(r.slot);
      }
      known = std::max(known, mg);
      if (mg > bound) {
        j.max_gen[pos] = mg;
        ++j.used;
      }
    }
    j.next_seq = best + 1;
  }
  f.durable_bound = bound;
  std::sort(suspects.begin(), suspects.end());
  suspects.erase(std::unique(suspects.begin(), suspects.end()), suspects.end());
  const std::unordered_set<std::uint32_t> suspect(suspects.begin(), suspects.end());
  // The checkpoint's pages, unread, but those whose slot a put took since (read below).
  const std::uint64_t floor = std::max(f.meta.gen_floor, f.stale_floor);  // failed_list.cpp
  std::unordered_map<std::uint32_t, const internal::CkptRecord*> listed;  // suspect slot -> its record
  found->reserve(found->size() + ck.records.size() + suspects.size());
  for (internal::CkptRecord& r : ck.records) {
    if (r.slot >= f.slots || r.gen > bound || r.len > opt.page_bytes || r.key.empty()) continue;
    known = std::max(known, r.gen);
    if (r.gen <= floor) continue;
    if (suspect.count(r.slot) != 0) {
      listed[r.slot] = &r;
      continue;
    }
    (*found)[std::move(r.key)].push_back(Candidate{fi, r.slot, r.gen, r.len, r.tick, r.crc, true});
  }
  // Each slot the journal lists above the bound: its header and page in one read (adjacent
  // slots of a slab in one read of up to kRunBytes), taken only when both are whole (a put
  // writes them at once: a crash can leave either torn).
  struct Read {
    std::uint32_t first;
    std::uint32_t count;
    AlignedBuf buf;
    Future fut;
  };
  std::deque<Read> inflight;
  auto take_slot = [&](std::uint32_t slot, const unsigned char* bytes) {
    const auto d = decode_header(bytes, opt.page_bytes);
    if (!d) return;
    known = std::max(known, d->gen);
    if (d->gen <= floor) return;
    std::uint64_t tick = (std::uint64_t{1} << 62) + d->gen;  // after the checkpoint: newest
    const bool was_listed = d->gen <= bound;
    if (was_listed) {
      const auto it = listed.find(slot);
      if (it == listed.end() || it->second->gen != d->gen) return;  // freed before the checkpoint
      tick = it->second->tick;
    }
    if (crc32c(bytes + kHeaderBytes, d->len) != d->crc) return;
    (*found)[std::string(d->key)].push_back(Candidate{fi, slot, d->gen, d->len, tick, d->crc, was_listed, true});
  };
  auto drain_one = [&] {
    Read r = std::move(inflight.front());
    inflight.pop_front();
    try {
      r.fut.get();
    } catch (const Error&) {
      return;  // unreadable: not whole (a folder that fails for good fails at its first batch)
    }
    for (std::uint32_t k = 0; k < r.count; ++k) take_slot(r.first + k, r.buf.get() + k * slot_bytes);
  };
  const std::uint64_t max_run = std::max<std::uint64_t>(1, kRunBytes / slot_bytes);
  for (std::size_t i = 0; i < suspects.size();) {
    std::size_t n = 1;
    while (i + n < suspects.size() && n < max_run && suspects[i + n] == suspects[i] + n &&
           suspects[i + n] / f.per_slab == suspects[i] / f.per_slab) {
      ++n;
    }
    st.open_headers_read += n;
    st.open_pages_read += n;
    Read r{suspects[i], static_cast<std::uint32_t>(n), aligned_buf(n * slot_bytes), {}};
    r.fut = f.slab_of(r.first).pread(r.buf.get(), n * slot_bytes, f.offset_of(r.first, slot_bytes));
    inflight.push_back(std::move(r));
    if (inflight.size() >= kSuspectInFlight) drain_one();
    i += n;
  }
  while (!inflight.empty()) drain_one();
  next_gen = std::max({next_gen, known + 1 + kJournalGenGap, floor + 1});
  return true;
}

}  // namespace deepio::kv
