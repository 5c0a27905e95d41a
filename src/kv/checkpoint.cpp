// Writing checkpoints (impl.hpp, "Checkpoint"): per folder, its live (slot, generation, LRU
// tick) and the generation bound, replaced durably (files.hpp). A failed folder is left out:
// its file on disk stays the one from before the failure until a probe rewrites it.
#include "kv/impl.hpp"

namespace deepio::kv {

void Store::Impl::maybe_checkpoint() {
  if (opt.checkpoint_interval.count() <= 0) return;
  {
    std::lock_guard lk(mu);
    if (!model.dirty() || std::chrono::steady_clock::now() - last_ckpt < opt.checkpoint_interval) return;
  }
  std::unique_lock ck(ckpt_mu, std::try_to_lock);
  if (!ck.owns_lock()) return;
  try {
    write_checkpoint();
  } catch (const Error&) {
    // Counted in the folder's errors by write_checkpoint; the next interval tries again.
  }
}

void Store::Impl::write_checkpoint() {
  struct Snap {
    std::vector<unsigned char> bytes;
    std::uint32_t folder;
  };
  std::vector<Snap> snaps;
  {
    std::lock_guard lk(mu);
    const std::uint64_t bound = checkpoint_bound();
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      if (!model.failed(fi)) snaps.push_back(Snap{internal::encode_checkpoint(bound, model.records(fi)), fi});
    }
    model.take_dirty();
    last_ckpt = std::chrono::steady_clock::now();
  }
  std::optional<Error> first;
  for (Snap& s : snaps) {
    try {
      internal::replace_durably(*handle, folders[s.folder].path, "index.ckpt", s.bytes);
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      fail_folder(s.folder, e.errnum(), e.what());
      if (!first) first = e;
    }
  }
  std::lock_guard lk(mu);
  ++st.checkpoints;
  if (first) throw *first;
}

void Store::Impl::write_folder_checkpoint(std::uint32_t fi) {
  std::vector<unsigned char> bytes;
  {
    std::lock_guard lk(mu);
    bytes = internal::encode_checkpoint(checkpoint_bound(), model.records(fi));
  }
  internal::replace_durably(*handle, folders[fi].path, "index.ckpt", bytes);
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
}

}  // namespace deepio::kv
