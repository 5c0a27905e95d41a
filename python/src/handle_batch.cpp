// `_deepio.Handle.submit_batch`: many reads or writes in one call, through the same protocol
// as every submission of handle.cpp (each buffer imported with the GIL and handed to the
// engine as its operation's keep-alive), with one GIL release for the whole submission.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/binding.hpp"
#include "handle.hpp"
#include "op.hpp"

namespace deepio::py {

using detail::BindingOp;

namespace {
// A single file for the whole batch: a path or a descriptor, not a sequence of them.
bool is_one_file(nb::handle files) {
  if (PyLong_Check(files.ptr()) || PyUnicode_Check(files.ptr()) || PyBytes_Check(files.ptr())) return true;
  return nb::hasattr(files, "__fspath__");
}

std::vector<nb::handle> as_items(nb::handle seq, const char* what) {
  if (!PySequence_Check(seq.ptr()) || PyUnicode_Check(seq.ptr()) || PyBytes_Check(seq.ptr())) {
    throw nb::type_error((std::string(what) + " must be a sequence (list or tuple), not " + py_type_name(seq)).c_str());
  }
  nb::object fast = nb::steal(PySequence_Fast(seq.ptr(), what));
  if (!fast.is_valid()) throw nb::python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  // Borrowed from `seq`'s own items: the caller keeps `seq` (and so them) alive.
  std::vector<nb::handle> out(items, items + n);
  return out;
}
}  // namespace

nb::object PyHandle::submit_batch(bool write, nb::handle buffers, nb::handle files, nb::handle offsets, bool futures,
                                  bool fsync) {
  auto h = engine();
  // A tensor or array is itself a sequence (of rows or elements): only a list or tuple of
  // buffers is one.
  if (!PyList_Check(buffers.ptr()) && !PyTuple_Check(buffers.ptr())) {
    throw nb::type_error(("buffers must be a list or tuple of buffers, not " + py_type_name(buffers)).c_str());
  }
  // Copies of the sequences (new references) so their items stay alive whatever the caller
  // does to the originals from another thread.
  nb::object buffer_list = nb::steal(PySequence_List(buffers.ptr()));
  if (!buffer_list.is_valid()) {
    PyErr_Clear();
    throw nb::type_error(("buffers must be a sequence, not " + py_type_name(buffers)).c_str());
  }
  const std::vector<nb::handle> bufs_in = as_items(buffer_list, "buffers");
  const std::size_t n = bufs_in.size();
  const bool one_file = is_one_file(files);
  nb::object file_list;
  std::vector<nb::handle> files_in;
  if (!one_file) {
    file_list = nb::steal(PySequence_List(files.ptr()));
    if (!file_list.is_valid()) {
      PyErr_Clear();
      throw nb::type_error(
          ("files must be a path, a descriptor or a sequence of them, not " + py_type_name(files)).c_str());
    }
    files_in = as_items(file_list, "files");
    if (files_in.size() != n) {
      throw InvalidArgument("files has " + std::to_string(files_in.size()) + " items for " + std::to_string(n) +
                            " buffers");
    }
  }
  std::vector<std::int64_t> offs(n, 0);
  if (!offsets.is_none()) {
    nb::object off_list = nb::steal(PySequence_List(offsets.ptr()));
    if (!off_list.is_valid()) {
      PyErr_Clear();
      throw nb::type_error(("offsets must be a sequence of integers, not " + py_type_name(offsets)).c_str());
    }
    const std::vector<nb::handle> offs_in = as_items(off_list, "offsets");
    if (offs_in.size() != n) {
      throw InvalidArgument("offsets has " + std::to_string(offs_in.size()) + " items for " + std::to_string(n) +
                            " buffers");
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!PyIndex_Check(offs_in[i].ptr()) || PyBool_Check(offs_in[i].ptr())) {
        throw nb::type_error(
            ("offsets[" + std::to_string(i) + "] must be an integer, not " + py_type_name(offs_in[i])).c_str());
      }
      const long long v = PyLong_AsLongLong(offs_in[i].ptr());
      if (v == -1 && PyErr_Occurred()) throw nb::python_error();  // OverflowError names the value
      offs[i] = static_cast<std::int64_t>(v);
    }
  }
  const Target shared = one_file ? parse_target(files) : Target{};
  // Every buffer is imported before anything is submitted: a bad one refuses the batch.
  // Without futures the batch's buffers share one keep-alive (BatchBuffers: one allocation,
  // contiguous buffer-protocol objects held by their Py_buffer alone), so the import costs a
  // buffer export per request and nothing more; wait() collects the whole batch. With
  // futures, each Op owns its buffer's reference, as a single submission's does.
  std::shared_ptr<BatchBuffers> shared_keep;  // this call's own reference (see submit_op)
  std::vector<std::shared_ptr<Buffer>> keep;  // with futures: this call's own references
  if (futures) {
    keep.reserve(n);
  } else {
    shared_keep = std::make_shared<BatchBuffers>();
  }
  std::vector<std::size_t> sizes(n);
  std::vector<IoRequest> reqs(n);
  std::vector<BindingOp> binding(n);
  for (std::size_t i = 0; i < n; ++i) {
    IoRequest& r = reqs[i];
    if (!futures && import_view(bufs_in[i], !write, &shared_keep->views)) {
      r.buffer = shared_keep->views.back().buf;
      r.nbytes = static_cast<std::size_t>(shared_keep->views.back().len);
    } else {
      auto b = std::make_shared<Buffer>(import_buffer(bufs_in[i], !write, "buffer", /*allow_device=*/true));
      order_after_producer(bufs_in[i], b.get());
      r.buffer = b->data;
      r.nbytes = b->nbytes;
      r.op.stream = b->stream;
      if (futures) {
        binding[i].keep_alive = b;
        keep.push_back(std::move(b));
      } else {
        shared_keep->others.push_back(std::move(b));
      }
    }
    if (!futures) binding[i].keep_alive = shared_keep;
    sizes[i] = r.nbytes;
    if (one_file) {
      r.path = shared.path;
      r.fd = shared.fd;
    } else {
      const Target t = parse_target(files_in[i]);
      r.path = t.path;
      r.fd = t.fd;
    }
    r.write = write;
    r.file_offset = static_cast<std::uint64_t>(offs[i]);  // a negative one is refused by the engine
    binding[i].detached = futures;
    r.op.fsync = fsync;
  }
  std::vector<Future> futs;
  std::optional<Error> err;
  {
    nb::gil_scoped_release release;
    try {
      futs = detail::submit_batch(*h, std::move(reqs), std::move(binding));
    } catch (const Error& e) {
      err.emplace(e);
    }
  }
  if (err) raise_error(*err);
  if (!futures) return nb::int_(n);
  nb::list out;
  for (std::size_t i = 0; i < n; ++i) {
    out.append(std::make_shared<Op>(std::move(futs[i]), write, static_cast<std::uint64_t>(offs[i]), sizes[i]));
  }
  return out;
}

}  // namespace deepio::py
