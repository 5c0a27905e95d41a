#pragma once

#include "deepio/export.hpp"

namespace deepio {
/// The library's version, "MAJOR.MINOR.PATCH".
[[nodiscard]] DEEPIO_API const char* version() noexcept;
}  // namespace deepio
