// `_deepio.File`: the engine's file object (detail::open_file) behind deepio.File, with the
// bookkeeping deepio.File needs for close() and fsync() kept here, so that a pread/pwrite from
// Python is one call into the binding (submission, tracking, close protocol) and nothing more.
//
// Protocol (every member below is used with the GIL held; the GIL is the lock):
//  * submit()/submit_ranges() refuse (ValueError) once the file is closed or closing; otherwise
//    they count themselves as a user of the file for the duration of the submission (which
//    releases the GIL), then track the operation and stop being a user.
//  * Tracking: the operations not yet seen done, in submission order, and the done ones
//    holding a failure nobody retrieved (Op::unobserved_failure). The done ones at the front
//    leave at each submission; a full pass runs only when the list doubled since the last
//    one, so each operation costs O(1) however many are running.
//  * begin_close(): marks the file closing (new calls refused), waits until no submission is
//    under way (GIL released between checks), and returns true; false when the file is closed
//    already or another close() is under way (this one then waits for it to finish).
//    drain() then waits for every tracked operation and returns the unretrieved failures
//    (each marked retrieved: raised once); close() drops this hold on the descriptors (they
//    close once no operation on the file runs). Between begin_close() and close() nobody
//    submits: the tracked operations are all there are.
//  * Fork: the tracked operations belong to the process that submitted them (their workers
//    are there). In a forked child the first call forgets them, the count of users and the
//    closing mark; the parent's workers finish and report them.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common.hpp"
#include "engine/binding.hpp"
#include "platform/process.hpp"

namespace deepio::py {

class Op;
class PyHandle;

class PyFile {
 public:
  explicit PyFile(std::shared_ptr<detail::SharedFile> file) noexcept
      : file_(std::move(file)), fd_(detail::file_fd(*file_)), direct_(detail::file_direct(*file_)) {}
  PyFile(const PyFile&) = delete;
  PyFile& operator=(const PyFile&) = delete;

  /// The file object; ValueError once closed.
  [[nodiscard]] std::shared_ptr<detail::SharedFile> get() const {
    if (!file_) throw nb::value_error("I/O operation on a closed file");
    return file_;
  }
  [[nodiscard]] int fd() const noexcept { return file_ ? fd_ : -1; }
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  [[nodiscard]] bool closed() const noexcept { return !file_; }
  /// Drops this hold on the descriptors (see the protocol above).
  void close() noexcept { file_.reset(); }

  /// One read or write through `handle` (a _deepio.Handle), tracked; returns its _deepio.Op
  /// (made in place: one Python object, no shared_ptr or keep-alive). ValueError once closed
  /// or closing; the engine's OSError for a refused submission.
  nb::object submit(nb::handle handle, bool write, nb::handle buffer, std::int64_t file_offset);
  /// One operation over many ranges (Handle.submit_ranges with future=True), tracked.
  nb::object submit_ranges(nb::handle handle, bool write, nb::handle buffer, nb::handle file_offsets, nb::handle sizes,
                           nb::handle buffer_offsets);
  /// Counts a call using the descriptor (size, truncate, fsync) until leave(); returns the
  /// descriptor. ValueError once closed or closing.
  int enter();
  void leave() noexcept;
  bool begin_close();
  /// Waits (GIL released, Ctrl-C honoured) for every tracked operation; returns the failures
  /// nobody retrieved as exceptions, marking them retrieved.
  nb::list drain();
  /// Tracked operations: (not yet seen done, done with an unretrieved failure). For tests.
  [[nodiscard]] std::pair<std::size_t, std::size_t> tracked() const { return {ops_.size(), failed_.size()}; }
#ifdef DEEPIO_TEST_HOOKS
  /// Tracked operations looked at by track() and prune() since the file opened (test builds
  /// only): the work that tracking costs, which tests count instead of timing it.
  [[nodiscard]] std::uint64_t visits() const noexcept { return visits_; }
#endif

 private:
  static constexpr std::size_t kPruneMin = 64;

  void adopt();
  void check_usable() const;
  void track(nb::object op);
  void settle(nb::object op);
  void prune();
  /// Counts `n` tracked operations looked at (test builds only; nothing otherwise).
  void visited([[maybe_unused]] std::size_t n) noexcept {
#ifdef DEEPIO_TEST_HOOKS
    visits_ += n;
#endif
  }
  /// Runs `submit` (returning the Op) as a user of the file, then tracks its Op.
  template <class Submit>
  nb::object tracked_submit(Submit&& submit);

  std::shared_ptr<detail::SharedFile> file_;
  int fd_;
  bool direct_;
  detail::ProcessStamp stamp_;  // the process whose engine runs the tracked operations
  // _deepio.Op objects (references, dropped with the GIL like every member here).
  std::deque<nb::object> ops_;
  std::vector<nb::object> failed_;
  std::size_t prune_at_ = kPruneMin;
  int users_ = 0;
  bool closing_ = false;
#ifdef DEEPIO_TEST_HOOKS
  std::uint64_t visits_ = 0;
#endif
};

/// Registers _deepio.File.
void init_file(nb::module_& m);

}  // namespace deepio::py
