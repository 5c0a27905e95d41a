#pragma once

namespace deepio {
/// The library's version, "MAJOR.MINOR.PATCH".
[[nodiscard]] const char* version() noexcept;
}  // namespace deepio
