#include "measure.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "system.hpp"

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
  Sample stop(std::size_t nbytes) const { return {now_seconds() - t0, process_cpu_seconds() - c0, nbytes}; }
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

Sample deepio_write_files(Handle& h, const void* buf, std::size_t nbytes, const std::vector<std::string>& paths) {
  Clock c;
  for (const auto& path : paths) h.async_pwrite(buf, nbytes, path);
  h.wait();
  for (const auto& path : paths) fsync_path(path);
  return c.stop(nbytes * paths.size());
}

Sample deepio_read_files(Handle& h, const std::vector<void*>& bufs, std::size_t nbytes,
                         const std::vector<std::string>& paths) {
  Clock c;
  for (std::size_t i = 0; i < paths.size(); ++i) h.async_pread(bufs[i], nbytes, paths[i]);
  h.wait();
  return c.stop(nbytes * paths.size());
}

Sample run_together(const std::vector<std::function<Sample()>>& jobs, std::vector<Sample>* each) {
  std::vector<Sample> samples(jobs.size());
  std::vector<std::exception_ptr> errors(jobs.size());
  Clock c;
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      threads.emplace_back([&, i] {
        try {
          samples[i] = jobs[i]();
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
  }
  Sample total = c.stop(0);
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (const auto& s : samples) total.nbytes += s.nbytes;
  if (each != nullptr) *each = std::move(samples);
  return total;
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

Sample naive_write(const void* src, std::size_t nbytes, const std::string& path, bool in_place) {
  Clock c;
  std::unique_ptr<char, decltype(&std::free)> bytes(static_cast<char*>(std::malloc(nbytes ? nbytes : 1)), &std::free);
  if (!bytes) throw Error(ENOMEM, "cannot allocate the write buffer", path, 0, nbytes);
  std::memcpy(bytes.get(), src, nbytes);
  Fd f{open_or_throw(path, O_WRONLY | O_CREAT | (in_place ? 0 : O_TRUNC))};
  write_full(f.fd, bytes.get(), nbytes, 0, path, false);
  if (::fsync(f.fd) != 0) throw Error(errno, "fsync failed", path);
  return c.stop(nbytes);
}

Sample raw_direct(bool write, void* buf, std::size_t nbytes, std::size_t block_size, std::size_t threads,
                  const std::string& path, bool preallocate) {
  Clock c;
  Fd f{open_or_throw(path, write ? (O_WRONLY | O_CREAT | O_DIRECT) : (O_RDONLY | O_DIRECT))};
  // Best effort, as deepio's own: where the file system refuses, the writes extend the file.
  if (write && preallocate) (void)::fallocate(f.fd, 0, 0, static_cast<off_t>(nbytes));
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
