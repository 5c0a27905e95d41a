// io_uring registered ("fixed") files for file objects (core/fixed_files.hpp): a File's
// requests go through its slot in each worker's table (HandleStats::fixed_file_requests) and
// move the right bytes on every backend; closing a File takes it out of every ring, so an
// unlinked file is really freed (the kernel's own listing of each ring's table, and the
// inode's IN_DELETE_SELF, which comes only once nothing holds the file); a full table falls
// back to the plain descriptor and reuses slots freed by closed Files; Files opened and closed
// by many threads while I/O runs; a File that outlives its Handle; a forked child dropping a
// File leaves the parent's rings alone; path operations are never registered.
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "core/fixed_files.hpp"

namespace deepio {
namespace {

using test::in_child;
using test::pattern;
using test::slurp;

using FixedFiles = test::BackendTest;

// Sparse registered-file tables (IORING_RSRC_REGISTER_SPARSE) arrived in Linux 5.19.
bool kernel_has_sparse_files() {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 19);
}

// How many entries of this process's io_uring file tables name `name`, as the kernel lists
// them in each ring's /proc/self/fdinfo; -1 if no listing could be read (the kernel prints the
// table only when it gets the ring's lock at once, so a busy ring is read again).
int ring_entries_naming(const std::string& name) {
  int total = 0;
  bool seen_table = false;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (ec || target.string() != "anon_inode:[io_uring]") continue;
    for (int attempt = 0; attempt < 50; ++attempt) {
      std::ifstream in("/proc/self/fdinfo/" + e.path().filename().string());
      std::string line;
      bool table = false;
      int here = 0;
      while (std::getline(in, line)) {
        if (line.rfind("UserFiles:", 0) == 0) table = true;
        if (table && line.find(name) != std::string::npos) ++here;
      }
      if (table) {
        seen_table = true;
        total += here;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return seen_table ? total : -1;
}

// Polls `pred` for up to 2 s (the kernel may drop a file a little after its last reference).
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Skips unless io_uring is usable and keeps a file table (Linux 5.19+).
#define SKIP_WITHOUT_FILE_TABLES()                                                                      \
  do {                                                                                                  \
    std::string why_;                                                                                   \
    if (!test::backend_available(BackendKind::IoUring, &why_)) GTEST_SKIP() << "io_uring: " << why_;    \
    if (!kernel_has_sparse_files()) GTEST_SKIP() << "no sparse io_uring file tables before Linux 5.19"; \
  } while (0)

// Restores the default table size when a test that shrank it ends.
struct TableSlots {
  explicit TableSlots(unsigned n) { detail::set_file_table_slots(n); }
  ~TableSlots() { detail::set_file_table_slots(0); }
  TableSlots(const TableSlots&) = delete;
  TableSlots& operator=(const TableSlots&) = delete;
};

TEST_P(FixedFiles, FileOperationsGoThroughTheRingsTableAndPathOperationsDoNot) {
  const std::string path = dir_.file("fixed.bin");
  const auto data = pattern(1 << 20, 51);
  test::put(path, data);
  Handle h(opts({.block_size = 65536, .intra_op_parallelism = 2}));
  File f = h.open(path, O_RDWR);
  std::vector<std::byte> buf(1 << 20);
  std::vector<Future> futs;
  std::vector<std::size_t> offsets;
  std::mt19937 rng(7);
  for (int i = 0; i < 64; ++i) {
    offsets.push_back((rng() % 255) * 4096);
    futs.push_back(f.pread(buf.data() + offsets.back(), 4096, offsets.back()));
  }
  for (auto& fu : futs) EXPECT_EQ(fu.get(), 4096u);
  for (const std::size_t at : offsets) {
    EXPECT_TRUE(std::equal(buf.begin() + static_cast<std::ptrdiff_t>(at),
                           buf.begin() + static_cast<std::ptrdiff_t>(at + 4096),
                           data.begin() + static_cast<std::ptrdiff_t>(at)))
        << at;
  }
  // Unaligned: heads and tails through the descriptor without O_DIRECT (registered too).
  std::vector<std::byte> odd(70000);
  EXPECT_EQ(f.pread(odd.data(), odd.size(), 12345).get(), odd.size());
  EXPECT_TRUE(std::equal(odd.begin(), odd.end(), data.begin() + 12345));
  const auto update = pattern(300000, 52);
  EXPECT_EQ(f.pwrite(update.data(), update.size(), 4099).get(), update.size());
  auto expect = data;
  std::copy(update.begin(), update.end(), expect.begin() + 4099);
  std::vector<std::byte> all(expect.size());
  EXPECT_EQ(f.pread(all.data(), all.size(), 0).get(), all.size());
  EXPECT_EQ(all, expect);
  const HandleStats s = h.stats();
  EXPECT_EQ(s.ops_failed, 0u);
  EXPECT_EQ(s.fixed_file_fallbacks, 0u);
  if (GetParam() == BackendKind::IoUring && kernel_has_sparse_files()) {
    // 64 reads of one request each, and at least one request for each of the other ops.
    EXPECT_GE(s.fixed_file_requests, 64u + 3);
  } else {
    EXPECT_EQ(s.fixed_file_requests, 0u) << "only io_uring registers files";
  }
  const auto before = h.stats().fixed_file_requests;
  std::vector<std::byte> by_path(65536);
  EXPECT_EQ(h.async_pread(by_path.data(), by_path.size(), path, 65536).get(), by_path.size());
  EXPECT_TRUE(std::equal(by_path.begin(), by_path.end(), expect.begin() + 65536));
  EXPECT_EQ(h.stats().fixed_file_requests, before) << "path operations keep plain descriptors";
  f.close();
  EXPECT_EQ(slurp(path), expect);
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(FixedFiles);

// Watches `path` for the inode's end (IN_DELETE_SELF: unlinked and no reference left).
class InodeEnd {
 public:
  explicit InodeEnd(const std::string& path) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (fd_ >= 0) wd_ = ::inotify_add_watch(fd_, path.c_str(), IN_DELETE_SELF);
  }
  ~InodeEnd() {
    if (fd_ >= 0) ::close(fd_);
  }
  InodeEnd(const InodeEnd&) = delete;
  InodeEnd& operator=(const InodeEnd&) = delete;
  [[nodiscard]] bool watching() const { return fd_ >= 0 && wd_ >= 0; }
  // Whether the event has come (reads what is queued; remembers it).
  bool ended() {
    alignas(inotify_event) char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t at = 0; at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        if ((ev->mask & IN_DELETE_SELF) != 0) ended_ = true;
        at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
      }
    }
    return ended_;
  }

 private:
  int fd_;
  int wd_ = -1;
  bool ended_ = false;
};

// Reads all of a 256 KiB file through `f` with 64 KiB blocks (both workers of a two-worker
// handle get requests), unaligned too (the twin descriptor), and checks the bytes.
void read_all(File& f, const std::vector<std::byte>& data) {
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(f.pread(back.data(), back.size(), 0).get(), back.size());
  EXPECT_EQ(back, data);
  EXPECT_EQ(f.pread(back.data(), 200000, 7).get(), 200000u);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 200000, data.begin() + 7));
}

TEST(FixedFilesUring, ClosingAFileTakesItOutOfEveryRingSoAnUnlinkedFileIsFreed) {
  SKIP_WITHOUT_FILE_TABLES();
  test::TempDir dir;
  const auto data = pattern(256 << 10, 61);
  Handle h({.block_size = 65536, .intra_op_parallelism = 2, .backend = BackendKind::IoUring});
  const std::int64_t base = detail::fixed_files_installed();
  for (const bool in_flight : {false, true}) {
    const std::string name = in_flight ? "gone-in-flight.bin" : "gone.bin";
    const std::string path = dir.file(name);
    test::put(path, data);
    File f = h.open(path, O_RDONLY);
    read_all(f, data);
    const int descriptors = f.direct() ? 2 : 1;
    EXPECT_EQ(detail::fixed_files_installed() - base, 2 * descriptors) << "each worker installed each descriptor";
    const int listed = ring_entries_naming(name);
    if (listed >= 0) {
      EXPECT_EQ(listed, 2 * descriptors) << "the kernel's listing of the two rings";
    }
    InodeEnd end(path);
    ASSERT_TRUE(end.watching());
    ASSERT_EQ(::unlink(path.c_str()), 0);
    EXPECT_FALSE(end.ended()) << "the File still holds the file";
    std::vector<std::byte> back(data.size());
    Future last;
    if (in_flight) last = f.pread(back.data(), back.size(), 0);  // the last holder is this op
    f.close();
    if (in_flight) {
      // The op finishes on a worker, which takes the file out of both rings (its own and the
      // other worker's) before the op completes.
      EXPECT_EQ(last.get(), back.size());
      EXPECT_EQ(back, data);
    }
    EXPECT_EQ(detail::fixed_files_installed(), base) << "taken out of every table";
    if (listed >= 0) {
      EXPECT_TRUE(eventually([&] { return ring_entries_naming(name) == 0; })) << "a ring still holds it";
    }
    EXPECT_TRUE(eventually([&] { return end.ended(); })) << "the unlinked file's inode was not freed";
  }
  EXPECT_GE(h.stats().fixed_file_requests, 8u);
}

TEST(FixedFilesUring, AFullTableFallsBackToThePlainDescriptorAndReusesFreedSlots) {
  SKIP_WITHOUT_FILE_TABLES();
  test::TempDir dir;
  const TableSlots two(2);
  Handle h({.block_size = 65536, .intra_op_parallelism = 1, .backend = BackendKind::IoUring});
  const std::int64_t base = detail::fixed_files_installed();
  std::vector<std::vector<std::byte>> data;
  std::vector<File> files;
  for (int i = 0; i < 4; ++i) {
    data.push_back(pattern(65536, 70 + static_cast<unsigned>(i)));
    const std::string path = dir.file("full" + std::to_string(i) + ".bin");
    test::put(path, data.back());
    files.push_back(h.open(path, O_RDONLY, DirectIo::Off));  // one descriptor each
  }
  std::vector<std::byte> back(65536);
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(files[i].pread(back.data(), back.size(), 0).get(), back.size());
      EXPECT_EQ(back, data[i]) << "file " << i;
    }
  }
  HandleStats s = h.stats();
  EXPECT_EQ(detail::fixed_files_installed() - base, 2);
  EXPECT_EQ(s.fixed_file_requests, 4u) << "files 0 and 1, twice each";
  EXPECT_EQ(s.fixed_file_fallbacks, 4u) << "files 2 and 3, twice each: the table was full";
  files[0].close();  // frees its slot: file 2 gets it on its next request
  EXPECT_EQ(detail::fixed_files_installed() - base, 1);
  EXPECT_EQ(files[2].pread(back.data(), back.size(), 0).get(), back.size());
  EXPECT_EQ(back, data[2]);
  EXPECT_EQ(files[1].pread(back.data(), back.size(), 0).get(), back.size());
  EXPECT_EQ(back, data[1]);
  s = h.stats();
  EXPECT_EQ(s.fixed_file_requests, 6u);
  EXPECT_EQ(s.fixed_file_fallbacks, 4u);
  EXPECT_EQ(s.ops_failed, 0u);
  files.clear();
  EXPECT_EQ(detail::fixed_files_installed(), base);
}

// Threads open, read through and close Files (some closed with reads in flight) on one handle
// whose tables are small (slots are taken, freed and reused all the time, and some requests
// fall back), while other threads read the same files by path. Every byte is checked; run
// under TSan in CI.
TEST(FixedFilesUring, ManyThreadsOpenAndCloseFilesWhileIoRuns) {
  SKIP_WITHOUT_FILE_TABLES();
  test::TempDir dir;
  const TableSlots few(6);
  constexpr int kFiles = 8;
  constexpr int kThreads = 4;
  constexpr std::size_t kSize = 64 << 10;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::string> paths;
  for (int i = 0; i < kFiles; ++i) {
    data.push_back(pattern(kSize, 80 + static_cast<unsigned>(i)));
    paths.push_back(dir.file("many" + std::to_string(i) + ".bin"));
    test::put(paths.back(), data.back());
  }
  const std::int64_t base = detail::fixed_files_installed();
  {
    Handle h({.block_size = 16384, .intra_op_parallelism = 2, .backend = BackendKind::IoUring});
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        std::vector<std::byte> a(kSize), b(kSize);
        for (int it = 0; it < 40; ++it) {
          const int i = static_cast<int>(rng() % kFiles);
          if (t == kThreads - 1) {  // by path, beside the Files
            if (h.async_pread(a.data(), kSize, paths[static_cast<std::size_t>(i)], 0).get() != kSize ||
                a != data[static_cast<std::size_t>(i)]) {
              bad.fetch_add(1);
            }
            continue;
          }
          File f = h.open(paths[static_cast<std::size_t>(i)], O_RDONLY, it % 2 == 0 ? DirectIo::Auto : DirectIo::Off);
          Future x = f.pread(a.data(), kSize, 0);
          Future y = f.pread(b.data() + 1, kSize - 3, 1);  // unaligned: the twin descriptor
          if (it % 3 == 0) f.close();                      // the reads hold the file
          if (x.get() != kSize || a != data[static_cast<std::size_t>(i)]) bad.fetch_add(1);
          if (y.get() != kSize - 3 ||
              !std::equal(b.begin() + 1, b.end() - 2, data[static_cast<std::size_t>(i)].begin() + 1)) {
            bad.fetch_add(1);
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(bad.load(), 0);
    const HandleStats s = h.stats();
    EXPECT_EQ(s.ops_failed, 0u);
    EXPECT_GT(s.fixed_file_requests, 0u);
    EXPECT_EQ(detail::fixed_files_installed(), base) << "every closed File left every table";
  }
  EXPECT_EQ(detail::fixed_files_installed(), base);
}

// A File may outlive its Handle (closed after it): the rings are gone, and with them the
// registrations; dropping the File then touches nothing of theirs.
TEST(FixedFilesUring, AFileClosedAfterItsHandleIsGone) {
  SKIP_WITHOUT_FILE_TABLES();
  test::TempDir dir;
  const std::string path = dir.file("outlives.bin");
  const auto data = pattern(256 << 10, 91);
  test::put(path, data);
  const std::int64_t base = detail::fixed_files_installed();
  File f;
  {
    Handle h({.block_size = 65536, .intra_op_parallelism = 2, .backend = BackendKind::IoUring});
    f = h.open(path, O_RDONLY);
    read_all(f, data);
    EXPECT_GT(detail::fixed_files_installed(), base);
    EXPECT_GT(h.stats().fixed_file_requests, 0u);
  }
  EXPECT_EQ(detail::fixed_files_installed(), base) << "the rings took their registrations with them";
  InodeEnd end(path);
  ASSERT_TRUE(end.watching());
  ASSERT_EQ(::unlink(path.c_str()), 0);
  EXPECT_FALSE(end.ended());
  f.close();
  EXPECT_TRUE(eventually([&] { return end.ended(); }));
  EXPECT_EQ(detail::fixed_files_installed(), base);
}

// A forked child shares the parent's rings: a File it drops must not take the file out of
// them (the parent's next request through the slot would fail with EBADF).
TEST(FixedFilesUring, AForkedChildDroppingAFileLeavesTheParentsRingsAlone) {
  SKIP_WITHOUT_FILE_TABLES();
  test::TempDir dir;
  const std::string path = dir.file("forked.bin");
  const auto data = pattern(256 << 10, 95);
  test::put(path, data);
  Handle h({.block_size = 65536, .intra_op_parallelism = 2, .backend = BackendKind::IoUring});
  const std::int64_t base = detail::fixed_files_installed();
  auto f = std::make_unique<File>(h.open(path, O_RDONLY));
  read_all(*f, data);
  const std::int64_t installed = detail::fixed_files_installed();
  const int code = in_child([&] {
    f.reset();  // the child's copy of the File goes
    return detail::fixed_files_installed() == installed ? 0 : 1;
  });
  EXPECT_EQ(code, 0) << "the child left the parent's tables alone";
  const auto before = h.stats();
  read_all(*f, data);
  const auto after = h.stats();
  EXPECT_EQ(after.ops_failed, before.ops_failed);
  EXPECT_GT(after.fixed_file_requests, before.fixed_file_requests) << "still through the slots";
  f.reset();
  EXPECT_EQ(detail::fixed_files_installed(), base);
}

}  // namespace
}  // namespace deepio
