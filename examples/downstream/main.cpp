// Writes a file through deepio::Handle, reads it back, compares the bytes; then checks that a
// deepio::Error thrown inside the library is caught here by its type (its typeinfo must come
// from the library). Exit status 0 only when all of that holds.
// Usage: deepio_downstream [folder]   (default: the system's temporary folder)
#include <deepio/deepio.hpp>
#include <deepio/gpu.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

// A handle is neither copyable nor movable; `{}` means its default options (GdsHandle too).
static_assert(!std::is_copy_constructible_v<deepio::Handle> && !std::is_move_constructible_v<deepio::Handle>);
static_assert(requires { deepio::GdsHandle({}); });
// The Python binding's protocol (keep-alives, operations detached from wait()) is not part of
// the user's types; it lives in deepio's sources, not in the installed headers.
template <class T>
concept HasKeepAlive = requires(T t) {
  t.keep_alive;
};
static_assert(!HasKeepAlive<deepio::OpOptions> && !HasKeepAlive<deepio::WaitResult>);

int main(int argc, char** argv) {
  const std::filesystem::path folder = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  const std::string path = (folder / ("deepio-downstream-" + std::to_string(getpid()) + ".bin")).string();
  // Not a multiple of any alignment: the direct body and the buffered tail are both exercised.
  const std::size_t n = (3u << 20) + 123;
  std::vector<unsigned char> src(n), dst(n, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);

  try {
    // "The default options", both ways a user writes it, compile and agree (`Handle h({})` was
    // ambiguous with an internal constructor once).
    const deepio::Handle braces({});
    const deepio::Handle plain;
    if (braces.options().block_size != plain.options().block_size) {
      std::fprintf(stderr, "deepio_downstream: Handle({}) and Handle() disagree\n");
      return 1;
    }
    deepio::Handle handle({.block_size = 1 << 20, .intra_op_parallelism = 2});
    handle.sync_pwrite(src.data(), n, path);
    // collect(): wait() that returns the failures instead of throwing the first.
    handle.async_pwrite(src.data(), n, path);
    const deepio::WaitResult collected = handle.collect();
    if (!collected.complete || collected.count != 1 || !collected.errors.empty()) {
      std::fprintf(stderr, "deepio_downstream: collect() after one write: %zu collected, %zu failed\n", collected.count,
                   collected.errors.size());
      return 1;
    }
    const std::size_t got = handle.async_pread(dst.data(), n, path).get();
    std::remove(path.c_str());
    if (got != n || std::memcmp(src.data(), dst.data(), n) != 0) {
      std::fprintf(stderr, "deepio_downstream: MISMATCH: read %zu of %zu bytes back from %s\n", got, n, path.c_str());
      return 1;
    }
    std::printf("deepio %s: wrote and read back %zu bytes with %s: OK\n", deepio::version(), n,
                std::string(deepio::to_string(handle.backend())).c_str());

    try {
      handle.sync_pread(dst.data(), n, (folder / "deepio-downstream-no-such-file").string());
      std::fprintf(stderr, "deepio_downstream: reading a missing file did not throw\n");
      return 1;
    } catch (const deepio::Error& e) {
      if (e.errnum() != ENOENT) {
        std::fprintf(stderr, "deepio_downstream: missing file gave errno %d, not ENOENT: %s\n", e.errnum(), e.what());
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::remove(path.c_str());
    std::fprintf(stderr, "deepio_downstream: %s\n", e.what());
    return 1;
  }
  return 0;
}
