// A folder's failure, and the probes that bring a failed folder back (docs/kv.md "Faults").
#include <algorithm>
#include <cstring>

#include "kv/impl.hpp"

namespace deepio::kv {

using internal::aligned_buf;
using internal::AlignedBuf;
using internal::errno_of;
using internal::kHeaderBytes;
using internal::settle;

void Store::Impl::fail_folder(std::uint32_t fi, int err, const std::string& what) {
  Folder& f = folders[fi];
  ++f.errors;
  f.last_errno = err;
  f.last_error = what;
  f.failed_at = std::chrono::steady_clock::now();
  if (!model.fail(fi)) return;
  f.failed_gen = next_gen - 1;  // at open, raised once every folder was scanned (recovery.cpp)
  warnings.push_back("deepio.kv: folder " + f.path + " failed (" + what +
                     "); its pages are misses and new pages go to the other folders until a probe finds it "
                     "working again");
}

void Store::Impl::maybe_retry_failed() {
  if (opt.retry_failed_after.count() <= 0) return;
  {
    std::lock_guard lk(mu);
    const auto now = std::chrono::steady_clock::now();
    bool due = false;
    for (std::uint32_t fi = 0; fi < folders.size() && !due; ++fi) {
      due = model.failed(fi) && folders[fi].opened && now - folders[fi].failed_at >= opt.retry_failed_after;
    }
    if (!due) return;
  }
  std::unique_lock pl(probe_mu, std::try_to_lock);
  if (!pl.owns_lock()) return;
  try {
    retry_failed(false);
  } catch (const std::exception&) {
    // bad_alloc and the like, before a probe took any slot: a later batch tries again.
  }
}

std::size_t Store::Impl::retry_failed(bool all) {
  std::vector<std::uint32_t> due;
  {
    std::lock_guard lk(mu);
    const auto now = std::chrono::steady_clock::now();
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      const Folder& f = folders[fi];
      if (model.failed(fi) && f.opened && (all || now - f.failed_at >= opt.retry_failed_after)) due.push_back(fi);
    }
  }
  std::size_t back = 0;
  for (std::uint32_t fi : due) back += probe(fi) ? 1 : 0;
  return back;
}

/// Probes failed folder fi (probe_mu held, mu not; docs/kv.md "Faults"):
///  1. per slab, a zeroed 4 KiB block (no valid header) written with OpOptions::fsync over the
///     header of one of its Free slots, then read back and compared; a slab with no Free slot
///     (all pinned by gets or being written) has one header read. The slots written are taken
///     out of the free list meanwhile. A Free slot's header is never needed: its page was
///     dropped, so a header that no longer parses can only keep it from coming back.
///  2. the folder's checkpoint, written as write_checkpoint writes it (under ckpt_mu): the
///     folder has no live page now, so it lists none, with the current generation bound --
///     once that bound covers every dropped page (covers_drops; until then the folder stays
///     failed, for the next probe, with no error counted).
///     The checkpoint on disk was the one from before the failure (a failed folder is left out
///     of checkpoints) and listed the pages the failure dropped: after a crash, a reopen would
///     bring them back, whatever was removed or evicted since.
/// Success, with no other error of the folder meanwhile: it takes new pages again (a warning
/// is queued, recoveries counted). Failure: it stays failed, the error counted, the time of
/// the failure reset.
bool Store::Impl::probe(std::uint32_t fi) {
  Folder& f = folders[fi];
  std::vector<std::optional<std::uint32_t>> slot_of;
  const AlignedBuf zeros = aligned_buf(kHeaderBytes);  // before any slot is taken: may throw
  const AlignedBuf back = aligned_buf(kHeaderBytes * f.slabs.size());
  std::vector<Future> ops;
  ops.reserve(f.slabs.size());
  std::uint64_t errors_before = 0;
  {
    std::lock_guard lk(mu);
    if (!model.failed(fi)) return false;
    errors_before = f.errors;
    slot_of = model.take_probe_slots(fi, f.per_slab);
  }
  int err = 0;
  std::string what;
  auto note = [&](int e, const std::string& w) {
    if (e != 0 && err == 0) {
      err = e;
      what = w;
    }
  };
  // Every request started is waited for before the buffers go, whatever failed.
  auto start = [&](auto&& op) {
    try {
      ops.push_back(op());
    } catch (const Error& e) {
      note(errno_of(e), e.what());
    }
  };
  auto wait_all = [&] {
    for (Future& op : ops) {
      std::string w;
      const int e = settle(op, &w);
      note(e, w);
    }
    ops.clear();
  };
  for (std::size_t s = 0; s < f.slabs.size(); ++s) {
    if (!slot_of[s]) continue;
    start([&] {
      return f.slabs[s].pwrite(zeros.get(), kHeaderBytes, f.offset_of(*slot_of[s], slot_bytes),
                               OpOptions{.fsync = true, .stream = std::nullopt});
    });
  }
  wait_all();
  if (err == 0) {
    std::memset(back.get(), 0xA5, kHeaderBytes * f.slabs.size());
    for (std::size_t s = 0; s < f.slabs.size(); ++s) {
      const std::uint64_t off = slot_of[s] ? f.offset_of(*slot_of[s], slot_bytes) : 0;
      start([&] { return f.slabs[s].pread(back.get() + s * kHeaderBytes, kHeaderBytes, off); });
    }
    wait_all();
  }
  for (std::size_t s = 0; s < f.slabs.size() && err == 0; ++s) {
    if (slot_of[s] && std::memcmp(back.get() + s * kHeaderBytes, zeros.get(), kHeaderBytes) != 0) {
      note(EIO, "kv: a probe of " + f.slabs[s].path() + " read back other bytes than it wrote");
    }
  }
  bool written = false;
  if (err == 0) {
    try {
      std::lock_guard ck(ckpt_mu);
      written = write_folder_checkpoint(fi);
    } catch (const Error& e) {
      note(errno_of(e), e.what());
    }
  }
  std::lock_guard lk(mu);
  model.return_probe_slots(fi, slot_of);
  // The folder works, but a put older than a dropped page is still in flight: its checkpoint
  // would not keep that page from coming back after a crash. Not a failure: the next probe.
  if (err == 0 && !written) return false;
  if (err != 0) {
    fail_folder(fi, err, what);
    return false;
  }
  if (f.errors != errors_before) return false;  // an operation of the folder failed meanwhile
  model.recover(fi);
  ++f.recoveries;
  warnings.push_back("deepio.kv: folder " + f.path + " recovered");
  return true;
}

/// A put batch: its pages that failed because their folder's I/O failed (that folder is now
/// failed) are put again, to the next healthy folder, until none is left.

}  // namespace deepio::kv
