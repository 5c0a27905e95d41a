// Batches (Handle::submit_batch): every request checked first (check_batch), all of them
// tracked in the order given, then opened, planned and queued on the opener threads in
// contiguous runs, with consecutive requests on one path sharing one open (SharedFile) and
// their slices reaching each worker in groups (PendingSlices). A request that fails there
// completes failed on its own; nothing of a batch is ever dropped (Openers::stop runs every
// posted run). Thread safety: a run, its SharedFile and its PendingSlices belong to one opener
// thread; openers_ is guarded by openers_mutex_.
#include <algorithm>
#include <new>
#include <optional>

#include "engine/checks.hpp"
#include "engine/engine_parts.hpp"
#include "engine/openers.hpp"

namespace deepio::detail {

std::vector<std::shared_ptr<OpState>> Engine::submit_batch(std::vector<IoRequest> requests,
                                                           std::vector<BindingOp> binding) {
  process_.check();
  // 1. Every argument first: a refused request leaves the whole batch unsubmitted.
  if (!binding.empty() && binding.size() != requests.size()) {
    throw InvalidArgument("submit_batch: " + std::to_string(binding.size()) + " binding options for " +
                          std::to_string(requests.size()) + " requests");
  }
  check_batch(requests);
  if (requests.empty()) return {};
  // The opener threads first: if they cannot be started, nothing is tracked and the throw
  // leaves the handle as it was.
  Openers& openers = start_openers();
  // 2. The ops, in the submission order as given (one lock for the whole batch).
  auto batch = std::make_shared<std::vector<IoRequest>>(std::move(requests));
  std::vector<std::shared_ptr<OpState>> ops;
  ops.reserve(batch->size());
  for (std::size_t i = 0; i < batch->size(); ++i) {
    IoRequest& r = (*batch)[i];
    ops.push_back(new_op(r.write, r.buffer, r.nbytes, file_name(r.path.empty() ? nullptr : &r.path, r.fd),
                         r.file_offset, std::move(r.op), binding.empty() ? BindingOp{} : std::move(binding[i]),
                         r.nbytes));
  }
  track(ops);
  // 3. Opening and planning go to the openers, in contiguous runs (at least kMinRun requests
  // each, so a small batch stays on one thread and in order).
  constexpr std::size_t kMinRun = 16;
  const std::size_t runs = std::clamp<std::size_t>(ops.size() / kMinRun, 1, openers.size());
  auto shared_ops = std::make_shared<std::vector<std::shared_ptr<OpState>>>(ops);
  for (std::size_t k = 0; k < runs; ++k) {
    const std::size_t begin = ops.size() * k / runs;
    const std::size_t end = ops.size() * (k + 1) / runs;
    try {
      openers.post([this, batch, shared_ops, begin, end] { start_run(*batch, *shared_ops, begin, end); });
    } catch (const std::exception&) {
      // Tracked already: a run that cannot be queued fails its requests (a later wait()
      // reports them) rather than leaving them pending forever.
      for (std::size_t i = begin; i < end; ++i) {
        const auto& op = ops[i];
        op->fail(Status::failure(ENOMEM, "out of memory while submitting", op->path(), op->offset(), op->nbytes()));
        submitted_.fetch_add(1);
        op->complete_now();
      }
    }
  }
  return ops;
}

void Engine::start_run(const std::vector<IoRequest>& batch, const std::vector<std::shared_ptr<OpState>>& ops,
                       std::size_t begin, std::size_t end) noexcept {
  // Consecutive requests on one path in one direction share one open of it (a file read or
  // written at many offsets costs one open, not one per request).
  // Not for device memory when a route (GDS) may serve it: the route registers the
  // descriptor with cuFile per operation, and a descriptor registered twice is refused.
  const auto same_file = [&](std::size_t a_index, std::size_t b_index) {
    const IoRequest& a = batch[a_index];
    const IoRequest& b = batch[b_index];
    if (may_route_ && (ops[a_index]->on_device() || ops[b_index]->on_device())) return false;
    return !a.path.empty() && a.write == b.write && a.path == b.path;
  };
  std::shared_ptr<SharedFile> shared;
  std::optional<PendingSlices> pending;
  try {
    pending.emplace(workers_.size());
  } catch (...) {
    // Out of memory: every request is queued on its own, as a single submission is.
  }
  PendingSlices* const out = pending ? &*pending : nullptr;
  for (std::size_t i = begin; i < end; ++i) {
    const IoRequest& r = batch[i];
    if (shared && !(i > begin && same_file(i - 1, i))) shared.reset();
    if (!shared && i + 1 < end && same_file(i, i + 1)) {
      if (out != nullptr) flush(*out);  // the open may wait for queued operations
      try {
        shared = open_shared(r.write, r.path);
      } catch (...) {
        shared.reset();  // the request opens the file itself and reports why it cannot
      }
    }
    if (out != nullptr && !shared && !r.path.empty()) flush(*out);  // it opens its file
    start_batched(ops[i], r, shared, out);
    if (out != nullptr && out->count >= out->limit) {
      flush(*out);
      out->limit = std::min(out->limit * 2, PendingSlices::kMaxLimit);
    }
  }
  if (out != nullptr) flush(*out);
}

void Engine::flush(PendingSlices& pending) noexcept {
  for (std::size_t w = 0; w < pending.per_worker.size(); ++w) {
    auto& tasks = pending.per_worker[w];
    try {
      workers_[w]->enqueue(tasks);
    } catch (...) {
      // Out of memory while queueing: the slices not queued end their ops as failed.
      for (auto& t : tasks) {
        if (!t.op) continue;
        t.op->fail(
            Status::failure(ENOMEM, "out of memory while submitting", t.op->path(), t.op->offset(), t.op->nbytes()));
        t.op->slice_done();
      }
      tasks.clear();
    }
  }
  pending.count = 0;
}

Openers& Engine::start_openers() {
  std::lock_guard lock(openers_mutex_);
  if (!openers_) openers_ = std::make_unique<Openers>(std::min<std::size_t>(options_.intra_op_parallelism, 8));
  return *openers_;
}

void Engine::start_batched(const std::shared_ptr<OpState>& op, const IoRequest& r,
                           const std::shared_ptr<SharedFile>& shared, PendingSlices* pending) noexcept {
  Status failure;
  try {
    start(op, r.buffer, r.path.empty() ? nullptr : &r.path, r.fd, /*tracked=*/true, shared, pending);
    return;
  } catch (const Error& e) {
    // As for a single submission, an open failure names the request that was attempted.
    const bool bare = e.nbytes() == 0 && e.offset() == 0 && op->nbytes() != 0;
    failure = Status::failure(e.errnum(), e.message() + (bare ? (op->write() ? " for writing" : " for reading") : ""),
                              e.path().empty() ? op->path() : e.path(), bare ? op->offset() : e.offset(),
                              bare ? op->nbytes() : e.nbytes());
  } catch (const std::bad_alloc&) {
    failure = Status::failure(ENOMEM, "out of memory while submitting", op->path(), op->offset(), op->nbytes());
  } catch (const std::exception& e) {
    failure = Status::failure(EIO, e.what(), op->path(), op->offset(), op->nbytes());
  }
  // Failed before any slice was queued: it completes now, counted as submitted and finished
  // so the descriptor back-pressure stays balanced.
  op->fail(std::move(failure));
  submitted_.fetch_add(1);
  op->complete_now();
}

}  // namespace deepio::detail
