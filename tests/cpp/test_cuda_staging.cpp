// The engine's CUDA staging path (engine/cuda_stager.cpp) against the fake driver named by
// DEEPIO_CUDA_LIBRARY (set by CTest): GPU "device" memory that the fake keeps in host memory,
// recognised through cuPointerGetAttribute, copied with cuMemcpy*Async, ordered by events.
// Run without that variable on a GPU machine, the first two tests use the real driver. Every
// handle here pins DeviceRouteMode::Staged: where cuFile is also found (scripts/gpu-check.sh sets
// the fake one, a GPU machine has the real one), the default route would take it instead.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "gpu/cuda.hpp"
#include "common/support.hpp"
#include "deepio/kv.hpp"

namespace deepio {
namespace {

using namespace detail::gpu;
using test::pattern;
using test::slurp;

constexpr DeviceRouteMode kStaged = DeviceRouteMode::Staged;

class CudaStaging : public testing::Test {
 protected:
  void SetUp() override {
    detail::Status why;
    api_ = cuda(&why);
    if (api_ == nullptr) GTEST_SKIP() << "no (fake) CUDA driver: " << why.message;
    // The test thread allocates and copies as a CUDA program does: with a current context
    // (the real driver refuses those calls with CUDA_ERROR_INVALID_CONTEXT without one).
    CUdevice dev = 0;
    ASSERT_EQ(api_->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_->cuDevicePrimaryCtxRetain(&ctx_, dev), CUDA_SUCCESS);
    ASSERT_EQ(api_->cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (api_ != nullptr) set_result(nullptr, 0, 0);
  }
  void* device_alloc(std::size_t n) {
    CUdeviceptr p = 0;
    EXPECT_EQ(api_->cuMemAlloc(&p, n), CUDA_SUCCESS);
    allocs_.push_back(p);
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }
  // The fake driver's error injection, or nullptr on a real driver.
  using SetResult = void (*)(const char*, CUresult, int);
  SetResult fake_control() const {
    void* h = ::dlopen(api_->library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) return nullptr;
    auto* f = reinterpret_cast<SetResult>(::dlsym(h, "deepio_fake_cuda_set_result"));
    ::dlclose(h);
    return f;
  }
  void set_result(const char* name, CUresult r, int after) {
    if (SetResult f = fake_control()) f(name, r, after);
  }
  ~CudaStaging() override {
    if (api_ != nullptr && ctx_ != nullptr) {
      api_->cuCtxSetCurrent(ctx_);
      for (auto p : allocs_) api_->cuMemFree(p);
      api_->cuCtxSetCurrent(nullptr);
      CUdevice dev = 0;
      if (api_->cuDeviceGet(&dev, 0) == CUDA_SUCCESS) api_->cuDevicePrimaryCtxRelease(dev);
    }
  }
  const CudaApi* api_ = nullptr;
  CUcontext ctx_ = nullptr;
  std::vector<CUdeviceptr> allocs_;
  test::TempDir dir_;
};

TEST_F(CudaStaging, DeviceMemoryRoundTripsThroughTheEngine) {
  const std::size_t n = (3 << 20) + 4097;
  const auto data = pattern(n, 42);
  void* dev = device_alloc(n);
  ASSERT_EQ(api_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dev), data.data(), n), CUDA_SUCCESS);
  Handle h({.block_size = 256 << 10,
            .queue_depth = 4,
            .overlap_events = true,
            .intra_op_parallelism = 2,
            .device_route = kStaged});
  const std::string path = dir_.file("gpu.bin");
  h.sync_pwrite(dev, n, path, 513);
  auto file = slurp(path);
  ASSERT_EQ(file.size(), n + 513);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), file.begin() + 513));

  void* back = device_alloc(n);
  h.sync_pread(back, n, path, 513);
  std::vector<std::byte> host(n);
  ASSERT_EQ(api_->cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(back), n), CUDA_SUCCESS);
  EXPECT_EQ(host, data);
  const auto s = h.stats();
  EXPECT_EQ(s.bytes_direct, 0u) << "device memory is never handed to the kernel";
  EXPECT_GT(s.bytes_bounced, 0u);
}

// The engine sets up its own context on its workers: a thread that has none current (a
// thread pool's, Python's) can submit and wait on device memory.
TEST_F(CudaStaging, SubmittingFromAThreadWithoutAContextWorks) {
  const std::size_t n = (3 << 20) + 5;
  const auto data = pattern(n, 12);
  void* dev = device_alloc(n);
  ASSERT_EQ(api_->cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dev), data.data(), n), CUDA_SUCCESS);
  void* back = device_alloc(n);
  const std::string f = dir_.file("noctx.bin");
  std::thread([&] {
    CUcontext none = nullptr;
    ASSERT_EQ(api_->cuCtxGetCurrent(&none), CUDA_SUCCESS);
    ASSERT_EQ(none, nullptr) << "a new thread has no current context";
    Handle h({.block_size = 1 << 20, .queue_depth = 4, .intra_op_parallelism = 2, .device_route = kStaged});
    h.sync_pwrite(dev, n, f);
    h.sync_pread(back, n, f);
  }).join();
  EXPECT_EQ(slurp(f), data);
  std::vector<std::byte> host(n);
  ASSERT_EQ(api_->cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(back), n), CUDA_SUCCESS);
  EXPECT_EQ(host, data);
}

TEST_F(CudaStaging, HostBuffersStillGoDirect) {
  const auto info = probe_direct_io(dir_.path().string());
  if (!info.supported) GTEST_SKIP() << "no O_DIRECT here";
  device_alloc(4096);  // the driver is in use, so classification really asks it
  Handle h({.device_route = kStaged});
  UniqueLockedBuffer buf(1 << 20);
  std::memset(buf.data(), 3, buf.size());
  h.sync_pwrite(buf.data(), buf.size(), dir_.file("host"));
  EXPECT_EQ(h.stats().bytes_direct, buf.size());
}

TEST_F(CudaStaging, DriverCopyErrorsSurfaceWithTheirName) {
  if (fake_control() == nullptr) GTEST_SKIP() << "needs the fake driver to inject a copy failure";
  const std::size_t n = 1 << 20;
  const std::string path = dir_.file("e");
  test::put(path, pattern(n, 1));
  void* dev = device_alloc(n);
  Handle h({.block_size = 65536, .queue_depth = 4, .device_route = kStaged});
  set_result("cuMemcpyHtoD", 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */, 3);
  try {
    h.sync_pread(dev, n, path);
    FAIL() << "expected the copy failure";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << e.what();
  }
  set_result(nullptr, 0, 0);
  EXPECT_EQ(h.sync_pread(dev, n, path), 1u) << "the handle stays usable";
}

// The producer handshake (OpOptions::stream) on whichever driver runs this: the real one on a
// GPU machine (scripts/gpu-check.sh, step "staging"), the fake here. The producer's stream is
// kept busy (the real driver: a chain of large device-to-device copies, ~100 ms on an H100;
// the fake: a late fill), then sets the buffer with cuMemsetD8Async. A write ordered after it
// must write what it set; a read into it must end with the file's bytes, not the memset's.
TEST_F(CudaStaging, ProducerStreamOrdersTheStagedCopies) {
  using Memset = CUresult(CUdeviceptr, unsigned char, std::size_t, CUstream);
  using DtoD = CUresult(CUdeviceptr, CUdeviceptr, std::size_t, CUstream);
  using Fill = CUresult(void*, std::uintptr_t, int, std::size_t, long);
  void* lib = ::dlopen(api_->library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto* memset_async = reinterpret_cast<Memset*>(::dlsym(lib, "cuMemsetD8Async"));
  auto* dtod_async = reinterpret_cast<DtoD*>(::dlsym(lib, "cuMemcpyDtoDAsync_v2"));
  auto* fake_fill = reinterpret_cast<Fill*>(::dlsym(lib, "deepio_fake_cuda_enqueue_fill"));
  ::dlclose(lib);
  ASSERT_NE(memset_async, nullptr);
  ASSERT_NE(dtod_async, nullptr);
  const std::size_t busy_bytes = fake_fill != nullptr ? 4096 : std::size_t{512} << 20;
  const auto scratch_a = reinterpret_cast<CUdeviceptr>(device_alloc(busy_bytes));
  const auto scratch_b = reinterpret_cast<CUdeviceptr>(device_alloc(busy_bytes));
  const std::size_t n = (4 << 20) + 4097;
  void* dev = device_alloc(n);
  const auto d = reinterpret_cast<CUdeviceptr>(dev);
  const auto data = pattern(n, 77);
  CUstream side = nullptr;
  ASSERT_EQ(api_->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  Handle h({.block_size = 1 << 20, .queue_depth = 4, .intra_op_parallelism = 2, .device_route = kStaged});
  for (CUstream producer : {CUstream{nullptr}, side}) {
    SCOPED_TRACE(producer == nullptr ? "legacy default stream" : "non-blocking stream");
    auto keep_busy = [&] {
      if (fake_fill != nullptr) {
        ASSERT_EQ(fake_fill(producer, scratch_a, 1, busy_bytes, 200'000), CUDA_SUCCESS);
        return;
      }
      for (int i = 0; i < 100; ++i) ASSERT_EQ(dtod_async(scratch_b, scratch_a, busy_bytes, producer), CUDA_SUCCESS);
    };
    OpOptions after;
    after.stream = reinterpret_cast<std::uintptr_t>(producer);
    ASSERT_EQ(memset_async(d, 0, n, producer), CUDA_SUCCESS);
    ASSERT_EQ(api_->cuStreamSynchronize(producer), CUDA_SUCCESS);

    keep_busy();
    ASSERT_EQ(memset_async(d, 0x5C, n, producer), CUDA_SUCCESS);
    const std::string path = dir_.file("order.bin");
    EXPECT_EQ(h.async_pwrite(dev, n, path, 0, after).get(), n);
    const auto file = slurp(path);
    EXPECT_EQ(std::count(file.begin(), file.end(), std::byte{0x5C}), static_cast<std::ptrdiff_t>(n))
        << "the write staged the memory before the producer set it";

    test::put(path, data);
    keep_busy();
    ASSERT_EQ(memset_async(d, 0x77, n, producer), CUDA_SUCCESS);
    EXPECT_EQ(h.async_pread(dev, n, path, 0, after).get(), n);
    ASSERT_EQ(api_->cuStreamSynchronize(producer), CUDA_SUCCESS);
    std::vector<std::byte> back(n);
    ASSERT_EQ(api_->cuMemcpyDtoH(back.data(), d, n), CUDA_SUCCESS);
    EXPECT_TRUE(back == data) << "the producer's memset overwrote the read";
  }
  EXPECT_EQ(api_->cuStreamDestroy(side), CUDA_SUCCESS);
}

// deepio::kv::Store on device memory: pages move through the store's page-locked host buffers
// (the CRC-32C needs host bytes) with the engine's CudaStager. Two buffers for five pages, so
// the pipeline waits for buffers; one page mixes a device and a host segment.
TEST_F(CudaStaging, KvStoreMovesDevicePagesThroughHostBuffersAndChecksThem) {
  constexpr std::size_t kPage = 64 << 10;
  constexpr std::size_t kRows = 5;
  kv::StoreOptions o;
  o.folders = {(dir_.path() / "kv").string()};
  o.page_bytes = kPage;
  o.capacity_bytes = 16 * (4096 + kPage);
  o.batch_threads = 1;
  o.device_pages_in_flight = 2;
  o.checkpoint_interval = std::chrono::milliseconds(0);
  kv::Store store(o);
  auto* pool = static_cast<unsigned char*>(device_alloc(kRows * kPage));
  auto* back = static_cast<unsigned char*>(device_alloc(kRows * kPage));
  const auto dptr = [](const void* p) { return reinterpret_cast<CUdeviceptr>(p); };
  std::vector<std::vector<std::byte>> pages;
  for (std::size_t r = 0; r < kRows; ++r) {
    pages.push_back(pattern(kPage, static_cast<int>(r) + 7));
    ASSERT_EQ(api_->cuMemcpyHtoD(dptr(pool + r * kPage), pages[r].data(), kPage), CUDA_SUCCESS);
  }
  const std::vector<std::string> names = {"k0", "k1", "k2", "k3", "k4"};
  const std::vector<std::string_view> keys(names.begin(), names.end());
  std::vector<std::vector<kv::Segment>> src, dst;
  std::vector<std::byte> host_half(kPage / 2);
  for (std::size_t r = 0; r < kRows; ++r) {
    if (r == 3) {  // half on the device, half in host memory
      std::memcpy(host_half.data(), pages[3].data() + kPage / 2, kPage / 2);
      src.push_back({{pool + r * kPage, kPage / 2}, {host_half.data(), kPage / 2}});
    } else {
      src.push_back({{pool + r * kPage, kPage}});
    }
    dst.push_back({{back + r * kPage, kPage}});
  }
  EXPECT_EQ(store.put(keys, src).get(), std::vector<bool>(kRows, true));
  EXPECT_EQ(store.get(keys, dst).get(), std::vector<bool>(kRows, true));
  for (std::size_t r = 0; r < kRows; ++r) {
    std::vector<std::byte> host(kPage);
    ASSERT_EQ(api_->cuMemcpyDtoH(host.data(), dptr(back + r * kPage), kPage), CUDA_SUCCESS);
    EXPECT_EQ(host, pages[r]) << "row " << r;
  }
  EXPECT_EQ(store.stats().device_pages, 2 * kRows);

  // A flipped byte on disk: a miss, and the device row keeps what it held (nothing unverified
  // is copied to the device).
  const auto slab = dir_.path() / "kv" / "slab-0000.bin";
  auto bytes = slurp(slab.string());
  const auto at = std::search(bytes.begin(), bytes.end(), pages[0].begin(), pages[0].begin() + 256);
  ASSERT_NE(at, bytes.end());
  const auto off = static_cast<std::size_t>(at - bytes.begin()) + 100;
  {
    const int fd = ::open(slab.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const unsigned char flipped = static_cast<unsigned char>(bytes[off]) ^ 0xFF;
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(off)), 1);
    ::close(fd);
  }
  const std::vector<std::byte> sentinel(kPage, std::byte{0xEE});
  ASSERT_EQ(api_->cuMemcpyHtoD(dptr(back), sentinel.data(), kPage), CUDA_SUCCESS);
  std::vector<std::string_view> k0 = {keys[0]};
  std::vector<std::vector<kv::Segment>> row0 = {dst[0]};
  EXPECT_EQ(store.get(k0, row0).get(), std::vector<bool>{false});
  std::vector<std::byte> host(kPage);
  ASSERT_EQ(api_->cuMemcpyDtoH(host.data(), dptr(back), kPage), CUDA_SUCCESS);
  EXPECT_EQ(host, sentinel) << "a miss must not copy unverified bytes to the device";
  EXPECT_EQ(store.stats().corrupt, 1u);

  // Driver copy errors fail that page only (false), never the folder, and keep the page.
  if (fake_control() != nullptr) {
    std::vector<std::string_view> k1 = {keys[1]};
    std::vector<std::vector<kv::Segment>> row1 = {dst[1]};
    set_result("cuMemcpyHtoD", 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */, 0);
    EXPECT_EQ(store.get(k1, row1).get(), std::vector<bool>{false});
    set_result(nullptr, 0, 0);
    EXPECT_EQ(store.stats().device_copy_errors, 1u);
    EXPECT_EQ(store.get(k1, row1).get(), std::vector<bool>{true}) << "a failed copy does not forget the page";
    const std::vector<std::string_view> k9 = {"k9"};
    set_result("cuMemcpyDtoH", 700, 0);
    EXPECT_EQ(store.put(k9, std::vector<std::vector<kv::Segment>>{src[2]}).get(), std::vector<bool>{false});
    set_result(nullptr, 0, 0);
    EXPECT_EQ(store.contains(k9), std::vector<bool>{false});
    EXPECT_EQ(store.stats().device_copy_errors, 2u);
    EXPECT_FALSE(store.stats().folders.at(0).failed);
  }

  // Host pages in the same store, with the driver loaded: the host path, no device pages.
  const auto before = store.stats().device_pages;
  std::vector<std::byte> h(kPage), hb(kPage);
  std::memcpy(h.data(), pages[4].data(), kPage);
  const std::vector<std::string_view> kh = {"host"};
  EXPECT_EQ(store.put(kh, std::vector<std::vector<kv::Segment>>{{{h.data(), kPage}}}).get(), std::vector<bool>{true});
  EXPECT_EQ(store.get(kh, std::vector<std::vector<kv::Segment>>{{{hb.data(), kPage}}}).get(), std::vector<bool>{true});
  EXPECT_EQ(hb, h);
  EXPECT_EQ(store.stats().device_pages, before);
}

// BatchOptions::stream: a put copies what the producer's queued work wrote, a get's copy to the
// device lands after the producer's queued work (as ProducerStreamOrdersTheStagedCopies).
TEST_F(CudaStaging, KvStoreCopiesFollowTheProducerStream) {
  using Memset = CUresult(CUdeviceptr, unsigned char, std::size_t, CUstream);
  using DtoD = CUresult(CUdeviceptr, CUdeviceptr, std::size_t, CUstream);
  using Fill = CUresult(void*, std::uintptr_t, int, std::size_t, long);
  void* lib = ::dlopen(api_->library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto* memset_async = reinterpret_cast<Memset*>(::dlsym(lib, "cuMemsetD8Async"));
  auto* dtod_async = reinterpret_cast<DtoD*>(::dlsym(lib, "cuMemcpyDtoDAsync_v2"));
  auto* fake_fill = reinterpret_cast<Fill*>(::dlsym(lib, "deepio_fake_cuda_enqueue_fill"));
  ::dlclose(lib);
  ASSERT_NE(memset_async, nullptr);
  ASSERT_NE(dtod_async, nullptr);
  const std::size_t busy_bytes = fake_fill != nullptr ? 4096 : std::size_t{512} << 20;
  const auto scratch_a = reinterpret_cast<CUdeviceptr>(device_alloc(busy_bytes));
  const auto scratch_b = reinterpret_cast<CUdeviceptr>(device_alloc(busy_bytes));
  auto keep_busy = [&] {
    if (fake_fill != nullptr) {
      ASSERT_EQ(fake_fill(nullptr, scratch_a, 1, busy_bytes, 200'000), CUDA_SUCCESS);
      return;
    }
    for (int i = 0; i < 100; ++i) ASSERT_EQ(dtod_async(scratch_b, scratch_a, busy_bytes, nullptr), CUDA_SUCCESS);
  };
  constexpr std::size_t kPage = 256 << 10;
  kv::StoreOptions o;
  o.folders = {(dir_.path() / "kv").string()};
  o.page_bytes = kPage;
  o.capacity_bytes = 4 * (4096 + kPage);
  o.batch_threads = 1;
  o.checkpoint_interval = std::chrono::milliseconds(0);
  kv::Store store(o);
  void* dev = device_alloc(kPage);
  const auto d = reinterpret_cast<CUdeviceptr>(dev);
  const std::vector<std::string_view> key = {"p"};
  const std::vector<std::vector<kv::Segment>> page = {{{dev, kPage}}};
  const kv::BatchOptions legacy{.stream = 0};

  ASSERT_EQ(memset_async(d, 0, kPage, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  keep_busy();
  ASSERT_EQ(memset_async(d, 0x5C, kPage, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(store.put(key, page, legacy).get(), std::vector<bool>{true});
  keep_busy();
  ASSERT_EQ(memset_async(d, 0x77, kPage, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(store.get(key, page, legacy).get(), std::vector<bool>{true});
  ASSERT_EQ(api_->cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  std::vector<std::byte> back(kPage);
  ASSERT_EQ(api_->cuMemcpyDtoH(back.data(), d, kPage), CUDA_SUCCESS);
  EXPECT_EQ(std::count(back.begin(), back.end(), std::byte{0x5C}), static_cast<std::ptrdiff_t>(kPage))
      << "the put copied before the producer's memset (0x00), or the get landed before its next one (0x77)";
}

}  // namespace
}  // namespace deepio
