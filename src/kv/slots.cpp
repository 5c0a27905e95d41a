#include "kv/slots.hpp"

#include <algorithm>
#include <set>

namespace deepio::kv::internal {

SlotModel::SlotModel(std::size_t folders, double high_watermark, double low_watermark)
    : high_(high_watermark), low_(low_watermark), folders_(folders) {}

void SlotModel::init_folder(std::uint32_t fi, std::uint64_t slots) {
  Folder& f = folders_[fi];
  f.slots = slots;
  f.info.assign(slots, SlotInfo{});
  f.free.clear();
  for (std::uint64_t s = slots; s-- > 0;) f.free.push_back(static_cast<std::uint32_t>(s));  // lowest first out
}

SlotModel::Index::iterator SlotModel::lookup(std::string_view key) { return index_.find(key); }
SlotModel::Index::const_iterator SlotModel::lookup(std::string_view key) const { return index_.find(key); }

void SlotModel::release(Folder& f, std::uint32_t slot) {
  SlotInfo& s = f.info[slot];
  s.tick = 0;
  s.key = nullptr;
  if (s.pins > 0) {
    s.state = SlotState::Zombie;
  } else {
    s.state = SlotState::Free;
    f.free.push_back(slot);
  }
}

void SlotModel::drop(Index::iterator it) {
  dropped_max_gen_ = std::max(dropped_max_gen_, it->second.gen);
  Folder& f = folders_[it->second.folder];
  f.lru.erase(it->second.lru);
  release(f, it->second.slot);
  index_.erase(it);
  dirty_ = true;
}

void SlotModel::evict(std::uint32_t fi) {
  Folder& f = folders_[fi];
  const auto high = static_cast<std::uint64_t>(high_ * static_cast<double>(f.slots));
  const auto low = static_cast<std::uint64_t>(low_ * static_cast<double>(f.slots));
  if (!f.free.empty() && f.slots - f.free.size() + 1 <= high) return;
  while (f.slots - f.free.size() > low && !f.lru.empty()) {
    drop(index_.find(*f.lru.front()));
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
    if (f.free.empty()) continue;
    const std::uint32_t slot = f.free.back();
    f.free.pop_back();
    f.info[slot].state = SlotState::Writing;
    return Place{fi, slot};
  }
  return std::nullopt;
}

bool SlotModel::commit(const std::string& key, Place p, std::uint64_t gen, std::uint64_t len, std::uint32_t crc) {
  Folder& f = folders_[p.folder];
  auto it = lookup(key);
  if (it != index_.end() && it->second.gen > gen) {
    release(f, p.slot);  // a newer put of the key committed first
    return false;
  }
  if (it != index_.end()) drop(it);
  auto [nit, inserted] = index_.emplace(key, Entry{});
  Entry& e = nit->second;
  e.folder = p.folder;
  e.slot = p.slot;
  e.gen = gen;
  e.len = len;
  e.crc = crc;
  f.info[p.slot].state = SlotState::Live;
  e.lru = f.lru.insert(f.lru.end(), &nit->first);
  f.info[p.slot].tick = ++clock_;
  f.info[p.slot].gen = gen;
  f.info[p.slot].key = &nit->first;
  dirty_ = true;
  return true;
}

void SlotModel::abort(Place p) { release(folders_[p.folder], p.slot); }

std::optional<Pinned> SlotModel::pin(std::string_view key, std::uint64_t len) {
  auto it = lookup(key);
  if (it == index_.end()) return std::nullopt;
  Entry& e = it->second;
  Folder& f = folders_[e.folder];
  if (e.len != len || f.failed) return std::nullopt;
  ++f.info[e.slot].pins;
  f.lru.splice(f.lru.end(), f.lru, e.lru);
  f.info[e.slot].tick = ++clock_;
  return Pinned{Place{e.folder, e.slot}, e.gen, e.len, e.crc};
}

void SlotModel::unpin(Place p) {
  Folder& f = folders_[p.folder];
  SlotInfo& s = f.info[p.slot];
  if (--s.pins == 0 && s.state == SlotState::Zombie) {
    s.state = SlotState::Free;
    f.free.push_back(p.slot);
  }
}

void SlotModel::forget(std::string_view key, std::uint64_t gen) {
  auto it = lookup(key);
  if (it != index_.end() && it->second.gen == gen) drop(it);
}

bool SlotModel::contains(std::string_view key) const { return lookup(key) != index_.end(); }

bool SlotModel::remove(std::string_view key) {
  auto it = lookup(key);
  if (it == index_.end()) return false;
  drop(it);
  return true;
}

std::size_t SlotModel::clear() {
  const std::size_t n = index_.size();
  while (!index_.empty()) drop(index_.begin());
  return n;
}

std::size_t SlotModel::clear_slots(std::uint32_t fi, std::uint64_t first, std::uint64_t count, std::uint64_t below) {
  Folder& f = folders_[fi];
  const std::uint64_t end = std::min(f.slots, first + count);
  std::size_t n = 0;
  for (std::uint64_t s = first; s < end; ++s) {
    const SlotInfo& i = f.info[s];
    if (i.state != SlotState::Live || i.gen >= below) continue;
    drop(index_.find(*i.key));
    ++n;
  }
  return n;
}

bool SlotModel::fail(std::uint32_t fi) {
  Folder& f = folders_[fi];
  if (f.failed) return false;
  f.failed = true;
  // The folder's own entries (its LRU list), not the whole index: O(its pages).
  for (const std::string* key : f.lru) {
    auto it = index_.find(*key);
    dropped_max_gen_ = std::max(dropped_max_gen_, it->second.gen);
    release(f, it->second.slot);
    index_.erase(it);  // the key's string goes with it: *key is not read again
  }
  f.lru.clear();
  dirty_ = true;
  return true;
}

std::vector<std::optional<std::uint32_t>> SlotModel::take_probe_slots(std::uint32_t fi, std::uint64_t per_group) {
  Folder& f = folders_[fi];
  std::vector<std::optional<std::uint32_t>> pick((f.slots + per_group - 1) / per_group);
  for (std::uint32_t slot : f.free) {
    auto& p = pick[slot / per_group];
    if (!p) p = slot;
  }
  std::erase_if(f.free, [&](std::uint32_t slot) { return pick[slot / per_group] == slot; });
  for (const auto& p : pick) {
    if (p) f.info[*p].state = SlotState::Writing;
  }
  return pick;
}

void SlotModel::return_probe_slots(std::uint32_t fi, const std::vector<std::optional<std::uint32_t>>& picks) {
  Folder& f = folders_[fi];
  for (const auto& p : picks) {
    if (!p) continue;
    f.info[*p].state = SlotState::Free;
    f.free.push_back(*p);
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
    const Entry& e = index_.find(*i.key)->second;
    out->back().len = e.len;
    out->back().crc = e.crc;
    out->back().key = *i.key;
  }
}

std::vector<CkptRecord> SlotModel::records(std::uint32_t fi) const {
  const Folder& f = folders_[fi];
  std::vector<CkptRecord> out;
  out.reserve(f.lru.size());
  for (const std::string* k : f.lru) {
    const Entry& e = index_.find(*k)->second;
    out.push_back(CkptRecord{e.slot, e.gen, f.info[e.slot].tick});
  }
  return out;
}

void SlotModel::load(const std::vector<std::pair<std::string, Found>>& pages) {
  std::vector<std::vector<std::pair<std::uint64_t, const std::string*>>> order(folders_.size());
  index_.reserve(index_.size() + pages.size());
  for (const auto& [key, c] : pages) {
    Folder& f = folders_[c.where.folder];
    auto [it, ins] = index_.emplace(key, Entry{c.where.folder, c.where.slot, c.gen, c.len, {}, c.crc});
    f.info[c.where.slot].state = SlotState::Live;
    f.info[c.where.slot].gen = c.gen;
    f.info[c.where.slot].key = &it->first;
    order[c.where.folder].emplace_back(c.tick, &it->first);
  }
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    Folder& f = folders_[fi];
    std::sort(order[fi].begin(), order[fi].end());
    for (auto& [tick, key] : order[fi]) {
      Entry& e = index_.find(*key)->second;
      e.lru = f.lru.insert(f.lru.end(), key);
      f.info[e.slot].tick = ++clock_;  // renumbered in LRU order (ticks only order)
    }
    f.free.clear();
    if (f.failed) continue;  // possibly failed before its slot table was made
    for (std::uint64_t s = f.slots; s-- > 0;) {
      if (f.info[s].state == SlotState::Free) f.free.push_back(static_cast<std::uint32_t>(s));
    }
  }
}

std::uint64_t SlotModel::used(std::uint32_t fi) const {
  const Folder& f = folders_[fi];
  if (f.failed) return 0;
  return f.slots - std::min<std::uint64_t>(f.slots, f.free.size());
}

std::vector<std::string> SlotModel::lru_keys(std::uint32_t fi) const {
  std::vector<std::string> out;
  for (const std::string* k : folders_[fi].lru) out.push_back(*k);
  return out;
}

std::optional<Pinned> SlotModel::find(std::string_view key) const {
  auto it = lookup(key);
  if (it == index_.end()) return std::nullopt;
  return Pinned{Place{it->second.folder, it->second.slot}, it->second.gen, it->second.len, it->second.crc};
}

std::string SlotModel::check() const {
  for (std::uint32_t fi = 0; fi < folders_.size(); ++fi) {
    const Folder& f = folders_[fi];
    const std::string where = "folder " + std::to_string(fi) + ": ";
    std::vector<int> in_free(f.slots, 0);
    for (std::uint32_t s : f.free) {
      if (s >= f.slots) return where + "free slot out of range";
      if (++in_free[s] > 1) return where + "slot " + std::to_string(s) + " twice in the free list";
    }
    std::vector<int> owners(f.slots, 0);
    std::set<const std::string*> keys;
    for (const auto& [key, e] : index_) {
      if (e.folder != fi) continue;
      if (f.failed) return where + "failed but holds " + key;
      if (e.slot >= f.slots) return where + "entry slot out of range";
      if (f.info[e.slot].gen != e.gen) return where + "slot " + std::to_string(e.slot) + ": generation not its entry's";
      if (f.info[e.slot].key != &key) return where + "slot " + std::to_string(e.slot) + ": key not its entry's";
      ++owners[e.slot];
      keys.insert(&key);
    }
    for (std::uint64_t s = 0; s < f.slots; ++s) {
      const SlotInfo& i = f.info[s];
      const std::string slot = where + "slot " + std::to_string(s) + ": ";
      if ((i.state == SlotState::Free) != (in_free[s] == 1)) return slot + "Free iff in the free list";
      if (i.state == SlotState::Free && i.pins > 0) return slot + "Free while pinned";
      if ((i.state == SlotState::Live) != (owners[s] == 1) || owners[s] > 1) return slot + "Live iff one entry";
      if (i.state == SlotState::Zombie && i.pins == 0) return slot + "Zombie without pins";
    }
    if (f.lru.size() != keys.size()) return where + "LRU list and entries differ in size";
    for (const std::string* k : f.lru) {
      if (keys.count(k) == 0) return where + "LRU list holds a key not of this folder";
    }
  }
  return {};
}

}  // namespace deepio::kv::internal
