// Helpers for the GPU tests: the shared test helpers, and access to the fake drivers'
// control functions.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"

namespace deepio::gputest {

// The shared helpers of every C++ test suite (tests/common/support.hpp).
using test::pattern;
using test::put;
using test::slurp;
using test::TempDir;

/// A function exported by an already loaded fake library.
template <typename Fn>
Fn* fake_symbol(const char* library, const char* name) {
  void* h = ::dlopen(library, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) h = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) throw std::runtime_error(std::string("cannot open ") + library);
  void* f = ::dlsym(h, name);
  ::dlclose(h);  // drops only the reference taken here
  if (f == nullptr) throw std::runtime_error(std::string("no ") + name + " in " + library);
  return reinterpret_cast<Fn*>(f);
}

}  // namespace deepio::gputest
