// `_deepio.KvStore`: the thin binding of deepio::kv::Store
// (include/deepio/kv.hpp), wrapped by deepio.kv.Store (python/deepio/kv/__init__.py); its
// futures and argument parsing are in kv_future.cpp.
//
// Arguments are checked here, with the GIL, so that a bad one raises at the call naming its
// index; the store's calls then run with the GIL released. Lifetimes: a registered pool is
// kept alive by the store until the store is destroyed (re-registering keeps the old one too,
// since a batch may still use it); the memory of put_segments/get_segments is the caller's to
// keep until the future is done. Done callbacks run on the store's batch thread with the GIL
// taken there, never under a store lock; the store is closed and destroyed with the GIL
// released, so those threads can take it meanwhile.
//
// Calls, close and fork (KvStore):
//  * Every call first checks the process (deepio.ForkedHandleError in a forked child) before
//    it takes any lock, the binding's own (the Gate's) included; then it counts itself as a
//    user of the store (Gate::users) until it returns. close() marks the store closing (later
//    calls raise ValueError "closed store"), waits until no call is under way (GIL released,
//    Ctrl-C honoured), then closes and destroys the store; a second close() waits for the first.
//  * A forked child never touches the store, its threads or the Gate (the parent's, perhaps
//    held at the fork): its calls raise, and dropping the object there leaks the store.
//  * A done callback runs on one of the store's batch threads, which closing the store joins:
//    a close() or the last reference dropped there (t_callback_of names the store) never waits
//    there. It refuses new calls and hands the store to a thread of its own (retire()), which
//    waits for the calls under way, then closes and destroys it: never a self-join, and never a
//    wait for a call that may itself wait for this batch thread. Such a close() returns at
//    once (a close() already under way elsewhere finishes the store). The pools stay alive
//    until that close finished every batch; a failure of its checkpoint is reported as a
//    deepio.UnobservedFailureWarning.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "deepio/kv.hpp"
#include "kv_future.hpp"
#include "memory/regions.hpp"
#include "platform/process.hpp"

namespace deepio::py {
namespace {

constexpr const char* kClosed = "deepio.kv: operation on a closed store";

/// The use count of a store's binding: shared with a thread that closes the store for it
/// (retire()), which may outlive the binding object.
struct Gate {
  std::mutex mu;
  std::condition_variable changed;  // notified when users reaches 0 and when a close ends
  int users = 0;                    // calls under way
  bool closing = false;             // a close() waits for them (new calls refused)
};

/// Closes and destroys `store` on a thread of its own, once no call counted by `gate` is under
/// way, then drops `pools` and `pool` (with the GIL); for a store whose own batch thread
/// closes or drops it (see the protocol above). Returns at once. GIL held.
void retire(std::unique_ptr<kv::Store> store, std::vector<std::shared_ptr<Buffer>> pools, nb::object pool,
            std::shared_ptr<Gate> gate) {
  struct Held {
    std::vector<std::shared_ptr<Buffer>> pools;
    nb::object pool;
  };
  auto* held = new Held{std::move(pools), std::move(pool)};
  kv::Store* raw = store.release();  // owned by the thread; leaked if there is none
  try {
    std::thread([raw, held, gate = std::move(gate)] {
      std::unique_ptr<kv::Store> owned(raw);
      {
        std::unique_lock lock(gate->mu);
        gate->changed.wait(lock, [&] { return gate->users == 0; });
      }
      std::string error;
      try {
        owned->close();
      } catch (const std::exception& e) {
        error = e.what();
      }
      owned.reset();
      if (interpreter_finalizing()) return;  // exiting: the pools are leaked with the process
      nb::gil_scoped_acquire gil;
      delete held;
      if (!error.empty()) warn_unobserved("deepio.kv: closing a store from its own done callback: " + error);
    }).detach();
  } catch (const std::system_error&) {
    // No thread to be had: the store stays open and its memory alive (a leak, neither a hang
    // nor the self-join that destroying it here would be).
  }
}

class KvStore {
 public:
  KvStore(const std::vector<std::string>& folders, std::uint64_t capacity_bytes, std::size_t page_bytes,
          double high_watermark, double low_watermark, std::uint64_t slab_bytes, double checkpoint_interval,
          std::size_t batch_threads, std::size_t queue_depth, std::size_t workers, std::size_t device_pages_in_flight,
          double retry_failed_after, std::string fingerprint, bool clear_on_mismatch) {
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
    o.fingerprint = std::move(fingerprint);
    o.clear_on_mismatch = clear_on_mismatch;
    nb::gil_scoped_release release;
    store_ = std::make_unique<kv::Store>(o);
  }
  ~KvStore() {
    if (!stamp_.here() || interpreter_finalizing()) {
      // A forked child: the store's threads and locks are the parent's. At exit: its threads
      // may want the GIL. Either way it is leaked.
      (void)store_.release();
      return;
    }
    if (store_ && t_callback_of == store_.get()) {
      retire(std::move(store_), std::move(pools_), std::move(pool_obj_), gate_);
      return;
    }
    nb::gil_scoped_release release;
    store_.reset();
  }
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  /// A call's use of the store (see the protocol above): ForkedHandleError in a forked child,
  /// ValueError once closed or closing.
  class Use {
   public:
    explicit Use(KvStore& owner) : owner_(owner), store_(owner.enter()) {}
    ~Use() { owner_.leave(); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    kv::Store& operator*() const noexcept { return store_; }
    kv::Store* operator->() const noexcept { return &store_; }

   private:
    KvStore& owner_;
    kv::Store& store_;
  };

  void register_pool(nb::handle pool) {
    Use s(*this);
    const std::size_t page = s->page_bytes();
    // CUDA memory too: the store copies device pages through its own host buffers. Host
    // memory is adopted as a region io_uring registers (fixed buffers: its pages are pinned
    // once, not at every request), released before the pool itself goes (after the store
    // closed: pools_ outlives every batch).
    Buffer imported = import_buffer(pool, true, "pool", /*allow_device=*/true);
    const std::uint64_t region = imported.device < 0 ? detail::adopt_host_region(imported.data, imported.nbytes) : 0;
    std::shared_ptr<Buffer> buf(new Buffer(std::move(imported)), [region](Buffer* b) {
      detail::release_host_region(region);
      delete b;
    });
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
  std::vector<std::vector<kv::Segment>> rows(nb::handle slots, std::size_t nkeys, std::size_t page) {
    if (pools_.empty()) throw nb::value_error("no pool registered: call register(pool) before put() or get()");
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
  std::vector<std::vector<kv::Segment>> segments(nb::handle segments, std::size_t nkeys, std::size_t page) {
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
    Use s(*this);
    std::vector<nb::object> keep;
    auto k = parse_keys(keys, &keep);
    const std::size_t page = s->page_bytes();
    std::vector<std::vector<kv::Segment>> segs = pool_rows ? rows(pages, k.size(), page)
                                                           : segments(pages, k.size(), page);
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
    nb::gil_scoped_release release;  // keys stay referenced by `keep`
    return KvFuture(write ? s->put(k, segs, opt) : s->get(k, segs, opt), &*s);
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
    kv::StoreStats st;
    {
      Use s(*this);
      nb::gil_scoped_release release;  // it waits for the store's locks
      st = s->stats();
    }
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
    d["open_headers_read"] = st.open_headers_read;
    d["open_pages_read"] = st.open_pages_read;
    d["pending_puts"] = st.pending_puts;
    d["pending_put_pages"] = st.pending_put_pages;
    d["pending_put_bytes"] = st.pending_put_bytes;
    d["device_pages"] = st.device_pages;
    d["device_copy_errors"] = st.device_copy_errors;
    d["io_ops"] = st.io_ops;
    d["bytes_fixed"] = st.bytes_fixed;
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

  /// The warnings queued since the last call; once closed, those of the close. While another
  /// thread closes: none (that close's caller gets them).
  std::vector<std::string> take_warnings() {
    stamp_.check();
    {
      std::lock_guard lock(gate_->mu);
      if (!store_) return std::move(late_warnings_);
      if (gate_->closing) return {};
    }
    Use s(*this);
    nb::gil_scoped_release release;
    return s->take_warnings();
  }

  void checkpoint() {
    call([](kv::Store& s) { s.checkpoint(); });
  }
  std::size_t clear() {
    return call([](kv::Store& s) { return s.clear(); });
  }
  std::size_t retry_failed() {
    return call([](kv::Store& s) { return s.retry_failed(); });
  }

  void close() {
    stamp_.check();  // a forked child: before the gate, which a parent's thread may have held
    {
      std::unique_lock lock(gate_->mu);
      if (!store_) return;
      if (t_callback_of == store_.get()) {
        // This store's batch thread: a close here would join this thread, and a wait here (for
        // another close, or for calls that may wait for this thread's batches) might never end.
        if (gate_->closing) return;                        // the close under way finishes the store
        std::unique_ptr<kv::Store> s = std::move(store_);  // calls refused from here on
        lock.unlock();
        retire(std::move(s), pools_, pool_obj_, gate_);
        return;
      }
      if (gate_->closing) {
        lock.unlock();
        wait_until([this] { return !gate_->closing; }, [] {});  // another close(): until it is done
        return;
      }
      gate_->closing = true;
    }
    wait_until([this] { return gate_->users == 0; }, [this] { gate_->closing = false; });
    std::unique_ptr<kv::Store> s;
    {
      std::lock_guard lock(gate_->mu);
      s = std::move(store_);  // calls refused from here on (store_ null)
    }
    std::exception_ptr error;
    std::vector<std::string> warnings;
    {
      nb::gil_scoped_release release;
      try {
        s->close();  // throws deepio::Error (a checkpoint that failed) after closing
      } catch (...) {
        error = std::current_exception();
      }
      warnings = s->take_warnings();
      s.reset();
    }
    late_warnings_ = std::move(warnings);
    done_closing();
    if (error) std::rethrow_exception(error);
  }

  bool closed() const { return store_ == nullptr; }
  std::size_t page_bytes() {
    Use s(*this);
    return s->page_bytes();
  }
  /// Calls under way (for tests).
  int users() {
    std::lock_guard lock(gate_->mu);
    return gate_->users;
  }

 private:
  kv::Store& enter() {
    stamp_.check();  // before any lock: a forked child takes none
    std::lock_guard lock(gate_->mu);
    if (!store_ || gate_->closing) throw nb::value_error(kClosed);
    ++gate_->users;
    return *store_;
  }
  void leave() noexcept {
    std::lock_guard lock(gate_->mu);
    if (--gate_->users == 0) gate_->changed.notify_all();
  }
  void done_closing() {
    std::lock_guard lock(gate_->mu);
    gate_->closing = false;
    gate_->changed.notify_all();
  }
  /// Waits (GIL released, in slices that honour Ctrl-C) until pred() holds under the gate's
  /// mutex; on a raised signal calls undo() under it and raises. GIL held, the mutex not.
  template <class Pred, class Undo>
  void wait_until(Pred pred, Undo undo) {
    for (;;) {
      bool ok = false;
      {
        nb::gil_scoped_release release;
        std::unique_lock lock(gate_->mu);
        ok = gate_->changed.wait_for(lock, std::chrono::milliseconds(50), pred);
      }
      if (ok) return;
      if (PyErr_CheckSignals() != 0) {
        {
          std::lock_guard lock(gate_->mu);
          undo();
          gate_->changed.notify_all();
        }
        throw nb::python_error();
      }
    }
  }

  /// fn(store) with the GIL released, as a user of the store.
  template <typename Fn>
  std::invoke_result_t<Fn, kv::Store&> call(Fn fn) {
    Use s(*this);
    nb::gil_scoped_release release;
    return fn(*s);
  }
  /// fn(store, keys) with the GIL released (the keys' objects stay referenced meanwhile).
  template <typename Fn>
  std::invoke_result_t<Fn, kv::Store&, const std::vector<std::string_view>&> with_keys(nb::handle keys, Fn fn) {
    Use s(*this);
    std::vector<nb::object> keep;
    auto k = parse_keys(keys, &keep);
    nb::gil_scoped_release release;
    return fn(*s, k);
  }

  detail::ProcessStamp stamp_;  // the process that made the store (first thing every call checks)
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();  // its mutex also guards changes of store_
  std::unique_ptr<kv::Store> store_;                       // changed with the GIL and the gate's mutex held
  std::vector<std::shared_ptr<Buffer>> pools_;             // every pool registered (GIL)
  nb::object pool_obj_;                                    // the latest pool (GIL)
  int pool_device_ = -1;                                   // its CUDA device, -1 for host memory
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
  init_kv_future(m);
  nb::class_<KvStore>(m, "KvStore", "deepio::kv::Store (use deepio.kv.Store).")
      .def(nb::init<const std::vector<std::string>&, std::uint64_t, std::size_t, double, double, std::uint64_t, double,
                    std::size_t, std::size_t, std::size_t, std::size_t, double, std::string, bool>(),
           nb::arg("folders"), nb::arg("capacity_bytes"), nb::arg("page_bytes"), nb::arg("high_watermark"),
           nb::arg("low_watermark"), nb::arg("slab_bytes"), nb::arg("checkpoint_interval"), nb::arg("batch_threads"),
           nb::arg("queue_depth"), nb::arg("workers"), nb::arg("device_pages_in_flight"), nb::arg("retry_failed_after"),
           nb::arg("fingerprint"), nb::arg("clear_on_mismatch"))
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
      .def_prop_ro("_users", &KvStore::users, "Calls under way (for tests).")
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
