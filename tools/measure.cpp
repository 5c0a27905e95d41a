#include "measure.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cli_util.hpp"

namespace deepio::cli {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_or_throw(const std::string& path, int flags, mode_t mode = 0644) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw Error(errno, "cannot open", path);
  return fd;
}

void fsync_path(const std::string& path) {
  Fd f{open_or_throw(path, O_RDONLY)};
  if (::fsync(f.fd) != 0) throw Error(errno, "fsync failed", path);
}

struct Clock {
  double t0 = now_seconds();
  double c0 = process_cpu_seconds();
  Sample stop(std::size_t nbytes) const {
    return {now_seconds() - t0, process_cpu_seconds() - c0, nbytes};
  }
};

// Full-length read/write loops: a short transfer is not a success.
void read_full(int fd, char* p, std::size_t n, std::uint64_t off, const std::string& path, bool positional) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = positional ? ::pread(fd, p + done, n - done, static_cast<off_t>(off + done))
                                 : ::read(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(errno, "read failed", path, off + done, n - done);
    }
    if (r == 0) throw Error(ENODATA, "unexpected end of file", path, off + done, n - done);
    done += static_cast<std::size_t>(r);
  }
}

void write_full(int fd, const char* p, std::size_t n, std::uint64_t off, const std::string& path, bool positional) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = positional ? ::pwrite(fd, p + done, n - done, static_cast<off_t>(off + done))
                                 : ::write(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(errno, "write failed", path, off + done, n - done);
    }
    if (r == 0) throw Error(EIO, "write made no progress", path, off + done, n - done);
    done += static_cast<std::size_t>(r);
  }
}

}  // namespace

Sample deepio_write(Handle& h, const void* buf, std::size_t nbytes, const std::string& path) {
  Clock c;
  h.async_pwrite(buf, nbytes, path, 0);
  h.wait();
  fsync_path(path);
  return c.stop(nbytes);
}

Sample deepio_read(Handle& h, void* buf, std::size_t nbytes, const std::string& path) {
  Clock c;
  h.async_pread(buf, nbytes, path, 0);
  h.wait();
  return c.stop(nbytes);
}

Sample naive_read(void* dst, std::size_t nbytes, const std::string& path) {
  Clock c;
  Fd f{open_or_throw(path, O_RDONLY)};
  std::unique_ptr<char, decltype(&std::free)> bytes(static_cast<char*>(std::malloc(nbytes ? nbytes : 1)), &std::free);
  if (!bytes) throw Error(ENOMEM, "cannot allocate the read buffer", path, 0, nbytes);
  read_full(f.fd, bytes.get(), nbytes, 0, path, false);
  std::memcpy(dst, bytes.get(), nbytes);
  bytes.reset();
  return c.stop(nbytes);
}

Sample naive_write(const void* src, std::size_t nbytes, const std::string& path) {
  Clock c;
  std::unique_ptr<char, decltype(&std::free)> bytes(static_cast<char*>(std::malloc(nbytes ? nbytes : 1)), &std::free);
  if (!bytes) throw Error(ENOMEM, "cannot allocate the write buffer", path, 0, nbytes);
  std::memcpy(bytes.get(), src, nbytes);
  Fd f{open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC)};
  write_full(f.fd, bytes.get(), nbytes, 0, path, false);
  if (::fsync(f.fd) != 0) throw Error(errno, "fsync failed", path);
  return c.stop(nbytes);
}

Sample raw_direct(bool write, void* buf, std::size_t nbytes, std::size_t block_size,
                  std::size_t threads, const std::string& path) {
  Clock c;
  Fd f{open_or_throw(path, write ? (O_WRONLY | O_CREAT | O_DIRECT) : (O_RDONLY | O_DIRECT))};
  const std::size_t blocks = (nbytes + block_size - 1) / block_size;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::unique_ptr<Error>> errors(threads);
  {
    std::vector<std::jthread> pool;
    for (std::size_t t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (std::size_t b = next++; b < blocks && !failed; b = next++) {
            const std::size_t off = b * block_size;
            const std::size_t len = std::min(block_size, nbytes - off);
            char* p = static_cast<char*>(buf) + off;
            if (write) write_full(f.fd, p, len, off, path, true);
            else read_full(f.fd, p, len, off, path, true);
          }
        } catch (const Error& e) {
          errors[t] = std::make_unique<Error>(e);
          failed = true;
        }
      });
    }
  }
  for (auto& e : errors) {
    if (e) throw *e;
  }
  if (write && ::fsync(f.fd) != 0) throw Error(errno, "fsync failed", path);
  return c.stop(nbytes);
}

std::string fio_engine_for(BackendKind kind) {
  switch (kind) {
    case BackendKind::IoUring: return "io_uring";
    case BackendKind::Libaio: return "libaio";
    default: return "psync";
  }
}

std::string fio_version(const std::string& fio_path) {
  std::string out;
  if (run_capture({fio_path, "--version"}, out) != 0) return {};
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

FioResult run_fio(const std::string& fio_path, const FioJob& job) {
  FioResult r;
  const std::uint64_t per_job = job.nbytes / job.numjobs;
  std::vector<std::string> argv = {
      fio_path,
      "--name=deepio-ceiling",
      "--filename=" + job.path,
      std::string("--rw=") + (job.write ? "write" : "read"),
      "--bs=" + std::to_string(job.block_size),
      "--iodepth=" + std::to_string(job.iodepth),
      "--ioengine=" + job.ioengine,
      std::string("--direct=") + (job.direct ? "1" : "0"),
      "--size=" + std::to_string(per_job),
      "--numjobs=" + std::to_string(job.numjobs),
      "--group_reporting",
      "--thread",
      "--fallocate=none",  // deepio writes into a fresh, unallocated file: so does fio
      "--invalidate=1",
      "--output-format=json"};
  if (job.numjobs > 1) argv.push_back("--offset_increment=" + std::to_string(per_job));
  if (job.write) argv.push_back("--end_fsync=1");
  for (const auto& a : argv) r.command += (r.command.empty() ? "" : " ") + a;
  std::string out, err;
  const int rc = run_capture(argv, out, &err);
  if (rc != 0) {
    auto line = err.substr(0, err.find('\n'));
    r.error = "fio exited with status " + std::to_string(rc) + (line.empty() ? "" : ": " + line);
    return r;
  }
  const auto brace = out.find('{');
  std::string perr;
  auto doc = brace == std::string::npos ? std::nullopt : parse_json(std::string_view(out).substr(brace), &perr);
  const JsonValue* j = doc ? doc->get("jobs") : nullptr;
  const JsonValue* j0 = j ? j->at(0) : nullptr;
  const JsonValue* side = j0 ? j0->get(job.write ? "write" : "read") : nullptr;
  if (side == nullptr) {
    r.error = "cannot parse fio's JSON output" + (perr.empty() ? "" : ": " + perr);
    return r;
  }
  const double io_bytes = side->num("io_bytes");
  const double runtime_ms = side->num("runtime");
  if (io_bytes <= 0 || runtime_ms <= 0) {
    r.error = "fio reported no I/O";
    return r;
  }
  // usr_cpu/sys_cpu are percentages of job_runtime for the (group-reported) job.
  const double cpu_pct = j0->num("usr_cpu") + j0->num("sys_cpu");
  const double job_runtime_ms = j0->num("job_runtime", runtime_ms);
  r.sample.nbytes = static_cast<std::uint64_t>(io_bytes);
  r.sample.seconds = runtime_ms / 1000.0;
  r.sample.cpu_seconds = cpu_pct / 100.0 * job_runtime_ms / 1000.0;
  r.ok = true;
  return r;
}

void fill_pattern(void* buf, std::size_t nbytes, std::uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  std::size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < nbytes; ++i) p[i] = static_cast<unsigned char>(x >> (8 * (i % 8)));
}

void touch_pages(void* buf, std::size_t nbytes) {
  const long page = ::sysconf(_SC_PAGESIZE);
  auto* p = static_cast<volatile char*>(buf);
  for (std::size_t i = 0; i < nbytes; i += static_cast<std::size_t>(page > 0 ? page : 4096)) p[i] = p[i];
}

}  // namespace deepio::cli
