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
#include "gpu/cuda.hpp"

namespace deepio::gputest {

// The shared helpers of every C++ test suite (tests/common/support.hpp).
using test::pattern;
using test::put;
using test::slurp;
using test::TempDir;

/// Holds device `ordinal`'s primary context current on the calling thread, as a CUDA program
/// does before allocating or copying: the real driver (and the fake) refuse those calls with
/// CUDA_ERROR_INVALID_CONTEXT on a thread without one. Restores "none current" at the end.
class CurrentContext {
 public:
  explicit CurrentContext(const detail::gpu::CudaApi* api, int ordinal = 0) : api_(api) {
    if (api_ == nullptr) return;
    if (api_->cuDeviceGet(&dev_, ordinal) != detail::gpu::CUDA_SUCCESS ||
        api_->cuDevicePrimaryCtxRetain(&ctx_, dev_) != detail::gpu::CUDA_SUCCESS) {
      ADD_FAILURE() << "cannot retain the primary context of device " << ordinal;
      api_ = nullptr;
      return;
    }
    EXPECT_EQ(api_->cuCtxSetCurrent(ctx_), detail::gpu::CUDA_SUCCESS);
  }
  ~CurrentContext() {
    if (api_ == nullptr) return;
    api_->cuCtxSetCurrent(nullptr);
    api_->cuDevicePrimaryCtxRelease(dev_);
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;

 private:
  const detail::gpu::CudaApi* api_;
  detail::gpu::CUdevice dev_ = 0;
  detail::gpu::CUcontext ctx_ = nullptr;
};

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
