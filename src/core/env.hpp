// The one place deepio reads environment variables. Every variable is listed in
// docs/settings.md. Garbage is rejected with deepio::Error(EINVAL) naming the variable,
// never silently ignored.
#pragma once

#include <cstddef>
#include <optional>

#include "deepio/options.hpp"

namespace deepio::detail {

/// DEEPIO_BACKEND: auto | io_uring | libaio | threads. Used when the caller asked for Auto.
std::optional<BackendKind> env_backend();
/// DEEPIO_DIRECT_IO: auto | on | off. Used when the caller asked for Auto.
std::optional<DirectIo> env_direct_io();
/// DEEPIO_STAGING_BYTES: host staging memory per worker for device (GPU) buffers and
/// unaligned host buffers, in bytes, with an optional K, M or G suffix (powers of 1024);
/// at least 64K, at most 1G.
std::optional<std::size_t> env_staging_bytes();

}  // namespace deepio::detail
