// `deepio info --kv FOLDER...`: a deepio.kv store's folders as text or JSON
// (kv::inspect_folder, include/deepio/kv_inspect.hpp, gathers them).
#pragma once

#include <string>
#include <vector>

#include "deepio/kv_inspect.hpp"

namespace deepio::cli {

[[nodiscard]] std::string kv_info_text(const std::vector<kv::FolderReport>& folders);
[[nodiscard]] std::string kv_info_json(const std::vector<kv::FolderReport>& folders);

}  // namespace deepio::cli
