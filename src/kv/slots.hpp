// The store's slots, index and LRU as a pure model: no I/O, no threads, no clock. Store::Impl
// holds one under its mutex and does the I/O around it; tests/cpp/test_kv_slots.cpp drives it
// alone with randomized operation sequences and checks the invariants below after each step.
//
// State. Per folder: `slots` slots, each Free, Writing (handed to a put, not yet committed),
// Live (the slot of exactly one index entry) or Zombie (dropped from the index while gets
// still pin it); a free list; an LRU list of its live keys (least recently used first) and an
// LRU tick per live slot (what a checkpoint records); a failed flag. The index maps a key to
// (folder, slot, generation, length).
//
// Invariants (after every public call):
//  I1. Every slot is in exactly one state; the free list holds each Free slot once and no
//      other; a slot with pins > 0 is never Free.
//  I2. Each index entry's slot is Live and belongs to no other entry; every Live slot has one.
//  I3. A folder's LRU list holds exactly the keys of its index entries; a failed folder has
//      no entries.
//  I4. allocate() hands out only a Free slot (so never a pinned one) of a folder not failed.
//  I5. A put commits only over an older generation: a commit whose key has a newer entry
//      frees its slot instead.
// Policies:
//  - Placement: the folder FNV-1a 64(key) % folders first, then the next ones in order,
//    skipping failed folders and folders with no Free slot after eviction.
//  - Eviction (in allocate): when a folder's used slots + 1 exceed high_watermark * slots or
//    none is Free, least recently used pages are dropped until used <= low_watermark * slots
//    or no live page is left. A pinned page is dropped too (its slot turns Zombie, handed out
//    only after the last unpin); Writing slots are not evictable.
//  - A get pins (pin()) and touches; unpin() of the last pin frees a Zombie slot.
// Not thread-safe: the caller serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kv/layout.hpp"

namespace deepio::kv::internal {

enum class SlotState : std::uint8_t { Free, Writing, Live, Zombie };

struct Place {
  std::uint32_t folder = 0;
  std::uint32_t slot = 0;
  friend bool operator==(const Place&, const Place&) = default;
};

/// What a get pinned: read the slot's page and check it against crc (its CRC-32C, as the
/// put computed it or open read it from the slot's header).
struct Pinned {
  Place where;
  std::uint64_t gen = 0;
  std::uint64_t len = 0;
  std::uint32_t crc = 0;
};

/// A page found by recovery, to install with load().
struct Found {
  Place where;
  std::uint64_t gen = 0;
  std::uint64_t len = 0;
  std::uint64_t tick = 0;  // orders the LRU list (smaller: less recently used)
  std::uint32_t crc = 0;   // the page's CRC-32C (its header's)
};

class SlotModel {
 public:
  /// `folders` folders of no slots yet (init_folder gives them theirs); watermarks as
  /// StoreOptions's (0 < low <= high <= 1).
  SlotModel(std::size_t folders, double high_watermark, double low_watermark);

  /// Gives folder fi its slots, all Free (before any other call touches it; lowest handed out first).
  void init_folder(std::uint32_t fi, std::uint64_t slots);

  // -- puts --
  /// A Writing slot for a new page of `key` (evicting as the policy says), or nullopt when no
  /// folder has one.
  std::optional<Place> allocate(std::string_view key);
  /// The put of `key` into p (Writing) is durable: the index switches to it (with the page's
  /// CRC-32C, what a get checks) and the key's old slot is released. false (and p released)
  /// when a newer generation of the key committed first.
  bool commit(const std::string& key, Place p, std::uint64_t gen, std::uint64_t len, std::uint32_t crc = 0);
  /// A put into p (Writing) failed: p is released.
  void abort(Place p);

  // -- gets --
  /// Pins and touches the key's slot when present, of length `len`, in a folder not failed.
  std::optional<Pinned> pin(std::string_view key, std::uint64_t len);
  /// Ends a pin(); the last one frees a Zombie slot.
  void unpin(Place p);
  /// The key's entry, if it is still generation gen, is dropped (its slot did not hold it).
  void forget(std::string_view key, std::uint64_t gen);

  // -- removal --
  [[nodiscard]] bool contains(std::string_view key) const;
  /// Drops the key's entry; false when absent.
  bool remove(std::string_view key);
  /// Drops every entry; returns how many there were.
  std::size_t clear();
  /// Drops the entries among slots [first, first + count) of folder fi whose generation is
  /// below `below`; returns how many. clear() a slice at a time (Store::clear: the lock
  /// released between slices, pages committed meanwhile with a newer generation kept).
  std::size_t clear_slots(std::uint32_t fi, std::uint64_t first, std::uint64_t count, std::uint64_t below);

  // -- folder failure and recovery --
  /// Marks folder fi failed and drops its entries (pinned slots turn Zombie). Returns false
  /// when it already was failed (nothing changes).
  bool fail(std::uint32_t fi);
  [[nodiscard]] bool failed(std::uint32_t fi) const { return folders_[fi].failed; }
  /// Takes one Free slot per group of `per_group` slots (a slab) out of the free list, as
  /// Writing (for a probe to overwrite); nullopt for a group with none.
  std::vector<std::optional<std::uint32_t>> take_probe_slots(std::uint32_t fi, std::uint64_t per_group);
  /// Gives back what take_probe_slots() took.
  void return_probe_slots(std::uint32_t fi, const std::vector<std::optional<std::uint32_t>>& picks);
  /// Folder fi takes new pages again.
  void recover(std::uint32_t fi) { folders_[fi].failed = false; }

  // -- checkpoints and recovery --
  /// Folder fi's live pages, least recently used first.
  [[nodiscard]] std::vector<CkptRecord> records(std::uint32_t fi) const;
  /// Appends the live pages among slots [first, first + count) of folder fi, in slot order
  /// (a checkpoint taken a slice at a time, the lock released in between: O(count) per call);
  /// `with_keys`: each page's key, length and CRC too (a format-2 checkpoint).
  void records_in(std::uint32_t fi, std::uint64_t first, std::uint64_t count, std::vector<CkptRecord>* out,
                  bool with_keys = false) const;
  /// Installs the pages recovery found (one per key; their slots Free until now), then remakes
  /// the LRU lists and free lists (a failed folder gets no free list). Once, before any put.
  void load(const std::vector<std::pair<std::string, Found>>& pages);

  // -- counts --
  [[nodiscard]] std::size_t pages() const { return pages_; }
  [[nodiscard]] std::size_t folders() const { return folders_.size(); }
  [[nodiscard]] std::uint64_t slots(std::uint32_t fi) const { return folders_[fi].slots; }
  /// Slots not Free (0 for a failed folder, as stats report it).
  [[nodiscard]] std::uint64_t used(std::uint32_t fi) const;
  [[nodiscard]] std::uint64_t evictions() const { return evictions_; }
  /// The highest generation of a page dropped from the index so far (removed, evicted,
  /// replaced, forgotten, cleared, or lost with its folder's failure). A checkpoint whose
  /// bound is below it would let the next open's scan take that page back (its header is
  /// newer than the bound and no checkpoint lists it).
  [[nodiscard]] std::uint64_t dropped_max_gen() const { return dropped_max_gen_; }
  /// Whether the index changed since the last take_dirty(); clears the flag.
  bool take_dirty() { return std::exchange(dirty_, false); }
  [[nodiscard]] bool dirty() const { return dirty_; }

  // -- for tests --
  [[nodiscard]] SlotState state(Place p) const { return folders_[p.folder].info[p.slot].state; }
  [[nodiscard]] std::uint32_t pins(Place p) const { return folders_[p.folder].info[p.slot].pins; }
  [[nodiscard]] std::vector<std::string> lru_keys(std::uint32_t fi) const;
  [[nodiscard]] std::optional<Pinned> find(std::string_view key) const;
  /// The index position where key's entry would sit with no collision.
  [[nodiscard]] std::size_t home_of_key(std::string_view key) const noexcept { return home(hash(key)); }
  /// Checks I1-I3; the first violation in words, or "" when there is none.
  [[nodiscard]] std::string check() const;

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  // One slot: 48 bytes, whatever its state (the index's whole per-slot cost is this and about
  // 10 bytes of the hash table; the key is an allocation of its own).
  struct SlotInfo {
    std::uint64_t tick = 0;  // LRU tick of a Live slot (what a checkpoint records)
    std::uint64_t gen = 0;   // generation of a Live slot's page
    // A Live slot's key: a 4-byte length, then its bytes (one allocation).
    std::unique_ptr<char[]> key;
    std::uint32_t len = 0;  // a Live slot's page length
    std::uint32_t crc = 0;  // and its CRC-32C
    std::uint32_t pins = 0;
    // The folder's LRU list (Live slots: both links) or free list (Free slots: next).
    std::uint32_t prev = kNone, next = kNone;
    SlotState state = SlotState::Free;
  };
  struct Folder {
    std::uint64_t slots = 0;
    std::vector<SlotInfo> info;
    std::uint32_t free_head = kNone;  // slots to hand out: a stack linked through SlotInfo::next
    std::uint64_t free_count = 0;
    std::uint32_t lru_head = kNone;  // least recently used Live slot
    std::uint32_t lru_tail = kNone;  // most recently used
    std::size_t live = 0;
    bool failed = false;
  };

  static std::string_view key_of(const SlotInfo& s) noexcept;
  static std::uint64_t hash(std::string_view key) noexcept;
  // The index: open addressing with linear probing over table_, whose size is fixed at about
  // 1.25 x the slots of every folder (live pages never outnumber slots), backward-shift
  // deletion (no tombstones). An entry packs folder (16 bits), slot (32), 7 bits of the key's
  // hash and a set bit (0: empty), and its distance from its home (8 bits, saturating); a probe
  // compares keys only where the hash bits match, a deletion moves entries without their keys.
  [[nodiscard]] std::size_t home(std::uint64_t h) const noexcept;
  /// The table position of key's entry, or table_.size().
  [[nodiscard]] std::size_t position(std::string_view key, std::uint64_t h) const noexcept;
  [[nodiscard]] std::optional<Place> lookup(std::string_view key) const noexcept;
  void index_insert(std::uint64_t h, Place p);
  void index_erase(std::size_t pos);
  /// The home position of the entry at pos.
  [[nodiscard]] std::size_t home_of(std::size_t pos) const noexcept;
  void rebuild_table();

  static void push_free(Folder& f, std::uint32_t slot);
  static std::uint32_t pop_free(Folder& f);
  void lru_append(Folder& f, std::uint32_t slot);
  void lru_unlink(Folder& f, std::uint32_t slot);
  /// Ends slot's Live state (the entry already out of the index): Zombie while pinned, else Free.
  void release(Folder& f, std::uint32_t slot);
  /// Drops the Live page at p from the index.
  void drop(Place p);
  /// drop(p) where pos is p's index entry.
  void drop_at(Place p, std::size_t pos);
  void evict(std::uint32_t fi);

  double high_;
  double low_;
  std::vector<Folder> folders_;
  std::vector<std::uint64_t> table_;
  std::size_t pages_ = 0;
  std::uint64_t clock_ = 0;
  std::uint64_t evictions_ = 0;
  std::uint64_t dropped_max_gen_ = 0;
  bool dirty_ = false;
};

}  // namespace deepio::kv::internal
