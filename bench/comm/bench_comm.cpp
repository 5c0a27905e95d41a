// Time per call of deepio::comm::compressed_allreduce against MPI_Allreduce (fp32 sum) on the
// same communicator, same sizes, interleaved (A B A B ...), medians over repetitions.
// Run it under mpirun; bench/comm/shaped_network.sh runs it over a shaped network.
//
//   bench_comm [--min-log2 20] [--max-log2 26] [--reps R | --budget-s S] [--label TEXT] [--json FILE]
//
// Per size it reports the median wall time of each method (the max over ranks of one call,
// with a barrier before each call), the speedup, algorithmic throughput (N*4 bytes / time) and
// CPU seconds per GiB (user+sys of all ranks during the call, summed, per GiB of one rank's
// fp32 input; MPI ranks spin while they wait, so this counts polling too). Correctness is
// verified after the timed region: the compressed output must be bit-identical on all ranks
// and the allreduce output must equal W times the input mean within rounding.
#include <deepio/comm.hpp>

#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::uint64_t fnv1a(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Sample {
  double wall;  // max over ranks
  double cpu;   // sum over ranks
};

template <class Fn>
Sample timed(Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  Sample s{};
  MPI_Allreduce(&wall, &s.wall, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&cpu, &s.cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, w = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w);

  int min_log2 = 20, max_log2 = 26, reps = 0;
  double budget_s = 20.0;  // per size, both methods together, when --reps is not given
  std::string label = "local", json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        if (rank == 0) std::fprintf(stderr, "missing value after %s\n", a.c_str());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      return argv[++i];
    };
    if (a == "--min-log2") min_log2 = std::stoi(next());
    else if (a == "--max-log2") max_log2 = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--budget-s") budget_s = std::stod(next());
    else if (a == "--label") label = next();
    else if (a == "--json") json_path = next();
    else {
      if (rank == 0) std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }

  const char* kernel = deepio::comm::best_kernel() == deepio::comm::Kernel::avx2 ? "avx2" : "scalar";
  if (rank == 0) {
    std::printf("# bench_comm: ranks=%d label=%s kernel=%s sizes=2^%d..2^%d reps=%s\n", w, label.c_str(), kernel,
                min_log2, max_log2, reps ? std::to_string(reps).c_str() : "auto");
    std::printf("# %-8s %6s %10s %4s %12s %12s %8s %10s %10s %10s %10s %s\n", "label", "log2n", "elements", "reps",
                "onebit_s", "allreduce_s", "speedup", "onebit_GBs", "allred_GBs", "onebit_cpu", "allred_cpu",
                "(cpu = CPU s/GiB, all ranks)");
    std::fflush(stdout);
  }
  FILE* json = nullptr;
  if (rank == 0 && !json_path.empty()) json = std::fopen(json_path.c_str(), "a");

  int failures = 0;
  for (int lg = min_log2; lg <= max_log2; ++lg) {
    const std::size_t n0 = std::size_t{1} << lg;
    const std::size_t n = deepio::comm::padded_size(n0, static_cast<std::size_t>(w));
    std::vector<float> input(n0), output(n0), sum(n0), worker_error(n, 0.0f), server_error(n / w, 0.0f);
    std::mt19937 gen(static_cast<unsigned>(rank) + 1);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& x : input) x = u(gen) - 0.5f + 0.01f * static_cast<float>(rank);

    const auto onebit = [&] {
      deepio::comm::compressed_allreduce(std::span<const float>(input), std::span<float>(output), worker_error,
                                         server_error, MPI_COMM_WORLD);
    };
    const auto allreduce = [&] {
      MPI_Allreduce(input.data(), sum.data(), static_cast<int>(n0), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    // Warm-up (connections, page faults, workspace), which also sizes the repetitions.
    const Sample w1 = timed(onebit);
    const Sample w2 = timed(allreduce);
    int r = reps;
    if (r == 0) r = static_cast<int>(std::clamp(budget_s / (w1.wall + w2.wall), 3.0, 15.0));
    MPI_Bcast(&r, 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<double> t1, t2, c1, c2;
    for (int k = 0; k < r; ++k) {
      const Sample a = timed(onebit);
      const Sample b = timed(allreduce);
      t1.push_back(a.wall);
      c1.push_back(a.cpu);
      t2.push_back(b.wall);
      c2.push_back(b.cpu);
    }

    // Verification, outside the timed region.
    std::uint64_t h = fnv1a(output.data(), n0 * sizeof(float)), hmin = 0, hmax = 0;
    MPI_Allreduce(&h, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    double local = 0.0, global_in = 0.0, global_out = 0.0;
    for (float x : input) local += x;
    MPI_Allreduce(&local, &global_in, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (float x : sum) global_out += x;
    const bool ok = hmin == hmax && std::fabs(global_out - global_in) <= 1e-3 * static_cast<double>(n0);
    if (!ok) ++failures;

    const double gib = static_cast<double>(n0) * 4.0 / (1024.0 * 1024.0 * 1024.0);
    const double m1 = median(t1), m2 = median(t2);
    if (rank == 0) {
      std::printf("  %-8s %6d %10zu %4d %12.6f %12.6f %8.2f %10.3f %10.3f %10.3f %10.3f%s\n", label.c_str(), lg, n0, r,
                  m1, m2, m2 / m1, static_cast<double>(n0) * 4e-9 / m1, static_cast<double>(n0) * 4e-9 / m2,
                  median(c1) / gib, median(c2) / gib, ok ? "" : "  VERIFY FAILED");
      std::fflush(stdout);
      if (json) {
        std::fprintf(json,
                     "{\"label\":\"%s\",\"ranks\":%d,\"kernel\":\"%s\",\"log2n\":%d,\"elements\":%zu,\"reps\":%d,"
                     "\"onebit_median_s\":%.9f,\"allreduce_median_s\":%.9f,\"speedup\":%.4f,"
                     "\"onebit_cpu_s_per_gib\":%.4f,\"allreduce_cpu_s_per_gib\":%.4f,\"verified\":%s}\n",
                     label.c_str(), w, kernel, lg, n0, r, m1, m2, m2 / m1, median(c1) / gib, median(c2) / gib,
                     ok ? "true" : "false");
        std::fflush(json);
      }
    }
  }
  if (json) std::fclose(json);
  MPI_Finalize();
  return failures ? 1 : 0;
}
