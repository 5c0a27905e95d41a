#include "kv_future.hpp"

#include <chrono>
#include <utility>

#include <nanobind/stl/pair.h>

namespace deepio::py {

thread_local const kv::Store* t_callback_of = nullptr;

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

bool KvFuture::done() const {
  stamp_.check();
  return fut_.done();
}

nb::list KvFuture::result(std::optional<double> timeout) {
  stamp_.check();  // a parent's batch: its threads are not here
  std::optional<Clock::time_point> deadline;
  if (timeout) {
    if (*timeout < 0) throw nb::value_error("timeout must be non-negative");
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
  }
  for (;;) {
    bool done = false;
    {
      nb::gil_scoped_release release;
      auto slice_end = Clock::now() + std::chrono::milliseconds(50);
      if (deadline && *deadline < slice_end) slice_end = *deadline;
      done = fut_.wait_for(slice_end - Clock::now());
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (deadline && Clock::now() >= *deadline) {
      if (fut_.done()) break;
      PyErr_SetString(PyExc_TimeoutError, "deepio.kv: the batch did not complete within the timeout");
      throw nb::python_error();
    }
  }
  nb::list out;
  for (bool b : fut_.get()) out.append(nb::bool_(b));
  return out;
}

void KvFuture::add_done_callback(nb::handle self, nb::object fn) {
  stamp_.check();
  if (fut_.done()) {
    fn(self);
    return;
  }
  // The references live in ctx, made and released with the GIL; it is released by the
  // callback, which runs exactly once (the store completes every batch, at the latest when
  // it closes). While the interpreter finalizes it is leaked instead.
  auto* ctx = new std::pair<nb::object, nb::object>(nb::borrow(self), std::move(fn));
  fut_.on_done([ctx, owner = owner_] {
    if (interpreter_finalizing()) return;
    nb::gil_scoped_acquire gil;
    const kv::Store* outer = t_callback_of;
    t_callback_of = owner;
    try {
      ctx->second(ctx->first);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("deepio.kv: a done callback raised");
    }
    delete ctx;  // may drop the last reference to the store: still marked as its callback
    t_callback_of = outer;
  });
}

std::vector<std::string_view> parse_keys(nb::handle keys, std::vector<nb::object>* keep) {
  if (nb::isinstance<nb::str>(keys) || nb::isinstance<nb::bytes>(keys)) {
    throw nb::type_error("keys must be a list of str or bytes, not a single str or bytes");
  }
  std::vector<std::string_view> out;
  std::size_t i = 0;
  for (nb::handle k : nb::iter(keys)) {
    std::string_view v;
    if (PyUnicode_Check(k.ptr())) {
      Py_ssize_t n = 0;
      const char* p = PyUnicode_AsUTF8AndSize(k.ptr(), &n);
      if (p == nullptr) throw nb::python_error();
      v = std::string_view(p, static_cast<std::size_t>(n));
    } else if (PyBytes_Check(k.ptr())) {
      v = std::string_view(PyBytes_AS_STRING(k.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(k.ptr())));
    } else {
      throw nb::type_error(
          ("keys[" + std::to_string(i) + "] is " + py_type_name(k) + "; keys are str or bytes").c_str());
    }
    if (v.empty() || v.size() > kv::kMaxKeyBytes) {
      throw nb::value_error(("keys[" + std::to_string(i) + "] is " + std::to_string(v.size()) +
                             " bytes long; keys are 1 to " + std::to_string(kv::kMaxKeyBytes) +
                             " bytes (utf-8 for str)")
                                .c_str());
    }
    keep->push_back(nb::borrow(k));
    out.push_back(v);
    ++i;
  }
  return out;
}

void init_kv_future(nb::module_& m) {
  nb::class_<KvFuture>(m, "KvFuture", "The completion of a deepio.kv.Store put or get batch.")
      .def("done", &KvFuture::done, "True once every page of the batch is stored or read (or failed).")
      .def("result", &KvFuture::result, nb::arg("timeout") = nb::none(),
           "Waits (GIL released, Ctrl-C honoured) and returns one bool per key; TimeoutError when the timeout passes.")
      .def(
          "add_done_callback",
          [](nb::handle self, nb::object fn) { nb::cast<KvFuture&>(self).add_done_callback(self, std::move(fn)); },
          nb::arg("fn"),
          "Calls fn(future) once when done: at once if done, else from the store's batch thread (GIL held).");
}

}  // namespace deepio::py
