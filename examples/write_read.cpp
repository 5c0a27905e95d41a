// Smallest useful deepio program: writes a buffer to a file, reads it back, checks it,
// prints GiB/s. Usage: write_read [folder] [MiB]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "deepio/deepio.hpp"

int main(int argc, char** argv) {
  const std::string folder = argc > 1 ? argv[1] : "/tmp";
  const std::size_t mib = argc > 2 ? std::stoul(argv[2]) : 256;
  const std::size_t n = mib << 20;
  const std::string path = folder + "/deepio-example.bin";
  try {
    deepio::UniqueLockedBuffer src(n), dst(n);
    for (std::size_t i = 0; i < n; ++i) src.bytes()[i] = static_cast<std::byte>(i * 131 + 7);
    deepio::Handle h({.queue_depth = 32, .overlap_events = true, .intra_op_parallelism = 2});
    auto t0 = std::chrono::steady_clock::now();
    h.sync_pwrite(src.data(), n, path);
    auto t1 = std::chrono::steady_clock::now();
    h.sync_pread(dst.data(), n, path);
    auto t2 = std::chrono::steady_clock::now();
    const bool ok = std::memcmp(src.data(), dst.data(), n) == 0;
    std::remove(path.c_str());
    const double gib = static_cast<double>(n) / (1 << 30);
    std::printf("backend %s: write %.2f GiB/s, read %.2f GiB/s, data %s\n",
                std::string(deepio::to_string(h.backend())).c_str(),
                gib / std::chrono::duration<double>(t1 - t0).count(),
                gib / std::chrono::duration<double>(t2 - t1).count(), ok ? "verified" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const deepio::Error& e) {
    std::fprintf(stderr, "write_read: %s\n", e.what());
    return 1;
  }
}
