// A read-only look at a deepio.kv store's folder (`deepio info --kv`): its layout, capacity,
// pages, free slots and last checkpoint, and whether a store holds it now. Reads kv.meta,
// index.ckpt and (with scan) every slot header with plain reads; never takes the folder's lock,
// never writes: safe while a server runs the store. What it reports of a running store is as of
// the files on disk (the last checkpoint, and the headers written so far).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "deepio/export.hpp"

namespace deepio::kv {

struct FolderReport {
  std::string folder;
  /// Empty when the folder holds a store whose kv.meta reads whole; else what is wrong (no
  /// kv.meta: not a store; unreadable; torn). The fields below are then mostly zero.
  std::string problem;
  std::uint32_t meta_format = 0;  ///< kv.meta format (1 or 2)
  std::uint64_t page_bytes = 0;
  std::uint64_t slot_bytes = 0;  ///< header + page, rounded to 4 KiB
  std::uint64_t slots = 0;
  std::uint64_t slabs = 0;           ///< slab files the layout has
  std::uint64_t capacity_bytes = 0;  ///< slots x page_bytes
  std::uint64_t disk_bytes = 0;      ///< what the slab files take on disk
  std::string fingerprint;
  std::uint64_t generation_floor = 0;
  bool checkpoint = false;  ///< index.ckpt is there and whole
  std::string checkpoint_problem;
  double checkpoint_age_seconds = 0;   ///< since index.ckpt was written
  std::uint64_t checkpoint_pages = 0;  ///< pages the checkpoint lists
  std::uint64_t checkpoint_bound = 0;
  bool scanned = false;                  ///< scan asked for, and every header read
  std::uint64_t pages = 0;               ///< live pages: by the scan, else the checkpoint's
  std::uint64_t free_slots = 0;          ///< slots - pages
  std::uint64_t unreadable_headers = 0;  ///< scan: headers that are not whole (never written, torn)
  /// The process holding the folder's lock (a store has it open), from /proc/locks.
  std::optional<std::int64_t> held_by_pid;
};

/// Looks at one folder; `scan` also reads every slot header (as a reopen does: O(slots)
/// reads of 4 KiB) to count the live pages, including those put after the last checkpoint.
/// Never throws for what it finds (FolderReport::problem); throws std::bad_alloc only.
DEEPIO_API FolderReport inspect_folder(const std::string& folder, bool scan = false);

}  // namespace deepio::kv
