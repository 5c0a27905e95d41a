// The one place deepio reads environment variables. Every variable is listed in
// docs/settings.md. Garbage is rejected with deepio::Error(EINVAL) naming the variable,
// never silently ignored.
#pragma once

#include <optional>

#include "deepio/options.hpp"

namespace deepio::detail {

/// DEEPIO_BACKEND: auto | io_uring | libaio | threads. Used when the caller asked for Auto.
std::optional<BackendKind> env_backend();
/// DEEPIO_DIRECT_IO: auto | on | off. Used when the caller asked for Auto.
std::optional<DirectIo> env_direct_io();

}  // namespace deepio::detail
