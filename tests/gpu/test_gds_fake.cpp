// deepio::GdsHandle over the fake CUDA driver and fake libcufile: chunking and parallelism,
// the registration cache, the driver reference count, error paths and the compat fallback,
// file objects' one cuFile registration each.
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"
#include "engine/cuda_stager.hpp"
#include "engine/engine.hpp"
#include "engine/gds.hpp"
#include "engine/handle_access.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;
using deepio::gputest::fake_symbol;
using deepio::gputest::pattern;
using deepio::gputest::put;
using deepio::gputest::slurp;
using deepio::gputest::TempDir;

struct FakeStats {
  long opens, closes, refs, io_calls, max_io, max_concurrency, buffers, handles;
};

FakeStats fake_stats() {
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
    cuda_ = load_cuda(DEEPIO_FAKE_CUDA, &why);
    ASSERT_NE(cuda_, nullptr) << why.message;
    cufile_ = load_cufile(DEEPIO_FAKE_CUFILE, &why);
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
    return make_gds_handle(o, cuda_.get(), {}, with_cufile ? cufile_.get() : nullptr,
                           deepio::detail::Status::failure(ENOTSUP, "cuFile not found: test"));
  }
  std::byte* device_alloc(std::size_t n) {
    CUdeviceptr d = 0;
    EXPECT_EQ(cuda_->cuMemAlloc(&d, n), CUDA_SUCCESS);
    return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(d));
  }
  void device_free(void* p) {
    EXPECT_EQ(cuda_->cuMemFree(static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p))), CUDA_SUCCESS);
  }
  std::unique_ptr<CudaApi> cuda_;
  std::unique_ptr<CuFileApi> cufile_;
  std::unique_ptr<deepio::gputest::CurrentContext> ctx_;
  TempDir dir_;
  int live_before_ = 0;
};

TEST_F(FakeGds, RoundTripSplitsIntoParallelBlockSizedChunks) {
  control("deepio_fake_cufile_delay_us", 20000u);
  auto h = handle({.block_size = 64 << 10, .intra_op_parallelism = 4});
  EXPECT_EQ(h.mode(), "gds") << h.mode_reason();
  const std::size_t n = 5 * (64 << 10) + 123;  // not a multiple of the chunk
  const auto data = pattern(n, 1);
  std::byte* dev = device_alloc(n);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("a.bin");
  h.async_pwrite(dev, n, f, 0);
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(slurp(f), data);
  auto s = fake_stats();
  EXPECT_EQ(s.io_calls, 6);
  EXPECT_EQ(s.max_io, 64 << 10);
  EXPECT_GE(s.max_concurrency, 2);
  EXPECT_EQ(s.handles, 0) << "file handle not deregistered";

  std::byte* back = device_alloc(n);
  EXPECT_EQ(h.sync_pread(back, n, f, 0), 1u);
  EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
  const auto st = h.gds_stats();
  EXPECT_EQ(st.ops_completed, 2u);
  EXPECT_EQ(st.bytes_cufile, 2 * n);
  EXPECT_EQ(st.bytes_staged, 0u);
  EXPECT_EQ(st.chunks, 12u);
  EXPECT_EQ(fake_symbol<std::size_t()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_max_direct_kib")(), 64u);
  device_free(dev);
  device_free(back);
}

TEST_F(FakeGds, FileOffsetsWritesDoNotTruncateAndWaitCounts) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::string f = dir_.file("b.bin");
  const auto base = pattern(20000, 2);
  put(f, base);
  const auto patch = pattern(5000, 3);
  std::byte* dev = device_alloc(5000);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), patch.data(), 5000), CUDA_SUCCESS);
  EXPECT_EQ(h.wait(), 0u);
  h.async_pwrite(dev, 5000, f, 7001);
  h.async_pwrite(dev, 0, f, 0);  // an empty op still counts
  EXPECT_EQ(h.wait(), 2u);
  auto expect = base;
  std::memcpy(expect.data() + 7001, patch.data(), 5000);
  EXPECT_EQ(slurp(f), expect);
  device_free(dev);
}

TEST_F(FakeGds, PinnedBuffersAreUsedByBaseAndOffsetAndRangeChecked) {
  auto h = handle({.block_size = 1000});
  const std::size_t n = 8192;
  std::byte* dev = device_alloc(n);
  ASSERT_TRUE(h.pin_device_buffer(dev, n));
  EXPECT_TRUE(h.pin_device_buffer(dev, n));  // same registration: no-op
  EXPECT_EQ(fake_stats().buffers, 1);
  const std::string f = dir_.file("c.bin");
  const auto data = pattern(n, 4);
  put(f, data);
  // A view inside the pinned buffer: cuFile gets the base and an offset. The request is cut
  // at the first page boundary (a block_size below a page becomes one page).
  ASSERT_EQ(h.sync_pread(dev + 100, 8000, f, 100), 1u);
  std::uintptr_t last_base = 0;
  long last_off = 0;
  fake_symbol<void(std::uintptr_t*, long*)>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_last_io")(&last_base, &last_off);
  EXPECT_EQ(last_base, reinterpret_cast<std::uintptr_t>(dev));
  EXPECT_EQ(last_off, 4096);  // the second request: [4096, 8100) of the file and of the buffer
  EXPECT_EQ(std::memcmp(dev + 100, data.data() + 100, 8000), 0);
  // Crossing the end of the registration is refused at submission (DeepNVMe did not check).
  try {
    h.async_pread(dev + 8000, 500, f, 0);
    ADD_FAILURE() << "accepted a range past the pinned buffer";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_NE(e.message().find("crosses the end of pinned buffer"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), f);
  }
  EXPECT_THROW(h.pin_device_buffer(dev + 4096, 100), Error);  // overlaps
  std::vector<char> host(64);
  try {
    h.pin_device_buffer(host.data(), host.size());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
  }
  EXPECT_FALSE(h.unpin_device_buffer(dev + 1));
  EXPECT_TRUE(h.unpin_device_buffer(dev));
  EXPECT_FALSE(h.unpin_device_buffer(dev));
  EXPECT_EQ(fake_stats().buffers, 0);
  device_free(dev);
}

TEST_F(FakeGds, UnpinWhileInFlightIsEBUSY) {
  control("deepio_fake_cufile_delay_us", 100000u);
  auto h = handle({.block_size = 4096});
  std::byte* dev = device_alloc(4096);
  ASSERT_TRUE(h.pin_device_buffer(dev, 4096));
  const std::string f = dir_.file("busy.bin");
  put(f, pattern(4096, 13));
  h.async_pread(dev, 4096, f, 0);
  try {
    h.unpin_device_buffer(dev);
    ADD_FAILURE() << "unpinned a buffer under I/O";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EBUSY);
  }
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_TRUE(h.unpin_device_buffer(dev));
  device_free(dev);
}

TEST_F(FakeGds, NewAndFreePinnedDeviceBuffer) {
  auto h = handle();
  void* p = h.new_pinned_device_buffer(1 << 16);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(classify(cuda_.get(), p).is_device);
  EXPECT_EQ(fake_stats().buffers, 1);
  EXPECT_TRUE(h.free_pinned_device_buffer(p));
  EXPECT_EQ(fake_stats().buffers, 0);
  std::vector<char> host(8);
  EXPECT_FALSE(h.free_pinned_device_buffer(host.data()));
}

TEST_F(FakeGds, DriverOpensOnceAndClosesWithTheLastHandleDeregisteringLeftovers) {
  std::byte* dev = device_alloc(4096);
  const int refs_before = fake_symbol<int(int)>(DEEPIO_FAKE_CUDA,
                                                "deepio_fake_cuda_context_refs")(0);  // the test's own
  {
    auto a = handle();
    {
      auto b = handle();
      EXPECT_EQ(fake_stats().opens, 1);
      ASSERT_TRUE(b.pin_device_buffer(dev, 4096));
    }
    EXPECT_EQ(fake_stats().refs, 1);
    EXPECT_EQ(fake_stats().buffers, 1);  // pins outlive the handle that made them
  }
  const auto s = fake_stats();
  EXPECT_EQ(s.opens, 1);
  EXPECT_EQ(s.closes, 1);
  EXPECT_EQ(s.refs, 0);
  EXPECT_EQ(s.buffers, 0) << "cuFile's registration ends with its driver";
  // ... but the buffer stays pinned in deepio's registry until unpinned (Python keeps the
  // tensor alive as long): a later handle finds it, and pinning it again registers it again.
  ASSERT_EQ(cufile_->buffers.entries.size(), 1u);
  EXPECT_FALSE(cufile_->buffers.entries.begin()->second.cufile_registered);
  EXPECT_EQ(fake_symbol<int(int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_context_refs")(0), refs_before)
      << "the handles released every context they retained";
  {
    auto c = handle();
    EXPECT_TRUE(c.pin_device_buffer(dev, 4096));
    EXPECT_EQ(fake_stats().buffers, 1) << "registered again with the reopened driver";
    const std::string f = dir_.file("again.bin");
    const auto data = pattern(4096, 8);
    put(f, data);
    EXPECT_EQ(c.sync_pread(dev, 4096, f, 0), 1u);
    EXPECT_EQ(c.gds_stats().bytes_cufile, 4096u);
    EXPECT_TRUE(c.unpin_device_buffer(dev)) << "still pinned after the driver closed";
    EXPECT_EQ(fake_stats().buffers, 0);
  }
  EXPECT_TRUE(cufile_->buffers.entries.empty());
  device_free(dev);
}

TEST_F(FakeGds, DriverOpenFailureFallsBackOrThrowsByMode) {
  control("deepio_fake_cufile_fail_open", CU_FILE_NVFS_DRIVER_ERROR);
  try {
    auto strict = handle({.mode = GdsMode::CuFile});
    ADD_FAILURE() << "CuFile mode accepted a driver that cannot open";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cuFileDriverOpen: CU_FILE_NVFS_DRIVER_ERROR"), std::string::npos) << e.what();
  }
  auto h = handle();
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("cuFileDriverOpen"), std::string::npos) << h.mode_reason();
  const std::string f = dir_.file("d.bin");
  const auto data = pattern(10000, 5);
  put(f, data);
  std::byte* dev = device_alloc(10000);
  EXPECT_EQ(h.sync_pread(dev, 10000, f, 0), 1u);
  EXPECT_EQ(std::memcmp(dev, data.data(), 10000), 0);
  EXPECT_EQ(h.gds_stats().bytes_staged, 10000u);
  EXPECT_EQ(fake_stats().io_calls, 0);
  device_free(dev);
}

TEST_F(FakeGds, UnsupportedFileFallsBackToStagingAndSaysSo) {
  control("deepio_fake_cufile_fail_register", CU_FILE_IO_NOT_SUPPORTED);
  auto h = handle({.block_size = 3000, .intra_op_parallelism = 3});
  EXPECT_EQ(h.mode(), "gds");
  const std::size_t n = 10000;
  const auto data = pattern(n, 6);
  std::byte* dev = device_alloc(n);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("e.bin");
  EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
  EXPECT_EQ(slurp(f), data);
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("cuFileHandleRegister: CU_FILE_IO_NOT_SUPPORTED"), std::string::npos)
      << h.mode_reason();
  const auto st = h.gds_stats();
  EXPECT_EQ(st.files_fallback, 1u);
  EXPECT_EQ(st.bytes_staged, n);
  EXPECT_EQ(st.bytes_cufile, 0u);

  auto strict = handle({.mode = GdsMode::CuFile});
  try {
    strict.async_pread(dev, n, f, 0);
    ADD_FAILURE() << "CuFile mode staged a file cuFile refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOTSUP);
    EXPECT_EQ(e.path(), f);
  }
  EXPECT_EQ(strict.pending(), 0u);
  device_free(dev);
}

// What the real library did on a GPU machine without nvidia-fs (docs/gpu.md): the driver
// opens, then cuFileHandleRegister refuses every file with CU_FILE_HANDLE_NOT_REGISTERED,
// whether or not its compatibility mode was asked for. Auto must still work, by staging.
TEST_F(FakeGds, HandleNotRegisteredWithoutNvidiaFsFallsBackInAutoAndFailsInCuFileMode) {
  control("deepio_fake_cufile_nvfs_major", 0u);
  control("deepio_fake_cufile_fail_register", CU_FILE_HANDLE_NOT_REGISTERED);
  const std::size_t n = (1 << 20) + 77;
  const auto data = pattern(n, 31);
  std::byte* dev = device_alloc(n);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("nvfs.bin");
  {
    auto h = handle({.block_size = 256 << 10, .intra_op_parallelism = 2});
    EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
    EXPECT_EQ(slurp(f), data);
    std::byte* back = device_alloc(n);
    EXPECT_EQ(h.sync_pread(back, n, f, 0), 1u);
    EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
    device_free(back);
    EXPECT_EQ(h.mode(), "compat");
    EXPECT_NE(h.mode_reason().find("CU_FILE_HANDLE_NOT_REGISTERED"), std::string::npos) << h.mode_reason();
    const auto st = h.gds_stats();
    EXPECT_EQ(st.files_fallback, 2u);
    EXPECT_EQ(st.bytes_staged, 2 * n);
    EXPECT_EQ(st.bytes_cufile, 0u);
    EXPECT_EQ(st.ops_failed, 0u);
  }
  auto strict = handle({.mode = GdsMode::CuFile});
  try {
    strict.async_pwrite(dev, n, f, 0);
    ADD_FAILURE() << "CuFile mode staged a file cuFile refused";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("CU_FILE_HANDLE_NOT_REGISTERED"), std::string::npos) << e.what();
    EXPECT_EQ(e.path(), f);
  }
  EXPECT_EQ(slurp(f), data) << "a refused write must not touch the file";
  device_free(dev);
}

// The handle asks cuFile to allow its compatibility mode through the parameter API, before the
// driver opens; nothing is written to the working directory.
TEST_F(FakeGds, CompatModeIsRequestedBeforeTheDriverOpens) {
  EXPECT_EQ(fake_symbol<int(int)>(DEEPIO_FAKE_CUFILE,
                                  "deepio_fake_cufile_param_bool")(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE),
            -1);
  const auto before = std::filesystem::directory_iterator(std::filesystem::current_path());
  std::size_t entries_before = 0;
  for (const auto& e : before) entries_before += e.exists() ? 1 : 0;
  {
    auto h = handle();
    EXPECT_EQ(fake_symbol<int(int)>(DEEPIO_FAKE_CUFILE,
                                    "deepio_fake_cufile_param_bool")(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE),
              1);
  }
  std::size_t entries_after = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::current_path())) {
    entries_after += e.exists() ? 1 : 0;
  }
  EXPECT_EQ(entries_after, entries_before) << "no configuration file in the working directory";
  // Compat mode never touches cuFile, so it asks nothing.
  control("deepio_fake_cufile_reset");
  auto c = handle({.mode = GdsMode::Compat});
  EXPECT_EQ(fake_symbol<int(int)>(DEEPIO_FAKE_CUFILE,
                                  "deepio_fake_cufile_param_bool")(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE),
            -1);
}

// A buffer registration cuFile refuses for lack of GDS support keeps the pin unregistered in
// Auto (I/O on it still works), and is an error in CuFile mode.
TEST_F(FakeGds, RefusedBufferRegistrationIsKeptUnregisteredInAuto) {
  control("deepio_fake_cufile_fail_bufregister", 5036 /* CU_FILE_GPU_MEMORY_PINNING_FAILED */);
  const std::size_t n = 8192;
  std::byte* dev = device_alloc(n);
  auto h = handle({.block_size = 4096});
  EXPECT_TRUE(h.pin_device_buffer(dev, n));
  EXPECT_NE(h.mode_reason().find("CU_FILE_GPU_MEMORY_PINNING_FAILED"), std::string::npos) << h.mode_reason();
  EXPECT_EQ(h.gds_stats().pins_refused, 1u);
  const auto data = pattern(n, 32);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("unreg.bin");
  EXPECT_EQ(h.sync_pwrite(dev + 1000, 5000, f, 0), 1u);
  EXPECT_EQ(slurp(f), std::vector<std::byte>(data.begin() + 1000, data.begin() + 6000));
  EXPECT_TRUE(h.unpin_device_buffer(dev));
  auto strict = handle({.mode = GdsMode::CuFile});
  EXPECT_THROW(strict.pin_device_buffer(dev, n), Error);
  device_free(dev);
}

TEST_F(FakeGds, CompatModeNeverCallsCuFile) {
  auto h = handle({.block_size = 1 << 12, .mode = GdsMode::Compat});
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("requested"), std::string::npos);
  const std::size_t n = 3 * 4096 + 1;
  const auto data = pattern(n, 8);
  std::byte* dev = device_alloc(n);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("f.bin");
  EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
  std::byte* back = device_alloc(n);
  EXPECT_EQ(h.sync_pread(back, n, f, 0), 1u);
  EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
  EXPECT_EQ(fake_stats().opens, 0);
  EXPECT_EQ(fake_stats().io_calls, 0);
  device_free(dev);
  device_free(back);
}

TEST_F(FakeGds, NoCuFileMeansStagedCompatOrENOTSUP) {
  auto h = handle({}, /*with_cufile=*/false);
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("cuFile not found"), std::string::npos) << h.mode_reason();
  try {
    auto strict = handle({.mode = GdsMode::CuFile}, false);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOTSUP);
  }
}

TEST_F(FakeGds, NoCudaThrowsTheLoadersReason) {
  try {
    auto h = make_gds_handle({}, nullptr, deepio::detail::Status::failure(ENODEV, "libcuda.so.1: no CUDA device"),
                             cufile_.get(), {});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODEV);
    EXPECT_NE(e.message().find("libcuda.so.1: no CUDA device"), std::string::npos);
  }
  EXPECT_THROW(handle({.block_size = 0}), Error);
  EXPECT_THROW(handle({.intra_op_parallelism = 0}), Error);
}

TEST_F(FakeGds, PosixErrorFromCuFileReachesWaitWithContext) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::string f = dir_.file("g.bin");
  put(f, pattern(16384, 9));
  std::byte* dev = device_alloc(16384);
  control("deepio_fake_cufile_fail_io", 0, -1L, EIO, 2);  // the third read fails
  h.async_pread(dev, 16384, f, 0);
  try {
    h.wait();
    ADD_FAILURE() << "EIO was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), f);
    EXPECT_EQ(e.nbytes(), 4096u);
    EXPECT_EQ(e.offset() % 4096, 0u);
    EXPECT_NE(e.message().find("cuFileRead"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.gds_stats().ops_failed, 1u);
  EXPECT_EQ(fake_stats().handles, 0);
  device_free(dev);
}

TEST_F(FakeGds, CuFileErrorCodeIsNamed) {
  auto h = handle({.mode = GdsMode::CuFile});  // Auto would stage instead (below)
  std::byte* dev = device_alloc(100);
  control("deepio_fake_cufile_fail_io", 1, static_cast<long>(-CU_FILE_CUDA_DRIVER_ERROR), 0, 0);
  try {
    h.sync_pwrite(dev, 100, dir_.file("h.bin"), 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_NE(e.message().find("cuFileWrite: CU_FILE_CUDA_DRIVER_ERROR"), std::string::npos) << e.what();
  }
  device_free(dev);
}

// A cuFile error at I/O time in Auto does not fail the operation: that request and the rest
// of its operation are staged through host memory, counted and explained. A file system error
// (-1 with errno) is not a cuFile refusal and still fails (PosixErrorFromCuFileReachesWait...).
TEST_F(FakeGds, CuFileErrorAtIoTimeIsStagedInAuto) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 1});
  const std::size_t n = 5 * 4096 + 321;
  const auto data = pattern(n, 55);
  const std::string f = dir_.file("iofallback.bin");
  put(f, data);
  std::byte* dev = device_alloc(n);
  control("deepio_fake_cufile_fail_io", 0, static_cast<long>(-CU_FILE_IO_NOT_SUPPORTED), 0, 2);  // third read
  EXPECT_EQ(h.sync_pread(dev, n, f, 0), 1u);
  EXPECT_EQ(std::memcmp(dev, data.data(), n), 0);
  auto st = h.gds_stats();
  EXPECT_EQ(st.ops_failed, 0u);
  EXPECT_EQ(st.io_fallbacks, 4u) << "the failed request and the three after it";
  EXPECT_EQ(st.bytes_cufile, 2u * 4096);
  EXPECT_EQ(st.bytes_staged, n - 2u * 4096);
  EXPECT_EQ(fake_stats().io_calls, 3) << "cuFile is not asked again for that operation";
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("cuFileRead: CU_FILE_IO_NOT_SUPPORTED"), std::string::npos) << h.mode_reason();

  // Writes too; the next operation tries cuFile again.
  const auto data2 = pattern(n, 56);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data2.data(), n), CUDA_SUCCESS);
  control("deepio_fake_cufile_fail_io", 1, static_cast<long>(-CU_FILE_CUDA_DRIVER_ERROR), 0, 0);
  EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
  EXPECT_EQ(slurp(f), data2);
  st = h.gds_stats();
  EXPECT_EQ(st.io_fallbacks, 4u + 6u);
  EXPECT_EQ(st.ops_failed, 0u);
  EXPECT_EQ(fake_stats().io_calls, 4);
  EXPECT_EQ(h.sync_pread(dev, n, f, 0), 1u);
  EXPECT_EQ(fake_stats().io_calls, 4 + 6);
  EXPECT_EQ(std::memcmp(dev, data2.data(), n), 0);

  // A staged request that fails fails the operation, naming its own error and the cuFile one.
  fake_symbol<void(const char*, CUresult, int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_result")(
      "cuMemcpyDtoH", CUDA_ERROR_ILLEGAL_ADDRESS, 0);
  control("deepio_fake_cufile_fail_io", 1, static_cast<long>(-CU_FILE_INTERNAL_ERROR), 0, 0);
  try {
    h.sync_pwrite(dev, n, f, 0);
    ADD_FAILURE() << "a failed staged write was lost";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), f);
    EXPECT_NE(e.message().find("cuMemcpyDtoH"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("after cuFileWrite: CU_FILE_INTERNAL_ERROR"), std::string::npos) << e.what();
  }
  fake_symbol<void(const char*, CUresult, int)>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_result")(nullptr, 0, 0);
  EXPECT_EQ(h.gds_stats().ops_failed, 1u);
  EXPECT_EQ(fake_stats().handles, 0);
  device_free(dev);
}

// Real cuFile needs O_DIRECT descriptors: the staged fallback reads and writes through the
// same file reopened without O_DIRECT, at any offset and length, into unaligned memory.
TEST_F(FakeGds, CuFileErrorAtIoTimeIsStagedOnAnODirectDescriptor) {
  control("deepio_fake_cufile_keep_direct", 1);
  // One worker: every request after the failing first one is staged (with two, the other
  // worker's cuFileWrite could reach the O_DIRECT descriptor first and fail for real).
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 1});
  const std::size_t n = 3 * 4096 + 999;
  const auto data = pattern(n, 57);
  std::byte* dev = device_alloc(n + 1);
  std::byte* odd = dev + 1;  // no alignment O_DIRECT would accept
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(odd), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("direct.bin");
  put(f, std::vector<std::byte>(n + 700, std::byte{0}));
  if (h.options().direct_io == DirectIo::Off) GTEST_SKIP() << "direct I/O switched off";
  control("deepio_fake_cufile_fail_io", 1, static_cast<long>(-CU_FILE_IO_NOT_SUPPORTED), 0, 0);
  EXPECT_EQ(h.sync_pwrite(odd, n, f, 333), 1u);
  auto expect = std::vector<std::byte>(n + 700, std::byte{0});
  std::memcpy(expect.data() + 333, data.data(), n);
  EXPECT_EQ(slurp(f), expect);
  std::memset(odd, 0, n);
  control("deepio_fake_cufile_fail_io", 0, static_cast<long>(-CU_FILE_IO_NOT_SUPPORTED), 0, 0);
  EXPECT_EQ(h.sync_pread(odd, n, f, 333), 1u);
  EXPECT_EQ(std::memcmp(odd, data.data(), n), 0);
  EXPECT_EQ(h.gds_stats().ops_failed, 0u);
  EXPECT_GE(h.gds_stats().io_fallbacks, 2u);
  device_free(dev);
}

TEST_F(FakeGds, ShortTransfersAreContinued) {
  control("deepio_fake_cufile_max_io", std::size_t{1000});
  auto h = handle({.block_size = 8192});
  const std::size_t n = 20000;
  const auto data = pattern(n, 10);
  const std::string f = dir_.file("i.bin");
  put(f, data);
  std::byte* dev = device_alloc(n);
  EXPECT_EQ(h.sync_pread(dev, n, f, 0), 1u);
  EXPECT_EQ(std::memcmp(dev, data.data(), n), 0);
  EXPECT_EQ(fake_stats().io_calls, 9 + 9 + 4);  // chunks of 8192, 8192, 3616 at 1000 per call
  device_free(dev);
}

TEST_F(FakeGds, SubmissionErrors) {
  auto h = handle();
  std::byte* dev = device_alloc(4096);
  const std::string f = dir_.file("j.bin");
  put(f, pattern(1000, 11));
  try {
    h.async_pread(dev, 2000, f, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA);
  }
  try {
    h.async_pread(dev, 10, dir_.file("missing"), 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOENT);
    EXPECT_EQ(e.path(), dir_.file("missing"));
  }
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(fake_stats().handles, 0);
  // Host memory is not an error (DeepNVMe's gds_handle serves CPU tensors too): it takes the
  // handle's host path, never cuFile.
  const auto host = pattern(100, 12);
  h.async_pwrite(host.data(), host.size(), f, 0);
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(fake_stats().io_calls, 0);
  auto expect = pattern(1000, 11);
  std::memcpy(expect.data(), host.data(), host.size());
  EXPECT_EQ(slurp(f), expect);
  device_free(dev);
}

TEST_F(FakeGds, DestructionFinishesInFlightWrites) {
  control("deepio_fake_cufile_delay_us", 20000u);
  const std::size_t n = 8 * 4096;
  const auto data = pattern(n, 12);
  std::byte* dev = device_alloc(n);
  ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
  const std::string f = dir_.file("k.bin");
  {
    auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
    h.async_pwrite(dev, n, f, 0);
  }
  EXPECT_EQ(slurp(f), data);
  device_free(dev);
}

TEST_F(FakeGds, ConcurrentSubmittersAndWaiters) {
  auto h = handle({.block_size = 2048, .intra_op_parallelism = 3});
  constexpr int kThreads = 4;
  const std::size_t n = 10000;
  std::vector<std::byte*> devs;
  std::vector<std::vector<std::byte>> datas;
  for (int i = 0; i < kThreads; ++i) {
    datas.push_back(pattern(n, 100 + static_cast<std::uint32_t>(i)));
    devs.push_back(device_alloc(n));
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(devs.back()), datas.back().data(), n), CUDA_SUCCESS);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const std::string f = dir_.file("t" + std::to_string(i));
      for (int k = 0; k < 5; ++k) h.sync_pwrite(devs[static_cast<std::size_t>(i)], n, f, 0);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(slurp(dir_.file("t" + std::to_string(i))), datas[static_cast<std::size_t>(i)]);
    device_free(devs[static_cast<std::size_t>(i)]);
  }
  EXPECT_EQ(h.gds_stats().ops_completed, 20u);
}

TEST_F(FakeGds, NvfsAbsentMeansCuFileCompatibilityMode) {
  control("deepio_fake_cufile_nvfs_major", 0u);
  auto h = handle();
  if (nvidia_fs_loaded()) GTEST_SKIP() << "nvidia-fs is loaded on this machine";
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("compatibility mode"), std::string::npos) << h.mode_reason();
}

long register_calls() { return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_register_calls")(); }

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Without nvidia-fs every cuFileHandleRegister is refused the same way: after the first
// refusal, files on that file system are staged without asking cuFile again, and the reason is
// said once.
TEST_F(FakeGds, ARefusedFileSystemIsAskedOnce) {
  control("deepio_fake_cufile_fail_register", CU_FILE_HANDLE_NOT_REGISTERED);
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::size_t n = 10000;
  std::byte* dev = device_alloc(n);
  const int files = 5;
  for (int i = 0; i < files; ++i) {
    const auto data = pattern(n, 40 + static_cast<std::uint32_t>(i));
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
    const std::string f = dir_.file("fs" + std::to_string(i) + ".bin");
    EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
    EXPECT_EQ(slurp(f), data);
    std::memset(dev, 0, n);
    EXPECT_EQ(h.sync_pread(dev, n, f, 0), 1u);
    EXPECT_EQ(std::memcmp(dev, data.data(), n), 0);
  }
  EXPECT_EQ(register_calls(), 1) << "one registration attempt for one file system";
  const auto st = h.gds_stats();
  EXPECT_EQ(st.files_fallback, 2u * files);
  EXPECT_EQ(st.registrations_skipped, 2u * files - 1);
  EXPECT_EQ(st.bytes_staged, 2u * files * n);
  EXPECT_EQ(st.bytes_cufile, 0u);
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_EQ(occurrences(h.mode_reason(), "CU_FILE_HANDLE_NOT_REGISTERED"), 1u) << h.mode_reason();
  EXPECT_NE(h.mode_reason().find("file system"), std::string::npos) << h.mode_reason();

  // CuFile mode never stages, so it is never told "not this file system": it asks each time.
  auto strict = handle({.mode = GdsMode::CuFile});
  const std::string f = dir_.file("fs0.bin");
  for (int i = 0; i < 2; ++i) EXPECT_THROW(strict.async_pread(dev, n, f, 0), Error);
  EXPECT_EQ(register_calls(), 3);
  device_free(dev);
}

// ---- File objects: one cuFile registration per file object ----

long deregister_calls() {
  return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_deregister_calls")();
}
struct Deregistered {
  long io_calls;  // the fake's io_calls when the last handle was deregistered
  int fd_open;    // its descriptor was still open on the registered file then
};
Deregistered last_deregister() {
  Deregistered d{};
  fake_symbol<void(long*, int*)>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_last_deregister")(&d.io_calls, &d.fd_open);
  return d;
}

// A file object registers its descriptor with cuFile on its first device operation, reuses
// the handle for every later one, and deregisters it when it is closed, while its descriptor is
// still open. Path operations keep one registration each.
TEST_F(FakeGds, AFileObjectRegistersWithCuFileOnce) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::size_t n = 3 * 4096 + 100;
  const std::string f = dir_.file("object.bin");
  std::byte* dev = device_alloc(n);
  constexpr int kOps = 5;
  File file = h.open(f, O_RDWR | O_CREAT);
  EXPECT_EQ(register_calls(), 0) << "registered before any device operation";
  const auto host = pattern(100, 69);
  EXPECT_EQ(file.pwrite(host.data(), host.size(), kOps * n).get(), host.size());  // host memory: no cuFile
  EXPECT_EQ(register_calls(), 0);
  for (int i = 0; i < kOps; ++i) {
    const auto data = pattern(n, 60 + static_cast<std::uint32_t>(i));
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
    EXPECT_EQ(file.pwrite(dev, n, i * n).get(), n);
    std::memset(dev, 0, n);
    EXPECT_EQ(file.pread(dev, n, i * n).get(), n);
    EXPECT_EQ(std::memcmp(dev, data.data(), n), 0) << "op " << i;
  }
  EXPECT_EQ(register_calls(), 1) << "one registration for the file object";
  EXPECT_EQ(deregister_calls(), 0) << "deregistered while the file object is open";
  EXPECT_EQ(fake_stats().handles, 1);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.device_ops_cufile, 2u * kOps);
  EXPECT_EQ(s.device_bytes_cufile, 2u * kOps * n);
  EXPECT_EQ(s.device_bytes_staged, 0u);
  const long io_calls = fake_stats().io_calls;
  file.close();
  EXPECT_EQ(deregister_calls(), 1);
  EXPECT_EQ(fake_stats().handles, 0);
  const Deregistered d = last_deregister();
  EXPECT_EQ(d.fd_open, 1) << "deregistered after the descriptor closed";
  EXPECT_EQ(d.io_calls, io_calls);

  // Path operations: one registration (and deregistration) each, as before.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
    EXPECT_EQ(h.sync_pread(dev, n, f, 0), 1u);
  }
  EXPECT_EQ(register_calls(), 1 + 4);
  EXPECT_EQ(deregister_calls(), 1 + 4);
  EXPECT_EQ(fake_stats().handles, 0);
  EXPECT_EQ(last_deregister().fd_open, 1);

  // A second file object registers for itself; destroying it (no close()) deregisters.
  {
    File again = h.open(f, O_RDONLY);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(again.pread(dev, n, 0).get(), n);
    EXPECT_EQ(register_calls(), 6);
  }
  EXPECT_EQ(deregister_calls(), 6);
  EXPECT_EQ(last_deregister().fd_open, 1);
  device_free(dev);
}

// Two threads' first operations on one file object at once: one registration.
TEST_F(FakeGds, ConcurrentFirstOperationsOnAFileObjectRegisterOnce) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::size_t n = 2 * 4096 + 5;
  const std::string f = dir_.file("race.bin");
  constexpr int kThreads = 4;
  std::vector<std::byte*> bufs;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kThreads; ++i) {
    data.push_back(pattern(n, 80 + static_cast<std::uint32_t>(i)));
    bufs.push_back(device_alloc(n));
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(bufs.back()), data.back().data(), n), CUDA_SUCCESS);
  }
  File file = h.open(f, O_RDWR | O_CREAT);
  std::atomic<int> ready{0};
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        EXPECT_EQ(file.pwrite(bufs[i], n, static_cast<std::uint64_t>(i) * n).get(), n);
      });
    }
  }
  EXPECT_EQ(register_calls(), 1);
  EXPECT_EQ(h.stats().device_ops_cufile, static_cast<std::uint64_t>(kThreads));
  file.close();
  EXPECT_EQ(deregister_calls(), 1);
  const auto back = slurp(f);
  ASSERT_EQ(back.size(), kThreads * n);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(std::memcmp(back.data() + i * n, data[i].data(), n), 0) << "thread " << i;
  }
  for (std::byte* b : bufs) device_free(b);
}

// A file object on a file system cuFile refuses (Auto): staged with the right bytes, and
// cuFile is asked once, not per operation. CuFile mode: an error each time, never kept.
TEST_F(FakeGds, AFileObjectCuFileRefusesIsStagedAndAskedOnce) {
  control("deepio_fake_cufile_fail_register", CU_FILE_HANDLE_NOT_REGISTERED);
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::size_t n = 10000;
  const std::string f = dir_.file("refused.bin");
  std::byte* dev = device_alloc(n);
  constexpr int kOps = 4;
  {
    File file = h.open(f, O_RDWR | O_CREAT);
    for (int i = 0; i < kOps; ++i) {
      const auto data = pattern(n, 90 + static_cast<std::uint32_t>(i));
      ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
      EXPECT_EQ(file.pwrite(dev, n, i * n).get(), n);
      std::memset(dev, 0, n);
      EXPECT_EQ(file.pread(dev, n, i * n).get(), n);
      EXPECT_EQ(std::memcmp(dev, data.data(), n), 0) << "op " << i;
    }
  }
  EXPECT_EQ(register_calls(), 1) << "the refusal is asked once";
  EXPECT_EQ(deregister_calls(), 0);
  const auto st = h.gds_stats();
  EXPECT_EQ(st.files_fallback, 2u * kOps);
  EXPECT_EQ(st.registrations_skipped, 2u * kOps - 1);
  EXPECT_EQ(st.bytes_staged, 2u * kOps * n);
  EXPECT_EQ(st.bytes_cufile, 0u);
  EXPECT_EQ(h.stats().device_ops_staged, 2u * kOps);
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_EQ(occurrences(h.mode_reason(), "CU_FILE_HANDLE_NOT_REGISTERED"), 1u) << h.mode_reason();

  auto strict = handle({.mode = GdsMode::CuFile});
  File file = strict.open(f, O_RDONLY);
  for (int i = 0; i < 2; ++i) EXPECT_THROW((void)file.pread(dev, n, 0), Error);
  EXPECT_EQ(register_calls(), 3) << "an error is not kept: the next operation asks again";
  control("deepio_fake_cufile_fail_register", 0);
  EXPECT_EQ(file.pread(dev, n, 0).get(), n);
  EXPECT_EQ(file.pread(dev, n, n).get(), n);
  EXPECT_EQ(register_calls(), 4);
  file.close();
  EXPECT_EQ(deregister_calls(), 1);
  device_free(dev);
}

// Closing a file object while its operation is in flight: the operation finishes, then the
// handle is deregistered, after the operation's last cuFileRead and before the descriptor
// closes.
TEST_F(FakeGds, ClosingAFileObjectDeregistersAfterItsLastOperation) {
  auto h = handle({.block_size = 4096, .intra_op_parallelism = 2});
  const std::size_t n = 4 * 4096;
  const std::string f = dir_.file("inflight.bin");
  const auto data = pattern(n, 99);
  put(f, data);
  std::byte* dev = device_alloc(n);
  File file = h.open(f, O_RDONLY);
  control("deepio_fake_cufile_hold_io", 1);
  Future read = file.pread(dev, n, 0);
  const auto held = fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_io_held");
  for (int i = 0; i < 10000 && held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GT(held(), 0) << "the read never reached cuFile";
  file.close();
  EXPECT_FALSE(read.done());
  EXPECT_EQ(deregister_calls(), 0) << "deregistered while an operation was in flight";
  control("deepio_fake_cufile_hold_io", 0);
  EXPECT_EQ(read.get(), n);
  EXPECT_EQ(std::memcmp(dev, data.data(), n), 0);
  EXPECT_EQ(register_calls(), 1);
  EXPECT_EQ(deregister_calls(), 1) << "not deregistered when the last operation finished";
  const Deregistered d = last_deregister();
  EXPECT_EQ(d.io_calls, fake_stats().io_calls) << "deregistered before the last cuFileRead";
  EXPECT_EQ(d.fd_open, 1) << "deregistered after the descriptor closed";
  EXPECT_EQ(fake_stats().handles, 0);
  device_free(dev);
}

// A File kept after its handle went (no calls on it): the registration keeps cuFile's driver
// open until the File goes, then deregisters and lets the driver close.
TEST_F(FakeGds, AFileObjectOutlivingItsHandleDeregistersWhenItGoes) {
  const std::size_t n = 4096;
  const std::string f = dir_.file("outlive.bin");
  std::byte* dev = device_alloc(n);
  File file;
  {
    auto h = handle({.block_size = 4096});
    file = h.open(f, O_RDWR | O_CREAT);
    EXPECT_EQ(file.pwrite(dev, n, 0).get(), n);
  }
  EXPECT_EQ(deregister_calls(), 0);
  EXPECT_EQ(fake_stats().refs, 1) << "the driver closed under a live registration";
  file.close();
  EXPECT_EQ(deregister_calls(), 1);
  EXPECT_EQ(last_deregister().fd_open, 1);
  EXPECT_EQ(fake_stats().handles, 0);
  EXPECT_EQ(fake_stats().refs, 0) << "the driver stayed open after the last registration";
  device_free(dev);
}

// A plain handle's route (Auto, made at the first device operation) serves file objects the
// same way.
TEST_F(FakeGds, AFileObjectOnAPlainHandleRegistersOnce) {
  Handle h = make_handle({.block_size = 4096}, cuda_.get(), {}, cufile_.get(), {});
  const std::size_t n = 4096 + 1;
  const std::string f = dir_.file("plain.bin");
  std::byte* dev = device_alloc(n);
  File file = h.open(f, O_RDWR | O_CREAT);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(file.pwrite(dev, n, i * n).get(), n);
    EXPECT_EQ(file.pread(dev, n, i * n).get(), n);
  }
  EXPECT_EQ(register_calls(), 1);
  EXPECT_EQ(h.stats().device_ops_cufile, 6u);
  file.close();
  EXPECT_EQ(deregister_calls(), 1);
  device_free(dev);
}

// cuFile writes cufile.log into the working directory unless told otherwise: the handle that
// opens the driver points it at a file of deepio's choosing, unless the user chose one.
TEST_F(FakeGds, CuFileLogLeavesTheWorkingDirectoryUnlessTheUserChose) {
  auto param = [] {
    const char* v = fake_symbol<const char*(int)>(DEEPIO_FAKE_CUFILE,
                                                  "deepio_fake_cufile_param_string")(CUFILE_PARAM_ENV_LOGFILE_PATH);
    return v != nullptr ? std::string(v) : std::string("(unset)");
  };
  const char* saved = std::getenv("CUFILE_LOGFILE_PATH");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("CUFILE_LOGFILE_PATH");
  {
    auto h = handle();
    const std::string log = param();
    EXPECT_EQ(log, cufile_log_path());
    EXPECT_NE(log.find("/deepio-cufile-" + std::to_string(::getuid()) + ".log"), std::string::npos) << log;
    EXPECT_EQ(log.find(std::filesystem::current_path().string() + "/cufile.log"), std::string::npos) << log;
    EXPECT_EQ(h.mode(), "gds") << h.mode_reason();
  }
  control("deepio_fake_cufile_reset");
  ::setenv("CUFILE_LOGFILE_PATH", "/nonexistent/user-chosen.log", 1);
  {
    auto h = handle();
    EXPECT_EQ(cufile_log_path(), "");
    EXPECT_EQ(param(), "(unset)") << "the user's CUFILE_LOGFILE_PATH is cuFile's to read";
  }
  if (saved != nullptr) {
    ::setenv("CUFILE_LOGFILE_PATH", saved_value.c_str(), 1);
  } else {
    ::unsetenv("CUFILE_LOGFILE_PATH");
  }
}

// Managed memory is host-addressable: a GdsHandle reads and writes it in place like host
// memory (no cuFile, no staging) and refuses to pin it as device memory.
TEST_F(FakeGds, ManagedMemoryIsReadAndWrittenInPlace) {
  auto alloc_managed = fake_symbol<CUresult(CUdeviceptr*, std::size_t, unsigned int)>(DEEPIO_FAKE_CUDA,
                                                                                      "cuMemAllocManaged");
  const std::size_t n = 3 * 4096 + 5;
  CUdeviceptr d = 0;
  ASSERT_EQ(alloc_managed(&d, n, 1 /* CU_MEM_ATTACH_GLOBAL */), CUDA_SUCCESS);
  auto* m = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(d));
  const auto data = pattern(n, 77);
  std::memcpy(m, data.data(), n);
  auto h = handle({.block_size = 4096});
  const std::string f = dir_.file("managed.bin");
  EXPECT_EQ(h.sync_pwrite(m, n, f, 0), 1u);
  EXPECT_EQ(slurp(f), data);
  std::memset(m, 0, n);
  EXPECT_EQ(h.sync_pread(m, n, f, 0), 1u);
  EXPECT_EQ(std::memcmp(m, data.data(), n), 0);
  const auto st = h.gds_stats();
  EXPECT_EQ(st.ops_completed, 0u) << "not a device operation";
  EXPECT_EQ(st.bytes_cufile, 0u);
  EXPECT_EQ(st.bytes_staged, 0u);
  EXPECT_EQ(fake_stats().io_calls, 0);
  EXPECT_EQ(h.stats().ops_completed, 2u);
  try {
    (void)h.pin_device_buffer(m, n);
    ADD_FAILURE() << "managed memory pinned as device memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
  }
  device_free(m);
}

// ---- One handle type: HandleOptions::device_route on a plain deepio::Handle ----

class FakeRoute : public FakeGds {
 protected:
  Handle plain(HandleOptions o = {}, bool with_cufile = true) {
    return make_handle(o, cuda_.get(), {}, with_cufile ? cufile_.get() : nullptr,
                       deepio::detail::Status::failure(ENOTSUP, "cuFile not found: test"));
  }
  // Writes n device bytes to a new file and reads them back into other device memory.
  void round_trip(Handle& h, std::size_t n, const char* name) {
    const auto data = pattern(n, 21);
    std::byte* dev = device_alloc(n);
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(dev), data.data(), n), CUDA_SUCCESS);
    const std::string f = dir_.file(name);
    EXPECT_EQ(h.sync_pwrite(dev, n, f, 0), 1u);
    EXPECT_EQ(slurp(f), data);
    std::byte* back = device_alloc(n);
    EXPECT_EQ(h.sync_pread(back, n, f, 0), 1u);
    EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
    device_free(dev);
    device_free(back);
  }
};

TEST_F(FakeRoute, AutoIsTheDefaultAndOpensTheDriverOnlyAtTheFirstDeviceOperation) {
  EXPECT_EQ(HandleOptions{}.device_route, DeviceRouteMode::Auto);
  auto h = plain({.block_size = 4096, .intra_op_parallelism = 2});
  EXPECT_EQ(fake_stats().opens, 0) << "cuFile's driver opened before any device operation";
  // Host memory never asks for the route.
  const auto host = pattern(10000, 4);
  const std::string f = dir_.file("host.bin");
  EXPECT_EQ(h.sync_pwrite(host.data(), host.size(), f, 0), 1u);
  EXPECT_EQ(fake_stats().opens, 0);
  const std::size_t n = 3 * 4096 + 77;
  round_trip(h, n, "auto.bin");
  EXPECT_EQ(fake_stats().opens, 1);
  EXPECT_GT(fake_stats().io_calls, 0);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.device_ops_completed, 2u);
  EXPECT_EQ(s.device_ops_cufile, 2u);
  EXPECT_EQ(s.device_ops_staged, 0u);
  EXPECT_EQ(s.device_bytes_cufile, 2 * n);
  EXPECT_EQ(s.device_bytes_staged, 0u);
  EXPECT_EQ(s.ops_completed, 3u);
  EXPECT_EQ(h.options().device_route, DeviceRouteMode::Auto);
}

TEST_F(FakeRoute, AutoMakesItsRouteOnceUnderConcurrentFirstOperations) {
  std::atomic<int> asked{0};
  deepio::detail::gpu::DriverSource source = [&] {
    asked.fetch_add(1);
    return Drivers{cuda_.get(), {}, cufile_.get(), {}};
  };
  Handle h = deepio::detail::HandleAccess::handle(
      make_engine({.block_size = 4096}, source, deepio::detail::cuda_device_support(cuda_.get())));
  EXPECT_EQ(asked.load(), 0);
  const std::size_t n = 5000;
  const auto data = pattern(n, 5);
  constexpr int kThreads = 4;
  std::vector<std::byte*> bufs;
  for (int i = 0; i < kThreads; ++i) {
    bufs.push_back(device_alloc(n));
    ASSERT_EQ(cuda_->cuMemcpyHtoD(reinterpret_cast<std::uintptr_t>(bufs.back()), data.data(), n), CUDA_SUCCESS);
  }
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] { h.async_pwrite(bufs[i], n, dir_.file("c" + std::to_string(i)), 0); });
    }
  }
  EXPECT_EQ(h.wait(), static_cast<std::size_t>(kThreads));
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(fake_stats().opens, 1);
  EXPECT_EQ(h.stats().device_ops_cufile, static_cast<std::size_t>(kThreads));
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(slurp(dir_.file("c" + std::to_string(i))), data);
  for (std::byte* b : bufs) device_free(b);
}

TEST_F(FakeRoute, StagedNeverCallsCuFile) {
  auto h = plain({.block_size = 4096, .device_route = DeviceRouteMode::Staged});
  const std::size_t n = 2 * 4096 + 3;
  round_trip(h, n, "staged.bin");
  EXPECT_EQ(fake_stats().opens, 0);
  EXPECT_EQ(fake_stats().io_calls, 0);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.device_ops_staged, 2u);
  EXPECT_EQ(s.device_ops_cufile, 0u);
  EXPECT_EQ(s.device_bytes_staged, 2 * n);
  EXPECT_EQ(s.device_bytes_cufile, 0u);
}

TEST_F(FakeRoute, AutoWithoutCuFileStagesAndGdsRefusesAtConstruction) {
  auto h = plain({.block_size = 4096}, /*with_cufile=*/false);
  round_trip(h, 4096 + 9, "nocufile.bin");
  EXPECT_EQ(h.stats().device_ops_staged, 2u);
  EXPECT_EQ(h.stats().device_bytes_cufile, 0u);
  try {
    auto strict = plain({.device_route = DeviceRouteMode::Gds}, /*with_cufile=*/false);
    ADD_FAILURE() << "device_route gds without cuFile";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOTSUP);
    EXPECT_NE(e.message().find("cuFile not found"), std::string::npos) << e.message();
  }
  try {
    Handle strict = make_handle({.device_route = DeviceRouteMode::Gds}, nullptr,
                                deepio::detail::Status::failure(ENOTSUP, "libcuda.so.1: not found"), cufile_.get(), {});
    ADD_FAILURE() << "device_route gds without CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOTSUP);
    EXPECT_NE(e.message().find("libcuda.so.1: not found"), std::string::npos) << e.message();
  }
}

TEST_F(FakeRoute, GdsRouteOnAPlainHandleUsesCuFile) {
  auto h = plain({.block_size = 4096, .device_route = DeviceRouteMode::Gds});
  EXPECT_EQ(fake_stats().opens, 1) << "gds opens the driver at construction";
  round_trip(h, 4096 * 2, "gds.bin");
  EXPECT_EQ(h.stats().device_ops_cufile, 2u);
  EXPECT_EQ(h.stats().device_bytes_cufile, 2u * 4096 * 2);
}

TEST_F(FakeRoute, AutoWithoutCudaNeverAsksForTheDrivers) {
  int asked = 0;
  deepio::detail::gpu::DriverSource source = [&] {
    ++asked;
    return Drivers{};
  };
  Handle h = deepio::detail::HandleAccess::handle(make_engine({.block_size = 4096}, source, {}));
  const auto data = pattern(3 * 4096 + 1, 6);
  const std::string f = dir_.file("host-only.bin");
  EXPECT_EQ(h.sync_pwrite(data.data(), data.size(), f, 0), 1u);
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(h.sync_pread(back.data(), back.size(), f, 0), 1u);
  EXPECT_EQ(back, data);
  EXPECT_EQ(asked, 0);
  EXPECT_EQ(fake_stats().opens, 0);
  EXPECT_EQ(h.stats().device_ops_completed, 0u);
}

TEST_F(FakeRoute, GdsHandleIsAHandleWithItsRouteSet) {
  auto g = handle({.block_size = 4096, .mode = GdsMode::CuFile});
  EXPECT_EQ(g.options().device_route, DeviceRouteMode::Gds);
  round_trip(g, 4096, "gdshandle.bin");
  EXPECT_EQ(g.stats().device_ops_cufile, 2u);
  EXPECT_EQ(g.gds_stats().bytes_cufile, g.stats().device_bytes_cufile);
  auto c = handle({.block_size = 4096, .mode = GdsMode::Compat});
  EXPECT_EQ(c.options().device_route, DeviceRouteMode::Staged);
  round_trip(c, 4096, "compat.bin");
  EXPECT_EQ(c.stats().device_ops_staged, 2u);
  EXPECT_EQ(c.gds_stats().bytes_staged, c.stats().device_bytes_staged);
}

}  // namespace
