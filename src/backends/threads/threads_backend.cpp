// The portable backend: the worker thread itself performs each request with one pread(2)
// or pwrite(2) call at submission and queues the result as a completion.
// Lifecycle: nothing to set up. Errors: the call's -errno becomes the completion result;
// short counts are passed through for the worker to finish. Concurrency comes only from
// having several workers (intra_op_parallelism); queue_depth bounds batching, not overlap.
#include "backends/threads/threads_backend.hpp"
#include "backends/sync_backend.hpp"

#include <unistd.h>

#include <cerrno>

namespace deepio::detail {

namespace {
class ThreadsBackend final : public SyncBackend {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "threads"; }

 protected:
  std::int64_t run(const Request& r) override {
    const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                              : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
    return n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n);
  }
};
}  // namespace

std::unique_ptr<Backend> make_threads_backend(std::size_t /*queue_depth*/) {
  return std::make_unique<ThreadsBackend>();
}

}  // namespace deepio::detail
