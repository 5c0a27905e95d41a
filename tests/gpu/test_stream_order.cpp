// Stream order by handshake (OpOptions::stream): staged copies of device memory wait for the
// producer's stream on the device, not by stalling the caller. Against the fake driver, whose
// streams run late on their own threads (tests/gpu/fake_cuda.c): a "kernel" queued on a
// producer stream (deepio_fake_cuda_enqueue_fill) fills device memory a while after the call,
// so a staging copy that is not ordered after it sees the memory as it was before (writes),
// or is overwritten by it afterwards (reads). Run by the deepio_gpu_tests.fake_env ctest entry
// (DEEPIO_CUDA_LIBRARY pointing at the fake); they skip elsewhere. The plain handles pin
// device_route Staged (the environment also offers the fake cuFile, which Auto would take);
// the cuFile route's ordering is the GdsHandle case at the end.
#include <chrono>
#include <future>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/deepio.hpp"
#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "gpu_support.hpp"

namespace {

using namespace deepio;
using namespace deepio::detail::gpu;
using deepio::gputest::CurrentContext;
using deepio::gputest::fake_symbol;
using deepio::gputest::pattern;
using deepio::gputest::put;
using deepio::gputest::slurp;
using deepio::gputest::TempDir;

// The index of the first byte where a and b differ ("none" when equal), with both bytes:
// short failure messages for megabytes of data.
std::string first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return "byte " + std::to_string(i) + ": " + std::to_string(static_cast<int>(a[i])) + " vs " +
             std::to_string(static_cast<int>(b[i]));
    }
  }
  return "none";
}
std::vector<std::byte> bytes(int value, std::size_t n) { return std::vector<std::byte>(n, std::byte(value)); }

using EnqueueFill = CUresult(void* stream, std::uintptr_t ptr, int byte, std::size_t nbytes, long delay_us);
using SetCopyDelay = void(long us);
using StreamWaits = long();
using SetResult = void(const char* name, CUresult result, int after);
using HoldFills = void(int hold);

constexpr long kLateUs = 300'000;  // how late the producer's fill runs

enum class Producer { Legacy, NonBlocking };
std::string name_of(const testing::TestParamInfo<Producer>& p) {
  return p.param == Producer::Legacy ? "LegacyDefaultStream" : "NonBlockingStream";
}

class FakeEnvStreams : public testing::TestWithParam<Producer> {
 protected:
  void SetUp() override {
    const char* v = std::getenv("DEEPIO_CUDA_LIBRARY");
    if (v == nullptr || std::string(v) != DEEPIO_FAKE_CUDA)
      GTEST_SKIP() << "run through ctest deepio_gpu_tests.fake_env";
    detail::Status why;
    api_ = cuda(&why);
    ASSERT_NE(api_, nullptr) << why.message;
    ctx_ = std::make_unique<CurrentContext>(api_);
    fill_ = fake_symbol<EnqueueFill>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_enqueue_fill");
    copy_delay_ = fake_symbol<SetCopyDelay>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_copy_delay_us");
    waits_ = fake_symbol<StreamWaits>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_stream_waits");
    set_result_ = fake_symbol<SetResult>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_set_result");
    hold_fills_ = fake_symbol<HoldFills>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_hold_fills");
    if (GetParam() == Producer::NonBlocking) {
      ASSERT_EQ(api_->cuStreamCreate(&producer_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    }
  }
  void TearDown() override {
    if (api_ == nullptr) return;
    set_result_(nullptr, 0, 0);
    copy_delay_(0);
    hold_fills_(0);
    api_->cuStreamSynchronize(producer_);
    if (producer_ != nullptr) api_->cuStreamDestroy(producer_);
    for (auto p : allocs_) api_->cuMemFree(p);
    ctx_.reset();
  }
  void* device_alloc(std::size_t n) {
    CUdeviceptr p = 0;
    EXPECT_EQ(api_->cuMemAlloc(&p, n), CUDA_SUCCESS);
    allocs_.push_back(p);
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }
  // Options naming the producer's stream (0: the legacy default stream).
  [[nodiscard]] OpOptions after_producer() const {
    OpOptions o;
    o.stream = reinterpret_cast<std::uintptr_t>(producer_);
    return o;
  }
  // Queues a late "kernel" on the producer's stream that sets n bytes at p to `byte`.
  void produce(void* p, int byte, std::size_t n) {
    ASSERT_EQ(fill_(producer_, reinterpret_cast<std::uintptr_t>(p), byte, n, kLateUs), CUDA_SUCCESS);
  }
  // Queues a "kernel" on the producer's stream that sets n bytes at p to `byte` only once
  // release_fills() is called, and holds fills until then.
  void produce_held(void* p, int byte, std::size_t n) {
    hold_fills_(1);
    ASSERT_EQ(fill_(producer_, reinterpret_cast<std::uintptr_t>(p), byte, n, -1), CUDA_SUCCESS);
  }
  void release_fills() { hold_fills_(0); }
  // Runs `submit` on another thread while the producer's fill is held (produce_held) and returns
  // its Future; fails the test if the submission does not return while the fill is held (it
  // waited for the producer), releasing the fill first so that nothing hangs. No clock decides:
  // the 60 s only bounds a broken engine.
  template <class Submit>
  Future submitted_while_held(Submit&& submit) {
    auto pending = std::async(std::launch::async, std::forward<Submit>(submit));
    const bool returned = pending.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    release_fills();
    EXPECT_TRUE(returned) << "the submission waited for the producer";
    return pending.get();
  }
  // Device memory as the device has it once every stream is idle.
  std::vector<std::byte> device_bytes(const void* p, std::size_t n) {
    EXPECT_EQ(api_->cuStreamSynchronize(producer_), CUDA_SUCCESS);
    std::vector<std::byte> out(n);
    EXPECT_EQ(api_->cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(p), n), CUDA_SUCCESS);
    return out;
  }

  const CudaApi* api_ = nullptr;
  std::unique_ptr<CurrentContext> ctx_;
  CUstream producer_ = nullptr;  // null: the legacy default stream
  EnqueueFill* fill_ = nullptr;
  SetCopyDelay* copy_delay_ = nullptr;
  StreamWaits* waits_ = nullptr;
  SetResult* set_result_ = nullptr;
  HoldFills* hold_fills_ = nullptr;
  std::vector<CUdeviceptr> allocs_;
  TempDir dir_;
};

// A write whose source a producer is still filling writes the filled bytes, and submitting it
// does not wait for the producer.
TEST_P(FakeEnvStreams, WriteStagesWhatTheProducerWrote) {
  const std::size_t n = (1 << 20) + 4097;
  void* dev = device_alloc(n);
  Handle h(
      {.block_size = 256 << 10, .queue_depth = 4, .intra_op_parallelism = 2, .device_route = DeviceRouteMode::Staged});
  const std::string path = dir_.file("w.bin");
  const long waits = waits_();
  produce_held(dev, 0x5C, n);
  Future f = submitted_while_held([&] { return h.async_pwrite(dev, n, path, 0, after_producer()); });
  EXPECT_EQ(f.get(), n);
  EXPECT_GE(waits_() - waits, 2) << "each worker's stream waits for the producer's event";
  EXPECT_EQ(first_difference(slurp(path), bytes(0x5C, n)), "none") << "the file holds what the producer wrote";
}

// A read into memory the producer is still filling (with other bytes) ends with the file's
// bytes: the read's host-to-device copies run after the producer's fill.
TEST_P(FakeEnvStreams, ReadLandsAfterTheProducer) {
  const std::size_t n = (1 << 20) + 4097;
  const auto data = pattern(n, 7);
  const std::string path = dir_.file("r.bin");
  put(path, data);
  void* dev = device_alloc(n);
  Handle h(
      {.block_size = 256 << 10, .queue_depth = 4, .intra_op_parallelism = 2, .device_route = DeviceRouteMode::Staged});
  produce_held(dev, 0x77, n);
  Future f = submitted_while_held([&] { return h.async_pread(dev, n, path, 0, after_producer()); });
  EXPECT_EQ(f.get(), n);
  EXPECT_EQ(first_difference(device_bytes(dev, n), data), "none") << "the device holds the file's bytes";
}

// The same through a batch (per-request options) and a ranged read.
TEST_P(FakeEnvStreams, BatchesAndRangesAreOrderedToo) {
  const std::size_t n = 300'000;
  const auto data = pattern(n, 9);
  const std::string src = dir_.file("src.bin");
  put(src, data);
  void* out = device_alloc(n);
  void* in = device_alloc(n);
  void* ranged = device_alloc(n);
  Handle h({.block_size = 64 << 10, .queue_depth = 8, .device_route = DeviceRouteMode::Staged});
  produce(out, 0x31, n);
  produce(in, 0x32, n);
  produce(ranged, 0x33, n);
  std::vector<IoRequest> batch(2);
  batch[0].write = true;
  batch[0].buffer = out;
  batch[0].path = dir_.file("out.bin");
  batch[1].buffer = in;
  batch[1].path = src;
  for (auto& r : batch) {
    r.nbytes = n;
    r.op = after_producer();
  }
  auto futures = h.submit_batch(std::move(batch));
  const std::vector<IoRange> ranges{{0, 0, n / 2}, {n / 2, n / 2, n - n / 2}};
  Future r = h.async_pread_ranges(ranged, n, src, ranges, after_producer());
  for (auto& f : futures) EXPECT_EQ(f.get(), n);
  EXPECT_EQ(r.get(), n);
  EXPECT_EQ(first_difference(slurp(dir_.file("out.bin")), bytes(0x31, n)), "none");
  EXPECT_EQ(first_difference(device_bytes(in, n), data), "none");
  EXPECT_EQ(first_difference(device_bytes(ranged, n), data), "none");
}

// Without a stream nothing is ordered (the caller's job, as before) and nothing waits; the
// completion guarantee still holds with late copies: after get() the bytes are in device
// memory, for every stream.
TEST_P(FakeEnvStreams, CompletionMeansTheBytesAreOnTheDevice) {
  copy_delay_(2000);
  const std::size_t n = (1 << 20) + 3;
  const auto data = pattern(n, 11);
  const std::string path = dir_.file("c.bin");
  put(path, data);
  void* dev = device_alloc(n);
  Handle h(
      {.block_size = 128 << 10, .queue_depth = 4, .intra_op_parallelism = 2, .device_route = DeviceRouteMode::Staged});
  const long waits = waits_();
  EXPECT_EQ(h.async_pread(dev, n, path).get(), n);
  EXPECT_EQ(waits_(), waits) << "no stream given: no handshake";
  // Read back on the producer's stream (not the legacy one the synchronous copy would use).
  std::vector<std::byte> back(n);
  ASSERT_EQ(api_->cuMemcpyDtoHAsync(back.data(), reinterpret_cast<CUdeviceptr>(dev), n, producer_), CUDA_SUCCESS);
  ASSERT_EQ(api_->cuStreamSynchronize(producer_), CUDA_SUCCESS);
  EXPECT_EQ(first_difference(back, data), "none");
}

// A failure to record the producer's event is the submission's error, naming the call.
TEST_P(FakeEnvStreams, RecordFailureIsTheSubmissionsError) {
  const std::size_t n = 4096;
  void* dev = device_alloc(n);
  Handle h({.device_route = DeviceRouteMode::Staged});
  set_result_("cuEventRecord", 400 /* CUDA_ERROR_INVALID_HANDLE */, 0);
  try {
    h.async_pwrite(dev, n, dir_.file("e.bin"), 0, after_producer());
    FAIL() << "expected the record failure";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_NE(std::string(e.what()).find("cuEventRecord"), std::string::npos) << e.what();
  }
  set_result_(nullptr, 0, 0);
  produce(dev, 0x42, n);
  EXPECT_EQ(h.async_pwrite(dev, n, dir_.file("e.bin"), 0, after_producer()).get(), n) << "the handle stays usable";
  EXPECT_EQ(first_difference(slurp(dir_.file("e.bin")), bytes(0x42, n)), "none");
}

// Host memory ignores the stream (no driver call is made for it).
TEST_P(FakeEnvStreams, HostMemoryIgnoresTheStream) {
  const auto data = pattern(10000, 3);
  Handle h({.device_route = DeviceRouteMode::Staged});
  const long waits = waits_();
  OpOptions junk;
  junk.stream = 0xdead;
  EXPECT_EQ(h.async_pwrite(data.data(), data.size(), dir_.file("h.bin"), 0, junk).get(), data.size());
  EXPECT_EQ(slurp(dir_.file("h.bin")), data);
  EXPECT_EQ(waits_(), waits);
}

// cuFile transfers follow no stream: GdsHandle's route workers wait for the producer's event
// on their own thread before the first chunk (the fake cuFile reads and writes the device
// memory directly, so an early transfer sees or is overwritten by the wrong bytes). Where cuFile
// is not the fake (DEEPIO_CUFILE_LIBRARY=none, as scripts/gpu-check.sh's ctest_nocufile runs
// it), the handle is in compat mode and the same transfers take the staging route, which must
// wait for the producer just the same.
TEST_P(FakeEnvStreams, CuFileRouteWaitsForTheProducer) {
  const std::size_t n = 10 * 4096 + 17;
  const char* cufile = std::getenv("DEEPIO_CUFILE_LIBRARY");
  const bool fake_cufile = cufile != nullptr && std::string(cufile) == DEEPIO_FAKE_CUFILE;
  GdsHandle h({.block_size = 4096, .intra_op_parallelism = 2});
  if (fake_cufile) {
    ASSERT_EQ(h.mode(), "gds") << h.mode_reason();
  } else {
    ASSERT_EQ(h.mode(), "compat") << "no fake cuFile here, yet the handle is in gds mode";
  }
  void* dev = device_alloc(n);
  const std::string path = dir_.file("g.bin");
  produce_held(dev, 0x6A, n);
  Future w = submitted_while_held([&] { return h.async_pwrite(dev, n, path, 0, after_producer()); });
  EXPECT_EQ(w.get(), n);
  EXPECT_EQ(first_difference(slurp(path), bytes(0x6A, n)), "none");
  if (fake_cufile) {
    EXPECT_GT(h.gds_stats().bytes_cufile, 0u) << "went through cuFile";
  } else {
    EXPECT_EQ(h.gds_stats().bytes_cufile, 0u) << "compat mode staged";
  }

  const auto data = pattern(n, 5);
  put(path, data);
  produce(dev, 0x6B, n);
  EXPECT_EQ(h.async_pread(dev, n, path, 0, after_producer()).get(), n);
  EXPECT_EQ(first_difference(device_bytes(dev, n), data), "none");
}

INSTANTIATE_TEST_SUITE_P(Producers, FakeEnvStreams, testing::Values(Producer::Legacy, Producer::NonBlocking), name_of);

// The fake itself: copies and fills run late and in order per stream; events and waits follow.
TEST(FakeEnvStreamsDriver, StreamsRunLateAndInOrder) {
  const char* v = std::getenv("DEEPIO_CUDA_LIBRARY");
  if (v == nullptr || std::string(v) != DEEPIO_FAKE_CUDA) GTEST_SKIP() << "run through ctest deepio_gpu_tests.fake_env";
  detail::Status why;
  const CudaApi* api = cuda(&why);
  ASSERT_NE(api, nullptr) << why.message;
  CurrentContext ctx(api);
  auto* fill = fake_symbol<EnqueueFill>(DEEPIO_FAKE_CUDA, "deepio_fake_cuda_enqueue_fill");
  CUdeviceptr d = 0;
  ASSERT_EQ(api->cuMemAlloc(&d, 64), CUDA_SUCCESS);
  CUstream a = nullptr;
  CUstream b = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(api->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  EXPECT_EQ(api->cuEventQuery(e), CUDA_SUCCESS) << "never recorded: complete";
  ASSERT_EQ(fill(a, d, 1, 64, 100'000), CUDA_SUCCESS);
  ASSERT_EQ(api->cuEventRecord(e, a), CUDA_SUCCESS);
  EXPECT_EQ(api->cuEventQuery(e), CUDA_ERROR_NOT_READY);
  std::vector<unsigned char> host(64, 9);
  ASSERT_EQ(api->cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
  ASSERT_EQ(api->cuMemcpyDtoHAsync(host.data(), d, 64, b), CUDA_SUCCESS);
  ASSERT_EQ(api->cuStreamSynchronize(b), CUDA_SUCCESS);
  EXPECT_EQ(host, std::vector<unsigned char>(64, 1)) << "b's copy ran after a's fill";
  EXPECT_EQ(api->cuEventQuery(e), CUDA_SUCCESS);
  // The legacy default stream is a stream too, and the synchronous copy waits for it.
  ASSERT_EQ(fill(nullptr, d, 2, 64, 50'000), CUDA_SUCCESS);
  ASSERT_EQ(api->cuMemcpyDtoH(host.data(), d, 64), CUDA_SUCCESS);
  EXPECT_EQ(host, std::vector<unsigned char>(64, 2));
  EXPECT_EQ(api->cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(api->cuStreamDestroy(a), CUDA_SUCCESS);
  EXPECT_EQ(api->cuStreamDestroy(b), CUDA_SUCCESS);
  EXPECT_EQ(api->cuMemFree(d), CUDA_SUCCESS);
}

}  // namespace
