#include "gpu/loader.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>

namespace deepio::detail::gpu {

namespace {

LibraryChoice choice_from_env(const char* variable, std::vector<std::string> defaults) {
  LibraryChoice choice;
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') {
    choice.candidates = std::move(defaults);
    return choice;
  }
  choice.from_env = variable;
  if (std::string(value) == "none") {
    choice.disabled = true;
    return choice;
  }
  choice.candidates.emplace_back(value);
  return choice;
}

}  // namespace

LibraryChoice cuda_library_choice() { return choice_from_env("DEEPIO_CUDA_LIBRARY", {"libcuda.so.1"}); }

LibraryChoice cufile_library_choice() {
  return choice_from_env("DEEPIO_CUFILE_LIBRARY", {"libcufile.so.0", "libcufile.so"});
}

Status open_library(const std::vector<std::string>& candidates, Library* out) {
  std::string reasons;
  for (const auto& name : candidates) {
    void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      out->handle = handle;
      out->name = name;
      return Status::success();
    }
    const char* err = ::dlerror();
    if (!reasons.empty()) reasons += "; ";
    reasons += err != nullptr ? std::string(err) : name + ": cannot be opened";
  }
  if (candidates.empty()) reasons = "no library name to open";
  return Status::failure(ENOENT, reasons);
}

void* find_symbol(const Library& lib, const char* name) noexcept {
  if (lib.handle == nullptr) return nullptr;
  return ::dlsym(lib.handle, name);
}

}  // namespace deepio::detail::gpu
