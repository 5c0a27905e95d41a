// One file, one identity: an operation never opens its file by path a second time. The
// pieces that cannot go O_DIRECT (unaligned heads and tails, the rest of a short transfer,
// a request the file system refused with EINVAL) go through a descriptor reopened from the
// op's own O_DIRECT one (/proc/self/fd/N). Writers that replace a file atomically (write a
// temporary, rename() it over the path) do so at any moment; these tests rename a new file
// over the path at the worst moment, from the fault hook, and check that every byte still
// comes from (or goes to) the file that was opened first.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "common/support.hpp"
#include "platform/fault.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::slurp;

using FileIdentity = test::BackendTest;

constexpr std::size_t kFileBytes = 2 << 20;

bool has_direct(int fd) { return fd >= 0 && (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

// Renames `from` over `to` once, at the first of: the open of a descriptor without O_DIRECT
// for `to` (the twin of the op's O_DIRECT one: the old code opened it by path, right after
// the direct one), or the first completion of a direct request, which it then reports as
// short so that the rest must go through the page cache (the old code opened that
// descriptor by path, on the worker, at that moment).
class RenameOnce {
 public:
  RenameOnce(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {
    detail::set_fault_hook([this](const FaultSite& s) { return on(s); });
  }
  ~RenameOnce() { detail::set_fault_hook({}); }
  RenameOnce(const RenameOnce&) = delete;
  RenameOnce& operator=(const RenameOnce&) = delete;
  [[nodiscard]] bool renamed() const { return renamed_.load(); }

 private:
  std::optional<std::int64_t> on(const FaultSite& s) {
    if (s.point == FaultPoint::Open && s.path != nullptr && s.path == to_ && (s.flags & O_DIRECT) == 0) {
      rename_now();
    } else if ((s.point == FaultPoint::Read || s.point == FaultPoint::Write) && s.result >= 8192 && has_direct(s.fd) &&
               rename_now()) {
      return s.result / 2;
    }
    return std::nullopt;
  }
  bool rename_now() {
    if (renamed_.exchange(true)) return false;
    if (::rename(from_.c_str(), to_.c_str()) != 0) std::perror("rename");
    return true;
  }

  const std::string from_, to_;
  std::atomic<bool> renamed_{false};
};

struct Geometry {
  const char* name;
  std::uint64_t offset;
  std::size_t nbytes;
};
// Unaligned: head and tail go through the page cache, opened at submission. Aligned: all
// direct, and the short first block makes the rest need the page cache at completion.
constexpr Geometry kGeometries[] = {{"unaligned", 100, (1 << 20) + 333}, {"aligned", 0, 1 << 20}};

enum class How { Single, Batch };

Future submit(Handle& h, How how, bool write, void* buf, std::size_t nbytes, const std::string& path,
              std::uint64_t offset) {
  if (how == How::Single) {
    return write ? h.async_pwrite(buf, nbytes, path, offset) : h.async_pread(buf, nbytes, path, offset);
  }
  // Two requests on one path: the batch opens the file once for both (Engine::open_shared).
  const std::size_t half = nbytes / 2;
  auto futures = h.submit_batch({
      {.write = write, .buffer = buf, .nbytes = half, .path = path, .file_offset = offset},
      {.write = write,
       .buffer = static_cast<std::byte*>(buf) + half,
       .nbytes = nbytes - half,
       .path = path,
       .file_offset = offset + half},
  });
  return std::move(futures.back());
}

void read_keeps_the_old_file(const test::TempDir& dir, const HandleOptions& options, How how) {
  for (const Geometry& g : kGeometries) {
    SCOPED_TRACE(g.name);
    const std::string path = dir.file(std::string("r-") + g.name), fresh = path + ".new";
    const auto old_bytes = pattern(kFileBytes, 1);
    test::put(path, old_bytes);
    test::put(fresh, pattern(kFileBytes, 2));
    Handle h(options);
    // Congruent with the file offset, so the aligned body goes direct (not bounced).
    test::OffsetBuffer buf(g.nbytes, g.offset % 4096);
    {
      RenameOnce swap(fresh, path);
      submit(h, how, false, buf.data(), g.nbytes, path, g.offset).get();
      ASSERT_TRUE(swap.renamed()) << "the hook never saw the moment to rename";
    }
    EXPECT_EQ(h.wait(), how == How::Batch ? 1u : 0u);
    if (h.stats().bytes_direct + h.stats().bytes_bounced == 0) GTEST_SKIP() << "this folder takes no O_DIRECT";
    EXPECT_TRUE(std::equal(old_bytes.begin() + static_cast<std::ptrdiff_t>(g.offset),
                           old_bytes.begin() + static_cast<std::ptrdiff_t>(g.offset + g.nbytes), buf.data()))
        << "bytes of the file renamed over the path were mixed in";
  }
}

void write_goes_to_the_old_file(const test::TempDir& dir, const HandleOptions& options, How how) {
  for (const Geometry& g : kGeometries) {
    SCOPED_TRACE(g.name);
    const std::string path = dir.file(std::string("w-") + g.name), fresh = path + ".new";
    auto expected = pattern(kFileBytes, 3);
    test::put(path, expected);
    const auto fresh_bytes = pattern(kFileBytes, 4);
    test::put(fresh, fresh_bytes);
    // The old inode stays reachable through this descriptor after the rename unlinks it.
    const int old_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(old_fd, 0);
    const auto data = pattern(g.nbytes, 5);
    std::copy(data.begin(), data.end(), expected.begin() + static_cast<std::ptrdiff_t>(g.offset));
    Handle h(options);
    test::OffsetBuffer buf(g.nbytes, g.offset % 4096);
    buf.fill(data);
    {
      RenameOnce swap(fresh, path);
      submit(h, how, true, buf.data(), g.nbytes, path, g.offset).get();
      EXPECT_TRUE(swap.renamed()) << "the hook never saw the moment to rename";
    }
    EXPECT_EQ(h.wait(), how == How::Batch ? 1u : 0u);
    std::vector<std::byte> old_now(kFileBytes);
    EXPECT_EQ(::pread(old_fd, old_now.data(), old_now.size(), 0), static_cast<ssize_t>(kFileBytes));
    ::close(old_fd);
    if (h.stats().bytes_direct + h.stats().bytes_bounced == 0) GTEST_SKIP() << "this folder takes no O_DIRECT";
    EXPECT_EQ(slurp(path), fresh_bytes) << "the file renamed over the path was written to";
    EXPECT_TRUE(old_now == expected) << "the file opened first lacks some of the written bytes";
  }
}

TEST_P(FileIdentity, ReadOfAFileRenamedOverReturnsOnlyTheOldBytes) {
  read_keeps_the_old_file(dir_, opts({.block_size = 256 << 10, .queue_depth = 4}), How::Single);
}

TEST_P(FileIdentity, WriteToAFileRenamedOverLandsOnlyInTheOldFile) {
  write_goes_to_the_old_file(dir_, opts({.block_size = 256 << 10, .queue_depth = 4}), How::Single);
}

TEST_P(FileIdentity, BatchReadOfAFileRenamedOverReturnsOnlyTheOldBytes) {
  read_keeps_the_old_file(dir_, opts({.block_size = 256 << 10, .queue_depth = 4}), How::Batch);
}

TEST_P(FileIdentity, BatchWriteToAFileRenamedOverLandsOnlyInTheOldFile) {
  write_goes_to_the_old_file(dir_, opts({.block_size = 256 << 10, .queue_depth = 4}), How::Batch);
}

// A caller's O_DIRECT descriptor with direct_io=off: the buffered twin is reopened from it
// (as before), at submission; the path is never used.
TEST_P(FileIdentity, CallersDirectDescriptorIsReopenedNotItsPath) {
  const std::string path = dir_.file("fd"), fresh = path + ".new";
  const auto old_bytes = pattern(kFileBytes, 6);
  test::put(path, old_bytes);
  test::put(fresh, pattern(kFileBytes, 7));
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "this folder takes no O_DIRECT";
  ASSERT_EQ(::rename(fresh.c_str(), path.c_str()), 0);
  Handle h(opts({.block_size = 256 << 10, .direct_io = DirectIo::Off}));
  std::vector<std::byte> buf(1000);
  h.async_pread(buf.data(), buf.size(), fd, 77).get();
  ::close(fd);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), old_bytes.begin() + 77));
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(FileIdentity);

}  // namespace
}  // namespace deepio
