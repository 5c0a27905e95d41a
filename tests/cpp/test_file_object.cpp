// deepio::File (Handle::open): a file opened once for many operations. Its operations read
// and write the file that was opened, whatever happens to the path after (renamed over,
// unlinked); many operations open nothing (counted at the fault hook's Open point, which every
// open and every reopen through /proc/self/fd consults); a File's operations are the handle's
// (wait() counts them) with the checks of the path calls; closing it never cuts one short.
// Run against every backend.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <vector>

#include "common/support.hpp"
#include "platform/fault.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::slurp;

using FileObject = test::BackendTest;

// Counts the opens (and reopens) of paths containing `name`; leaves them alone.
class OpenCounter {
 public:
  explicit OpenCounter(std::string name) : name_(std::move(name)) {
    detail::set_fault_hook([this](const FaultSite& s) -> std::optional<std::int64_t> {
      if (s.point == FaultPoint::Open && s.path != nullptr && std::string(s.path).find(name_) != std::string::npos) {
        opens_.fetch_add(1);
      }
      return std::nullopt;
    });
  }
  ~OpenCounter() { detail::set_fault_hook({}); }
  OpenCounter(const OpenCounter&) = delete;
  OpenCounter& operator=(const OpenCounter&) = delete;
  [[nodiscard]] int opens() const { return opens_.load(); }

 private:
  std::string name_;
  std::atomic<int> opens_{0};
};

std::vector<std::byte> bytes_of(const std::vector<std::byte>& v, std::size_t at, std::size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n)};
}

TEST_P(FileObject, ManyOperationsOpenTheFileOnce) {
  const std::string path = dir_.file("once.bin");
  const auto data = pattern(1 << 20, 11);
  test::put(path, data);
  Handle h(opts({.block_size = 65536}));
  OpenCounter counter("once.bin");
  File f = h.open(path, O_RDWR);
  const int at_open = counter.opens();
  EXPECT_EQ(at_open, f.direct() ? 2 : 1) << "the file, and its twin without O_DIRECT reopened from it";

  std::vector<std::byte> buf(4096 * 3 + 7);
  std::vector<Future> futs;
  for (std::uint64_t i = 0; i < 64; ++i) {
    // Aligned and unaligned (head and tail through the page cache): every kind of request.
    futs.push_back(f.pread(buf.data(), 4096, i * 4096));
    futs.push_back(f.pread(buf.data() + 1, 4096 + 5, i * 4096 + 3));
  }
  for (auto& fu : futs) fu.get();
  const std::vector<IoRange> ranges = {{.file_offset = 8192, .buffer_offset = 0, .nbytes = 4096},
                                       {.file_offset = 100, .buffer_offset = 4096, .nbytes = 300}};
  EXPECT_EQ(f.pread_ranges(buf.data(), buf.size(), ranges).get(), 4396u);
  EXPECT_EQ(bytes_of(buf, 0, 4096), bytes_of(data, 8192, 4096));
  EXPECT_EQ(bytes_of(buf, 4096, 300), bytes_of(data, 100, 300));
  const auto more = pattern(4096 * 3 + 7, 12);
  EXPECT_EQ(f.pwrite(more.data(), more.size(), 5).get(), more.size());
  EXPECT_EQ(f.pwrite_ranges(more.data(), more.size(), ranges).get(), 4396u);
  EXPECT_EQ(h.wait(), 0u) << "collected by their Futures";
  EXPECT_EQ(counter.opens(), at_open) << "no operation opened anything";
  EXPECT_EQ(h.stats().ops_completed, 64u * 2 + 3);
}

TEST_P(FileObject, ReadsAndWritesTheOpenedFileAfterTheNameIsRenamedOverOrUnlinked) {
  const std::string path = dir_.file("kept.bin");
  const std::string other = dir_.file("other.bin");
  const auto data = pattern(256 << 10, 21);
  const auto impostor = pattern(256 << 10, 22);
  test::put(path, data);
  test::put(other, impostor);
  Handle h(opts({.block_size = 65536}));
  File f = h.open(path, O_RDWR);
  struct stat opened {};
  ASSERT_EQ(::fstat(f.fd(), &opened), 0);

  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);  // a new file under the name
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(f.pread(back.data(), back.size(), 0).get(), data.size());
  EXPECT_EQ(back, data) << "read the file that was opened, not the one now at the path";
  const auto update = pattern(10000, 23);
  EXPECT_EQ(f.pwrite(update.data(), update.size(), 4093).get(), update.size());
  EXPECT_EQ(slurp(path), impostor) << "the file now at the path is untouched";

  ASSERT_EQ(::unlink(path.c_str()), 0);  // no name at all
  std::vector<std::byte> part(update.size() + 6);
  const std::vector<IoRange> ranges = {{.file_offset = 4090, .buffer_offset = 0, .nbytes = part.size()}};
  EXPECT_EQ(f.pread_ranges(part.data(), part.size(), ranges).get(), part.size());
  auto expect = data;
  std::copy(update.begin(), update.end(), expect.begin() + 4093);
  EXPECT_EQ(part, bytes_of(expect, 4090, part.size()));
  // Grown through the File past the size the open saw: readable at once (no stat by path).
  const auto tail = pattern(5000, 24);
  EXPECT_EQ(f.pwrite(tail.data(), tail.size(), data.size()).get(), tail.size());
  std::vector<std::byte> t(tail.size());
  EXPECT_EQ(f.pread(t.data(), t.size(), data.size()).get(), t.size());
  EXPECT_EQ(t, tail);
  EXPECT_EQ(f.size(), data.size() + tail.size());
  struct stat still {};
  ASSERT_EQ(::fstat(f.fd(), &still), 0);
  EXPECT_EQ(still.st_ino, opened.st_ino);
  EXPECT_EQ(still.st_nlink, 0u);
}

TEST_P(FileObject, ChecksAsThePathCallsDo) {
  const std::string path = dir_.file("checks.bin");
  test::put(path, pattern(4096, 31));
  Handle h(opts());
  File r = h.open(path, O_RDONLY);
  std::vector<std::byte> buf(8192);
  try {
    (void)r.pread(buf.data(), 5000, 0);
    ADD_FAILURE() << "read past the end accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENODATA);
    EXPECT_EQ(e.path(), path);
  }
  try {
    (void)r.pwrite(buf.data(), 10, 0);
    ADD_FAILURE() << "write to a read-only File accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EBADF);
    EXPECT_EQ(e.path(), path);
  }
  EXPECT_THROW((void)r.pread(buf.data(), 10, static_cast<std::uint64_t>(-1)), InvalidArgument);
  // Grown by someone else: the read past the size the open saw is checked against fstat.
  test::put(path, pattern(4096, 32), 4096);
  EXPECT_EQ(r.pread(buf.data(), 8192, 0).get(), 8192u);
  File w = h.open(path, O_WRONLY);
  try {
    (void)w.pread(buf.data(), 10, 0);
    ADD_FAILURE() << "read of a write-only File accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EBADF);
  }
  try {
    (void)h.open(path, O_WRONLY | O_CREAT | O_EXCL);
    ADD_FAILURE() << "O_EXCL opened an existing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EEXIST);
    EXPECT_EQ(e.path(), path);
  }
  File none;
  EXPECT_FALSE(none.is_open());
  EXPECT_EQ(none.fd(), -1);
  EXPECT_THROW((void)none.pread(buf.data(), 1, 0), InvalidArgument);
}

TEST_P(FileObject, ClosingNeverCutsAnOperationShort) {
  const std::string path = dir_.file("close.bin");
  const auto data = pattern(1 << 20, 41);
  Handle h(opts({.block_size = 65536}));
  std::vector<Future> futs;
  {
    File f = h.open(path, O_WRONLY | O_CREAT | O_TRUNC);
    for (std::size_t i = 0; i < 16; ++i) {
      futs.push_back(f.pwrite(data.data() + i * 65536, 65536, i * 65536));
    }
    f.close();
    EXPECT_FALSE(f.is_open());
  }  // and destroyed: the operations keep the descriptors
  EXPECT_EQ(h.wait(), 16u);
  for (auto& fu : futs) EXPECT_EQ(fu.get(), 65536u);
  EXPECT_EQ(slurp(path), data);
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(FileObject);

// Handle::open opens as the engine opens its own files: O_DIRECT where taken, close-on-exec,
// a refusal counted (Auto) or an error naming the file (On). (It replaced the binding's
// open_for_caller: deepio.File holds the same file object.)
TEST(FileOpen, OpensAsTheEngineDoes) {
  test::TempDir dir;
  const std::string path = dir.file("caller.bin");
  Handle h;
  File f = h.open(path, O_RDWR | O_CREAT | O_TRUNC);
  ASSERT_GE(f.fd(), 0);
  const bool takes_direct = f.direct();  // the test folder's file system decides
  EXPECT_EQ((::fcntl(f.fd(), F_GETFL) & O_DIRECT) != 0, f.direct());
  EXPECT_NE(::fcntl(f.fd(), F_GETFD) & FD_CLOEXEC, 0);
  f.close();
  f = h.open(path, O_RDONLY, DirectIo::Off);
  EXPECT_FALSE(f.direct());
  EXPECT_EQ(::fcntl(f.fd(), F_GETFL) & O_DIRECT, 0);
  f.close();
  EXPECT_EQ(h.stats().direct_refused, takes_direct ? 0u : 1u);

  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Open && (s.flags & O_DIRECT) != 0) return -EINVAL;
    return std::nullopt;
  });
  const auto before = h.stats().direct_refused;
  f = h.open(path, O_RDWR);
  EXPECT_FALSE(f.direct());
  f.close();
  EXPECT_EQ(h.stats().direct_refused, before + 1);
  try {
    (void)h.open(path, O_RDWR, DirectIo::On);
    ADD_FAILURE() << "direct_io=on opened without O_DIRECT";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_EQ(e.path(), path);
  }
  detail::set_fault_hook({});
  EXPECT_EQ(h.stats().direct_refused, before + 1);
}

}  // namespace
}  // namespace deepio
