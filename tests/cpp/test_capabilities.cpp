#include <gtest/gtest.h>

#include "deepio/deepio.hpp"
#include "common/support.hpp"

namespace deepio {
namespace {

TEST(Capabilities, ListsAllBackendsInAutoOrderWithReasons) {
  const Capabilities caps = capabilities();
  ASSERT_EQ(caps.backends.size(), 3u);
  EXPECT_EQ(caps.backends[0].kind, BackendKind::IoUring);
  EXPECT_EQ(caps.backends[1].kind, BackendKind::Libaio);
  EXPECT_EQ(caps.backends[2].kind, BackendKind::Threads);
  EXPECT_TRUE(caps.backends[2].available) << "threads always works";
  for (const auto& b : caps.backends) {
    EXPECT_EQ(b.available, b.reason.empty()) << to_string(b.kind) << ": " << b.reason;
  }
  // Auto picks the first available one, and a Handle agrees.
  BackendKind first = BackendKind::Threads;
  for (const auto& b : caps.backends) {
    if (b.available) {
      first = b.kind;
      break;
    }
  }
  EXPECT_EQ(caps.auto_choice, first);
  Handle h;
  EXPECT_EQ(h.backend(), first);
  EXPECT_EQ(caps.version, version());
}

TEST(Capabilities, ParsesNames) {
  EXPECT_EQ(parse_backend("io_uring"), BackendKind::IoUring);
  EXPECT_EQ(parse_backend("libaio"), BackendKind::Libaio);
  EXPECT_EQ(parse_backend("threads"), BackendKind::Threads);
  EXPECT_EQ(parse_backend("auto"), BackendKind::Auto);
  EXPECT_FALSE(parse_backend("fast").has_value());
  EXPECT_EQ(parse_direct_io("on"), DirectIo::On);
  EXPECT_FALSE(parse_direct_io("yes").has_value());
  for (auto k : {BackendKind::Auto, BackendKind::IoUring, BackendKind::Libaio, BackendKind::Threads}) {
    EXPECT_EQ(parse_backend(to_string(k)), k);
  }
}

TEST(Capabilities, ProbesDirectIoOfARealFolderAndTmpfs) {
  test::TempDir dir;
  const DirectIoInfo disk = probe_direct_io(dir.path().string());
  EXPECT_FALSE(disk.filesystem.empty());
  if (disk.supported) {
    EXPECT_GT(disk.offset_align, 0u);
    EXPECT_EQ(disk.offset_align & (disk.offset_align - 1), 0u) << "power of two";
  }
  const DirectIoInfo shm = probe_direct_io("/dev/shm");
  EXPECT_EQ(shm.filesystem, "tmpfs");
  EXPECT_THROW((void)probe_direct_io(dir.file("missing/sub")), Error);
}

TEST(Options, RejectsZeroSettings) {
  EXPECT_THROW(Handle({.block_size = 0}), Error);
  EXPECT_THROW(Handle({.queue_depth = 0}), Error);
  EXPECT_THROW(Handle({.intra_op_parallelism = 0}), Error);
  try {
    Handle h({.queue_depth = 0});
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("queue_depth"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepio

namespace deepio {
namespace {

class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~EnvVar() { ::unsetenv(name_); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
};

TEST(Settings, EnvironmentChoosesBackendAndDirectIoWhenAskedForAuto) {
  {
    EnvVar v("DEEPIO_BACKEND", "threads");
    EXPECT_EQ(Handle().backend(), BackendKind::Threads);
    std::string why;
    if (test::backend_available(BackendKind::Libaio, &why)) {
      EXPECT_EQ(Handle({.backend = BackendKind::Libaio}).backend(), BackendKind::Libaio) << "explicit wins";
    }
  }
  {
    EnvVar v("DEEPIO_DIRECT_IO", "off");
    EXPECT_EQ(Handle().options().direct_io, DirectIo::Off);
  }
}

TEST(Settings, GarbageInTheEnvironmentIsAnError) {
  EnvVar v("DEEPIO_BACKEND", "fastest");
  try {
    Handle h;
    FAIL() << "garbage accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("DEEPIO_BACKEND"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepio
