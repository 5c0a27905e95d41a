// deepio::kv::Store's implementation (the guarantees are in include/deepio/kv.hpp; the format
// in layout.hpp; the slot model in slots.hpp). One file per job:
//   future.cpp      BatchFuture
//   layout.cpp      header, kv.meta and checkpoint bytes (pure)
//   slots.cpp       slots, index, LRU and eviction (pure model)
//   files.cpp       durable replace, whole-file reads, the folder lock
//   page_io.cpp     a batch's host pages as ranged operations, a block of a slab's pages each
//   batch_io.cpp    put and get batches (the I/O of the protocols below)
//   recovery.cpp    open: layout, checkpoint and header scan
//   journal.cpp     the slot journal: a put batch's records, open from checkpoint + journal
//   probe.cpp       folder failures and the probes that bring them back
//   checkpoint.cpp  writing checkpoints
//   failed_list.cpp the failed folders named in the healthy ones (a stale checkpoint's floor)
//   store.cpp       the public API, the batch threads and close
//
// Put protocol (one batch thread per batch): under mu, allocate a slot per page (evicting
// LRU pages of its folder when needed) and a new generation; then, unlocked, write every
// page's data (no sync; host pages a ranged write per block of a slab's pages, page_io.hpp)
// while computing its CRC, then every header (one pwrite_ranges per
// slab), without waiting for the data in between; once every write completed, one fdatasync
// per slab touched (a zero-byte write with OpOptions::fsync: the engine's sync threads, all
// slabs at once); then, under mu, switch the index to the new slots (with each page's CRC)
// and free the old ones (freed later when pinned). A crash anywhere leaves a slot whose header
// CRC or data CRC does not match (a miss, or the older slot of the key at open) or the
// previous version; nothing is acknowledged before its sync.
//
// Get protocol: under mu, look up and pin (the index gives slot, length and the page's CRC);
// unlocked, read the data straight into the caller's segments (no header: one request per
// segment, host pages a ranged read per block of a slab's pages) and verify each block's
// pages against the index's CRCs as it lands; under mu, unpin (a mismatch forgets the
// entry: its slot no longer holds the page).
//
// Device pages (a segment in CUDA memory, DeviceSupport::classify): the same protocols through
// the batch thread's DeviceScratch: put copies a page device→host into a free buffer, takes its
// CRC there and writes it from there, waiting for the oldest device page's write when every
// buffer is held; get reads device pages into buffers (as many as there are), verifies each as
// its read completes and starts the host→device copy of a verified one only, and completes the
// batch after every copy finished. BatchOptions::stream's events (recorded at the call) are
// waited for by the stagers' streams before the batch's first copy. A failed copy is the
// page's false, not a folder failure; a get's page stays indexed.
//
// Checkpoint: the live (slot, generation, LRU tick) of each folder and a generation bound B
// below every put still in flight. At open a slot whose header is valid is live if its
// generation is above B (written after the checkpoint) or the checkpoint lists it with that
// generation; slots freed before the checkpoint are dead. Per key the newest whole page wins:
// a listed page is taken unread when the key has no other, any other only if its data CRC
// matches (a put writes header and data at once: a crash can leave a header over torn data).
// Generations come from one counter per store, restarted above the highest found at open.
// A store made with a journal (journal.hpp) writes format-2 checkpoints (key, length, CRC per
// slot) and lists each slot a put takes in its slab's journal, synced with the batch: open
// then reads only the slots listed above the bound (none after a clean close), each header
// and page whole or not taken; an incomplete journal (its head says "scan", or no format-2
// checkpoint) falls back to the scan of every header, as for a store made without a journal.
// An open from the journal restarts the counter kJournalGenGap above the highest generation it
// knows: a put cut by the crash may have left a whole header whose record never landed.
//
// Errors: any failed operation of a folder marks it failed (errno, message, count, time, a
// queued warning); its index entries are dropped (pinned slots turn Zombie, freed when the last
// get unpins them) and it gets no new pages. After a batch that finds its last error
// retry_failed_after old, or at retry_failed(), probe() tests it (probe.cpp). A folder that
// failed at open (its slot table never read whole) is not probed.
//
// Locks: mu guards the slot model, folders' error state, stats and warnings; no I/O wait and
// no callback runs under it, and no work over every page: a checkpoint and clear() take the
// slot table 4096 slots per hold (checkpoint.cpp, Store::clear). ckpt_mu serializes checkpoints; probe_mu probes; qmu
// the queue. Order: probe_mu, ckpt_mu, mu.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deepio/handle.hpp"
#include "deepio/kv.hpp"
#include "engine/device.hpp"
#include "kv/device_scratch.hpp"
#include "kv/files.hpp"
#include "kv/future.hpp"
#include "kv/journal.hpp"
#include "kv/layout.hpp"
#include "kv/page_io.hpp"
#include "kv/slots.hpp"
#include "platform/process.hpp"

namespace deepio::kv {

namespace internal {

/// A folder's files and error history (its slots are in the SlotModel).
struct Folder {
  std::string path;
  /// kv.lock, held with flock(LOCK_EX) while the store is open: one store per folder.
  FolderLock lock;
  std::vector<File> slabs;
  std::uint64_t slots = 0;
  std::uint64_t per_slab = 0;
  /// Its kv.meta as read or written at open (fingerprint, generation floor).
  Meta meta;
  /// Opened with another fingerprint and clear_on_mismatch: the scan drops every page.
  bool clear_pages = false;
  /// open() read every slot header of the folder (its slabs and slot table are whole): only
  /// such a folder is probed after a failure. One that failed at open waits for a reopen.
  bool opened = false;
  /// When the folder last saw an error (a failed operation or probe): the next automatic
  /// probe waits StoreOptions::retry_failed_after from here.
  std::chrono::steady_clock::time_point failed_at{};
  std::uint64_t errors = 0;
  std::uint64_t recoveries = 0;
  int last_errno = 0;
  std::string last_error;
  /// Its absolute path, links resolved: how failed.list names it (failed_list.cpp).
  std::string id;
  /// The highest generation handed out when it last failed: its pages then are at or below.
  std::uint64_t failed_gen = 0;
  /// From the failed.list files read at open: its pages at or below this are dead.
  std::uint64_t stale_floor = 0;
  /// Its failed.list as last read or written (ckpt_mu): rewritten only when it changes.
  std::vector<unsigned char> failed_list;
  /// Per slab, with a journal (meta.journal_blocks > 0; mu); empty otherwise.
  std::vector<SlabJournal> journal;
  /// The bound of the folder's last durable checkpoint (mu): ring blocks at or below it are free.
  std::uint64_t durable_bound = 0;

  [[nodiscard]] bool has_journal() const { return meta.journal_blocks > 0; }
  /// Where slab s's journal begins (past its last slot).
  [[nodiscard]] std::uint64_t journal_offset(std::uint64_t s, std::uint64_t slot_bytes) const {
    return std::min(per_slab, slots - s * per_slab) * slot_bytes;
  }

  [[nodiscard]] std::uint64_t offset_of(std::uint32_t slot, std::uint64_t slot_bytes) const {
    return (slot % per_slab) * slot_bytes;
  }
  [[nodiscard]] File& slab_of(std::uint32_t slot) { return slabs[slot / per_slab]; }
};

struct Job {
  bool write = false;
  /// BatchOptions::stream's events, one per device of the batch's device pages.
  std::vector<std::pair<int, std::shared_ptr<deepio::detail::DeviceFence>>> fences;
  std::vector<std::string> keys;
  std::vector<std::vector<Segment>> segments;
  std::shared_ptr<BatchFuture::State> state;
};

/// The errno a failed operation stands for (EIO where the error carries none).
inline int errno_of(const Error& e) noexcept { return e.errnum() != 0 ? e.errnum() : EIO; }

/// Waits for f and returns its errno (0 on success), with the message in *what.
inline int settle(Future& f, std::string* what) {
  try {
    f.get();
    return 0;
  } catch (const Error& e) {
    *what = e.what();
    return errno_of(e);
  }
}

}  // namespace internal

struct Store::Impl {
  using Folder = internal::Folder;
  using Job = internal::Job;

  StoreOptions opt;
  const deepio::detail::ProcessStamp stamp;
  std::uint64_t slot_bytes = 0;
  std::unique_ptr<Handle> handle;
  deepio::detail::DeviceSupport device;  // read once at open, as a Handle does

  mutable std::mutex mu;
  std::vector<Folder> folders;  // the vector never changes after open
  internal::SlotModel model;
  std::set<std::uint64_t> inflight_gens;
  std::condition_variable gens_cv;  // notified when puts leave inflight_gens (mu)
  std::uint64_t next_gen = 1;
  StoreStats st;
  std::vector<std::string> warnings;
  bool closed = false;

  std::mutex ckpt_mu;
  std::mutex probe_mu;  // one probe of failed folders at a time; taken before ckpt_mu and mu
  std::chrono::steady_clock::time_point last_ckpt = std::chrono::steady_clock::now();  // mu
  /// A slab's journal ring is half full (or scanning): checkpoint after the batch (mu).
  bool journal_wants_ckpt = false;

  std::mutex qmu;
  std::condition_variable qcv;  // the queue, stopping, and close_finished (qmu)
  std::deque<Job> queue;
  bool stopping = false;
  /// Batch threads not yet out of run_jobs (qmu).
  std::size_t running = 0;
  /// close() came from a batch thread (a done-callback): the last thread out finishes it (qmu).
  bool close_deferred = false;
  /// finish_close() is done: the checkpoint written, the folders unlocked (qmu).
  bool close_finished = false;
  /// Joined by close(), or detached by a close() from a batch thread. Each thread holds a
  /// shared_ptr to this Impl, so that it outlives them: the Store's own reference may go first.
  std::vector<std::thread> threads;

  explicit Impl(const StoreOptions& o) : opt(o), model(o.folders.size(), o.high_watermark, o.low_watermark) {}

  // -- store.cpp: batch threads and close --
  /// Starts the batch threads, each holding `self` (this Impl).
  void start_threads(const std::shared_ptr<Impl>& self);
  /// After the batch threads are gone: the final checkpoint, slabs closed, folders unlocked,
  /// the engine destroyed; close_finished set. Throws the checkpoint's error.
  void finish_close();
  /// Queues a batch; refused once close() began (its threads may be gone).
  void enqueue(Job job);
  void run_jobs();
  /// Throws ForkedHandle in a forked child, InvalidArgument after close().
  void check_usable() const;

  // -- batch_io.cpp --
  /// A put batch: its pages that failed because their folder's I/O failed (that folder is now
  /// failed) are put again, to the next healthy folder, until none is left.
  std::vector<bool> put_batch(Job& job, internal::DeviceScratch& scratch);
  std::vector<bool> do_put(Job& job, internal::DeviceScratch& scratch, std::vector<bool>* io_failed);
  std::vector<bool> do_get(Job& job, internal::DeviceScratch& scratch);

  // -- recovery.cpp --
  void open();
  /// Before anything is made or locked: every folder's kv.meta against the options (page_bytes,
  /// fingerprint unless clear_on_mismatch); a folder with none needs a capacity share (> 0)
  /// its file system has free. Throws InvalidArgument naming the folder.
  void check_layouts(std::uint64_t share);
  void open_folder(std::uint32_t fi, std::uint64_t share);
  struct Candidate {
    std::uint32_t folder, slot;
    std::uint64_t gen, len, tick;
    std::uint32_t crc;
    bool listed;         ///< the folder's checkpoint lists it (its put completed before that checkpoint)
    bool whole = false;  ///< its header and page were read and are whole (journal_open)
  };
  /// Reads every slot header of folder fi; appends its live candidates by key.
  void scan_folder(std::uint32_t fi, std::unordered_map<std::string, std::vector<Candidate>>* found);
  /// Per candidate, whether its slot's data matches its CRC (read through the handle, several
  /// at once).
  std::vector<char> data_matches(const std::vector<const Candidate*>& cands);

  // -- journal.cpp --
  /// Starts the journal writes of a put batch (records, or the head), reserving ring blocks
  /// under mu; a write that cannot start fails its pages when finish() is called.
  void journal_write(internal::JournalWrites& jw);
  /// Folder fi's checkpoint of bound `bound` is durable: frees the ring blocks it covers (mu).
  void journal_checkpointed(std::uint32_t fi, std::uint64_t bound);
  /// Open of folder fi from its format-2 checkpoint and its journal: the checkpoint's pages and
  /// the whole pages of the slots the journal lists above the bound go into *found (the
  /// checkpoint's keys moved there). false (nothing added) when the journal is incomplete: the
  /// caller scans every header.
  bool journal_open(std::uint32_t fi, internal::Ckpt& ck,
                    std::unordered_map<std::string, std::vector<Candidate>>* found);
  /// Folder fi's journal state at open: every ring block free; `scan` after a full scan (the
  /// heads say "scan" until a checkpoint covers generation `upto`).
  void journal_reset(std::uint32_t fi, bool scan, std::uint64_t upto);
  /// Writes the heads of a new folder ("normal") and syncs each slab.
  void journal_create(std::uint32_t fi);
  /// At close, after the last checkpoint (no batch left): the heads that checkpoint turned
  /// back to "normal" are written (synced), so that the next open needs no scan. A failure
  /// leaves "scan" on the drive (a scan at the next open).
  void journal_close() noexcept;

  // -- probe.cpp --
  /// Marks folder fi failed (mu held): counts the error, queues a warning the first time and
  /// drops its pages.
  void fail_folder(std::uint32_t fi, int err, const std::string& what);
  /// After a batch: probes the folders failed for at least retry_failed_after, unless another
  /// thread is probing.
  void maybe_retry_failed();
  /// Probes the failed folders (all, or those failed at least retry_failed_after ago); returns
  /// how many came back. probe_mu held, mu not.
  std::size_t retry_failed(bool all);
  bool probe(std::uint32_t fi);

  // -- checkpoint.cpp --
  void maybe_checkpoint();
  /// The generation bound of a checkpoint taken now: below every put in flight (mu held).
  [[nodiscard]] std::uint64_t checkpoint_bound() const {
    return inflight_gens.empty() ? next_gen - 1 : *inflight_gens.begin() - 1;
  }
  /// Whether a checkpoint taken now covers every page dropped so far: its bound is at or
  /// above SlotModel::dropped_max_gen() (mu held). Not while a put that took its generation
  /// before a dropped page's is still in flight.
  [[nodiscard]] bool covers_drops() const { return checkpoint_bound() >= model.dropped_max_gen(); }
  /// Writes every folder's checkpoint but the failed ones' (ckpt_mu held, mu not). `periodic`:
  /// only if it covers every drop (covers_drops); otherwise nothing is written and the index
  /// stays dirty, for the next try (a periodic checkpoint that did not make a removal durable
  /// would break "removals are durable at the next checkpoint").
  void write_checkpoint(bool periodic = false);
  /// Writes folder fi's checkpoint, as of now (ckpt_mu held, mu not); false, writing nothing,
  /// when it would not cover every drop (covers_drops): the probe tries again later.
  bool write_folder_checkpoint(std::uint32_t fi);
  /// Folder fi's checkpoint bytes with generation bound `bound`, its slots read a slice at a
  /// time under mu; nullopt when the folder is failed (mu not held).
  std::optional<std::vector<unsigned char>> snapshot_folder(std::uint32_t fi, std::uint64_t bound);
  /// Waits until every put that took its generation before the call has committed or failed
  /// (lk holds mu).
  void wait_for_earlier_puts(std::unique_lock<std::mutex>& lk);
  /// checkpoint() and clear(): the barrier above, then the checkpoint; throws when every
  /// folder has failed (nothing was written, nothing is durable).
  void durable_checkpoint();

  // -- failed_list.cpp --
  /// At open, before any scan: every folder's failed.list, into the folders' stale_floor.
  void read_failed_lists();
  /// After a checkpoint (ckpt_mu held, mu not): the folders failed now, to each healthy one.
  void write_failed_lists();
};

}  // namespace deepio::kv
