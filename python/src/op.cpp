#include "op.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine/binding.hpp"

namespace deepio::py {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kSlice = std::chrono::milliseconds(50);  // GIL released this long between signal checks

// Blocks until `f` is done or `deadline` passes (GIL released in slices, signals checked);
// returns whether it is done.
bool wait_future(const Future& f, std::optional<Clock::time_point> deadline) {
  if (f.done()) return true;  // no GIL round trip for a finished operation (most results)
  for (;;) {
    bool done = false;
    {
      nb::gil_scoped_release release;
      auto slice_end = Clock::now() + kSlice;
      if (deadline && *deadline < slice_end) slice_end = *deadline;
      done = f.wait_for(slice_end - Clock::now());
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (deadline && Clock::now() >= *deadline) return f.done();
  }
}

std::optional<Clock::time_point> deadline_after(std::optional<double> timeout) {
  if (!timeout) return std::nullopt;
  if (*timeout < 0) throw nb::value_error("timeout must be non-negative");
  const double capped = std::min(*timeout, 1e9);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(capped));
}
}  // namespace

thread_local bool t_in_op_callback = false;

void Op::add_done_callback(nb::handle self, nb::object fn) {
  if (fut_.done()) {  // (ForkedHandle in a forked child)
    fn(self);
    return;
  }
  // The references live in ctx, made and released with the GIL; the callback runs exactly
  // once (every operation finishes, at the latest when its engine shuts down) and releases
  // them. While the interpreter finalizes they are leaked instead.
  auto* ctx = new std::pair<nb::object, nb::object>(nb::borrow(self), std::move(fn));
  try {
    detail::on_done(fut_, [ctx] {
      if (interpreter_finalizing()) return;
      nb::gil_scoped_acquire gil;
      const bool outer = t_in_op_callback;
      t_in_op_callback = true;
      try {
        ctx->second(ctx->first);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("deepio: a done callback of a deepio.Future raised");
      }
      delete ctx;  // may drop the last reference to a handle: still marked
      t_in_op_callback = outer;
    });
  } catch (...) {
    delete ctx;
    throw;
  }
}

bool Op::wait(std::optional<double> timeout) { return wait_future(fut_, deadline_after(timeout)); }

void Op::ensure_done(std::optional<double> timeout) {
  if (!wait_future(fut_, deadline_after(timeout))) {
    PyErr_SetString(PyExc_TimeoutError, "the operation did not finish in time");
    throw nb::python_error();
  }
}

void init_op(nb::module_& m) {
  nb::class_<Op>(m, "Op", "One operation submitted through deepio.File; wrapped by deepio.Future.")
      .def("done", &Op::done, "True once the operation finished (successfully or not). Never blocks.")
      .def(
          "add_done_callback",
          [](nb::handle self, nb::object fn) { nb::cast<Op&>(self).add_done_callback(self, std::move(fn)); },
          nb::arg("fn"),
          "Calls fn(op) once when done: at once if done, else from the engine thread that completes it (GIL held).")
      .def("wait", &Op::wait, nb::arg("timeout").none() = nb::none(),
           "Blocks (GIL released) until done or `timeout` seconds passed; returns done().")
      .def("result", &Op::result, nb::arg("timeout").none() = nb::none(),
           "Waits, then returns the number of bytes transferred or raises the operation's OSError.")
      .def("exception", &Op::exception, nb::arg("timeout").none() = nb::none(),
           "Waits, then returns the operation's exception or None.")
      .def("take_unobserved", &Op::take_unobserved,
           "The failure of a finished operation nobody retrieved (marking it retrieved), or None.")
      .def("unobserved_failure", &Op::unobserved_failure,
           "True for a finished, failed operation whose failure nobody retrieved.")
      .def_prop_ro("collected", &Op::collected)
      .def_prop_ro("write", &Op::write)
      .def_prop_ro("offset", &Op::offset)
      .def_prop_ro("nbytes", &Op::nbytes);
}

}  // namespace deepio::py
