// deepio::kv::Store's public calls, its batch threads and close (impl.hpp says where the
// rest is).
#include <algorithm>
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

void Store::Impl::run_jobs() {
  internal::DeviceScratch scratch(&device, opt.device_pages_in_flight,
                                  internal::round_up(opt.page_bytes, internal::kAlign));
  for (;;) {
    Job job;
    {
      std::unique_lock lk(qmu);
      qcv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      job = std::move(queue.front());
      queue.pop_front();
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

void Store::Impl::check_usable() const {
  stamp.check();
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

Store::Store(const StoreOptions& options) : impl_(std::make_unique<Impl>(options)) {
  Impl& m = *impl_;
  if (options.folders.empty()) throw InvalidArgument("kv: no folders");
  if (options.page_bytes == 0) throw InvalidArgument("kv: page_bytes is 0");
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
  for (std::size_t t = 0; t < std::max<std::size_t>(1, options.batch_threads); ++t) {
    m.threads.emplace_back([&m] { m.run_jobs(); });
  }
}

Store::~Store() {
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
  std::size_t n = 0;
  {
    std::lock_guard lk(impl_->mu);
    n = impl_->model.clear();
    impl_->st.removes += n;
  }
  impl_->durable_checkpoint();
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
  std::lock_guard lk(impl_->mu);
  StoreStats s = impl_->st;
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
  std::lock_guard lk(impl_->mu);
  std::vector<std::string> out;
  out.swap(impl_->warnings);
  return out;
}

std::size_t Store::page_bytes() const noexcept { return impl_->opt.page_bytes; }

void Store::close() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.mu);
    if (m.closed) return;
    m.closed = true;
  }
  if (!m.stamp.here()) {
    // A forked child: the threads, locks and engine are the parent's; leak them all (joining
    // or destroying threads that are not in this process would hang or abort).
    (void)m.handle.release();
    (void)new std::vector<std::thread>(std::move(m.threads));
    return;
  }
  {
    std::lock_guard lk(m.qmu);
    m.stopping = true;
  }
  m.qcv.notify_all();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  std::optional<Error> err;
  try {
    std::lock_guard ck(m.ckpt_mu);
    m.write_checkpoint();
  } catch (const Error& e) {
    err = e;
  }
  for (internal::Folder& f : m.folders) f.slabs.clear();
  // The locks last, once no write of this store can come.
  for (internal::Folder& f : m.folders) f.lock.reset();
  m.handle.reset();
  if (err) throw *err;
}

}  // namespace deepio::kv
