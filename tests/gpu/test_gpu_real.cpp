// Tests that need a real GPU (and, for GDS proper, nvidia-fs). They skip with the reason
// where cuda() is null. Also the FakeEnv.* tests, run by the deepio_gpu_tests.fake_env ctest
// entry with DEEPIO_CUDA_LIBRARY / DEEPIO_CUFILE_LIBRARY pointing at the fakes: they check the
// process-wide loaders and the public GdsHandle constructor end to end.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;
using deepio::gputest::pattern;
using deepio::gputest::put;
using deepio::gputest::slurp;
using deepio::gputest::TempDir;

// ---- FakeEnv: process-wide loaders pointed at the fakes ----

bool fake_env() {
  const char* v = std::getenv("DEEPIO_CUDA_LIBRARY");
  return v != nullptr && std::string(v) == DEEPIO_FAKE_CUDA;
}

TEST(FakeEnv, LoadersHonourTheEnvironment) {
  if (!fake_env()) GTEST_SKIP() << "run through ctest deepio_gpu_tests.fake_env";
  deepio::detail::Status why;
  const CudaApi* api = cuda(&why);
  ASSERT_NE(api, nullptr) << why.message;
  EXPECT_EQ(api->library, DEEPIO_FAKE_CUDA);
  ASSERT_NE(cufile(&why), nullptr) << why.message;
  const GpuInfo info = gpu_info();
  EXPECT_TRUE(info.cuda_found);
  EXPECT_EQ(info.driver_version, 12040);
  EXPECT_EQ(info.device_count, 1);
  EXPECT_TRUE(info.cufile_found);
  EXPECT_EQ(info.cufile_library, DEEPIO_FAKE_CUFILE);
}

TEST(FakeEnv, PublicGdsHandleRoundTrip) {
  if (!fake_env()) GTEST_SKIP() << "run through ctest deepio_gpu_tests.fake_env";
  TempDir dir;
  GdsHandle h({.block_size = 4096, .intra_op_parallelism = 2});
  EXPECT_EQ(h.mode(), "gds") << h.mode_reason();
  const GpuInfo while_open = gpu_info();
  EXPECT_EQ(while_open.gds_mode, "gds") << while_open.gds_reason;  // driver open: properties read
  const std::size_t n = 10 * 4096 + 17;
  void* dev = h.new_pinned_device_buffer(n);
  const auto data = pattern(n, 21);
  const CudaApi* api = cuda(nullptr);
  {
    // The handle leaves the thread's context as it found it (none): the copy holds its own.
    CUcontext current = nullptr;
    EXPECT_EQ(api->cuCtxGetCurrent(&current), CUDA_SUCCESS);
    EXPECT_EQ(current, nullptr);
    deepio::gputest::CurrentContext ctx(api);
    ASSERT_EQ(api->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  }
  EXPECT_TRUE(classify(dev).is_device);
  const std::string f = dir.file("env.bin");
  EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
  EXPECT_EQ(slurp(f), data);
  EXPECT_EQ(h.gds_stats().bytes_cufile, n);
  EXPECT_TRUE(h.free_pinned_device_buffer(dev));
}

// ---- Real GPU ----

const CudaApi* real_cuda() {
  if (fake_env()) return nullptr;
  return cuda(nullptr);
}

#define NEED_GPU()                                                                         \
  do {                                                                                     \
    deepio::detail::Status why_;                                                           \
    if (fake_env() || cuda(&why_) == nullptr)                                              \
      GTEST_SKIP() << "needs a CUDA GPU: " << (fake_env() ? "fake driver" : why_.message); \
  } while (0)

TEST(RealGpu, InfoReportsTheDriver) {
  NEED_GPU();
  const GpuInfo info = gpu_info();
  EXPECT_TRUE(info.cuda_found);
  EXPECT_GT(info.driver_version, 0);
  EXPECT_GT(info.device_count, 0);
  EXPECT_NE(info.gds_mode, "unavailable");
}

TEST(RealGpu, ClassifyDeviceAndHostMemory) {
  NEED_GPU();
  const CudaApi* api = real_cuda();
  CUcontext ctx = nullptr;
  ASSERT_EQ(api->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ(api->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  ASSERT_EQ(api->cuMemAlloc(&d, 1 << 20), CUDA_SUCCESS);
  void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
  EXPECT_TRUE(classify(p).is_device);
  EXPECT_EQ(classify(p).ordinal, 0);
  EXPECT_TRUE(classify(static_cast<char*>(p) + 12345).is_device);
  bool other_thread = false;  // a thread with no context current (the engine's workers)
  std::thread([&] { other_thread = classify(p).is_device; }).join();
  EXPECT_TRUE(other_thread);
  std::vector<char> host(4096);
  EXPECT_FALSE(classify(host.data()).is_device);
  EXPECT_EQ(api->cuMemFree(d), CUDA_SUCCESS);
  EXPECT_EQ(api->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

// DeepNVMe's GDS checklist (deepnvme.md §5.2) in C++: block 256 KiB, parallelism 2, 1 MiB I/O,
// plus sizes that are not multiples of the block and views into registered buffers.
class RealGds : public ::testing::TestWithParam<GdsMode> {};

TEST_P(RealGds, WriteThenReadBackThroughPinnedAndUnpinnedBuffers) {
  NEED_GPU();
  const CudaApi* api = real_cuda();
  TempDir dir;
  GdsHandle h({.block_size = 256 << 10, .queue_depth = 2, .intra_op_parallelism = 2, .mode = GetParam()});
  for (const std::size_t n : {std::size_t{1} << 20, (std::size_t{1} << 20) + 4097, std::size_t{777}}) {
    const auto data = pattern(n, static_cast<std::uint32_t>(n));
    void* src = h.new_pinned_device_buffer(n);
    ASSERT_EQ(api->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(src), data.data(), n), CUDA_SUCCESS);
    const std::string f = dir.file("r" + std::to_string(n));
    EXPECT_EQ(h.sync_pwrite(src, n, f, 0), 1u);
    EXPECT_EQ(slurp(f), data) << "mode " << h.mode() << ": " << h.mode_reason();

    CUdeviceptr dst = 0;  // unpinned destination
    ASSERT_EQ(api->cuMemAlloc(&dst, n), CUDA_SUCCESS);
    h.async_pread(reinterpret_cast<void*>(static_cast<std::uintptr_t>(dst)), n, f, 0);
    EXPECT_EQ(h.wait(), 1u);
    std::vector<std::byte> back(n);
    ASSERT_EQ(api->cuMemcpyDtoH(back.data(), dst, n), CUDA_SUCCESS);
    EXPECT_EQ(back, data);

    // A view into the pinned buffer at an offset, from a file offset.
    if (n > 8192) {
      std::vector<std::byte> zero(n);
      ASSERT_EQ(api->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(src), zero.data(), n), CUDA_SUCCESS);
      EXPECT_EQ(h.sync_pread(static_cast<char*>(src) + 4096, n - 8192, f, 4096), 1u);
      ASSERT_EQ(api->cuMemcpyDtoH(back.data(), reinterpret_cast<std::uintptr_t>(src), n), CUDA_SUCCESS);
      EXPECT_EQ(std::memcmp(back.data() + 4096, data.data() + 4096, n - 8192), 0);
    }
    EXPECT_EQ(api->cuMemFree(dst), CUDA_SUCCESS);
    EXPECT_TRUE(h.free_pinned_device_buffer(src));
  }
  std::printf("[ mode %s ] %s\n", h.mode().c_str(), h.mode_reason().c_str());
}

INSTANTIATE_TEST_SUITE_P(Modes, RealGds, ::testing::Values(GdsMode::Auto, GdsMode::Compat), [](const auto& param_info) {
  return param_info.param == GdsMode::Auto ? std::string("Auto") : std::string("Compat");
});

}  // namespace
