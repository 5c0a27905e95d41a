// Tests that need a real GPU (and, for GDS proper, nvidia-fs). They skip with the reason
// where cuda() is null. Also the FakeEnv.* tests, run by the deepio_gpu_tests.fake_env ctest
// entry with DEEPIO_CUDA_LIBRARY / DEEPIO_CUFILE_LIBRARY pointing at the fakes: they check the
// process-wide loaders and the public GdsHandle constructor end to end.
#include <dlfcn.h>
#include <unistd.h>

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
  // The process-wide loader set cuFile's log file before opening the library (the user sets
  // no CUFILE_LOGFILE_PATH in this test's environment), out of the working directory.
  const char* log = std::getenv("CUFILE_LOGFILE_PATH");
  ASSERT_NE(log, nullptr) << "CUFILE_LOGFILE_PATH not set before libcufile was opened";
  EXPECT_EQ(std::string(log), cufile_log_path());
}

TEST(FakeEnv, PlainHandleMovesDeviceMemoryThroughCuFileByDefault) {
  // One handle type: a deepio::Handle with its default options (device_route Auto) over the
  // process-wide drivers takes cuFile for device memory, as a GdsHandle does; Staged never does.
  if (!fake_env()) GTEST_SKIP() << "run through ctest deepio_gpu_tests.fake_env";
  TempDir dir;
  const CudaApi* api = cuda(nullptr);
  ASSERT_NE(api, nullptr);
  deepio::gputest::CurrentContext ctx(api);
  const std::size_t n = 5 * 4096 + 3;
  const auto data = pattern(n, 22);
  CUdeviceptr d = 0;
  ASSERT_EQ(api->cuMemAlloc(&d, n), CUDA_SUCCESS);
  void* dev = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
  ASSERT_EQ(api->cuMemcpyHtoD(d, data.data(), n), CUDA_SUCCESS);
  for (const DeviceRouteMode route : {DeviceRouteMode::Auto, DeviceRouteMode::Staged}) {
    Handle h({.block_size = 4096, .device_route = route});
    const std::string f = dir.file(std::string(to_string(route)) + ".bin");
    EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
    EXPECT_EQ(slurp(f), data);
    const HandleStats s = h.stats();
    EXPECT_EQ(s.device_ops_completed, 1u);
    EXPECT_EQ(s.device_bytes_cufile, route == DeviceRouteMode::Auto ? n : 0u) << to_string(route);
    EXPECT_EQ(s.device_bytes_staged, route == DeviceRouteMode::Auto ? 0u : n) << to_string(route);
  }
  EXPECT_EQ(api->cuMemFree(d), CUDA_SUCCESS);
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
  deepio::gputest::CurrentContext ctx(api);  // the test's own copies need one; the handle keeps none
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

// On the real driver: GdsHandle's calls leave the calling thread's context as they found it
// (none, and device 0's primary context), cuCtxPushCurrent_v2/cuCtxPopCurrent_v2 resolve and
// behave as the fake's; managed memory is host memory; no cufile.log in the working directory.
TEST(RealGpu, ContextsRestoredManagedMemoryIsHostNoLogInTheWorkingDirectory) {
  NEED_GPU();
  const CudaApi* api = real_cuda();
  TempDir dir;
  const std::size_t n = (1 << 20) + 4097;
  const auto data = pattern(n, 99);
  auto current = [&] {
    CUcontext c = reinterpret_cast<CUcontext>(1);
    EXPECT_EQ(api->cuCtxGetCurrent(&c), CUDA_SUCCESS);
    return c;
  };
  CUcontext primary = nullptr;
  ASSERT_EQ(api->cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
  for (const bool with_context : {false, true}) {
    std::thread([&] {
      if (with_context) {
        ASSERT_EQ(api->cuCtxSetCurrent(primary), CUDA_SUCCESS);
      }
      const CUcontext mine = with_context ? primary : nullptr;
      {
        GdsHandle h({.block_size = 256 << 10, .intra_op_parallelism = 2});
        EXPECT_EQ(current(), mine) << "construction";
        void* p = h.new_pinned_device_buffer(n);
        EXPECT_EQ(current(), mine) << "new_pinned_device_buffer";
        {
          ScopedContext g;
          ASSERT_TRUE(ScopedContext::enter(api, primary, &g).ok());
          ASSERT_EQ(api->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(p), data.data(), n), CUDA_SUCCESS);
        }
        EXPECT_EQ(current(), mine) << "ScopedContext";
        const std::string f = dir.file(with_context ? "ctx1" : "ctx0");
        EXPECT_EQ(h.sync_pwrite(p, n, f, 0), 1u);
        EXPECT_EQ(current(), mine) << "sync_pwrite";
        EXPECT_EQ(slurp(f), data) << h.mode_reason();
        EXPECT_EQ(h.sync_pread(p, n, f, 0), 1u);
        EXPECT_EQ(current(), mine) << "sync_pread";
        EXPECT_TRUE(h.unpin_device_buffer(p));
        EXPECT_EQ(current(), mine) << "unpin";
        EXPECT_TRUE(h.pin_device_buffer(p, n));
        EXPECT_EQ(current(), mine) << "pin";
        EXPECT_TRUE(h.free_pinned_device_buffer(p));
        EXPECT_EQ(current(), mine) << "free_pinned_device_buffer";
        std::printf("[ mode %s ] %s\n[ stats ] files_fallback %llu registrations_skipped %llu io_fallbacks %llu\n",
                    h.mode().c_str(), h.mode_reason().c_str(),
                    static_cast<unsigned long long>(h.gds_stats().files_fallback),
                    static_cast<unsigned long long>(h.gds_stats().registrations_skipped),
                    static_cast<unsigned long long>(h.gds_stats().io_fallbacks));
      }
      EXPECT_EQ(current(), mine) << "destruction";
      if (with_context) {
        EXPECT_EQ(api->cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
      }
    }).join();
  }
  EXPECT_EQ(::access("cufile.log", F_OK), -1) << "cuFile wrote cufile.log into the working directory";
  const std::string log = cufile_log_path();
  std::printf("[ cufile log ] %s %s\n", log.c_str(), ::access(log.c_str(), F_OK) == 0 ? "exists" : "absent");

  // Managed memory (small: never more than the card has free) is host memory to deepio.
  void* libcuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto* alloc_managed = libcuda != nullptr ? reinterpret_cast<CUresult (*)(CUdeviceptr*, std::size_t, unsigned int)>(
                                                 ::dlsym(libcuda, "cuMemAllocManaged"))
                                           : nullptr;
  if (alloc_managed != nullptr) {
    deepio::gputest::CurrentContext ctx(api);
    CUdeviceptr m = 0;
    ASSERT_EQ(alloc_managed(&m, 1 << 20, 1 /* CU_MEM_ATTACH_GLOBAL */), CUDA_SUCCESS);
    void* mp = reinterpret_cast<void*>(static_cast<std::uintptr_t>(m));
    unsigned int type = 0;
    EXPECT_EQ(api->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m), CUDA_SUCCESS);
    std::printf("[ managed ] MEMORY_TYPE %u\n", type);
    EXPECT_TRUE(is_managed(api, mp));
    EXPECT_FALSE(classify(mp).is_device);
    std::memcpy(mp, data.data(), 1 << 20);  // host-addressable
    GdsHandle h;
    const std::string f = dir.file("managed");
    EXPECT_EQ(h.sync_pwrite(mp, 1 << 20, f, 0), 1u);
    EXPECT_EQ(h.gds_stats().ops_completed, 0u);
    EXPECT_EQ(slurp(f), std::vector<std::byte>(data.begin(), data.begin() + (1 << 20)));
    EXPECT_EQ(api->cuMemFree(m), CUDA_SUCCESS);
  }
  if (libcuda != nullptr) ::dlclose(libcuda);
  EXPECT_EQ(api->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

INSTANTIATE_TEST_SUITE_P(Modes, RealGds, ::testing::Values(GdsMode::Auto, GdsMode::Compat), [](const auto& param_info) {
  return param_info.param == GdsMode::Auto ? std::string("Auto") : std::string("Compat");
});

}  // namespace
