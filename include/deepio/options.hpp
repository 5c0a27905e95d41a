// Options of an I/O handle. Defaults are DeepNVMe's aio_handle defaults.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "deepio/export.hpp"

namespace deepio {

/// The kernel interface a handle's workers use.
enum class BackendKind {
  Auto,     ///< io_uring, else libaio, else threads; capabilities() says why one was skipped
  IoUring,  ///< liburing, one ring per worker
  Libaio,   ///< Linux native AIO, one context per worker
  Threads,  ///< pread/pwrite: a request that may wait for a device runs on a pool of up to
            ///< queue_depth threads per worker; one answered at once (memory, cache) on the worker
};

/// Whether file data bypasses the page cache.
enum class DirectIo {
  Auto,  ///< O_DIRECT where the file system accepts it, buffered I/O where it refuses (tmpfs)
  On,    ///< O_DIRECT or an error (EINVAL) for files that refuse it
  Off,   ///< buffered I/O only
};

/// How a handle moves CUDA device memory to and from files.
enum class DeviceRouteMode {
  /// GPUDirect Storage (cuFile) where it is usable, staging through host memory otherwise.
  /// Nothing is decided or loaded at construction: the first operation on device memory
  /// (which needs the CUDA driver already in the process) looks for cuFile, once per handle,
  /// and opens its driver if found; without CUDA or cuFile every operation is staged.
  Auto,
  Staged,  ///< always staged through page-locked host memory; cuFile is never loaded
  /// cuFile required (its own compatibility mode allowed), as DeepNVMe's gds_handle: the handle
  /// throws ENOTSUP at construction when CUDA or cuFile is missing or the driver cannot open.
  Gds,
};

struct HandleOptions {
  /// Largest single request a worker submits. Direct-I/O requests are rounded to the file's
  /// alignment unit (so a block_size below the alignment acts as the alignment). Must be > 0.
  std::size_t block_size = 1 << 20;
  /// Most requests one worker keeps in flight. Must be > 0.
  std::size_t queue_depth = 128;
  /// Submit each request with its own system call instead of one call per batch.
  bool single_submit = false;
  /// true: keep the queue topped up as completions arrive. false: submit a batch of up to
  /// queue_depth requests and wait for the whole batch before the next (DeepNVMe's default).
  bool overlap_events = false;
  /// Worker threads; every request is split across them. Any size works with any value. Must be > 0.
  std::size_t intra_op_parallelism = 1;
  BackendKind backend = BackendKind::Auto;
  DirectIo direct_io = DirectIo::Auto;
  /// How device memory reaches files (host memory is never affected). Handle::stats() counts
  /// what each route moved.
  DeviceRouteMode device_route = DeviceRouteMode::Auto;
};

/// "auto", "io_uring", "libaio", "threads".
[[nodiscard]] DEEPIO_API std::string_view to_string(BackendKind kind) noexcept;
[[nodiscard]] DEEPIO_API std::optional<BackendKind> parse_backend(std::string_view name) noexcept;
/// "auto", "on", "off".
[[nodiscard]] DEEPIO_API std::string_view to_string(DirectIo mode) noexcept;
[[nodiscard]] DEEPIO_API std::optional<DirectIo> parse_direct_io(std::string_view name) noexcept;
/// "auto", "staged", "gds".
[[nodiscard]] DEEPIO_API std::string_view to_string(DeviceRouteMode mode) noexcept;
[[nodiscard]] DEEPIO_API std::optional<DeviceRouteMode> parse_device_route(std::string_view name) noexcept;

}  // namespace deepio
