// deepio::kv::Store's public calls, its batch threads and close (impl.hpp says where the
// rest is).
#include <algorithm>
#include <exception>
#include <filesystem>
#include <set>

#include "kv/impl.hpp"

namespace deepio::kv {

void Store::Impl::enqueue(Job job) {
  {
    std::lock_guard lk(qmu);
    if (stopping) throw InvalidArgument("kv::Store: the store is closed");
    queue.push_back(std::move(job));
  }
  qcv.notify_one();
}

namespace {
/// The store whose batch thread this is (null on other threads): close() there is deferred.
thread_local const Store::Impl* t_batch_store = nullptr;
}  // namespace

void Store::Impl::run_jobs() {
  t_batch_store = this;
  {
    internal::DeviceScratch scratch(&device, opt.device_pages_in_flight,
                                    internal::round_up(opt.page_bytes, internal::kAlign));
    for (;;) {
      Job job;
      {
        std::unique_lock lk(qmu);
        qcv.wait(lk, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) break;
        // Loads go ahead of stores: the oldest get, else the oldest put (puts keep their order).
        auto it = std::find_if(queue.begin(), queue.end(), [](const internal::Job& j) { return !j.write; });
        if (it == queue.end()) it = queue.begin();
        job = std::move(*it);
        queue.erase(it);
      }
      std::vector<bool> results;
      try {
        results = job.write ? put_batch(job, scratch) : do_get(job, scratch);
      } catch (...) {
        results.assign(job.keys.size(), false);  // bad_alloc and the like: the batch fails
      }
      job.state->complete(std::move(results));
      maybe_checkpoint();
      maybe_retry_failed();
    }
  }
  t_batch_store = nullptr;
  bool last = false;
  {
    std::lock_guard lk(qmu);
    last = --running == 0 && close_deferred;
  }
  if (last) {
    try {
      finish_close();
    } catch (...) {
      // Nobody is left to tell: the close was asked for from a callback, which has returned.
    }
  }
  // The thread's reference to *this goes with its function object: the last one frees it.
}

void Store::Impl::finish_close() {
  std::exception_ptr err;  // thrown after the rest: every later close() waits for close_finished
  try {
    std::lock_guard ck(ckpt_mu);
    write_checkpoint();
    journal_close();
  } catch (...) {
    err = std::current_exception();
  }
  for (internal::Folder& f : folders) f.slabs.clear();
  // The locks last, once no write of this store can come.
  for (internal::Folder& f : folders) f.lock.reset();
  handle.reset();
  {
    std::lock_guard lk(qmu);
    close_finished = true;
  }
  qcv.notify_all();
  if (err) std::rethrow_exception(err);
}

void Store::Impl::start_threads(const std::shared_ptr<Impl>& self) {
  const std::size_t n = std::max<std::size_t>(1, opt.batch_threads);
  running = n;
  try {
    for (std::size_t t = 0; t < n; ++t) threads.emplace_back([self] { self->run_jobs(); });
  } catch (...) {
    {
      std::lock_guard lk(qmu);
      stopping = true;
      running -= n - threads.size();
    }
    qcv.notify_all();
    for (auto& t : threads) t.join();
    throw;
  }
}

void Store::Impl::check_usable() const {
  stamp.check();  // before any lock: one held by another thread at the fork stays held here
  std::lock_guard lk(mu);
  if (closed) throw InvalidArgument("kv::Store: the store is closed");
}

// ---- Store ----------------------------------------------------------------------------------

namespace {
void check_keys(std::span<const std::string_view> keys) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty() || keys[i].size() > kMaxKeyBytes) {
      throw InvalidArgument("kv: key " + std::to_string(i) + " is " + std::to_string(keys[i].size()) +
                            " bytes; keys are 1 to " + std::to_string(kMaxKeyBytes) + " bytes");
    }
  }
}
}  // namespace

Store::Store(const StoreOptions& options) : impl_(std::make_shared<Impl>(options)) {
  Impl& m = *impl_;
  if (options.folders.empty()) throw InvalidArgument("kv: no folders");
  if (options.page_bytes == 0) throw InvalidArgument("kv: page_bytes is 0");
  if (options.page_bytes > 0xFFFFFFFFu) {  // the index keeps a page's length in 32 bits
    throw InvalidArgument("kv: page_bytes is " + std::to_string(options.page_bytes) + "; at most 4 GiB - 1");
  }
  if (options.fingerprint.size() > internal::kMaxFingerprintBytes) {
    throw InvalidArgument("kv: the fingerprint is " + std::to_string(options.fingerprint.size()) + " bytes; at most " +
                          std::to_string(internal::kMaxFingerprintBytes));
  }
  if (!(options.low_watermark > 0 && options.low_watermark <= options.high_watermark && options.high_watermark <= 1)) {
    throw InvalidArgument("kv: watermarks must satisfy 0 < low <= high <= 1");
  }
  std::set<std::string> seen;
  for (const std::string& f : options.folders) {
    if (f.empty()) throw InvalidArgument("kv: an empty folder path");
    if (!seen.insert(std::filesystem::absolute(f).lexically_normal().string()).second) {
      throw InvalidArgument("kv: folder " + f + " is given twice");
    }
  }
  m.slot_bytes = internal::kHeaderBytes + internal::round_up(options.page_bytes, internal::kAlign);
  m.st.page_bytes = options.page_bytes;
  m.st.slot_bytes = m.slot_bytes;
  m.open();
  m.start_threads(impl_);
}

Store::~Store() {
  if (!impl_->stamp.here()) {
    // A forked child: the threads, locks, engine and memory are the parent's (their copies
    // here have no threads, and a lock another thread held at the fork stays held): leaked on
    // purpose, so that nothing blocks and nothing of the parent's is released.
    (void)new std::shared_ptr<Impl>(std::move(impl_));
    return;
  }
  try {
    close();
  } catch (...) {
    // close() reports checkpoint failures; the destructor cannot.
  }
}

namespace {
/// BatchOptions::stream's events: one per device holding a segment, recorded now.
std::vector<std::pair<int, std::shared_ptr<detail::DeviceFence>>> fences_for(
    const detail::DeviceSupport& device, std::span<const std::vector<Segment>> segments, const BatchOptions& options) {
  std::vector<std::pair<int, std::shared_ptr<detail::DeviceFence>>> out;
  if (!options.stream || !device.make_fence || !device.classify) return out;
  for (const std::vector<Segment>& page : segments) {
    for (const Segment& s : page) {
      if (s.nbytes == 0) continue;
      const int dev = device.classify(s.data);
      if (dev < 0 || std::any_of(out.begin(), out.end(), [&](const auto& f) { return f.first == dev; })) continue;
      detail::Status why;
      auto fence = device.make_fence(dev, *options.stream, &why);
      if (!fence) detail::throw_error(why.errnum != 0 ? why.errnum : EIO, why.message);
      out.emplace_back(dev, std::move(fence));
    }
  }
  return out;
}
}  // namespace

BatchFuture Store::put(std::span<const std::string_view> keys, std::span<const std::vector<Segment>> segments,
                       const BatchOptions& options) {
  impl_->check_usable();
  check_keys(keys);
  if (keys.size() != segments.size()) {
    throw InvalidArgument("kv: " + std::to_string(keys.size()) + " keys but " + std::to_string(segments.size()) +
                          " pages");
  }
  internal::Job job;
  job.write = true;
  job.keys.assign(keys.begin(), keys.end());
  job.segments.assign(segments.begin(), segments.end());
  job.fences = fences_for(impl_->device, segments, options);
  job.state = std::make_shared<BatchFuture::State>(impl_->stamp);
  BatchFuture fut(job.state);
  impl_->enqueue(std::move(job));
  return fut;
}

BatchFuture Store::get(std::span<const std::string_view> keys, std::span<const std::vector<Segment>> segments,
                       const BatchOptions& options) {
  impl_->check_usable();
  check_keys(keys);
  if (keys.size() != segments.size()) {
    throw InvalidArgument("kv: " + std::to_string(keys.size()) + " keys but " + std::to_string(segments.size()) +
                          " destinations");
  }
  internal::Job job;
  job.keys.assign(keys.begin(), keys.end());
  job.segments.assign(segments.begin(), segments.end());
  job.fences = fences_for(impl_->device, segments, options);
  job.state = std::make_shared<BatchFuture::State>(impl_->stamp);
  BatchFuture fut(job.state);
  impl_->enqueue(std::move(job));
  return fut;
}

std::size_t Store::exists(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::size_t n = 0;
  for (std::string_view k : keys) {
    if (!impl_->model.contains(k)) break;
    ++n;
  }
  return n;
}

std::vector<bool> Store::contains(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::vector<bool> out;
  out.reserve(keys.size());
  for (std::string_view k : keys) out.push_back(impl_->model.contains(k));
  return out;
}

std::size_t Store::remove(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::size_t n = 0;
  for (std::string_view k : keys) n += impl_->model.remove(k) ? 1 : 0;
  impl_->st.removes += n;
  return n;
}

std::size_t Store::clear() {
  impl_->check_usable();
  // A slice of slots per hold of the lock, never every page at once: the pages committed
  // before the call (generations below `below`) go; one committed meanwhile may stay.
  constexpr std::uint64_t kSlice = 4096;
  Impl& m = *impl_;
  std::uint64_t below = 0;
  {
    std::lock_guard lk(m.mu);
    below = m.next_gen;
  }
  std::size_t n = 0;
  for (std::uint32_t fi = 0; fi < m.folders.size(); ++fi) {
    for (std::uint64_t first = 0;; first += kSlice) {
      std::lock_guard lk(m.mu);
      if (first >= m.model.slots(fi)) break;
      const std::size_t k = m.model.clear_slots(fi, first, kSlice, below);
      n += k;
      m.st.removes += k;
    }
  }
  m.durable_checkpoint();
  return n;
}

std::size_t Store::retry_failed() {
  impl_->check_usable();
  std::lock_guard pl(impl_->probe_mu);
  return impl_->retry_failed(true);
}

void Store::checkpoint() {
  impl_->check_usable();
  impl_->durable_checkpoint();
}

StoreStats Store::stats() const {
  impl_->stamp.check();
  std::uint64_t pending_puts = 0, pending_put_pages = 0, pending_put_bytes = 0;
  {
    std::lock_guard qk(impl_->qmu);  // puts queued, not yet started: the back-pressure signal
    for (const internal::Job& j : impl_->queue) {
      if (!j.write) continue;
      ++pending_puts;
      pending_put_pages += j.segments.size();
      for (const auto& page : j.segments) pending_put_bytes += internal::page_bytes_of(page);
    }
  }
  const std::uint64_t bytes_fixed = impl_->handle->stats().bytes_fixed;
  std::lock_guard lk(impl_->mu);
  StoreStats s = impl_->st;
  s.bytes_fixed = bytes_fixed;
  s.pending_puts = pending_puts;
  s.pending_put_pages = pending_put_pages;
  s.pending_put_bytes = pending_put_bytes;
  s.pages = impl_->model.pages();
  s.evictions = impl_->model.evictions();
  s.capacity_bytes = 0;
  for (std::uint32_t fi = 0; fi < impl_->folders.size(); ++fi) {
    const internal::Folder& f = impl_->folders[fi];
    FolderStats fs;
    fs.path = f.path;
    fs.failed = impl_->model.failed(fi);
    fs.slots = f.slots;
    fs.used = impl_->model.used(fi);
    fs.errors = f.errors;
    fs.recoveries = f.recoveries;
    fs.last_errno = f.last_errno;
    fs.last_error = f.last_error;
    s.capacity_bytes += f.slots * impl_->opt.page_bytes;
    s.folders.push_back(std::move(fs));
  }
  return s;
}

std::vector<std::string> Store::take_warnings() {
  impl_->stamp.check();
  std::lock_guard lk(impl_->mu);
  std::vector<std::string> out;
  out.swap(impl_->warnings);
  return out;
}

std::size_t Store::page_bytes() const noexcept { return impl_->opt.page_bytes; }

void Store::close() {
  Impl& m = *impl_;
  m.stamp.check();
  const bool on_batch_thread = t_batch_store == &m;
  bool first = false;
  {
    std::lock_guard lk(m.mu);
    first = !m.closed;
    m.closed = true;
  }
  if (!first) {
    // Another close() (or a deferred one) is under way: wait for it, unless this thread is
    // one it waits for.
    if (!on_batch_thread) {
      std::unique_lock lk(m.qmu);
      m.qcv.wait(lk, [&] { return m.close_finished; });
    }
    return;
  }
  {
    std::lock_guard lk(m.qmu);
    m.stopping = true;
    m.close_deferred = on_batch_thread;
  }
  m.qcv.notify_all();
  if (on_batch_thread) {
    // From a done-callback: this thread cannot join itself. Every batch thread finishes the
    // queue and leaves; the last one out writes the checkpoint and unlocks (finish_close).
    // They hold the Impl alive; their std::thread objects let go of them.
    for (auto& t : m.threads) t.detach();
    m.threads.clear();
    return;
  }
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.finish_close();
}

}  // namespace deepio::kv
