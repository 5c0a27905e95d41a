#include "kv/layout.hpp"

#include <algorithm>
#include <new>

#include "deepio/kv.hpp"

namespace deepio::kv::internal {

std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

AlignedBuf aligned_buf(std::size_t n) {
  n = round_up(std::max<std::size_t>(n, 1), kAlign);
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return AlignedBuf(static_cast<unsigned char*>(p));
}

void encode_header(unsigned char* h, std::string_view key, std::uint64_t gen, std::uint64_t len, std::uint32_t crc,
                   std::uint64_t page_bytes) {
  std::memset(h, 0, kHeaderBytes);
  put_le<std::uint32_t>(h, kMagic);
  put_le<std::uint16_t>(h + 4, kVersion);
  put_le<std::uint16_t>(h + 6, static_cast<std::uint16_t>(key.size()));
  put_le<std::uint64_t>(h + 8, gen);
  put_le<std::uint64_t>(h + 16, len);
  put_le<std::uint32_t>(h + 24, crc);
  put_le<std::uint64_t>(h + 32, page_bytes);
  std::memcpy(h + kKeyOffset, key.data(), key.size());
  put_le<std::uint32_t>(h + 28, crc32c(h, kKeyOffset + key.size()));
}

std::optional<Decoded> decode_header(const unsigned char* h, std::uint64_t page_bytes) {
  if (get_le<std::uint32_t>(h) != kMagic || get_le<std::uint16_t>(h + 4) != kVersion) return std::nullopt;
  const std::size_t klen = get_le<std::uint16_t>(h + 6);
  if (klen == 0 || klen > kMaxKeyBytes) return std::nullopt;
  unsigned char tmp[kKeyOffset];
  std::memcpy(tmp, h, kKeyOffset);
  put_le<std::uint32_t>(tmp + 28, 0);
  std::uint32_t c = crc32c(tmp, kKeyOffset);
  c = crc32c(h + kKeyOffset, klen, c);
  if (c != get_le<std::uint32_t>(h + 28)) return std::nullopt;
  if (get_le<std::uint64_t>(h + 32) != page_bytes) return std::nullopt;
  Decoded d;
  d.key = std::string_view(reinterpret_cast<const char*>(h + kKeyOffset), klen);
  d.gen = get_le<std::uint64_t>(h + 8);
  d.len = get_le<std::uint64_t>(h + 16);
  d.crc = get_le<std::uint32_t>(h + 24);
  if (d.len > page_bytes) return std::nullopt;
  return d;
}

namespace {
constexpr std::size_t kMetaV1Bytes = 44;
constexpr std::size_t kMetaV2Fixed = 52;  // up to the fingerprint's length
}  // namespace

std::vector<unsigned char> encode_meta(const Meta& m) {
  const bool v3 = m.journal_blocks > 0;
  const std::size_t fixed = kMetaV2Fixed + (v3 ? 4 : 0);
  std::vector<unsigned char> b(fixed + m.fingerprint.size() + 4);
  put_le<std::uint32_t>(b.data(), kMetaMagic);
  put_le<std::uint32_t>(b.data() + 4, v3 ? kMetaVersion : 2);
  put_le<std::uint64_t>(b.data() + 8, m.page_bytes);
  put_le<std::uint64_t>(b.data() + 16, m.slot_bytes);
  put_le<std::uint64_t>(b.data() + 24, m.slots);
  put_le<std::uint64_t>(b.data() + 32, m.per_slab);
  put_le<std::uint64_t>(b.data() + 40, m.gen_floor);
  if (v3) put_le<std::uint32_t>(b.data() + 48, m.journal_blocks);
  put_le<std::uint32_t>(b.data() + fixed - 4, static_cast<std::uint32_t>(m.fingerprint.size()));
  std::memcpy(b.data() + fixed, m.fingerprint.data(), m.fingerprint.size());
  put_le<std::uint32_t>(b.data() + b.size() - 4, crc32c(b.data(), b.size() - 4));
  return b;
}

std::optional<Meta> decode_meta(const std::vector<unsigned char>& b) {
  if (b.size() < kMetaV1Bytes || get_le<std::uint32_t>(b.data()) != kMetaMagic) return std::nullopt;
  if (crc32c(b.data(), b.size() - 4) != get_le<std::uint32_t>(b.data() + b.size() - 4)) return std::nullopt;
  Meta m;
  m.version = get_le<std::uint32_t>(b.data() + 4);
  m.page_bytes = get_le<std::uint64_t>(b.data() + 8);
  m.slot_bytes = get_le<std::uint64_t>(b.data() + 16);
  m.slots = get_le<std::uint64_t>(b.data() + 24);
  m.per_slab = get_le<std::uint64_t>(b.data() + 32);
  if (m.version == 1) {  // format 1 wrote its version as 1 (the slot header's) and no fingerprint
    if (b.size() != kMetaV1Bytes) return std::nullopt;
  } else if (m.version == 2 || m.version == 3) {
    const std::size_t fixed = kMetaV2Fixed + (m.version == 3 ? 4 : 0);
    if (b.size() < fixed + 4) return std::nullopt;
    m.gen_floor = get_le<std::uint64_t>(b.data() + 40);
    if (m.version == 3) {
      m.journal_blocks = get_le<std::uint32_t>(b.data() + 48);
      if (m.journal_blocks < 2) return std::nullopt;  // a head and at least one block of records
    }
    const std::size_t fp = get_le<std::uint32_t>(b.data() + fixed - 4);
    if (fp > kMaxFingerprintBytes || b.size() != fixed + fp + 4) return std::nullopt;
    m.fingerprint.assign(reinterpret_cast<const char*>(b.data() + fixed), fp);
  } else {
    return std::nullopt;
  }
  if (m.slots == 0 || m.per_slab == 0) return std::nullopt;
  return m;
}

namespace {
constexpr std::size_t kCkptV2Fixed = 34;  // a format-2 record up to its key
}  // namespace

std::vector<unsigned char> encode_checkpoint(std::uint64_t bound, const std::vector<CkptRecord>& records,
                                             bool with_keys) {
  std::size_t size = 24 + 4;
  for (const CkptRecord& r : records) size += with_keys ? kCkptV2Fixed + r.key.size() : 24;
  std::vector<unsigned char> b(size);
  put_le<std::uint32_t>(b.data(), kCkptMagic);
  put_le<std::uint32_t>(b.data() + 4, with_keys ? 2 : 1);
  put_le<std::uint64_t>(b.data() + 8, bound);
  put_le<std::uint64_t>(b.data() + 16, records.size());
  unsigned char* p = b.data() + 24;
  for (const CkptRecord& r : records) {
    if (!with_keys) {
      put_le<std::uint64_t>(p, r.slot);
      put_le<std::uint64_t>(p + 8, r.gen);
      put_le<std::uint64_t>(p + 16, r.tick);
      p += 24;
      continue;
    }
    put_le<std::uint32_t>(p, r.slot);
    put_le<std::uint64_t>(p + 4, r.gen);
    put_le<std::uint64_t>(p + 12, r.tick);
    put_le<std::uint64_t>(p + 20, r.len);
    put_le<std::uint32_t>(p + 28, r.crc);
    put_le<std::uint16_t>(p + 32, static_cast<std::uint16_t>(r.key.size()));
    std::memcpy(p + kCkptV2Fixed, r.key.data(), r.key.size());
    p += kCkptV2Fixed + r.key.size();
  }
  put_le<std::uint32_t>(p, crc32c(b.data(), b.size() - 4));
  return b;
}

std::optional<Ckpt> decode_checkpoint(const std::vector<unsigned char>& v) {
  if (v.size() < 28 || get_le<std::uint32_t>(v.data()) != kCkptMagic) return std::nullopt;
  if (crc32c(v.data(), v.size() - 4) != get_le<std::uint32_t>(v.data() + v.size() - 4)) return std::nullopt;
  Ckpt c;
  c.version = get_le<std::uint32_t>(v.data() + 4);
  c.bound = get_le<std::uint64_t>(v.data() + 8);
  const auto count = get_le<std::uint64_t>(v.data() + 16);
  const std::size_t end = v.size() - 4;
  if (c.version == 1) {
    if (count > (v.size() - 28) / 24 || v.size() != 28 + count * 24) return std::nullopt;
    c.records.reserve(count);
    for (std::uint64_t r = 0; r < count; ++r) {
      const unsigned char* p = v.data() + 24 + r * 24;
      c.records.push_back(CkptRecord{static_cast<std::uint32_t>(get_le<std::uint64_t>(p)), get_le<std::uint64_t>(p + 8),
                                     get_le<std::uint64_t>(p + 16)});
    }
    return c;
  }
  if (c.version != 2 || count > (v.size() - 28) / kCkptV2Fixed) return std::nullopt;
  c.records.resize(count);
  std::size_t at = 24;
  for (CkptRecord& r : c.records) {
    if (end - at < kCkptV2Fixed) return std::nullopt;
    const unsigned char* p = v.data() + at;
    const std::size_t klen = get_le<std::uint16_t>(p + 32);
    if (end - at - kCkptV2Fixed < klen) return std::nullopt;
    r.slot = get_le<std::uint32_t>(p);
    r.gen = get_le<std::uint64_t>(p + 4);
    r.tick = get_le<std::uint64_t>(p + 12);
    r.len = get_le<std::uint64_t>(p + 20);
    r.crc = get_le<std::uint32_t>(p + 28);
    r.key.assign(reinterpret_cast<const char*>(p + kCkptV2Fixed), klen);
    at += kCkptV2Fixed + klen;
  }
  if (at != end) return std::nullopt;
  return c;
}

void encode_journal_block(unsigned char* b, const JournalBlock& j) {
  std::memset(b, 0, kJournalBlock);
  put_le<std::uint32_t>(b, kJournalMagic);
  put_le<std::uint16_t>(b + 4, 1);
  put_le<std::uint16_t>(b + 6, j.head ? 1 : 2);
  put_le<std::uint64_t>(b + 8, j.seq);
  const std::size_t n = std::min(j.records.size(), kJournalRecordsPerBlock);
  put_le<std::uint32_t>(b + 16, static_cast<std::uint32_t>(n));
  put_le<std::uint32_t>(b + 20, j.scan ? 1 : 0);
  unsigned char* p = b + 24;
  for (std::size_t i = 0; i < n; ++i, p += kJournalRecordBytes) {
    put_le<std::uint32_t>(p, j.records[i].slot);
    put_le<std::uint64_t>(p + 4, j.records[i].gen);
  }
  put_le<std::uint32_t>(b + kJournalBlock - 4, crc32c(b, kJournalBlock - 4));
}

std::optional<JournalBlock> decode_journal_block(const unsigned char* b) {
  if (get_le<std::uint32_t>(b) != kJournalMagic || get_le<std::uint16_t>(b + 4) != 1) return std::nullopt;
  if (crc32c(b, kJournalBlock - 4) != get_le<std::uint32_t>(b + kJournalBlock - 4)) return std::nullopt;
  const auto kind = get_le<std::uint16_t>(b + 6);
  const std::size_t n = get_le<std::uint32_t>(b + 16);
  if ((kind != 1 && kind != 2) || n > kJournalRecordsPerBlock) return std::nullopt;
  JournalBlock j;
  j.head = kind == 1;
  j.seq = get_le<std::uint64_t>(b + 8);
  j.scan = (get_le<std::uint32_t>(b + 20) & 1) != 0;
  j.records.resize(n);
  const unsigned char* p = b + 24;
  for (std::size_t i = 0; i < n; ++i, p += kJournalRecordBytes) {
    j.records[i] = JournalRecord{get_le<std::uint32_t>(p), get_le<std::uint64_t>(p + 4)};
  }
  return j;
}

}  // namespace deepio::kv::internal
