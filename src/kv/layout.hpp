// The store's on-disk format, as pure encode/decode functions (no I/O): slot headers, the
// folder's kv.meta and its index.ckpt. docs/kv.md "Format" describes the same bytes.
//
// Slot header (little endian), kHeaderBytes long, followed by the page at kHeaderBytes:
//   0 u32 magic "DKVS" | 4 u16 version | 6 u16 key length | 8 u64 generation | 16 u64 page length
//   24 u32 CRC-32C of the page | 28 u32 CRC-32C of bytes [0, 40 + key length) with this field 0
//   32 u64 page_bytes of the layout | 40 key bytes
// kv.meta, format 1 (44 bytes; still read): magic "DKVM" | u32 1 | u64 page_bytes | u64 slot
//   bytes | u64 slots | u64 slots per slab | u32 CRC-32C of bytes [0, 40).
// kv.meta, format 2 (a store made without a journal): magic "DKVM" | u32 2 | u64 page_bytes |
//   u64 slot bytes | u64 slots | u64 slots per slab | u64 generation floor | u32 fingerprint
//   length | the fingerprint | u32 CRC-32C of everything before it. A format-1 file reads as
//   fingerprint "" and floor 0. The floor: a slot whose header generation is at or below it is
//   dead (the pages of another fingerprint, dropped in one atomic replace of kv.meta).
// kv.meta, format 3 (a store made with a journal, written since): format 2 with a u32 count of
//   journal blocks per slab after the floor. Formats 1 and 2 read as 0 journal blocks.
// index.ckpt, format 1 (a store without a journal): magic "DKVC" | u32 1 | u64 generation bound
//   | u64 count | count x (u64 slot, u64 generation, u64 LRU tick) | u32 CRC-32C of everything
//   before it.
// index.ckpt, format 2 (a store with a journal): magic "DKVC" | u32 2 | u64 bound | u64 count |
//   count x (u32 slot, u64 generation, u64 LRU tick, u64 page length, u32 page CRC-32C, u16 key
//   length, the key) | u32 CRC-32C of everything before it: what the index needs, no header read.
// Journal (format 3 only): kJournalBlock-byte blocks past a slab's last slot, block 0 the head,
//   the others a ring of records: magic "DKVJ" | u16 1 | u16 kind (1 head, 2 records) | u64
//   sequence | u32 count | u32 flags (head: 1 = the ring is incomplete, scan the slab) | count x
//   (u32 slot, u64 generation) | zeros | at 4092 u32 CRC-32C of bytes [0, 4092).
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepio::kv::internal {

inline constexpr std::uint32_t kMagic = 0x53564B44u;  // "DKVS"
inline constexpr std::uint16_t kVersion = 1;          // slot headers and checkpoints
inline constexpr std::size_t kHeaderBytes = 4096;
inline constexpr std::size_t kAlign = 4096;
inline constexpr std::size_t kKeyOffset = 40;
inline constexpr std::uint32_t kMetaMagic = 0x4D564B44u;     // "DKVM"
inline constexpr std::uint32_t kMetaVersion = 3;             // kv.meta as written now (with a journal)
inline constexpr std::uint32_t kCkptMagic = 0x43564B44u;     // "DKVC"
inline constexpr std::uint32_t kJournalMagic = 0x4A564B44u;  // "DKVJ"
inline constexpr std::size_t kJournalBlock = 4096;
inline constexpr std::size_t kJournalRecordBytes = 12;
inline constexpr std::size_t kJournalRecordsPerBlock = (kJournalBlock - 4 - 24) / kJournalRecordBytes;
/// The longest fingerprint (StoreOptions::fingerprint).
inline constexpr std::size_t kMaxFingerprintBytes = 4096;

template <typename T>
void put_le(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof v);  // x86-64 and aarch64 Linux are little endian
}
template <typename T>
T get_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

/// FNV-1a 64 of the key: which folder a new page goes to first.
std::uint64_t fnv1a(std::string_view s) noexcept;

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};
using AlignedBuf = std::unique_ptr<unsigned char, AlignedFree>;
/// n bytes (at least one, rounded up to kAlign), kAlign-aligned, zeroed. Throws bad_alloc.
AlignedBuf aligned_buf(std::size_t n);

/// Writes a whole header (kHeaderBytes) at h.
void encode_header(unsigned char* h, std::string_view key, std::uint64_t gen, std::uint64_t len, std::uint32_t crc,
                   std::uint64_t page_bytes);

struct Decoded {
  std::string_view key;  // into the header's bytes
  std::uint64_t gen = 0;
  std::uint64_t len = 0;
  std::uint32_t crc = 0;
};

/// The header's fields if it is whole (its CRC) and of this layout (page_bytes, a length
/// within it, a key of 1 to kMaxKeyBytes bytes).
std::optional<Decoded> decode_header(const unsigned char* h, std::uint64_t page_bytes);

/// A folder's layout and what its bytes mean (kv.meta).
struct Meta {
  std::uint32_t version = kMetaVersion;  // as read; encode_meta always writes kMetaVersion
  std::uint64_t page_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t slots = 0;
  std::uint64_t per_slab = 0;
  std::uint64_t gen_floor = 0;
  /// Journal blocks per slab (head included); 0: a store made without one (format 1 or 2).
  std::uint32_t journal_blocks = 0;
  std::string fingerprint;
};

/// Format 3 when m.journal_blocks > 0, else format 2.
std::vector<unsigned char> encode_meta(const Meta& m);
/// The meta if the bytes are a whole kv.meta of format 1, 2 or 3; nullopt otherwise.
std::optional<Meta> decode_meta(const std::vector<unsigned char>& b);

/// One live page of a folder in a checkpoint.
struct CkptRecord {
  std::uint32_t slot = 0;
  std::uint64_t gen = 0;
  std::uint64_t tick = 0;
  // Format 2 only (empty key in format 1): what the index needs without reading the header.
  std::uint64_t len = 0;
  std::uint32_t crc = 0;
  std::string key{};
};

struct Ckpt {
  std::uint32_t version = 1;
  std::uint64_t bound = 0;
  std::vector<CkptRecord> records;
};

/// Format 2 (keys, lengths and CRCs too) when `with_keys`, else format 1.
std::vector<unsigned char> encode_checkpoint(std::uint64_t bound, const std::vector<CkptRecord>& records,
                                             bool with_keys = false);
/// The checkpoint if the bytes are a whole one of format 1 or 2; nullopt (no checkpoint: every
/// header counts) otherwise.
std::optional<Ckpt> decode_checkpoint(const std::vector<unsigned char>& b);

/// One slot handed to a put since the last checkpoint.
struct JournalRecord {
  std::uint32_t slot = 0;
  std::uint64_t gen = 0;
};

struct JournalBlock {
  bool head = false;
  bool scan = false;  // head: the ring may miss records, the slab is scanned at open
  std::uint64_t seq = 0;
  std::vector<JournalRecord> records;  // at most kJournalRecordsPerBlock
};

/// Writes a whole block (kJournalBlock bytes) at b.
void encode_journal_block(unsigned char* b, const JournalBlock& j);
/// The block if whole (magic, CRC, count); nullopt otherwise (never written, torn, zeros).
std::optional<JournalBlock> decode_journal_block(const unsigned char* b);

}  // namespace deepio::kv::internal
