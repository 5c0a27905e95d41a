// The cost per page of deepio::kv and the power-loss contract that makes it safe (issue 46):
// a get reads only its page (no slot header: the index knows the page's CRC-32C); a put
// writes header and page without waiting in between and syncs each slab it touched once per
// batch, acknowledging nothing before that sync; a header whose page did not land whole (a
// put torn by a crash) is a miss, and the key's older version comes back at open.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv/layout.hpp"
#include "kv/slots.hpp"
#include "kv_support.hpp"
#include "platform/fault.hpp"

namespace deepio::test {
namespace {

using kv::Store;
constexpr std::uint64_t kSlot = 4096 + kPage;

/// Counts a folder's slab I/O by kind: header and page reads and writes, and syncs.
struct Counts {
  std::atomic<int> header_reads{0}, page_reads{0}, header_writes{0}, page_writes{0}, journal_writes{0}, syncs{0};
  std::atomic<int> header_and_page_writes{0};  // a staged put: header and page in one request
  std::atomic<bool> hold_sync{false};
  std::atomic<int> sync_err{0};
};

std::shared_ptr<Counts> count_io(const std::string& folder) {
  auto c = std::make_shared<Counts>();
  deepio::detail::set_fault_hook(
      [c, prefix = folder_prefix(folder)](const deepio::detail::FaultSite& site) -> std::optional<std::int64_t> {
        using deepio::detail::FaultPoint;
        if (site.point == FaultPoint::Sync) {
          const std::string p = site.path != nullptr ? site.path : "";
          if (p.rfind(prefix, 0) != 0 || p.find("/slab-") == std::string::npos) return std::nullopt;
          while (c->hold_sync.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ++c->syncs;
          if (c->sync_err.load() != 0) return -c->sync_err.load();
          return std::nullopt;
        }
        if (site.point != FaultPoint::Read && site.point != FaultPoint::Write) return std::nullopt;
        if (!fd_in(site.fd, prefix) || !fd_is_slab(site.fd)) return std::nullopt;
        const bool header = site.offset % kSlot == 0;
        if (site.point == FaultPoint::Write && !header && site.nbytes == 4096) {  // a journal block
          ++c->journal_writes;
          return std::nullopt;
        }
        if (site.point == FaultPoint::Read) {
          ++(header ? c->header_reads : c->page_reads);
        } else if (header && site.nbytes > 4096) {
          ++c->header_and_page_writes;
        } else {
          ++(header ? c->header_writes : c->page_writes);
        }
        return std::nullopt;
      });
  return c;
}

struct NoHook {
  ~NoHook() { deepio::detail::set_fault_hook({}); }
};

// One folder of four slabs of 16 slots: a batch of 8 new pages (slots 0-7, one slab) costs
// 8 header writes, 8 page writes, one journal block and one sync; a get of them 8 page reads
// and no header read. A batch over 3 slabs writes a journal block to and syncs each once.
TEST(KvCost, APutSyncsEachSlabOnceAndAGetReadsOnlyThePage) {
  TempDir dir;
  const std::string a = dir.file("a");
  auto o = small_options({a}, 64);
  o.slab_bytes = 16 * kSlot;
  Store s(o);  // made (and its headers scanned) before the hook: open's reads are not counted
  NoHook unhook;
  auto c = count_io(a);
  auto keys = numbered_keys("k", 8);
  std::vector<std::vector<unsigned char>> pages;
  for (const auto& k : keys) pages.push_back(page_for(k, kPage));
  for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
  EXPECT_EQ(c->syncs.load(), 1);
  EXPECT_EQ(c->header_writes.load(), 8);
  EXPECT_EQ(c->page_writes.load(), 8);
  EXPECT_EQ(c->journal_writes.load(), 1);
  std::vector<std::vector<unsigned char>> out(8, std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, keys, out)) EXPECT_TRUE(b);
  EXPECT_EQ(out, pages);
  EXPECT_EQ(c->header_reads.load(), 0);
  EXPECT_EQ(c->page_reads.load(), 8);

  c->syncs = 0;
  c->journal_writes = 0;
  auto more = numbered_keys("m", 30);  // slots 8-37: slabs 0, 1 and 2
  std::vector<std::vector<unsigned char>> more_pages;
  for (const auto& k : more) more_pages.push_back(page_for(k, kPage));
  for (bool b : put_pages(s, more, more_pages)) EXPECT_TRUE(b);
  EXPECT_EQ(c->syncs.load(), 3);
  EXPECT_EQ(c->journal_writes.load(), 3);
}

// A put is acknowledged only after its slab's sync: while the sync is held the batch is not
// done; a failed sync fails the put (the folder with it) and leaves no page behind.
TEST(KvCost, APutIsAcknowledgedOnlyAfterItsSync) {
  TempDir dir;
  const std::string a = dir.file("a");
  Store s(small_options({a}, 16));
  NoHook unhook;
  auto c = count_io(a);
  struct Release {
    Counts* c;
    ~Release() { c->hold_sync = false; }
  } release{c.get()};
  c->hold_sync = true;
  std::vector<unsigned char> page = page_for("p", kPage);
  std::vector<std::string_view> k{"p"};
  std::vector<std::vector<kv::Segment>> seg{{kv::Segment{page.data(), page.size()}}};
  kv::BatchFuture f = s.put(k, seg);
  EXPECT_FALSE(f.wait_for(std::chrono::milliseconds(200)));
  std::vector<std::string_view> pk{"p"};
  EXPECT_FALSE(s.contains(pk)[0]);
  c->hold_sync = false;
  EXPECT_TRUE(f.get()[0]);
  EXPECT_TRUE(s.contains(pk)[0]);

  c->sync_err = EIO;
  std::vector<std::vector<unsigned char>> q{page_for("q", kPage)};
  EXPECT_FALSE(put_pages(s, {"q"}, q)[0]);
  std::vector<std::string_view> qk{"q"};
  EXPECT_FALSE(s.contains(qk)[0]);
  EXPECT_TRUE(s.stats().folders[0].failed);
}

/// Writes into slot `slot` of the one-slab folder `folder` what a put torn by a power loss can
/// leave: a whole header for (key, gen, the CRC of `page`) and only the first half of `page`.
void write_torn_put(const std::string& folder, std::uint32_t slot, const std::string& key, std::uint64_t gen,
                    const std::vector<unsigned char>& page) {
  std::vector<unsigned char> bytes(kSlot, 0);
  kv::internal::encode_header(bytes.data(), key, gen, page.size(), kv::crc32c(page.data(), page.size()), kPage);
  std::memcpy(bytes.data() + 4096, page.data(), page.size() / 2);
  const int fd = ::open((folder + "/slab-0000.bin").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(slot * kSlot)),
            static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

/// Writes journal block `pos` of the ring of the one-slab folder `folder` of `slots` slots,
/// listing `records` (the put's own record, which a power loss may keep without its page).
void write_journal(const std::string& folder, std::uint64_t slots, std::uint32_t pos,
                   const std::vector<kv::internal::JournalRecord>& records) {
  std::vector<unsigned char> block(kv::internal::kJournalBlock);
  kv::internal::encode_journal_block(block.data(), kv::internal::JournalBlock{false, false, 1000 + pos, records});
  const int fd = ::open((folder + "/slab-0000.bin").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const auto off = static_cast<off_t>(slots * kSlot + (pos + 1) * kv::internal::kJournalBlock);
  ASSERT_EQ(::pwrite(fd, block.data(), block.size(), off), static_cast<ssize_t>(block.size()));
  ::close(fd);
}

// A crash tore two puts (header and journal record whole, page not): a replace of "old" (whose
// acknowledged version comes back at open) and a new key "new" (a miss at get, then forgotten).
TEST(KvCost, AHeaderWhosePageDidNotLandIsNotThere) {
  TempDir dir;
  const std::string a = dir.file("a");
  std::vector<std::vector<unsigned char>> v1{page_for("old", kPage, 1)};
  {
    Store s(small_options({a}, 16));
    ASSERT_TRUE(put_pages(s, {"old"}, v1)[0]);  // slot 0; the close checkpoints it
  }
  const std::uint64_t gen = std::uint64_t{1} << 40;  // above the checkpoint's bound: after it
  write_torn_put(a, 5, "old", gen, page_for("old", kPage, 2));
  write_torn_put(a, 6, "new", gen + 1, page_for("new", kPage, 3));
  write_journal(a, 16, 1, {{5, gen}, {6, gen + 1}});  // block 0 holds the first put's record
  Store s(small_options({a}, 16));
  // "old" comes back as its whole version; "new" is not listed at all: a page newer than the
  // checkpoint is read at open and taken only if whole (a SIGKILL mid-put leaves the same).
  EXPECT_EQ(s.stats().recovered_pages, 1u);
  EXPECT_EQ(s.stats().open_pages_read, 2u);  // the two slots the journal lists; "old"'s listed one is not read
  std::vector<std::string_view> keys{"old", "new"};
  const auto listed = s.contains(keys);
  EXPECT_TRUE(listed[0]);
  EXPECT_FALSE(listed[1]);
  std::vector<std::vector<unsigned char>> out(2, std::vector<unsigned char>(kPage));
  auto got = get_pages(s, {"old", "new"}, out);
  EXPECT_TRUE(got[0]);
  EXPECT_EQ(out[0], v1[0]);
  EXPECT_FALSE(got[1]);
  EXPECT_EQ(s.stats().corrupt, 0u);  // never indexed, so never a corrupt read
}

// A batch's host pages go to the engine as one ranged operation per slab and handle block, not
// one per page or segment (docs/kv.md "Cost per page"): with 64 KiB blocks (8 pages of 8 KiB),
// a put of 64 pages into one slab is 8 data writes, one header write, one journal block and
// one sync; a get of
// them 8 reads. Each page is still its own request (the hook sees 64 reads and 64 writes) and
// verified against its CRC. A page of 8 segments costs no more operations than a page of one.
TEST(KvCost, ABatchIsOneOperationPerSlabAndBlockNotPerPage) {
  TempDir dir;
  const std::string a = dir.file("a");
  auto o = small_options({a}, 256);
  o.handle.block_size = 64 << 10;
  Store s(o);
  NoHook unhook;
  auto c = count_io(a);
  auto keys = numbered_keys("k", 64);
  std::vector<std::vector<unsigned char>> pages;
  for (const auto& k : keys) pages.push_back(page_for(k, kPage));
  const std::uint64_t ops0 = s.stats().io_ops;
  for (bool b : put_pages(s, keys, pages)) EXPECT_TRUE(b);
  EXPECT_EQ(s.stats().io_ops - ops0, 8u + 1u + 1u + 1u);
  EXPECT_EQ(c->page_writes.load(), 64);
  EXPECT_EQ(c->header_writes.load(), 64);
  EXPECT_EQ(c->syncs.load(), 1);

  const std::uint64_t ops1 = s.stats().io_ops;
  std::vector<std::vector<unsigned char>> out(64, std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, keys, out)) EXPECT_TRUE(b);
  EXPECT_EQ(out, pages);
  EXPECT_EQ(s.stats().io_ops - ops1, 8u);
  EXPECT_EQ(c->page_reads.load(), 64);
  EXPECT_EQ(c->header_reads.load(), 0);

  // 16 pages of 8 segments of 1 KiB each, scattered over one buffer (every other KiB): staged
  // (page_io.hpp), each page one request through the batch thread's staging memory, two
  // operations (16 x 8 KiB in 64 KiB blocks), 16 requests, not 128.
  std::vector<unsigned char> mem(16 * 2 * kPage);
  std::vector<std::string_view> k16(keys.begin(), keys.begin() + 16);
  std::vector<std::vector<kv::Segment>> segs(16);
  for (std::size_t p = 0; p < 16; ++p) {
    for (std::size_t g = 0; g < 8; ++g) segs[p].push_back(kv::Segment{mem.data() + (p * 16 + g * 2) * 1024, 1024});
  }
  const std::uint64_t ops2 = s.stats().io_ops;
  c->page_reads = 0;
  kv::BatchFuture f = s.get(k16, segs);
  for (bool b : f.get()) EXPECT_TRUE(b);
  EXPECT_EQ(s.stats().io_ops - ops2, 2u);
  EXPECT_EQ(c->page_reads.load(), 16);
  for (std::size_t p = 0; p < 16; ++p) {
    for (std::size_t g = 0; g < 8; ++g) {
      ASSERT_EQ(std::memcmp(mem.data() + (p * 16 + g * 2) * 1024, pages[p].data() + g * 1024, 1024), 0) << p << g;
    }
  }
  EXPECT_EQ(s.stats().corrupt, 0u);

  // A put of scattered pages is gathered the same way, after room for the page's header:
  // one write per page, its header with it (no header write of its own), and the bytes a
  // plain get reads back are the segments' in order.
  for (std::size_t p = 0; p < 16; ++p) {
    for (std::size_t g = 0; g < 8; ++g) std::memset(segs[p][g].data, static_cast<int>(p * 8 + g + 1), 1024);
  }
  std::vector<std::string> again = numbered_keys("s", 16);
  std::vector<std::string_view> ks(again.begin(), again.end());
  c->page_writes = 0;
  c->header_writes = 0;
  kv::BatchFuture put = s.put(ks, segs);  // held: get() returns a reference into it
  for (bool b : put.get()) EXPECT_TRUE(b);
  EXPECT_EQ(c->header_and_page_writes.load(), 16);
  EXPECT_EQ(c->page_writes.load(), 0);
  EXPECT_EQ(c->header_writes.load(), 0);
  std::vector<std::vector<unsigned char>> back(16, std::vector<unsigned char>(kPage));
  for (bool b : get_pages(s, again, back)) EXPECT_TRUE(b);
  for (std::size_t p = 0; p < 16; ++p) {
    for (std::size_t g = 0; g < 8; ++g) {
      ASSERT_EQ(back[p][g * 1024], static_cast<unsigned char>(p * 8 + g + 1)) << p << g;
      ASSERT_EQ(back[p][g * 1024 + 1023], static_cast<unsigned char>(p * 8 + g + 1)) << p << g;
    }
  }
}

// A batch stages at most 64 MiB (page_io.hpp): 40 pages of 2 MiB in 64 segments of 32 KiB
// each, 80 MiB, go 32 through staging (a request per 1 MiB block) and 8 as a request per
// segment; every byte lands where it belongs both ways.
TEST(KvCost, ABatchStagesAtMost64MiBAndSendsTheRestPerSegment) {
  TempDir dir;
  const std::string a = dir.file("a");
  constexpr std::size_t kBig = 2 << 20, kSeg = 32 << 10, kPages = 40;
  auto o = small_options({a}, 48);
  o.page_bytes = kBig;
  o.capacity_bytes = 48 * (4096 + kBig);
  Store s(o);
  NoHook unhook;
  auto c = count_io(a);
  std::vector<unsigned char> mem(kPages * 2 * kBig);  // every other 32 KiB: scattered
  std::vector<std::vector<kv::Segment>> segs(kPages);
  for (std::size_t p = 0; p < kPages; ++p) {
    for (std::size_t g = 0; g < kBig / kSeg; ++g) {
      unsigned char* at = mem.data() + (p * (kBig / kSeg) + g) * 2 * kSeg;
      std::memset(at, static_cast<int>((p * 7 + g) % 251), kSeg);
      segs[p].push_back(kv::Segment{at, kSeg});
    }
  }
  std::vector<std::string> keys = numbered_keys("b", static_cast<int>(kPages));
  std::vector<std::string_view> ks(keys.begin(), keys.end());
  kv::BatchFuture put = s.put(ks, segs);
  for (bool b : put.get()) EXPECT_TRUE(b);
  std::vector<std::vector<unsigned char>> back(kPages, std::vector<unsigned char>(kBig));
  for (bool b : get_pages(s, keys, back)) EXPECT_TRUE(b);
  for (std::size_t p = 0; p < kPages; ++p) {
    for (std::size_t g = 0; g < kBig / kSeg; ++g) {
      ASSERT_EQ(back[p][g * kSeg], static_cast<unsigned char>((p * 7 + g) % 251)) << p << " " << g;
      ASSERT_EQ(back[p][g * kSeg + kSeg - 1], static_cast<unsigned char>((p * 7 + g) % 251)) << p << " " << g;
    }
  }
  std::fill(mem.begin(), mem.end(), 0);
  c->page_reads = 0;
  c->header_reads = 0;  // (the hook tells headers by kSlot, not this store's slot size: both count)
  kv::BatchFuture got = s.get(ks, segs);
  for (bool b : got.get()) EXPECT_TRUE(b);
  // A staged page is one request per handle block (1 MiB: two), an unstaged one one per segment.
  EXPECT_EQ(c->page_reads.load() + c->header_reads.load(), 32 * 2 + 8 * 64);
  for (std::size_t p = 0; p < kPages; ++p) {
    for (std::size_t g = 0; g < kBig / kSeg; ++g) {
      ASSERT_EQ(static_cast<const unsigned char*>(segs[p][g].data)[kSeg / 2],
                static_cast<unsigned char>((p * 7 + g) % 251))
          << p << " " << g;
    }
  }
}

// Two pages of a get into the same memory cannot be one ranged read (its ranges may not
// overlap in the buffer): the chunk goes as one operation per page, as before, and both are
// hits (the same key twice: the same bytes land twice).
TEST(KvCost, PagesOverTheSameMemoryFallBackToAnOperationEach) {
  TempDir dir;
  const std::string a = dir.file("a");
  Store s(small_options({a}, 16));
  std::vector<std::vector<unsigned char>> v{page_for("p", kPage)};
  ASSERT_TRUE(put_pages(s, {"p"}, v)[0]);
  std::vector<unsigned char> out(kPage);
  std::vector<std::string_view> k{"p", "p"};
  std::vector<std::vector<kv::Segment>> seg(2, {kv::Segment{out.data(), out.size()}});
  const std::uint64_t ops0 = s.stats().io_ops;
  auto got = s.get(k, seg).get();
  EXPECT_TRUE(got[0]);
  EXPECT_TRUE(got[1]);
  EXPECT_EQ(s.stats().io_ops - ops0, 2u);
  EXPECT_EQ(out, v[0]);
  EXPECT_EQ(s.stats().corrupt, 0u);
}

// The index's memory per page, besides the key's own bytes (docs/kv.md "Cost per page",
// "Memory, measured by ..."): a model of 200 000 slots, all live, with 64-byte keys (SGLang's
// hex SHA-256), measured by the heap's own count. Printed, and bounded so that it does not
// grow unnoticed.
TEST(KvCost, TheIndexCostsAFixedNumberOfBytesPerPagePlusTheKey) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators replace malloc: mallinfo2() does not see them";
#endif
  constexpr std::uint32_t kSlots = 200000;
  constexpr std::size_t kKey = 64;
  std::vector<std::pair<std::string, kv::internal::Found>> pages;
  pages.reserve(kSlots);
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    std::string k = std::to_string(i);
    k.resize(kKey, 'k');
    pages.emplace_back(std::move(k), kv::internal::Found{{0, i}, i + 1u, kPage, i, i});
  }
  // Small allocations (uordblks) and large ones glibc maps on their own (hblkhd): the slot
  // array and the hash table are of the second kind.
  const auto heap = [] {
    const auto m = ::mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const std::size_t before = heap();
  std::size_t per_page = 0;
  {
    kv::internal::SlotModel m(1, 1.0, 1.0);
    m.init_folder(0, kSlots);
    m.load(pages);
    ASSERT_EQ(m.pages(), kSlots);
    const std::size_t after = heap();
    ASSERT_GT(after, before) << "mallinfo2() saw no allocation: another allocator?";
    per_page = (after - before) / kSlots;
  }
  ASSERT_GT(per_page, kKey);
  // The key is an allocation of its own: a 4-byte length and its characters, which glibc
  // gives a chunk of that plus its 8-byte header, rounded up to 16 (80 bytes here).
  const std::size_t key_bytes = (4 + kKey + 8 + 15) / 16 * 16;
  std::cout << "[ index ] " << per_page << " bytes per live page with a " << kKey << "-byte key: " << key_bytes
            << " for the key's allocation, " << per_page - key_bytes << " for the rest\n";
  EXPECT_LE(per_page - key_bytes, 64u) << "issue 46: at most 64 bytes per slot plus the key";
}

}  // namespace
}  // namespace deepio::test
