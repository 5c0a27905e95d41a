// deepio::GdsHandle over the fake drivers with file objects: one cuFile registration per file
// object (also under concurrent first operations and on a plain Handle), staged and asked once
// where cuFile refuses it, deregistered after its last operation or when it outlives its
// handle; cuFile's log file; managed memory read and written in place.
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

}  // namespace
