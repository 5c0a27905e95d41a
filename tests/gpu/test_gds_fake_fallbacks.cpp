// deepio::GdsHandle over the fake drivers when cuFile fails or is missing: the driver failing to
// open, unsupported and unregistered files, compat mode (asked for, forced, without nvidia-fs),
// no cuFile or no CUDA, POSIX and cuFile errors at submission and at I/O time (staged in auto
// mode), a file system cuFile refuses asked once.
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
#include "fake_gds.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;
using namespace deepio::gputest;  // the FakeGds fixture, the fake cuFile's counters and controls

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

TEST_F(FakeGds, NvfsAbsentMeansCuFileCompatibilityMode) {
  control("deepio_fake_cufile_nvfs_major", 0u);
  auto h = handle();
  if (nvidia_fs_loaded()) GTEST_SKIP() << "nvidia-fs is loaded on this machine";
  EXPECT_EQ(h.mode(), "compat");
  EXPECT_NE(h.mode_reason().find("compatibility mode"), std::string::npos) << h.mode_reason();
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

}  // namespace
