// The CUDA loader against a fake driver (host memory posing as device memory).
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include <thread>

#include <gtest/gtest.h>

#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio::detail::gpu;
using deepio::gputest::fake_symbol;

void fake_set_result(const char* name, CUresult r, int after) {
  fake_symbol<void(const char*, CUresult, int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_result")(name, r, after);
}
void fake_device_count(int n) { fake_symbol<void(int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_device_count")(n); }

class FakeCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    deepio::detail::Status why;
    api_ = load_cuda(DEEPIO_FAKE_CUDA, &why);
    ASSERT_NE(api_, nullptr) << why.message;
    fake_set_result(nullptr, 0, 0);
    fake_device_count(1);
  }
  void TearDown() override {
    fake_set_result(nullptr, 0, 0);
    fake_device_count(1);
  }
  std::unique_ptr<CudaApi> api_;
};

// Like the real driver, the fake refuses memory calls on a thread with no current context
// (what the staging test missed before a GPU machine ran it: CUDA_ERROR_INVALID_CONTEXT).
TEST_F(FakeCuda, MemoryCallsNeedACurrentContextLikeTheRealDriver) {
  CUdeviceptr d = 0;
  EXPECT_EQ(api_->cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_NE(cuda_error_text(api_.get(), CUDA_ERROR_INVALID_CONTEXT).find("CUDA_ERROR_INVALID_CONTEXT"),
            std::string::npos);
  deepio::gputest::CurrentContext ctx(api_.get());
  ASSERT_EQ(api_->cuMemAlloc(&d, 64), CUDA_SUCCESS);
  std::thread([&] {
    std::vector<char> host(64);
    EXPECT_EQ(api_->cuMemcpyDtoH(host.data(), d, 64), CUDA_ERROR_INVALID_CONTEXT) << "the context is per thread";
  }).join();
  EXPECT_EQ(api_->cuMemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeCuda, LoadsVersionedSymbolsAndCountsDevices) {
  EXPECT_EQ(api_->library, DEEPIO_FAKE_CUDA);
  EXPECT_EQ(api_->driver_version, 12040);
  EXPECT_EQ(api_->device_count, 1);
  EXPECT_NE(api_->cuMemAlloc, nullptr);
  EXPECT_NE(api_->cuMemcpyHtoDAsync, nullptr);
  EXPECT_NE(api_->cuDevicePrimaryCtxRelease, nullptr);
}

TEST_F(FakeCuda, DriverWithoutV2SymbolsIsRefusedNamingTheSymbol) {
  deepio::detail::Status why;
  EXPECT_EQ(load_cuda(DEEPIO_FAKE_CUDA_OLD, &why), nullptr);
  EXPECT_EQ(why.errnum, ENOTSUP);
  EXPECT_NE(why.message.find("_v2"), std::string::npos) << why.message;
  EXPECT_NE(why.message.find(DEEPIO_FAKE_CUDA_OLD), std::string::npos) << why.message;
}

TEST_F(FakeCuda, CuInitFailureIsENODEVWithTheDriversText) {
  fake_set_result("cuInit", CUDA_ERROR_NO_DEVICE, 0);
  deepio::detail::Status why;
  EXPECT_EQ(load_cuda(DEEPIO_FAKE_CUDA, &why), nullptr);
  EXPECT_EQ(why.errnum, ENODEV);
  EXPECT_NE(why.message.find("cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"),
            std::string::npos)
      << why.message;
}

TEST_F(FakeCuda, ZeroDevicesIsENODEV) {
  fake_device_count(0);
  deepio::detail::Status why;
  EXPECT_EQ(load_cuda(DEEPIO_FAKE_CUDA, &why), nullptr);
  EXPECT_EQ(why.errnum, ENODEV);
  EXPECT_NE(why.message.find("no CUDA device"), std::string::npos) << why.message;
}

TEST_F(FakeCuda, ClassifyTellsDeviceFromHostMemory) {
  deepio::gputest::CurrentContext ctx(api_.get());
  CUdeviceptr d = 0;
  ASSERT_EQ(api_->cuMemAlloc(&d, 4096), CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
  EXPECT_TRUE(classify(api_.get(), p).is_device);
  EXPECT_EQ(classify(api_.get(), p).ordinal, 0);
  EXPECT_TRUE(classify(api_.get(), static_cast<char*>(p) + 4095).is_device);  // a view
  std::vector<char> host(64);
  EXPECT_FALSE(classify(api_.get(), host.data()).is_device);
  // Registered host memory is CUDA-known but not device memory.
  ASSERT_EQ(api_->cuMemHostRegister(host.data(), host.size(), CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
  EXPECT_FALSE(classify(api_.get(), host.data()).is_device);
  EXPECT_EQ(api_->cuMemHostUnregister(host.data()), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuMemFree(d), CUDA_SUCCESS);
  EXPECT_FALSE(classify(api_.get(), p).is_device);
}

// Managed memory reports MEMORY_TYPE DEVICE (as with the real driver) but is host-addressable:
// deepio classifies it as host memory, so it is read and written in place, never staged.
TEST_F(FakeCuda, ClassifySaysManagedMemoryIsHostMemory) {
  deepio::gputest::CurrentContext ctx(api_.get());
  auto alloc_managed = fake_symbol<CUresult(CUdeviceptr*, std::size_t, unsigned int)>(DEEPIO_FAKE_CUDA,
                                                                                      "cuMemAllocManaged");
  CUdeviceptr d = 0;
  ASSERT_EQ(alloc_managed(&d, 4096, 1 /* CU_MEM_ATTACH_GLOBAL */), CUDA_SUCCESS);
  unsigned int type = 0;
  ASSERT_EQ(api_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE) << "the fake reports managed memory as the driver does";
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
  EXPECT_FALSE(classify(api_.get(), p).is_device);
  EXPECT_EQ(classify(api_.get(), p).ordinal, -1);
  EXPECT_FALSE(classify(api_.get(), static_cast<char*>(p) + 100).is_device);
  CUdeviceptr plain = 0;
  ASSERT_EQ(api_->cuMemAlloc(&plain, 64), CUDA_SUCCESS);
  EXPECT_TRUE(classify(api_.get(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(plain))).is_device);
  EXPECT_EQ(api_->cuMemFree(plain), CUDA_SUCCESS);
  EXPECT_EQ(api_->cuMemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeCuda, CopiesStreamsAndEventsThroughTheShim) {
  deepio::gputest::CurrentContext ctx(api_.get());
  CUdeviceptr d = 0;
  ASSERT_EQ(api_->cuMemAlloc(&d, 256), CUDA_SUCCESS);
  const auto src = deepio::gputest::pattern(256, 7);
  std::vector<std::byte> back(256);
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(api_->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuMemcpyHtoDAsync(d, src.data(), src.size(), s), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuEventRecord(e, s), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(api_->cuEventQuery(e), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuMemcpyDtoHAsync(back.data(), d, back.size(), s), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(back, src);
  EXPECT_EQ(api_->cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(api_->cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(api_->cuMemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeCuda, CudaStatusUsesTheDriversNames) {
  const auto st = cuda_status(api_.get(), CUDA_ERROR_ILLEGAL_ADDRESS, "cuMemcpyHtoDAsync");
  EXPECT_EQ(st.errnum, EIO);
  EXPECT_EQ(st.message,
            "cuMemcpyHtoDAsync: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered (fake))");
}

TEST(FakeCuFileLoader, LoadsAndPrefersTheV2Close) {
  deepio::detail::Status why;
  auto api = load_cufile(DEEPIO_FAKE_CUFILE, &why);
  ASSERT_NE(api, nullptr) << why.message;
  EXPECT_TRUE(api->close_is_v2);
  EXPECT_NE(api->cuFileDriverGetProperties, nullptr);
  EXPECT_NE(api->cuFileDriverSetMaxDirectIOSize, nullptr);
  EXPECT_EQ(api->cuFileGetVersion, nullptr);  // optional, absent from the fake
}

TEST(FakeCuFileLoader, ACudaDriverIsNotACuFileLibrary) {
  deepio::detail::Status why;
  EXPECT_EQ(load_cufile(DEEPIO_FAKE_CUDA, &why), nullptr);
  EXPECT_EQ(why.errnum, ENOTSUP);
  EXPECT_NE(why.message.find("lacks cuFileDriverOpen"), std::string::npos) << why.message;
}

}  // namespace
