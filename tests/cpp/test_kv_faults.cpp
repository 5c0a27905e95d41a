// deepio::kv::Store when a folder's I/O fails: injected EIO/ENOSPC on one folder (misses
// there, the others serve, a failed write put again elsewhere), a folder that cannot open, and
// the probes that bring a failed folder back (by hand, by itself after retry_failed_after,
// never with 0; pinned slots left alone; no dropped page back after a crash). Fault hooks match
// the store's own folder (folder_prefix), never a substring of an absolute path.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv_support.hpp"
#include "platform/fault.hpp"

namespace deepio::test {
namespace {

using kv::BatchFuture;
using kv::Segment;
using kv::Store;

TEST(KvStore, EioOnOneFolderMissesThereAndOthersServe) {
  TempDir dir;
  const std::string bad = dir.file("bad");
  Store s(small_options({bad, dir.file("good")}));
  std::vector<std::string> keys;
  std::vector<std::vector<unsigned char>> pages;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("f" + std::to_string(i));
    pages.push_back(page_for(keys.back(), kPage));
  }
  for (bool b : put_pages(s, keys, pages)) ASSERT_TRUE(b);
  deepio::detail::set_fault_hook(
      [prefix = folder_prefix(bad)](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point != deepio::detail::FaultPoint::Read || !fd_in(site.fd, prefix)) return std::nullopt;
        return -EIO;
      });
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  auto ok = get_pages(s, keys, out);
  deepio::detail::set_fault_hook({});
  auto st = s.stats();
  ASSERT_EQ(st.folders.size(), 2u);
  EXPECT_TRUE(st.folders[0].failed);
  EXPECT_EQ(st.folders[0].last_errno, EIO);
  EXPECT_FALSE(st.folders[1].failed);
  std::size_t hits = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (ok[i]) {
      ++hits;
      EXPECT_EQ(out[i], pages[i]);
    }
  }
  EXPECT_GT(hits, 0u);
  EXPECT_LT(hits, keys.size());
  EXPECT_EQ(s.take_warnings().size(), 1u);
  // New puts go to the good folder and are served.
  std::vector<std::vector<unsigned char>> more{page_for("after", kPage)};
  EXPECT_TRUE(put_pages(s, {"after"}, more)[0]);
  std::vector<std::vector<unsigned char>> back{std::vector<unsigned char>(kPage)};
  EXPECT_TRUE(get_pages(s, {"after"}, back)[0]);
}

TEST(KvStore, AWriteFailurePutsThePageOnAnotherFolder) {
  TempDir dir;
  Store s(small_options({dir.file("bad"), dir.file("good")}));
  std::vector<std::string> keys;
  std::vector<std::vector<unsigned char>> pages;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("w" + std::to_string(i));
    pages.push_back(page_for(keys.back(), kPage));
  }
  deepio::detail::set_fault_hook(
      [prefix = folder_prefix(dir.file("bad"))](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point != deepio::detail::FaultPoint::Write || !fd_in(site.fd, prefix)) return std::nullopt;
        return -ENOSPC;
      });
  auto ok = put_pages(s, keys, pages);
  deepio::detail::set_fault_hook({});
  for (bool b : ok) EXPECT_TRUE(b);
  auto st = s.stats();
  EXPECT_TRUE(st.folders[0].failed);
  EXPECT_EQ(st.folders[0].last_errno, ENOSPC);
  EXPECT_EQ(st.folders[1].used, 16u);
  EXPECT_EQ(st.puts, 16u);
  EXPECT_EQ(st.puts_failed, 0u);
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, keys, out)) EXPECT_TRUE(b);
  EXPECT_EQ(out, pages);
}

// Reads of the folder `folder` fail with EIO while on() is set. Made before the store, so
// that the hook goes after it (no I/O in flight).
class BadReads {
 public:
  explicit BadReads(const std::string& folder) {
    auto on = on_;
    deepio::detail::set_fault_hook(
        [on, prefix = folder_prefix(folder)](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
          if (!on->load() || site.point != deepio::detail::FaultPoint::Read) return std::nullopt;
          if (!fd_in(site.fd, prefix)) return std::nullopt;
          return -EIO;
        });
  }
  ~BadReads() { deepio::detail::set_fault_hook({}); }
  BadReads(const BadReads&) = delete;
  BadReads& operator=(const BadReads&) = delete;
  void set(bool on) { on_->store(on); }

 private:
  std::shared_ptr<std::atomic<bool>> on_ = std::make_shared<std::atomic<bool>>(false);
};

std::vector<std::string> numbered(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

std::vector<std::vector<unsigned char>> pages_of(const std::vector<std::string>& keys) {
  std::vector<std::vector<unsigned char>> pages;
  for (const auto& k : keys) pages.push_back(page_for(k, kPage));
  return pages;
}

/// Puts 16 pages over {bad, good}, then fails "bad" by a get under EIO; returns the store's
/// warnings (the failure's).
std::vector<std::string> fail_bad_folder(Store& s, BadReads& fault) {
  auto keys = numbered("f", 16);
  auto pages = pages_of(keys);
  for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
  fault.set(true);
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  get_pages(s, keys, out);
  EXPECT_TRUE(s.stats().folders[0].failed);
  return s.take_warnings();
}

bool wait_until(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A folder failed by EIO is probed by retry_failed(): while the fault lasts the probe fails
// (still failed, one more error each time); once it is gone the folder comes back, empty (its
// pages stay dropped), takes new pages and serves them.
TEST(KvStore, AFailedFolderComesBackOnceItWorks) {
  TempDir dir;
  const std::string bad = dir.file("bad");
  BadReads fault(dir.file("bad"));
  Store s(small_options({bad, dir.file("good")}));
  EXPECT_EQ(fail_bad_folder(s, fault).size(), 1u);
  const std::uint64_t errors = s.stats().folders[0].errors;
  EXPECT_EQ(s.retry_failed(), 0u);
  EXPECT_EQ(s.retry_failed(), 0u);
  auto st = s.stats();
  EXPECT_TRUE(st.folders[0].failed);
  EXPECT_EQ(st.folders[0].errors, errors + 2);
  EXPECT_EQ(st.folders[0].recoveries, 0u);
  EXPECT_TRUE(s.take_warnings().empty());  // a failed probe of a failed folder warns no more
  fault.set(false);
  EXPECT_EQ(s.retry_failed(), 1u);
  st = s.stats();
  EXPECT_FALSE(st.folders[0].failed);
  EXPECT_EQ(st.folders[0].recoveries, 1u);
  EXPECT_EQ(st.folders[0].errors, errors + 2);  // the history stays
  EXPECT_EQ(st.folders[0].last_errno, EIO);
  EXPECT_EQ(st.folders[0].used, 0u);
  EXPECT_EQ(s.take_warnings(), std::vector<std::string>{"deepio.kv: folder " + bad + " recovered"});
  EXPECT_EQ(s.retry_failed(), 0u);  // nothing is failed
  auto keys = numbered("n", 32);
  auto pages = pages_of(keys);
  for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
  EXPECT_GT(s.stats().folders[0].used, 0u);
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, keys, out)) EXPECT_TRUE(b);
  EXPECT_EQ(out, pages);
  EXPECT_FALSE(s.stats().folders[0].failed);
}

// retry_failed_after: after a batch that finds the folder failed that long ago, the batch
// thread probes it; while the fault lasts each probe fails, then one succeeds.
TEST(KvStore, AFailedFolderIsProbedAfterRetryFailedAfter) {
  TempDir dir;
  BadReads fault(dir.file("bad"));
  auto o = small_options({dir.file("bad"), dir.file("good")});
  o.retry_failed_after = std::chrono::milliseconds(50);
  Store s(o);
  fail_bad_folder(s, fault);
  const std::uint64_t errors = s.stats().folders[0].errors;
  std::vector<std::vector<unsigned char>> tick{page_for("tick", 100)};
  auto batch = [&] {
    EXPECT_TRUE(put_pages(s, {"tick"}, tick)[0]);
    return false;
  };
  EXPECT_TRUE(wait_until([&] { return batch() || s.stats().folders[0].errors >= errors + 2; }));
  EXPECT_TRUE(s.stats().folders[0].failed);
  fault.set(false);
  EXPECT_TRUE(wait_until([&] { return batch() || !s.stats().folders[0].failed; }));
  EXPECT_EQ(s.stats().folders[0].recoveries, 1u);
  const auto w = s.take_warnings();
  ASSERT_FALSE(w.empty());
  EXPECT_NE(w.back().find("recovered"), std::string::npos);
}

// retry_failed_after = 0: no batch probes; retry_failed() still does.
TEST(KvStore, RetryFailedAfterZeroNeverProbesByItself) {
  TempDir dir;
  BadReads fault(dir.file("bad"));
  auto o = small_options({dir.file("bad"), dir.file("good")});
  o.retry_failed_after = std::chrono::milliseconds(0);
  Store s(o);
  fail_bad_folder(s, fault);
  fault.set(false);
  const std::uint64_t errors = s.stats().folders[0].errors;
  std::vector<std::vector<unsigned char>> tick{page_for("tick", 100)};
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(put_pages(s, {"tick"}, tick)[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto st = s.stats();
  EXPECT_TRUE(st.folders[0].failed);
  EXPECT_EQ(st.folders[0].errors, errors);
  EXPECT_EQ(s.retry_failed(), 1u);
}

// A get pins its slot; the folder fails (the slot turns zombie) and comes back while the get
// still reads. The slot must not be handed out (nor probed) until the get is done: the get's
// data read is held by the hook, then cut short, so that its last 4 KiB are read again from
// the disk after the folder took many new pages: a reused slot would make it a miss.
TEST(KvStore, AGetInFlightKeepsItsSlotWhileTheFolderComesBack) {
  TempDir dir;
  const std::string bad = dir.file("bad");
  constexpr std::uint64_t kSlot = 4096 + kPage;
  struct Hook {
    std::atomic<bool> arm{false}, eio{false}, release{false}, cut{false};
    std::atomic<std::int64_t> held{-1};  // file offset of the held data read
  };
  auto h = std::make_shared<Hook>();
  deepio::detail::set_fault_hook(
      [h, prefix = folder_prefix(bad)](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        if (site.point != deepio::detail::FaultPoint::Read || !fd_in(site.fd, prefix)) return std::nullopt;
        const auto off = static_cast<std::int64_t>(site.offset);
        if (off == h->held.load()) {
          if (!h->release.load()) return deepio::detail::kFaultHold;
          if (!h->cut.exchange(true) && site.result == static_cast<std::int64_t>(kPage)) return kPage - 4096;
          return std::nullopt;
        }
        if (h->eio.load()) return -EIO;
        if (h->arm.load() && site.offset % kSlot == 4096 && site.nbytes == kPage) {
          std::int64_t none = -1;
          if (h->held.compare_exchange_strong(none, off)) return deepio::detail::kFaultHold;
        }
        return std::nullopt;
      });
  {
    Store s(small_options({bad}, 8));
    struct Release {  // a failed assertion must not leave the get held: the store's close waits for it
      Hook* h;
      ~Release() {
        h->eio = false;
        h->release = true;
      }
    } release_at_exit{h.get()};
    std::vector<std::vector<unsigned char>> pinned{page_for("pinned", kPage)}, other{page_for("other", kPage)};
    ASSERT_TRUE(put_pages(s, {"pinned"}, pinned)[0]);
    ASSERT_TRUE(put_pages(s, {"other"}, other)[0]);
    h->arm = true;
    std::vector<unsigned char> out(kPage);
    std::vector<std::string_view> k{"pinned"};
    std::vector<std::vector<Segment>> seg{{Segment{out.data(), out.size()}}};
    BatchFuture fut = s.get(k, seg);
    ASSERT_TRUE(wait_until([&] { return h->held.load() >= 0; }));  // a get reads no header: the data only
    h->arm = false;
    h->eio = true;
    std::vector<std::vector<unsigned char>> back{std::vector<unsigned char>(kPage)};
    EXPECT_FALSE(get_pages(s, {"other"}, back)[0]);
    ASSERT_TRUE(s.stats().folders[0].failed);
    EXPECT_EQ(s.retry_failed(), 0u);
    h->eio = false;
    ASSERT_EQ(s.retry_failed(), 1u);
    for (int round = 0; round < 4; ++round) {  // every slot the folder hands out, several times
      auto keys = numbered("n" + std::to_string(round) + "-", 8);
      auto pages = pages_of(keys);
      put_pages(s, keys, pages);
    }
    EXPECT_GT(s.stats().folders[0].used, 0u);
    h->release = true;
    EXPECT_TRUE(fut.get()[0]);
    EXPECT_TRUE(h->cut.load());
    EXPECT_EQ(out, pinned[0]);
    EXPECT_FALSE(s.stats().folders[0].failed);
  }
  deepio::detail::set_fault_hook({});
}

// The folder's checkpoint on disk still lists the pages its failure dropped: a crash after the
// recovery (before the next checkpoint) must not bring them back. The "crash" is a copy of the
// folder's files taken while the store is open, opened by another store.
TEST(KvStore, ARecoveredFolderDoesNotBringBackItsDroppedPagesAfterACrash) {
  TempDir dir;
  const std::string bad = dir.file("bad");
  BadReads fault(dir.file("bad"));
  Store s(small_options({bad}, 32));
  auto keys = numbered("d", 8);
  auto pages = pages_of(keys);
  for (bool b : put_pages(s, keys, pages)) ASSERT_TRUE(b);
  s.checkpoint();  // lists them
  fault.set(true);
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, keys, out)) EXPECT_FALSE(b);
  fault.set(false);
  ASSERT_TRUE(s.stats().folders[0].failed);
  ASSERT_EQ(s.retry_failed(), 1u);
  std::vector<std::vector<unsigned char>> after{page_for("after", kPage)};
  ASSERT_TRUE(put_pages(s, {"after"}, after)[0]);
  const std::string crashed = dir.file("crashed");
  std::filesystem::copy(bad, crashed, std::filesystem::copy_options::recursive);
  Store again(small_options({crashed}, 32));
  std::vector<std::string_view> dropped(keys.begin(), keys.end());
  EXPECT_EQ(again.contains(dropped), std::vector<bool>(keys.size(), false));
  std::vector<std::vector<unsigned char>> back{std::vector<unsigned char>(kPage)};
  EXPECT_TRUE(get_pages(again, {"after"}, back)[0]);
  EXPECT_EQ(back, after);
}

TEST(KvStore, AFolderThatCannotOpenIsFailedAndTheOthersServe) {
  TempDir dir;
  const std::string blocker = dir.file("file");
  put(blocker, pattern(10, 1));  // a regular file: no folder can be made under it
  Store s(small_options({blocker + "/kv", dir.file("good")}));
  auto st = s.stats();
  EXPECT_TRUE(st.folders[0].failed);
  EXPECT_NE(st.folders[0].last_errno, 0);
  EXPECT_FALSE(st.folders[1].failed);
  EXPECT_EQ(s.take_warnings().size(), 1u);
  EXPECT_EQ(s.retry_failed(), 0u);  // never opened: not probed (a reopen tries it again)
  EXPECT_TRUE(s.stats().folders[0].failed);
  std::vector<std::vector<unsigned char>> p{page_for("k", kPage)};
  EXPECT_TRUE(put_pages(s, {"k"}, p)[0]);
  std::vector<std::vector<unsigned char>> out{std::vector<unsigned char>(kPage)};
  EXPECT_TRUE(get_pages(s, {"k"}, out)[0]);
  EXPECT_EQ(out[0], p[0]);
  // No folder at all: the open fails.
  EXPECT_THROW(Store(small_options({blocker + "/kv"})), Error);
}

}  // namespace
}  // namespace deepio::test
