// deepio::GdsHandle over the fake CUDA driver and fake libcufile: chunking and parallelism,
// offsets, pinned buffers and the registration cache, the driver reference count, short
// transfers, submission errors, shutdown with writes in flight, concurrent callers. The
// fallbacks and errors: test_gds_fake_fallbacks.cpp; file objects: test_gds_fake_file_objects.cpp;
// the device route of a plain Handle: test_gds_fake_route.cpp; the fixture: fake_gds.hpp.
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

}  // namespace
