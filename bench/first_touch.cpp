// The machine, not deepio: how fast a plain liburing loop reads one file into memory it has
// never read into before, against reading it again, and against cycling through a small
// buffer the way fio does (iodepth x bs). No deepio code is involved.
//
//   first_touch --path FILE [--size BYTES] [--block BYTES] [--qd N] [--passes N] [--cycle]
//
// Allocates --size bytes, locks and zeroes them, then reads the file --passes times at
// queue depth --qd, each request into the next --block of the buffer (with --cycle: into the
// next of qd slots, like fio). Prints one JSON line per pass. docs/benchmarks.md uses it to
// show why engine_vs_fio.py reports deepio's first and last pass separately.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench_util.hpp"

int main(int argc, char** argv) {
  std::string path;
  std::size_t size = std::size_t{512} << 20, block = 64 << 10, qd = 64, passes = 2;
  bool cycle = false;
  deepio::bench::Args in("first_touch", argc, argv);
  while (in.next()) {
    const std::string_view k = in.flag();
    if (k == "--path") path = in.value();
    else if (k == "--size") size = in.number();
    else if (k == "--block") block = in.number();
    else if (k == "--qd") qd = in.number();
    else if (k == "--passes") passes = in.number();
    else if (k == "--cycle") cycle = true;
    else in.unknown();
  }
  if (path.empty() || block == 0 || block % 4096 != 0 || size % block != 0 || qd == 0 || qd > 4096) {
    in.fail("--path is required; --block a multiple of 4096 dividing --size; --qd 1..4096");
  }
  const std::size_t buf_bytes = cycle ? qd * block : size;
  void* mem = ::mmap(nullptr, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) in.fail("cannot allocate the buffer");
  ::mlock(mem, buf_bytes);  // as deepio's UniqueLockedBuffer does; a refusal only means unlocked memory
  std::memset(mem, 0, buf_bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) in.fail("cannot open " + path + ": " + std::strerror(errno));
  io_uring ring{};
  if (const int r = io_uring_queue_init(static_cast<unsigned>(qd), &ring, 0); r < 0) {
    in.fail(std::string("io_uring_queue_init: ") + std::strerror(-r));
  }
  auto* base = static_cast<char*>(mem);
  const std::size_t n = size / block;
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const double c0 = deepio::bench::cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t next = 0, done = 0, inflight = 0;
    while (done < n) {
      while (inflight < qd && next < n) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        char* dst = base + (cycle ? next % qd : next) * block;
        io_uring_prep_read(sqe, fd, dst, static_cast<unsigned>(block), next * block);
        ++next;
        ++inflight;
      }
      if (const int r = io_uring_submit_and_wait(&ring, 1); r < 0 && r != -EINTR) {
        in.fail(std::string("io_uring_submit_and_wait: ") + std::strerror(-r));
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        if (cqe->res != static_cast<int>(block)) in.fail("a read returned " + std::to_string(cqe->res));
        ++seen;
      }
      io_uring_cq_advance(&ring, seen);
      inflight -= seen;
      done += seen;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "{\"tool\": \"liburing\", \"pass\": %zu, \"cycle\": %s, \"bytes\": %zu, \"seconds\": %.6f, "
        "\"cpu_seconds\": %.6f}\n",
        pass, cycle ? "true" : "false", size, secs, deepio::bench::cpu_seconds() - c0);
    std::fflush(stdout);
  }
  io_uring_queue_exit(&ring);
  ::close(fd);
  ::munmap(mem, buf_bytes);
  return 0;
}
