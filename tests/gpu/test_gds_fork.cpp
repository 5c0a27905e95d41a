// deepio::GdsHandle across fork(), over the fake CUDA driver and fake libcufile: a file
// object's cuFile registration inherited by a forked child belongs to the parent's cuFile
// state, so the child lets it go without deregistering it, and the parent's registration
// stays and is deregistered once, by the parent. Each child runs under alarm(): a hang
// becomes SIGALRM (exit 214), not a stuck test.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>

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

long register_calls() { return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_register_calls")(); }
long deregister_calls() {
  return fake_symbol<long()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_handle_deregister_calls")();
}
void reset_fake() { fake_symbol<void()>(DEEPIO_FAKE_CUFILE, "deepio_fake_cufile_reset")(); }

TEST(FakeGdsFork, AFileObjectDroppedInAForkedChildIsNotDeregisteredThere) {
  deepio::detail::Status why;
  std::unique_ptr<CudaApi> cuda = load_cuda(DEEPIO_FAKE_CUDA, &why);
  ASSERT_NE(cuda, nullptr) << why.message;
  std::unique_ptr<CuFileApi> cufile = load_cufile(DEEPIO_FAKE_CUFILE, &why);
  ASSERT_NE(cufile, nullptr) << why.message;
  reset_fake();
  deepio::gputest::TempDir dir;
  {
    deepio::gputest::CurrentContext ctx(cuda.get());
    constexpr std::size_t n = 4096;
    CUdeviceptr dev = 0;
    ASSERT_EQ(cuda->cuMemAlloc(&dev, n), CUDA_SUCCESS);
    void* p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dev));
    {
      GdsHandle h = make_gds_handle({.block_size = 4096}, cuda.get(), {}, cufile.get(),
                                    deepio::detail::Status::failure(ENOTSUP, "unused"));
      File file = h.open(dir.file("f.bin"), O_RDWR | O_CREAT);
      ASSERT_EQ(file.pwrite(p, n, 0).get(), n);  // registered with cuFile on this first operation
      ASSERT_EQ(register_calls(), 1);
      const int code = deepio::test::in_child([&] {
        ::alarm(10);
        file.close();  // the child's copy: cuFile's handle is the parent's
        return deregister_calls() == 0 ? 0 : 1;
      });
      EXPECT_EQ(code, 0) << "1: the child deregistered the parent's cuFile handle; 214: it hung";
      EXPECT_EQ(deregister_calls(), 0);
      EXPECT_EQ(file.pread(p, n, 0).get(), n) << "the parent's registration is gone";
      EXPECT_EQ(register_calls(), 1);
      file.close();
      EXPECT_EQ(deregister_calls(), 1);
    }
    EXPECT_EQ(cuda->cuMemFree(dev), CUDA_SUCCESS);
  }
  reset_fake();
}

}  // namespace
