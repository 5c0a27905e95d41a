// One timed GPU-tensor transfer, printed as a JSON line; bench/gpu_vs_host.py interleaves the
// memories against each other. --memory:
//   disk    no deepio, no GPU: the disk ceiling of this run: --qd threads, each pread/pwrite of
//           --block bytes with O_DIRECT (buffered where the file system refuses it) into the
//           same registered host buffer
//   host    deepio between the file and a locked host buffer (the baseline)
//   device  deepio's staging pipeline: Handle on a cuMemAlloc'ed device pointer (disk reads
//           overlapped with host-to-device copies through pinned slots)
//   bounce  DeepNVMe's scheme: the whole tensor through one pinned host buffer, unpipelined
//           (read: disk -> host, then one cuMemcpyHtoD; write: one cuMemcpyDtoH, then disk)
//   gds     deepio::GdsHandle on a pinned device buffer (cuFile, or its staged fallback)
//   h2d     no file: one cuMemcpyHtoD (read) / cuMemcpyDtoH (write) of the whole size from/to
//           the pinned host buffer: the host-to-device ceiling
// Honesty rules (issue 11): the host buffer is page-locked AND registered with CUDA
// (cuMemHostRegister), so h2d and bounce are real page-locked DMA copies; every row that
// touches the file starts from a cold page cache (--cold: "drop" = sync + drop_caches, needs
// root; "fadvise" = fdatasync + POSIX_FADV_DONTNEED on the file; "auto" = drop when root,
// else fadvise), checked with mincore() just before the clock starts ("resident" in the JSON);
// every write row ends with fsync() inside the timed region, so the page cache cannot absorb it.
// Verification (--verify) copies the device buffer back outside the timed region.
// Runs against any driver DEEPIO_CUDA_LIBRARY names (the fake one in tests/gpu too).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "deepio/deepio.hpp"
#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"

namespace {

using namespace deepio::detail::gpu;
using deepio::bench::cpu_seconds;

struct Args {
  std::string memory = "device", op = "read", path, cold = "auto";
  std::size_t size = 1ull << 30, block = 1 << 20, qd = 32, par = 1;
  bool prepare = false, verify = false;
};

unsigned char byte_at(std::size_t i) { return static_cast<unsigned char>((i * 131 + 7) >> 3); }

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw deepio::Error(EIO, std::string(what) + ": " + cuda_error_text(cuda(nullptr), r));
}

/// deepio::Error appends the errno's text itself.
[[noreturn]] void sys_fail(const std::string& what) { throw deepio::Error(errno, what); }

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void fsync_path(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) sys_fail("open " + path);
  if (::fsync(f.fd) != 0) sys_fail("fsync " + path);
}

/// Empties the page cache of `path` the way `how` says ("auto" picks); returns what was done.
std::string make_cold(const std::string& path, const std::string& how) {
  if (how == "none") return "none";
  if (how == "drop" || how == "auto") {
    ::sync();
    Fd f(::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC));
    if (f.fd >= 0 && ::write(f.fd, "3\n", 2) == 2) return "drop_caches";
    if (how == "drop") sys_fail("--cold drop: writing 3 to /proc/sys/vm/drop_caches (root only)");
  }
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) sys_fail("open " + path);
  if (::fdatasync(f.fd) != 0) sys_fail("fdatasync " + path);
  const int r = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  if (r != 0) {
    errno = r;
    sys_fail("posix_fadvise(DONTNEED) " + path);
  }
  return "fadvise";
}

/// Fraction of the first `n` bytes of `path` in the page cache (mincore), -1 if unknown.
double resident_fraction(const std::string& path, std::size_t n) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0) return -1;
  n = std::min<std::size_t>(n, static_cast<std::size_t>(st.st_size));
  if (n == 0) return 0;
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, f.fd, 0);
  if (m == MAP_FAILED) return -1;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((n + page - 1) / page);
  double frac = -1;
  if (::mincore(m, n, vec.data()) == 0) {
    std::size_t in = 0;
    for (unsigned char v : vec) in += v & 1U;
    frac = static_cast<double>(in) / static_cast<double>(vec.size());
  }
  ::munmap(m, n);
  return frac;
}

/// The disk ceiling: `threads` threads, each moving every threads-th block of `block` bytes
/// between the file and `buf` with plain pread/pwrite. O_DIRECT unless the file system
/// refuses it (then *direct = false and the page cache is in play). Throws on an I/O error.
void disk_copy(const std::string& path, unsigned char* buf, std::size_t size, std::size_t block, std::size_t threads,
               bool read, bool* direct) {
  const int flags = (read ? O_RDONLY : O_WRONLY | O_CREAT) | O_CLOEXEC;
  int fd = block % 4096 == 0 ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  *direct = fd >= 0;
  if (fd < 0 && (errno == EINVAL || block % 4096 != 0)) fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) sys_fail("open " + path);
  Fd f(fd);
  const std::size_t blocks = (size + block - 1) / block;
  threads = std::max<std::size_t>(1, std::min(threads, blocks));
  std::atomic<int> error{0};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::size_t b = t; b < blocks && error.load() == 0; b += threads) {
        std::size_t off = b * block;
        std::size_t left = std::min(block, size - off);
        // O_DIRECT: a tail that is not a multiple of 4096 goes through a buffered descriptor.
        const bool tail_unaligned = *direct && (left % 4096) != 0;
        int use = f.fd;
        int own = -1;
        if (tail_unaligned) use = own = ::open(path.c_str(), flags, 0644);
        while (left > 0 && use >= 0) {
          const ssize_t n = read ? ::pread(use, buf + off, left, static_cast<off_t>(off))
                                 : ::pwrite(use, buf + off, left, static_cast<off_t>(off));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            error.store(n < 0 ? errno : EIO);
            break;
          }
          off += static_cast<std::size_t>(n);
          left -= static_cast<std::size_t>(n);
        }
        if (use < 0) error.store(errno);
        if (own >= 0) ::close(own);
      }
    });
  }
  for (auto& th : pool) th.join();
  if (error.load() != 0) {
    errno = error.load();
    sys_fail(std::string(read ? "pread " : "pwrite ") + path);
  }
}

int run(const Args& a) {
  deepio::detail::Status why;
  const CudaApi* cu = cuda(&why);
  if (cu == nullptr) {
    std::fprintf(stderr, "gpu_bench: no usable CUDA driver: %s\n", why.message.c_str());
    return 4;
  }
  // The engine stages through the primary context; make it current here too.
  CUcontext ctx = nullptr;
  check(cu->cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  deepio::UniqueLockedBuffer host(a.size);
  auto* hp = static_cast<unsigned char*>(host.data());
  // Registered with CUDA, not only mlock()ed: the driver copies from/to it by DMA (an
  // unregistered buffer is copied as pageable memory, through the driver's own staging).
  check(cu->cuMemHostRegister(hp, a.size, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
  struct Unregister {
    const CudaApi* cu;
    void* p;
    ~Unregister() { cu->cuMemHostUnregister(p); }
  } unregister{cu, hp};
  CUdeviceptr dev = 0;
  deepio::GdsHandle* gds = nullptr;
  std::unique_ptr<deepio::GdsHandle> gds_owner;
  if (a.memory == "gds") {
    gds_owner = std::make_unique<deepio::GdsHandle>(
        deepio::GdsOptions{.block_size = a.block, .queue_depth = a.qd, .intra_op_parallelism = a.par});
    gds = gds_owner.get();
    dev = reinterpret_cast<CUdeviceptr>(gds->new_pinned_device_buffer(a.size));
  } else {
    check(cu->cuMemAlloc(&dev, a.size), "cuMemAlloc");
  }
  void* dptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dev));
  // "device" measures the staging pipeline: never cuFile, whatever the machine has.
  deepio::Handle h({.block_size = a.block,
                    .queue_depth = a.qd,
                    .overlap_events = true,
                    .intra_op_parallelism = a.par,
                    .device_route = deepio::DeviceRouteMode::Staged});

  for (std::size_t i = 0; i < a.size; ++i) hp[i] = a.op == "write" || a.prepare ? byte_at(i) : 0;
  if (a.prepare) {
    h.sync_pwrite(hp, a.size, a.path);
    fsync_path(a.path);
    cu->cuMemFree(dev);
    return 0;
  }
  if (a.op == "write") check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD");  // the tensor to store
  else check(cu->cuMemcpyHtoD(dev, std::vector<unsigned char>(a.size).data(), a.size), "clear");

  const bool read = a.op == "read";
  const bool file = a.memory != "h2d";
  // Cold start: nothing of the file in the page cache (checked), nothing dirty anywhere.
  std::string cold = "n/a";
  double resident = -1;
  if (file) {
    cold = make_cold(a.path, a.cold);
    resident = resident_fraction(a.path, a.size);
  }
  bool direct = true;

  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  if (a.memory == "disk") {
    disk_copy(a.path, hp, a.size, a.block, a.qd, read, &direct);
  } else if (a.memory == "host") {
    read ? h.sync_pread(hp, a.size, a.path) : h.sync_pwrite(hp, a.size, a.path);
  } else if (a.memory == "device") {
    read ? h.sync_pread(dptr, a.size, a.path) : h.sync_pwrite(dptr, a.size, a.path);
  } else if (a.memory == "bounce") {
    if (read) {
      h.sync_pread(hp, a.size, a.path);
      check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD");
    } else {
      check(cu->cuMemcpyDtoH(hp, dev, a.size), "cuMemcpyDtoH");
      h.sync_pwrite(hp, a.size, a.path);
    }
  } else if (a.memory == "gds") {
    read ? gds->sync_pread(dptr, a.size, a.path) : gds->sync_pwrite(dptr, a.size, a.path);
  } else {  // h2d
    read ? check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD")
         : check(cu->cuMemcpyDtoH(hp, dev, a.size), "cuMemcpyDtoH");
  }
  if (file && !read) fsync_path(a.path);  // durable: the page cache does not count as the disk
  const auto t1 = std::chrono::steady_clock::now();
  const double cpu = cpu_seconds() - c0;

  // What actually moved the bytes: O_DIRECT or buffered, cuFile or staged.
  const deepio::HandleStats hs = gds != nullptr ? static_cast<const deepio::Handle&>(*gds).stats() : h.stats();
  const deepio::GdsStats gs = gds != nullptr ? gds->gds_stats() : deepio::GdsStats{};
  if (a.memory != "disk") direct = hs.direct_refused == 0;
  const bool in_host = a.memory == "host" || a.memory == "disk";
  bool ok = true;
  if (a.verify && file) {
    std::vector<unsigned char> back(a.size);
    if (read && !in_host) check(cu->cuMemcpyDtoH(back.data(), dev, a.size), "cuMemcpyDtoH");
    else if (read) std::memcpy(back.data(), hp, a.size);
    else h.sync_pread(back.data(), a.size, a.path);
    for (std::size_t i = 0; i < a.size && ok; ++i) ok = back[i] == byte_at(i);
  }
  std::printf(
      "{\"tool\": \"deepio\", \"memory\": \"%s\", \"op\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, "
      "\"cpu_seconds\": %.6f, \"gds_mode\": \"%s\", \"cold\": \"%s\", \"resident\": %.4f, "
      "\"host_registered\": true, \"fsync\": %s, \"direct\": %s, \"bytes_direct\": %llu, "
      "\"direct_refused\": %llu, \"bytes_cufile\": %llu, \"bytes_staged\": %llu, \"files_fallback\": %llu, "
      "\"verified\": %s}\n",
      a.memory.c_str(), a.op.c_str(), a.size, std::chrono::duration<double>(t1 - t0).count(), cpu,
      gds != nullptr ? gds->mode().c_str() : "", cold.c_str(), resident, file && !read ? "true" : "false",
      direct ? "true" : "false", static_cast<unsigned long long>(hs.bytes_direct),
      static_cast<unsigned long long>(hs.direct_refused), static_cast<unsigned long long>(gs.bytes_cufile),
      static_cast<unsigned long long>(gs.bytes_staged), static_cast<unsigned long long>(gs.files_fallback),
      a.verify && file ? (ok ? "true" : "false") : "null");
  if (gds != nullptr) gds->free_pinned_device_buffer(dptr);
  else cu->cuMemFree(dev);
  return ok ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  deepio::bench::Args in("gpu_bench", argc, argv);
  while (in.next()) {
    const std::string_view k = in.flag();
    if (k == "--memory") a.memory = in.value();
    else if (k == "--op") a.op = in.value();
    else if (k == "--path") a.path = in.value();
    else if (k == "--size") a.size = in.number();
    else if (k == "--block") a.block = in.number();
    else if (k == "--qd") a.qd = in.number();
    else if (k == "--par") a.par = in.number();
    else if (k == "--cold") a.cold = in.value();
    else if (k == "--prepare") a.prepare = true;
    else if (k == "--verify") a.verify = true;
    else in.unknown();
  }
  const std::string_view memories[] = {"disk", "host", "device", "bounce", "gds", "h2d"};
  if (std::find(std::begin(memories), std::end(memories), a.memory) == std::end(memories)) {
    in.fail("--memory disk|host|device|bounce|gds|h2d");
  }
  if (a.path.empty() && a.memory != "h2d") in.fail("--path is required");
  if (a.op != "read" && a.op != "write") in.fail("--op read|write");
  if (a.cold != "auto" && a.cold != "drop" && a.cold != "fadvise" && a.cold != "none") {
    in.fail("--cold auto|drop|fadvise|none");
  }
  if (a.size == 0 || a.block == 0 || a.qd == 0) in.fail("--size, --block and --qd must be positive");
  try {
    return run(a);
  } catch (const deepio::Error& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
