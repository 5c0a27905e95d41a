// The portable backend: the worker thread itself performs each request with one pread(2)
// or pwrite(2) call at submission and queues the result as a completion.
// Lifecycle: nothing to set up. Errors: the call's -errno becomes the completion result;
// short counts are passed through for the worker to finish. Concurrency comes only from
// having several workers (intra_op_parallelism); queue_depth bounds batching, not overlap.
#include "backends/threads/threads_backend.hpp"

#include <unistd.h>

#include <cerrno>
#include <deque>

namespace deepio::detail {

namespace {
class ThreadsBackend final : public Backend {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "threads"; }

  int submit(std::span<const Request> reqs) override {
    for (const Request& r : reqs) {
      const ssize_t n = r.write ? ::pwrite(r.fd, r.buf, r.len, static_cast<off_t>(r.offset))
                                : ::pread(r.fd, r.buf, r.len, static_cast<off_t>(r.offset));
      done_.push_back({r.tag, n < 0 ? -static_cast<std::int64_t>(errno) : static_cast<std::int64_t>(n)});
    }
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<Completion> out, std::size_t /*min: results are ready at submission*/) override {
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return static_cast<int>(n);
  }

 private:
  std::deque<Completion> done_;
};
}  // namespace

std::unique_ptr<Backend> make_threads_backend(std::size_t /*queue_depth*/) {
  return std::make_unique<ThreadsBackend>();
}

}  // namespace deepio::detail
