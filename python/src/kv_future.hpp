// `_deepio.KvFuture` and the argument parsing of `_deepio.KvStore` (python/src/kv.cpp, whose
// opening comment states the protocol of calls, close and fork).
//
// KvFuture wraps a deepio::kv::BatchFuture. In a forked child every method raises
// deepio.ForkedHandleError before touching the batch (its threads are the parent's). A done
// callback runs on the store's batch thread with the GIL taken there, and marks that thread
// (t_callback_of) as running a callback of its store while it runs, so that the store closed
// or dropped there is not joined from its own thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "deepio/kv.hpp"
#include "platform/process.hpp"

namespace deepio::py {

/// The store whose done callback this thread is running (one of that store's batch threads),
/// or null. Identity only, never dereferenced.
extern thread_local const kv::Store* t_callback_of;

class KvFuture {
 public:
  KvFuture(kv::BatchFuture f, const kv::Store* owner) : fut_(std::move(f)), owner_(owner) {}
  bool done() const;
  /// Waits (GIL released, Ctrl-C honoured); one bool per key; TimeoutError after `timeout`.
  nb::list result(std::optional<double> timeout);
  /// fn(self) once done: at once if done, else on the batch thread (GIL held).
  void add_done_callback(nb::handle self, nb::object fn);

 private:
  kv::BatchFuture fut_;
  const kv::Store* owner_;      // identity only (never dereferenced): the store of the batch
  detail::ProcessStamp stamp_;  // the process whose store runs the batch
};

/// Keys as views into the Python objects (valid while `keys` lives and the GIL is held or the
/// objects are referenced by `keep`). TypeError / ValueError naming the key's index.
std::vector<std::string_view> parse_keys(nb::handle keys, std::vector<nb::object>* keep);

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

/// Registers _deepio.KvFuture.
void init_kv_future(nb::module_& m);

}  // namespace deepio::py
