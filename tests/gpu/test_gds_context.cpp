// Context hygiene of GdsHandle over the fake CUDA driver with two devices: every public call
// made on a user's thread leaves that thread's current CUDA context as it found it (device 0's,
// or none), even when it works on device 1's memory and when it fails; the handle releases
// exactly the primary contexts it retained.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/gpu.hpp"
#include "engine/gds.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;
using deepio::gputest::fake_symbol;
using deepio::gputest::pattern;
using deepio::gputest::put;
using deepio::gputest::slurp;
using deepio::gputest::TempDir;

template <typename... A>
void cufile_control(const char* name, A... args) {
  fake_symbol<void(A...)>(DEEPIO_FAKE_CUFILE, name)(args...);
}
void cuda_fail(const char* name, CUresult r, int after) {
  fake_symbol<void(const char*, CUresult, int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_result")(name, r, after);
}
int context_refs(int device) {
  return fake_symbol<int(int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_context_refs")(device);
}
// Sets the fake's device count before the driver is loaded: the library is kept mapped first
// (fake_symbol drops its own reference, which would unload a library nothing else holds).
void fake_device_count(int n) {
  static void* const keep = ::dlopen(DEEPIO_FAKE_CUDA, RTLD_NOW | RTLD_LOCAL);  // never closed
  ASSERT_NE(keep, nullptr) << ::dlerror();
  fake_symbol<void(int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_device_count")(n);
}
int context_depth() { return fake_symbol<int()>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_context_depth")(); }

// How a GdsHandle reaches files in one run of the scenario.
enum class Path { CuFile, Refused, NoCuFile };

class GdsContext : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    fake_device_count(2);
    cuda_fail(nullptr, 0, 0);
    deepio::detail::Status why;
    cuda_ = load_cuda(DEEPIO_FAKE_CUDA, &why);
    ASSERT_NE(cuda_, nullptr) << why.message;
    ASSERT_EQ(cuda_->device_count, 2);
    cufile_ = load_cufile(DEEPIO_FAKE_CUFILE, &why);
    ASSERT_NE(cufile_, nullptr) << why.message;
    cufile_control("deepio_fake_cufile_reset");
    if (GetParam() == Path::Refused) cufile_control("deepio_fake_cufile_fail_register", CU_FILE_HANDLE_NOT_REGISTERED);
    for (int d = 0; d < 2; ++d) {
      CUdevice dev = 0;
      ASSERT_EQ(cuda_->cuDeviceGet(&dev, d), CUDA_SUCCESS);
      ASSERT_EQ(cuda_->cuDevicePrimaryCtxRetain(&ctx_[d], dev), CUDA_SUCCESS);
      refs_before_[d] = context_refs(d);
    }
    ASSERT_NE(ctx_[0], ctx_[1]) << "the fake must give each device its own primary context";
  }
  void TearDown() override {
    cuda_fail(nullptr, 0, 0);
    cufile_control("deepio_fake_cufile_reset");
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(context_refs(d), refs_before_[d]) << "device " << d << ": a retained context was not released";
      (void)cuda_->cuDevicePrimaryCtxRelease(d);
    }
    fake_device_count(1);
  }

  GdsHandle handle(GdsOptions o = {}) {
    const bool with_cufile = GetParam() != Path::NoCuFile;
    return make_gds_handle(o, cuda_.get(), {}, with_cufile ? cufile_.get() : nullptr,
                           deepio::detail::Status::failure(ENOTSUP, "cuFile not found: test"));
  }
  // Device-1 memory, allocated with device 1's context pushed on this (the test's) thread.
  std::byte* alloc_on_1(const std::vector<std::byte>& data) {
    EXPECT_EQ(cuda_->cuCtxPushCurrent(ctx_[1]), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    EXPECT_EQ(cuda_->cuMemAlloc(&d, data.size()), CUDA_SUCCESS);
    EXPECT_EQ(cuda_->cuMemcpyHtoD(d, data.data(), data.size()), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    EXPECT_EQ(cuda_->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(d));
  }
  void free_on_1(void* p) {
    EXPECT_EQ(cuda_->cuCtxPushCurrent(ctx_[1]), CUDA_SUCCESS);
    EXPECT_EQ(cuda_->cuMemFree(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p))), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    EXPECT_EQ(cuda_->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  CUcontext current() const {
    CUcontext c = nullptr;
    EXPECT_EQ(cuda_->cuCtxGetCurrent(&c), CUDA_SUCCESS);
    return c;
  }

  // Every public GdsHandle call on device-1 memory, from the calling thread, checking after
  // each one that the thread's context is still `mine` (nullptr: none).
  void every_call(CUcontext mine) {
    const int depth = context_depth();
    auto same = [&](const char* after) {
      EXPECT_EQ(current(), mine) << "after " << after;
      EXPECT_EQ(context_depth(), depth) << "after " << after << ": context stack changed";
    };
    const std::size_t n = 3 * 4096 + 100;
    const auto data = pattern(n, 7);
    std::byte* plain = alloc_on_1(data);  // an unpinned device-1 buffer
    {
      auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
      same("construction");
      const std::string f = dir_.file("ctx.bin");
      EXPECT_EQ(h.sync_pwrite(plain, n, f, 0), 1u);
      same("sync_pwrite");
      EXPECT_EQ(slurp(f), data);

      void* pinned = h.new_pinned_device_buffer(n, 1);
      same("new_pinned_device_buffer");
      EXPECT_EQ(classify(cuda_.get(), pinned).ordinal, 1) << "allocated on the device asked for";
      EXPECT_EQ(h.sync_pread(pinned, n, f, 0), 1u);
      same("sync_pread into a pinned buffer");
      EXPECT_EQ(std::memcmp(pinned, data.data(), n), 0);
      h.async_pwrite(pinned, n, f, 0);
      same("async_pwrite");
      EXPECT_EQ(h.wait(), 1u);
      same("wait");
      EXPECT_TRUE(h.free_pinned_device_buffer(pinned));
      same("free_pinned_device_buffer");

      EXPECT_TRUE(h.pin_device_buffer(plain, n));
      same("pin_device_buffer");
      h.async_pread(plain + 100, 4000, f, 100);
      EXPECT_EQ(h.wait(), 1u);
      same("async_pread + wait on a view of a pinned buffer");
      EXPECT_TRUE(h.unpin_device_buffer(plain));
      same("unpin_device_buffer");
      EXPECT_FALSE(h.unpin_device_buffer(plain));
      same("unpin_device_buffer of an unpinned buffer");

      // Failures leave the thread as they found it too.
      cuda_fail("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY, 0);
      EXPECT_THROW((void)h.new_pinned_device_buffer(n, 1), Error);
      same("a failed new_pinned_device_buffer");
      EXPECT_THROW((void)h.new_pinned_device_buffer(n, 7), Error);
      same("new_pinned_device_buffer on a device that does not exist");
      EXPECT_THROW((void)h.pin_device_buffer(plain, 0), Error);
      same("a refused pin_device_buffer");

      EXPECT_TRUE(h.pin_device_buffer(plain, n));  // left pinned: the destructor deregisters it
      same("pin_device_buffer");
    }
    same("destruction with a buffer still pinned");
    free_on_1(plain);
  }

  std::unique_ptr<CudaApi> cuda_;
  std::unique_ptr<CuFileApi> cufile_;
  CUcontext ctx_[2] = {nullptr, nullptr};
  int refs_before_[2] = {0, 0};
  TempDir dir_;
};

TEST_P(GdsContext, AThreadOnDevice0KeepsItsContext) {
  std::thread([&] {
    ASSERT_EQ(cuda_->cuCtxSetCurrent(ctx_[0]), CUDA_SUCCESS);
    every_call(ctx_[0]);
    EXPECT_EQ(cuda_->cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  }).join();
}

TEST_P(GdsContext, AThreadWithoutAContextIsLeftWithout) {
  std::thread([&] {
    ASSERT_EQ(current(), nullptr);
    every_call(nullptr);
  }).join();
}

TEST_P(GdsContext, AThreadWithPushedContextsKeepsItsStack) {
  std::thread([&] {
    ASSERT_EQ(cuda_->cuCtxPushCurrent(ctx_[1]), CUDA_SUCCESS);
    ASSERT_EQ(cuda_->cuCtxPushCurrent(ctx_[0]), CUDA_SUCCESS);
    every_call(ctx_[0]);
    CUcontext popped = nullptr;
    EXPECT_EQ(cuda_->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, ctx_[0]);
    EXPECT_EQ(cuda_->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, ctx_[1]);
  }).join();
}

INSTANTIATE_TEST_SUITE_P(Paths, GdsContext, ::testing::Values(Path::CuFile, Path::Refused, Path::NoCuFile),
                         [](const ::testing::TestParamInfo<Path>& i) {
                           switch (i.param) {
                             case Path::CuFile: return std::string("CuFile");
                             case Path::Refused: return std::string("RegistrationRefused");
                             case Path::NoCuFile: return std::string("NoCuFile");
                           }
                           return std::string("unknown");
                         });

// The fake itself: a context stack per thread, allocations owned by the current device.
TEST(FakeCudaContexts, PushPopSetAndAllocationOwnership) {
  fake_device_count(2);
  deepio::detail::Status why;
  auto api = load_cuda(DEEPIO_FAKE_CUDA, &why);
  ASSERT_NE(api, nullptr) << why.message;
  std::thread([&] {
    CUcontext c[2];
    for (int d = 0; d < 2; ++d) ASSERT_EQ(api->cuDevicePrimaryCtxRetain(&c[d], d), CUDA_SUCCESS);
    CUcontext cur = nullptr;
    CUcontext popped = nullptr;
    EXPECT_EQ(api->cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT) << "nothing to pop";
    ASSERT_EQ(api->cuCtxPushCurrent(c[1]), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    ASSERT_EQ(api->cuMemAlloc(&d, 64), CUDA_SUCCESS);
    int ordinal = -1;
    EXPECT_EQ(api->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    CUcontext owner = nullptr;
    EXPECT_EQ(api->cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d), CUDA_SUCCESS);
    EXPECT_EQ(owner, c[1]);
    ASSERT_EQ(api->cuCtxSetCurrent(c[0]), CUDA_SUCCESS);  // replaces the top
    EXPECT_EQ(api->cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_EQ(cur, c[0]);
    EXPECT_EQ(api->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, c[0]);
    EXPECT_EQ(api->cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_EQ(cur, nullptr);
    ASSERT_EQ(api->cuCtxPushCurrent(c[0]), CUDA_SUCCESS);
    EXPECT_EQ(api->cuMemFree(d), CUDA_SUCCESS);
    EXPECT_EQ(api->cuCtxSetCurrent(nullptr), CUDA_SUCCESS);  // pops
    EXPECT_EQ(context_depth(), 0);
    for (int k = 0; k < 2; ++k) EXPECT_EQ(api->cuDevicePrimaryCtxRelease(k), CUDA_SUCCESS);
  }).join();
  fake_device_count(1);
}

// ScopedContext: pushes only when needed and restores on destruction.
TEST(FakeCudaContexts, ScopedContextRestoresTheThreadsContext) {
  fake_device_count(2);
  deepio::detail::Status why;
  auto api = load_cuda(DEEPIO_FAKE_CUDA, &why);
  ASSERT_NE(api, nullptr) << why.message;
  std::thread([&] {
    CUcontext c[2];
    for (int d = 0; d < 2; ++d) ASSERT_EQ(api->cuDevicePrimaryCtxRetain(&c[d], d), CUDA_SUCCESS);
    CUcontext cur = nullptr;
    {
      ScopedContext g;
      ASSERT_TRUE(ScopedContext::enter(api.get(), c[1], &g).ok());
      EXPECT_EQ(api->cuCtxGetCurrent(&cur), CUDA_SUCCESS);
      EXPECT_EQ(cur, c[1]);
      {
        ScopedContext same;  // already current: nothing pushed
        ASSERT_TRUE(ScopedContext::enter(api.get(), c[1], &same).ok());
        EXPECT_EQ(context_depth(), 1);
      }
      EXPECT_EQ(context_depth(), 1);
    }
    EXPECT_EQ(api->cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_EQ(cur, nullptr);
    EXPECT_EQ(context_depth(), 0);
    cuda_fail("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT, 0);
    ScopedContext refused;
    EXPECT_FALSE(ScopedContext::enter(api.get(), c[0], &refused).ok());
    EXPECT_EQ(context_depth(), 0);
    for (int k = 0; k < 2; ++k) EXPECT_EQ(api->cuDevicePrimaryCtxRelease(k), CUDA_SUCCESS);
  }).join();
  cuda_fail(nullptr, 0, 0);
  fake_device_count(1);
}

}  // namespace
