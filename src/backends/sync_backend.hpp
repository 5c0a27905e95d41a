// SyncBackend: the shape of a backend whose requests complete inside the submitting call
// (the thread pool's pread/pwrite, cuFile's cuFileRead/cuFileWrite).
//
// submit() runs each request at once, on the worker thread, through run() and queues its
// result; reap() hands queued results back in submission order (`min` is always satisfied:
// results are ready before reap is called). Concurrency comes only from having several
// workers. run() returns the byte count or a negative errno, like a kernel completion.
#pragma once

#include <deque>
#include <span>

#include "core/backend.hpp"

namespace deepio::detail {

class SyncBackend : public Backend {
 public:
  int submit(std::span<const Request> reqs) final {
    for (const Request& r : reqs) done_.push_back({r.tag, run(r), false});
    return static_cast<int>(reqs.size());
  }

  int reap(std::span<Completion> out, std::size_t /*min*/, std::int64_t /*max_wait_us*/) final {
    std::size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.front();
      done_.pop_front();
    }
    return static_cast<int>(n);
  }

 protected:
  virtual std::int64_t run(const Request& r) = 0;

 private:
  std::deque<Completion> done_;
};

}  // namespace deepio::detail
