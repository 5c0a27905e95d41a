#include "platform/crash_sim.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "platform/fault.hpp"

namespace deepio::detail {

namespace {

std::runtime_error sim_error(const std::string& what, const std::string& name) {
  return std::runtime_error("crash simulator: " + what + " " + name + ": " + std::to_string(errno));
}

void write_all(int fd, const unsigned char* p, std::size_t n, std::uint64_t off, const std::string& name) {
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw sim_error("cannot rewrite", name);
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
}

std::vector<unsigned char> read_upto(int fd, std::size_t n, std::uint64_t off) {
  std::vector<unsigned char> out(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out.data() + got, n - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // the end of the file (or unreadable: treated as past the end)
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  return out;
}

std::uint64_t size_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

}  // namespace

struct CrashRecorder::File {
  struct Write {
    std::uint64_t off = 0;
    std::vector<unsigned char> data;
  };
  std::string name;
  std::size_t order = 0;  // the how-manieth file the recorder saw: seeds its outcome
  int fd = -1;            // our own descriptor, read-write, through the page cache
  std::uint64_t synced_size = 0;
  std::map<std::uint64_t, std::vector<unsigned char>> base;         // sector -> bytes at the last flush
  std::vector<Write> writes;                                        // completed since, in order
  std::multiset<std::pair<std::uint64_t, std::uint64_t>> inflight;  // (offset, length)

  ~File() {
    if (fd >= 0) ::close(fd);
  }
  [[nodiscard]] bool clean() const { return base.empty() && writes.empty() && inflight.empty(); }
};

CrashRecorder::CrashRecorder(std::size_t tear_bytes) : tear_(tear_bytes) {
  if (tear_ < 512 || (tear_ & (tear_ - 1)) != 0) throw std::invalid_argument("crash simulator: tear_bytes");
  set_fault_hook([this](const FaultSite& site) { return on_site(site); });
}

CrashRecorder::~CrashRecorder() { set_fault_hook({}); }

CrashRecorder::File& CrashRecorder::file_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw sim_error("cannot stat descriptor", std::to_string(fd));
  auto& slot = files_[{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)}];
  if (!slot) {
    auto f = std::make_unique<File>();
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    char buf[4096];
    const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    f->name = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : link;
    f->fd = ::open(link.c_str(), O_RDWR | O_CLOEXEC);
    if (f->fd < 0) throw sim_error("cannot reopen", f->name);
    f->synced_size = static_cast<std::uint64_t>(st.st_size);
    f->order = files_.size();
    slot = std::move(f);
  }
  return *slot;
}

void CrashRecorder::fail_under(std::string folder) {
  std::lock_guard lk(mu_);
  if (!folder.empty() && folder.back() != '/') folder += '/';
  fail_prefix_ = std::move(folder);
}

bool CrashRecorder::failing(const FaultSite& site) const {
  if (fail_prefix_.empty()) return false;
  std::string name;
  if (site.fd >= 0) {
    char buf[4096];
    const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(site.fd)).c_str(), buf, sizeof buf - 1);
    if (n > 0) name.assign(buf, static_cast<std::size_t>(n));
  } else if (site.path != nullptr) {
    name = site.path;
  }
  return name.rfind(fail_prefix_, 0) == 0;
}

std::optional<std::int64_t> CrashRecorder::on_site(const FaultSite& site) {
  std::lock_guard lk(mu_);
  switch (site.point) {
    case FaultPoint::Submit:
    case FaultPoint::Sync:
      // After the crash nothing new reaches the kernel and no flush happens.
      if (frozen_) return -EIO;
      if (site.point == FaultPoint::Submit) return std::nullopt;
      if (failing(site)) return -EIO;  // a failed drive's flush: nothing becomes durable
      break;
    case FaultPoint::Read: return failing(site) ? std::optional<std::int64_t>(-EIO) : std::nullopt;
    case FaultPoint::Issue:
    case FaultPoint::Write:
      if (!site.write && site.point == FaultPoint::Issue) return std::nullopt;
      break;
    default: return std::nullopt;
  }
  if (site.fd < 0) return std::nullopt;
  File& f = file_of(site.fd);
  if (site.point == FaultPoint::Issue) {
    if (f.clean()) f.synced_size = size_of(f.fd);
    if (site.nbytes > 0) {
      for (std::uint64_t s = site.offset / tear_; s <= (site.offset + site.nbytes - 1) / tear_; ++s) {
        if (!f.base.contains(s)) f.base[s] = read_upto(f.fd, tear_, s * tear_);
      }
    }
    f.inflight.insert({site.offset, site.nbytes});
    ++inflight_;
    return std::nullopt;
  }
  if (site.point == FaultPoint::Write) {
    auto it = f.inflight.find({site.offset, site.nbytes});
    if (it == f.inflight.end()) return std::nullopt;  // issued before the recorder
    f.inflight.erase(it);
    --inflight_;
    if (site.result > 0) {
      f.writes.push_back({site.offset, read_upto(f.fd, static_cast<std::size_t>(site.result), site.offset)});
    }
    return failing(site) ? std::optional<std::int64_t>(-EIO) : std::nullopt;
  }
  flushed(f);
  return std::nullopt;
}

void CrashRecorder::note_flush(int fd) {
  std::lock_guard lk(mu_);
  if (frozen_ || fd < 0) return;
  flushed(file_of(fd));
}

void CrashRecorder::flushed(File& f) {
  // Every completed write is durable. A sector a write in flight covers keeps, as its
  // base, the newest completed bytes (what the flush made durable), the others are forgotten.
  std::map<std::uint64_t, std::vector<unsigned char>> keep;
  for (const auto& [off, len] : f.inflight) {
    for (std::uint64_t s = off / tear_; len > 0 && s <= (off + len - 1) / tear_; ++s) keep[s] = f.base[s];
  }
  std::uint64_t end = f.synced_size;
  for (const File::Write& w : f.writes) {
    end = std::max<std::uint64_t>(end, w.off + w.data.size());
    for (auto& [s, bytes] : keep) {
      const std::uint64_t lo = std::max<std::uint64_t>(s * tear_, w.off);
      const std::uint64_t hi = std::min<std::uint64_t>((s + 1) * tear_, w.off + w.data.size());
      if (lo >= hi) continue;
      if (bytes.size() < hi - s * tear_) bytes.resize(hi - s * tear_, 0);
      std::copy(w.data.begin() + static_cast<std::ptrdiff_t>(lo - w.off),
                w.data.begin() + static_cast<std::ptrdiff_t>(hi - w.off),
                bytes.begin() + static_cast<std::ptrdiff_t>(lo - s * tear_));
    }
  }
  f.base = std::move(keep);
  f.writes.clear();
  f.synced_size = end;
}

std::size_t CrashRecorder::unflushed_writes() const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (const auto& [id, f] : files_) n += f->writes.size();
  return n;
}

CrashReport CrashRecorder::crash(std::uint64_t seed) {
  {
    std::lock_guard lk(mu_);
    frozen_ = true;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (inflight_ == 0) break;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("crash simulator: requests still in flight");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard lk(mu_);
  CrashReport rep;
  for (auto& [id, fp] : files_) {
    File& f = *fp;
    if (f.clean()) continue;
    ++rep.files;
    std::mt19937_64 rng(seed ^ ((f.order + 1) * 0x9E3779B97F4A7C15ull));
    for (const auto& [s, bytes] : f.base) {
      write_all(f.fd, bytes.data(), bytes.size(), s * tear_, f.name);
      ++rep.sectors_restored;
    }
    std::uint64_t end = f.synced_size;
    for (const File::Write& w : f.writes) {
      const auto choice = rng() % 3;  // 0 kept, 1 dropped, 2 torn
      if (choice == 1) {
        ++rep.writes_dropped;
        continue;
      }
      std::size_t kept = 0, pieces = 0;
      for (std::uint64_t lo = w.off; lo < w.off + w.data.size();) {
        const std::uint64_t hi = std::min<std::uint64_t>((lo / tear_ + 1) * tear_, w.off + w.data.size());
        ++pieces;
        if (choice == 0 || rng() % 2 == 0) {
          write_all(f.fd, w.data.data() + (lo - w.off), hi - lo, lo, f.name);
          end = std::max(end, hi);
          ++kept;
        }
        lo = hi;
      }
      if (kept == pieces) {
        ++rep.writes_kept;
      } else {
        ++rep.writes_torn;
      }
    }
    if (::ftruncate(f.fd, static_cast<off_t>(end)) != 0) throw sim_error("cannot truncate", f.name);
    if (::fsync(f.fd) != 0) throw sim_error("cannot sync", f.name);
  }
  return rep;
}

}  // namespace deepio::detail
