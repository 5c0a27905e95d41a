// Writing checkpoints (impl.hpp, "Checkpoint"): per folder, its live (slot, generation, LRU
// tick; with a journal also key, length and CRC) and the generation bound, replaced durably
// (files.hpp); once durable, the folder's journal ring is free up to that bound. A failed
// folder is left out: its file on disk stays the one from before the failure until a probe
// rewrites it.
#include "kv/impl.hpp"

namespace deepio::kv {

void Store::Impl::maybe_checkpoint() {
  {
    // A journal ring half full asks for one whatever the interval (journal.hpp).
    std::lock_guard lk(mu);
    if (!journal_wants_ckpt) {
      if (opt.checkpoint_interval.count() <= 0) return;
      if (!model.dirty() || std::chrono::steady_clock::now() - last_ckpt < opt.checkpoint_interval) return;
    }
  }
  std::unique_lock ck(ckpt_mu, std::try_to_lock);
  if (!ck.owns_lock()) return;
  try {
    write_checkpoint(true);
  } catch (const Error&) {
    // Counted in the folder's errors by write_checkpoint; the next interval tries again.
  }
}

namespace {
/// Slots read per hold of mu while a checkpoint is taken: the lock is never held for O(pages).
constexpr std::uint64_t kCkptSlice = 4096;
}  // namespace

// A checkpoint taken a slice of slots at a time (mu released in between) is as good as one
// taken at once: a page committed meanwhile has a generation above the bound (every put in
// flight when the bound was taken is above it), so open takes it whether listed or not; a
// page removed or replaced meanwhile may be listed, as if removed just after the checkpoint
// (a replace's newer slot wins at open: its generation is higher and its data whole).
std::optional<std::vector<unsigned char>> Store::Impl::snapshot_folder(std::uint32_t fi, std::uint64_t bound) {
  std::vector<internal::CkptRecord> records;
  for (std::uint64_t first = 0;; first += kCkptSlice) {
    std::lock_guard lk(mu);
    if (model.failed(fi)) return std::nullopt;  // its file stays the one from before the failure
    if (first >= model.slots(fi)) break;
    model.records_in(fi, first, kCkptSlice, &records, folders[fi].has_journal());
  }
  return internal::encode_checkpoint(bound, records, folders[fi].has_journal());
}

void Store::Impl::write_checkpoint(bool periodic) {
  std::uint64_t bound = 0;
  {
    std::lock_guard lk(mu);
    if (periodic && !covers_drops()) return;  // after a later batch
    bound = checkpoint_bound();
    model.take_dirty();
    last_ckpt = std::chrono::steady_clock::now();
    journal_wants_ckpt = false;
  }
  std::optional<Error> first;
  for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
    try {
      auto bytes = snapshot_folder(fi, bound);
      if (!bytes) continue;
      internal::replace_durably(*handle, folders[fi].path, "index.ckpt", *bytes);
      std::lock_guard lk(mu);
      journal_checkpointed(fi, bound);
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      fail_folder(fi, e.errnum(), e.what());
      if (!first) first = e;
    }
  }
  if (!first) {
    try {
      write_failed_lists();  // after the folders' index.ckpt (failed_list.cpp)
    } catch (const Error& e) {
      first = e;
    }
  }
  std::lock_guard lk(mu);
  ++st.checkpoints;
  if (first) throw *first;
}

bool Store::Impl::write_folder_checkpoint(std::uint32_t fi) {
  std::uint64_t bound = 0;
  {
    std::lock_guard lk(mu);
    if (!covers_drops()) return false;
    bound = checkpoint_bound();
  }
  const bool keys = folders[fi].has_journal();
  std::vector<internal::CkptRecord> records;
  for (std::uint64_t first = 0;; first += kCkptSlice) {
    std::lock_guard lk(mu);
    if (first >= model.slots(fi)) break;
    model.records_in(fi, first, kCkptSlice, &records, keys);
  }
  internal::replace_durably(*handle, folders[fi].path, "index.ckpt", internal::encode_checkpoint(bound, records, keys));
  std::lock_guard lk(mu);
  journal_checkpointed(fi, bound);
  return true;
}

// A checkpoint written after it lists every page committed before the call and has a
// generation bound above every page removed before it, so that no removed page (nor an older
// version of it) is taken back by the scan of a later open.
void Store::Impl::wait_for_earlier_puts(std::unique_lock<std::mutex>& lk) {
  const std::uint64_t target = next_gen;
  gens_cv.wait(lk, [&] { return inflight_gens.empty() || *inflight_gens.begin() >= target; });
}

void Store::Impl::durable_checkpoint() {
  {
    std::unique_lock lk(mu);
    wait_for_earlier_puts(lk);
  }
  std::lock_guard ck(ckpt_mu);
  write_checkpoint();
  std::lock_guard lk(mu);
  for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
    if (!model.failed(fi)) return;
  }
  throw Error(EIO, "kv: every folder of the store has failed; nothing was checkpointed", folders[0].path);
}

}  // namespace deepio::kv
