#include "file.hpp"

#include <chrono>
#include <thread>
#include <utility>

#include <nanobind/stl/pair.h>

#include "handle.hpp"
#include "op.hpp"

namespace deepio::py {

namespace {
// A submission holds the file for microseconds (the GIL released only around the engine's
// queueing); a second close() waits for a first one's drain. Neither is worth a condition
// variable beside the GIL: the waiter checks again after this long without the GIL.
constexpr auto kPoll = std::chrono::microseconds(200);

// Sleeps kPoll with the GIL released; raises what a signal handler raised (Ctrl-C).
void pause_released() {
  {
    nb::gil_scoped_release release;
    std::this_thread::sleep_for(kPoll);
  }
  if (PyErr_CheckSignals() != 0) throw nb::python_error();
}

PyHandle& handle_arg(nb::handle handle) {
  PyHandle* h = nullptr;
  if (!nb::try_cast<PyHandle*>(handle, h) || h == nullptr) {
    throw nb::type_error(("handle must be a _deepio.Handle, not " + py_type_name(handle)).c_str());
  }
  return *h;
}

// Ends a submission's use of the file whatever happens.
struct Leave {
  PyFile* file;
  ~Leave() { file->leave(); }
};

Op& op_of(nb::handle obj) { return *nb::inst_ptr<Op>(obj); }
}  // namespace

void PyFile::adopt() {
  if (stamp_.here()) return;
  // A forked child: the parent's operations and calls (see the protocol in file.hpp).
  // ~Op of a parent's operation does nothing here (done() throws ForkedHandle, caught).
  ops_.clear();
  failed_.clear();
  users_ = 0;
  closing_ = false;
  prune_at_ = kPruneMin;
  stamp_ = detail::ProcessStamp();
}

void PyFile::check_usable() const {
  if (!file_ || closing_) throw nb::value_error("I/O operation on a closed file");
}

int PyFile::enter() {
  adopt();
  check_usable();
  ++users_;
  return fd_;
}

void PyFile::leave() noexcept {
  if (users_ > 0) --users_;  // (0 only after a fork forgot the parent's calls)
}

template <class Submit>
nb::object PyFile::tracked_submit(Submit&& submit) {
  enter();
  Leave leave{this};
  nb::object op = submit();
  // Tracked before this call stops being a user: a close() that waited for it waits for it.
  track(op);
  return op;
}

nb::object PyFile::submit(nb::handle handle, bool write, nb::handle buffer, std::int64_t file_offset) {
  PyHandle& h = handle_arg(handle);
  return tracked_submit([&] {
    std::size_t nbytes = 0;
    Future fut = h.submit_detached(write, buffer, nb::find(this), file_offset, &nbytes);
    // The Op made in place in its Python object. Should that allocation fail, the detached
    // operation runs on, its failure (if any) reported by the engine as a dropped future's.
    nb::object obj = nb::inst_alloc(nb::type<Op>());
    new (nb::inst_ptr<Op>(obj)) Op(std::move(fut), write, static_cast<std::uint64_t>(file_offset), nbytes);
    nb::inst_mark_ready(obj);
    return obj;
  });
}

nb::object PyFile::submit_ranges(nb::handle handle, bool write, nb::handle buffer, nb::handle file_offsets,
                                 nb::handle sizes, nb::handle buffer_offsets) {
  PyHandle& h = handle_arg(handle);
  return tracked_submit([&] {
    return h.submit_ranges(write, buffer, nb::find(this), file_offsets, sizes, buffer_offsets,
                           /*fsync=*/false, /*future=*/true);
  });
}

void PyFile::track(nb::object op) {
  while (!ops_.empty()) {
    visited(1);
    if (!op_of(ops_.front()).done()) break;
    nb::object front = std::move(ops_.front());
    ops_.pop_front();
    settle(std::move(front));
  }
  ops_.push_back(std::move(op));
  if (ops_.size() > prune_at_ || failed_.size() > prune_at_) prune();
}

void PyFile::settle(nb::object op) {
  if (op_of(op).unobserved_failure()) failed_.push_back(std::move(op));
}

void PyFile::prune() {
  visited(ops_.size() + failed_.size());
  std::deque<nb::object> kept;
  for (auto& op : ops_) {
    if (op_of(op).done()) {
      settle(std::move(op));
    } else {
      kept.push_back(std::move(op));
    }
  }
  ops_.swap(kept);
  kept.clear();  // the done operations nobody needs: collected now, with the GIL
  std::erase_if(failed_, [](const nb::object& op) { return !op_of(op).unobserved_failure(); });
  prune_at_ = std::max(kPruneMin, 2 * std::max(ops_.size(), failed_.size()));
}

bool PyFile::begin_close() {
  adopt();
  if (closing_) {
    while (file_) pause_released();  // another close() is under way: returns once it closed
    return false;
  }
  if (!file_) return false;
  closing_ = true;
  try {
    while (users_ > 0) pause_released();
  } catch (...) {  // Ctrl-C: the file stays open and usable, as it was
    closing_ = false;
    throw;
  }
  return true;
}

nb::list PyFile::drain() {
  adopt();
  std::vector<nb::object> ops(ops_.begin(), ops_.end());
  ops.insert(ops.end(), failed_.begin(), failed_.end());
  for (auto& op : ops) op_of(op).wait(std::nullopt);
  nb::list errors;
  for (auto& op : ops) {
    nb::object e = op_of(op).take_unobserved();
    if (!e.is_none()) errors.append(e);
  }
  ops.clear();
  prune();
  return errors;
}

void init_file(nb::module_& m) {
  nb::class_<PyFile>(m, "File",
                     "A file opened once by the engine (deepio.File's); its operations go through any handle.")
      .def_prop_ro("fd", &PyFile::fd, "The descriptor (-1 once closed); the File owns it.")
      .def_prop_ro("direct", &PyFile::direct, "Whether it was opened with O_DIRECT.")
      .def_prop_ro("closed", &PyFile::closed)
      .def("close", &PyFile::close,
           "Drops this hold on the descriptors: they close once no operation on the file is running.")
      .def("submit", &PyFile::submit, nb::arg("handle"), nb::arg("write"), nb::arg("buffer"),
           nb::arg("file_offset") = 0,
           nb::sig("def submit(self, handle: Handle, write: bool, buffer: object, file_offset: int = 0) -> Op"),
           "One read or write through handle, tracked for close(); returns its Op. ValueError once the "
           "file is closed or closing.")
      .def("submit_ranges", &PyFile::submit_ranges, nb::arg("handle"), nb::arg("write"), nb::arg("buffer"),
           nb::arg("file_offsets"), nb::arg("sizes"), nb::arg("buffer_offsets").none() = nb::none(),
           nb::sig("def submit_ranges(self, handle: Handle, write: bool, buffer: object, file_offsets: object, "
                   "sizes: object, buffer_offsets: object | None = None) -> Op"),
           "One operation over many ranges (Handle.submit_ranges, future=True), tracked for close().")
      .def("enter", &PyFile::enter,
           "Counts a call using the descriptor until leave(); returns it. ValueError once closed or closing.")
      .def("leave", &PyFile::leave)
      .def("begin_close", &PyFile::begin_close,
           "Refuses new calls, waits for the submissions under way; False if closed already or another "
           "close() is under way (after waiting for it).")
      .def("drain", &PyFile::drain,
           "Waits for every tracked operation; returns the failures nobody retrieved (marked retrieved).")
      .def_prop_ro("tracked", &PyFile::tracked,
                   "(operations not yet seen done, done ones with an unretrieved failure); for tests.")
#ifdef DEEPIO_TEST_HOOKS
      .def_prop_ro("_visits", &PyFile::visits,
                   "TESTING ONLY. Tracked operations looked at by tracking since the file opened.")
#endif
      ;
}

}  // namespace deepio::py
