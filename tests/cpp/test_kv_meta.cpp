// What a KV store's folder holds, and for whom (issue 45, items 5 and 6): a store is made only
// with an explicit capacity that fits the folder's file system, and it serves pages only to
// the fingerprint (model, layout, dtype, page shape, TP rank/size) that wrote them; a mismatch
// raises, or with clear_on_mismatch drops every page durably, a crash at any instant
// included. A folder costs a few descriptors whatever its size.
#include <dirent.h>
#include <sys/statvfs.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv_support.hpp"
#include "platform/fault.hpp"

namespace deepio::test {
namespace {

using kv::Store;
using kv::StoreOptions;

std::string message_of(const StoreOptions& o) {
  try {
    Store s(o);
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not InvalidArgument: ") + e.what();
  }
  return "no error";
}

std::vector<std::string> keys_of(const std::string& prefix, int n) {
  std::vector<std::string> k;
  for (int i = 0; i < n; ++i) k.push_back(prefix + std::to_string(i));
  return k;
}

std::vector<std::vector<unsigned char>> pages_of(const std::vector<std::string>& keys) {
  std::vector<std::vector<unsigned char>> p;
  for (const auto& k : keys) p.push_back(page_for(k, 3000));
  return p;
}

std::size_t present(Store& s, const std::vector<std::string>& keys) {
  std::vector<std::string_view> kv(keys.begin(), keys.end());
  std::size_t n = 0;
  for (bool b : s.contains(kv)) n += b ? 1 : 0;
  return n;
}

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::vector<unsigned char> out;
  for (std::byte b : slurp(path)) out.push_back(static_cast<unsigned char>(b));
  return out;
}

TEST(KvMeta, AFolderWithoutAStoreNeedsACapacity) {
  TempDir dir;
  const std::string fresh = dir.file("nvme1/kv");
  auto o = small_options({fresh});
  o.capacity_bytes = 0;
  const std::string msg = message_of(o);
  EXPECT_NE(msg.find(fresh), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds no store; give capacity_bytes"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.file("nvme1"))) << "nothing is made";
  // An existing store reopens with capacity 0, as before; a fresh folder beside it does not.
  const std::string old = dir.file("nvme0");
  { Store made(small_options({old})); }
  auto reopen = small_options({old});
  reopen.capacity_bytes = 0;
  { Store again(reopen); }
  reopen.folders.push_back(fresh);
  const std::string both = message_of(reopen);
  EXPECT_NE(both.find(fresh), std::string::npos) << both;
  EXPECT_FALSE(std::filesystem::exists(dir.file("nvme1")));
}

TEST(KvMeta, ACapacityOverTheFreeSpaceIsRefused) {
  TempDir dir;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  const std::uint64_t free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  auto o = small_options({dir.file("a"), dir.file("b")});
  o.capacity_bytes = 2 * (free + (std::uint64_t{64} << 30));  // each folder's share over it
  const std::string msg = message_of(o);
  EXPECT_NE(msg.find(dir.file("a")), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(o.capacity_bytes / 2)), std::string::npos) << msg;
  EXPECT_NE(msg.find("bytes free"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
  // Two folders on one file system share its space: each half fits, both together do not.
  o.capacity_bytes = free + free / 2;
  const std::string sum = message_of(o);
  EXPECT_NE(sum.find(dir.file("b")), std::string::npos) << sum;
  EXPECT_NE(sum.find("for the 2 new ones"), std::string::npos) << sum;
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
}

TEST(KvMeta, AnotherFingerprintIsRefusedBeforeAnythingIsTouched) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")});
  o.fingerprint = "llama-3-8b/bf16/page=16/tp=0of2";
  auto keys = keys_of("p", 12);
  auto pages = pages_of(keys);
  {
    Store s(o);
    for (bool b : put_pages(s, keys, pages)) ASSERT_TRUE(b);
  }
  const auto meta = file_bytes(dir.file("a") + "/kv.meta");
  const auto ckpt = file_bytes(dir.file("a") + "/index.ckpt");
  auto other = o;
  other.fingerprint = "llama-3-8b/bf16/page=16/tp=1of2";
  const std::string msg = message_of(other);
  EXPECT_NE(msg.find(dir.file("a")), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"" + o.fingerprint + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"" + other.fingerprint + "\""), std::string::npos) << msg;
  EXPECT_EQ(file_bytes(dir.file("a") + "/kv.meta"), meta);
  EXPECT_EQ(file_bytes(dir.file("a") + "/index.ckpt"), ckpt);
  Store s(o);  // the owner still finds its pages
  EXPECT_EQ(present(s, keys), keys.size());
  EXPECT_TRUE(s.take_warnings().empty());
  auto big = o;
  big.fingerprint.assign(4097, 'x');
  EXPECT_NE(message_of(big).find("fingerprint is 4097 bytes"), std::string::npos);
}

TEST(KvMeta, ClearOnMismatchDropsEveryPageDurablyAndWarns) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")});
  o.fingerprint = "old";
  auto before = keys_of("b", 10);
  auto after = keys_of("a", 10);
  auto pb = pages_of(before);
  auto pa = pages_of(after);
  {
    Store s(o);
    put_pages(s, before, pb);
    s.checkpoint();           // these in the checkpoint
    put_pages(s, after, pa);  // these only in their headers (above its bound)
    s.take_warnings();
  }
  auto n = o;
  n.fingerprint = "new";
  n.clear_on_mismatch = true;
  auto later = keys_of("n", 6);
  auto pn = pages_of(later);
  {
    Store s(n);
    EXPECT_EQ(s.stats().recovered_pages, 0u);
    EXPECT_EQ(present(s, before) + present(s, after), 0u);
    const auto w = s.take_warnings();
    ASSERT_EQ(w.size(), 2u);  // one per folder
    EXPECT_NE(w[0].find("\"old\""), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("\"new\""), std::string::npos) << w[0];
    std::vector<std::vector<unsigned char>> out(before.size(), std::vector<unsigned char>(3000));
    for (bool b : get_pages(s, before, out)) EXPECT_FALSE(b);
    for (bool b : put_pages(s, later, pn)) EXPECT_TRUE(b);
  }
  {
    auto plain = n;
    plain.clear_on_mismatch = false;
    Store s(plain);  // the new fingerprint is on disk: no mismatch, no warning
    EXPECT_TRUE(s.take_warnings().empty());
    EXPECT_EQ(present(s, later), later.size());
    EXPECT_EQ(present(s, before) + present(s, after), 0u);
    std::vector<std::vector<unsigned char>> out(later.size(), std::vector<unsigned char>(3000));
    for (bool b : get_pages(s, later, out)) EXPECT_TRUE(b);
    EXPECT_EQ(out, pn);
  }
  EXPECT_NE(message_of(o).find("\"new\""), std::string::npos);  // the old one is refused now
}

// A store made before fingerprints (kv.meta format 1) reads as fingerprint "".
TEST(KvMeta, AnOldMetaReadsAsTheEmptyFingerprint) {
  TempDir dir;
  auto o = small_options({dir.file("a")});
  auto keys = keys_of("k", 5);
  auto pages = pages_of(keys);
  {
    Store s(o);
    put_pages(s, keys, pages);
  }
  // Rewrite kv.meta as format 1 wrote it: 44 bytes, no fingerprint, no floor.
  auto m = file_bytes(dir.file("a") + "/kv.meta");
  ASSERT_GE(m.size(), 44u);
  std::vector<unsigned char> v1(m.begin(), m.begin() + 40);
  const std::uint32_t one = 1;
  std::memcpy(v1.data() + 4, &one, 4);
  const std::uint32_t crc = kv::crc32c(v1.data(), 40);
  v1.resize(44);
  std::memcpy(v1.data() + 40, &crc, 4);
  std::vector<std::byte> raw(v1.size());
  std::memcpy(raw.data(), v1.data(), v1.size());
  std::filesystem::remove(dir.file("a") + "/kv.meta");
  put(dir.file("a") + "/kv.meta", raw);
  {
    Store s(o);
    EXPECT_EQ(present(s, keys), keys.size());
  }
  auto f = o;
  f.fingerprint = "x";
  EXPECT_NE(message_of(f).find("fingerprint \"\""), std::string::npos);
}

/// Puts pages under fingerprint "old" (half of them in the checkpoint), then runs a child that
/// opens the store with "new" and clear_on_mismatch and dies (_exit) where `crash` says:
/// returns the child's exit code.
int crash_while_clearing(const StoreOptions& o, const std::vector<std::string>& keys, bool at_meta_sync) {
  auto pages = pages_of(keys);
  {
    Store s(o);
    std::vector<std::string> half(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(keys.size() / 2));
    std::vector<std::string> rest(keys.begin() + static_cast<std::ptrdiff_t>(keys.size() / 2), keys.end());
    auto ph = pages_of(half);
    auto pr = pages_of(rest);
    put_pages(s, half, ph);
    s.checkpoint();
    put_pages(s, rest, pr);
  }
  return in_watched_child([&] {
    auto n = o;
    n.fingerprint = "new";
    n.clear_on_mismatch = true;
    if (at_meta_sync) {
      deepio::detail::set_fault_hook([](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point == deepio::detail::FaultPoint::Sync && site.path != nullptr &&
            std::string(site.path).find("kv.meta.tmp") != std::string::npos) {
          ::_exit(0);  // the new kv.meta written, not yet synced nor renamed
        }
        return std::nullopt;
      });
    }
    Store s(n);
    ::_exit(at_meta_sync ? 3 : 0);  // opened: a crash with the store open
    return 4;
  });
}

TEST(KvMeta, ACrashWhileClearingNeverShowsOldPagesUnderTheNewFingerprint) {
  for (bool at_meta_sync : {true, false}) {
    TempDir dir;
    auto o = small_options({dir.file("a"), dir.file("b")});
    o.fingerprint = "old";
    const auto keys = keys_of("c", 12);
    ASSERT_EQ(crash_while_clearing(o, keys, at_meta_sync), 0) << at_meta_sync;
    auto n = o;
    n.fingerprint = "new";
    // Either the old store is still there (a mismatch, refused) or none of its pages is.
    try {
      Store s(n);
      EXPECT_EQ(present(s, keys), 0u) << "old pages visible under the new fingerprint";
    } catch (const InvalidArgument& e) {
      EXPECT_TRUE(at_meta_sync) << e.what();  // only a crash before the replace leaves it
    }
    n.clear_on_mismatch = true;
    Store s(n);
    EXPECT_EQ(present(s, keys), 0u);
  }
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Two descriptors per 1 GiB slab made a 32 GiB store cost 67, and the default capacity of a
// 3.84 TB drive about 3,600: past the usual soft RLIMIT_NOFILE (1024) and io_uring's
// registered-file table. Now a folder holds at most 4 slab files (one by default), whatever
// its size: a 32 GiB store, engine included, costs at most 16 descriptors. Sparse-allocated
// (fallocate) on the test folder's disk, which needs 32 GiB free.
TEST(KvMeta, AStoreCostsAFewDescriptorsWhateverItsSize) {
  TempDir dir;
  constexpr std::uint64_t kCapacity = std::uint64_t{32} << 30;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  if (static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize < kCapacity + (std::uint64_t{4} << 30)) {
    GTEST_SKIP() << "needs 36 GiB free under " << dir.path();
  }
  for (std::uint64_t slab_bytes : {std::uint64_t{0}, std::uint64_t{1} << 30}) {
    const std::string folder = dir.file("s" + std::to_string(slab_bytes));
    StoreOptions o;
    o.folders = {folder};
    o.capacity_bytes = kCapacity;
    o.slab_bytes = slab_bytes;
    o.checkpoint_interval = std::chrono::milliseconds(0);
    const std::size_t before = open_descriptors();
    {
      Store s(o);
      const std::size_t during = open_descriptors();
      EXPECT_LE(during - before, 16u) << "slab_bytes " << slab_bytes;
      const auto st = s.stats();
      EXPECT_EQ(st.folders.at(0).slots, kCapacity / st.slot_bytes);
      RecordProperty("descriptors_slab_bytes_" + std::to_string(slab_bytes), static_cast<int>(during - before));
      std::vector<std::string> keys{"k"};
      std::vector<std::vector<unsigned char>> p{page_for("k", 5000)};
      EXPECT_TRUE(put_pages(s, keys, p)[0]);
    }
    EXPECT_EQ(open_descriptors(), before);
    std::filesystem::remove_all(folder);
  }
}

// A folder laid out by an older deepio (kv.meta format 1, many small slabs) is still read
// with its own slab count.
TEST(KvMeta, AnOldLayoutWithManySlabsIsReadAsItIs) {
  TempDir dir;
  const std::string folder = dir.file("old");
  std::filesystem::create_directories(folder);
  constexpr std::uint64_t kSlots = 64, kPerSlab = 4, kSlot = 4096 + kPage;
  unsigned char m[44] = {};
  const std::uint32_t magic = 0x4D564B44u, one = 1;
  const std::uint64_t fields[4] = {kPage, kSlot, kSlots, kPerSlab};
  std::memcpy(m, &magic, 4);
  std::memcpy(m + 4, &one, 4);
  std::memcpy(m + 8, fields, sizeof fields);
  const std::uint32_t crc = kv::crc32c(m, 40);
  std::memcpy(m + 40, &crc, 4);
  std::vector<std::byte> raw(44);
  std::memcpy(raw.data(), m, 44);
  put(folder + "/kv.meta", raw);
  auto o = small_options({folder});
  o.capacity_bytes = 0;
  auto keys = keys_of("o", 40);
  auto pages = pages_of(keys);
  {
    Store s(o);
    EXPECT_EQ(s.stats().folders.at(0).slots, kSlots);
    for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
  }
  EXPECT_TRUE(std::filesystem::exists(folder + "/slab-0015.bin"));
  Store s(o);
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(3000));
  for (bool b : get_pages(s, keys, out)) EXPECT_TRUE(b);
  EXPECT_EQ(out, pages);
}

}  // namespace
}  // namespace deepio::test
