// What the tests of deepio::GdsHandle over the fake CUDA driver and fake libcufile
// (test_gds_fake*.cpp) share: the FakeGds fixture (both fakes loaded, the fake cuFile reset,
// a current context, no device memory leaked), and the fake cuFile's counters and controls.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "deepio/gpu.hpp"
#include "engine/gds.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "gpu_support.hpp"

namespace deepio::gputest {

struct FakeStats {
  long opens, closes, refs, io_calls, max_io, max_concurrency, buffers, handles;
};

inline FakeStats fake_stats() {
  long v[8];
  fake_symbol<void(long*)>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_stats")(v);
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}
template <typename... A>
void control(const char* name, A... args) {
  fake_symbol<void(A...)>(DEEPIO_FAKE_CUFILE, name)(args...);
}

class FakeGds : public ::testing::Test {
 protected:
  void SetUp() override {
    deepio::detail::Status why;
    cuda_ = detail::gpu::load_cuda(DEEPIO_FAKE_CUDA, &why);
    ASSERT_NE(cuda_, nullptr) << why.message;
    cufile_ = detail::gpu::load_cufile(DEEPIO_FAKE_CUFILE, &why);
    ASSERT_NE(cufile_, nullptr) << why.message;
    control("deepio_fake_cufile_reset");
    live_before_ = fake_symbol<int()>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_live_allocations")();
    ctx_ = std::make_unique<deepio::gputest::CurrentContext>(cuda_.get());  // for device_alloc & co
  }
  void TearDown() override {
    ctx_.reset();
    control("deepio_fake_cufile_reset");
    EXPECT_EQ(fake_symbol<int()>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_live_allocations")(), live_before_)
        << "device memory leaked";
  }
  GdsHandle handle(GdsOptions o = {}, bool with_cufile = true) {
    return detail::gpu::make_gds_handle(o, cuda_.get(), {}, with_cufile ? cufile_.get() : nullptr,
                                        deepio::detail::Status::failure(ENOTSUP, "cuFile not found: test"));
  }
  std::byte* device_alloc(std::size_t n) {
    detail::gpu::CUdeviceptr d = 0;
    EXPECT_EQ(cuda_->cuMemAlloc(&d, n), detail::gpu::CUDA_SUCCESS);
    return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(d));
  }
  void device_free(void* p) {
    EXPECT_EQ(cuda_->cuMemFree(static_cast<detail::gpu::CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p))),
              detail::gpu::CUDA_SUCCESS);
  }
  std::unique_ptr<detail::gpu::CudaApi> cuda_;
  std::unique_ptr<detail::gpu::CuFileApi> cufile_;
  std::unique_ptr<deepio::gputest::CurrentContext> ctx_;
  TempDir dir_;
  int live_before_ = 0;
};

inline long register_calls() {
  return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_register_calls")();
}

inline long deregister_calls() {
  return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_deregister_calls")();
}
struct Deregistered {
  long io_calls;  // the fake's io_calls when the last handle was deregistered
  int fd_open;    // its descriptor was still open on the registered file then
};
inline Deregistered last_deregister() {
  Deregistered d{};
  fake_symbol<void(long*, int*)>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_last_deregister")(&d.io_calls, &d.fd_open);
  return d;
}

inline std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace deepio::gputest
