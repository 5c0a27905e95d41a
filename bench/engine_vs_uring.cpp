// deepio's engine against a plain liburing loop with the same buffer, request size, queue
// depth and file: the DeepNVMe-shaped sequential comparison of issue 15, without DeepSpeed.
//
//   engine_vs_uring --dir DIR [--size BYTES] [--block BYTES] [--qd N] [--pairs N] [--json]
//                   [--only deepio|liburing]
//
// One page-locked buffer from deepio's allocator (deepio::UniqueLockedBuffer: mlock'ed, advised onto
// transparent huge pages; the share really on huge pages is printed) serves both sides. The
// file DIR/engine_vs_uring.bin (--size bytes, written once untimed) is overwritten in place and
// read back with O_DIRECT: deepio through Handle(io_uring, block_size, queue_depth, one
// worker), the plain loop by one thread keeping --qd requests of --block bytes in flight on one
// ring (submit and wait for one completion, reap all that are ready, refill). Writes are timed
// through fsync, reads start from a dropped page cache. Pairs are interleaved with the order
// alternating (deepio first in even pairs); medians of GiB/s, CPU s/GiB (getrusage of the whole
// process) and of the paired ratios deepio/plain. Beside each, the requests the device saw:
// the deltas of /sys/block/<disk>/stat (I/Os completed and sectors) over the sample, as KiB per
// device I/O (other processes' I/O on the same disk shows up there too: compare the two sides
// of one run, not absolute figures). --only runs one side alone (for `perf stat` / `perf record`
// of that side: no pairs, no ratio).
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "deepio/deepio.hpp"

namespace {

using deepio::bench::cpu_seconds;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "engine_vs_uring: %s\n", what.c_str());
  std::exit(1);
}

/// The disk behind `path` (a partition's disk), as /sys/block/<name>; empty when none.
std::string disk_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  const std::string dev = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  struct stat q {};
  char real[4096];
  const std::string sys = ::stat((dev + "/queue").c_str(), &q) == 0 ? dev : dev + "/..";
  return ::realpath(sys.c_str(), real) != nullptr ? std::string(real) : sys;
}

/// Read and write I/Os and sectors completed by the disk so far.
struct DiskStat {
  unsigned long long rios = 0, rsect = 0, wios = 0, wsect = 0;
};
DiskStat disk_stat(const std::string& disk) {
  DiskStat d;
  std::ifstream f(disk + "/stat");
  unsigned long long v[8] = {};
  for (auto& x : v) f >> x;
  d.rios = v[0];
  d.rsect = v[2];
  d.wios = v[4];
  d.wsect = v[6];
  return d;
}

/// Bytes of [p, p + n) on transparent huge pages (/proc/self/smaps AnonHugePages, in proportion).
double thp_fraction(const void* p, std::size_t n) {
  std::ifstream f("/proc/self/smaps");
  const auto lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + n;
  std::uintptr_t s = 0, e = 0;
  double huge = 0;
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long a = 0, b = 0, kb = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      s = a;
      e = b;
    } else if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1 && kb > 0 && e > s) {
      const std::uintptr_t ol = std::max(lo, s), oh = std::min(hi, e);
      if (oh > ol) huge += static_cast<double>(kb) * 1024.0 * static_cast<double>(oh - ol) / static_cast<double>(e - s);
    }
  }
  return std::min(1.0, huge / static_cast<double>(n));
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) die("fsync " + path + ": " + std::strerror(errno));
  ::close(fd);
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) die("open " + path + ": " + std::strerror(errno));
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Sample {
  double seconds = 0, cpu = 0;
  unsigned long long ios = 0, sectors = 0;  // the device's, over the sample
};

/// The plain loop: one ring of qd entries, qd requests of `block` in flight, O_DIRECT.
void plain_uring(bool write, char* buf, std::size_t size, std::size_t block, std::size_t qd, const std::string& path) {
  const int fd = ::open(path.c_str(), (write ? O_WRONLY : O_RDONLY) | O_DIRECT | O_CLOEXEC);
  if (fd < 0) die("open " + path + ": " + std::strerror(errno));
  io_uring ring{};
  if (const int r = io_uring_queue_init(static_cast<unsigned>(qd), &ring, 0); r < 0) {
    die(std::string("io_uring_queue_init: ") + std::strerror(-r));
  }
  const std::size_t n = size / block;
  std::size_t next = 0, done = 0, inflight = 0;
  while (done < n) {
    while (inflight < qd && next < n) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      char* p = buf + next * block;
      if (write) io_uring_prep_write(sqe, fd, p, static_cast<unsigned>(block), next * block);
      else io_uring_prep_read(sqe, fd, p, static_cast<unsigned>(block), next * block);
      ++next;
      ++inflight;
    }
    if (const int r = io_uring_submit_and_wait(&ring, 1); r < 0 && r != -EINTR) {
      die(std::string("io_uring_submit_and_wait: ") + std::strerror(-r));
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      // Whole-block requests of a file this long: a short transfer here is a failure.
      if (cqe->res != static_cast<int>(block)) die("a request returned " + std::to_string(cqe->res));
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
    inflight -= seen;
    done += seen;
  }
  io_uring_queue_exit(&ring);
  ::close(fd);
}

struct Config {
  std::string dir;
  std::size_t size = std::size_t{1} << 30, block = 1 << 20, qd = 32, pairs = 5;
  bool json = false;
  int only = -1;  // -1 both sides; 0 deepio; 1 the plain loop
};

/// One timed transfer: side 0 = deepio, 1 = the plain loop.
Sample run_one(int side, bool write, deepio::Handle& h, char* buf, const Config& c, const std::string& path,
               const std::string& disk) {
  if (!write) drop_cache(path);
  const DiskStat d0 = disk_stat(disk);
  const double c0 = cpu_seconds(), t0 = now();
  if (side == 0) {
    if (write) h.async_pwrite(buf, c.size, path, 0);
    else h.async_pread(buf, c.size, path, 0);
    h.wait();
  } else {
    plain_uring(write, buf, c.size, c.block, c.qd, path);
  }
  if (write) fsync_path(path);
  Sample s{now() - t0, cpu_seconds() - c0, 0, 0};
  const DiskStat d1 = disk_stat(disk);
  s.ios = write ? d1.wios - d0.wios : d1.rios - d0.rios;
  s.sectors = write ? d1.wsect - d0.wsect : d1.rsect - d0.rsect;
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

Config parse(int argc, char** argv) {
  Config c;
  deepio::bench::Args in("engine_vs_uring", argc, argv);
  while (in.next()) {
    const std::string_view k = in.flag();
    if (k == "--dir") c.dir = in.value();
    else if (k == "--size") c.size = in.number();
    else if (k == "--block") c.block = in.number();
    else if (k == "--qd") c.qd = in.number();
    else if (k == "--pairs") c.pairs = in.number();
    else if (k == "--json") c.json = true;
    else if (k == "--only") {
      const std::string v = in.value();
      if (v != "deepio" && v != "liburing") in.fail("--only: 'deepio' or 'liburing', not '" + v + "'");
      c.only = v == "deepio" ? 0 : 1;
    } else in.unknown();
  }
  if (c.dir.empty() || c.block == 0 || c.block % 4096 != 0 || c.size % c.block != 0 || c.qd == 0 || c.qd > 4096 ||
      c.pairs == 0) {
    in.fail("--dir is required; --block a multiple of 4096 dividing --size; --qd 1..4096; --pairs >= 1");
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  const std::string path = c.dir + "/engine_vs_uring.bin";
  deepio::UniqueLockedBuffer buf(c.size);
  auto* p = static_cast<char*>(buf.data());
  for (std::size_t i = 0; i < c.size; i += 4096) p[i] = static_cast<char>(i / 4096);
  deepio::Handle h({.block_size = c.block,
                    .queue_depth = c.qd,
                    .overlap_events = true,
                    .intra_op_parallelism = 1,
                    .backend = deepio::BackendKind::IoUring,
                    .direct_io = deepio::DirectIo::On});
  h.sync_pwrite(p, c.size, path, 0);  // the file both sides overwrite and read, untimed
  fsync_path(path);
  const std::string disk = disk_of(path);
  std::printf(
      "engine_vs_uring: %zu MiB, block %zu KiB, queue depth %zu, %zu pairs, O_DIRECT, io_uring; buffer %s, %.0f%% on "
      "transparent huge pages; file %s (overwritten in place); disk %s\n",
      c.size >> 20, c.block >> 10, c.qd, c.pairs, buf.locked() ? "page-locked" : "not page-locked",
      100.0 * thp_fraction(p, c.size), path.c_str(), disk.c_str());
  const char* names[2] = {"deepio", "liburing"};
  for (int op = 0; op < 2; ++op) {
    const bool write = op == 0;
    std::vector<double> gib[2], cpu[2], kib[2], ratio;
    for (std::size_t i = 0; i < c.pairs; ++i) {
      Sample s[2];
      for (int k = 0; k < 2; ++k) {
        const int side = (static_cast<int>(i) + k) % 2;  // alternate which goes first
        if (c.only < 0 || c.only == side) s[side] = run_one(side, write, h, p, c, path, disk);
      }
      for (int side = 0; side < 2; ++side) {
        if (c.only >= 0 && c.only != side) continue;
        const double g = static_cast<double>(c.size) / s[side].seconds / static_cast<double>(1ULL << 30);
        gib[side].push_back(g);
        cpu[side].push_back(s[side].cpu / (static_cast<double>(c.size) / static_cast<double>(1ULL << 30)));
        kib[side].push_back(s[side].ios ? static_cast<double>(s[side].sectors) / 2.0 / static_cast<double>(s[side].ios)
                                        : 0.0);
        if (c.json) {
          std::printf(
              "{\"op\": \"%s\", \"side\": \"%s\", \"pair\": %zu, \"gib_per_s\": %.4f, \"cpu_s_per_gib\": %.5f, "
              "\"device_ios\": %llu, \"device_kib_per_io\": %.1f}\n",
              write ? "write" : "read", names[side], i, g, cpu[side].back(), s[side].ios, kib[side].back());
        }
      }
      if (c.only < 0) ratio.push_back(gib[0].back() / gib[1].back());
    }
    for (int side = 0; side < 2; ++side) {
      if (c.only >= 0 && c.only != side) continue;
      std::printf("%-5s %-8s median %6.3f GiB/s (range %.3f-%.3f), %.4f CPU s/GiB, device %.0f KiB/IO\n",
                  write ? "write" : "read", names[side], median(gib[side]),
                  *std::min_element(gib[side].begin(), gib[side].end()),
                  *std::max_element(gib[side].begin(), gib[side].end()), median(cpu[side]), median(kib[side]));
    }
    if (c.only >= 0) continue;
    std::printf("%-5s deepio/liburing: median of %zu paired ratios %.3f (range %.3f-%.3f)\n", write ? "write" : "read",
                c.pairs, median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                *std::max_element(ratio.begin(), ratio.end()));
    std::fflush(stdout);
  }
  ::unlink(path.c_str());
  return 0;
}
