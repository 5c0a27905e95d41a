// dlopen/dlsym helpers shared by the CUDA and cuFile shims, and the one place the GPU layer
// reads its environment variables (DEEPIO_CUDA_LIBRARY, DEEPIO_CUFILE_LIBRARY; listed in
// docs/gpu.md and docs/settings.md).
//
// Libraries are opened RTLD_NOW | RTLD_LOCAL so their symbols never interpose on anything
// else in the process, and are never dlclose()d: the CUDA driver and libcufile start threads
// and register atexit handlers, and unloading them under those is undefined (deliberate leak of
// one mapping per library per process).
#pragma once

#include <cerrno>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "platform/status.hpp"

namespace deepio::detail::gpu {

/// Which libraries to try, in order, for one shim. `disabled` means the user switched the
/// library off (the variable's value was "none"); `from_env` names the variable that chose.
struct LibraryChoice {
  std::vector<std::string> candidates;
  bool disabled = false;
  std::string from_env;  ///< "" when the built-in default names are used
};

/// DEEPIO_CUDA_LIBRARY: unset or empty -> "libcuda.so.1"; "none" -> disabled; anything else
/// is a file name or path handed to dlopen().
LibraryChoice cuda_library_choice();
/// DEEPIO_CUFILE_LIBRARY: unset or empty -> "libcufile.so.0", then "libcufile.so"; "none" ->
/// disabled; anything else is a file name or path handed to dlopen().
LibraryChoice cufile_library_choice();

/// An opened shared library. Not closed on destruction (see above).
struct Library {
  void* handle = nullptr;
  std::string name;  ///< the candidate that opened
};

/// Tries each candidate; on failure returns a Status (ENOENT) whose message names every
/// candidate with dlerror()'s text. Thread-safe (dlerror is per thread in glibc).
Status open_library(const std::vector<std::string>& candidates, Library* out);

/// dlsym. Returns nullptr when absent.
void* find_symbol(const Library& lib, const char* name) noexcept;

/// Resolves `name` into *fn; on absence records the missing name in *missing (first one only).
template <typename Fn>
void resolve(const Library& lib, const char* name, Fn** fn, std::string* missing) {
  *fn = reinterpret_cast<Fn*>(find_symbol(lib, name));
  if (*fn == nullptr && missing->empty()) *missing = name;
}

/// A library loaded once per process: the API, or why there is none.
template <typename Api>
struct LoadedOnce {
  std::unique_ptr<Api> api;
  Status why;
};

/// The one-time load both shims share: honours the library choice (disabled by the user, or the
/// candidates to try), names the variable that chose the library in the reason, and turns an
/// allocation failure while loading into ENOMEM. `load` is the shim's own
/// `std::unique_ptr<Api>(const std::vector<std::string>&, Status*)`.
template <typename Api, typename Load>
LoadedOnce<Api> load_once(LibraryChoice (*choose)(), const char* what, Load load) noexcept {
  LoadedOnce<Api> out;
  try {
    const LibraryChoice choice = choose();
    if (choice.disabled) {
      out.why = Status::failure(ENOTSUP, std::string(what) + " disabled: " + choice.from_env + "=none");
      return out;
    }
    out.api = load(choice.candidates, &out.why);
    if (out.api == nullptr && !choice.from_env.empty()) {
      out.why.message += " (library chosen by " + choice.from_env + ")";
    }
  } catch (const std::bad_alloc&) {
    out.api.reset();
    out.why.errnum = ENOMEM;
  }
  return out;
}

}  // namespace deepio::detail::gpu
