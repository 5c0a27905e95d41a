// Registered ("fixed") files: a file object's descriptors installed in the io_uring workers'
// file tables, and taken out of every table when the file object goes.
//
// Protocol:
//  * A file object (SharedFile, engine_parts.hpp) holds one FixedFile per descriptor it owns.
//    Its operations hand the worker a pointer to it (OpState::fixed_file), which the worker
//    puts in each request whose descriptor it is (Request::fixed_file).
//  * A backend that keeps a table (the io_uring backend: one sparse table per ring) installs
//    the descriptor in a free slot on the first request of that FixedFile reaching its worker,
//    records (table, slot) in the FixedFile (add(), from that worker thread), and sends this
//    and every later request of it through the slot. A full table, or a registration the
//    kernel refuses, leaves the requests on the plain descriptor; a kernel without sparse
//    tables leaves every request there.
//  * A registered file holds a reference to the open file, as a descriptor does: an unlinked
//    file's blocks stay allocated while any ring holds it. So when the FixedFile goes -- with
//    its file object, after the last operation on it finished (every operation holds the file
//    object), before its descriptors close -- ~FixedFile takes it out of every table that
//    installed it (FileTable::remove), on the thread that drops the file object, at once: the
//    file is released when the last descriptor closes, as it would be without registration.
//    No request of the file can be in a ring then, so its slots are free for other files.
//  * A table outlives its ring: once the backend has shut its ring down, remove() does nothing
//    (closing the ring dropped every registration).
//  * Fork: a table belongs to the process that made it. In a forked child, ~FixedFile leaves
//    the parent's tables alone (the child shares the parent's rings: taking a slot out there
//    would take it from the parent, and a lock a parent thread held at the fork stays held).
//
// Thread safety: add() may be called by several workers at once (a lock-free list, so no lock
// can be inherited held by a forked child); remove() may be called from any thread (the table
// locks itself against its worker); ~FixedFile runs when nothing else refers to the FixedFile.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace deepio::detail {

/// A ring's table of registered files, as the file objects it holds see it (implemented by
/// the io_uring backend).
class FileTable {
 public:
  virtual ~FileTable() = default;
  /// Takes `slot` out of the table and frees it for another file (nothing once the ring is
  /// shut down, or in a process other than the table's). Called once per installation, by
  /// ~FixedFile, when no request of the file is in the ring. Thread-safe, never throws.
  virtual void remove(unsigned slot) noexcept = 0;

 protected:
  FileTable() = default;
  FileTable(const FileTable&) = default;
  FileTable& operator=(const FileTable&) = default;
};

class FixedFile {
 public:
  FixedFile() noexcept;
  /// Takes the descriptor out of every table of this process that installed it.
  ~FixedFile();
  FixedFile(const FixedFile&) = delete;
  FixedFile& operator=(const FixedFile&) = delete;

  /// The descriptor; set once, before any operation can see the FixedFile. -1: none.
  void set_fd(int fd) noexcept { fd_ = fd; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Unique in the process, never reused: a table's key for it.
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  /// Records that `table` installed the descriptor in `slot` (from the table's worker).
  void add(std::shared_ptr<FileTable> table, unsigned slot);

 private:
  struct Entry {
    std::weak_ptr<FileTable> table;
    unsigned slot = 0;
    Entry* next = nullptr;
  };
  int fd_ = -1;
  const std::uint64_t id_;
  std::atomic<Entry*> entries_{nullptr};  // pushed by add(); walked and freed by the destructor
};

/// Test hooks (tests/cpp/test_fixed_files.cpp), process-wide:
/// The number of slots a table made from now on gets (0: the default, 1024 or the soft
/// RLIMIT_NOFILE if lower).
void set_file_table_slots(unsigned slots) noexcept;
[[nodiscard]] unsigned file_table_slots() noexcept;
/// Descriptors installed in the tables of this process now (installations minus removals,
/// counting a table's entries as removed when its ring shuts down).
[[nodiscard]] std::int64_t fixed_files_installed() noexcept;
/// For the tables: count an installation (+1) or removals (-n).
void count_fixed_files(std::int64_t delta) noexcept;

}  // namespace deepio::detail
