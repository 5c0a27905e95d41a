// The staging pipeline for device memory, exercised without a GPU: a "device" here is a host
// region that the classify hook claims, and the stager defers each host-to-device copy until
// the worker asks whether it is done. If the worker reused a staging slot, or completed an
// operation, before its copy finished, the deferred copy would carry the wrong bytes (or
// arrive after wait() returned) and these tests would fail.
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "core/stager.hpp"
#include "engine/device.hpp"
#include "common/support.hpp"

namespace deepio {
namespace {

using detail::DeviceStager;
using detail::Status;
using test::pattern;
using test::slurp;

struct FakeDevice {
  std::vector<std::byte> memory = std::vector<std::byte>(std::size_t{64} << 20);
  std::atomic<int> stagers{0};
  std::atomic<std::size_t> slots{0};  // staging slots the last stager was made for
  std::atomic<int> registrations{0};
  std::atomic<int> copies_in{0}, copies_out{0};
  std::atomic<int> fail_after{-1};  // from_staging call number that fails with EIO
  bool owns(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= memory.data() && b < memory.data() + memory.size();
  }
};

class FakeStager : public DeviceStager {
 public:
  explicit FakeStager(FakeDevice* dev) : dev_(dev) {}
  Status register_staging(void* base, std::size_t nbytes) override {
    ++dev_->registrations;
    base_ = base;
    size_ = nbytes;
    return {};
  }
  Status to_staging(int, void* staging, const std::byte* src, std::size_t n) override {
    EXPECT_TRUE(dev_->owns(src));
    check_staging(staging, n);
    std::memcpy(staging, src, n);
    ++dev_->copies_in;
    return {};
  }
  Status from_staging(int slot, std::byte* dst, const void* staging, std::size_t n) override {
    EXPECT_TRUE(dev_->owns(dst));
    check_staging(staging, n);
    EXPECT_EQ(pending_.count(slot), 0u) << "slot reused before its copy finished";
    if (dev_->fail_after.load() >= 0 && dev_->copies_out.fetch_add(1) == dev_->fail_after.load()) {
      return Status::failure(EIO, "fake device copy failed");
    }
    // Snapshot nothing: the copy reads the staging slot later, as an async DMA would.
    pending_[slot] = {dst, static_cast<const std::byte*>(staging), n, 0};
    return {};
  }
  bool done(int slot) override {
    auto it = pending_.find(slot);
    if (it == pending_.end()) return true;
    if (++it->second.polls < 2) return false;  // "still running" the first time
    finish(it);
    return true;
  }
  Status wait(int slot) override {
    auto it = pending_.find(slot);
    if (it != pending_.end()) finish(it);
    return {};
  }

 private:
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    std::size_t n;
    int polls;
  };
  void finish(std::map<int, Copy>::iterator it) {
    std::memcpy(it->second.dst, it->second.src, it->second.n);
    pending_.erase(it);
  }
  void check_staging(const void* p, std::size_t n) const {
    auto* b = static_cast<const std::byte*>(p);
    EXPECT_TRUE(b >= static_cast<std::byte*>(base_) && b + n <= static_cast<std::byte*>(base_) + size_)
        << "staging outside the registered arena";
  }
  FakeDevice* dev_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::map<int, Copy> pending_;
};

class Staging : public test::BackendTest {
 protected:
  void SetUp() override {
    test::BackendTest::SetUp();
    if (IsSkipped()) return;
    detail::set_device_support({[this](const void* p) { return dev_.owns(p) ? 0 : -1; },
                                [this](int device, std::size_t slots, Status*) -> std::unique_ptr<DeviceStager> {
                                  EXPECT_EQ(device, 0);
                                  ++dev_.stagers;
                                  dev_.slots = slots;
                                  return std::make_unique<FakeStager>(&dev_);
                                },
                                {}});
  }
  void TearDown() override {
    detail::set_device_support({});
    test::BackendTest::TearDown();
  }
  FakeDevice dev_;
};

TEST_P(Staging, DeviceBuffersRoundTripThroughFewSlots) {
  // queue_depth 4 => at most 4 staging slots per worker: slots are reused many times.
  Handle h(opts({.block_size = 65536, .queue_depth = 4, .overlap_events = true, .intra_op_parallelism = 2}));
  const std::string path = dir_.file("dev");
  for (std::size_t n : {1ul, 4097ul, (1ul << 20) + 333, (5ul << 20) + 1}) {
    for (std::uint64_t off : {0ul, 7ul, 65536ul}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " off=" << off);
      const auto data = pattern(n, static_cast<std::uint32_t>(n + off));
      std::byte* src = dev_.memory.data() + 4096;
      std::memcpy(src, data.data(), n);
      h.sync_pwrite(src, n, path, off);
      auto file = slurp(path);
      ASSERT_TRUE(std::equal(data.begin(), data.end(), file.begin() + static_cast<std::ptrdiff_t>(off)));
      std::byte* dst = dev_.memory.data() + (32u << 20) + 3;
      std::memset(dst, 0, n);
      h.sync_pread(dst, n, path, off);
      ASSERT_EQ(std::memcmp(dst, data.data(), n), 0) << "device bytes differ after wait()";
    }
  }
  EXPECT_EQ(dev_.stagers.load(), 2) << "one stager per worker, made once";
  EXPECT_EQ(dev_.registrations.load(), 2);
  EXPECT_EQ(h.stats().bytes_direct, 0u) << "device memory never goes to the kernel directly";
}

TEST_P(Staging, ManyAsyncDeviceReadsThenOneWait) {
  Handle h(opts({.block_size = 65536, .queue_depth = 3, .overlap_events = false}));
  constexpr int kOps = 24;
  const std::size_t n = 200000;
  for (int i = 0; i < kOps; ++i)
    test::put(dir_.file("r" + std::to_string(i)), pattern(n, static_cast<std::uint32_t>(i)));
  for (int i = 0; i < kOps; ++i) {
    h.async_pread(dev_.memory.data() + static_cast<std::size_t>(i) * n, n, dir_.file("r" + std::to_string(i)));
  }
  EXPECT_EQ(h.wait(), static_cast<std::size_t>(kOps));
  for (int i = 0; i < kOps; ++i) {
    const auto expect = pattern(n, static_cast<std::uint32_t>(i));
    ASSERT_EQ(std::memcmp(dev_.memory.data() + static_cast<std::size_t>(i) * n, expect.data(), n), 0) << i;
  }
}

TEST_P(Staging, CopyFailureFailsTheOpAfterEverythingFinished) {
  Handle h(opts({.block_size = 65536, .queue_depth = 4}));
  const std::string path = dir_.file("f");
  test::put(path, pattern(1 << 20, 1));
  dev_.fail_after = 5;
  try {
    h.sync_pread(dev_.memory.data(), 1 << 20, path);
    FAIL() << "expected EIO";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), path);
  }
  dev_.fail_after = -1;
  EXPECT_EQ(h.sync_pread(dev_.memory.data(), 1 << 20, path), 1u) << "the handle stays usable";
}

TEST_P(Staging, NoDriverMeansAClearError) {
  detail::set_device_support({[this](const void* p) { return dev_.owns(p) ? 0 : -1; }, {}, {}});
  Handle h(opts({}));
  const std::string path = dir_.file("x");
  test::put(path, pattern(10000, 1));
  try {
    h.sync_pread(dev_.memory.data(), 10000, path);
    FAIL() << "expected ENODEV";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODEV);
    EXPECT_EQ(e.path(), path);
  }
}

TEST_P(Staging, StagingBytesSetsTheSlotsPerWorker) {
  // DEEPIO_STAGING_BYTES is the staging memory of one worker: slots of block_size bytes, at
  // least two, never more than queue_depth.
  struct Case {
    const char* value;  // nullptr: unset
    std::size_t slots;
  };
  const std::string path = dir_.file("s");
  test::put(path, pattern(4096, 9));
  for (const Case c :
       {Case{nullptr, 16}, Case{"4M", 4}, Case{"4194304", 4}, Case{"64M", 32}, Case{"64K", 2}, Case{"1g", 32}}) {
    SCOPED_TRACE(c.value != nullptr ? c.value : "(unset)");
    if (c.value != nullptr) {
      ASSERT_EQ(::setenv("DEEPIO_STAGING_BYTES", c.value, 1), 0);
    } else {
      ::unsetenv("DEEPIO_STAGING_BYTES");
    }
    {
      Handle h(opts({.block_size = 1 << 20, .queue_depth = 32, .intra_op_parallelism = 1}));
      dev_.slots = 0;
      EXPECT_EQ(h.sync_pread(dev_.memory.data(), 4096, path), 1u);
      EXPECT_EQ(dev_.slots.load(), c.slots);
    }
    ::unsetenv("DEEPIO_STAGING_BYTES");
  }
  for (const char* bad : {"0", "lots", "-4M", "16MB", "2G", "32K", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    ASSERT_EQ(::setenv("DEEPIO_STAGING_BYTES", bad, 1), 0);
    try {
      Handle h(opts({}));
      ADD_FAILURE() << "garbage accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.errnum(), EINVAL);
      EXPECT_NE(std::string(e.what()).find("DEEPIO_STAGING_BYTES"), std::string::npos) << e.what();
    }
    ::unsetenv("DEEPIO_STAGING_BYTES");
  }
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Staging);

// Issue 46: deepio's own locked memory is host memory, so no op on it asks the GPU driver
// (classify is a cuPointerGetAttribute in a CUDA process); other memory still is asked about.
TEST(DeviceClassify, LockedMemoryIsNeverAskedAboutOtherMemoryIs) {
  std::atomic<int> asked{0};
  detail::set_device_support({[&](const void*) {
                                asked.fetch_add(1);
                                return -1;
                              },
                              {},
                              {}});
  test::TempDir dir;
  const std::string path = dir.file("f");
  const auto data = pattern(1 << 16, 3);
  test::put(path, data);
  {
    Handle h(HandleOptions{});
    UniqueLockedBuffer locked(1 << 16);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(h.sync_pread(locked.data(), 1 << 16, path), 1u);
    EXPECT_EQ(std::memcmp(locked.data(), data.data(), data.size()), 0);
    EXPECT_EQ(asked.load(), 0);
    std::vector<std::byte> plain(1 << 16);
    EXPECT_EQ(h.sync_pread(plain.data(), plain.size(), path), 1u);
    EXPECT_EQ(asked.load(), 1);
  }
  detail::set_device_support({});
}

}  // namespace
}  // namespace deepio
