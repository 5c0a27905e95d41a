// The slot journal (src/kv/journal.hpp, issue 47 item 4): reopen reads the checkpoint and only
// the slots put since it (none after a clean close), a journal that fills forces a checkpoint
// and loses nothing, an incomplete journal falls back to the scan of every header, and a store
// made before the journal (kv.meta format 2, checkpoint format 1) opens as it did.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv/layout.hpp"
#include "kv_support.hpp"
#include "platform/fault.hpp"

namespace deepio::test {
namespace {

using kv::Store;
namespace ki = kv::internal;

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<std::vector<unsigned char>> pages_of(const std::vector<std::string>& keys, std::uint32_t salt = 0) {
  std::vector<std::vector<unsigned char>> p;
  for (const auto& k : keys) p.push_back(page_for(k, kPage, salt));
  return p;
}

/// Every key holds the page of `salt` (page_of), read back whole.
void expect_pages(Store& s, const std::vector<std::string>& keys, std::uint32_t salt = 0) {
  std::vector<std::vector<unsigned char>> out(keys.size(), std::vector<unsigned char>(kPage));
  const auto ok = get_pages(s, keys, out);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(ok[i]) << keys[i];
    if (ok[i]) {
      EXPECT_EQ(out[i], page_for(keys[i], kPage, salt)) << keys[i];
    }
  }
}

/// A one-folder store made with `keys` put (their pages of salt 0) and closed; its slot count
/// and slot size, for tests that then rewrite its files.
struct Made {
  std::uint64_t slots = 0, slot_bytes = 0;
};
Made make_and_close(const kv::StoreOptions& o, const std::vector<std::string>& keys) {
  Store s(o);
  auto p = pages_of(keys);
  for (bool ok : put_pages(s, keys, p)) EXPECT_TRUE(ok);
  return Made{s.stats().folders[0].slots, s.stats().slot_bytes};
}

TEST(KvJournal, FormatsRoundTrip) {
  ki::Meta m;
  m.page_bytes = 8192;
  m.slot_bytes = 12288;
  m.slots = 100;
  m.per_slab = 50;
  m.gen_floor = 7;
  m.journal_blocks = 65;
  m.fingerprint = "fp";
  auto v3 = ki::decode_meta(ki::encode_meta(m));
  ASSERT_TRUE(v3);
  EXPECT_EQ(v3->version, 3u);
  EXPECT_EQ(v3->journal_blocks, 65u);
  EXPECT_EQ(v3->fingerprint, "fp");
  EXPECT_EQ(v3->gen_floor, 7u);
  m.journal_blocks = 0;  // a store made without a journal keeps format 2
  auto v2 = ki::decode_meta(ki::encode_meta(m));
  ASSERT_TRUE(v2);
  EXPECT_EQ(v2->version, 2u);
  EXPECT_EQ(v2->journal_blocks, 0u);
  EXPECT_EQ(v2->fingerprint, "fp");

  std::vector<ki::CkptRecord> recs{{3, 10, 5, 700, 0xABCD, "key-3"}, {9, 12, 6, 0, 1, "k"}};
  auto c2 = ki::decode_checkpoint(ki::encode_checkpoint(11, recs, true));
  ASSERT_TRUE(c2);
  EXPECT_EQ(c2->version, 2u);
  EXPECT_EQ(c2->bound, 11u);
  ASSERT_EQ(c2->records.size(), 2u);
  EXPECT_EQ(c2->records[0].key, "key-3");
  EXPECT_EQ(c2->records[0].len, 700u);
  EXPECT_EQ(c2->records[0].crc, 0xABCDu);
  EXPECT_EQ(c2->records[1].slot, 9u);
  EXPECT_EQ(c2->records[1].tick, 6u);
  auto c1 = ki::decode_checkpoint(ki::encode_checkpoint(11, recs));
  ASSERT_TRUE(c1);
  EXPECT_EQ(c1->version, 1u);
  EXPECT_EQ(c1->records[1].gen, 12u);
  EXPECT_TRUE(c1->records[1].key.empty());
  auto torn = ki::encode_checkpoint(11, recs, true);
  torn[30] ^= 1;
  EXPECT_FALSE(ki::decode_checkpoint(torn));

  std::vector<unsigned char> blk(ki::kJournalBlock);
  ki::JournalBlock j{false, false, 42, {}};
  for (std::uint32_t i = 0; i < ki::kJournalRecordsPerBlock; ++i) j.records.push_back({i, 1000u + i});
  ki::encode_journal_block(blk.data(), j);
  auto back = ki::decode_journal_block(blk.data());
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->head);
  EXPECT_EQ(back->seq, 42u);
  ASSERT_EQ(back->records.size(), ki::kJournalRecordsPerBlock);
  EXPECT_EQ(back->records.back().gen, 1000u + ki::kJournalRecordsPerBlock - 1);
  blk[600] ^= 1;  // torn
  EXPECT_FALSE(ki::decode_journal_block(blk.data()));
  std::vector<unsigned char> zeros(ki::kJournalBlock);
  EXPECT_FALSE(ki::decode_journal_block(zeros.data()));  // never written
}

// After a crash, open reads the checkpoint, the journal, and the header and page of each slot
// put since the checkpoint only: not every slot header (O(capacity)) as a store without one.
TEST(KvJournal, ACrashReadsOnlyTheSlotsPutSinceTheCheckpoint) {
  TempDir dir;
  const auto o = small_options({dir.file("a"), dir.file("b")}, 256);
  const auto old_keys = numbered_keys("old-", 60);
  const std::vector<std::string> replaced(old_keys.begin(), old_keys.begin() + 3);
  const std::vector<std::string> kept(old_keys.begin() + 3, old_keys.end());
  const int rc = in_watched_child([&] {
    Store s(o);
    auto p = pages_of(old_keys);
    for (bool ok : put_pages(s, old_keys, p)) {
      if (!ok) return 2;
    }
    s.checkpoint();
    const auto since = numbered_keys("new-", 7);
    auto q = pages_of(since);
    for (bool ok : put_pages(s, since, q)) {
      if (!ok) return 2;
    }
    auto r = pages_of(replaced, 1);
    for (bool ok : put_pages(s, replaced, r)) {
      if (!ok) return 2;
    }
    ::_exit(0);  // a crash: no close, the 10 pages put since the checkpoint are not in it
  });
  ASSERT_EQ(rc, 0);
  Store s(o);
  const auto st = s.stats();
  EXPECT_EQ(st.recovered_pages, 67u);
  EXPECT_EQ(st.open_headers_read, 10u);  // the 7 new pages and the 3 replacements, of 256 slots
  EXPECT_EQ(st.open_pages_read, 10u);
  expect_pages(s, numbered_keys("new-", 7));
  expect_pages(s, replaced, 1);
  expect_pages(s, kept);
}

// One put per batch takes one journal block per batch: with checkpoint_interval 0 (no
// periodic checkpoint) a ring half full still gets a checkpoint, and a crash after many times
// the ring's size loses no acknowledged put.
TEST(KvJournal, AJournalThatFillsForcesACheckpointAndLosesNothing) {
  TempDir dir;
  auto o = small_options({dir.file("a")}, 64);  // 64 slots: a ring of 64 blocks
  o.batch_threads = 1;
  const auto keys = numbered_keys("k", 40);
  const int rounds = 300;
  const int rc = in_watched_child(
      [&] {
        Store s(o);
        for (int r = 0; r < rounds; ++r) {
          const std::vector<std::string> one{keys[static_cast<std::size_t>(r) % keys.size()]};
          auto p = pages_of(one, static_cast<std::uint32_t>(r));
          if (!put_pages(s, one, p)[0]) return 2;
        }
        if (s.stats().checkpoints < 4) return 3;  // forced by the journal, not by an interval
        ::_exit(0);                               // a crash: no close
      },
      60);
  ASSERT_EQ(rc, 0);
  Store s(o);
  const auto st = s.stats();
  EXPECT_EQ(st.recovered_pages, keys.size());
  EXPECT_LT(st.open_headers_read, 64u);  // from the journal, not a scan of the 64 slots
  for (std::size_t k = 0; k < keys.size(); ++k) {
    // The last round that put key k.
    std::uint32_t last = 0;
    for (int r = 0; r < rounds; ++r) {
      if (static_cast<std::size_t>(r) % keys.size() == k) last = static_cast<std::uint32_t>(r);
    }
    expect_pages(s, {keys[k]}, last);
  }
}

// While a put older than a removed page is in flight, no checkpoint may be written (it would
// not cover the removal): a ring that fills meanwhile turns its head to "scan" and takes no
// more records, and the open after a crash scans every header; nothing acknowledged is lost,
// and the next checkpoint brings the journal back.
TEST(KvJournal, ARingThatFillsWhileNoCheckpointCanBeWrittenTurnsToTheScan) {
  TempDir dir;
  auto o = small_options({dir.file("a")}, 64);  // 64 slots: a ring of 64 blocks
  const auto keys = numbered_keys("k", 10);
  const int rounds = 100;
  const int rc = in_watched_child(
      [&] {
        auto held = std::make_shared<std::atomic<bool>>(false);
        // The first put's page (slot 0) never completes: its generation stays in flight.
        deepio::detail::set_fault_hook([held](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
          if (site.point != deepio::detail::FaultPoint::Write || !fd_is_slab(site.fd)) return std::nullopt;
          if (site.offset != 4096 || site.nbytes != kPage) return std::nullopt;
          held->store(true);
          return deepio::detail::kFaultHold;
        });
        Store s(o);
        std::vector<unsigned char> first = page_for("held", kPage);
        std::vector<std::string_view> hk{"held"};
        std::vector<std::vector<kv::Segment>> hs{{kv::Segment{first.data(), first.size()}}};
        kv::BatchFuture f = s.put(hk, hs);
        while (!held->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (int r = 0; r < rounds; ++r) {  // each replace drops a page newer than the held put
          const std::vector<std::string> one{keys[static_cast<std::size_t>(r) % keys.size()]};
          auto p = pages_of(one, static_cast<std::uint32_t>(r));
          if (!put_pages(s, one, p)[0]) return 2;
        }
        if (s.stats().checkpoints != 0) return 3;  // none could be written
        ::_exit(0);                                // a crash, the first put still in flight
      },
      60);
  ASSERT_EQ(rc, 0);
  {
    Store s(o);
    EXPECT_EQ(s.stats().open_headers_read, s.stats().folders[0].slots);  // the head says "scan"
    // The held put was never acknowledged: its page may be there (the hook holds only the
    // write's completion) or not.
    EXPECT_GE(s.stats().recovered_pages, keys.size());
    EXPECT_LE(s.stats().recovered_pages, keys.size() + 1);
    for (std::size_t k = 0; k < keys.size(); ++k)
      expect_pages(s, {keys[k]}, static_cast<std::uint32_t>(rounds - 10 + k));
  }  // the close's checkpoint covers what the scan found: the head says "normal" again
  Store s(o);
  EXPECT_EQ(s.stats().open_headers_read, 0u);
  EXPECT_GE(s.stats().recovered_pages, keys.size());
}

// A head that does not say "normal" (torn, or "scan": the ring missed records) makes open scan
// every header of the folder, as a store without a journal does; the next checkpoint brings
// the journal back.
TEST(KvJournal, AnIncompleteJournalFallsBackToTheScan) {
  TempDir dir;
  const auto o = small_options({dir.file("a")}, 64);
  const auto keys = numbered_keys("k", 30);
  const auto [slots, slot_bytes] = make_and_close(o, keys);
  {
    const std::string slab = dir.file("a") + "/slab-0000.bin";
    const int fd = ::open(slab.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    std::vector<unsigned char> zeros(ki::kJournalBlock);
    ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(slots * slot_bytes)),
              static_cast<ssize_t>(zeros.size()));
    ::close(fd);
  }
  {
    Store s(o);
    EXPECT_EQ(s.stats().open_headers_read, slots);  // every header: the journal cannot be trusted
    expect_pages(s, keys);
    auto more = numbered_keys("more-", 5);
    auto p = pages_of(more);
    for (bool ok : put_pages(s, more, p)) ASSERT_TRUE(ok);
  }  // the close's checkpoint covers the scan: the head says "normal" again
  Store s(o);
  EXPECT_EQ(s.stats().open_headers_read, 0u);
  EXPECT_EQ(s.stats().recovered_pages, 35u);
  expect_pages(s, numbered_keys("more-", 5));
}

// A store made before the journal (kv.meta format 2, checkpoint format 1, slabs of slots
// only) opens with the scan of every header, keeps its format, and loses nothing.
TEST(KvJournal, AStoreMadeWithoutAJournalOpensAsBefore) {
  TempDir dir;
  const auto o = small_options({dir.file("a")}, 64);
  const auto keys = numbered_keys("k", 20);
  const auto [slots, slot_bytes] = make_and_close(o, keys);
  // Rewrite it as the previous format wrote it.
  const std::string a = dir.file("a");
  auto meta = ki::decode_meta(read_file(a + "/kv.meta"));
  ASSERT_TRUE(meta);
  ASSERT_GT(meta->journal_blocks, 0u);
  meta->journal_blocks = 0;
  write_file(a + "/kv.meta", ki::encode_meta(*meta));
  auto ck = ki::decode_checkpoint(read_file(a + "/index.ckpt"));
  ASSERT_TRUE(ck);
  ASSERT_EQ(ck->version, 2u);
  write_file(a + "/index.ckpt", ki::encode_checkpoint(ck->bound, ck->records));
  std::filesystem::resize_file(a + "/slab-0000.bin", slots * slot_bytes);
  {
    Store s(o);
    EXPECT_EQ(s.stats().open_headers_read, slots);
    EXPECT_EQ(s.stats().recovered_pages, keys.size());
    expect_pages(s, keys);
    auto more = numbered_keys("more-", 5);
    auto p = pages_of(more);
    for (bool ok : put_pages(s, more, p)) ASSERT_TRUE(ok);
  }
  EXPECT_EQ(ki::decode_meta(read_file(a + "/kv.meta"))->version, 2u);
  EXPECT_EQ(ki::decode_checkpoint(read_file(a + "/index.ckpt"))->version, 1u);
  EXPECT_EQ(std::filesystem::file_size(a + "/slab-0000.bin"), slots * slot_bytes);
  Store s(o);
  EXPECT_EQ(s.stats().open_headers_read, slots);
  EXPECT_EQ(s.stats().recovered_pages, keys.size() + 5);
  expect_pages(s, numbered_keys("more-", 5));
}

}  // namespace
}  // namespace deepio::test
