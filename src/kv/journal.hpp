// The slot journal of a store made with one (kv.meta format 3; layout.hpp has the bytes): per
// slab a head block and a ring of blocks past its last slot, listing the (slot, generation) a
// put took since the last checkpoint. A put batch writes its slots' records with its headers,
// before the slab's one fdatasync, so an acknowledged put's record is durable when its future
// completes (no flush of its own). Open then reads the checkpoint (format 2: key, length and
// CRC per live slot) and, of the slots, only those the ring lists with a generation above the
// checkpoint's bound (recovery.cpp, journal_open).
//
// The ring never overwrites a record the last durable checkpoint of its folder does not
// cover (a generation above its bound): a batch that finds no such block free writes no
// records and turns the slab's head to "scan" instead (its own write, covered by its own
// sync), and open scans every slot header of that slab, as for a store without a journal. A
// checkpoint whose bound covers every generation put meanwhile turns the head back (the next
// batch writes it). A ring half full asks for a checkpoint after the batch, so that "scan" is
// the exception (a checkpoint that cannot cover the removals yet waits, impl.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "deepio/handle.hpp"
#include "kv/layout.hpp"

namespace deepio::kv::internal {

/// Journal blocks per slab (head included) for a new folder of `per_slab` slots per slab:
/// one block per 64 slots, between 64 and 4096 blocks of records.
std::uint32_t journal_blocks_for(std::uint64_t per_slab);

/// One slab's journal as the store keeps it (Store::Impl::mu).
struct SlabJournal {
  std::uint32_t ring = 0;              // blocks of records (the head excluded)
  std::uint32_t cursor = 0;            // the ring position written next
  std::uint64_t next_seq = 1;          // sequence number of the next block
  std::vector<std::uint64_t> max_gen;  // per ring position: its newest record's generation
  std::uint32_t used = 0;              // ring positions not yet covered by a durable checkpoint
  bool scan = false;                   // the head says (or is being written to say) "scan"
  std::uint64_t scan_max_gen = 0;      // the newest generation put to the slab while scanning
  bool head_pending = false;           // the head must be written back to "normal"
};

/// The journal writes of one put batch: add() each page written (its slot and generation),
/// then Store::Impl::journal_write() starts them, finish() waits before the slabs' sync.
class JournalWrites {
 public:
  void add(std::size_t page, std::uint32_t folder, std::uint32_t slot, std::uint64_t gen) {
    pages_.push_back(Page{page, folder, slot, gen});
  }
  /// Waits for the writes started; a failed one fails its slab's pages (err, what).
  void finish(std::vector<int>& err, std::vector<std::string>& what);
  /// Engine operations started (one write per block), for StoreStats::io_ops.
  [[nodiscard]] std::uint64_t ops() const noexcept { return ops_; }

  struct Page {
    std::size_t page;
    std::uint32_t folder, slot;
    std::uint64_t gen;
  };
  struct Write {
    std::vector<std::size_t> pages;  // the batch's pages a failure of it fails
    AlignedBuf buf;
    Future fut;
    int err = 0;  // the write could not start
    std::string what;
  };
  std::vector<Page> pages_;
  std::vector<Write> writes_;
  std::uint64_t ops_ = 0;
};

}  // namespace deepio::kv::internal
