// `_deepio.KvStore` and `_deepio.KvFuture`: thin bindings over deepio::kv::Store
// (include/deepio/kv.hpp), wrapped by deepio.kv.Store (python/deepio/kv/__init__.py).
//
// Arguments are checked here, with the GIL, so that a bad one raises at the call naming its
// index; the store's calls then run with the GIL released. Lifetimes: a registered pool is
// kept alive by the store until the store is destroyed (re-registering keeps the old one too,
// since a batch may still use it); the memory of put_segments/get_segments is the caller's to
// keep until the future is done. Done callbacks run on the store's batch thread with the GIL
// taken there, never under a store lock; the store is closed and destroyed with the GIL
// released, so those threads can take it meanwhile.
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "deepio/kv.hpp"

namespace deepio::py {
namespace {

using Clock = std::chrono::steady_clock;

class KvFuture {
 public:
  explicit KvFuture(kv::BatchFuture f) : fut_(std::move(f)) {}
  bool done() const { return fut_.done(); }

  nb::list result(std::optional<double> timeout) {
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

  void add_done_callback(nb::handle self, nb::object fn) {
    if (fut_.done()) {
      fn(self);
      return;
    }
    // The references live in ctx, made and released with the GIL; it is released by the
    // callback, which runs exactly once (the store completes every batch, at the latest when
    // it closes). While the interpreter finalizes it is leaked instead.
    auto* ctx = new std::pair<nb::object, nb::object>(nb::borrow(self), std::move(fn));
    fut_.on_done([ctx] {
      if (interpreter_finalizing()) return;
      nb::gil_scoped_acquire gil;
      try {
        ctx->second(ctx->first);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("deepio.kv: a done callback raised");
      }
      delete ctx;
    });
  }

 private:
  kv::BatchFuture fut_;
};

/// Keys as views into the Python objects (valid while `keys` lives and the GIL is held or the
/// objects are referenced by `keep`).
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

/// Parses seq, the per-key argument of a put or get (slots, segment lists), into one page per
/// item with parse(item, index); ValueError "N keys but M <noun>; <advice>" when the counts differ.
template <typename Parse>
std::vector<std::vector<kv::Segment>> per_key(nb::handle seq, std::size_t nkeys, const char* noun, const char* advice,
                                              Parse parse) {
  std::vector<std::vector<kv::Segment>> pages;
  std::size_t i = 0;
  for (nb::handle item : nb::iter(seq)) pages.push_back(parse(item, i++));
  if (pages.size() != nkeys) {
    throw nb::value_error(
        (std::to_string(nkeys) + " keys but " + std::to_string(pages.size()) + " " + noun + "; " + advice).c_str());
  }
  return pages;
}

class KvStore {
 public:
  KvStore(const std::vector<std::string>& folders, std::uint64_t capacity_bytes, std::size_t page_bytes,
          double high_watermark, double low_watermark, std::uint64_t slab_bytes, double checkpoint_interval,
          std::size_t batch_threads, std::size_t queue_depth, std::size_t workers, std::size_t device_pages_in_flight,
          double retry_failed_after) {
    kv::StoreOptions o;
    o.folders = folders;
    o.capacity_bytes = capacity_bytes;
    o.page_bytes = page_bytes;
    o.high_watermark = high_watermark;
    o.low_watermark = low_watermark;
    o.slab_bytes = slab_bytes;
    if (checkpoint_interval < 0) throw nb::value_error("checkpoint_interval must be non-negative");
    o.checkpoint_interval = std::chrono::milliseconds(static_cast<std::int64_t>(checkpoint_interval * 1000));
    if (!(retry_failed_after >= 0)) throw nb::value_error("retry_failed_after must be non-negative");
    // Rounded up: a positive value never turns into 0 (never).
    o.retry_failed_after = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(retry_failed_after * 1000)));
    o.batch_threads = batch_threads;
    o.device_pages_in_flight = device_pages_in_flight;
    o.handle.queue_depth = queue_depth;
    o.handle.intra_op_parallelism = workers;
    nb::gil_scoped_release release;
    store_ = std::make_unique<kv::Store>(o);
  }
  ~KvStore() {
    if (interpreter_finalizing()) {
      (void)store_.release();  // its threads may want the GIL: leak it at exit
      return;
    }
    nb::gil_scoped_release release;
    store_.reset();
  }
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  kv::Store& store() {
    if (!store_) throw nb::value_error("deepio.kv.Store is closed");
    return *store_;
  }

  void register_pool(nb::handle pool) {
    const std::size_t page = store().page_bytes();
    // CUDA memory too: the store copies device pages through its own host buffers.
    auto buf = std::make_shared<Buffer>(import_buffer(pool, true, "pool", /*allow_device=*/true));
    // The shape: obj.shape (NumPy, torch, CuPy...) or its memoryview's.
    nb::object shape_obj;
    if (nb::hasattr(pool, "shape")) {
      shape_obj = pool.attr("shape");
    } else {
      shape_obj = nb::module_::import_("builtins").attr("memoryview")(pool).attr("shape");
    }
    std::vector<std::size_t> shape;
    for (nb::handle d : nb::iter(shape_obj)) shape.push_back(nb::cast<std::size_t>(d));
    if (shape.size() != 2 || shape[0] == 0 || shape[1] == 0 || buf->nbytes % shape[0] != 0 ||
        buf->nbytes / shape[0] != page) {
      std::string got = "(";
      for (std::size_t k = 0; k < shape.size(); ++k) got += (k ? ", " : "") + std::to_string(shape[k]);
      got += shape.size() == 1 ? ",)" : ")";
      throw nb::value_error(("pool must be 2-D [slots, page_bytes] with rows of page_bytes = " + std::to_string(page) +
                             " bytes, C-contiguous; got shape " + got + " of " + std::to_string(buf->nbytes) + " bytes")
                                .c_str());
    }
    rows_ = shape[0];
    base_ = static_cast<unsigned char*>(buf->data);
    pool_obj_ = nb::borrow(pool);
    pool_device_ = buf->device;
    pools_.push_back(std::move(buf));
  }

  /// Pool rows as pages: slots[i] is a row of the registered pool.
  std::vector<std::vector<kv::Segment>> rows(nb::handle slots, std::size_t nkeys) {
    if (pools_.empty()) throw nb::value_error("no pool registered: call register(pool) before put() or get()");
    const std::size_t page = store().page_bytes();
    return per_key(slots, nkeys, "slots", "give one slot per key", [&](nb::handle s, std::size_t i) {
      if (PyBool_Check(s.ptr()) || !PyIndex_Check(s.ptr())) {
        throw nb::type_error(("slots[" + std::to_string(i) + "] is " + py_type_name(s) + "; slots are ints").c_str());
      }
      const long long v = PyLong_AsLongLong(nb::steal(PyNumber_Index(s.ptr())).ptr());
      if (v == -1 && PyErr_Occurred()) throw nb::python_error();
      if (v < 0 || static_cast<unsigned long long>(v) >= rows_) {
        throw nb::value_error(("slots[" + std::to_string(i) + "] is " + std::to_string(v) +
                               "; the registered pool has rows 0 to " + std::to_string(rows_ - 1))
                                  .c_str());
      }
      return std::vector<kv::Segment>{kv::Segment{base_ + static_cast<std::size_t>(v) * page, page}};
    });
  }

  /// Caller memory as pages: segments[i] is a list of (address, nbytes) pairs.
  std::vector<std::vector<kv::Segment>> segments(nb::handle segments, std::size_t nkeys) {
    const std::size_t page = store().page_bytes();
    return per_key(segments, nkeys, "segment lists", "give one per key", [&](nb::handle list, std::size_t i) {
      std::vector<kv::Segment> one;
      std::size_t total = 0;
      for (nb::handle pair : nb::iter(list)) {
        std::uintptr_t addr = 0;
        std::size_t n = 0;
        try {
          auto t = nb::cast<std::pair<std::uintptr_t, std::size_t>>(pair);
          addr = t.first;
          n = t.second;
        } catch (const nb::cast_error&) {
          throw nb::type_error(("segments[" + std::to_string(i) + "] holds " + py_type_name(pair) +
                                "; each segment is a pair (address: int, nbytes: int)")
                                   .c_str());
        }
        if (addr == 0 && n > 0)
          throw nb::value_error(("segments[" + std::to_string(i) + "] has a null address").c_str());
        total += n;
        one.push_back(kv::Segment{reinterpret_cast<void*>(addr), n});
      }
      if (total > page) {
        throw nb::value_error(("segments[" + std::to_string(i) + "] sum to " + std::to_string(total) +
                               " bytes, more than page_bytes = " + std::to_string(page))
                                  .c_str());
      }
      return one;
    });
  }

  /// put/get of keys with their pages: pool rows (`pages` is the slots) or segment lists.
  KvFuture submit(bool write, nb::handle keys, nb::handle pages, bool pool_rows) {
    std::vector<nb::object> keep;
    auto k = parse_keys(keys, &keep);
    std::vector<std::vector<kv::Segment>> segs = pool_rows ? rows(pages, k.size()) : segments(pages, k.size());
    kv::BatchOptions opt;
    if (pool_rows && pool_device_ >= 0) {
      // A CUDA pool: the copies follow the producer's stream (torch's current stream, or the
      // DLPack exchange), as the engine's own device operations do.
      Buffer b;
      b.device = pool_device_;
      b.nbytes = rows_;
      order_after_producer(pool_obj_, &b);
      opt.stream = b.stream;
    }
    kv::Store& s = store();
    nb::gil_scoped_release release;  // keys stay referenced by `keep`
    return KvFuture(write ? s.put(k, segs, opt) : s.get(k, segs, opt));
  }

  std::size_t exists(nb::handle keys) {
    return with_keys(keys, [](kv::Store& s, const std::vector<std::string_view>& k) { return s.exists(k); });
  }
  nb::list contains(nb::handle keys) {
    std::vector<bool> r = with_keys(keys,
                                    [](kv::Store& s, const std::vector<std::string_view>& k) { return s.contains(k); });
    nb::list out;
    for (bool b : r) out.append(nb::bool_(b));
    return out;
  }
  std::size_t remove(nb::handle keys) {
    return with_keys(keys, [](kv::Store& s, const std::vector<std::string_view>& k) { return s.remove(k); });
  }

  nb::dict stats() {
    kv::StoreStats st = store().stats();
    nb::dict d;
    d["page_bytes"] = st.page_bytes;
    d["slot_bytes"] = st.slot_bytes;
    d["capacity_bytes"] = st.capacity_bytes;
    d["pages"] = st.pages;
    d["puts"] = st.puts;
    d["puts_failed"] = st.puts_failed;
    d["gets"] = st.gets;
    d["hits"] = st.hits;
    d["misses"] = st.misses;
    d["corrupt"] = st.corrupt;
    d["evictions"] = st.evictions;
    d["removes"] = st.removes;
    d["bytes_written"] = st.bytes_written;
    d["bytes_read"] = st.bytes_read;
    d["checkpoints"] = st.checkpoints;
    d["recovered_pages"] = st.recovered_pages;
    d["open_seconds"] = st.open_seconds;
    d["device_pages"] = st.device_pages;
    d["device_copy_errors"] = st.device_copy_errors;
    nb::list folders;
    for (const kv::FolderStats& f : st.folders) {
      nb::dict fd;
      fd["path"] = f.path;
      fd["state"] = f.failed ? "failed" : "ok";
      fd["slots"] = f.slots;
      fd["used"] = f.used;
      fd["errors"] = f.errors;
      fd["recoveries"] = f.recoveries;
      fd["last_errno"] = f.last_errno;
      fd["last_error"] = f.last_error;
      folders.append(fd);
    }
    d["folders"] = folders;
    return d;
  }

  std::vector<std::string> take_warnings() {
    if (!store_) return std::move(late_warnings_);
    return store_->take_warnings();
  }

  void checkpoint() {
    kv::Store& s = store();
    nb::gil_scoped_release release;
    s.checkpoint();
  }

  std::size_t clear() {
    kv::Store& s = store();
    nb::gil_scoped_release release;
    return s.clear();
  }

  std::size_t retry_failed() {
    kv::Store& s = store();
    nb::gil_scoped_release release;
    return s.retry_failed();
  }

  void close() {
    if (!store_) return;
    std::unique_ptr<kv::Store> s = std::move(store_);
    nb::gil_scoped_release release;
    try {
      s->close();  // throws deepio::Error (a checkpoint that failed) after closing
    } catch (...) {
      late_warnings_ = s->take_warnings();
      throw;
    }
    late_warnings_ = s->take_warnings();
  }

  bool closed() const { return store_ == nullptr; }
  std::size_t page_bytes() { return store().page_bytes(); }

 private:
  /// fn(store, keys) with the GIL released (the keys' objects stay referenced meanwhile).
  template <typename Fn>
  std::invoke_result_t<Fn, kv::Store&, const std::vector<std::string_view>&> with_keys(nb::handle keys, Fn fn) {
    std::vector<nb::object> keep;
    auto k = parse_keys(keys, &keep);
    kv::Store& s = store();
    nb::gil_scoped_release release;
    return fn(s, k);
  }

  std::unique_ptr<kv::Store> store_;
  std::vector<std::shared_ptr<Buffer>> pools_;  // every pool registered (GIL)
  nb::object pool_obj_;                         // the latest pool (GIL)
  int pool_device_ = -1;                        // its CUDA device, -1 for host memory
  unsigned char* base_ = nullptr;
  std::size_t rows_ = 0;
  std::vector<std::string> late_warnings_;  // queued by the close
};

/// KvStore.put/get (PoolRows: pages are pool rows) and put_segments/get_segments.
template <bool Write, bool PoolRows>
KvFuture submit_as(KvStore& s, nb::handle keys, nb::handle pages) {
  return s.submit(Write, keys, pages, PoolRows);
}

}  // namespace

void init_kv(nb::module_& m) {
  nb::class_<KvFuture>(m, "KvFuture", "The completion of a deepio.kv.Store put or get batch.")
      .def("done", &KvFuture::done, "True once every page of the batch is stored or read (or failed).")
      .def("result", &KvFuture::result, nb::arg("timeout") = nb::none(),
           "Waits (GIL released, Ctrl-C honoured) and returns one bool per key; TimeoutError when the timeout passes.")
      .def(
          "add_done_callback",
          [](nb::handle self, nb::object fn) { nb::cast<KvFuture&>(self).add_done_callback(self, std::move(fn)); },
          nb::arg("fn"),
          "Calls fn(future) once when done: at once if done, else from the store's batch thread (GIL held).");
  nb::class_<KvStore>(m, "KvStore", "deepio::kv::Store (use deepio.kv.Store).")
      .def(nb::init<const std::vector<std::string>&, std::uint64_t, std::size_t, double, double, std::uint64_t, double,
                    std::size_t, std::size_t, std::size_t, std::size_t, double>(),
           nb::arg("folders"), nb::arg("capacity_bytes"), nb::arg("page_bytes"), nb::arg("high_watermark"),
           nb::arg("low_watermark"), nb::arg("slab_bytes"), nb::arg("checkpoint_interval"), nb::arg("batch_threads"),
           nb::arg("queue_depth"), nb::arg("workers"), nb::arg("device_pages_in_flight"), nb::arg("retry_failed_after"))
      .def("register", &KvStore::register_pool, nb::arg("pool"))
      .def("put", &submit_as<true, true>, nb::arg("keys"), nb::arg("slots"))
      .def("get", &submit_as<false, true>, nb::arg("keys"), nb::arg("slots"))
      .def("put_segments", &submit_as<true, false>, nb::arg("keys"), nb::arg("segments"))
      .def("get_segments", &submit_as<false, false>, nb::arg("keys"), nb::arg("segments"))
      .def("exists", &KvStore::exists, nb::arg("keys"))
      .def("contains", &KvStore::contains, nb::arg("keys"))
      .def("remove", &KvStore::remove, nb::arg("keys"))
      .def("stats", &KvStore::stats)
      .def("take_warnings", &KvStore::take_warnings)
      .def("checkpoint", &KvStore::checkpoint)
      .def("clear", &KvStore::clear)
      .def("retry_failed", &KvStore::retry_failed)
      .def("close", &KvStore::close)
      .def_prop_ro("closed", &KvStore::closed)
      .def_prop_ro("page_bytes", &KvStore::page_bytes);
  m.attr("KV_MAX_KEY_BYTES") = kv::kMaxKeyBytes;
  m.def(
      "kv_crc32c",
      [](nb::handle buffer, std::uint32_t crc) {
        Buffer b = import_buffer(buffer, false, "buffer");
        nb::gil_scoped_release release;
        return kv::crc32c(b.data, b.nbytes, crc);
      },
      nb::arg("buffer"), nb::arg("crc") = 0,
      "CRC-32C (Castagnoli) of a host buffer's bytes, continuing from crc: the store's page checksum.");
}

}  // namespace deepio::py
