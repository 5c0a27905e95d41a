// Page-locked allocations for Python: new_cpu_locked_tensor / free_cpu_locked_tensor /
// is_pinned (DeepNVMe's names; deepio's own word for this memory is "locked").
//
// Ownership: every allocation is owned by one `_deepio.LockedAllocation` object, which is the
// owner of the array (and, through DLPack, of any torch tensor or NumPy view made from it).
// free_locked_array() / free_locked_address() ("free_cpu_locked_tensor", "..._by_ptr") end the
// locking at once: registrations end and the pages are unlocked (VmLck and VmPin drop), the
// allocation is no longer locked for any handle, and a second free returns False. The pages
// stay mapped, data intact, until the owner dies, i.e. until the last array, view, tensor or
// operation in flight using them is gone: an array used after the free is valid memory, not a
// crash, and an operation still running on it never sees its memory change.
// The registry below maps base addresses to live owners; it is touched only with the GIL held.
//
// lend_staging(): a block of a handle's staging memory (engine/binding.hpp), owned by one
// `_deepio.StagingLease`. It goes back to the handle's pool when that object dies, so a
// Python window (deepio.Writer/Reader) keeps the object alive from every view of the block
// (a view held by an operation in flight included): the block is reused only once nothing can
// touch it.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <map>
#include <memory>

#include "common.hpp"
#include "engine/binding.hpp"
#include "handle.hpp"
#include "memory/regions.hpp"

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
  /// Frees the allocation for the caller: unregistered, unlocked, no longer locked (the
  /// mapping goes with the owner); false when it already was.
  bool release() {
    if (released_) return false;
    released_ = true;
    detail::retire_locked(buf_.data);
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

// Frees the live allocation whose base address is `base`; false for any other address or a
// second free.
bool release_at(std::uintptr_t base) {
  auto it = live().find(base);
  return it != live().end() && it->second->release();
}

LockedAllocation::~LockedAllocation() {
  live().erase(address());
  free_locked(buf_.data);
}

}  // namespace

struct StagingLease {
  detail::StagingPool::Lease lease;
};

void init_memory(nb::module_& m) {
  nb::class_<StagingLease>(m, "StagingLease",
                           "One block of a handle's staging memory; back to the handle's pool when this object dies.")
      .def_prop_ro("address", [](const StagingLease& l) { return reinterpret_cast<std::uintptr_t>(l.lease.data()); })
      .def_prop_ro("nbytes", [](const StagingLease& l) { return l.lease.size(); })
      .def_prop_ro("locked", [](const StagingLease& l) { return l.lease.locked(); });

  m.def(
      "lend_staging",
      [](const PyHandle& handle, std::int64_t nbytes) {
        if (nbytes < 0) throw nb::value_error("the size of a staging block must be non-negative");
        auto h = handle.engine();
        auto out = std::make_unique<StagingLease>();
        {
          nb::gil_scoped_release release;  // a fresh block is mapped, faulted in and locked
          out->lease = detail::lend_staging(*h, static_cast<std::size_t>(nbytes));
        }
        return out.release();
      },
      nb::arg("handle"), nb::arg("nbytes"), nb::rv_policy::take_ownership,
      "A block of at least nbytes (whole pages) of the handle's staging memory (page-aligned, locked where "
      "RLIMIT_MEMLOCK allows), from the pool its workers' bounce slots come from; it goes back there when the "
      "returned StagingLease dies. Keep the lease alive from every view of the block.");

  nb::class_<LockedAllocation>(m, "LockedAllocation",
                               "Owner of one page-aligned (and, when the limit allows, locked) allocation.")
      .def_prop_ro("address", &LockedAllocation::address)
      .def_prop_ro("nbytes", &LockedAllocation::nbytes)
      .def_prop_ro("locked", &LockedAllocation::locked)
      .def_prop_ro("lock_errno", &LockedAllocation::lock_errno)
      .def_prop_ro("released", &LockedAllocation::released)
      .def("release", &LockedAllocation::release,
           "Frees the allocation (free_cpu_locked_tensor): unlocked at once; False if it already was. The "
           "memory stays mapped until the last array using it dies.");

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
        return host_range(obj, &data, &n) && release_at(reinterpret_cast<std::uintptr_t>(data));
      },
      nb::arg("buffer"),
      "Frees the allocation whose base address `buffer` starts at (unlocked at once); False for "
      "anything else (a view not at the base, foreign memory, a second free).");

  m.def(
      "free_locked_address", [](std::uintptr_t address) { return release_at(address); }, nb::arg("address"),
      "Frees the allocation whose base address is `address` (DeepSpeed's free_cpu_locked_tensor_by_ptr); "
      "False for any other address or a second free.");

  m.def(
      "is_locked_range",
      [](nb::handle obj) {
        const void* data = nullptr;
        std::size_t n = 0;
        if (!host_range(obj, &data, &n)) return false;
        if (const LockedAllocation* a = containing(data); a != nullptr && a->released()) return false;
        return is_locked(data, n);
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
    d["staging_blocks"] = detail::StagingPool::live_blocks();
    return d;
  });
}

}  // namespace deepio::py
