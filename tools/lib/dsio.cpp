#include "dsio.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "deepio/gpu.hpp"
#include "format.hpp"
#include "gpu.hpp"
#include "measure.hpp"
#include "system.hpp"

namespace deepio::cli {

namespace {
std::string percent(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "0%";
  return fixed(100.0 * static_cast<double>(part) / static_cast<double>(whole), 0) + "%";
}

}  // namespace

/// "O_DIRECT 100%" / "buffered (file system refuses O_DIRECT)" from stats deltas.
std::string io_path(std::uint64_t direct, std::uint64_t bounced, std::uint64_t buffered, std::uint64_t refused) {
  const std::uint64_t total = direct + bounced + buffered;
  std::string s;
  if (total == 0) return "no I/O";
  if (direct + bounced == total) {
    s = "O_DIRECT 100%";
  } else if (buffered == total) {
    s = "buffered 100%";
  } else {
    s = "O_DIRECT " + percent(direct + bounced, total) + ", buffered " + percent(buffered, total);
  }
  if (bounced != 0) s += " (" + percent(bounced, total) + " via bounce buffer)";
  if (refused != 0) s += ", O_DIRECT refused " + std::to_string(refused) + "x";
  return s;
}

void write_file_plain(const std::string& path, std::size_t nbytes, std::uint64_t seed) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(errno, "cannot create", path);
  std::vector<char> chunk(8 << 20);
  std::size_t done = 0;
  std::uint64_t k = 0;
  while (done < nbytes) {
    const std::size_t n = std::min(chunk.size(), nbytes - done);
    fill_pattern(chunk.data(), n, seed + k++);
    std::size_t w = 0;
    while (w < n) {
      const ssize_t r = ::pwrite(fd, chunk.data() + w, n - w, static_cast<off_t>(done + w));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int e = r < 0 ? errno : EIO;
        ::close(fd);
        throw Error(e, "cannot write", path, done + w, n - w);
      }
      w += static_cast<std::size_t>(r);
    }
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
}

/// Compares buf with the file's first nbytes read by plain pread; returns "" or the problem.
std::string compare_with_file(const void* buf, std::size_t nbytes, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + " to validate: " + std::strerror(errno);
  std::vector<char> chunk(8 << 20);
  std::size_t off = 0;
  std::string problem;
  while (off < nbytes && problem.empty()) {
    const std::size_t n = std::min(chunk.size(), nbytes - off);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, chunk.data() + got, n - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        problem = "validation read of " + path + " failed at offset " + std::to_string(off + got);
        break;
      }
      got += static_cast<std::size_t>(r);
    }
    if (!problem.empty()) break;
    if (std::memcmp(chunk.data(), static_cast<const char*>(buf) + off, n) != 0) {
      std::size_t i = 0;
      while (chunk[i] == static_cast<const char*>(buf)[off + i]) ++i;
      problem = "validation failed: " + path + " differs from the buffer at byte " + std::to_string(off + i);
    }
    off += n;
  }
  ::close(fd);
  return problem;
}

std::string ds_io_file(const DsIoPlan& p, int tid, std::size_t loop, const std::string& folder) {
  return folder + "/_aio_" + (p.read ? "read" : "write") + "_" + std::to_string(p.io_size) + ".pt." +
         std::to_string(tid) + "_" + std::to_string(p.different_files ? loop : 0);
}

namespace {

/// Set-up (not timed): read files created when missing or of the wrong size, write files
/// removed, as ds_io does.
void prepare_files(const DsIoPlan& p, int tid, const std::string& folder) {
  const std::size_t nfiles = p.different_files ? p.warmup + p.loops : 1;
  for (std::size_t i = 0; i < nfiles; ++i) {
    const std::string f = ds_io_file(p, tid, i, folder);
    if (p.read) {
      struct stat st {};
      if (::stat(f.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != p.io_size) {
        write_file_plain(f, static_cast<std::size_t>(p.io_size), static_cast<std::uint64_t>(tid) * 1000 + i);
      }
    } else {
      ::unlink(f.c_str());
    }
  }
}

/// One timed op: ds_io's read is pread + wait; its write is pwrite + wait, without fsync.
Sample timed_op(const DsIoPlan& p, Handle& h, void* buf, const std::string& f) {
  const std::size_t n = static_cast<std::size_t>(p.io_size);
  if (p.read) return deepio_read(h, buf, n, f);
  const double w0 = now_seconds();
  h.async_pwrite(buf, n, f, 0);
  h.wait();
  return Sample{now_seconds() - w0, 0.0, n};
}

void add_stats(ProcReport& r, const HandleStats& st) {
  r.bytes_direct = st.bytes_direct;
  r.bytes_bounced = st.bytes_bounced;
  r.bytes_buffered = st.bytes_buffered;
  r.direct_refused = st.direct_refused;
}

/// The memory of one process: page-locked host memory (the buffer itself, or with --gpu the
/// host side of filling and validating), and with --gpu the device, its context current on
/// this thread, and the device buffer the handle moves.
struct ProcMemory {
  ProcMemory(const DsIoPlan& p, int tid) : host(static_cast<std::size_t>(p.io_size)) {
    if (!p.gpu) return;
    device.emplace(p.devices.empty() ? 0 : p.devices[static_cast<std::size_t>(tid) % p.devices.size()]);
    dev.emplace(static_cast<std::size_t>(p.io_size));
  }
  [[nodiscard]] void* io_buffer() const { return dev ? dev->data() : host.data(); }
  /// The bytes of the I/O buffer in host memory (copied back from the device with --gpu).
  const void* host_view(std::size_t n) {
    if (dev) dev->download(host.data(), n);
    return host.data();
  }
  UniqueLockedBuffer host;
  std::optional<CudaDevice> device;
  std::optional<DeviceBuffer> dev;
};

/// The handle of one process: a Handle, or with --use_gds a GdsHandle (Handle's destructor is
/// not virtual, so each is held as itself).
struct ProcHandle {
  explicit ProcHandle(const DsIoPlan& p) {
    if (p.use_gds) {
      gds.emplace(gds_options(p.handle, GdsMode::Auto));
    } else {
      // DeepNVMe's aio_handle path: device memory staged through host memory, never cuFile.
      HandleOptions staged = p.handle;
      staged.device_route = DeviceRouteMode::Staged;
      plain.emplace(staged);
    }
  }
  [[nodiscard]] Handle& get() { return gds ? static_cast<Handle&>(*gds) : *plain; }
  std::optional<Handle> plain;
  std::optional<GdsHandle> gds;
};

/// Host-side counters, and with --gpu what the device memory went through.
void report_handle(ProcReport& r, const DsIoPlan& p, ProcHandle& h) {
  add_stats(r, h.get().stats());
  if (!p.gpu) return;
  std::string mode = "staged";
  if (h.gds) {
    const GdsStats gs = h.gds->gds_stats();
    r.bytes_cufile = gs.bytes_cufile;
    r.bytes_staged = gs.bytes_staged;
    r.files_fallback = gs.files_fallback;
    mode = h.gds->mode();
    if (const std::string why = h.gds->mode_reason(); !why.empty()) mode += ": " + why;
  } else {
    r.bytes_staged = r.bytes;
  }
  std::snprintf(r.gpu_mode, sizeof r.gpu_mode, "%s", mode.c_str());
}

}  // namespace

ProcReport ds_io_process(const DsIoPlan& p, Group& g) {
  ProcReport r;
  const int tid = g.rank();
  const std::string& folder = p.folders[static_cast<std::size_t>(tid) % p.folders.size()];
  const std::size_t n = static_cast<std::size_t>(p.io_size);
  if (!g.barrier()) return r;
  prepare_files(p, tid, folder);
  ProcMemory mem(p, tid);
  if (!p.read) {
    fill_pattern(mem.host.data(), n, static_cast<std::uint64_t>(tid) + 7);
    if (mem.dev) mem.dev->upload(mem.host.data(), n);
  } else {
    touch_pages(mem.host.data(), n);
    if (mem.dev) {
      std::memset(mem.host.data(), 0, n);
      mem.dev->upload(mem.host.data(), n);  // so a read that moves nothing cannot pass --validate
    }
  }
  ProcHandle ph(p);
  Handle& h = ph.get();
  r.backend = static_cast<int>(h.backend());
  if (!g.barrier()) return r;
  const double cpu0 = process_cpu_seconds();
  for (std::size_t i = 0; i < p.warmup + p.loops; ++i) {
    const std::string f = ds_io_file(p, tid, i, folder);
    const double t0 = now_seconds();
    const Sample s = timed_op(p, h, mem.io_buffer(), f);
    if (!g.barrier()) return r;
    const double t1 = now_seconds();
    if (i >= p.warmup || p.include_warmup) {
      r.task_sec += s.seconds;
      r.e2e_sec += t1 - t0;
      r.bytes += n;
    }
    if (p.validate) {
      std::string problem = compare_with_file(mem.host_view(n), n, f);
      if (!problem.empty()) throw std::runtime_error(problem);
    }
  }
  r.cpu_sec = process_cpu_seconds() - cpu0;
  report_handle(r, p, ph);
  g.barrier();
  return r;
}

DsIoTotals aggregate(const std::vector<ProcReport>& reports) {
  DsIoTotals t;
  t.processes = static_cast<int>(reports.size());
  t.ok = true;
  for (const auto& r : reports) {
    if (r.failed) {
      if (t.ok) t.error = r.error;
      t.ok = false;
    }
    t.task_latency = std::max(t.task_latency, r.task_sec);
    t.e2e_latency = std::max(t.e2e_latency, r.e2e_sec);
    t.bytes += r.bytes;
    t.cpu_sec += r.cpu_sec;
    t.bytes_direct += r.bytes_direct;
    t.bytes_bounced += r.bytes_bounced;
    t.bytes_buffered += r.bytes_buffered;
    t.direct_refused += r.direct_refused;
    t.bytes_cufile += r.bytes_cufile;
    t.bytes_staged += r.bytes_staged;
    t.files_fallback += r.files_fallback;
  }
  if (!reports.empty()) {
    t.backend = static_cast<BackendKind>(reports.front().backend);
    t.gpu_mode = reports.front().gpu_mode;
  }
  return t;
}

DsIoTotals ds_io_run(const DsIoPlan& plan) {
  return aggregate(
      run_local(static_cast<int>(plan.folders.size()), [&plan](Group& g) { return ds_io_process(plan, g); }));
}

}  // namespace deepio::cli
