// One timed deepio transfer, printed as a JSON line; bench/engine_vs_fio.py drives it against
// fio, interleaved. Modes:
//   --mode seq   : one file of --size bytes, read or written from one locked buffer
//   --mode files : --files files of --size bytes each in --dir, all submitted async, one wait()
//   --mode ops   : --files operations of --size bytes each on one file (--path) at consecutive
//                  offsets, all submitted async, one wait(): the per-operation cost without the
//                  per-file one (open, statx, close)
// The data is verified outside the timed region (--verify), files are prepared by --prepare.
// --repeat N times the transfer N times with the same handle and buffer, one line each: on
// virtual machines the first transfer into freshly allocated memory can be much slower than
// later ones (docs/benchmarks.md), so the driver reports the first and the last separately.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "bench_util.hpp"
#include "deepio/deepio.hpp"

namespace {

using deepio::bench::cpu_seconds;

struct Args {
  std::string mode = "seq", op = "read", path, backend = "auto";
  std::size_t size = 1ull << 30, block = 1 << 20, qd = 128, par = 1, files = 0, repeat = 1;
  bool overlap = true, single = false, prepare = false, verify = false;
};

std::string file_name(const Args& a, std::size_t i) { return a.path + "/f" + std::to_string(i); }

unsigned char byte_at(std::size_t file, std::size_t i) {
  return static_cast<unsigned char>((i * 131 + file * 7 + 1) >> 3);
}

int run(const Args& a) {
  const bool many = a.mode == "files";
  const bool ops = a.mode == "ops";
  const std::size_t count = many || ops ? a.files : 1;
  const std::size_t total = a.size * count;
  deepio::UniqueLockedBuffer buf(total);
  auto* p = static_cast<unsigned char*>(buf.data());
  deepio::HandleOptions o{.block_size = a.block,
                          .queue_depth = a.qd,
                          .single_submit = a.single,
                          .overlap_events = a.overlap,
                          .intra_op_parallelism = a.par,
                          .backend = *deepio::parse_backend(a.backend),
                          .direct_io = deepio::DirectIo::Auto};
  deepio::Handle h(o);
  if (a.prepare || a.op == "write") {
    for (std::size_t f = 0; f < count; ++f) {
      for (std::size_t i = 0; i < a.size; ++i) p[f * a.size + i] = byte_at(f, i);
    }
  } else {
    std::memset(p, 0, total);
  }
  if (a.prepare) {
    for (std::size_t f = 0; f < count; ++f) {
      h.async_pwrite(p + f * a.size, a.size, many ? file_name(a, f) : a.path, ops ? f * a.size : 0);
    }
    h.wait();
    ::sync();
    return 0;
  }
  for (std::size_t pass = 0; pass < a.repeat; ++pass) {
    if (pass > 0 && a.verify && a.op == "read") std::memset(p, 0, total);  // untimed
    const auto before = h.stats();
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t f = 0; f < count; ++f) {
      const std::string name = many ? file_name(a, f) : a.path;
      const std::uint64_t offset = ops ? f * a.size : 0;
      if (a.op == "read") {
        h.async_pread(p + f * a.size, a.size, name, offset);
      } else {
        h.async_pwrite(p + f * a.size, a.size, name, offset);
      }
    }
    const auto ts = std::chrono::steady_clock::now();
    h.wait();
    const auto t1 = std::chrono::steady_clock::now();
    const double cpu = cpu_seconds() - c0;
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    const double submit_secs = std::chrono::duration<double>(ts - t0).count();
    bool ok = true;
    if (a.verify) {
      for (std::size_t f = 0; f < count && ok; ++f) {
        for (std::size_t i = 0; i < a.size; ++i) {
          if (p[f * a.size + i] != byte_at(f, i)) {
            ok = false;
            break;
          }
        }
      }
    }
    const auto s = h.stats();
    auto delta = [](std::uint64_t now, std::uint64_t then) { return static_cast<unsigned long long>(now - then); };
    std::printf(
        "{\"tool\": \"deepio\", \"op\": \"%s\", \"mode\": \"%s\", \"pass\": %zu, \"bytes\": %zu, "
        "\"seconds\": %.6f, \"submit_seconds\": %.6f, \"cpu_seconds\": %.6f, \"backend\": \"%s\", "
        "\"bytes_direct\": %llu, \"bytes_bounced\": %llu, \"bytes_buffered\": %llu, \"bytes_fixed\": %llu, "
        "\"locked\": %s, \"verified\": %s}\n",
        a.op.c_str(), a.mode.c_str(), pass, total, secs, submit_secs, cpu,
        std::string(deepio::to_string(h.backend())).c_str(), delta(s.bytes_direct, before.bytes_direct),
        delta(s.bytes_bounced, before.bytes_bounced), delta(s.bytes_buffered, before.bytes_buffered),
        delta(s.bytes_fixed, before.bytes_fixed), buf.locked() ? "true" : "false",
        a.verify ? (ok ? "true" : "false") : "null");
    std::fflush(stdout);
    if (!ok) return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  deepio::bench::Args in("engine_bench", argc, argv);
  while (in.next()) {
    const std::string_view k = in.flag();
    if (k == "--mode") a.mode = in.value();
    else if (k == "--op") a.op = in.value();
    else if (k == "--path") a.path = in.value();
    else if (k == "--backend") a.backend = in.value();
    else if (k == "--size") a.size = in.number();
    else if (k == "--block") a.block = in.number();
    else if (k == "--qd") a.qd = in.number();
    else if (k == "--par") a.par = in.number();
    else if (k == "--files") a.files = in.number();
    else if (k == "--repeat") a.repeat = in.number();
    else if (k == "--no-overlap") a.overlap = false;
    else if (k == "--single-submit") a.single = true;
    else if (k == "--prepare") a.prepare = true;
    else if (k == "--verify") a.verify = true;
    else in.unknown();
  }
  if (a.path.empty() || !deepio::parse_backend(a.backend) ||
      (a.mode != "seq" && a.mode != "files" && a.mode != "ops")) {
    in.fail("--path is required; --mode seq|files|ops; --backend auto|io_uring|libaio|threads");
  }
  try {
    return run(a);
  } catch (const deepio::Error& e) {
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
}
