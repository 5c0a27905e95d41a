// deepio::kv::Store: a KV-cache page store on local NVMe drives (docs/kv.md, "The store").
//
// Layout: one folder per drive; in each, a preallocated slab file of fixed slots (at most 4
// files: StoreOptions::slab_bytes). A slot is a 4 KiB header (magic, format version, key,
// page length, CRC-32C of the page, generation, the header's own CRC-32C) followed by
// page_bytes rounded up to 4 KiB. Every byte moves through one deepio::Handle, on slab files
// opened once (deepio::File, O_DIRECT where the file system allows it). New pages go to a
// folder chosen by key hash; a failed or full folder's share goes to the next healthy one; a
// failed folder is probed now and then and comes back when it works again.
//
// Guarantees:
//  - A get reads only the page and returns true only when the stored length equals the length
//    asked for and the CRC-32C of the bytes read matches the one the index holds for the page
//    (the put's, or its header's at open): a torn, stale or overwritten slot is a miss, never
//    wrong bytes (on a miss the destination's contents are unspecified).
//  - A put completes (its BatchFuture reports done) once data and header are on stable storage:
//    both written without a wait between, then, after every write completed, one fdatasync
//    per slab file the batch touched (one per folder with slab_bytes 0). A put of an existing
//    key writes a new slot; the index switches to it only once it is durable; the old slot is
//    freed after that, and not while a get has it pinned.
//  - Reopen after a crash: every put whose future completed is present (unless evicted or
//    removed), and no key returns a torn page. remove() and evictions are durable at the next
//    checkpoint (periodic, checkpoint(), close): after a crash before it a removed key may
//    come back, whole. clear() is durable when it returns.
//  - Space: puts never fail for space (the least recently used pages are evicted between the
//    high and low watermarks); only a page larger than page_bytes (false), failed writes on
//    every folder (false) or every slot pinned by gets (false) fails a put. A page whose
//    folder's write failed is put again on the next healthy folder.
//  - A folder whose I/O fails (EIO, ENOSPC, gone) is marked failed: its pages are dropped (misses
//    from then on, for good), new pages go elsewhere, Stats names it (errno, count) and a
//    warning is queued (take_warnings()).
//  - A failed folder comes back once it works again: after a batch that finds its last error at
//    least retry_failed_after old (or at retry_failed()), one thread probes it, without the
//    store's lock: in each slab a zeroed 4 KiB block is written with fsync over the header of a
//    free slot (a page already dropped) and read back, through the slab files the pages use;
//    then its checkpoint is rewritten, listing none of the dropped pages (so that a crash after
//    the recovery cannot bring them back). Success: it takes new pages again, a "recovered"
//    warning is queued and FolderStats::recoveries counts it. Failure: it stays failed, the
//    error is counted and the wait starts again. Slots pinned by gets in flight are left alone
//    until those gets finish. A folder that could not be opened at all waits for a reopen.
//
// Device memory: a segment may be CUDA device memory (recognised as the engine recognises it:
// cuPointerGetAttribute, asked only once the process has loaded the driver; managed memory is
// host memory). The CRC-32C needs host bytes, so a page with a device segment moves through
// one of device_pages_in_flight page-locked host buffers of the batch thread, copied by the
// engine's CUDA stager (the page-locked arena registered with cuMemHostRegister): a put copies
// device→host, computes the CRC there and writes from there (while the next page is copied); a
// get reads into a buffer, verifies it, and copies host→device only a page that verified (a
// miss leaves the device memory as it was); the future completes after those copies finished.
// A failed driver copy makes that page false (counted in StoreStats::device_copy_errors), not a
// folder failure, and a get's page stays stored. The copies follow the caller's CUDA stream
// named by BatchOptions::stream (an event recorded at the call); without one, finish the work
// that writes (put) or reads (get) the memory before the call.
// cuFile (GPUDirect Storage) is not used: it would need the bytes read twice to be checked.
//
// Thread safety: every member function may be called from several threads at once, except
// close() (call it after the last call of other threads). A Store may be closed or destroyed
// on any thread, its own batch threads included (from a BatchFuture::on_done callback): there
// the close is deferred (see close()), never a thread joining itself.
// Fork: a Store belongs to the process that made it. In a forked child every call of a Store
// or of its BatchFutures (stats(), take_warnings(), close() and on_done() included) throws
// deepio::ForkedHandle before taking any lock, destroying the Store there returns at once and
// releases nothing of the parent's (its memory is left), and the child does not hold the
// folders' kv.lock (replaced by /dev/null in the child at the fork): once the parent closes
// the store, another may open the folders while the child lives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deepio/error.hpp"
#include "deepio/export.hpp"
#include "deepio/options.hpp"

namespace deepio::kv {

/// The longest key accepted, in bytes.
inline constexpr std::size_t kMaxKeyBytes = 1024;

struct StoreOptions {
  /// One folder per drive; created if missing.
  std::vector<std::string> folders;
  /// Total capacity over all folders, split evenly; the folders' space is allocated at once
  /// (fallocate) and written with zeros once, when a folder's store is made, so that no put's
  /// sync commits the file system's journal for a slot's first write (docs/kv.md "Cost per
  /// page"). Needed to make a store: a folder that holds none (no kv.meta) with
  /// capacity_bytes 0 throws deepio::InvalidArgument naming it, before anything is made, so
  /// that a drive that failed to mount never has its store made on the file system below it.
  /// New folders' shares larger than their file system's free space (statvfs f_bavail, plus
  /// slab files already there; folders on one file system added up) throw
  /// deepio::InvalidArgument naming the folder and the sizes.
  /// The layout (slots per folder, page_bytes) is fixed when a folder's store is made and kept
  /// by later opens, whatever these say: reopen an existing store with 0.
  std::uint64_t capacity_bytes = 0;
  /// What the pages' bytes mean, for the backend that stores them: model, KV layout, dtype,
  /// page shape, tensor-parallel rank and size... Opaque to the store (compared byte for byte),
  /// at most 4 KiB. Written in each folder's kv.meta when its store is made (a store made by
  /// an older deepio has the fingerprint ""). Opening a store made with another fingerprint
  /// throws deepio::InvalidArgument naming the folder and both fingerprints, before anything
  /// is touched, unless clear_on_mismatch.
  std::string fingerprint;
  /// With another fingerprint on a folder: drop every page there, durably (one atomic replace
  /// of kv.meta holding the new fingerprint; a crash at any instant leaves either the old
  /// store, which the next open meets as a mismatch again, or none of its pages), and queue a
  /// warning naming both fingerprints (take_warnings()). No page written under one fingerprint
  /// is ever a hit under another.
  bool clear_on_mismatch = false;
  /// The largest page; a slot holds 4 KiB of header plus this rounded up to 4 KiB.
  std::size_t page_bytes = std::size_t{2} << 20;  ///< at most 4 GiB - 1
  /// Eviction starts when a folder's used slots exceed high_watermark of its slots (or none is
  /// free) and frees least recently used pages down to low_watermark.
  double high_watermark = 0.95;
  double low_watermark = 0.85;
  /// How a new folder's slots are split over slab files: 0 (the default), one file per
  /// folder; otherwise files of slab_bytes (max(1, slab_bytes / slot size) slots each), but
  /// never more than 4 per folder (larger slabs when the folder's share needs it). Each slab
  /// costs two descriptors (O_DIRECT and buffered) and the folder one more (kv.lock): 3 to 9
  /// per folder, whatever its size (docs/kv.md, "Descriptors"). Kept by later opens: a folder
  /// made by an older deepio (1 GiB slabs, any number) is read with its slabs as they are.
  /// A folder over 16 TiB on ext4 (its largest file) needs slab_bytes.
  std::uint64_t slab_bytes = 0;
  /// A checkpoint of the index is written at close and, when the index changed, after a batch
  /// that finds this long passed since the last one; zero: only at close, checkpoint(), and
  /// after a batch that left a slab's slot journal half full (its ring must not overwrite a
  /// record no durable checkpoint covers; docs/kv.md "Restart").
  std::chrono::milliseconds checkpoint_interval{60000};
  /// A failed folder is probed after a batch that finds its last error (failed operation or
  /// probe) at least this old; zero (or negative): only by Store::retry_failed().
  std::chrono::milliseconds retry_failed_after{30000};
  /// Threads that run batches (each a whole put or get: CRCs, submission, waiting, commit).
  std::size_t batch_threads = 4;
  /// Device (CUDA) pages: each batch thread moves them through this many page-sized,
  /// page-locked host buffers (made on its first device page; at least 1), so that many device
  /// pages of a batch are in flight at once. Host memory never uses them.
  std::size_t device_pages_in_flight = 4;
  /// The engine's options (queue depth, workers, backend).
  HandleOptions handle{.block_size = std::size_t{1} << 20, .queue_depth = 128, .intra_op_parallelism = 2};
};

/// One piece of caller memory of a page (scatter/gather): the page is its segments in order.
struct Segment {
  void* data = nullptr;
  std::size_t nbytes = 0;
};

/// Options of one put or get batch.
struct BatchOptions {
  /// Device pages: the CUDA stream (a CUstream as an integer; 0 or 1 the legacy default stream,
  /// 2 the per-thread one; of the device's primary context, as torch's streams are) whose work
  /// queued before the call the batch's copies must come after, as OpOptions::stream: an event
  /// is recorded on it at the call, on the calling thread, and the store's copy stream waits
  /// for it on the device (no thread waits). Unset: nothing is ordered (finish that work
  /// before the call). Ignored for host pages.
  std::optional<std::uintptr_t> stream;
};

/// The completion of a put or get batch: one bool per key. Copyable; copies share the state.
class DEEPIO_API BatchFuture {
 public:
  BatchFuture() = default;
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  [[nodiscard]] bool done() const;
  void wait() const;
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds timeout) const;
  /// Waits, then returns the per-key results (true: stored durably / found whole).
  const std::vector<bool>& get() const;
  /// Calls fn once, when done: at once on this thread if already done, else on the store's
  /// batch thread that completes it, with no store lock held. fn must not throw. fn may call
  /// Store::close() or destroy the Store (drop its last reference): the close is then
  /// deferred to the batch threads' exit (Store::close()). Waiters are woken first: a
  /// callback may still be running, or not yet started, when wait() returns. Throws
  /// deepio::ForkedHandle in a forked child (fn is not kept).
  void on_done(std::function<void()> fn) const;

  struct State;

 private:
  friend class Store;
  explicit BatchFuture(std::shared_ptr<State> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

struct FolderStats {
  std::string path;
  bool failed = false;
  std::uint64_t slots = 0;
  std::uint64_t used = 0;
  std::uint64_t errors = 0;      ///< failed operations and probes, over the store's life
  std::uint64_t recoveries = 0;  ///< times a probe brought the folder back
  int last_errno = 0;            ///< of the last error (kept after a recovery)
  std::string last_error;
};

struct StoreStats {
  std::size_t page_bytes = 0;
  std::size_t slot_bytes = 0;
  std::uint64_t capacity_bytes = 0;
  std::uint64_t pages = 0;
  std::uint64_t puts = 0, puts_failed = 0;
  std::uint64_t gets = 0, hits = 0, misses = 0;
  std::uint64_t corrupt = 0;  ///< gets whose bytes read did not match the page's CRC-32C
  std::uint64_t evictions = 0, removes = 0;
  std::uint64_t bytes_written = 0, bytes_read = 0;
  std::uint64_t checkpoints = 0;
  std::uint64_t recovered_pages = 0;     ///< pages found by the last open
  std::uint64_t device_pages = 0;        ///< pages of puts and gets that were in device memory
  std::uint64_t device_copy_errors = 0;  ///< of those, pages failed (false) by a device copy
  /// Engine operations that puts and gets started (reads, writes and syncs): a batch's host
  /// pages go as one ranged operation per slab and handle block (docs/kv.md "Cost per page").
  std::uint64_t io_ops = 0;
  /// Bytes the engine moved through io_uring registered ("fixed") buffers: pages of a pool
  /// the Python binding registered (deepio.kv.Store.register adopts a host pool of up to
  /// 8 GiB), or of deepio's locked allocations. 0 with another backend.
  std::uint64_t bytes_fixed = 0;
  double open_seconds = 0;  ///< how long the last open took (checkpoint, journal, reads)
  /// Slot headers the last open read: with the journal, the slots put since the last
  /// checkpoint (none after a clean close); without it (a store made before, or a journal
  /// that could not be trusted), each slot's once.
  std::uint64_t open_headers_read = 0;
  std::uint64_t open_pages_read = 0;  ///< pages the last open read to check (not vouched for)
  /// Put batches queued and not yet started (gets are started first), their pages and bytes:
  /// puts coming faster than the drives take them show here (back-pressure for the caller).
  std::uint64_t pending_puts = 0, pending_put_pages = 0, pending_put_bytes = 0;
  std::vector<FolderStats> folders;
};

class DEEPIO_API Store {
 public:
  /// Opens or creates the store. Throws deepio::InvalidArgument for bad options (no folder,
  /// page_bytes 0, watermarks out of order, a fingerprint over 4 KiB, an existing layout with
  /// another page_bytes, or another fingerprint without clear_on_mismatch, a folder holding no
  /// store with capacity_bytes 0, or a share over its free space; see StoreOptions) and
  /// deepio::Error when a folder cannot be created or its slabs cannot be allocated, and
  /// deepio::Error EBUSY when another open store (in this process or another) holds one of the
  /// folders (each folder's kv.lock is held with flock until close()).
  explicit Store(const StoreOptions& options);
  /// close(); never throws.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Stores page i as the concatenation of segments[i] under keys[i]. Returns at once; the
  /// caller keeps every segment's memory valid and unchanged until the future is done.
  /// Throws deepio::InvalidArgument (naming the index) for a key empty or over kMaxKeyBytes,
  /// or sizes that differ; a page over page_bytes is false in the result.
  /// Throws deepio::Error (EIO, the driver's message) when options.stream is set and the
  /// event cannot be recorded on it.
  BatchFuture put(std::span<const std::string_view> keys, std::span<const std::vector<Segment>> segments,
                  const BatchOptions& options = {});
  /// Fills segments[i] with the page of keys[i]: true where found, its stored length equal
  /// to the sum of segments[i]'s sizes and its checksum matched. Memory valid until done.
  /// options as for put() (the copies to the device wait for the stream's work: a buffer the
  /// producer still reads is not overwritten under it).
  BatchFuture get(std::span<const std::string_view> keys, std::span<const std::vector<Segment>> segments,
                  const BatchOptions& options = {});
  /// Length of the leading run of keys present.
  std::size_t exists(std::span<const std::string_view> keys);
  /// Per key: present.
  std::vector<bool> contains(std::span<const std::string_view> keys);
  /// Removes keys (absent ones are ignored); returns how many were present. Durable at the
  /// next checkpoint (checkpoint(), close(), or the periodic one): a crash before it may bring
  /// a removed page back, whole (it is still that key's page).
  std::size_t remove(std::span<const std::string_view> keys);
  /// Removes every page and returns how many there were; durable when it returns (it ends
  /// with checkpoint()): after a crash none of them comes back. For pages that must not be
  /// served again (SGLang's clear after new weights). A put in flight at the call may commit
  /// after it and stay. A folder failed at the time keeps its pages on the drive; they come
  /// back only if a later open finds that folder readable and its old checkpoint intact.
  std::size_t clear();
  /// Writes the index checkpoint now (temp file, fsync, rename, fsync of the folder), after
  /// waiting for every put in flight that began before the call: every page committed and
  /// every removal made before the call are then durable.
  void checkpoint();
  /// Probes every failed folder now, however recently it failed (as the automatic probe after
  /// retry_failed_after does; see "Guarantees"), and returns how many came back. Waits for a
  /// probe another thread runs. A folder that could not be opened is not probed. Thread-safe;
  /// throws deepio::InvalidArgument after close().
  std::size_t retry_failed();
  /// Counters and per-folder state. Throws deepio::ForkedHandle in a forked child.
  [[nodiscard]] StoreStats stats() const;
  /// Warnings queued since the last call, oldest first: "deepio.kv: folder PATH failed (...)..."
  /// and "deepio.kv: folder PATH recovered". Throws deepio::ForkedHandle in a forked child.
  std::vector<std::string> take_warnings();
  [[nodiscard]] std::size_t page_bytes() const noexcept;
  /// Finishes every batch in flight, writes the checkpoint, closes the slabs and unlocks the
  /// folders; throws the checkpoint's deepio::Error (the store is closed all the same). Later
  /// calls (other than stats(), take_warnings(), close() and destruction) throw
  /// deepio::InvalidArgument. Idempotent: a second close() (or the destructor) waits until the
  /// first one finished, unless it runs on one of the store's batch threads.
  /// From one of the store's own batch threads (a BatchFuture::on_done callback, where the
  /// destructor runs too when the callback held the last reference): returns at once; the
  /// batch threads finish the queued batches and the last one out writes the checkpoint and
  /// unlocks the folders (its errors are lost: nobody is left to tell). Until then, a new Store
  /// over the same folders gets EBUSY. Throws deepio::ForkedHandle in a forked child.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the batch threads (a close from one is deferred)
};

/// CRC-32C (Castagnoli) of data, continuing from crc (0 to start): AVX-512 VPCLMULQDQ
/// folding (1 KiB and more) and SSE4.2 where the CPU has them, a table otherwise. crc32c("123456789") == 0xE3069283.
[[nodiscard]] DEEPIO_API std::uint32_t crc32c(const void* data, std::size_t nbytes, std::uint32_t crc = 0) noexcept;

}  // namespace deepio::kv
