// The engine's cost per request of a batch, without Python: --count reads (or writes) of
// --size bytes at random aligned offsets of one file (--path, created and filled if missing
// or too small), submitted with Handle::submit_batch ("batch") or one async_pread/async_pwrite
// per request ("loop"), then one wait() ("batch-sliced": submit_batch, then collect() with
// 50 ms deadlines until complete, as the Python binding waits; "ranges": one
// async_pread_ranges/async_pwrite_ranges over all of them). Rounds interleave the modes (batch, loop, loop,
// batch, ...); each prints a JSON line; the summary gives the medians (kops/s, CPU s/GiB of
// the process, all threads). Reads are verified byte for byte after the last round.
//
//   batch_bench --path /dev/shm/f --count 65536 --size 4096 --rounds 5 [--modes batch,loop,ranges]
//               [--qd 128] [--par 1] [--block 1048576] [--backend auto] [--op read|write]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "deepio/deepio.hpp"

namespace {

using deepio::bench::cpu_seconds;

unsigned char byte_at(std::uint64_t file_pos) { return static_cast<unsigned char>((file_pos * 131 + 7) >> 3); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 != 0 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  deepio::bench::Args args("batch_bench", argc, argv);
  std::string path = "/dev/shm/deepio-batch-bench";
  std::string modes_arg = "batch,loop";
  std::string backend = "auto";
  std::string op = "read";
  std::size_t count = 65536, size = 4096, rounds = 5, qd = 128, par = 1, block = 1 << 20;
  while (args.next()) {
    const auto f = args.flag();
    if (f == "--path") {
      path = args.value();
    } else if (f == "--count") {
      count = args.number();
    } else if (f == "--size") {
      size = args.number();
    } else if (f == "--rounds") {
      rounds = args.number();
    } else if (f == "--qd") {
      qd = args.number();
    } else if (f == "--par") {
      par = args.number();
    } else if (f == "--block") {
      block = args.number();
    } else if (f == "--backend") {
      backend = args.value();
    } else if (f == "--modes") {
      modes_arg = args.value();
    } else if (f == "--op") {
      op = args.value();
    } else {
      args.fail("unknown flag " + std::string(f));
    }
  }
  const bool write = op == "write";
  std::vector<std::string> modes;
  for (std::size_t at = 0; at <= modes_arg.size();) {
    const std::size_t comma = std::min(modes_arg.find(',', at), modes_arg.size());
    modes.push_back(modes_arg.substr(at, comma - at));
    at = comma + 1;
  }
  const std::size_t total = count * size;
  deepio::UniqueLockedBuffer buf(total);
  auto* p = static_cast<unsigned char*>(buf.data());
  deepio::HandleOptions o{
      .block_size = block, .queue_depth = qd, .intra_op_parallelism = par, .backend = *deepio::parse_backend(backend)};
  deepio::Handle h(o);
  // The file: byte_at(position) everywhere.
  {
    std::vector<unsigned char> content(total);
    for (std::size_t i = 0; i < total; ++i) content[i] = byte_at(i);
    h.sync_pwrite(content.data(), total, path, 0);
  }
  // Slot i of the buffer goes to (or comes from) file offset offsets[i]: a random permutation.
  std::vector<std::uint64_t> offsets(count);
  std::iota(offsets.begin(), offsets.end(), 0);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937_64(2));
  for (auto& v : offsets) v *= size;
  std::vector<deepio::IoRange> ranges(count);
  for (std::size_t i = 0; i < count; ++i) ranges[i] = {offsets[i], i * size, size};
  std::vector<deepio::IoRequest> proto(count);
  for (std::size_t i = 0; i < count; ++i) {
    proto[i].write = write;
    proto[i].buffer = p + i * size;
    proto[i].nbytes = size;
    proto[i].path = path;
    proto[i].file_offset = offsets[i];
  }
  if (write) {
    for (std::size_t i = 0; i < count; ++i) {
      for (std::size_t k = 0; k < size; ++k) p[i * size + k] = byte_at(offsets[i] + k);
    }
  }
  std::map<std::string, std::vector<double>> secs, cpus;
  std::printf("{\"path\":\"%s\",\"count\":%zu,\"size\":%zu,\"qd\":%zu,\"par\":%zu,\"backend\":\"%s\"}\n", path.c_str(),
              count, size, qd, par, std::string(deepio::to_string(h.backend())).c_str());
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<std::string> order = modes;
    if (r % 2 == 1) std::reverse(order.begin(), order.end());
    for (const auto& mode : order) {
      std::vector<deepio::IoRequest> reqs;
      const bool sliced = mode == "batch-sliced";
      if (mode == "batch" || sliced) reqs = proto;  // untimed copy: submit_batch consumes its argument
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      if (mode == "batch" || sliced) {
        h.submit_batch(std::move(reqs));
      } else if (mode == "ranges") {
        if (write) {
          h.async_pwrite_ranges(p, total, path, ranges);
        } else {
          h.async_pread_ranges(p, total, path, ranges);
        }
      } else if (mode == "loop") {
        for (std::size_t i = 0; i < count; ++i) {
          if (write) {
            h.async_pwrite(p + i * size, size, path, offsets[i]);
          } else {
            h.async_pread(p + i * size, size, path, offsets[i]);
          }
        }
      } else {
        std::fprintf(stderr, "batch_bench: unknown mode %s\n", mode.c_str());
        return 2;
      }
      std::size_t n = 0;
      if (sliced) {
        // As the Python binding waits: collect() with a deadline 50 ms ahead, until complete.
        for (;;) {
          deepio::CollectOptions co;
          co.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
          const deepio::WaitResult w = h.collect(co);
          if (w.complete) {
            n = w.count;
            break;
          }
        }
      } else {
        n = h.wait();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double c = cpu_seconds() - c0;
      if (n != (mode == "ranges" ? 1 : count)) {
        std::fprintf(stderr, "batch_bench: wait() returned %zu for %zu requests\n", n, count);
        return 1;
      }
      secs[mode].push_back(s);
      cpus[mode].push_back(c);
      std::printf("{\"round\":%zu,\"mode\":\"%s\",\"kops\":%.1f,\"cpu_s_per_gib\":%.3f}\n", r, mode.c_str(),
                  static_cast<double>(count) / s / 1e3, c / (static_cast<double>(total) / (1 << 30)));
    }
  }
  if (!write) {
    for (std::size_t i = 0; i < count; ++i) {
      for (std::size_t k = 0; k < size; ++k) {
        if (p[i * size + k] != byte_at(offsets[i] + k)) {
          std::fprintf(stderr, "batch_bench: wrong byte in request %zu at %zu\n", i, k);
          return 1;
        }
      }
    }
  }
  for (const auto& mode : modes) {
    const double s = median(secs[mode]);
    const double c = median(cpus[mode]);
    std::printf("median %-6s %8.1f kops/s  %6.3f CPU s/GiB  (%zu rounds)\n", mode.c_str(),
                static_cast<double>(count) / s / 1e3, c / (static_cast<double>(total) / (1 << 30)), rounds);
  }
  const auto st = h.stats();
  std::printf("bytes: direct %llu, buffered %llu, fixed %llu, bounced %llu\n",
              static_cast<unsigned long long>(st.bytes_direct), static_cast<unsigned long long>(st.bytes_buffered),
              static_cast<unsigned long long>(st.bytes_fixed), static_cast<unsigned long long>(st.bytes_bounced));
  ::unlink(path.c_str());
  return 0;
}
