// `_deepio.Op`: one operation submitted through deepio.File (wrapped by deepio.Future), or a
// batch's or ranged read's own operation with futures. It owns the operation's Future: waiting
// releases the GIL in slices and checks for signals; a failure nobody asked for is warned about
// when the Op goes (Future's rule in deepio/handle.hpp does the same for a running one).
#pragma once

#include <cstdint>
#include <optional>

#include "common.hpp"

namespace deepio::py {

/// True on an engine thread while it runs a done callback of an Op (PyHandle::shutdown
/// defers an engine's shutdown made there: a worker cannot join itself).
extern thread_local bool t_in_op_callback;

class Op {
 public:
  Op(Future fut, bool write, std::uint64_t offset, std::size_t nbytes)
      : fut_(std::move(fut)), write_(write), offset_(offset), nbytes_(nbytes) {}
  ~Op() {
    // Collect a finished operation now (GIL held) so that its buffer is released at once; a
    // failure nobody retrieved becomes a warning here. A running one is collected by its
    // handle once done, and its failure, if any, reported by the engine when it finishes
    // (Future's rule), as a warning at the next flush_unobserved(). In a forked child the
    // operation is the parent's (done() throws ForkedHandle): it is collected there.
    try {
      if (fut_.done()) {
        try {
          fut_.get();
        } catch (const Error& e) {
          if (!collected_) {
            warn_unobserved(std::string("deepio: a ") + (write_ ? "write" : "read") +
                            " failed and its deepio.Future was dropped before result() or exception(): " + e.what());
          }
        }
      }
    } catch (const ForkedHandle&) {
    }
  }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  bool done() const { return fut_.done(); }

  /// fn(self) once done: at once on this thread if done, else on the engine thread that
  /// completes the operation, with the GIL taken there (while it runs, that thread is marked
  /// t_in_op_callback, so that a handle dropped there is shut down on a thread of its own).
  /// The callback's exceptions are reported as unraisable. Collects nothing.
  void add_done_callback(nb::handle self, nb::object fn);

  bool wait(std::optional<double> timeout);

  /// Waits, then returns the bytes transferred or raises the operation's exception;
  /// TimeoutError when `timeout` passes first.
  std::size_t result(std::optional<double> timeout) {
    ensure_done(timeout);
    collected_ = true;
    try {
      return fut_.get();  // releases the buffer here, with the GIL
    } catch (const Error& e) {
      raise_error(e);
    }
  }

  /// The failure as an exception object, or None (waits like result()).
  nb::object exception(std::optional<double> timeout) {
    ensure_done(timeout);
    collected_ = true;
    try {
      fut_.get();
    } catch (const Error& e) {
      return make_exception(e);
    }
    return nb::none();
  }

  /// For deepio.File's close()/fsync(): the failure of a finished operation whose Future
  /// nobody asked (result()/exception()), as an exception, which marks it asked; else None.
  nb::object take_unobserved() {
    if (collected_ || !fut_.done()) return nb::none();
    try {
      fut_.get();
    } catch (const Error& e) {
      collected_ = true;
      return make_exception(e);
    }
    return nb::none();
  }

  /// A finished operation that failed and whose Future nobody asked (no state change).
  bool unobserved_failure() {
    if (collected_ || !fut_.done()) return false;
    try {
      fut_.get();
    } catch (const Error&) {
      return true;
    }
    return false;
  }

  bool write() const { return write_; }
  bool collected() const { return collected_; }
  std::uint64_t offset() const { return offset_; }
  std::size_t nbytes() const { return nbytes_; }

 private:
  void ensure_done(std::optional<double> timeout);

  Future fut_;
  bool write_;
  std::uint64_t offset_;
  std::size_t nbytes_;
  bool collected_ = false;
};

/// Registers _deepio.Op.
void init_op(nb::module_& m);

}  // namespace deepio::py
