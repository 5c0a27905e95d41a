// One handle type: HandleOptions::device_route on a plain deepio::Handle over the fake drivers
// (Auto, Staged and Gds routes, the driver opened at the first device operation and once under
// concurrent ones, no CUDA), and GdsHandle as a Handle with its route set.
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
