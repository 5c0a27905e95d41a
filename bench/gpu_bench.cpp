// One timed GPU-tensor transfer, printed as a JSON line; bench/gpu_vs_host.py interleaves the
// memories against each other. --memory:
//   host    deepio between the file and a locked host buffer (the baseline)
//   device  deepio's staging pipeline: Handle on a cuMemAlloc'ed device pointer (disk reads
//           overlapped with host-to-device copies through pinned slots)
//   bounce  DeepNVMe's scheme: the whole tensor through one pinned host buffer, unpipelined
//           (read: disk -> host, then one cuMemcpyHtoD; write: one cuMemcpyDtoH, then disk)
//   gds     deepio::GdsHandle on a pinned device buffer (cuFile, or its staged fallback)
//   h2d     no file: one cuMemcpyHtoD (read) / cuMemcpyDtoH (write) of the whole size from/to
//           a pinned host buffer: the host-to-device ceiling
// Verification (--verify) copies the device buffer back outside the timed region.
// Runs against any driver DEEPIO_CUDA_LIBRARY names (the fake one in tests/gpu too).

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.hpp"
#include "deepio/deepio.hpp"
#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"

namespace {

using namespace deepio::detail::gpu;
using deepio::bench::cpu_seconds;

struct Args {
  std::string memory = "device", op = "read", path;
  std::size_t size = 1ull << 30, block = 1 << 20, qd = 32, par = 1;
  bool prepare = false, verify = false;
};

unsigned char byte_at(std::size_t i) { return static_cast<unsigned char>((i * 131 + 7) >> 3); }

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw deepio::Error(EIO, std::string(what) + ": " + cuda_error_text(cuda(nullptr), r));
}

int run(const Args& a) {
  deepio::detail::Status why;
  const CudaApi* cu = cuda(&why);
  if (cu == nullptr) {
    std::fprintf(stderr, "gpu_bench: no usable CUDA driver: %s\n", why.message.c_str());
    return 4;
  }
  // The engine stages through the primary context; make it current here too.
  CUcontext ctx = nullptr;
  check(cu->cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  deepio::PinnedBuffer host(a.size);
  auto* hp = static_cast<unsigned char*>(host.data());
  CUdeviceptr dev = 0;
  deepio::GdsHandle* gds = nullptr;
  std::unique_ptr<deepio::GdsHandle> gds_owner;
  if (a.memory == "gds") {
    gds_owner = std::make_unique<deepio::GdsHandle>(deepio::GdsOptions{.block_size = a.block, .queue_depth = a.qd,
                                                                        .intra_op_parallelism = a.par});
    gds = gds_owner.get();
    dev = reinterpret_cast<CUdeviceptr>(gds->new_pinned_device_buffer(a.size));
  } else {
    check(cu->cuMemAlloc(&dev, a.size), "cuMemAlloc");
  }
  void* dptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(dev));
  deepio::Handle h({.block_size = a.block, .queue_depth = a.qd, .overlap_events = true, .intra_op_parallelism = a.par});

  for (std::size_t i = 0; i < a.size; ++i) hp[i] = a.op == "write" || a.prepare ? byte_at(i) : 0;
  if (a.prepare) {
    h.sync_pwrite(hp, a.size, a.path);
    return 0;
  }
  if (a.op == "write") check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD");  // the tensor to store
  else check(cu->cuMemcpyHtoD(dev, std::vector<unsigned char>(a.size).data(), a.size), "clear");

  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const bool read = a.op == "read";
  if (a.memory == "host") {
    read ? h.sync_pread(hp, a.size, a.path) : h.sync_pwrite(hp, a.size, a.path);
  } else if (a.memory == "device") {
    read ? h.sync_pread(dptr, a.size, a.path) : h.sync_pwrite(dptr, a.size, a.path);
  } else if (a.memory == "bounce") {
    if (read) {
      h.sync_pread(hp, a.size, a.path);
      check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD");
    } else {
      check(cu->cuMemcpyDtoH(hp, dev, a.size), "cuMemcpyDtoH");
      h.sync_pwrite(hp, a.size, a.path);
    }
  } else if (a.memory == "gds") {
    read ? gds->sync_pread(dptr, a.size, a.path) : gds->sync_pwrite(dptr, a.size, a.path);
  } else if (a.memory == "h2d") {
    read ? check(cu->cuMemcpyHtoD(dev, hp, a.size), "cuMemcpyHtoD") : check(cu->cuMemcpyDtoH(hp, dev, a.size), "cuMemcpyDtoH");
  } else {
    std::fprintf(stderr, "gpu_bench: --memory host|device|bounce|gds|h2d\n");
    return 2;
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double cpu = cpu_seconds() - c0;
  bool ok = true;
  if (a.verify && a.memory != "h2d") {
    std::vector<unsigned char> back(a.size);
    if (read && a.memory != "host") check(cu->cuMemcpyDtoH(back.data(), dev, a.size), "cuMemcpyDtoH");
    else if (read) std::memcpy(back.data(), hp, a.size);
    else h.sync_pread(back.data(), a.size, a.path);
    for (std::size_t i = 0; i < a.size && ok; ++i) ok = back[i] == byte_at(i);
  }
  std::printf("{\"tool\": \"deepio\", \"memory\": \"%s\", \"op\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, "
              "\"cpu_seconds\": %.6f, \"gds_mode\": \"%s\", \"verified\": %s}\n",
              a.memory.c_str(), a.op.c_str(), a.size, std::chrono::duration<double>(t1 - t0).count(), cpu,
              gds != nullptr ? gds->mode().c_str() : "", a.verify && a.memory != "h2d" ? (ok ? "true" : "false") : "null");
  if (gds != nullptr) gds->free_pinned_device_buffer(dptr);
  else cu->cuMemFree(dev);
  return ok ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  deepio::bench::Args in("gpu_bench", argc, argv);
  while (in.next()) {
    const std::string_view k = in.flag();
    if (k == "--memory") a.memory = in.value();
    else if (k == "--op") a.op = in.value();
    else if (k == "--path") a.path = in.value();
    else if (k == "--size") a.size = in.number();
    else if (k == "--block") a.block = in.number();
    else if (k == "--qd") a.qd = in.number();
    else if (k == "--par") a.par = in.number();
    else if (k == "--prepare") a.prepare = true;
    else if (k == "--verify") a.verify = true;
    else in.unknown();
  }
  if (a.path.empty() && a.memory != "h2d") in.fail("--path is required");
  try {
    return run(a);
  } catch (const deepio::Error& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
