#include "core/device_reads.hpp"

namespace deepio::detail {

DeviceReads* DeviceReadsTable::find(std::uint64_t device_key) noexcept {
  if (device_key == ~std::uint64_t{0}) return nullptr;  // its stored key would be 0
  const std::uint64_t want = device_key + 1;
  std::size_t i = static_cast<std::size_t>((device_key * 0x9E3779B97F4A7C15ull) >> 56) % kMaxDevices;
  for (std::size_t n = 0; n < kMaxDevices; ++n, i = (i + 1) % kMaxDevices) {
    std::uint64_t k = entries_[i].key.load(std::memory_order_acquire);
    if (k == 0 && entries_[i].key.compare_exchange_strong(k, want, std::memory_order_acq_rel)) return &entries_[i];
    if (k == want) return &entries_[i];  // ours, or another thread's compare-exchange just made it
  }
  return nullptr;
}

DeviceReads* device_reads(std::uint64_t device_key) noexcept {
  static DeviceReadsTable table;
  return table.find(device_key);
}

}  // namespace deepio::detail
