// deepio::kv::Store on real files in temporary folders: round trips, replace, corruption on
// disk, reopen (checkpoint + scan, its work counted), eviction past capacity, concurrency, one
// store per folder, durable clear() and checkpoint(), CRC-32C vectors (faults and probes:
// test_kv_faults.cpp). Small pages and capacities keep it fast under the sanitizers.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "kv_support.hpp"
#include "deepio/kv.hpp"
#include "platform/fault.hpp"

namespace deepio::kv::detail {
std::uint32_t crc32c_portable(const void* data, std::size_t nbytes, std::uint32_t crc) noexcept;
}

namespace deepio::test {
namespace {

using kv::BatchFuture;
using kv::Segment;
using kv::Store;
using kv::StoreOptions;

TEST(KvCrc, KnownVectors) {
  const char* v = "123456789";
  EXPECT_EQ(kv::crc32c(v, 9), 0xE3069283u);
  EXPECT_EQ(kv::detail::crc32c_portable(v, 9, 0), 0xE3069283u);
  EXPECT_EQ(kv::crc32c("", 0), 0u);
  std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(kv::crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  std::vector<unsigned char> ones(32, 0xFF);
  EXPECT_EQ(kv::crc32c(ones.data(), 32), 0x62A8AB43u);
  // Continuation equals one pass; both paths agree on odd lengths and offsets.
  auto data = page_for("crc", 10007);
  for (std::size_t cut : {0ul, 1ul, 7ul, 4096ul, 10007ul}) {
    const std::uint32_t a = kv::crc32c(data.data() + cut, data.size() - cut, kv::crc32c(data.data(), cut));
    EXPECT_EQ(a, kv::crc32c(data.data(), data.size()));
    EXPECT_EQ(a, kv::detail::crc32c_portable(data.data(), data.size(), 0));
  }
}

TEST(KvStore, RoundTripReplaceRemove) {
  TempDir dir;
  Store s(small_options({dir.file("a"), dir.file("b")}));
  std::vector<std::string> keys;
  std::vector<std::vector<unsigned char>> pages;
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    keys.push_back("key-" + std::to_string(rng()));
    pages.push_back(page_for(keys.back(), 1 + rng() % kPage));
  }
  auto ok = put_pages(s, keys, pages);
  for (bool b : ok) EXPECT_TRUE(b);
  std::vector<std::vector<unsigned char>> out;
  for (auto& p : pages) out.emplace_back(p.size(), 0);
  ok = get_pages(s, keys, out);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(ok[i]) << i;
    EXPECT_EQ(out[i], pages[i]) << i;
  }
  // A get asking for another length than stored is a miss.
  std::vector<std::vector<unsigned char>> wrong{std::vector<unsigned char>(pages[0].size() + 1)};
  EXPECT_FALSE(get_pages(s, {keys[0]}, wrong)[0]);
  // Replace.
  std::vector<std::vector<unsigned char>> newer{page_for(keys[1], kPage, 99)};
  EXPECT_TRUE(put_pages(s, {keys[1]}, newer)[0]);
  std::vector<std::vector<unsigned char>> back{std::vector<unsigned char>(kPage)};
  EXPECT_TRUE(get_pages(s, {keys[1]}, back)[0]);
  EXPECT_EQ(back[0], newer[0]);
  // exists / contains / remove.
  std::vector<std::string_view> probe{keys[0], keys[1], "absent", keys[2]};
  EXPECT_EQ(s.exists(probe), 2u);
  EXPECT_EQ(s.contains(probe), (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(s.remove(std::vector<std::string_view>{keys[0], "absent"}), 1u);
  EXPECT_EQ(s.exists(probe), 0u);
  // Too large a page is false, not an error.
  std::vector<std::vector<unsigned char>> big{std::vector<unsigned char>(kPage + 1)};
  EXPECT_FALSE(put_pages(s, {"big"}, big)[0]);
  // Scatter/gather: two segments make one page.
  auto whole = page_for("sg", 6000);
  std::vector<std::string_view> k1{"sg"};
  std::vector<std::vector<Segment>> put_segs{{Segment{whole.data(), 1000}, Segment{whole.data() + 1000, 5000}}};
  EXPECT_TRUE(s.put(k1, put_segs).get()[0]);
  std::vector<unsigned char> h1(2500), h2(3500);
  std::vector<std::vector<Segment>> get_segs{{Segment{h1.data(), h1.size()}, Segment{h2.data(), h2.size()}}};
  EXPECT_TRUE(s.get(k1, get_segs).get()[0]);
  EXPECT_EQ(0, std::memcmp(h1.data(), whole.data(), 2500));
  EXPECT_EQ(0, std::memcmp(h2.data(), whole.data() + 2500, 3500));
  auto st = s.stats();
  EXPECT_EQ(st.folders.size(), 2u);
  EXPECT_GT(st.hits, 0u);
}

TEST(KvStore, BadArguments) {
  TempDir dir;
  EXPECT_THROW(Store(StoreOptions{}), InvalidArgument);
  auto o = small_options({dir.file("a")});
  o.page_bytes = 0;
  EXPECT_THROW(Store{o}, InvalidArgument);
  o = small_options({dir.file("a"), dir.file("a")});
  EXPECT_THROW(Store{o}, InvalidArgument);
  o = small_options({dir.file("a")});
  o.low_watermark = 0.99;
  EXPECT_THROW(Store{o}, InvalidArgument);
  Store s(small_options({dir.file("a")}));
  std::string longkey(kv::kMaxKeyBytes + 1, 'x');
  std::vector<std::string_view> keys{"ok", longkey};
  std::vector<std::vector<Segment>> segs(2);
  EXPECT_THROW(s.put(keys, segs), InvalidArgument);
  std::vector<std::string_view> one{""};
  std::vector<std::vector<Segment>> seg1(1);
  EXPECT_THROW(s.get(one, seg1), InvalidArgument);
  EXPECT_THROW(s.put(std::vector<std::string_view>{"a"}, segs), InvalidArgument);
  s.close();
  EXPECT_THROW(s.exists(std::vector<std::string_view>{"a"}), InvalidArgument);
  // Another page_bytes over an existing layout.
  auto o2 = small_options({dir.file("a")});
  o2.page_bytes = 4096;
  EXPECT_THROW(Store{o2}, InvalidArgument);
}

TEST(KvStore, FlippedByteOnDiskIsAMiss) {
  TempDir dir;
  auto o = small_options({dir.file("a")}, 4);
  std::vector<std::vector<unsigned char>> pages{page_for("k", kPage)};
  {
    Store s(o);
    ASSERT_TRUE(put_pages(s, {"k"}, pages)[0]);
  }
  // Flip one data byte of whichever slot holds it (every slot's data byte 100).
  const std::string slab = dir.file("a") + "/slab-0000.bin";
  const int fd = ::open(slab.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (std::uint64_t slot = 0; slot < 4; ++slot) {
    unsigned char b = 0;
    const off_t off = static_cast<off_t>(slot * (4096 + kPage) + 4096 + 100);
    ASSERT_EQ(::pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &b, 1, off), 1);
  }
  ::fsync(fd);
  ::close(fd);
  Store s(o);
  EXPECT_EQ(s.stats().recovered_pages, 1u);
  std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(kPage)};
  EXPECT_FALSE(get_pages(s, {"k"}, out)[0]);
  EXPECT_EQ(s.stats().corrupt, 1u);
  EXPECT_EQ(s.exists(std::vector<std::string_view>{"k"}), 0u);  // forgotten after the miss
}

TEST(KvStore, ReopenKeepsPagesAndRemovals) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")});
  std::vector<std::string> keys;
  std::vector<std::vector<unsigned char>> pages;
  for (int i = 0; i < 30; ++i) {
    keys.push_back("r" + std::to_string(i));
    pages.push_back(page_for(keys.back(), 100 + i * 50));
  }
  {
    Store s(o);
    put_pages(s, keys, pages);
    s.remove(std::vector<std::string_view>{keys[0]});
    std::vector<std::vector<unsigned char>> newer{page_for(keys[1], 77, 5)};
    ASSERT_TRUE(put_pages(s, {keys[1]}, newer)[0]);
    pages[1] = newer[0];
  }
  Store s(o);
  EXPECT_EQ(s.stats().recovered_pages, 29u);
  std::vector<std::vector<unsigned char>> out;
  for (auto& p : pages) out.emplace_back(p.size(), 0);
  auto ok = get_pages(s, keys, out);
  EXPECT_FALSE(ok[0]);
  for (std::size_t i = 1; i < keys.size(); ++i) {
    EXPECT_TRUE(ok[i]) << i;
    EXPECT_EQ(out[i], pages[i]) << i;
  }
}

TEST(KvStore, ReopenWithoutCheckpointScans) {
  TempDir dir;
  auto o = small_options({dir.file("a")});
  std::vector<std::string> keys{"x", "y", "z"};
  std::vector<std::vector<unsigned char>> pages{page_for("x", 10), page_for("y", kPage), page_for("z", 4096)};
  {
    Store s(o);
    put_pages(s, keys, pages);
  }
  std::filesystem::remove(dir.file("a") + "/index.ckpt");  // as if the process died before close
  Store s(o);
  std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(10), std::vector<unsigned char>(kPage),
                                              std::vector<unsigned char>(4096)};
  auto ok = get_pages(s, keys, out);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(ok[i]);
    EXPECT_EQ(out[i], pages[i]);
  }
}

// Reopen after a clean close reads the checkpoint and the journal, and no slot: the format-2
// checkpoint holds each page's key, length and CRC (src/kv/journal.hpp). Without a checkpoint
// (lost, or never written) it reads each slot header once, batched, and a page only when not
// vouched for. Counted, not timed (the time depends on the disk; docs/benchmarks.md has the
// figures).
TEST(KvStore, ReopenReadsEachSlotHeaderOnce) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")}, 96);
  auto keys = numbered_keys("h", 60);
  std::vector<std::vector<unsigned char>> pages;
  for (const auto& k : keys) pages.push_back(page_for(k, 700));
  std::uint64_t slots_bytes = 0;  // each slab's slots, before its journal
  {
    Store s(o);
    for (bool b : put_pages(s, keys, pages)) ASSERT_TRUE(b);
    std::vector<std::vector<unsigned char>> newer{page_for(keys[0], 700, 1)};
    ASSERT_TRUE(put_pages(s, {keys[0]}, newer)[0]);  // two versions of keys[0] on the drive
    slots_bytes = s.stats().folders[0].slots * s.stats().slot_bytes;
  }
  struct Count {
    std::atomic<std::uint64_t> slot_bytes{0}, journal_bytes{0};
  };
  auto count = std::make_shared<Count>();
  deepio::detail::set_fault_hook(
      [count, slots_bytes](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point != deepio::detail::FaultPoint::Read || !fd_is_slab(site.fd)) return std::nullopt;
        (site.offset >= slots_bytes ? count->journal_bytes : count->slot_bytes) += site.nbytes;
        return std::nullopt;
      });
  {
    Store s(o);  // with the checkpoint: no slot is read, not even the old version of keys[0]
    const auto st = s.stats();
    deepio::detail::set_fault_hook({});
    EXPECT_EQ(st.recovered_pages, keys.size());
    EXPECT_EQ(st.open_headers_read, 0u);
    EXPECT_EQ(st.open_pages_read, 0u);
    EXPECT_EQ(count->slot_bytes.load(), 0u);
    EXPECT_GT(count->journal_bytes.load(), 0u);
    std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(700)};
    EXPECT_TRUE(get_pages(s, {keys[0]}, out)[0]);
    EXPECT_EQ(out[0], page_for(keys[0], 700, 1));
  }
  std::filesystem::remove(dir.file("a") + "/index.ckpt");  // as after a crash: every header counts
  std::filesystem::remove(dir.file("b") + "/index.ckpt");
  Store s(o);
  EXPECT_EQ(s.stats().open_headers_read, 96u);
  // No checkpoint: no page is vouched for, each key's newest is read (keys[0]'s is whole).
  EXPECT_EQ(s.stats().open_pages_read, keys.size());
  std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(700)};
  EXPECT_TRUE(get_pages(s, {keys[0]}, out)[0]);
  EXPECT_EQ(out[0], page_for(keys[0], 700, 1));
}

TEST(KvStore, ThreeTimesCapacityEvicts) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")}, 32);
  Store s(o);
  std::vector<std::string> last;
  for (int round = 0; round < 12; ++round) {  // 12 x 8 pages = 3 x 32
    std::vector<std::string> keys;
    std::vector<std::vector<unsigned char>> pages;
    for (int i = 0; i < 8; ++i) {
      keys.push_back("e" + std::to_string(round) + "-" + std::to_string(i));
      pages.push_back(page_for(keys.back(), kPage));
    }
    for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
    last = keys;
  }
  auto st = s.stats();
  EXPECT_LE(st.pages, 32u);
  EXPECT_GT(st.evictions, 0u);
  std::vector<std::string_view> lk(last.begin(), last.end());
  EXPECT_EQ(s.exists(lk), last.size());
  std::vector<std::vector<unsigned char>> out(last.size(), std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, last, out)) EXPECT_TRUE(b);
}

TEST(KvStore, PutAndGetOfOneKeyFromTwoThreads) {
  TempDir dir;
  Store s(small_options({dir.file("a")}, 16));
  std::vector<std::vector<unsigned char>> versions;
  for (std::uint32_t v = 0; v < 4; ++v) versions.push_back(page_for("hot", kPage, v));
  std::vector<std::vector<unsigned char>> first{versions[0]};
  ASSERT_TRUE(put_pages(s, {"hot"}, first)[0]);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 40; ++i) {
      std::vector<std::vector<unsigned char>> p{versions[static_cast<std::size_t>(i) % 4]};
      EXPECT_TRUE(put_pages(s, {"hot"}, p)[0]);
    }
    stop = true;
  });
  int hits = 0;
  while (!stop) {
    std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(kPage)};
    if (get_pages(s, {"hot"}, out)[0]) {
      ++hits;
      bool matches = false;
      for (auto& v : versions) matches = matches || out[0] == v;
      EXPECT_TRUE(matches);  // a hit is always one whole version
    }
  }
  writer.join();
  EXPECT_GT(hits, 0);
}

// Two stores on one folder would hand out the same slots: the second open is refused (EBUSY,
// naming the folder), whether the first is in this process or in another; the folder is free
// again once the first closes or its process dies.
TEST(KvStore, AFolderIsOpenedByOneStoreAtATime) {
  TempDir dir;
  const std::string shared = dir.file("shared");
  {
    Store first(small_options({shared}));
    try {
      Store second(small_options({dir.file("other"), shared}));
      ADD_FAILURE() << "a second store opened a folder in use";
    } catch (const Error& e) {
      EXPECT_EQ(e.errnum(), EBUSY);
      EXPECT_NE(std::string(e.what()).find(shared), std::string::npos) << e.what();
    }
    std::vector<std::vector<unsigned char>> p{page_for("k", kPage)};
    EXPECT_TRUE(put_pages(first, {"k"}, p)[0]);  // the refused open touched nothing
    first.close();
    Store again(small_options({shared}));
    std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(kPage)};
    EXPECT_TRUE(get_pages(again, {"k"}, out)[0]);
  }
  // Held by another process: a child opens the store and waits; its death frees the folder.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      Store held(small_options({shared}));
      const char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(2);
      ::pause();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_THROW(Store(small_options({shared})), Error);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  Store after(small_options({shared}));
  EXPECT_EQ(after.stats().folders.size(), 1u);
}

/// A key whose pages go to folder `folder` of `folders` (the store places by FNV-1a 64 of the key).
std::string key_for_folder(const std::string& prefix, std::uint64_t folder, std::uint64_t folders) {
  for (int i = 0;; ++i) {
    const std::string k = prefix + std::to_string(i);
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : k) h = (h ^ c) * 1099511628211ull;
    if (h % folders == folder) return k;
  }
}

// clear() drops every page and is durable when it returns: a crash right after it (a forked
// child that _exits with the store open) brings nothing back, neither pages in the last
// checkpoint nor pages put after it, nor an older version of a replaced page.
TEST(KvStore, ClearIsDurableWhenItReturns) {
  TempDir dir;
  auto o = small_options({dir.file("a"), dir.file("b")});
  std::vector<std::string> before, after;
  std::vector<std::vector<unsigned char>> before_pages, after_pages;
  for (int i = 0; i < 10; ++i) {
    before.push_back("c" + std::to_string(i));
    before_pages.push_back(page_for(before.back(), kPage));
    after.push_back("d" + std::to_string(i));
    after_pages.push_back(page_for(after.back(), 1000 + i));
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      Store s(o);
      for (bool b : put_pages(s, before, before_pages)) rc = b ? rc : 2;
      s.checkpoint();
      for (bool b : put_pages(s, after, after_pages)) rc = b ? rc : 3;
      std::vector<std::vector<unsigned char>> newer{page_for(after[0], 500, 9)};
      rc = put_pages(s, {after[0]}, newer)[0] ? rc : 4;  // the older version stays on the drive
      if (s.clear() != 20) rc = 5;
      std::vector<std::string_view> all(before.begin(), before.end());
      all.insert(all.end(), after.begin(), after.end());
      for (bool b : s.contains(all)) rc = b ? 6 : rc;
      std::vector<std::vector<unsigned char>> kept{page_for("kept", 300)};
      rc = put_pages(s, {"kept"}, kept)[0] ? rc : 7;
      ::_exit(rc);  // a crash: no close(), no checkpoint at close
    } catch (...) {
      ::_exit(8);
    }
  }
  ASSERT_EQ(exit_code_of(child), 0);
  Store s(o);
  EXPECT_EQ(s.stats().recovered_pages, 1u);
  std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(300)};
  EXPECT_TRUE(get_pages(s, {"kept"}, out)[0]);
  EXPECT_EQ(out[0], page_for("kept", 300));
  std::vector<std::string_view> all(before.begin(), before.end());
  all.insert(all.end(), after.begin(), after.end());
  for (bool b : s.contains(all)) EXPECT_FALSE(b);
}

// checkpoint() makes every remove() before it durable even while a put that started before the
// removed page's (an older generation) is still writing: it waits for that put, so that the
// checkpoint's generation bound covers the removed page and a later scan cannot take it back.
TEST(KvStore, CheckpointAfterRemoveWaitsForEarlierPutsInFlight) {
  TempDir dir;
  auto o = small_options({dir.file("slow"), dir.file("fast")});
  o.handle.intra_op_parallelism = 2;
  const std::string slow_key = key_for_folder("s", 0, 2);
  const std::string removed = key_for_folder("r", 1, 2);
  const std::string slow_prefix = folder_prefix(dir.file("slow"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    std::mutex m;
    std::condition_variable cv;
    bool entered = false;
    bool release = false;
    try {
      Store s(o);
      deepio::detail::set_fault_hook([&](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point != deepio::detail::FaultPoint::Write) return std::nullopt;
        if (!fd_in(site.fd, slow_prefix) || !fd_is_slab(site.fd)) return std::nullopt;
        std::lock_guard lk(m);
        entered = true;
        cv.notify_all();
        if (release) return std::nullopt;
        return deepio::detail::kFaultHold;  // the write stays in flight (its worker goes on)
      });
      std::vector<unsigned char> slow_page = page_for(slow_key, kPage);
      std::vector<std::string_view> sk{slow_key};
      std::vector<std::vector<Segment>> ss{{Segment{slow_page.data(), slow_page.size()}}};
      kv::BatchFuture slow = s.put(sk, ss);
      {
        std::unique_lock lk(m);
        cv.wait(lk, [&] { return entered; });  // its generation is taken, its write held
      }
      std::vector<unsigned char> rp = page_for(removed, kPage);
      std::vector<std::string_view> rk{removed};
      std::vector<std::vector<Segment>> rs{{Segment{rp.data(), rp.size()}}};
      kv::BatchFuture fast = s.put(rk, rs);
      if (!fast.wait_for(std::chrono::seconds(20))) rc = 2;  // the test's premise: it commits first
      if (rc == 0 && !fast.get()[0]) rc = 3;
      if (rc == 0 && s.remove(rk) != 1) rc = 4;
      std::atomic<bool> checkpointed{false};
      std::thread ck([&] {
        s.checkpoint();
        checkpointed = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (checkpointed) rc = rc != 0 ? rc : 5;  // it did not wait for the earlier put
      {
        std::lock_guard lk(m);
        release = true;
      }
      cv.notify_all();
      ck.join();
      deepio::detail::set_fault_hook({});
      if (rc == 0 && !slow.get()[0]) rc = 6;
      ::_exit(rc);  // a crash: no close()
    } catch (...) {
      ::_exit(7);
    }
  }
  ASSERT_EQ(exit_code_of(child), 0);
  Store s(o);
  std::vector<std::string_view> keys{slow_key, removed};
  auto present = s.contains(keys);
  EXPECT_TRUE(present[0]);
  EXPECT_FALSE(present[1]) << "a removed page came back after a crash that followed checkpoint()";
}

TEST(KvStore, OnDoneRunsOnce) {
  TempDir dir;
  Store s(small_options({dir.file("a")}));
  std::vector<std::vector<unsigned char>> p{page_for("cb", 100)};
  std::vector<std::string_view> k{"cb"};
  std::vector<std::vector<Segment>> segs{{Segment{p[0].data(), 100}}};
  std::atomic<int> calls{0};
  auto fut = s.put(k, segs);
  fut.on_done([&] { ++calls; });
  fut.wait();
  // The batch thread runs callbacks after it wakes waiters (as concurrent.futures does).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (calls.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(calls.load(), 1);
  fut.on_done([&] { ++calls; });  // already done: at once, on this thread
  EXPECT_EQ(calls.load(), 2);
}

}  // namespace
}  // namespace deepio::test
