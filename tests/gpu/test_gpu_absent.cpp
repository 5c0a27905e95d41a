// Without CUDA (this machine, or DEEPIO_CUDA_LIBRARY=none on a GPU machine) everything
// answers cleanly: nullptr with a reason, "unavailable", a documented exception.
#include <cerrno>
#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu/cufile.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;

TEST(GpuAbsent, CudaIsNullWithAReasonNamingTheLibrary) {
  deepio::detail::Status why;
  const CudaApi* api = cuda(&why);
  if (api != nullptr) GTEST_SKIP() << "a CUDA driver is present: " << api->library;
  EXPECT_FALSE(why.ok());
  EXPECT_TRUE(why.errnum == ENOTSUP || why.errnum == ENODEV) << why.errnum;
  const char* env = std::getenv("DEEPIO_CUDA_LIBRARY");
  const std::string expected = env == nullptr || *env == '\0' ? "libcuda.so.1"
                               : std::string(env) == "none"   ? "DEEPIO_CUDA_LIBRARY=none"
                                                              : env;
  EXPECT_NE(why.message.find(expected), std::string::npos) << why.message;
  // Asked again: same answer, no reload.
  deepio::detail::Status again;
  EXPECT_EQ(cuda(&again), nullptr);
  EXPECT_EQ(again.message, why.message);
  EXPECT_EQ(cuda(nullptr), nullptr);
}

TEST(GpuAbsent, GpuInfoSaysNotFound) {
  if (cuda(nullptr) != nullptr) GTEST_SKIP() << "a CUDA driver is present";
  const GpuInfo info = gpu_info();
  EXPECT_FALSE(info.cuda_found);
  EXPECT_FALSE(info.cuda_reason.empty());
  EXPECT_EQ(info.driver_version, 0);
  EXPECT_EQ(info.device_count, 0);
  EXPECT_FALSE(info.gds_usable);
  EXPECT_EQ(info.gds_mode, "unavailable");
  EXPECT_EQ(info.gds_reason, info.cuda_reason);
  if (!info.cufile_found) {
    EXPECT_NE(info.cufile_reason.find("libcufile"), std::string::npos) << info.cufile_reason;
  }
}

TEST(GpuAbsent, GdsHandleThrowsTheDocumentedError) {
  if (cuda(nullptr) != nullptr) GTEST_SKIP() << "a CUDA driver is present";
  for (GdsMode mode : {GdsMode::Auto, GdsMode::CuFile, GdsMode::Compat}) {
    try {
      GdsHandle h(GdsOptions{.mode = mode});
      ADD_FAILURE() << "constructed a GdsHandle without CUDA";
    } catch (const deepio::Error& e) {
      EXPECT_TRUE(e.errnum() == ENOTSUP || e.errnum() == ENODEV) << e.what();
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  }
}

TEST(GpuAbsent, ClassifyHostPointerIsNotDevice) {
  std::vector<int> host(16);
  EXPECT_FALSE(classify(host.data()).is_device);
  EXPECT_EQ(classify(host.data()).ordinal, -1);
  EXPECT_FALSE(classify(nullptr).is_device);
  EXPECT_FALSE(classify(nullptr, host.data()).is_device);
}

TEST(GpuAbsent, CudaStatusFormatsWithoutADriver) {
  const auto st = cuda_status(nullptr, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  EXPECT_EQ(st.errnum, ENOMEM);
  EXPECT_EQ(st.message, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY");
  const auto io = cuda_status(nullptr, 12345, "cuMemcpyHtoD");
  EXPECT_EQ(io.errnum, EIO);
  EXPECT_EQ(io.message, "cuMemcpyHtoD: CUDA error 12345");
}

TEST(GpuAbsent, CuFileErrorsAreNamedAndMapped) {
  const auto st = cufile_status(nullptr, CUfileError_t{CU_FILE_IO_NOT_SUPPORTED, 0}, "cuFileHandleRegister");
  EXPECT_EQ(st.errnum, ENOTSUP);
  EXPECT_EQ(st.message, "cuFileHandleRegister: CU_FILE_IO_NOT_SUPPORTED");
  const auto cu = cufile_status(nullptr, CUfileError_t{CU_FILE_CUDA_DRIVER_ERROR, CUDA_ERROR_ILLEGAL_ADDRESS}, "x");
  EXPECT_EQ(cu.message, "x: CU_FILE_CUDA_DRIVER_ERROR (CUDA_ERROR_ILLEGAL_ADDRESS)");
  const auto posix = cufile_io_status(nullptr, -1, ENOSPC, "cuFileWrite");
  EXPECT_EQ(posix.errnum, ENOSPC);
  const auto range = cufile_io_status(nullptr, -CU_FILE_CUDA_POINTER_RANGE_ERROR, 0, "cuFileRead");
  EXPECT_EQ(range.errnum, EINVAL);
  EXPECT_NE(range.message.find("CU_FILE_CUDA_POINTER_RANGE_ERROR"), std::string::npos);
  EXPECT_TRUE(cufile_unsupported(CU_FILE_IO_NOT_SUPPORTED));
  EXPECT_FALSE(cufile_unsupported(CU_FILE_INVALID_VALUE));
}

TEST(GpuAbsent, MissingLibrariesLoadToNullWithTheirNames) {
  deepio::detail::Status why;
  EXPECT_EQ(load_cuda("/nonexistent/libcuda-deepio.so", &why), nullptr);
  EXPECT_EQ(why.errnum, ENOTSUP);
  EXPECT_NE(why.message.find("/nonexistent/libcuda-deepio.so"), std::string::npos) << why.message;
  EXPECT_EQ(load_cufile("/nonexistent/libcufile-deepio.so", &why), nullptr);
  EXPECT_NE(why.message.find("/nonexistent/libcufile-deepio.so"), std::string::npos) << why.message;
}

}  // namespace

namespace deepio {
namespace {

// gds_options / handle_options carry every engine setting across, and only the mode differs.
TEST(GdsOptionsConversion, EveryEngineSettingCrossesBothWays) {
  HandleOptions h;
  h.block_size = 12345;
  h.queue_depth = 7;
  h.single_submit = true;
  h.overlap_events = true;
  h.intra_op_parallelism = 3;
  h.backend = BackendKind::Threads;
  h.direct_io = DirectIo::Off;
  const GdsOptions g = gds_options(h, GdsMode::Compat);
  EXPECT_EQ(g.block_size, 12345u);
  EXPECT_EQ(g.queue_depth, 7u);
  EXPECT_TRUE(g.single_submit);
  EXPECT_TRUE(g.overlap_events);
  EXPECT_EQ(g.intra_op_parallelism, 3u);
  EXPECT_EQ(g.backend, BackendKind::Threads);
  EXPECT_EQ(g.direct_io, DirectIo::Off);
  EXPECT_EQ(g.mode, GdsMode::Compat);
  EXPECT_EQ(gds_options(h).mode, GdsMode::Auto);
  const HandleOptions back = handle_options(g);
  EXPECT_EQ(back.block_size, h.block_size);
  EXPECT_EQ(back.queue_depth, h.queue_depth);
  EXPECT_EQ(back.single_submit, h.single_submit);
  EXPECT_EQ(back.overlap_events, h.overlap_events);
  EXPECT_EQ(back.intra_op_parallelism, h.intra_op_parallelism);
  EXPECT_EQ(back.backend, h.backend);
  EXPECT_EQ(back.direct_io, h.direct_io);
}

}  // namespace
}  // namespace deepio
