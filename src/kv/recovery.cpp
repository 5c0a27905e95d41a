// Opening a store: each folder's layout (kv.meta, made at first open), its slab files, its
// checkpoint and then either its journal (journal.cpp: the slots put since the checkpoint) or a
// scan of every slot header, resolved into the slot model (impl.hpp, "Checkpoint", for which
// headers are live). Runs once, on the constructing thread, before the batch threads start.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <unordered_map>

#include "kv/impl.hpp"

namespace deepio::kv {

using internal::aligned_buf;
using internal::AlignedBuf;
using internal::decode_header;
using internal::kHeaderBytes;
using internal::read_whole;

namespace {
constexpr std::size_t kScanChunkSlots = 2048;
constexpr std::size_t kScanInFlight = 8;
/// Pages read at once at open to check their data against their CRC.
constexpr std::size_t kVerifyInFlight = 32;
/// The most slab files a folder made now has (one with StoreOptions::slab_bytes 0).
constexpr std::uint64_t kMaxSlabs = 4;
/// A new slab is written with zeros once, in writes of this size, this many at once.
constexpr std::size_t kZeroChunk = std::size_t{4} << 20;
constexpr std::size_t kZeroInFlight = 8;

/// Writes zeros over bytes [0, bytes) of a new slab and syncs it once. fallocate leaves
/// unwritten extents: the first write of each slot would convert one, and the fdatasync of
/// that put batch would commit the file system's journal for it (ext4, XFS). Written once
/// here, a put's sync only flushes the data (docs/kv.md "Cost per page").
void write_zeros(File& slab, std::uint64_t bytes) {
  AlignedBuf zeros = aligned_buf(kZeroChunk);
  std::deque<Future> inflight;
  for (std::uint64_t off = 0; off < bytes; off += kZeroChunk) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kZeroChunk, bytes - off));
    inflight.push_back(slab.pwrite(zeros.get(), n, off));
    if (inflight.size() >= kZeroInFlight) {
      inflight.front().get();
      inflight.pop_front();
    }
  }
  while (!inflight.empty()) {
    inflight.front().get();
    inflight.pop_front();
  }
  slab.pwrite(nullptr, 0, 0, OpOptions{.fsync = true, .stream = std::nullopt}).get();
}

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

InvalidArgument no_store(const std::string& folder) {
  return InvalidArgument("kv: folder " + folder +
                         " holds no store; give capacity_bytes (the total over the folders) to make one there "
                         "(a store is never made with a size of its own: a folder on the wrong drive, one that "
                         "failed to mount, would fill that file system)");
}

InvalidArgument other_fingerprint(const std::string& folder, const std::string& stored, const std::string& given) {
  return InvalidArgument("kv: folder " + folder + " holds pages of fingerprint " + in_quotes(stored) +
                         ", not of the fingerprint given, " + in_quotes(given) +
                         "; open it with that fingerprint, or with clear_on_mismatch to drop its pages");
}

/// The file system that would hold `folder` (its nearest existing ancestor's): its id and the
/// bytes free for an unprivileged writer, plus what the folder's slab files already hold (a
/// creation cut short).
std::pair<std::uint64_t, std::uint64_t> file_system_of(const std::string& folder) {
  std::filesystem::path p = std::filesystem::absolute(folder);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  struct statvfs vfs {};
  if (::statvfs(p.c_str(), &vfs) != 0) throw Error(errno, "kv: cannot statvfs", p.string());
  std::uint64_t free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    struct stat st {};
    if (name.rfind("slab-", 0) == 0 && ::stat(e.path().c_str(), &st) == 0) {
      free += static_cast<std::uint64_t>(st.st_blocks) * 512;
    }
  }
  return {static_cast<std::uint64_t>(vfs.f_fsid), free};
}
}  // namespace

void Store::Impl::check_layouts(std::uint64_t share) {
  struct Need {
    std::uint64_t bytes = 0, free = 0;
    std::size_t folders = 0;
  };
  std::map<std::uint64_t, Need> need;  // per file system: new folders on one share its space
  for (const std::string& folder : opt.folders) {
    std::optional<std::vector<unsigned char>> bytes;
    try {
      bytes = read_whole(*handle, folder + "/kv.meta");
    } catch (const Error&) {
      continue;  // unreadable (not a folder, no access): open_folder fails it
    }
    std::optional<internal::Meta> meta;
    if (bytes) meta = internal::decode_meta(*bytes);
    if (meta) {
      if (meta->page_bytes != opt.page_bytes) {
        throw InvalidArgument("kv: " + folder + " holds a store of page_bytes " + std::to_string(meta->page_bytes) +
                              ", not " + std::to_string(opt.page_bytes));
      }
      if (meta->fingerprint != opt.fingerprint && !opt.clear_on_mismatch) {
        throw other_fingerprint(folder, meta->fingerprint, opt.fingerprint);
      }
      continue;
    }
    if (share == 0) throw no_store(folder);
    const auto [fs, free] = file_system_of(folder);
    Need& n = need[fs];
    n.bytes += share;
    n.free = std::max(n.free, free);
    if (++n.folders; n.bytes > n.free) {
      throw InvalidArgument("kv: folder " + folder + " would get " + std::to_string(share) + " bytes (capacity_bytes " +
                            std::to_string(opt.capacity_bytes) + " over " + std::to_string(opt.folders.size()) +
                            " folders; " + std::to_string(n.bytes) + " for the " + std::to_string(n.folders) +
                            " new ones on its file system), but that file system has " + std::to_string(n.free) +
                            " bytes free; give a smaller capacity_bytes");
    }
  }
}

void Store::Impl::open_folder(std::uint32_t fi, std::uint64_t share) {
  Folder& f = folders[fi];
  std::filesystem::create_directories(f.path);
  const std::string meta_path = f.path + "/kv.meta";
  auto bytes = read_whole(*handle, meta_path);
  std::optional<internal::Meta> meta;
  if (bytes) meta = internal::decode_meta(*bytes);
  bool fresh = false;
  if (meta) {
    const auto pb = meta->page_bytes;
    if (pb != opt.page_bytes) {
      throw InvalidArgument("kv: " + f.path + " holds a store of page_bytes " + std::to_string(pb) + ", not " +
                            std::to_string(opt.page_bytes));
    }
    if (meta->fingerprint != opt.fingerprint) {
      if (!opt.clear_on_mismatch) throw other_fingerprint(f.path, meta->fingerprint, opt.fingerprint);
      f.clear_pages = true;  // scan_folder drops them
    }
    f.slots = meta->slots;
    f.per_slab = meta->per_slab;
    f.meta = *meta;
  } else {
    if (share == 0) throw no_store(f.path);  // checked by check_layouts, unless kv.meta went since
    f.slots = std::max<std::uint64_t>(1, share / slot_bytes);
    f.slots = std::min<std::uint64_t>(f.slots, 0xFFFFFFFFull);
    // One slab file per folder, or slabs of slab_bytes but never more than kMaxSlabs: a
    // folder costs a few descriptors (two per slab, plus kv.lock) whatever its size.
    const std::uint64_t fewest = (f.slots + kMaxSlabs - 1) / kMaxSlabs;
    f.per_slab = opt.slab_bytes == 0 ? f.slots : std::max<std::uint64_t>(opt.slab_bytes / slot_bytes, fewest);
    f.per_slab = std::max<std::uint64_t>(f.per_slab, 1);
    f.meta.journal_blocks = internal::journal_blocks_for(f.per_slab);
    fresh = true;
  }
  const std::uint64_t nslabs = (f.slots + f.per_slab - 1) / f.per_slab;
  for (std::uint64_t s = 0; s < nslabs; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "/slab-%04llu.bin", static_cast<unsigned long long>(s));
    File file = handle->open(f.path + name, O_RDWR | O_CREAT);
    const std::uint64_t want = std::min(f.per_slab, f.slots - s * f.per_slab) * slot_bytes +
                               std::uint64_t{f.meta.journal_blocks} * internal::kJournalBlock;
    if (file.size() < want) {
      if (::fallocate(file.fd(), 0, 0, static_cast<off_t>(want)) != 0) {
        const int e = errno;
        if ((e != EOPNOTSUPP && e != ENOSYS) || ::ftruncate(file.fd(), static_cast<off_t>(want)) != 0) {
          throw Error(e, "kv: cannot allocate the slab", file.path(), 0, want);
        }
      }
    }
    if (fresh) write_zeros(file, want);  // also after a creation cut short (no kv.meta yet)
    f.slabs.push_back(std::move(file));
  }
  if (fresh) {
    // The journal's heads and an empty checkpoint before kv.meta: a creation cut short has no
    // kv.meta and starts again; one that completed opens from the journal at once.
    internal::Meta m;
    m.page_bytes = opt.page_bytes;
    m.slot_bytes = slot_bytes;
    m.slots = f.slots;
    m.per_slab = f.per_slab;
    m.journal_blocks = f.meta.journal_blocks;
    m.fingerprint = opt.fingerprint;
    f.meta = m;
    journal_create(fi);
    internal::replace_durably(*handle, f.path, "index.ckpt", internal::encode_checkpoint(0, {}, true));
    internal::replace_durably(*handle, f.path, "kv.meta", internal::encode_meta(m));
  }
  model.init_folder(fi, f.slots);
}

void Store::Impl::scan_folder(std::uint32_t fi, std::unordered_map<std::string, std::vector<Candidate>>* found) {
  Folder& f = folders[fi];
  // The checkpoint.
  std::uint64_t bound = 0;
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> ck;  // slot -> gen, tick
  if (auto b = read_whole(*handle, f.path + "/index.ckpt")) {
    if (auto c = internal::decode_checkpoint(*b)) {
      // With a journal: the checkpoint and the slots put since, unless the journal is incomplete.
      if (f.has_journal() && c->version == 2 && !f.clear_pages && journal_open(fi, *c, found)) return;
      bound = c->bound;
      for (const internal::CkptRecord& r : c->records) ck[r.slot] = {r.gen, r.tick};
    }
  }
  // Every generation up to the bound was handed out, though its header may be gone (a folder
  // that came back empty, a put that failed after taking one): a new page at or below it would
  // read as freed before this checkpoint at the next scan.
  next_gen = std::max(next_gen, bound + 1);
  struct Chunk {
    std::uint32_t first;
    std::size_t count;
    AlignedBuf buf;
    Future fut;
  };
  std::deque<Chunk> inflight;
  // Dead whatever the checkpoint says: at or below the floor (pages of an older fingerprint),
  // or every page when this open drops them (clear_on_mismatch).
  const std::uint64_t floor = std::max(f.meta.gen_floor, f.stale_floor);  // failed_list.cpp
  std::uint64_t highest = 0;
  auto drain_one = [&] {
    Chunk c = std::move(inflight.front());
    inflight.pop_front();
    c.fut.get();
    st.open_headers_read += c.count;
    for (std::size_t k = 0; k < c.count; ++k) {
      const std::uint32_t slot = c.first + static_cast<std::uint32_t>(k);
      auto d = decode_header(c.buf.get() + k * kHeaderBytes, opt.page_bytes);
      if (!d) continue;
      next_gen = std::max(next_gen, d->gen + 1);
      highest = std::max(highest, d->gen);
      if (f.clear_pages || d->gen <= floor) continue;
      std::uint64_t tick = 0;
      const bool listed = d->gen <= bound;
      if (listed) {
        auto it = ck.find(slot);
        if (it == ck.end() || it->second.first != d->gen) continue;  // freed before the checkpoint
        tick = it->second.second;
      } else {
        tick = (std::uint64_t{1} << 62) + d->gen;  // after the checkpoint: newest
      }
      (*found)[std::string(d->key)].push_back(Candidate{fi, slot, d->gen, d->len, tick, d->crc, listed});
    }
  };
  for (std::uint64_t s = 0; s < f.slabs.size(); ++s) {
    const std::uint64_t in_slab = std::min(f.per_slab, f.slots - s * f.per_slab);
    for (std::uint64_t k = 0; k < in_slab; k += kScanChunkSlots) {
      const std::size_t count = std::min<std::uint64_t>(kScanChunkSlots, in_slab - k);
      Chunk c{static_cast<std::uint32_t>(s * f.per_slab + k), count, aligned_buf(count * kHeaderBytes), {}};
      std::vector<IoRange> ranges(count);
      for (std::size_t r = 0; r < count; ++r) ranges[r] = IoRange{(k + r) * slot_bytes, r * kHeaderBytes, kHeaderBytes};
      c.fut = f.slabs[s].pread_ranges(c.buf.get(), count * kHeaderBytes, ranges);
      inflight.push_back(std::move(c));
      if (inflight.size() >= kScanInFlight) drain_one();
    }
  }
  while (!inflight.empty()) drain_one();
  next_gen = std::max(next_gen, floor + 1);  // new pages above the floor, even if no header is left
  // A journal that was incomplete (or unread) stays "scan" until a checkpoint covers this scan.
  journal_reset(fi, true, next_gen - 1);
  f.durable_bound = bound;
  if (f.clear_pages) {
    // One atomic replace drops every page: the new fingerprint and a floor at the highest
    // generation on the drive. A crash before it leaves the old kv.meta (a mismatch again), a
    // crash after it no page of the old fingerprint (all at or below the floor).
    internal::Meta m = f.meta;
    m.fingerprint = opt.fingerprint;
    m.gen_floor = std::max(floor, highest);
    internal::replace_durably(*handle, f.path, "kv.meta", internal::encode_meta(m));
    warnings.push_back("deepio.kv: folder " + f.path + " held pages of fingerprint " + in_quotes(f.meta.fingerprint) +
                       "; opened with fingerprint " + in_quotes(opt.fingerprint) +
                       " and clear_on_mismatch: every page of it was dropped");
    f.meta = m;
    f.clear_pages = false;
  }
}

std::vector<char> Store::Impl::data_matches(const std::vector<const Candidate*>& cands) {
  struct Read {
    std::size_t i;
    AlignedBuf buf;
    Future fut;
  };
  std::vector<char> ok(cands.size(), 0);
  std::deque<Read> inflight;
  auto drain_one = [&] {
    Read r = std::move(inflight.front());
    inflight.pop_front();
    const Candidate& c = *cands[r.i];
    try {
      if (c.len > 0) r.fut.get();
      ok[r.i] = crc32c(r.buf.get(), c.len) == c.crc ? 1 : 0;
    } catch (const Error&) {
      ok[r.i] = 0;  // unreadable: not whole (a folder that fails for good fails at its first batch)
    }
  };
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = *cands[i];
    ++st.open_pages_read;
    Folder& f = folders[c.folder];
    Read r{i, aligned_buf(std::max<std::uint64_t>(c.len, 1)), {}};
    if (c.len > 0) r.fut = f.slab_of(c.slot).pread(r.buf.get(), c.len, f.offset_of(c.slot, slot_bytes) + kHeaderBytes);
    inflight.push_back(std::move(r));
    if (inflight.size() >= kVerifyInFlight) drain_one();
  }
  while (!inflight.empty()) drain_one();
  return ok;
}

void Store::Impl::open() {
  const auto t0 = std::chrono::steady_clock::now();
  handle = std::make_unique<Handle>(opt.handle);
  device = deepio::detail::device_support();
  folders.resize(opt.folders.size());
  const std::uint64_t share = opt.capacity_bytes / opt.folders.size();
  if (opt.capacity_bytes != 0 && share < slot_bytes) {
    throw InvalidArgument("kv: capacity_bytes " + std::to_string(opt.capacity_bytes) + " holds less than one slot (" +
                          std::to_string(slot_bytes) + " bytes) per folder");
  }
  // Every folder's layout against the options, before anything is made, locked or written.
  check_layouts(share);
  // Every folder's lock first: one held by another store fails the open as a whole, before
  // anything is read or written. A folder that cannot be made or locked otherwise is left to
  // open_folder, which marks it failed for the same reason.
  for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
    folders[fi].path = opt.folders[fi];
    try {
      folders[fi].lock = internal::FolderLock(folders[fi].path);
    } catch (const Error& e) {
      if (e.errnum() == EBUSY) throw;
    } catch (const std::filesystem::filesystem_error&) {
    }
  }
  read_failed_lists();
  std::unordered_map<std::string, std::vector<Candidate>> found;
  std::size_t usable = 0;
  std::optional<Error> first;
  for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
    try {
      open_folder(fi, share);
      scan_folder(fi, &found);
      folders[fi].opened = true;
      ++usable;
    } catch (const InvalidArgument&) {
      throw;
    } catch (const Error& e) {
      fail_folder(fi, e.errnum(), e.what());
      if (!first) first = e;
    } catch (const std::filesystem::filesystem_error& e) {
      fail_folder(fi, e.code().value(), e.what());
      if (!first) first = Error(e.code().value(), e.what(), folders[fi].path);
    }
  }
  if (usable == 0) throw *first;
  for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
    if (model.failed(fi)) folders[fi].failed_gen = std::max(folders[fi].failed_gen, next_gen - 1);
  }
  // Resolve: per key the newest candidate that is whole. The checkpoint vouches for a page it
  // lists when the key has no other; any other is taken only if its data matches its CRC: a
  // put writes its header and its data at once, so a crash in a put can leave a header over
  // data that is not whole (and a replace torn by a crash leaves the older version).
  struct Pending {
    const std::string* key;
    std::vector<Candidate>* cands;
    std::size_t next = 0;
  };
  std::vector<Pending> todo;
  todo.reserve(found.size());
  for (auto& [key, cands] : found) {
    std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.gen > b.gen; });
    todo.push_back(Pending{&key, &cands});
  }
  std::vector<std::pair<std::string, internal::Found>> pages;
  pages.reserve(found.size());
  auto take = [&](const std::string& key, const Candidate& c) {
    pages.emplace_back(key, internal::Found{internal::Place{c.folder, c.slot}, c.gen, c.len, c.tick, c.crc});
  };
  while (!todo.empty()) {
    std::vector<Pending> check;  // each one's candidate `next` is read
    std::vector<const Candidate*> reads;
    for (Pending& p : todo) {
      while (p.next < p.cands->size() && model.failed((*p.cands)[p.next].folder)) ++p.next;
      if (p.next == p.cands->size()) continue;  // nothing whole: the key is not there
      const Candidate& c = (*p.cands)[p.next];
      if (c.whole || (c.listed && p.cands->size() == 1)) {
        take(*p.key, c);
        continue;
      }
      check.push_back(p);
      reads.push_back(&c);
    }
    const std::vector<char> ok = data_matches(reads);
    todo.clear();
    for (std::size_t i = 0; i < check.size(); ++i) {
      Pending& p = check[i];
      if (ok[i] != 0) {
        take(*p.key, (*p.cands)[p.next]);
      } else {
        ++p.next;
        todo.push_back(p);
      }
    }
  }
  model.load(pages);
  st.recovered_pages = model.pages();
  st.open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace deepio::kv
