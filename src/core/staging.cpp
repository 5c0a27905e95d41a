#include "core/staging.hpp"

#include <cerrno>
#include <new>
#include <utility>

namespace deepio::detail {

bool Staging::ensure() {
  if (!free_.empty() || arena_.data() != nullptr) return true;
  try {
    arena_ = pool_->take(slot_bytes_ * slots_);
  } catch (...) {
    return false;
  }
  for (std::size_t i = slots_; i-- > 0;) free_.push_back(static_cast<int>(i));
  return true;
}

DeviceStager* Staging::stager(int device, Status* why) {
  auto it = stagers_.find(device);
  if (it != stagers_.end()) return it->second.get();
  if (!factory_) {
    *why = Status::failure(ENODEV, "device memory needs the CUDA driver, which is not loaded");
    return nullptr;
  }
  auto st = factory_(device, slots_, why);
  if (!st) return nullptr;
  *why = st->register_staging(arena_.data(), arena_.size());
  if (!why->ok()) return nullptr;
  return stagers_.emplace(device, std::move(st)).first->second.get();
}

int Staging::take() noexcept {
  const int slot = free_.back();
  free_.pop_back();
  return slot;
}

Status Staging::start_copy_back(std::uint32_t id, int device, int slot, std::byte* dst, std::size_t n) {
  Status cs = stagers_.at(device)->from_staging(slot, dst, at(slot), n);
  if (cs.ok()) draining_.push_back({id, device, slot});
  return cs;
}

void Staging::drain(bool block, const std::function<void(std::uint32_t id, Status status)>& done) {
  while (!draining_.empty()) {
    const Draining d = draining_.front();
    DeviceStager* st = stagers_.at(d.device).get();
    if (!block && !st->done(d.slot)) return;  // copies finish in order on one stream
    Status err = st->wait(d.slot);
    draining_.pop_front();
    done(d.id, std::move(err));
  }
}

void Staging::abandon() {
  if (arena_.data() == nullptr) return;
  arena_.abandon();
  free_.clear();
}

}  // namespace deepio::detail
