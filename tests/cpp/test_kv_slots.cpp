// The KV store's slot model (src/kv/slots.hpp) alone, without I/O or threads: table tests of
// its policies (placement, watermarks, pins, replace races, failure, probes, recovery) and
// randomized operation sequences checked against a plain reference after every step (the
// invariants I1-I5 of slots.hpp, and LRU order: the pages evicted are always the least
// recently used of their folder).
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kv/slots.hpp"

namespace deepio::kv::internal {
namespace {

/// A key whose first folder (FNV-1a 64 % folders) is `folder`.
std::string key_in(std::uint32_t folder, std::uint32_t folders, int n) {
  for (int i = 0;; ++i) {
    std::string k = "k" + std::to_string(n) + "-" + std::to_string(i);
    if (fnv1a(k) % folders == folder) return k;
  }
}

/// Puts `key` (allocate + commit) and returns where it went.
std::optional<Place> put(SlotModel& m, const std::string& key, std::uint64_t gen, std::uint64_t len = 100) {
  auto p = m.allocate(key);
  if (p) {
    EXPECT_TRUE(m.commit(key, *p, gen, len));
  }
  return p;
}

TEST(KvSlots, PlacementFollowsTheHashAndPassesOverFailedOrFullFolders) {
  SlotModel m(3, 1.0, 1.0);
  for (std::uint32_t fi = 0; fi < 3; ++fi) m.init_folder(fi, 2);
  EXPECT_EQ(put(m, key_in(1, 3, 0), 1)->folder, 1u);
  m.fail(1);
  EXPECT_EQ(put(m, key_in(1, 3, 1), 2)->folder, 2u);  // the next folder
  // Folder 2 full of pinned pages: the next one after it (0).
  const std::string other = key_in(2, 3, 2);
  put(m, other, 3);
  ASSERT_TRUE(m.pin(key_in(1, 3, 1), 100));
  ASSERT_TRUE(m.pin(other, 100));
  EXPECT_EQ(put(m, key_in(2, 3, 3), 4)->folder, 0u);
  EXPECT_EQ(m.check(), "");
}

TEST(KvSlots, EvictionRunsFromTheHighWatermarkDownToTheLowOneInLruOrder) {
  SlotModel m(1, 0.8, 0.5);  // 10 slots: high 8, low 5
  m.init_folder(0, 10);
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back("p" + std::to_string(i));
    put(m, keys.back(), static_cast<std::uint64_t>(i + 1));
  }
  EXPECT_EQ(m.evictions(), 0u);
  EXPECT_EQ(m.used(0), 8u);
  ASSERT_TRUE(m.pin("p0", 100));  // touched: now the most recently used
  m.unpin(m.find("p0")->where);
  put(m, "p8", 9);  // 8 + 1 > 8: evict down to 5, then take one
  EXPECT_EQ(m.evictions(), 3u);
  EXPECT_EQ(m.used(0), 6u);
  for (const char* gone : {"p1", "p2", "p3"}) EXPECT_FALSE(m.contains(gone)) << gone;
  for (const char* kept : {"p0", "p4", "p7", "p8"}) EXPECT_TRUE(m.contains(kept)) << kept;
  EXPECT_EQ(m.lru_keys(0), (std::vector<std::string>{"p4", "p5", "p6", "p7", "p0", "p8"}));
  EXPECT_EQ(m.check(), "");
}

// A pinned page may be evicted (dropped from the index), but its slot is not handed out until
// the last get unpins it; a slot being written is neither.
TEST(KvSlots, PinnedAndWritingSlotsAreNotHandedOut) {
  SlotModel m(1, 1.0, 0.5);
  m.init_folder(0, 3);
  put(m, "a", 1);
  put(m, "b", 2);
  auto writing = m.allocate("c");
  ASSERT_TRUE(writing);
  const Place a = m.find("a")->where;
  const Place b = m.find("b")->where;
  ASSERT_TRUE(m.pin("a", 100));
  ASSERT_TRUE(m.pin("a", 100));
  ASSERT_TRUE(m.pin("b", 100));
  EXPECT_FALSE(m.allocate("d"));  // both evicted, but pinned; c being written
  EXPECT_EQ(m.evictions(), 2u);
  EXPECT_FALSE(m.contains("a"));
  EXPECT_EQ(m.state(a), SlotState::Zombie);
  EXPECT_EQ(m.state(*writing), SlotState::Writing);
  m.unpin(a);
  EXPECT_EQ(m.state(a), SlotState::Zombie);
  EXPECT_FALSE(m.allocate("d"));
  m.unpin(a);
  EXPECT_EQ(m.state(a), SlotState::Free);
  EXPECT_EQ(m.allocate("d"), a);
  EXPECT_EQ(m.check(), "");
  m.unpin(b);
  EXPECT_EQ(m.state(b), SlotState::Free);
  EXPECT_EQ(m.check(), "");
}

TEST(KvSlots, AnOlderGenerationNeverReplacesANewerOne) {
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 4);
  auto older = m.allocate("k");
  auto newer = m.allocate("k");
  ASSERT_TRUE(older && newer);
  EXPECT_TRUE(m.commit("k", *newer, 7, 10));
  EXPECT_FALSE(m.commit("k", *older, 6, 20));  // committed second, generation older: dropped
  EXPECT_EQ(m.state(*older), SlotState::Free);
  EXPECT_EQ(m.find("k")->gen, 7u);
  EXPECT_EQ(m.find("k")->len, 10u);
  auto third = m.allocate("k");
  EXPECT_TRUE(m.commit("k", *third, 8, 30));  // a newer one replaces it; the old slot is freed
  EXPECT_EQ(m.state(*newer), SlotState::Free);
  EXPECT_EQ(m.check(), "");
}

TEST(KvSlots, GetsAskForTheStoredLengthAndForgetOnlyTheGenerationTheyRead) {
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 4);
  put(m, "k", 5, 100);
  EXPECT_FALSE(m.pin("k", 99));
  EXPECT_FALSE(m.pin("absent", 100));
  auto p = m.pin("k", 100);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->gen, 5u);
  m.unpin(p->where);
  m.forget("k", 4);  // another generation: kept
  EXPECT_TRUE(m.contains("k"));
  m.forget("k", 5);
  EXPECT_FALSE(m.contains("k"));
  EXPECT_EQ(m.check(), "");
}

TEST(KvSlots, AFailedFolderDropsItsPagesAndAProbeTakesOneFreeSlotPerSlab) {
  SlotModel m(2, 1.0, 1.0);
  m.init_folder(0, 6);
  m.init_folder(1, 6);
  std::vector<std::string> in0;
  for (int i = 0; i < 3; ++i) {
    in0.push_back(key_in(0, 2, i));
    put(m, in0.back(), static_cast<std::uint64_t>(i + 1));
  }
  const std::string in1 = key_in(1, 2, 9);
  put(m, in1, 10);
  const Place pinned = m.pin(in0[0], 100)->where;
  EXPECT_TRUE(m.fail(0));
  EXPECT_FALSE(m.fail(0));  // already failed
  EXPECT_EQ(m.pages(), 1u);
  EXPECT_EQ(m.used(0), 0u);  // a failed folder reports none
  EXPECT_EQ(m.state(pinned), SlotState::Zombie);
  EXPECT_FALSE(m.pin(in0[1], 100));  // dropped
  // Slabs of 2 slots: slab 0 holds the Zombie and one Free slot; slabs 1 and 2 are free.
  auto picks = m.take_probe_slots(0, 2);
  ASSERT_EQ(picks.size(), 3u);
  for (const auto& p : picks) {
    ASSERT_TRUE(p);
    EXPECT_NE(*p, pinned.slot);
    EXPECT_EQ(m.state(Place{0, *p}), SlotState::Writing);
  }
  EXPECT_EQ(m.check(), "");
  m.return_probe_slots(0, picks);
  m.recover(0);
  m.unpin(pinned);
  EXPECT_EQ(m.used(0), 0u);
  EXPECT_EQ(put(m, in0[0], 20)->folder, 0u);
  EXPECT_EQ(m.check(), "");
}

// A checkpoint reads the slot table a slice at a time (records_in): the slices together list
// exactly the live pages records() lists, with the same generations and ticks.
TEST(KvSlots, RecordsInSlicesListTheLivePagesOnce) {
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 50);
  for (int i = 0; i < 30; ++i) put(m, "s" + std::to_string(i), static_cast<std::uint64_t>(i + 1));
  for (int i = 0; i < 30; i += 3) m.remove("s" + std::to_string(i));
  m.unpin(m.pin("s4", 100)->where);
  auto key = [](const CkptRecord& r) { return std::tuple(r.slot, r.gen, r.tick); };
  std::vector<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>> whole, sliced;
  for (const CkptRecord& r : m.records(0)) whole.push_back(key(r));
  std::vector<CkptRecord> out;
  for (std::uint64_t first = 0; first < 50; first += 7) m.records_in(0, first, 7, &out);
  for (const CkptRecord& r : out) sliced.push_back(key(r));
  std::sort(whole.begin(), whole.end());
  EXPECT_EQ(whole.size(), 20u);
  EXPECT_EQ(sliced, whole);  // slot order, each once
}

// Store::clear() drops a slice of slots at a time (clear_slots): only pages older than its
// call's generation go; the invariants hold after each slice.
TEST(KvSlots, ClearSlotsDropsOnlyOlderPagesOfItsSlice) {
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 16);
  for (int i = 0; i < 10; ++i) put(m, "c" + std::to_string(i), static_cast<std::uint64_t>(i + 1));  // slots 0-9
  EXPECT_EQ(m.clear_slots(0, 0, 3, 100), 3u);
  EXPECT_EQ(m.check(), "");
  EXPECT_EQ(m.clear_slots(0, 3, 100, 8), 4u);  // generations 4-7; 8-10 are as new as the cut
  EXPECT_EQ(m.check(), "");
  EXPECT_EQ(m.pages(), 3u);
  EXPECT_TRUE(m.contains("c7") && m.contains("c8") && m.contains("c9"));
  EXPECT_EQ(m.used(0), 3u);
}

TEST(KvSlots, RecordsAndLoadKeepTheLruOrder) {
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 8);
  for (int i = 0; i < 4; ++i) put(m, "r" + std::to_string(i), static_cast<std::uint64_t>(i + 1));
  m.unpin(m.pin("r1", 100)->where);
  auto recs = m.records(0);
  ASSERT_EQ(recs.size(), 4u);
  // Reload from the records (as recovery does) into a fresh model: same LRU order, same free slots.
  SlotModel back(1, 1.0, 1.0);
  back.init_folder(0, 8);
  std::vector<std::pair<std::string, Found>> pages;
  const std::vector<std::string> order = m.lru_keys(0);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    pages.emplace_back(order[i], Found{Place{0, recs[i].slot}, recs[i].gen, 100, recs[i].tick});
  }
  std::reverse(pages.begin(), pages.end());  // load sorts by tick
  back.load(pages);
  EXPECT_EQ(back.lru_keys(0), (std::vector<std::string>{"r0", "r2", "r3", "r1"}));
  EXPECT_EQ(back.used(0), 4u);
  EXPECT_EQ(back.check(), "");
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(back.allocate("n" + std::to_string(i)) == std::nullopt);
  EXPECT_FALSE(back.allocate("full"));  // all 8 used, low watermark 1.0: nothing to evict
}

// Random operations over 3 folders of a few slots, with puts and pins held open across
// steps; after each step the model's invariants hold, its index equals the reference's, and
// every eviction took the least recently used pages of its folder.
TEST(KvSlots, ARunOfEntriesLongerThanTheirStoredDistanceIsStillFoundAndShiftedRight) {
  // 300 keys of one home position: most of them sit 255 or more past it, where an entry's
  // stored distance saturates and a deletion finds the home from the key instead.
  SlotModel m(1, 1.0, 1.0);
  m.init_folder(0, 400);
  std::vector<std::string> same;
  for (int i = 0; same.size() < 300; ++i) {
    std::string k = "h" + std::to_string(i);
    if (m.home_of_key(k) == 7) same.push_back(std::move(k));
  }
  std::vector<std::string> keys = same;
  for (int i = 0; i < 60; ++i) keys.push_back("other" + std::to_string(i));
  std::mt19937 rng(46);
  std::shuffle(keys.begin(), keys.end(), rng);
  std::uint64_t gen = 0;
  for (const std::string& k : keys) ASSERT_TRUE(put(m, k, ++gen));
  ASSERT_EQ(m.check(), "");
  std::shuffle(keys.begin(), keys.end(), rng);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(m.remove(keys[i]));
    ASSERT_EQ(m.check(), "") << "after removing " << i + 1;
    for (std::size_t j = i + 1; j < keys.size(); j += 17) ASSERT_TRUE(m.contains(keys[j])) << keys[j];
  }
  EXPECT_EQ(m.pages(), 0u);
}

TEST(KvSlots, RandomOperationsKeepTheInvariantsAndEvictInLruOrder) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    const std::uint32_t nf = 1 + static_cast<std::uint32_t>(rng() % 3);
    const double high = 0.5 + static_cast<double>(rng() % 6) / 10.0;  // 0.5 .. 1.0
    const double low = high - static_cast<double>(rng() % 4) / 10.0;
    SlotModel m(nf, high, std::max(0.1, low));
    for (std::uint32_t fi = 0; fi < nf; ++fi) m.init_folder(fi, 1 + rng() % 8);
    struct Ref {
      Place where;
      std::uint64_t gen, len;
    };
    std::map<std::string, Ref> ref;
    std::vector<std::vector<std::string>> lru(nf);  // reference LRU per folder
    struct Writing {
      std::string key;
      Place where;
      std::uint64_t gen;
    };
    std::vector<Writing> writing;
    std::vector<Place> pinned;
    std::uint64_t gen = 0;
    auto drop_ref = [&](const std::string& k) {
      auto it = ref.find(k);
      if (it == ref.end()) return;
      auto& l = lru[it->second.where.folder];
      l.erase(std::find(l.begin(), l.end(), k));
      ref.erase(it);
    };
    for (int step = 0; step < 400; ++step) {
      const std::string key = "k" + std::to_string(rng() % 24);
      switch (rng() % 9) {
        case 0:
        case 1: {  // start a put
          std::set<std::string> before;
          for (auto& [k, r] : ref) before.insert(k);
          auto p = m.allocate(key);
          // Evicted keys: per folder, a prefix of the reference LRU list.
          std::vector<std::string> gone;
          for (const std::string& k : before) {
            if (!m.contains(k)) gone.push_back(k);
          }
          for (std::uint32_t fi = 0; fi < nf; ++fi) {
            std::size_t n = 0;
            for (const std::string& k : gone) n += ref[k].where.folder == fi ? 1 : 0;
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_FALSE(m.contains(lru[fi][i])) << "seed " << seed << ": evicted out of LRU order";
            }
          }
          for (const std::string& k : gone) drop_ref(k);
          if (p) {
            ASSERT_FALSE(m.failed(p->folder));
            ASSERT_EQ(m.state(*p), SlotState::Writing);
            ASSERT_EQ(m.pins(*p), 0u);
            for (const Place& q : pinned) ASSERT_FALSE(q == *p) << "a pinned slot handed out";
            writing.push_back(Writing{key, *p, ++gen});
          }
          break;
        }
        case 2: {  // finish a put: commit or abort
          if (writing.empty()) break;
          const std::size_t i = rng() % writing.size();
          Writing w = writing[i];
          writing.erase(writing.begin() + static_cast<std::ptrdiff_t>(i));
          if (rng() % 4 == 0 || m.failed(w.where.folder)) {
            m.abort(w.where);
            break;
          }
          auto it = ref.find(w.key);
          const bool newer = it == ref.end() || it->second.gen < w.gen;
          ASSERT_EQ(m.commit(w.key, w.where, w.gen, 100), newer) << "seed " << seed;
          if (newer) {
            drop_ref(w.key);
            ref[w.key] = Ref{w.where, w.gen, 100};
            lru[w.where.folder].push_back(w.key);
          }
          break;
        }
        case 3: {  // a get pins
          auto p = m.pin(key, 100);
          auto it = ref.find(key);
          ASSERT_EQ(p.has_value(), it != ref.end() && !m.failed(it->second.where.folder));
          if (p) {
            ASSERT_EQ(p->where, it->second.where);
            ASSERT_EQ(p->gen, it->second.gen);
            pinned.push_back(p->where);
            auto& l = lru[p->where.folder];
            l.erase(std::find(l.begin(), l.end(), key));
            l.push_back(key);
          }
          break;
        }
        case 4: {  // a get ends
          if (pinned.empty()) break;
          const std::size_t i = rng() % pinned.size();
          m.unpin(pinned[i]);
          pinned.erase(pinned.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
        case 5:
          ASSERT_EQ(m.remove(key), ref.count(key) == 1);
          drop_ref(key);
          break;
        case 6: {  // a folder fails, or a failed one comes back
          const auto fi = static_cast<std::uint32_t>(rng() % nf);
          if (m.failed(fi)) {
            m.recover(fi);
          } else if (rng() % 3 == 0) {
            m.fail(fi);
            std::vector<std::string> ks = lru[fi];
            for (const std::string& k : ks) drop_ref(k);
          }
          break;
        }
        case 7:
          if (rng() % 10 == 0) {
            ASSERT_EQ(m.clear(), ref.size());
            for (auto& l : lru) l.clear();
            ref.clear();
          }
          break;
        case 8: {  // a get that read another generation forgets it
          auto it = ref.find(key);
          if (it == ref.end()) break;
          m.forget(key, it->second.gen);
          drop_ref(key);
          break;
        }
      }
      ASSERT_EQ(m.check(), "") << "seed " << seed << " step " << step;
      ASSERT_EQ(m.pages(), ref.size()) << "seed " << seed << " step " << step;
      for (std::uint32_t fi = 0; fi < nf; ++fi) {
        ASSERT_EQ(m.lru_keys(fi), lru[fi]) << "seed " << seed << " step " << step << " folder " << fi;
      }
    }
  }
}

}  // namespace
}  // namespace deepio::kv::internal
