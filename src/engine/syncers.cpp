// The durable-write threads of syncers.hpp: group commit per file, and each descriptor asked
// for the writeback errors it has not seen.
#include "engine/syncers.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

namespace deepio::detail {

void Syncers::post(std::shared_ptr<OpState> op) noexcept {
  struct stat st {};
  const int fd = op->failed() ? -1 : op->sync_fd();
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    run_alone(std::move(op));  // failed (nothing to sync), or no file to group it by
    return;
  }
  const Key key{st.st_dev, st.st_ino};
  bool start = false;
  try {
    std::lock_guard lock(mutex_);
    Group& g = groups_[key];
    g.waiting.push_back(op);
    start = !std::exchange(g.running, true);
  } catch (...) {
    run_alone(std::move(op));  // out of memory: not grouped; a group's own sync covers the others
    return;
  }
  if (!start) return;  // the running sync of this file takes it in its next round
  try {
    pool_.post([this, key] { drain(key); });
  } catch (...) {
    drain(key);  // could not queue it (out of memory): sync here, on the worker
  }
}

void Syncers::run_alone(std::shared_ptr<OpState> op) noexcept {
  try {
    pool_.post([op] { op->run_sync(); });
  } catch (...) {
    op->run_sync();  // could not queue it (out of memory): sync here, on the worker
  }
}

void Syncers::drain(Key key) noexcept {
  for (;;) {
    std::vector<std::shared_ptr<OpState>> round;
    {
      std::lock_guard lock(mutex_);
      auto it = groups_.find(key);
      if (it->second.waiting.empty()) {
        groups_.erase(it);
        return;
      }
      round.swap(it->second.waiting);
    }
    const int err = round.front()->sync_file();
    finish_round(round, err);
  }
}

// One fdatasync wrote the file back for every op of the round, but Linux reports a writeback
// error once to each open file description, and only to those opened before it (errseq): a
// descriptor opened after an error someone has already seen syncs "successfully" while an
// older descriptor's pages were lost. So each other descriptor of the round is asked for the
// errors it has not seen (OpState::unseen_error: no writeback, no cache flush), once, and
// every op of that descriptor gets the answer. When the round's own sync failed, that error
// may be the first descriptor's alone (an older writeback error) or the device's (a failed
// cache flush, which no descriptor records): each other descriptor then syncs itself
// (OpState::sync_file: nothing left to write back, the cache flushed again), so an op whose
// descriptor saw no error and whose flush succeeds completes, and a failing flush still fails
// it. Which op of the round comes first (whose descriptor the round syncs) changes nothing.
void Syncers::finish_round(const std::vector<std::shared_ptr<OpState>>& round, int err) noexcept {
  const int first_fd = round.front()->sync_fd();
  std::vector<std::pair<int, int>> asked;  // (descriptor, its unseen error)
  try {
    asked.reserve(round.size());
  } catch (...) {
    for (const auto& op : round) op->finish_sync(err != 0 ? err : op->sync_file());  // no memory: sync each
    return;
  }
  for (const auto& op : round) {
    int e = err;
    const int fd = op->sync_fd();
    if (fd >= 0 && fd != first_fd) {
      auto it = std::find_if(asked.begin(), asked.end(), [fd](const auto& a) { return a.first == fd; });
      if (it == asked.end()) it = asked.insert(asked.end(), {fd, err == 0 ? op->unseen_error() : op->sync_file()});
      e = it->second;
    }
    op->finish_sync(e);
  }
}

}  // namespace deepio::detail
