#include "kv/slots.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

namespace deepio::kv::internal {

namespace {
__extension__ using U128 = unsigned __int128;  // GCC and Clang: a 64 x 64 -> 128-bit product
// An entry: folder (bits 48-63), slot (16-47), 7 bits of the key's hash with bit 8 always 1
// (0: empty) in bits 8-15, and in bits 0-7 how far the entry sits past its home position
// (kFar: that far or farther, the home then found from the key), so that a deletion's backward
// shift needs no key and no hash of the entries it moves.
constexpr std::uint64_t kTagMask = 0xFF00;
constexpr std::uint64_t kDistMask = 0xFF;
constexpr std::uint64_t kFar = 0xFF;

std::uint64_t pack(Place p, std::uint64_t h, std::uint64_t dist) noexcept {
  return (std::uint64_t{p.folder} << 48) | (std::uint64_t{p.slot} << 16) | (h & kTagMask) | 0x100u |
         std::min(dist, kFar);
}
Place unpack(std::uint64_t e) noexcept {
  return Place{static_cast<std::uint32_t>(e >> 48), static_cast<std::uint32_t>((e >> 16) & 0xFFFFFFFFu)};
}
bool tag_matches(std::uint64_t e, std::uint64_t h) noexcept { return (e & kTagMask) == ((h & kTagMask) | 0x100u); }

std::unique_ptr<char[]> copy_key(std::string_view key) {
  auto k = std::make_unique_for_overwrite<char[]>(4 + key.size());
  const auto n = static_cast<std::uint32_t>(key.size());
  std::memcpy(k.get(), &n, 4);
  std::memcpy(k.get() + 4, key.data(), key.size());
  return k;
}
}  // namespace

SlotModel::SlotModel(std::size_t folders, double high_watermark, double low_watermark)
    : high_(high_watermark), low_(low_watermark), folders_(folders) {
  rebuild_table();
}

std::string_view SlotModel::key_of(const SlotInfo& s) noexcept {
  std::uint32_t n = 0;
  std::memcpy(&n, s.key.get(), 4);
  return {s.key.get() + 4, n};
}

std::uint64_t SlotModel::hash(std::string_view key) noexcept { return std::hash<std::string_view>{}(key); }

std::size_t SlotModel::home(std::uint64_t h) const noexcept {
  // The high bits of a multiply-shift mix (libstdc++'s string hash is good in all its bits,
  // but this spreads any hash), scaled onto the table without a division.
  const std::uint64_t mixed = h * 0x9E3779B97F4A7C15ull;
  return static_cast<std::size_t>((static_cast<U128>(mixed) * table_.size()) >> 64);
}

void SlotModel::rebuild_table() {
  std::uint64_t slots = 0;
  for (const Folder& f : folders_) slots += f.slots;
  table_.assign(std::max<std::uint64_t>(16, slots + slots / 4 + 1), 0);
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    Folder& f = folders_[fi];
    for (std::uint32_t s = 0; s < f.slots; ++s) {
      if (f.info[s].state == SlotState::Live) index_insert(hash(key_of(f.info[s])), Place{fi, s});
    }
  }
}

std::size_t SlotModel::position(std::string_view key, std::uint64_t h) const noexcept {
  const std::size_t n = table_.size();
  for (std::size_t i = home(h);; i = i + 1 == n ? 0 : i + 1) {
    const std::uint64_t e = table_[i];
    if (e == 0) return n;
    if (!tag_matches(e, h)) continue;
    const Place p = unpack(e);
    if (key_of(folders_[p.folder].info[p.slot]) == key) return i;
  }
}

std::optional<Place> SlotModel::lookup(std::string_view key) const noexcept {
  const std::size_t i = position(key, hash(key));
  if (i == table_.size()) return std::nullopt;
  return unpack(table_[i]);
}

void SlotModel::index_insert(std::uint64_t h, Place p) {
  const std::size_t n = table_.size();
  std::size_t i = home(h);
  std::uint64_t dist = 0;
  for (; table_[i] != 0; ++dist) i = i + 1 == n ? 0 : i + 1;
  table_[i] = pack(p, h, dist);
}

std::size_t SlotModel::home_of(std::size_t pos) const noexcept {
  const std::uint64_t e = table_[pos];
  const std::uint64_t dist = e & kDistMask;
  if (dist == kFar) {
    const Place p = unpack(e);
    return home(hash(key_of(folders_[p.folder].info[p.slot])));
  }
  const std::size_t n = table_.size();
  return pos >= dist ? pos - dist : pos + n - dist;
}

void SlotModel::index_erase(std::size_t pos) {
  // Backward shift: each later entry of the run moves into the hole unless its home lies
  // cyclically in (hole, its position], where it already is reachable.
  const std::size_t n = table_.size();
  std::size_t hole = pos;
  for (std::size_t j = pos + 1 == n ? 0 : pos + 1; table_[j] != 0; j = j + 1 == n ? 0 : j + 1) {
    const std::size_t h = home_of(j);
    const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (stays) continue;
    const std::uint64_t dist = hole >= h ? hole - h : hole + n - h;
    table_[hole] = (table_[j] & ~kDistMask) | std::min<std::uint64_t>(dist, kFar);
    hole = j;
  }
  table_[hole] = 0;
}

void SlotModel::init_folder(std::uint32_t fi, std::uint64_t slots) {
  Folder& f = folders_[fi];
  f.slots = slots;
  f.info.clear();
  f.info.resize(slots);
  f.lru_head = f.lru_tail = kNone;
  f.live = 0;
  f.free_head = kNone;
  f.free_count = 0;
  for (std::uint64_t s = slots; s-- > 0;) push_free(f, static_cast<std::uint32_t>(s));  // lowest first out
  rebuild_table();
}

void SlotModel::push_free(Folder& f, std::uint32_t slot) {
  SlotInfo& s = f.info[slot];
  s.state = SlotState::Free;
  s.prev = kNone;
  s.next = f.free_head;
  f.free_head = slot;
  ++f.free_count;
}

std::uint32_t SlotModel::pop_free(Folder& f) {
  const std::uint32_t slot = f.free_head;
  f.free_head = f.info[slot].next;
  f.info[slot].next = kNone;
  --f.free_count;
  return slot;
}

void SlotModel::lru_append(Folder& f, std::uint32_t slot) {
  SlotInfo& s = f.info[slot];
  s.prev = f.lru_tail;
  s.next = kNone;
  if (f.lru_tail != kNone) {
    f.info[f.lru_tail].next = slot;
  } else {
    f.lru_head = slot;
  }
  f.lru_tail = slot;
}

void SlotModel::lru_unlink(Folder& f, std::uint32_t slot) {
  SlotInfo& s = f.info[slot];
  if (s.prev != kNone) {
    f.info[s.prev].next = s.next;
  } else {
    f.lru_head = s.next;
  }
  if (s.next != kNone) {
    f.info[s.next].prev = s.prev;
  } else {
    f.lru_tail = s.prev;
  }
  s.prev = s.next = kNone;
}

void SlotModel::release(Folder& f, std::uint32_t slot) {
  SlotInfo& s = f.info[slot];
  s.tick = 0;
  s.key.reset();
  if (s.pins > 0) {
    s.state = SlotState::Zombie;
  } else {
    push_free(f, slot);
  }
}

void SlotModel::drop(Place p) {
  const std::uint64_t h = hash(key_of(folders_[p.folder].info[p.slot]));
  const std::size_t n = table_.size();
  const std::uint64_t want = pack(p, h, 0);
  std::size_t i = home(h);
  while ((table_[i] & ~kDistMask) != want) i = i + 1 == n ? 0 : i + 1;  // the page's own entry: it is there
  drop_at(p, i);
}

void SlotModel::drop_at(Place p, std::size_t pos) {
  Folder& f = folders_[p.folder];
  SlotInfo& s = f.info[p.slot];
  dropped_max_gen_ = std::max(dropped_max_gen_, s.gen);
  index_erase(pos);
  lru_unlink(f, p.slot);
  --f.live;
  --pages_;
  release(f, p.slot);
  dirty_ = true;
}

void SlotModel::evict(std::uint32_t fi) {
  Folder& f = folders_[fi];
  const auto high = static_cast<std::uint64_t>(high_ * static_cast<double>(f.slots));
  const auto low = static_cast<std::uint64_t>(low_ * static_cast<double>(f.slots));
  if (f.free_count > 0 && f.slots - f.free_count + 1 <= high) return;
  while (f.slots - f.free_count > low && f.lru_head != kNone) {
    drop(Place{fi, f.lru_head});
    ++evictions_;
  }
  // Nothing left to evict but slots pinned or being written: take what is free.
}

std::optional<Place> SlotModel::allocate(std::string_view key) {
  const auto n = static_cast<std::uint32_t>(folders_.size());
  const auto start = static_cast<std::uint32_t>(fnv1a(key) % n);
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t fi = (start + k) % n;
    Folder& f = folders_[fi];
    if (f.failed) continue;
    evict(fi);
    if (f.free_count == 0) continue;
    const std::uint32_t slot = pop_free(f);
    f.info[slot].state = SlotState::Writing;
    return Place{fi, slot};
  }
  return std::nullopt;
}

bool SlotModel::commit(const std::string& key, Place p, std::uint64_t gen, std::uint64_t len, std::uint32_t crc) {
  Folder& f = folders_[p.folder];
  const std::uint64_t h = hash(key);
  if (const std::size_t pos = position(key, h); pos != table_.size()) {
    const Place old = unpack(table_[pos]);
    if (folders_[old.folder].info[old.slot].gen > gen) {
      release(f, p.slot);  // a newer put of the key committed first
      return false;
    }
    drop_at(old, pos);
  }
  SlotInfo& s = f.info[p.slot];
  s.key = copy_key(key);
  s.gen = gen;
  s.len = static_cast<std::uint32_t>(len);  // page_bytes < 4 GiB (Store refuses more)
  s.crc = crc;
  s.state = SlotState::Live;
  s.tick = ++clock_;
  lru_append(f, p.slot);
  ++f.live;
  ++pages_;
  index_insert(h, p);
  dirty_ = true;
  return true;
}

void SlotModel::abort(Place p) { release(folders_[p.folder], p.slot); }

std::optional<Pinned> SlotModel::pin(std::string_view key, std::uint64_t len) {
  const auto p = lookup(key);
  if (!p) return std::nullopt;
  Folder& f = folders_[p->folder];
  SlotInfo& s = f.info[p->slot];
  if (s.len != len || f.failed) return std::nullopt;
  ++s.pins;
  lru_unlink(f, p->slot);
  lru_append(f, p->slot);
  s.tick = ++clock_;
  return Pinned{*p, s.gen, s.len, s.crc};
}

void SlotModel::unpin(Place p) {
  Folder& f = folders_[p.folder];
  SlotInfo& s = f.info[p.slot];
  if (--s.pins == 0 && s.state == SlotState::Zombie) push_free(f, p.slot);
}

void SlotModel::forget(std::string_view key, std::uint64_t gen) {
  const auto p = lookup(key);
  if (p && folders_[p->folder].info[p->slot].gen == gen) drop(*p);
}

bool SlotModel::contains(std::string_view key) const { return lookup(key).has_value(); }

bool SlotModel::remove(std::string_view key) {
  const auto p = lookup(key);
  if (!p) return false;
  drop(*p);
  return true;
}

std::size_t SlotModel::clear() {
  const std::size_t n = pages_;
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    Folder& f = folders_[fi];
    while (f.lru_head != kNone) drop(Place{fi, f.lru_head});
  }
  return n;
}

std::size_t SlotModel::clear_slots(std::uint32_t fi, std::uint64_t first, std::uint64_t count, std::uint64_t below) {
  Folder& f = folders_[fi];
  const std::uint64_t end = std::min(f.slots, first + count);
  std::size_t n = 0;
  for (std::uint64_t s = first; s < end; ++s) {
    const SlotInfo& i = f.info[s];
    if (i.state != SlotState::Live || i.gen >= below) continue;
    drop(Place{fi, static_cast<std::uint32_t>(s)});
    ++n;
  }
  return n;
}

bool SlotModel::fail(std::uint32_t fi) {
  Folder& f = folders_[fi];
  if (f.failed) return false;
  f.failed = true;
  // The folder's own entries (its LRU list), not the whole index: O(its pages).
  while (f.lru_head != kNone) drop(Place{fi, f.lru_head});
  dirty_ = true;
  return true;
}

std::vector<std::optional<std::uint32_t>> SlotModel::take_probe_slots(std::uint32_t fi, std::uint64_t per_group) {
  Folder& f = folders_[fi];
  std::vector<std::optional<std::uint32_t>> pick((f.slots + per_group - 1) / per_group);
  for (std::uint32_t slot = f.free_head; slot != kNone; slot = f.info[slot].next) {
    auto& p = pick[slot / per_group];
    if (!p) p = slot;
  }
  // Unlinked from the free stack (the others keep their order).
  std::uint32_t* link = &f.free_head;
  while (*link != kNone) {
    const std::uint32_t slot = *link;
    if (pick[slot / per_group] == slot) {
      *link = f.info[slot].next;
      f.info[slot].next = kNone;
      f.info[slot].state = SlotState::Writing;
      --f.free_count;
    } else {
      link = &f.info[slot].next;
    }
  }
  return pick;
}

void SlotModel::return_probe_slots(std::uint32_t fi, const std::vector<std::optional<std::uint32_t>>& picks) {
  Folder& f = folders_[fi];
  for (const auto& p : picks) {
    if (p) push_free(f, *p);
  }
}

void SlotModel::records_in(std::uint32_t fi, std::uint64_t first, std::uint64_t count, std::vector<CkptRecord>* out,
                           bool with_keys) const {
  const Folder& f = folders_[fi];
  const std::uint64_t end = std::min(f.slots, first + count);
  for (std::uint64_t s = first; s < end; ++s) {
    const SlotInfo& i = f.info[s];
    if (i.state != SlotState::Live) continue;
    out->push_back(CkptRecord{static_cast<std::uint32_t>(s), i.gen, i.tick});
    if (!with_keys) continue;
    out->back().len = i.len;
    out->back().crc = i.crc;
    out->back().key = key_of(i);
  }
}

std::vector<CkptRecord> SlotModel::records(std::uint32_t fi) const {
  const Folder& f = folders_[fi];
  std::vector<CkptRecord> out;
  out.reserve(f.live);
  for (std::uint32_t s = f.lru_head; s != kNone; s = f.info[s].next) {
    out.push_back(CkptRecord{s, f.info[s].gen, f.info[s].tick});
  }
  return out;
}

void SlotModel::load(const std::vector<std::pair<std::string, Found>>& pages) {
  std::vector<std::vector<std::pair<std::uint64_t, std::uint32_t>>> order(folders_.size());
  for (const auto& [key, c] : pages) {
    Folder& f = folders_[c.where.folder];
    SlotInfo& s = f.info[c.where.slot];
    s.state = SlotState::Live;
    s.gen = c.gen;
    s.len = static_cast<std::uint32_t>(c.len);
    s.crc = c.crc;
    s.key = copy_key(key);
    ++f.live;
    ++pages_;
    index_insert(hash(key), c.where);
    order[c.where.folder].emplace_back(c.tick, c.where.slot);
  }
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    Folder& f = folders_[fi];
    std::sort(order[fi].begin(), order[fi].end());
    for (auto& [tick, slot] : order[fi]) {
      lru_append(f, slot);
      f.info[slot].tick = ++clock_;  // renumbered in LRU order (ticks only order)
    }
    f.free_head = kNone;
    f.free_count = 0;
    if (f.failed) continue;  // possibly failed before its slot table was made
    for (std::uint64_t s = f.slots; s-- > 0;) {
      if (f.info[s].state == SlotState::Free) push_free(f, static_cast<std::uint32_t>(s));
    }
  }
}

std::uint64_t SlotModel::used(std::uint32_t fi) const {
  const Folder& f = folders_[fi];
  if (f.failed) return 0;
  return f.slots - std::min<std::uint64_t>(f.slots, f.free_count);
}

std::vector<std::string> SlotModel::lru_keys(std::uint32_t fi) const {
  const Folder& f = folders_[fi];
  std::vector<std::string> out;
  for (std::uint32_t s = f.lru_head; s != kNone; s = f.info[s].next) out.emplace_back(key_of(f.info[s]));
  return out;
}

std::optional<Pinned> SlotModel::find(std::string_view key) const {
  const auto p = lookup(key);
  if (!p) return std::nullopt;
  const SlotInfo& s = folders_[p->folder].info[p->slot];
  return Pinned{*p, s.gen, s.len, s.crc};
}

std::string SlotModel::check() const {
  std::size_t entries = 0, live_total = 0;
  for (std::size_t i = 0; i < table_.size(); ++i) {
    const std::uint64_t e = table_[i];
    if (e == 0) continue;
    ++entries;
    const Place p = unpack(e);
    if (p.folder >= folders_.size() || p.slot >= folders_[p.folder].slots) return "index entry out of range";
    const SlotInfo& s = folders_[p.folder].info[p.slot];
    if (s.state != SlotState::Live) return "index entry of a slot not Live";
    if (position(key_of(s), hash(key_of(s))) != i) return "index entry not found by its key";
    const std::size_t h = home(hash(key_of(s)));
    const std::uint64_t dist = i >= h ? i - h : i + table_.size() - h;
    if ((e & 0xFF) != std::min<std::uint64_t>(dist, 0xFF)) return "index entry's distance from its home wrong";
  }
  if (entries != pages_) return "index size not the page count";
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    const Folder& f = folders_[fi];
    const std::string where = "folder " + std::to_string(fi) + ": ";
    std::vector<int> in_free(f.slots, 0);
    std::uint64_t free_seen = 0;
    for (std::uint32_t s = f.free_head; s != kNone; s = f.info[s].next) {
      if (s >= f.slots) return where + "free slot out of range";
      if (++in_free[s] > 1) return where + "slot " + std::to_string(s) + " twice in the free list";
      ++free_seen;
    }
    if (free_seen != f.free_count) return where + "free count wrong";
    std::size_t live = 0;
    for (std::uint64_t s = 0; s < f.slots; ++s) {
      const SlotInfo& i = f.info[s];
      const std::string slot = where + "slot " + std::to_string(s) + ": ";
      if ((i.state == SlotState::Free) != (in_free[s] == 1)) return slot + "Free iff in the free list";
      if (i.state == SlotState::Free && i.pins > 0) return slot + "Free while pinned";
      if (i.state == SlotState::Zombie && i.pins == 0) return slot + "Zombie without pins";
      if ((i.state == SlotState::Live) != (i.key != nullptr)) return slot + "a key iff Live";
      if (i.state != SlotState::Live) continue;
      ++live;
      if (f.failed) return where + "failed but holds " + std::string(key_of(i));
      const auto p = lookup(key_of(i));
      if (!p || p->folder != fi || p->slot != s) return slot + "Live but not its key's entry";
    }
    if (live != f.live) return where + "live count wrong";
    live_total += live;
    std::set<std::uint32_t> seen;
    std::uint32_t prev = kNone;
    for (std::uint32_t s = f.lru_head; s != kNone; s = f.info[s].next) {
      if (s >= f.slots || f.info[s].state != SlotState::Live) return where + "LRU list holds a slot not Live";
      if (!seen.insert(s).second) return where + "LRU list loops";
      if (f.info[s].prev != prev) return where + "LRU list links disagree";
      prev = s;
    }
    if (prev != f.lru_tail) return where + "LRU tail wrong";
    if (seen.size() != live) return where + "LRU list and live slots differ in size";
  }
  if (live_total != pages_) return "page count not the live slots'";
  return {};
}

}  // namespace deepio::kv::internal
