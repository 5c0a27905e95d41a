// The route's backend: one synchronous cuFileRead/cuFileWrite per request on a route worker,
// and in Auto the staged path through host memory after a cuFile error (see gds_route.hpp,
// "Backend").
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <unordered_map>
#include <vector>

#include "backends/gds/gds_file.hpp"
#include "backends/gds/gds_route.hpp"
#include "backends/sync_backend.hpp"

namespace deepio::detail::gpu {

namespace {

// The synchronous cuFile backend of one route worker.
class GdsBackend final : public SyncBackend {
 public:
  GdsBackend(std::shared_ptr<GdsRoute> route, CuFileApi* api) : route_(std::move(route)), api_(api) {}

  [[nodiscard]] const char* name() const noexcept override { return "cufile"; }

  std::string take_error_text(std::uint64_t tag) override {
    auto it = errors_.find(tag);
    if (it == errors_.end()) return {};
    std::string text = std::move(it->second);
    errors_.erase(it);
    return text;
  }

 private:
  std::int64_t fail(const Request& r, Status st) {
    errors_[r.tag] = std::move(st.message);
    return -static_cast<std::int64_t>(st.errnum != 0 ? st.errnum : EIO);
  }

  std::int64_t run(const Request& r) override {
    const auto& f = static_cast<const GdsFile&>(*r.driver_file);
    if (f.ordinal() != current_) {
      Status st = route_->make_current(f.ordinal());
      if (!st.ok()) return fail(r, std::move(st));
      current_ = f.ordinal();
    }
    if (f.staged_io.load(std::memory_order_relaxed)) return staged(r, f);
    const std::uintptr_t p = address(r.buf);
    const std::uintptr_t base = f.base != 0 ? f.base : p;
    const auto base_offset = static_cast<off_t>(p - base);
    const auto file_offset = static_cast<off_t>(r.offset);
    errno = 0;
    const ssize_t n = r.write ? api_->cuFileWrite(f.fh, reinterpret_cast<const void*>(base), r.len, file_offset,
                                                  base_offset)
                              : api_->cuFileRead(f.fh, reinterpret_cast<void*>(base), r.len, file_offset, base_offset);
    const int saved = errno;
    if (n >= 0) return n;
    Status st = cufile_io_status(route_->cuda(), n, saved, r.write ? "cuFileWrite" : "cuFileRead");
    // A cuFile error (not a file system errno) in Auto: this request, and the rest of its
    // operation, are staged through host memory instead of failing the operation. A failure
    // of the staged request is reported as such, naming the cuFile error that led to it.
    if (n != -1 && route_->stages_failed_io()) {
      f.set_cause(st.message);
      f.staged_io.store(true, std::memory_order_relaxed);
      route_->note_io_fallback(st.message + ": requests staged through host memory");
      return staged(r, f);
    }
    return fail(r, std::move(st));
  }

  // One request through host memory, on this worker thread (whose context is the buffer's):
  // device -> host copy and pwrite, or pread and host -> device copy. Returns the byte count
  // (short counts go back to the worker, which resubmits the rest) or -errno.
  std::int64_t staged(const Request& r, const GdsFile& f) {
    const char* verb = r.write ? "staged pwrite" : "staged pread";
    const std::string cause = f.cause();
    const std::string after = cause.empty() ? std::string() : " (after " + cause + ")";
    int fd = -1;
    Status st = f.posix_fd(&fd);
    if (!st.ok()) return fail(r, Status::failure(st.errnum, std::string(verb) + ": " + st.message + after));
    if (bounce_.size() < r.len) {
      try {
        bounce_.resize(r.len);
      } catch (const std::bad_alloc&) {
        return fail(r, Status::failure(ENOMEM, std::string(verb) + ": no memory for a staging buffer" + after));
      }
    }
    const CudaApi* cu = route_->cuda();
    const auto dev = static_cast<CUdeviceptr>(address(r.buf));
    ssize_t n = 0;
    if (r.write) {
      if (const CUresult c = cu->cuMemcpyDtoH(bounce_.data(), dev, r.len); c != CUDA_SUCCESS) {
        Status cs = cuda_status(cu, c, "cuMemcpyDtoH (staged write)");
        cs.message += after;
        return fail(r, std::move(cs));
      }
      n = ::pwrite(fd, bounce_.data(), r.len, static_cast<off_t>(r.offset));
    } else {
      n = ::pread(fd, bounce_.data(), r.len, static_cast<off_t>(r.offset));
    }
    if (n < 0) {
      const int e = errno;
      return fail(r, Status::failure(e, std::string(verb) + ": " + std::strerror(e) + after));
    }
    if (!r.write && n > 0) {
      if (const CUresult c = cu->cuMemcpyHtoD(dev, bounce_.data(), static_cast<std::size_t>(n)); c != CUDA_SUCCESS) {
        Status cs = cuda_status(cu, c, "cuMemcpyHtoD (staged read)");
        cs.message += after;
        return fail(r, std::move(cs));
      }
    }
    route_->count_io_fallback(static_cast<std::uint64_t>(n));
    return n;
  }

  std::shared_ptr<GdsRoute> route_;
  CuFileApi* api_;
  int current_ = -1;  // device whose context is current on this worker thread
  std::unordered_map<std::uint64_t, std::string> errors_;
  std::vector<std::byte> bounce_;  // host memory for staged requests, grown on first use
};

}  // namespace

std::unique_ptr<Backend> GdsRoute::make_backend() { return std::make_unique<GdsBackend>(shared_from_this(), cufile_); }

}  // namespace deepio::detail::gpu
