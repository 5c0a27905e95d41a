// Syncers: durable writes (OpOptions::fsync). Each op whose blocks are all done is fdatasynced here, on one of
// kSyncThreads threads, then completed. Many files at once on purpose: a journaling file
// system (ext4, xfs) commits the metadata of every file whose sync is waiting in one journal
// transaction and one cache flush, so N concurrent syncs of fresh files cost a few commits
// instead of N. (Without a journal, as on ext4 made with -O ^has_journal, each sync writes its
// file's inode and directory blocks itself and only the parallelism is gained.) Ops of ONE
// file are grouped instead (group commit): while a sync of a file runs, the ops of that file
// that finish meanwhile wait, and one more sync, started after all of their blocks were done,
// covers them all; a batch of 1024 durable writes to one file then costs a handful of
// fdatasync calls, not 1024. The threads sleep in the kernel almost all the time (no CPU cost
// to speak of).
//
// Protocol: post() is called by a worker when an op's last block is done; the op completes
// (finish_sync) once a fdatasync started after that has returned. stop() finishes every op
// posted so far before joining. Errors: each op gets the sync's errno, or the writeback error
// its own descriptor has not seen (finish_round). Thread safety: post() and stop() may be
// called from any thread; groups_ is guarded by mutex_.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/op.hpp"
#include "engine/openers.hpp"

namespace deepio::detail {

/// How many files are synced at once.
inline constexpr std::size_t kSyncThreads = 32;

class Syncers final : public SyncRunner {
 public:
  explicit Syncers(std::size_t n) : pool_(n) {}
  void post(std::shared_ptr<OpState> op) noexcept override;
  void stop() noexcept { pool_.stop(); }

 private:
  struct Key {
    dev_t dev;
    ino_t ino;
    bool operator<(const Key& o) const noexcept { return dev != o.dev ? dev < o.dev : ino < o.ino; }
  };
  struct Group {
    bool running = false;                           // a drain() of this file is under way
    std::vector<std::shared_ptr<OpState>> waiting;  // posted, not yet covered by a sync
  };

  void run_alone(std::shared_ptr<OpState> op) noexcept;
  // Syncs the file of `key` for every op waiting on it, round after round, until none is
  // left. Each op was posted after its blocks were done, so before the round that takes it
  // starts its sync: that one sync covers every op of the round.
  void drain(Key key) noexcept;
  static void finish_round(const std::vector<std::shared_ptr<OpState>>& round, int err) noexcept;

  std::mutex mutex_;
  std::map<Key, Group> groups_;  // guarded by mutex_; a file's entry lives while it has a drain()
  Openers pool_;                 // last: stopped (joined) first, while the groups and the mutex still exist
};

}  // namespace deepio::detail
