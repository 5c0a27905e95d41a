#include "ceiling.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "format.hpp"
#include "system.hpp"

namespace deepio::cli {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::uint64_t read_number(const std::string& path) {
  const std::string s = read_text(path);
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') break;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

bool write_number(const std::string& path, std::uint64_t v) {
  std::ofstream f(path);
  if (!f) return false;
  f << v;
  f.flush();
  return static_cast<bool>(f);
}

const char kNrHugepages[] = "/proc/sys/vm/nr_hugepages";

}  // namespace

const char* to_string(CeilingStanding s) noexcept {
  switch (s) {
    case CeilingStanding::Below: return "below";
    case CeilingStanding::AtCeiling: return "at_ceiling";
    case CeilingStanding::Above: return "above";
    default: return "none";
  }
}

CeilingVerdict judge_against_ceiling(double figure, std::span<const double> samples) {
  std::vector<double> v;
  for (double s : samples) {
    if (s > 0) v.push_back(s);
  }
  CeilingVerdict r;
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  const double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  r.lo = v.front();
  r.hi = v.back();
  r.limit = r.hi + std::max(r.hi - r.lo, kCeilingNoise * r.hi);
  if (figure > r.limit) {
    r.standing = CeilingStanding::Above;
    r.reason = "above every ceiling sample (" + fixed(r.lo, 2) + "-" + fixed(r.hi, 2) +
               " GiB/s) by more than their noise margin (" + fixed(r.limit, 2) + " GiB/s)";
    return r;
  }
  r.standing = figure >= r.lo ? CeilingStanding::AtCeiling : CeilingStanding::Below;
  r.percent = 100.0 * figure / median;
  return r;
}

QueueLimits queue_limits_of(const std::string& path) {
  QueueLimits q;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return q;
  const std::string dev = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  char target[512] = {};
  const ssize_t n = ::readlink(dev.c_str(), target, sizeof target - 1);
  if (n <= 0) return q;
  std::string t(target, static_cast<std::size_t>(n));
  q.device = t.substr(t.rfind('/') + 1);
  // A partition has no queue of its own: its disk's is one folder up.
  std::string queue = dev + "/queue";
  struct stat qs {};
  if (::stat(queue.c_str(), &qs) != 0) queue = dev + "/../queue";
  q.max_segments = read_number(queue + "/max_segments");
  q.max_sectors_kb = read_number(queue + "/max_sectors_kb");
  return q;
}

HugePagePool parse_hugepage_pool(std::string_view meminfo) {
  HugePagePool p;
  std::size_t pos = 0;
  while (pos < meminfo.size()) {
    const std::size_t end = std::min(meminfo.find('\n', pos), meminfo.size());
    const std::string_view line = meminfo.substr(pos, end - pos);
    pos = end + 1;
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon);
    std::uint64_t v = 0;
    for (char c : line.substr(colon + 1)) {
      if (c >= '0' && c <= '9') v = v * 10 + static_cast<std::uint64_t>(c - '0');
      else if (v != 0) break;
    }
    if (key == "HugePages_Total") p.total = v;
    else if (key == "HugePages_Free") p.free = v;
    else if (key == "HugePages_Rsvd") p.reserved = v;
    else if (key == "Hugepagesize") p.page_bytes = v * 1024;  // "2048 kB"
  }
  return p;
}

HugePagePool read_hugepage_pool() { return parse_hugepage_pool(read_text("/proc/meminfo")); }

std::uint64_t fio_huge_pages_needed(std::size_t block_size, std::size_t iodepth, std::size_t numjobs,
                                    std::uint64_t page_bytes) {
  if (page_bytes == 0) return 0;
  // fio maps iodepth x max block size plus its page alignment, rounded up to the huge page size.
  const std::uint64_t per_job = static_cast<std::uint64_t>(block_size) * iodepth + 4096;
  return static_cast<std::uint64_t>(numjobs) * ((per_job + page_bytes - 1) / page_bytes + 1);
}

HugePageLoan HugePageLoan::obtain(std::uint64_t pages, bool may_reserve) {
  HugePageLoan l;
  const HugePagePool pool = read_hugepage_pool();
  l.page_bytes_ = pool.page_bytes;
  if (pool.page_bytes == 0) {
    l.what_ = "this kernel has no hugetlb pages";
    return l;
  }
  const std::string size = human_bytes(pool.page_bytes);
  if (pool.available() >= pages) {
    l.ok_ = true;
    l.what_ = std::to_string(pages) + " of the " + std::to_string(pool.available()) + " free hugetlb pages of " + size;
    return l;
  }
  const std::string short_of = "needs " + std::to_string(pages) + " hugetlb pages of " + size + ", " +
                               std::to_string(pool.available()) + " free";
  if (!may_reserve) {
    l.what_ = short_of + " (--no_hugepage_reserve)";
    return l;
  }
  if (::access(kNrHugepages, W_OK) != 0) {
    l.what_ = short_of + ", and vm.nr_hugepages is not writable here (root reserves them)";
    return l;
  }
  std::uint64_t before = 0, after = 0, want = 0;
  bool short_after_all = false;
  {
    // Under deepio's pool lock: the pool re-read and changed as one step (system.hpp).
    const HugePagePoolLock lock;
    const HugePagePool now = read_hugepage_pool();
    if (now.available() >= pages) {  // another run gave pages back since the first look
      l.ok_ = true;
      l.what_ = std::to_string(pages) + " of the " + std::to_string(now.available()) + " free hugetlb pages of " + size;
      return l;
    }
    before = read_number(kNrHugepages);
    want = pages - now.available();
    register_hugepages_added(0);  // install the clean-up before the pool changes
    if (!write_number(kNrHugepages, before + want)) {
      l.what_ = short_of + ", and writing vm.nr_hugepages failed";
      return l;
    }
    after = read_number(kNrHugepages);
    l.added_ = after > before ? after - before : 0;
    register_hugepages_added(l.added_);
    short_after_all = l.added_ < want || read_hugepage_pool().available() < pages;
  }
  if (short_after_all) {
    l.what_ = short_of + ", and the kernel found only " + std::to_string(l.added_) + " of " + std::to_string(want) +
              " more (memory too fragmented)";
    l.give_back();  // after the lock is released: give_back takes it again
    return l;
  }
  l.ok_ = true;
  l.what_ = std::to_string(want) + " hugetlb pages of " + size + " reserved for this run (vm.nr_hugepages " +
            std::to_string(before) + " -> " + std::to_string(after) + ") and given back at the end";
  return l;
}

void HugePageLoan::give_back() noexcept {
  if (added_ == 0) return;
  added_ = 0;
  give_back_hugepages_now();
}

HugePageLoan::~HugePageLoan() { give_back(); }

HugePageLoan::HugePageLoan(HugePageLoan&& o) noexcept
    : ok_(o.ok_), page_bytes_(o.page_bytes_), added_(o.added_), what_(std::move(o.what_)) {
  o.added_ = 0;
  o.ok_ = false;
}

HugePageLoan& HugePageLoan::operator=(HugePageLoan&& o) noexcept {
  if (this != &o) {
    give_back();
    ok_ = o.ok_;
    page_bytes_ = o.page_bytes_;
    added_ = o.added_;
    what_ = std::move(o.what_);
    o.added_ = 0;
    o.ok_ = false;
  }
  return *this;
}

std::uint64_t thp_bytes(const void* p, std::size_t n) {
  std::ifstream f("/proc/self/smaps");
  if (!f || n == 0) return 0;
  const auto lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + n;
  std::uintptr_t start = 0, end = 0;
  double total = 0;
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      start = static_cast<std::uintptr_t>(a);
      end = static_cast<std::uintptr_t>(b);
      continue;
    }
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) != 1 || kb == 0) continue;
    const std::uintptr_t olo = std::max(lo, start), ohi = std::min(hi, end);
    if (ohi <= olo || end <= start) continue;
    total += static_cast<double>(kb) * 1024.0 * static_cast<double>(ohi - olo) / static_cast<double>(end - start);
  }
  return std::min<std::uint64_t>(static_cast<std::uint64_t>(total), n);
}

}  // namespace deepio::cli
