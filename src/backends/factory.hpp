// Creates backends by kind, and says why one cannot be created.
#pragma once

#include <cstddef>
#include <memory>

#include "core/backend.hpp"
#include "deepio/options.hpp"
#include "platform/status.hpp"

namespace deepio::detail {

/// Whether the backend was compiled into this library.
bool backend_compiled(BackendKind kind) noexcept;

/// A backend of `kind` (not Auto) with room for queue_depth requests in flight, whose
/// request tags are below queue_depth. With single_submit every submit() call reaches the
/// kernel at once; without, a backend may defer it to the next reap() and combine the two
/// in one system call. Returns nullptr and sets *why when it cannot be set up here (not
/// compiled, kernel too old, disabled by sysctl or seccomp, limits).
std::unique_ptr<Backend> make_backend(BackendKind kind, std::size_t queue_depth, Status* why,
                                      bool single_submit = false);

}  // namespace deepio::detail
