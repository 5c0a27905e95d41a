// Put and get batches: the I/O of the put and get protocols (impl.hpp) and their commit into
// the slot model. Runs on the store's batch threads, one batch per thread, mu taken only to
// allocate/pin and to commit/unpin.
#include <deque>
#include <map>

#include "kv/impl.hpp"
#include "kv/page_io.hpp"

namespace deepio::kv {

using internal::DeviceScratch;
using internal::encode_header;
using internal::errno_of;
using internal::Folder;
using internal::kHeaderBytes;
using internal::PageErrors;
using internal::PageOps;
using internal::settle;

namespace {

/// The slot headers of a put batch: page i's header is bytes [i * kHeaderBytes, +kHeaderBytes)
/// of one aligned buffer, written with one ranged write per slab (add() the pages, write(),
/// then finish() before the buffer goes), and then each slab synced once (sync()).
class SlabHeaders {
 public:
  explicit SlabHeaders(std::size_t pages) : bytes_(pages * kHeaderBytes), cap_(bytes_), buf_(borrow(&cap_)) {}
  ~SlabHeaders() {
    // Nothing may still write from the buffer when the next batch takes it (a batch that
    // threw between write() and finish()).
    for (auto& [where, g] : groups_) {
      std::string w;
      if (g.started) (void)settle(g.fut, &w);
    }
    give_back(std::move(buf_), cap_);
  }
  SlabHeaders(const SlabHeaders&) = delete;
  SlabHeaders& operator=(const SlabHeaders&) = delete;
  [[nodiscard]] unsigned char* at(std::size_t i) const {
    return static_cast<unsigned char*>(buf_.data()) + i * kHeaderBytes;
  }
  /// Page i's header is that of slot `slot` of folder `fi` (f).
  void add(std::size_t i, std::uint32_t fi, const Folder& f, std::uint32_t slot, std::uint64_t slot_bytes) {
    Group& g = groups_[{fi, slot / f.per_slab}];
    g.pages.push_back(i);
    g.ranges.push_back(IoRange{f.offset_of(slot, slot_bytes), i * kHeaderBytes, kHeaderBytes});
  }
  /// Page i went with its header (PageOps::add_with_header): its slab is synced all the same.
  void add_written(std::size_t i, std::uint32_t fi, const Folder& f, std::uint32_t slot) {
    groups_[{fi, slot / f.per_slab}].pages.push_back(i);
  }
  /// Starts the header writes (not synced); a call that throws marks its pages.
  void write(std::vector<Folder>& folders, PageErrors& errs) {
    for (auto& [where, g] : groups_) {
      if (g.ranges.empty()) continue;  // every page of the slab went with its header
      start(g, errs,
            [&] { return folders[where.first].slabs[where.second].pwrite_ranges(buf_.data(), bytes_, g.ranges); });
    }
  }
  /// Starts one fdatasync of each slab whose pages have no error yet: a zero-byte write with
  /// OpOptions::fsync, which the engine's sync threads turn into the file's fdatasync (slabs
  /// of several folders at once). It covers every write of the slab that completed before.
  void sync(std::vector<Folder>& folders, PageErrors& errs) {
    for (auto& [where, g] : groups_) {
      bool any = false;
      for (std::size_t i : g.pages) any = any || errs.err[i] == 0;
      if (!any) continue;
      start(g, errs, [&] {
        return folders[where.first].slabs[where.second].pwrite(nullptr, 0, 0,
                                                               OpOptions{.fsync = true, .stream = std::nullopt});
      });
    }
  }
  /// Engine operations started (a ranged write or a sync per slab).
  [[nodiscard]] std::uint64_t ops() const noexcept { return ops_; }
  /// Waits for what write() or sync() started; a failed one marks its pages.
  void finish(PageErrors& errs) {
    for (auto& [where, g] : groups_) {
      if (!g.started) continue;
      g.started = false;
      std::string w;
      const int e = settle(g.fut, &w);
      if (e != 0) {
        for (std::size_t i : g.pages) {
          if (errs.err[i] == 0) errs.set(i, e, w);
        }
      }
    }
  }

 private:
  struct Group {
    std::vector<std::size_t> pages;
    std::vector<IoRange> ranges;
    Future fut;
    bool started = false;
  };
  template <typename Fn>
  void start(Group& g, PageErrors& errs, Fn&& fn) {
    try {
      g.fut = fn();
      g.started = true;
      ++ops_;
    } catch (const Error& e) {
      for (std::size_t i : g.pages) {
        if (errs.err[i] == 0) errs.set(i, e);
      }
    }
  }
  // The batch thread keeps its last buffer (up to kKeep bytes) for the next batch: a new one
  // of 512 KiB (128 pages) is an mmap and 128 zeroed page faults per batch. Locked memory
  // (deepio's allocation): the io_uring backend registers it, so a header's request pins
  // nothing (the pages of a plain buffer are pinned by the kernel for every request).
  static constexpr std::size_t kKeep = std::size_t{4} << 20;
  static UniqueLockedBuffer& kept() {
    thread_local UniqueLockedBuffer k;
    return k;
  }
  /// A buffer of at least *bytes; *bytes becomes its size.
  static UniqueLockedBuffer borrow(std::size_t* bytes) {
    UniqueLockedBuffer& k = kept();
    if (k.data() != nullptr && k.size() >= *bytes) {
      *bytes = k.size();
      return std::move(k);
    }
    UniqueLockedBuffer b(*bytes);
    *bytes = b.size();
    return b;
  }
  static void give_back(UniqueLockedBuffer buf, std::size_t bytes) {
    UniqueLockedBuffer& k = kept();
    if (buf.data() != nullptr && bytes <= kKeep && (k.data() == nullptr || k.size() < bytes)) k = std::move(buf);
  }
  std::size_t bytes_;
  std::size_t cap_;  // buf_'s size (a kept buffer may be larger than bytes_)
  std::uint64_t ops_ = 0;
  UniqueLockedBuffer buf_;  // before groups_: their futures go first
  std::map<std::pair<std::uint32_t, std::uint64_t>, Group> groups_;
};

}  // namespace

std::vector<bool> Store::Impl::put_batch(Job& job, DeviceScratch& scratch) {
  std::vector<bool> io_failed;
  std::vector<bool> ok = do_put(job, scratch, &io_failed);
  for (std::size_t round = 1; round < folders.size(); ++round) {
    Job again;
    again.fences = job.fences;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < ok.size(); ++i) {
      if (!io_failed[i]) continue;
      where.push_back(i);
      again.keys.push_back(job.keys[i]);
      again.segments.push_back(job.segments[i]);
    }
    if (where.empty()) break;
    {
      std::lock_guard lk(mu);
      st.puts -= where.size();  // counted once
      st.puts_failed -= where.size();
    }
    std::vector<bool> again_ok = do_put(again, scratch, &io_failed);
    std::vector<bool> again_io = io_failed;
    io_failed.assign(ok.size(), false);
    for (std::size_t k = 0; k < where.size(); ++k) {
      ok[where[k]] = again_ok[k];
      io_failed[where[k]] = again_io[k];
    }
  }
  return ok;
}

std::vector<bool> Store::Impl::do_put(Job& job, DeviceScratch& scratch, std::vector<bool>* io_failed) {
  const std::size_t n = job.keys.size();
  std::vector<bool> ok(n, false);
  io_failed->assign(n, false);
  struct Slot {
    bool have = false;
    std::uint32_t folder = 0, slot = 0;
    std::uint64_t gen = 0, len = 0;
    std::uint32_t crc = 0;
  };
  std::vector<Slot> pl(n);
  {
    std::lock_guard lk(mu);
    st.puts += n;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t len = internal::page_bytes_of(job.segments[i]);
      if (len > opt.page_bytes) continue;
      auto where = model.allocate(job.keys[i]);
      if (!where) continue;
      pl[i] = Slot{true, where->folder, where->slot, next_gen++, len, 0};
      inflight_gens.insert(pl[i].gen);
    }
  }
  // The generations leave inflight_gens at the commit, or here if the batch throws before
  // it (bad_alloc): a checkpoint() waits for them.
  bool committed = false;
  auto release_gens = [&] {
    if (committed) return;
    std::lock_guard lk(mu);
    for (const Slot& p : pl) {
      if (p.have) inflight_gens.erase(p.gen);
    }
    gens_cv.notify_all();
  };
  struct OnExit {
    decltype(release_gens)& fn;
    ~OnExit() { fn(); }
  } on_exit{release_gens};
  // Phase 1: the data, unsynced; CRCs while it moves. A device page is copied into a host
  // buffer first (CRC there, written from there); with every buffer in use, the oldest
  // device page's write is waited for, so copies overlap the writes before them. A staged host
  // page (page_io.hpp) is gathered after room for its header and goes with it, one request:
  // its CRC and header are made in staging before its write starts.
  std::vector<std::vector<Future>> data(n);
  PageErrors errs(n);
  std::vector<int>& err = errs.err;
  std::vector<std::string>& what = errs.what;
  std::vector<char> on_dev(n, 0), copy_failed(n, 0), hdr_sent(n, 0);
  std::vector<int> buf(n, -1);
  std::deque<std::size_t> writing;                      // device pages whose write holds a buffer, oldest first
  PageOps host(/*write=*/true, opt.handle.block_size);  // host pages: a ranged write per chunk of a slab
  std::uint64_t ops = 0;
  std::string fence_why;
  bool fenced = true;
  for (auto& [dev, fence] : job.fences) fenced = fenced && scratch.order_after(dev, *fence, &fence_why);
  for (std::size_t i = 0; i < n; ++i) {
    if (!pl[i].have) continue;
    Folder& f = folders[pl[i].folder];  // the vector never changes after open
    File& slab = f.slab_of(pl[i].slot);
    std::uint64_t off = f.offset_of(pl[i].slot, slot_bytes) + kHeaderBytes;
    on_dev[i] = scratch.on_device(job.segments[i]) ? 1 : 0;
    if (on_dev[i] != 0 && !fenced) {
      copy_failed[i] = 1;
      what[i] = fence_why;
      continue;
    }
    if (on_dev[i] != 0) {
      int b = scratch.acquire();
      while (b < 0 && !writing.empty()) {  // wait for this batch's oldest device write
        const std::size_t j = writing.front();
        writing.pop_front();
        errs.settle_all(j, data[j]);
        scratch.release(buf[j]);
        buf[j] = -1;
        b = scratch.acquire();
      }
      if (b < 0) {  // only after a batch that threw (bad_alloc) kept its buffers
        copy_failed[i] = 1;
        what[i] = "kv: no free host buffer for a device page";
        continue;
      }
      if (!scratch.to_host(b, job.segments[i], &what[i])) {
        copy_failed[i] = 1;
        scratch.release(b);
        continue;
      }
      pl[i].crc = crc32c(scratch.data(b), pl[i].len);
      buf[i] = b;
      writing.push_back(i);
      try {
        if (pl[i].len > 0) data[i].push_back(slab.pwrite(scratch.data(b), pl[i].len, off));
        ops += pl[i].len > 0 ? 1 : 0;
      } catch (const Error& e) {
        errs.set(i, e);
      }
      continue;
    }
    // A staged page goes with its header, as one request (its CRC-32C made in staging).
    hdr_sent[i] = host.add_with_header(i, slab, job.segments[i], off - kHeaderBytes, errs,
                                       [&](unsigned char* h, const unsigned char* page, std::size_t len) {
                                         pl[i].crc = crc32c(page, len);
                                         encode_header(h, job.keys[i], pl[i].gen, pl[i].len, pl[i].crc, opt.page_bytes);
                                       })
                      ? 1
                      : 0;
  }
  host.flush(errs);
  for (std::size_t i = 0; i < n; ++i) {
    if (!pl[i].have || on_dev[i] != 0 || hdr_sent[i] != 0) continue;
    std::uint32_t c = 0;
    for (const Segment& s : job.segments[i]) c = crc32c(s.data, s.nbytes, c);
    pl[i].crc = c;
  }
  // Phase 2: the other pages' headers, one ranged write per slab, without waiting for the
  // data: a header that lands before its page is caught by the page's CRC (at get and at open),
  // as is a header and page written by one request and torn.
  SlabHeaders hdr(n);
  internal::JournalWrites journal;  // each slot's journal record (journal.hpp), synced with it
  for (std::size_t i = 0; i < n; ++i) {
    if (!pl[i].have || err[i] != 0 || copy_failed[i] != 0) continue;
    if (hdr_sent[i] != 0) {
      hdr.add_written(i, pl[i].folder, folders[pl[i].folder], pl[i].slot);
    } else {
      encode_header(hdr.at(i), job.keys[i], pl[i].gen, pl[i].len, pl[i].crc, opt.page_bytes);
      hdr.add(i, pl[i].folder, folders[pl[i].folder], pl[i].slot, slot_bytes);
    }
    journal.add(i, pl[i].folder, pl[i].slot, pl[i].gen);
  }
  hdr.write(folders, errs);
  journal_write(journal);
  host.settle(errs, [](std::size_t) {});
  for (std::size_t i = 0; i < n; ++i) errs.settle_all(i, data[i]);
  for (std::size_t i : writing) scratch.release(buf[i]);
  hdr.finish(errs);
  journal.finish(err, what);
  // Phase 3: once every write completed, one fdatasync per slab touched; only then commit.
  hdr.sync(folders, errs);
  hdr.finish(errs);
  // Commit.
  std::lock_guard lk(mu);
  committed = true;
  st.io_ops += ops + host.ops() + hdr.ops() + journal.ops();
  gens_cv.notify_all();
  for (std::size_t i = 0; i < n; ++i) {
    if (!pl[i].have) {
      ++st.puts_failed;
      continue;
    }
    inflight_gens.erase(pl[i].gen);
    const internal::Place where{pl[i].folder, pl[i].slot};
    if (on_dev[i] != 0) ++st.device_pages;
    if (copy_failed[i] != 0) {  // the device copy failed: nothing was written; not the folder's fault
      ++st.device_copy_errors;
      model.abort(where);
      ++st.puts_failed;
      continue;
    }
    if (err[i] != 0 || model.failed(pl[i].folder)) {
      if (err[i] != 0) fail_folder(pl[i].folder, err[i], what[i]);
      (*io_failed)[i] = true;
      model.abort(where);
      ++st.puts_failed;
      continue;
    }
    ok[i] = true;
    st.bytes_written += pl[i].len;
    model.commit(job.keys[i], where, pl[i].gen, pl[i].len, pl[i].crc);  // false: a newer put of the key committed first
  }
  return ok;
}

std::vector<bool> Store::Impl::do_get(Job& job, DeviceScratch& scratch) {
  const std::size_t n = job.keys.size();
  std::vector<bool> ok(n, false);
  struct Pin {
    bool have = false;
    std::uint32_t folder = 0, slot = 0;
    std::uint64_t gen = 0, len = 0;
    std::uint32_t crc = 0;
  };
  std::vector<Pin> pins(n);
  {
    std::lock_guard lk(mu);
    st.gets += n;
    for (std::size_t i = 0; i < n; ++i) {
      auto p = model.pin(job.keys[i], internal::page_bytes_of(job.segments[i]));
      if (p) pins[i] = Pin{true, p->where.folder, p->where.slot, p->gen, p->len, p->crc};
    }
  }
  // Only the pages are read: the index knows each one's CRC-32C, which the bytes read must
  // match (a slot that no longer holds the page fails it: a miss, and the entry forgotten).
  PageErrors errs(n);
  std::vector<int>& err = errs.err;
  std::vector<std::string>& what = errs.what;
  std::vector<std::vector<Future>> data(n);
  std::vector<char> on_dev(n, 0), copy_failed(n, 0), verified(n, 0);
  std::deque<std::size_t> dev_pending;
  PageOps host(/*write=*/false, opt.handle.block_size);  // host pages: a ranged read per chunk of a slab
  std::uint64_t ops = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!pins[i].have || err[i] != 0) continue;
    Folder& f = folders[pins[i].folder];
    File& slab = f.slab_of(pins[i].slot);
    std::uint64_t off = f.offset_of(pins[i].slot, slot_bytes) + kHeaderBytes;
    if (scratch.on_device(job.segments[i])) {
      on_dev[i] = 1;
      dev_pending.push_back(i);
      continue;
    }
    host.add(i, slab, job.segments[i], off, errs);
  }
  host.flush(errs);
  // Device pages: read into host buffers (as many at once as there are buffers), verified
  // there, and only a verified page is copied to the device (its copy overlapping the reads
  // after it); a miss leaves the device memory as it was.
  std::vector<int> buf(n, -1);
  std::deque<std::size_t> reading, copying;
  std::string dev_why;
  bool fenced = true;
  for (auto& [dev, fence] : job.fences) fenced = fenced && scratch.order_after(dev, *fence, &dev_why);
  if (!dev_pending.empty() && (!fenced || !scratch.prepare(&dev_why))) {
    for (std::size_t i : dev_pending) copy_failed[i] = 1;
    dev_pending.clear();
  }
  auto finish_copy = [&] {
    const std::size_t j = copying.front();
    copying.pop_front();
    if (!scratch.wait(buf[j], &what[j])) {
      verified[j] = 0;
      copy_failed[j] = 1;
    }
    scratch.release(buf[j]);
    buf[j] = -1;
  };
  auto start_reads = [&] {
    while (!dev_pending.empty()) {
      int b = scratch.acquire();
      if (b < 0) {
        if (copying.empty()) return;
        finish_copy();
        continue;
      }
      const std::size_t i = dev_pending.front();
      dev_pending.pop_front();
      Folder& f = folders[pins[i].folder];
      try {
        if (pins[i].len > 0) {
          data[i].push_back(
              f.slab_of(pins[i].slot)
                  .pread(scratch.data(b), pins[i].len, f.offset_of(pins[i].slot, slot_bytes) + kHeaderBytes));
          ++ops;
        }
        buf[i] = b;
        reading.push_back(i);
      } catch (const Error& e) {
        errs.set(i, e);
        scratch.release(b);
      }
    }
  };
  start_reads();
  while (!reading.empty()) {
    const std::size_t i = reading.front();
    reading.pop_front();
    errs.settle_all(i, data[i]);
    if (err[i] == 0) verified[i] = crc32c(scratch.data(buf[i]), pins[i].len) == pins[i].crc ? 1 : 0;
    if (verified[i] != 0) {
      copying.push_back(i);  // holds its buffer until the copy finished
      if (!scratch.to_device(buf[i], job.segments[i], &what[i])) {
        verified[i] = 0;
        copy_failed[i] = 1;
      }
    } else {
      scratch.release(buf[i]);
      buf[i] = -1;
    }
    start_reads();
  }
  while (!copying.empty()) finish_copy();
  for (std::size_t i : dev_pending) copy_failed[i] = 1;  // no buffer at all (see do_put)
  // Host pages: each chunk verified as soon as it landed, while later ones still move.
  host.settle(errs, [&](std::size_t i) {
    if (err[i] != 0) return;
    std::uint32_t c = 0;
    for (const Segment& s : job.segments[i]) c = crc32c(s.data, s.nbytes, c);
    verified[i] = c == pins[i].crc ? 1 : 0;
  });
  std::uint64_t corrupt = 0, bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    errs.settle_all(i, data[i]);
    if (!pins[i].have || err[i] != 0 || copy_failed[i] != 0) continue;
    if (verified[i] != 0) {
      ok[i] = true;
      bytes += pins[i].len;
    } else {
      ++corrupt;
    }
  }
  std::lock_guard lk(mu);
  st.io_ops += ops + host.ops();
  st.corrupt += corrupt;
  st.bytes_read += bytes;
  for (std::size_t i = 0; i < n; ++i) {
    if (ok[i]) {
      ++st.hits;
    } else {
      ++st.misses;
    }
    if (on_dev[i] != 0) ++st.device_pages;
    if (copy_failed[i] != 0) ++st.device_copy_errors;
    if (!pins[i].have) continue;
    model.unpin(internal::Place{pins[i].folder, pins[i].slot});
    if (err[i] != 0) {
      fail_folder(pins[i].folder, err[i], what[i]);
    } else if (!ok[i] && copy_failed[i] == 0) {
      // A slot that no longer holds the page the index says: forget it, keep the slot.
      model.forget(job.keys[i], pins[i].gen);
    }
  }
  return ok;
}

}  // namespace deepio::kv
