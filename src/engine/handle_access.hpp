// detail::HandleAccess: the library's own way into deepio::Handle, Future and GdsHandle, a
// friend of each (declared in include/deepio, defined only here): for the binding's protocol
// (binding.cpp) and for GdsHandles over given drivers (gds_handle.cpp). Nothing a user calls.
#pragma once

#include <memory>
#include <utility>

#include "deepio/handle.hpp"

namespace deepio {
class GdsHandle;
struct GdsOptions;
}  // namespace deepio

namespace deepio::detail {

namespace gpu {
struct GdsParts;
}  // namespace gpu

struct HandleAccess {
  static Engine& engine(const Handle& h) noexcept { return *h.engine_; }
  static const std::shared_ptr<OpState>& state(const Future& f) noexcept { return f.state_; }
  static Future future(std::shared_ptr<OpState> state) noexcept { return Future(std::move(state)); }
  /// A Handle over a prepared engine (a route made for given drivers: gds_handle.cpp).
  static Handle handle(std::unique_ptr<Engine> engine) noexcept {
    return Handle(Handle::PreparedEngine{}, std::move(engine));
  }
  /// A GdsHandle over a prepared engine and route (defined in gds_handle.cpp, GPU builds only).
  static GdsHandle gds_handle(const GdsOptions& options, gpu::GdsParts&& parts) noexcept;
};

}  // namespace deepio::detail
