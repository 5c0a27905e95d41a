// Single-core throughput of the packing kernels against this machine's memory bandwidth.
//
//   bench_comm_kernels [--log2n 24] [--reps 7]
//
// Every figure is GB/s of memory traffic the pass must do at minimum (bytes read + bytes
// written, counted once), median of --reps runs on buffers larger than the caches, so the
// kernels can be compared with memcpy (read + write) and a read-only sum on the same buffers.
// Also elements per second, which is what matters for the allreduce.
#include <deepio/comm.hpp>

#include "../../src/comm/kernels.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace dc = deepio::comm;
namespace dd = deepio::comm::detail;

namespace {

template <class Fn>
double median_seconds(int reps, Fn&& fn) {
  std::vector<double> t;
  fn();  // warm-up: page faults, caches
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  int log2n = 24, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--log2n") log2n = std::stoi(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const std::size_t n = std::size_t{1} << log2n;
  std::vector<float> x(n), y(n), e(n);
  std::vector<std::uint8_t> bits(n / 8);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(gen);
  for (float& v : e) v = 0.01f * u(gen);
  dc::pack_signs(x, bits);

  std::printf("# bench_comm_kernels: n=2^%d (%zu MiB of fp32 per buffer), reps=%d, 1 thread, best kernel=%s\n", log2n,
              n * 4 >> 20, reps, dc::best_kernel() == dc::Kernel::avx2 ? "avx2" : "scalar");
  std::printf("# %-26s %10s %12s %12s\n", "pass", "kernel", "GB/s", "Gelem/s");
  const auto row = [&](const char* name, const char* kernel, double bytes_per_elem, double seconds) {
    std::printf("  %-26s %10s %12.2f %12.3f\n", name, kernel, bytes_per_elem * static_cast<double>(n) * 1e-9 / seconds,
                static_cast<double>(n) * 1e-9 / seconds);
    std::fflush(stdout);
  };

  std::copy(e.begin(), e.end(), y.begin());
  row("memcpy (read+write)", "libc", 8.0, median_seconds(reps, [&] { std::memcpy(y.data(), x.data(), n * 4); }));
  row("sum (read only)", "scalar", 4.0, median_seconds(reps, [&] {
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        for (std::size_t i = 0; i < n; i += 8) {
          s0 += x[i];
          s1 += x[i + 1];
          s2 += x[i + 2];
          s3 += x[i + 3];
          s4 += x[i + 4];
          s5 += x[i + 5];
          s6 += x[i + 6];
          s7 += x[i + 7];
        }
        g_sink = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
      }));

  for (dc::Kernel k : {dc::Kernel::scalar, dc::Kernel::avx2}) {
    if (!dc::kernel_available(k)) continue;
    const char* kn = k == dc::Kernel::avx2 ? "avx2" : "scalar";
    row("pack_signs", kn, 4.125, median_seconds(reps, [&] { dd::pack(x.data(), n, bits.data(), k); }));
    row("unpack_signs", kn, 4.125, median_seconds(reps, [&] { dd::unpack(bits.data(), n, y.data(), 0.5f, k); }));
    row("worker_pass (x+e, norm, bits)", kn, 12.125, median_seconds(reps, [&] {
          dd::SumSq acc;
          dd::worker_pass(x.data(), n, y.data(), n, bits.data(), acc, k);
          g_sink = static_cast<float>(acc.total());
        }));
    row("residual_pass", kn, 8.0, median_seconds(reps, [&] { dd::residual_pass(y.data(), n, 1e-3f, k); }));
    for (std::size_t w : {std::size_t{4}, std::size_t{16}}) {
      std::vector<const std::uint8_t*> blocks(w, bits.data());
      std::vector<float> t(w, 0.25f);
      std::vector<std::uint8_t> out(n / 8);
      const std::string name = "server_pass W=" + std::to_string(w);
      row(name.c_str(), kn, 8.0 + 0.125 * static_cast<double>(w + 1), median_seconds(reps, [&] {
            dd::SumSq acc;
            dd::server_pass(blocks.data(), t.data(), w, y.data(), n, out.data(), acc, k);
            g_sink = static_cast<float>(acc.total());
          }));
    }
  }
  return 0;
}
