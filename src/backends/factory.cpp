#include "backends/factory.hpp"

#include <cerrno>

#include "backends/threads/threads_backend.hpp"
#if DEEPIO_HAVE_URING
#include "backends/uring/uring_backend.hpp"
#endif
#if DEEPIO_HAVE_AIO
#include "backends/aio/aio_backend.hpp"
#endif

namespace deepio::detail {

bool backend_compiled(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::IoUring: return DEEPIO_HAVE_URING != 0;
    case BackendKind::Libaio: return DEEPIO_HAVE_AIO != 0;
    case BackendKind::Threads: return true;
    case BackendKind::Auto: return true;
  }
  return false;
}

std::unique_ptr<Backend> make_backend(BackendKind kind, std::size_t queue_depth, Status* why, bool single_submit) {
  switch (kind) {
    case BackendKind::IoUring:
#if DEEPIO_HAVE_URING
      return make_uring_backend(queue_depth, single_submit, why);
#else
      *why = Status::failure(ENOTSUP, "not compiled in (liburing-dev was not found at build time)");
      return nullptr;
#endif
    case BackendKind::Libaio:
#if DEEPIO_HAVE_AIO
      return make_aio_backend(queue_depth, why);
#else
      *why = Status::failure(ENOTSUP, "not compiled in (libaio-dev was not found at build time)");
      return nullptr;
#endif
    case BackendKind::Threads: return make_threads_backend(queue_depth);
    case BackendKind::Auto: break;
  }
  *why = Status::failure(EINVAL, "make_backend needs a concrete backend kind");
  return nullptr;
}

}  // namespace deepio::detail
