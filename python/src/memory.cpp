// Page-locked allocations for Python: new_cpu_locked_tensor / free_cpu_locked_tensor /
// is_pinned.
//
// Ownership: every allocation is owned by one `_deepio.LockedAllocation` object, which is the
// owner of the array (and, through DLPack, of any torch tensor or NumPy view made from it).
// The memory is unlocked and unmapped when that object dies, i.e. when the last array, view
// or tensor using it is garbage collected. free_locked_array() ("free_cpu_locked_tensor")
// releases the allocation from deepio's bookkeeping at once (a second free returns False) but
// never unmaps memory that an array still points at: an array used after the free stays
// valid memory instead of crashing the process. The registry below maps base addresses to
// live owners; it is touched only with the GIL held.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <map>

#include "common.hpp"

namespace deepio::py {

namespace {

class LockedAllocation {
 public:
  explicit LockedAllocation(const LockedBuffer& b) : buf_(b) {}
  ~LockedAllocation();
  LockedAllocation(const LockedAllocation&) = delete;
  LockedAllocation& operator=(const LockedAllocation&) = delete;

  [[nodiscard]] std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(buf_.data); }
  [[nodiscard]] std::size_t nbytes() const { return buf_.nbytes; }
  [[nodiscard]] bool locked() const { return buf_.locked; }
  [[nodiscard]] int lock_errno() const { return buf_.lock_errno; }
  [[nodiscard]] bool released() const { return released_; }
  /// Marks the allocation freed by the caller; false when it already was.
  bool release() {
    if (released_) return false;
    released_ = true;
    return true;
  }

 private:
  LockedBuffer buf_;
  bool released_ = false;
};

// Live allocations by base address (GIL). Deliberately leaked: arrays may die after the
// module's static destructors ran.
std::map<std::uintptr_t, LockedAllocation*>& live() {
  static auto* m = new std::map<std::uintptr_t, LockedAllocation*>;
  return *m;
}

// The live allocation whose memory contains address p, or nullptr.
LockedAllocation* containing(const void* data) {
  const auto p = reinterpret_cast<std::uintptr_t>(data);
  auto it = live().upper_bound(p);
  if (it == live().begin()) return nullptr;
  --it;
  const std::size_t span = std::max<std::size_t>(it->second->nbytes(), 1);
  return p - it->first < span ? it->second : nullptr;
}

LockedAllocation::~LockedAllocation() {
  live().erase(address());
  free_locked(buf_.data);
}

}  // namespace

void init_memory(nb::module_& m) {
  nb::class_<LockedAllocation>(m, "LockedAllocation",
                               "Owner of one page-aligned (and, when the limit allows, locked) allocation.")
      .def_prop_ro("address", &LockedAllocation::address)
      .def_prop_ro("nbytes", &LockedAllocation::nbytes)
      .def_prop_ro("locked", &LockedAllocation::locked)
      .def_prop_ro("lock_errno", &LockedAllocation::lock_errno)
      .def_prop_ro("released", &LockedAllocation::released)
      .def("release", &LockedAllocation::release,
           "Marks the allocation freed (free_cpu_locked_tensor); False if it already was. The memory goes when "
           "the last array using it dies.");

  m.def(
      "alloc_locked",
      [](std::int64_t nbytes, const std::string& framework) {
        if (nbytes < 0) throw nb::value_error("the size of a locked allocation must be non-negative");
        LockedBuffer b;
        {
          nb::gil_scoped_release release;  // mmap + mlock of a large region takes a while
          b = allocate_locked(static_cast<std::size_t>(nbytes));
        }
        auto* alloc = new LockedAllocation(b);
        nb::object owner = nb::cast(alloc, nb::rv_policy::take_ownership);
        live()[alloc->address()] = alloc;
        const std::size_t shape[1] = {static_cast<std::size_t>(nbytes)};
        nb::object array;
        if (framework == "numpy") {
          array = nb::cast(nb::ndarray<nb::numpy, std::uint8_t>(b.data, 1, shape, owner));
        } else if (framework == "torch") {
          array = nb::cast(nb::ndarray<nb::pytorch, std::uint8_t>(b.data, 1, shape, owner));
        } else {
          array = nb::cast(nb::ndarray<std::uint8_t>(b.data, 1, shape, owner));
        }
        return nb::make_tuple(array, owner);
      },
      nb::arg("nbytes"), nb::arg("framework") = "numpy",
      "Allocates `nbytes` page-aligned bytes, locked when RLIMIT_MEMLOCK allows, as a 1-D uint8 array of the "
      "given framework ('numpy', 'torch', or anything else for a DLPack-capable array). Returns (array, owner).");

  m.def(
      "free_locked_array",
      [](nb::handle obj) {
        const void* data = nullptr;
        std::size_t n = 0;
        if (!host_range(obj, &data, &n)) return false;
        auto it = live().find(reinterpret_cast<std::uintptr_t>(data));
        if (it == live().end()) return false;
        return it->second->release();
      },
      nb::arg("buffer"),
      "Releases the allocation whose base address `buffer` starts at; False for anything else (a view not at "
      "the base, foreign memory, a second free). The memory itself goes when the last array using it dies.");

  m.def(
      "is_locked_range",
      [](nb::handle obj) {
        const void* data = nullptr;
        std::size_t n = 0;
        if (!host_range(obj, &data, &n)) return false;
        if (const LockedAllocation* a = containing(data); a != nullptr && a->released()) return false;
        return is_pinned(data, n);
      },
      nb::arg("buffer"), "True iff the buffer lies entirely inside one live deepio locked allocation.");

  m.def("locked_memory_stats", [] {
    const LockedMemoryStats s = locked_memory_stats();
    std::size_t released = 0;
    for (const auto& [addr, a] : live()) released += a->released();
    nb::dict d;
    d["allocations"] = s.allocations;
    d["bytes"] = s.bytes;
    d["locked_bytes"] = s.locked_bytes;
    d["released_but_referenced"] = released;
    return d;
  });
}

}  // namespace deepio::py
