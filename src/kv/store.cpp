// deepio::kv::Store's implementation (the guarantees are in include/deepio/kv.hpp).
//
// On disk, per folder: `kv.meta` (the layout: page_bytes, slot size, slots, slots per slab;
// written once, temp + rename + fsync), `slab-NNNN.bin` (preallocated with fallocate), and
// `index.ckpt` (the checkpoint). A slot is a 4 KiB header then the page. Header (little endian):
//   0 u32 magic "DKVS" | 4 u16 version | 6 u16 key length | 8 u64 generation | 16 u64 page length
//   24 u32 CRC-32C of the page | 28 u32 CRC-32C of bytes [0, 40 + key length) with this field 0
//   32 u64 page_bytes of the layout | 40 key bytes
// Generations come from one counter per store, restarted above the highest found at open.
//
// Put protocol (one batch thread per batch): under the lock, allocate a slot per page
// (evicting LRU pages of its folder when needed) and a new generation; then, unlocked, write
// every page's data (no sync) while computing its CRC, then every header with OpOptions::fsync
// (one pwrite_ranges per slab: the engine's fdatasync after it covers the data written
// before); then, under the lock, switch the index to the new slots and free the old ones
// (freed later when pinned). A crash anywhere leaves a slot whose header CRC or data CRC does
// not match (a miss) or the previous version.
//
// Get protocol: under the lock, look up and pin; unlocked, read the headers (one
// pread_ranges per slab) and the data straight into the caller's segments; verify key,
// generation, length and the data CRC; under the lock, unpin.
//
// Device pages (a segment in CUDA memory, DeviceSupport::classify): the same protocols through
// the batch thread's DeviceScratch: put copies a page device→host into a free buffer, takes its
// CRC there and writes it from there, waiting for the oldest device page's write when every
// buffer is held; get reads device pages into buffers (as many as there are), verifies each as
// its read completes and starts the host→device copy of a verified one only, and completes the
// batch after every copy finished. BatchOptions::stream's events (recorded at the call) are
// waited for by the stagers' streams before the batch's first copy. A failed copy is the
// page's false, not a folder failure; a get's page stays indexed.
//
// Checkpoint: the live (slot, generation, LRU tick) of each folder and a generation bound B
// below every put still in flight. At open a slot whose header is valid is live if its
// generation is above B (written after the checkpoint) or the checkpoint lists it with that
// generation; slots freed before the checkpoint are dead. For a key found in several slots
// the newest whose data CRC matches wins (a replace torn by a crash leaves the older one).
//
// Errors: any failed operation of a folder marks it failed (errno, message, count, time, a
// queued warning); its index entries are dropped (pinned slots turn Zombie, freed when the last
// get unpins them) and it gets no new pages. After a batch that finds its last error
// retry_failed_after old, or at retry_failed(), probe() tests it: a zeroed header block written
// (fsync) over a Free slot of each slab and read back, then the folder's checkpoint, which
// lists none of the dropped pages (its old one did: a crash would bring them back). A folder
// that failed at open (its slot table never read whole) is not probed.
// Locks: mu guards the index, folders' slot state, stats and warnings; no I/O wait and no
// callback runs under it. ckpt_mu serializes checkpoints; probe_mu probes. Order: probe_mu,
// ckpt_mu, mu.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "deepio/handle.hpp"
#include "deepio/kv.hpp"
#include "deepio/memory.hpp"
#include "engine/device.hpp"
#include "platform/fd.hpp"
#include "platform/status.hpp"

namespace deepio::kv {

// ---- BatchFuture ----------------------------------------------------------------------------

struct BatchFuture::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<bool> results;
  std::vector<std::function<void()>> callbacks;
  long pid = 0;

  void check_fork() const {
    const long now = static_cast<long>(::getpid());
    if (now != pid) throw ForkedHandle(pid, now);
  }
  void complete(std::vector<bool> r) {
    std::vector<std::function<void()>> cbs;
    {
      std::lock_guard lk(mu);
      results = std::move(r);
      done = true;
      cbs.swap(callbacks);
    }
    cv.notify_all();
    for (auto& fn : cbs) fn();
  }
};

bool BatchFuture::done() const {
  if (!state_) throw InvalidArgument("kv::BatchFuture: empty future");
  state_->check_fork();
  std::lock_guard lk(state_->mu);
  return state_->done;
}

void BatchFuture::wait() const {
  if (!state_) throw InvalidArgument("kv::BatchFuture: empty future");
  state_->check_fork();
  std::unique_lock lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->done; });
}

bool BatchFuture::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) throw InvalidArgument("kv::BatchFuture: empty future");
  state_->check_fork();
  std::unique_lock lk(state_->mu);
  return state_->cv.wait_for(lk, timeout, [&] { return state_->done; });
}

const std::vector<bool>& BatchFuture::get() const {
  wait();
  return state_->results;  // immutable once done
}

void BatchFuture::on_done(std::function<void()> fn) const {
  if (!state_) throw InvalidArgument("kv::BatchFuture: empty future");
  {
    std::lock_guard lk(state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

// ---- layout ---------------------------------------------------------------------------------

namespace {

constexpr std::uint32_t kMagic = 0x53564B44u;  // "DKVS"
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 4096;
constexpr std::size_t kAlign = 4096;
constexpr std::size_t kKeyOffset = 40;
constexpr std::uint32_t kMetaMagic = 0x4D564B44u;  // "DKVM"
constexpr std::uint32_t kCkptMagic = 0x43564B44u;  // "DKVC"
constexpr std::size_t kScanChunkSlots = 2048;
constexpr std::size_t kScanInFlight = 8;

template <typename T>
void put_le(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);  // x86-64 and aarch64 Linux are little endian
}
template <typename T>
T get_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};
using AlignedBuf = std::unique_ptr<unsigned char, AlignedFree>;
AlignedBuf aligned_buf(std::size_t n) {
  n = round_up(std::max<std::size_t>(n, 1), kAlign);
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return AlignedBuf(static_cast<unsigned char*>(p));
}

void encode_header(unsigned char* h, std::string_view key, std::uint64_t gen, std::uint64_t len, std::uint32_t crc,
                   std::uint64_t page_bytes) {
  std::memset(h, 0, kHeaderBytes);
  put_le<std::uint32_t>(h, kMagic);
  put_le<std::uint16_t>(h + 4, kVersion);
  put_le<std::uint16_t>(h + 6, static_cast<std::uint16_t>(key.size()));
  put_le<std::uint64_t>(h + 8, gen);
  put_le<std::uint64_t>(h + 16, len);
  put_le<std::uint32_t>(h + 24, crc);
  put_le<std::uint64_t>(h + 32, page_bytes);
  std::memcpy(h + kKeyOffset, key.data(), key.size());
  put_le<std::uint32_t>(h + 28, crc32c(h, kKeyOffset + key.size()));
}

struct Decoded {
  std::string_view key;
  std::uint64_t gen = 0;
  std::uint64_t len = 0;
  std::uint32_t crc = 0;
};

/// The header's fields if it is whole and of this layout.
std::optional<Decoded> decode_header(const unsigned char* h, std::uint64_t page_bytes) {
  if (get_le<std::uint32_t>(h) != kMagic || get_le<std::uint16_t>(h + 4) != kVersion) return std::nullopt;
  const std::size_t klen = get_le<std::uint16_t>(h + 6);
  if (klen == 0 || klen > kMaxKeyBytes) return std::nullopt;
  unsigned char tmp[kKeyOffset];
  std::memcpy(tmp, h, kKeyOffset);
  put_le<std::uint32_t>(tmp + 28, 0);
  std::uint32_t c = crc32c(tmp, kKeyOffset);
  c = crc32c(h + kKeyOffset, klen, c);
  if (c != get_le<std::uint32_t>(h + 28)) return std::nullopt;
  if (get_le<std::uint64_t>(h + 32) != page_bytes) return std::nullopt;
  Decoded d;
  d.key = std::string_view(reinterpret_cast<const char*>(h + kKeyOffset), klen);
  d.gen = get_le<std::uint64_t>(h + 8);
  d.len = get_le<std::uint64_t>(h + 16);
  d.crc = get_le<std::uint32_t>(h + 24);
  if (d.len > page_bytes) return std::nullopt;
  return d;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(errno, "kv: cannot open the folder to sync it", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(err, "kv: cannot sync the folder", dir);
}

/// Takes `dir`/kv.lock (made if missing) with flock(LOCK_EX | LOCK_NB): two stores writing
/// one folder would hand out the same slots and overwrite each other's pages. The lock is
/// per open file, so a second Store in this process is refused as one in another process is;
/// it goes when the descriptor closes (close(), or the process's end, a crash included).
/// Throws deepio::Error EBUSY naming the folder when it is held.
detail::UniqueFd lock_folder(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/kv.lock";
  detail::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (fd.get() < 0) throw Error(errno, "kv: cannot open the folder's lock file", path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      throw Error(EBUSY,
                  "kv: the folder is in use by another deepio.kv store (in this process or another); "
                  "close that one first",
                  dir);
    }
    throw Error(e, "kv: cannot lock the folder", path);
  }
  return fd;
}

/// Writes `bytes` to `path` durably: temp file through the handle with fsync, rename, folder sync.
void write_durably(Handle& handle, const std::string& dir, const std::string& name,
                   const std::vector<unsigned char>& bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  const std::string path = dir + "/" + name;
  ::unlink(tmp.c_str());
  handle.sync_pwrite(bytes.data(), bytes.size(), tmp, 0, true);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw Error(errno, "kv: cannot rename " + tmp, path);
  fsync_dir(dir);
}

/// The whole file through the handle, or nullopt when it does not exist.
std::optional<std::vector<unsigned char>> read_whole(Handle& handle, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error(errno, "kv: cannot stat", path);
  }
  std::vector<unsigned char> out(static_cast<std::size_t>(st.st_size));
  if (!out.empty()) handle.sync_pread(out.data(), out.size(), path, 0);
  return out;
}

enum class SlotState : std::uint8_t { Free, Writing, Live, Zombie };

struct SlotInfo {
  SlotState state = SlotState::Free;
  std::uint32_t pins = 0;
};

struct Entry {
  std::uint32_t folder = 0;
  std::uint32_t slot = 0;
  std::uint64_t gen = 0;
  std::uint64_t len = 0;
  std::list<const std::string*>::iterator lru;
};

struct Folder {
  std::string path;
  /// kv.lock, held with flock(LOCK_EX) while the store is open: one store per folder.
  detail::UniqueFd lock;
  std::vector<File> slabs;
  std::uint64_t slots = 0;
  std::uint64_t per_slab = 0;
  std::vector<SlotInfo> info;
  std::vector<std::uint32_t> free;                        // slots to hand out
  std::list<const std::string*> lru;                      // live keys, least recently used first
  std::unordered_map<std::uint32_t, std::uint64_t> tick;  // slot -> LRU tick (checkpoint)
  bool failed = false;
  /// open() read every slot header of the folder (its slabs and slot table are whole): only
  /// such a folder is probed after a failure. One that failed at open waits for a reopen.
  bool opened = false;
  /// When the folder last saw an error (a failed operation or probe): the next automatic
  /// probe waits StoreOptions::retry_failed_after from here.
  std::chrono::steady_clock::time_point failed_at{};
  std::uint64_t errors = 0;
  std::uint64_t recoveries = 0;
  int last_errno = 0;
  std::string last_error;
};

/// Device (CUDA) pages of one batch thread: the CRC-32C needs host bytes, so a device page
/// moves through one of `count` page-sized buffers of one page-locked arena (allocate_locked,
/// made on the first device page), copied by the engine's own DeviceStager for the device (the
/// CudaStager its workers use: the arena registered with cuMemHostRegister, device-to-host
/// copies synchronous, host-to-device copies queued on its non-blocking stream with an event
/// per buffer). Owned and used by one batch thread (a store's own thread, which may keep a
/// context current, as the engine's workers do). A buffer is handed out by acquire() and
/// comes back by release(), after its disk I/O settled and (gets) its copy finished (wait()).
class DeviceScratch {
 public:
  DeviceScratch(const detail::DeviceSupport* support, std::size_t count, std::size_t buf_bytes)
      : support_(support), count_(std::max<std::size_t>(1, count)), buf_bytes_(buf_bytes), busy_(count_, false) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  /// The device holding p, or -1 (host memory, managed memory, or no driver in the process).
  int device_of(const void* p) const { return support_->classify ? support_->classify(p) : -1; }
  /// Whether any segment of the page is device memory.
  bool on_device(const std::vector<Segment>& page) const {
    for (const Segment& s : page) {
      if (s.nbytes > 0 && device_of(s.data) >= 0) return true;
    }
    return false;
  }
  /// A free buffer, or -1 when all are in use.
  int acquire() {
    for (std::size_t k = 0; k < count_; ++k) {
      if (!busy_[k]) {
        busy_[k] = true;
        return static_cast<int>(k);
      }
    }
    return -1;
  }
  void release(int b) { busy_.at(static_cast<std::size_t>(b)) = false; }
  /// The buffer's memory; valid after a successful to_host()/prepare().
  unsigned char* data(int b) const {
    return static_cast<unsigned char*>(arena_.data()) + static_cast<std::size_t>(b) * buf_bytes_;
  }

  /// Makes the arena (first call); false + *why when it cannot be made.
  bool prepare(std::string* why) {
    if (arena_.data() != nullptr) return true;
    try {
      arena_ = UniqueLockedBuffer(count_ * buf_bytes_);
    } catch (const std::exception& e) {
      *why = std::string("kv: the host buffers for device pages: ") + e.what();
      return false;
    }
    return true;
  }
  /// Copies the page's segments, in order, into buffer b (device ones by the stager, host ones
  /// by memcpy). false + *why (the driver call and its error) on failure.
  bool to_host(int b, const std::vector<Segment>& page, std::string* why) {
    if (!prepare(why)) return false;
    std::size_t off = 0;
    for (const Segment& s : page) {
      if (s.nbytes == 0) continue;
      const int dev = device_of(s.data);
      if (dev < 0) {
        std::memcpy(data(b) + off, s.data, s.nbytes);
      } else {
        detail::DeviceStager* st = stager(dev, why);
        if (st == nullptr) return false;
        if (detail::Status r = st->to_staging(b, data(b) + off, static_cast<const std::byte*>(s.data), s.nbytes);
            !r.ok()) {
          *why = r.message;
          return false;
        }
      }
      off += s.nbytes;
    }
    return true;
  }
  /// Starts copying buffer b into the page's segments (host ones by memcpy, at once); wait(b)
  /// finishes them. false + *why when a copy cannot start (those started are still waited for).
  bool to_device(int b, const std::vector<Segment>& page, std::string* why) {
    std::size_t off = 0;
    for (const Segment& s : page) {
      if (s.nbytes == 0) continue;
      const int dev = device_of(s.data);
      if (dev < 0) {
        std::memcpy(s.data, data(b) + off, s.nbytes);
      } else {
        detail::DeviceStager* st = stager(dev, why);
        if (st == nullptr) return false;
        if (detail::Status r = st->from_staging(b, static_cast<std::byte*>(s.data), data(b) + off, s.nbytes); !r.ok()) {
          *why = r.message;
          return false;
        }
      }
      off += s.nbytes;
    }
    return true;
  }
  /// Every later copy to or from `dev` runs after the fence's work (the stager's stream waits
  /// for its event on the device). false + *why when that cannot be arranged.
  bool order_after(int dev, const detail::DeviceFence& fence, std::string* why) {
    if (!prepare(why)) return false;
    detail::DeviceStager* st = stager(dev, why);
    if (st == nullptr) return false;
    if (detail::Status r = st->order_after(fence); !r.ok()) {
      *why = r.message;
      return false;
    }
    return true;
  }
  /// Waits for buffer b's copies on every device; false + *why when one failed.
  bool wait(int b, std::string* why) {
    bool good = true;
    for (auto& [dev, st] : stagers_) {
      if (detail::Status r = st->wait(b); !r.ok() && good) {
        *why = r.message;
        good = false;
      }
    }
    return good;
  }

 private:
  detail::DeviceStager* stager(int dev, std::string* why) {
    auto it = stagers_.find(dev);
    if (it != stagers_.end()) return it->second.get();
    detail::Status st;
    std::unique_ptr<detail::DeviceStager> made;
    if (support_->make_stager) made = support_->make_stager(dev, count_, &st);
    if (made == nullptr) {
      *why = "kv: no copies for device " + std::to_string(dev) + ": " +
             (st.message.empty() ? std::string("no driver") : st.message);
      return nullptr;
    }
    if (detail::Status r = made->register_staging(arena_.data(), arena_.size()); !r.ok()) {
      *why = r.message;
      return nullptr;
    }
    return stagers_.emplace(dev, std::move(made)).first->second.get();
  }

  const detail::DeviceSupport* support_;
  std::size_t count_;
  std::size_t buf_bytes_;
  std::vector<bool> busy_;
  UniqueLockedBuffer arena_;  // before stagers_: they unregister it when destroyed
  std::map<int, std::unique_ptr<detail::DeviceStager>> stagers_;
};

struct Job {
  bool write = false;
  /// BatchOptions::stream's events, one per device of the batch's device pages.
  std::vector<std::pair<int, std::shared_ptr<detail::DeviceFence>>> fences;
  std::vector<std::string> keys;
  std::vector<std::vector<Segment>> segments;
  std::shared_ptr<BatchFuture::State> state;
};

/// The errno a failed operation stands for (EIO where the error carries none).
int errno_of(const Error& e) noexcept { return e.errnum() != 0 ? e.errnum() : EIO; }

/// Waits for f and returns its errno (0 on success), with the message in *what.
int settle(Future& f, std::string* what) {
  try {
    f.get();
    return 0;
  } catch (const Error& e) {
    *what = e.what();
    return errno_of(e);
  }
}

/// The I/O errors of a batch's pages: per page an errno (0: none) and its message. A page's
/// error fails its folder when the batch commits.
struct PageErrors {
  std::vector<int> err;
  std::vector<std::string> what;

  explicit PageErrors(std::size_t n) : err(n, 0), what(n) {}
  void set(std::size_t i, int e, const std::string& w) {
    err[i] = e;
    what[i] = w;
  }
  void set(std::size_t i, const Error& e) { set(i, errno_of(e), e.what()); }
  /// Waits for every future of page i (and drops them), keeping the page's first error.
  void settle_all(std::size_t i, std::vector<Future>& futs) {
    for (Future& f : futs) {
      std::string w;
      const int e = settle(f, &w);
      if (e != 0 && err[i] == 0) set(i, e, w);
    }
    futs.clear();
  }
};

/// The slot headers of a batch: page i's header is bytes [i * kHeaderBytes, +kHeaderBytes) of
/// one aligned buffer, moved with one ranged read, or one ranged write with OpOptions::fsync,
/// per slab (add() the pages, start(), then finish() before the buffer goes).
class SlabHeaders {
 public:
  explicit SlabHeaders(std::size_t pages) : bytes_(pages * kHeaderBytes), buf_(aligned_buf(bytes_)) {}
  [[nodiscard]] unsigned char* at(std::size_t i) const { return buf_.get() + i * kHeaderBytes; }
  /// Page i's header lives at file offset `offset` of slab `slab` of folder `folder`.
  void add(std::size_t i, std::uint32_t folder, std::uint64_t slab, std::uint64_t offset) {
    Group& g = groups_[{folder, slab}];
    g.pages.push_back(i);
    g.ranges.push_back(IoRange{offset, i * kHeaderBytes, kHeaderBytes});
  }
  /// Starts the reads (write false) or the synced writes; a call that throws marks its pages.
  void start(std::vector<Folder>& folders, bool write, PageErrors& errs) {
    for (auto& [where, g] : groups_) {
      File& slab = folders[where.first].slabs[where.second];
      try {
        g.fut = write
                    ? slab.pwrite_ranges(buf_.get(), bytes_, g.ranges, OpOptions{.fsync = true, .stream = std::nullopt})
                    : slab.pread_ranges(buf_.get(), bytes_, g.ranges);
        g.started = true;
      } catch (const Error& e) {
        for (std::size_t i : g.pages) errs.set(i, e);
      }
    }
  }
  /// Waits for what start() started; a failed one marks its pages.
  void finish(PageErrors& errs) {
    for (auto& [where, g] : groups_) {
      if (!g.started) continue;
      g.started = false;
      std::string w;
      const int e = settle(g.fut, &w);
      if (e != 0) {
        for (std::size_t i : g.pages) errs.set(i, e, w);
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
  std::size_t bytes_;
  AlignedBuf buf_;  // before groups_: their futures go first
  std::map<std::pair<std::uint32_t, std::uint64_t>, Group> groups_;
};

}  // namespace

// ---- Store::Impl ----------------------------------------------------------------------------

struct Store::Impl {
  StoreOptions opt;
  long pid = static_cast<long>(::getpid());
  std::uint64_t slot_bytes = 0;
  std::unique_ptr<Handle> handle;
  detail::DeviceSupport device;  // read once at open, as a Handle does

  mutable std::mutex mu;
  std::vector<Folder> folders;
  std::unordered_map<std::string, Entry> index;
  std::set<std::uint64_t> inflight_gens;
  std::condition_variable gens_cv;  // notified when puts leave inflight_gens (mu)
  std::uint64_t next_gen = 1;
  std::uint64_t clock = 0;
  StoreStats st;
  std::vector<std::string> warnings;
  bool dirty = false;
  bool closed = false;

  std::mutex ckpt_mu;
  std::mutex probe_mu;  // one probe of failed folders at a time; taken before ckpt_mu and mu
  std::chrono::steady_clock::time_point last_ckpt = std::chrono::steady_clock::now();  // mu

  std::mutex qmu;
  std::condition_variable qcv;
  std::deque<Job> queue;
  bool stopping = false;
  std::vector<std::thread> threads;

  // -- helpers (mu held) --
  std::uint64_t slot_offset(const Folder& f, std::uint32_t slot) const { return (slot % f.per_slab) * slot_bytes; }
  File& slab_of(Folder& f, std::uint32_t slot) { return f.slabs[slot / f.per_slab]; }
  /// Adds page i, whose slot is `slot` of folder `fi`, to a batch's headers.
  void add_header(SlabHeaders& hdr, std::size_t i, std::uint32_t fi, std::uint32_t slot) const {
    const Folder& f = folders[fi];
    hdr.add(i, fi, slot / f.per_slab, slot_offset(f, slot));
  }

  void fail_folder(std::uint32_t fi, int err, const std::string& what) {
    Folder& f = folders[fi];
    ++f.errors;
    f.last_errno = err;
    f.last_error = what;
    f.failed_at = std::chrono::steady_clock::now();
    if (f.failed) return;
    f.failed = true;
    warnings.push_back("deepio.kv: folder " + f.path + " failed (" + what +
                       "); its pages are misses and new pages go to the other folders until a probe finds it "
                       "working again");
    for (auto it = index.begin(); it != index.end();) {
      if (it->second.folder == fi) {
        f.lru.erase(it->second.lru);
        release_slot(f, it->second.slot);
        it = index.erase(it);
      } else {
        ++it;
      }
    }
    dirty = true;
  }

  void release_slot(Folder& f, std::uint32_t slot) {
    SlotInfo& s = f.info[slot];
    f.tick.erase(slot);
    if (s.pins > 0) {
      s.state = SlotState::Zombie;
    } else {
      s.state = SlotState::Free;
      f.free.push_back(slot);
    }
  }

  void drop_entry(std::unordered_map<std::string, Entry>::iterator it) {
    Folder& f = folders[it->second.folder];
    f.lru.erase(it->second.lru);
    release_slot(f, it->second.slot);
    index.erase(it);
    dirty = true;
  }

  void evict(std::uint32_t fi) {
    Folder& f = folders[fi];
    const auto high = static_cast<std::uint64_t>(opt.high_watermark * static_cast<double>(f.slots));
    const auto low = static_cast<std::uint64_t>(opt.low_watermark * static_cast<double>(f.slots));
    if (!f.free.empty() && f.slots - f.free.size() + 1 <= high) return;
    while (f.slots - f.free.size() > low && !f.lru.empty()) {
      auto it = index.find(*f.lru.front());
      drop_entry(it);
      ++st.evictions;
    }
    // Nothing left to evict but slots pinned or being written: take what is free.
  }

  std::optional<std::pair<std::uint32_t, std::uint32_t>> allocate(std::string_view key) {
    const auto n = static_cast<std::uint32_t>(folders.size());
    const auto start = static_cast<std::uint32_t>(fnv1a(key) % n);
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t fi = (start + k) % n;
      Folder& f = folders[fi];
      if (f.failed) continue;
      evict(fi);
      if (f.free.empty()) continue;
      const std::uint32_t slot = f.free.back();
      f.free.pop_back();
      f.info[slot].state = SlotState::Writing;
      return std::make_pair(fi, slot);
    }
    return std::nullopt;
  }

  void touch(Entry& e) {
    Folder& f = folders[e.folder];
    f.lru.splice(f.lru.end(), f.lru, e.lru);
    f.tick[e.slot] = ++clock;
  }

  // -- batch threads --
  /// Queues a batch; refused once close() began (its threads may be gone).
  void enqueue(Job job) {
    {
      std::lock_guard lk(qmu);
      if (stopping) throw InvalidArgument("kv::Store: the store is closed");
      queue.push_back(std::move(job));
    }
    qcv.notify_one();
  }

  void run_jobs() {
    DeviceScratch scratch(&device, opt.device_pages_in_flight, round_up(opt.page_bytes, kAlign));
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

  void maybe_checkpoint() {
    if (opt.checkpoint_interval.count() <= 0) return;
    {
      std::lock_guard lk(mu);
      if (!dirty || std::chrono::steady_clock::now() - last_ckpt < opt.checkpoint_interval) return;
    }
    std::unique_lock ck(ckpt_mu, std::try_to_lock);
    if (!ck.owns_lock()) return;
    try {
      write_checkpoint();
    } catch (const Error&) {
      // Counted in the folder's errors by write_checkpoint; the next interval tries again.
    }
  }

  // -- failed folders --
  /// After a batch: probes the folders failed for at least retry_failed_after, unless another
  /// thread is probing.
  void maybe_retry_failed() {
    if (opt.retry_failed_after.count() <= 0) return;
    {
      std::lock_guard lk(mu);
      const auto now = std::chrono::steady_clock::now();
      if (std::none_of(folders.begin(), folders.end(), [&](const Folder& f) {
            return f.failed && f.opened && now - f.failed_at >= opt.retry_failed_after;
          })) {
        return;
      }
    }
    std::unique_lock pl(probe_mu, std::try_to_lock);
    if (!pl.owns_lock()) return;
    try {
      retry_failed(false);
    } catch (const std::exception&) {
      // bad_alloc and the like, before a probe took any slot: a later batch tries again.
    }
  }

  /// Probes the failed folders (all, or those failed at least retry_failed_after ago); returns
  /// how many came back. probe_mu held, mu not.
  std::size_t retry_failed(bool all) {
    std::vector<std::uint32_t> due;
    {
      std::lock_guard lk(mu);
      const auto now = std::chrono::steady_clock::now();
      for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
        const Folder& f = folders[fi];
        if (f.failed && f.opened && (all || now - f.failed_at >= opt.retry_failed_after)) due.push_back(fi);
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
  ///     folder has no live page now, so it lists none, with the current generation bound.
  ///     The checkpoint on disk was the one from before the failure (a failed folder is left out
  ///     of checkpoints) and listed the pages the failure dropped: after a crash, a reopen would
  ///     bring them back, whatever was removed or evicted since.
  /// Success, with no other error of the folder meanwhile: it takes new pages again (a warning
  /// is queued, recoveries counted). Failure: it stays failed, the error counted, the time of
  /// the failure reset.
  bool probe(std::uint32_t fi) {
    Folder& f = folders[fi];
    std::vector<std::optional<std::uint32_t>> slot_of(f.slabs.size());
    const AlignedBuf zeros = aligned_buf(kHeaderBytes);  // before any slot is taken: may throw
    const AlignedBuf back = aligned_buf(kHeaderBytes * f.slabs.size());
    std::vector<Future> ops;
    ops.reserve(f.slabs.size());
    std::uint64_t errors_before = 0;
    {
      std::lock_guard lk(mu);
      if (!f.failed) return false;
      errors_before = f.errors;
      for (std::uint32_t slot : f.free) {
        auto& pick = slot_of[slot / f.per_slab];
        if (!pick) pick = slot;
      }
      std::erase_if(f.free, [&](std::uint32_t slot) { return slot_of[slot / f.per_slab] == slot; });
      for (const auto& pick : slot_of) {
        if (pick) f.info[*pick].state = SlotState::Writing;
      }
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
        return f.slabs[s].pwrite(zeros.get(), kHeaderBytes, slot_offset(f, *slot_of[s]),
                                 OpOptions{.fsync = true, .stream = std::nullopt});
      });
    }
    wait_all();
    if (err == 0) {
      std::memset(back.get(), 0xA5, kHeaderBytes * f.slabs.size());
      for (std::size_t s = 0; s < f.slabs.size(); ++s) {
        const std::uint64_t off = slot_of[s] ? slot_offset(f, *slot_of[s]) : 0;
        start([&] { return f.slabs[s].pread(back.get() + s * kHeaderBytes, kHeaderBytes, off); });
      }
      wait_all();
    }
    for (std::size_t s = 0; s < f.slabs.size() && err == 0; ++s) {
      if (slot_of[s] && std::memcmp(back.get() + s * kHeaderBytes, zeros.get(), kHeaderBytes) != 0) {
        note(EIO, "kv: a probe of " + f.slabs[s].path() + " read back other bytes than it wrote");
      }
    }
    if (err == 0) {
      try {
        std::lock_guard ck(ckpt_mu);
        std::vector<unsigned char> bytes;
        {
          std::lock_guard lk(mu);
          bytes = checkpoint_bytes(fi, checkpoint_bound());
        }
        write_durably(*handle, f.path, "index.ckpt", bytes);
      } catch (const Error& e) {
        note(errno_of(e), e.what());
      }
    }
    std::lock_guard lk(mu);
    for (const auto& pick : slot_of) {
      if (!pick) continue;
      f.info[*pick].state = SlotState::Free;
      f.free.push_back(*pick);
    }
    if (err != 0) {
      fail_folder(fi, err, what);
      return false;
    }
    if (f.errors != errors_before) return false;  // an operation of the folder failed meanwhile
    f.failed = false;
    ++f.recoveries;
    warnings.push_back("deepio.kv: folder " + f.path + " recovered");
    return true;
  }

  /// A put batch: its pages that failed because their folder's I/O failed (that folder is now
  /// failed) are put again, to the next healthy folder, until none is left.
  std::vector<bool> put_batch(Job& job, DeviceScratch& scratch) {
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

  std::vector<bool> do_put(Job& job, DeviceScratch& scratch, std::vector<bool>* io_failed) {
    const std::size_t n = job.keys.size();
    std::vector<bool> ok(n, false);
    io_failed->assign(n, false);
    struct Place {
      bool have = false;
      std::uint32_t folder = 0, slot = 0;
      std::uint64_t gen = 0, len = 0;
      std::uint32_t crc = 0;
    };
    std::vector<Place> pl(n);
    {
      std::lock_guard lk(mu);
      st.puts += n;
      for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t len = 0;
        for (const Segment& s : job.segments[i]) len += s.nbytes;
        if (len > opt.page_bytes) continue;
        auto where = allocate(job.keys[i]);
        if (!where) continue;
        pl[i] = Place{true, where->first, where->second, next_gen++, len, 0};
        inflight_gens.insert(pl[i].gen);
      }
    }
    // The generations leave inflight_gens at the commit, or here if the batch throws before
    // it (bad_alloc): a checkpoint() waits for them.
    bool committed = false;
    auto release_gens = [&] {
      if (committed) return;
      std::lock_guard lk(mu);
      for (const Place& p : pl) {
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
    // device page's write is waited for, so copies overlap the writes before them.
    std::vector<std::vector<Future>> data(n);
    PageErrors errs(n);
    std::vector<int>& err = errs.err;
    std::vector<std::string>& what = errs.what;
    std::vector<char> on_dev(n, 0), copy_failed(n, 0);
    std::vector<int> buf(n, -1);
    std::deque<std::size_t> writing;  // device pages whose write holds a buffer, oldest first
    std::string fence_why;
    bool fenced = true;
    for (auto& [dev, fence] : job.fences) fenced = fenced && scratch.order_after(dev, *fence, &fence_why);
    for (std::size_t i = 0; i < n; ++i) {
      if (!pl[i].have) continue;
      Folder& f = folders[pl[i].folder];  // the vector never changes after open
      File& slab = slab_of(f, pl[i].slot);
      std::uint64_t off = slot_offset(f, pl[i].slot) + kHeaderBytes;
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
        } catch (const Error& e) {
          errs.set(i, e);
        }
        continue;
      }
      try {
        for (const Segment& s : job.segments[i]) {
          if (s.nbytes == 0) continue;
          data[i].push_back(slab.pwrite(s.data, s.nbytes, off));
          off += s.nbytes;
        }
      } catch (const Error& e) {
        errs.set(i, e);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!pl[i].have || on_dev[i] != 0) continue;
      std::uint32_t c = 0;
      for (const Segment& s : job.segments[i]) c = crc32c(s.data, s.nbytes, c);
      pl[i].crc = c;
    }
    for (std::size_t i = 0; i < n; ++i) errs.settle_all(i, data[i]);
    for (std::size_t i : writing) scratch.release(buf[i]);
    // Phase 2: the headers, one ranged write with fsync per slab.
    SlabHeaders hdr(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (!pl[i].have || err[i] != 0 || copy_failed[i] != 0) continue;
      encode_header(hdr.at(i), job.keys[i], pl[i].gen, pl[i].len, pl[i].crc, opt.page_bytes);
      add_header(hdr, i, pl[i].folder, pl[i].slot);
    }
    hdr.start(folders, true, errs);
    hdr.finish(errs);
    // Commit.
    std::lock_guard lk(mu);
    committed = true;
    gens_cv.notify_all();
    for (std::size_t i = 0; i < n; ++i) {
      if (!pl[i].have) {
        ++st.puts_failed;
        continue;
      }
      inflight_gens.erase(pl[i].gen);
      Folder& f = folders[pl[i].folder];
      if (on_dev[i] != 0) ++st.device_pages;
      if (copy_failed[i] != 0) {  // the device copy failed: nothing was written; not the folder's fault
        ++st.device_copy_errors;
        release_slot(f, pl[i].slot);
        ++st.puts_failed;
        continue;
      }
      if (err[i] != 0 || f.failed) {
        if (err[i] != 0) fail_folder(pl[i].folder, err[i], what[i]);
        (*io_failed)[i] = true;
        release_slot(f, pl[i].slot);
        ++st.puts_failed;
        continue;
      }
      ok[i] = true;
      st.bytes_written += pl[i].len;
      auto it = index.find(job.keys[i]);
      if (it != index.end() && it->second.gen > pl[i].gen) {
        release_slot(f, pl[i].slot);  // a newer put of the key committed first
        continue;
      }
      if (it != index.end()) drop_entry(it);
      auto [nit, inserted] = index.emplace(job.keys[i], Entry{});
      Entry& e = nit->second;
      e.folder = pl[i].folder;
      e.slot = pl[i].slot;
      e.gen = pl[i].gen;
      e.len = pl[i].len;
      f.info[e.slot].state = SlotState::Live;
      e.lru = f.lru.insert(f.lru.end(), &nit->first);
      f.tick[e.slot] = ++clock;
      dirty = true;
    }
    return ok;
  }

  std::vector<bool> do_get(Job& job, DeviceScratch& scratch) {
    const std::size_t n = job.keys.size();
    std::vector<bool> ok(n, false);
    struct Pin {
      bool have = false;
      std::uint32_t folder = 0, slot = 0;
      std::uint64_t gen = 0, len = 0;
    };
    std::vector<Pin> pins(n);
    {
      std::lock_guard lk(mu);
      st.gets += n;
      for (std::size_t i = 0; i < n; ++i) {
        auto it = index.find(job.keys[i]);
        if (it == index.end()) continue;
        Entry& e = it->second;
        std::uint64_t want = 0;
        for (const Segment& s : job.segments[i]) want += s.nbytes;
        if (e.len != want || folders[e.folder].failed) continue;
        ++folders[e.folder].info[e.slot].pins;
        touch(e);
        pins[i] = Pin{true, e.folder, e.slot, e.gen, e.len};
      }
    }
    SlabHeaders hdr(n);
    PageErrors errs(n);
    std::vector<int>& err = errs.err;
    std::vector<std::string>& what = errs.what;
    for (std::size_t i = 0; i < n; ++i) {
      if (pins[i].have) add_header(hdr, i, pins[i].folder, pins[i].slot);
    }
    hdr.start(folders, false, errs);
    std::vector<std::vector<Future>> data(n);
    std::vector<char> on_dev(n, 0), copy_failed(n, 0), verified(n, 0);
    std::deque<std::size_t> dev_pending;
    for (std::size_t i = 0; i < n; ++i) {
      if (!pins[i].have || err[i] != 0) continue;
      Folder& f = folders[pins[i].folder];
      File& slab = slab_of(f, pins[i].slot);
      std::uint64_t off = slot_offset(f, pins[i].slot) + kHeaderBytes;
      if (scratch.on_device(job.segments[i])) {
        on_dev[i] = 1;
        dev_pending.push_back(i);
        continue;
      }
      try {
        for (const Segment& s : job.segments[i]) {
          if (s.nbytes == 0) continue;
          data[i].push_back(slab.pread(s.data, s.nbytes, off));
          off += s.nbytes;
        }
      } catch (const Error& e) {
        errs.set(i, e);
      }
    }
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
            data[i].push_back(slab_of(f, pins[i].slot)
                                  .pread(scratch.data(b), pins[i].len, slot_offset(f, pins[i].slot) + kHeaderBytes));
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
    hdr.finish(errs);
    while (!reading.empty()) {
      const std::size_t i = reading.front();
      reading.pop_front();
      errs.settle_all(i, data[i]);
      if (err[i] == 0) {
        auto d = decode_header(hdr.at(i), opt.page_bytes);
        verified[i] = d && d->key == job.keys[i] && d->gen == pins[i].gen && d->len == pins[i].len &&
                              crc32c(scratch.data(buf[i]), pins[i].len) == d->crc
                          ? 1
                          : 0;
      }
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
    std::uint64_t corrupt = 0, bytes = 0;
    for (std::size_t i = 0; i < n; ++i) {
      errs.settle_all(i, data[i]);
      if (!pins[i].have || err[i] != 0 || copy_failed[i] != 0) continue;
      if (on_dev[i] != 0) {
        if (verified[i] != 0) {
          ok[i] = true;
          bytes += pins[i].len;
        } else {
          ++corrupt;
        }
        continue;
      }
      auto d = decode_header(hdr.at(i), opt.page_bytes);
      bool good = d && d->key == job.keys[i] && d->gen == pins[i].gen && d->len == pins[i].len;
      if (good) {
        std::uint32_t c = 0;
        for (const Segment& s : job.segments[i]) c = crc32c(s.data, s.nbytes, c);
        good = c == d->crc;
      }
      if (good) {
        ok[i] = true;
        bytes += pins[i].len;
      } else {
        ++corrupt;
      }
    }
    std::lock_guard lk(mu);
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
      Folder& f = folders[pins[i].folder];
      SlotInfo& s = f.info[pins[i].slot];
      if (--s.pins == 0 && s.state == SlotState::Zombie) {
        s.state = SlotState::Free;
        f.free.push_back(pins[i].slot);
      }
      if (err[i] != 0) {
        fail_folder(pins[i].folder, err[i], what[i]);
      } else if (!ok[i] && copy_failed[i] == 0) {
        // A slot that no longer holds the page the index says: forget it, keep the slot.
        auto it = index.find(job.keys[i]);
        if (it != index.end() && it->second.gen == pins[i].gen) drop_entry(it);
      }
    }
    return ok;
  }

  // -- checkpoint --
  /// The generation bound of a checkpoint taken now: below every put in flight (mu held).
  std::uint64_t checkpoint_bound() const { return inflight_gens.empty() ? next_gen - 1 : *inflight_gens.begin() - 1; }

  /// Folder fi's checkpoint file: `bound` and its live (slot, generation, LRU tick), least
  /// recently used first (mu held).
  std::vector<unsigned char> checkpoint_bytes(std::uint32_t fi, std::uint64_t bound) const {
    const Folder& f = folders[fi];
    std::vector<unsigned char> b(24);
    put_le<std::uint32_t>(b.data(), kCkptMagic);
    put_le<std::uint32_t>(b.data() + 4, kVersion);
    put_le<std::uint64_t>(b.data() + 8, bound);
    std::uint64_t count = 0;
    for (const std::string* k : f.lru) {
      const Entry& e = index.at(*k);
      unsigned char rec[24];
      put_le<std::uint64_t>(rec, e.slot);
      put_le<std::uint64_t>(rec + 8, e.gen);
      auto t = f.tick.find(e.slot);
      put_le<std::uint64_t>(rec + 16, t == f.tick.end() ? 0 : t->second);
      b.insert(b.end(), rec, rec + 24);
      ++count;
    }
    put_le<std::uint64_t>(b.data() + 16, count);
    const std::uint32_t c = crc32c(b.data(), b.size());
    b.resize(b.size() + 4);
    put_le<std::uint32_t>(b.data() + b.size() - 4, c);
    return b;
  }

  void write_checkpoint() {
    struct Snap {
      std::vector<unsigned char> bytes;
      std::uint32_t folder;
    };
    std::vector<Snap> snaps;
    {
      std::lock_guard lk(mu);
      const std::uint64_t bound = checkpoint_bound();
      for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
        if (!folders[fi].failed) snaps.push_back(Snap{checkpoint_bytes(fi, bound), fi});
      }
      dirty = false;
      last_ckpt = std::chrono::steady_clock::now();
    }
    std::optional<Error> first;
    for (Snap& s : snaps) {
      try {
        write_durably(*handle, folders[s.folder].path, "index.ckpt", s.bytes);
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

  // -- open --
  void open_folder(std::uint32_t fi, std::uint64_t share) {
    Folder& f = folders[fi];
    std::filesystem::create_directories(f.path);
    const std::string meta_path = f.path + "/kv.meta";
    auto meta = read_whole(*handle, meta_path);
    bool fresh = false;
    if (meta && meta->size() == 44 && get_le<std::uint32_t>(meta->data()) == kMetaMagic &&
        crc32c(meta->data(), 40) == get_le<std::uint32_t>(meta->data() + 40)) {
      const auto pb = get_le<std::uint64_t>(meta->data() + 8);
      if (pb != opt.page_bytes) {
        throw InvalidArgument("kv: " + f.path + " holds a store of page_bytes " + std::to_string(pb) + ", not " +
                              std::to_string(opt.page_bytes));
      }
      f.slots = get_le<std::uint64_t>(meta->data() + 24);
      f.per_slab = get_le<std::uint64_t>(meta->data() + 32);
    } else {
      if (share == 0) {
        struct statvfs vfs {};
        if (::statvfs(f.path.c_str(), &vfs) != 0) throw Error(errno, "kv: cannot statvfs", f.path);
        share = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize / 2;
      }
      f.slots = std::max<std::uint64_t>(1, share / slot_bytes);
      f.slots = std::min<std::uint64_t>(f.slots, 0xFFFFFFFFull);
      f.per_slab = std::max<std::uint64_t>(1, opt.slab_bytes / slot_bytes);
      fresh = true;
    }
    const std::uint64_t nslabs = (f.slots + f.per_slab - 1) / f.per_slab;
    for (std::uint64_t s = 0; s < nslabs; ++s) {
      char name[32];
      std::snprintf(name, sizeof name, "/slab-%04llu.bin", static_cast<unsigned long long>(s));
      File file = handle->open(f.path + name, O_RDWR | O_CREAT);
      const std::uint64_t want = std::min(f.per_slab, f.slots - s * f.per_slab) * slot_bytes;
      if (file.size() < want) {
        if (::fallocate(file.fd(), 0, 0, static_cast<off_t>(want)) != 0) {
          const int e = errno;
          if ((e != EOPNOTSUPP && e != ENOSYS) || ::ftruncate(file.fd(), static_cast<off_t>(want)) != 0) {
            throw Error(e, "kv: cannot allocate the slab", file.path(), 0, want);
          }
        }
      }
      f.slabs.push_back(std::move(file));
    }
    if (fresh) {
      std::vector<unsigned char> m(44);
      put_le<std::uint32_t>(m.data(), kMetaMagic);
      put_le<std::uint32_t>(m.data() + 4, kVersion);
      put_le<std::uint64_t>(m.data() + 8, opt.page_bytes);
      put_le<std::uint64_t>(m.data() + 16, slot_bytes);
      put_le<std::uint64_t>(m.data() + 24, f.slots);
      put_le<std::uint64_t>(m.data() + 32, f.per_slab);
      put_le<std::uint32_t>(m.data() + 40, crc32c(m.data(), 40));
      write_durably(*handle, f.path, "kv.meta", m);
    }
    f.info.assign(f.slots, SlotInfo{});
  }

  struct Candidate {
    std::uint32_t folder, slot;
    std::uint64_t gen, len, tick;
    std::uint32_t crc;
  };

  /// Reads every slot header of folder fi; appends its live candidates by key.
  void scan_folder(std::uint32_t fi, std::unordered_map<std::string, std::vector<Candidate>>* found) {
    Folder& f = folders[fi];
    // The checkpoint.
    std::uint64_t bound = 0;
    std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> ck;  // slot -> gen, tick
    if (auto b = read_whole(*handle, f.path + "/index.ckpt"); b && b->size() >= 28) {
      const auto& v = *b;
      const auto count = get_le<std::uint64_t>(v.data() + 16);
      if (get_le<std::uint32_t>(v.data()) == kCkptMagic && v.size() == 28 + count * 24 &&
          crc32c(v.data(), v.size() - 4) == get_le<std::uint32_t>(v.data() + v.size() - 4)) {
        bound = get_le<std::uint64_t>(v.data() + 8);
        for (std::uint64_t r = 0; r < count; ++r) {
          const unsigned char* p = v.data() + 24 + r * 24;
          ck[static_cast<std::uint32_t>(get_le<std::uint64_t>(p))] = {get_le<std::uint64_t>(p + 8),
                                                                      get_le<std::uint64_t>(p + 16)};
        }
      }
    }
    struct Chunk {
      std::uint32_t first;
      std::size_t count;
      AlignedBuf buf;
      Future fut;
    };
    std::deque<Chunk> inflight;
    auto drain_one = [&] {
      Chunk c = std::move(inflight.front());
      inflight.pop_front();
      c.fut.get();
      for (std::size_t k = 0; k < c.count; ++k) {
        const std::uint32_t slot = c.first + static_cast<std::uint32_t>(k);
        auto d = decode_header(c.buf.get() + k * kHeaderBytes, opt.page_bytes);
        if (!d) continue;
        next_gen = std::max(next_gen, d->gen + 1);
        std::uint64_t tick = 0;
        if (d->gen <= bound) {
          auto it = ck.find(slot);
          if (it == ck.end() || it->second.first != d->gen) continue;  // freed before the checkpoint
          tick = it->second.second;
        } else {
          tick = (std::uint64_t{1} << 62) + d->gen;  // after the checkpoint: newest
        }
        (*found)[std::string(d->key)].push_back(Candidate{fi, slot, d->gen, d->len, tick, d->crc});
      }
    };
    for (std::uint64_t s = 0; s < f.slabs.size(); ++s) {
      const std::uint64_t in_slab = std::min(f.per_slab, f.slots - s * f.per_slab);
      for (std::uint64_t k = 0; k < in_slab; k += kScanChunkSlots) {
        const std::size_t count = std::min<std::uint64_t>(kScanChunkSlots, in_slab - k);
        Chunk c{static_cast<std::uint32_t>(s * f.per_slab + k), count, aligned_buf(count * kHeaderBytes), {}};
        std::vector<IoRange> ranges(count);
        for (std::size_t r = 0; r < count; ++r)
          ranges[r] = IoRange{(k + r) * slot_bytes, r * kHeaderBytes, kHeaderBytes};
        c.fut = f.slabs[s].pread_ranges(c.buf.get(), count * kHeaderBytes, ranges);
        inflight.push_back(std::move(c));
        if (inflight.size() >= kScanInFlight) drain_one();
      }
    }
    while (!inflight.empty()) drain_one();
  }

  /// Whether the slot's data matches crc (read through the handle).
  bool data_matches(const Candidate& c) {
    AlignedBuf buf = aligned_buf(c.len);
    Folder& f = folders[c.folder];
    if (c.len > 0) slab_of(f, c.slot).pread(buf.get(), c.len, slot_offset(f, c.slot) + kHeaderBytes).get();
    return crc32c(buf.get(), c.len) == c.crc;
  }

  void open() {
    const auto t0 = std::chrono::steady_clock::now();
    handle = std::make_unique<Handle>(opt.handle);
    device = detail::device_support();
    folders.resize(opt.folders.size());
    const std::uint64_t share = opt.capacity_bytes / opt.folders.size();
    if (opt.capacity_bytes != 0 && share < slot_bytes) {
      throw InvalidArgument("kv: capacity_bytes " + std::to_string(opt.capacity_bytes) + " holds less than one slot (" +
                            std::to_string(slot_bytes) + " bytes) per folder");
    }
    // Every folder's lock first: one held by another store fails the open as a whole, before
    // anything is read or written. A folder that cannot be made or locked otherwise is left to
    // open_folder, which marks it failed for the same reason.
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      folders[fi].path = opt.folders[fi];
      try {
        folders[fi].lock = lock_folder(folders[fi].path);
      } catch (const Error& e) {
        if (e.errnum() == EBUSY) throw;
      } catch (const std::filesystem::filesystem_error&) {
      }
    }
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
    // Resolve: per key the newest candidate (whose data matches, when there are several).
    std::vector<std::vector<std::pair<std::uint64_t, const std::string*>>> order(folders.size());
    for (auto& [key, cands] : found) {
      std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.gen > b.gen; });
      std::optional<Candidate> win;
      for (const Candidate& c : cands) {
        if (folders[c.folder].failed) continue;
        if (cands.size() == 1 || data_matches(c)) {
          win = c;
          break;
        }
      }
      if (!win) continue;
      Folder& f = folders[win->folder];
      auto [it, ins] = index.emplace(key, Entry{win->folder, win->slot, win->gen, win->len, {}});
      f.info[win->slot].state = SlotState::Live;
      f.tick[win->slot] = win->tick;
      order[win->folder].emplace_back(win->tick, &it->first);
    }
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      Folder& f = folders[fi];
      std::sort(order[fi].begin(), order[fi].end());
      for (auto& [tick, key] : order[fi]) index[*key].lru = f.lru.insert(f.lru.end(), key);
      for (auto& [slot, tick] : f.tick) tick = ++clock;  // renumber (ticks only order)
      if (f.failed) continue;                            // possibly failed before its slot table was made
      for (std::uint64_t s = f.slots; s-- > 0;) {
        if (f.info[s].state == SlotState::Free) f.free.push_back(static_cast<std::uint32_t>(s));
      }
    }
    st.recovered_pages = index.size();
    st.open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t t = 0; t < std::max<std::size_t>(1, opt.batch_threads); ++t)
      threads.emplace_back([this] { run_jobs(); });
  }

  /// Waits until every put that took its generation before the call has committed or failed
  /// (lk holds mu). A checkpoint written after it lists every page committed before the call
  /// and has a generation bound above every page removed before it, so that no removed page
  /// (nor an older version of it) is taken back by the scan of a later open.
  void wait_for_earlier_puts(std::unique_lock<std::mutex>& lk) {
    const std::uint64_t target = next_gen;
    gens_cv.wait(lk, [&] { return inflight_gens.empty() || *inflight_gens.begin() >= target; });
  }

  /// checkpoint() and clear(): the barrier above, then the checkpoint.
  void durable_checkpoint() {
    {
      std::unique_lock lk(mu);
      wait_for_earlier_puts(lk);
    }
    std::lock_guard ck(ckpt_mu);
    write_checkpoint();
  }

  void check_usable() const {
    const long now = static_cast<long>(::getpid());
    if (now != pid) throw ForkedHandle(pid, now);
    std::lock_guard lk(mu);
    if (closed) throw InvalidArgument("kv::Store: the store is closed");
  }
};

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

Store::Store(const StoreOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = options;
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
  m.slot_bytes = kHeaderBytes + round_up(options.page_bytes, kAlign);
  m.st.page_bytes = options.page_bytes;
  m.st.slot_bytes = m.slot_bytes;
  m.open();
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
  Job job;
  job.write = true;
  job.keys.assign(keys.begin(), keys.end());
  job.segments.assign(segments.begin(), segments.end());
  job.fences = fences_for(impl_->device, segments, options);
  job.state = std::make_shared<BatchFuture::State>();
  job.state->pid = impl_->pid;
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
  Job job;
  job.keys.assign(keys.begin(), keys.end());
  job.segments.assign(segments.begin(), segments.end());
  job.fences = fences_for(impl_->device, segments, options);
  job.state = std::make_shared<BatchFuture::State>();
  job.state->pid = impl_->pid;
  BatchFuture fut(job.state);
  impl_->enqueue(std::move(job));
  return fut;
}

std::size_t Store::exists(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::size_t n = 0;
  for (std::string_view k : keys) {
    if (impl_->index.find(std::string(k)) == impl_->index.end()) break;
    ++n;
  }
  return n;
}

std::vector<bool> Store::contains(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::vector<bool> out;
  out.reserve(keys.size());
  for (std::string_view k : keys) out.push_back(impl_->index.find(std::string(k)) != impl_->index.end());
  return out;
}

std::size_t Store::remove(std::span<const std::string_view> keys) {
  impl_->check_usable();
  std::lock_guard lk(impl_->mu);
  std::size_t n = 0;
  for (std::string_view k : keys) {
    auto it = impl_->index.find(std::string(k));
    if (it == impl_->index.end()) continue;
    impl_->drop_entry(it);
    ++n;
  }
  impl_->st.removes += n;
  return n;
}

std::size_t Store::clear() {
  impl_->check_usable();
  std::size_t n = 0;
  {
    std::lock_guard lk(impl_->mu);
    n = impl_->index.size();
    while (!impl_->index.empty()) impl_->drop_entry(impl_->index.begin());
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
  s.pages = impl_->index.size();
  s.capacity_bytes = 0;
  for (const Folder& f : impl_->folders) {
    FolderStats fs;
    fs.path = f.path;
    fs.failed = f.failed;
    fs.slots = f.slots;
    fs.used = f.slots - std::min<std::uint64_t>(f.slots, f.free.size());
    if (f.failed) fs.used = 0;
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
  if (static_cast<long>(::getpid()) != m.pid) {
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
  for (Folder& f : m.folders) f.slabs.clear();
  // The locks last, once no write of this store can come.
  for (Folder& f : m.folders) f.lock.reset();
  m.handle.reset();
  if (err) throw *err;
}

}  // namespace deepio::kv
