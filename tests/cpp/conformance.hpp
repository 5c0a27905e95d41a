// The conformance suite's fixture (tests/cpp/test_conformance.cpp says what the suite is): one
// instance per backend and one over the GPUDirect Storage route; shared by the suite's files.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "deepio/gpu.hpp"
#include "platform/fault.hpp"
#include "common/support.hpp"

namespace deepio::conformance {

using test::OffsetBuffer;
using test::pattern;
using test::put;
using test::slurp;

// A backend, or the GDS route (kind ignored).
struct Variant {
  BackendKind kind = BackendKind::Auto;
  bool gds = false;
};

inline std::string variant_name(const testing::TestParamInfo<Variant>& info) {
  return info.param.gds ? "gds" : std::string(to_string(info.param.kind));
}

// Turns the fake driver's "every buffer is device memory" switch on or off; false when the
// process did not load the fake (a real driver, or none).
inline bool adopt_all(bool on) {
  const char* lib = std::getenv("DEEPIO_CUDA_LIBRARY");
  if (lib == nullptr || *lib == '\0') return false;
  void* h = ::dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  auto* fn = reinterpret_cast<void (*)(int)>(::dlsym(h, "deepio_fake_cuda_adopt_all"));
  if (fn != nullptr) fn(on ? 1 : 0);
  ::dlclose(h);
  return fn != nullptr;
}

class Conformance : public testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    if (gds()) {
      const GpuInfo info = gpu_info();  // loads the drivers named by the environment
      if (!info.cuda_found || !info.cufile_found) {
        GTEST_SKIP() << "no CUDA/cuFile: " << info.cuda_reason << info.cufile_reason;
      }
      if (!adopt_all(true)) {
        GTEST_SKIP() << "the GDS instance needs the fake CUDA driver (DEEPIO_CUDA_LIBRARY)";
      }
      return;
    }
    std::string why;
    if (!test::backend_available(GetParam().kind, &why)) {
      GTEST_SKIP() << to_string(GetParam().kind) << ": " << why;
    }
  }
  void TearDown() override {
    detail::set_fault_hook({});
    if (gds()) {
      // Every test really went through cuFile, not through staging or the host path.
      for (const auto& h : made_) EXPECT_EQ(h->gds_stats().bytes_staged, 0u);
      std::uint64_t cufile = 0;
      for (const auto& h : made_) cufile += h->gds_stats().bytes_cufile;
      if (!made_.empty()) {
        EXPECT_GT(cufile, 0u) << "no byte went through cuFile";
      }
      adopt_all(false);
    }
  }
  [[nodiscard]] bool gds() const { return GetParam().gds; }
  /// `o` with this test's backend.
  [[nodiscard]] HandleOptions opts(HandleOptions o = {}) const {
    if (!gds()) o.backend = GetParam().kind;
    return o;
  }
  /// A Handle, or for the GDS instance a GdsHandle with the same options.
  std::shared_ptr<Handle> make(const HandleOptions& o) {
    if (!gds()) return std::make_shared<Handle>(o);
    auto h = std::make_shared<GdsHandle>(GdsOptions{.block_size = o.block_size,
                                                    .queue_depth = o.queue_depth,
                                                    .single_submit = o.single_submit,
                                                    .overlap_events = o.overlap_events,
                                                    .intra_op_parallelism = o.intra_op_parallelism,
                                                    .mode = GdsMode::CuFile});
    const std::lock_guard lock(made_mutex_);  // tests make handles from several threads
    made_.push_back(h);
    return h;
  }
  /// For a test that must destroy its handle: TearDown's cuFile check no longer covers it.
  void forget(const Handle* h) {
    const std::lock_guard lock(made_mutex_);
    std::erase_if(made_, [h](const auto& m) { return m.get() == h; });
  }
  test::TempDir dir_;
  std::mutex made_mutex_;
  std::vector<std::shared_ptr<GdsHandle>> made_;  // kept for TearDown's check of their stats
};

// Writes `n` bytes at `offset` from a buffer misaligned by `misalign`, checks the file, then
// reads them back into another misaligned buffer and checks memory.
inline void round_trip(Handle& h, const std::string& path, std::size_t n, std::uint64_t offset, std::size_t misalign,
                       std::uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " offset=" << offset << " misalign=" << misalign);
  const auto data = pattern(n, seed);
  const auto before = slurp(path);
  OffsetBuffer src(n, misalign);
  src.fill(data);
  h.sync_pwrite(src.data(), n, path, offset);
  auto after = slurp(path);
  ASSERT_EQ(after.size(), std::max<std::size_t>(before.size(), offset + n)) << "no truncation, exact extent";
  ASSERT_TRUE(std::equal(data.begin(), data.end(), after.begin() + static_cast<std::ptrdiff_t>(offset)))
      << "written bytes differ";
  for (std::size_t i = 0; i < std::min<std::size_t>(before.size(), offset); ++i) {
    ASSERT_EQ(after[i], before[i]) << "byte " << i << " before the write changed";
  }
  for (std::size_t i = offset + n; i < before.size(); ++i) {
    ASSERT_EQ(after[i], before[i]) << "byte " << i << " after the write changed";
  }
  OffsetBuffer dst(n, (misalign * 7 + 3) % 4096);
  std::memset(dst.data(), 0x5a, n);
  h.sync_pread(dst.data(), n, path, offset);
  ASSERT_EQ(dst.copy(), data) << "read bytes differ";
}

}  // namespace deepio::conformance
