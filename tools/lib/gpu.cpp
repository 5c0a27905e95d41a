#include "gpu.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "deepio/gpu.hpp"
#include "gpu/cuda.hpp"
#include "system.hpp"

namespace deepio::cli {

namespace gpu = deepio::detail::gpu;

namespace {

GpuProbe probe_here() {
  const GpuInfo i = gpu_info();
  GpuProbe g;
  g.cuda = i.cuda_found;
  g.cuda_reason = i.cuda_reason;
  g.device_count = i.device_count;
  g.driver_version = i.driver_version;
  g.cufile = i.cufile_found;
  g.cufile_reason = i.cufile_reason;
  g.gds_mode = i.gds_mode;
  g.gds_reason = i.gds_reason;
  return g;
}

// The child's answer crosses a pipe as lines: cuda, device_count, driver_version, cufile,
// gds_mode, then the three reasons (newlines in them become spaces).
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

std::string encode(const GpuProbe& g) {
  return std::to_string(g.cuda ? 1 : 0) + "\n" + std::to_string(g.device_count) + "\n" +
         std::to_string(g.driver_version) + "\n" + std::to_string(g.cufile ? 1 : 0) + "\n" + one_line(g.gds_mode) +
         "\n" + one_line(g.cuda_reason) + "\n" + one_line(g.cufile_reason) + "\n" + one_line(g.gds_reason) + "\n";
}

bool decode(const std::string& s, GpuProbe& g) {
  std::vector<std::string> f;
  std::size_t at = 0;
  for (std::size_t nl; (nl = s.find('\n', at)) != std::string::npos; at = nl + 1) f.push_back(s.substr(at, nl - at));
  if (f.size() != 8) return false;
  g.cuda = f[0] == "1";
  g.device_count = std::atoi(f[1].c_str());
  g.driver_version = std::atoi(f[2].c_str());
  g.cufile = f[3] == "1";
  g.gds_mode = f[4];
  g.cuda_reason = f[5];
  g.cufile_reason = f[6];
  g.gds_reason = f[7];
  return true;
}

GpuProbe probe_in_child() {
  GpuProbe failed;
  int fds[2];
  if (::pipe(fds) != 0) {
    failed.cuda_reason = std::string("cannot ask for CUDA in a child process: pipe: ") + std::strerror(errno);
    return failed;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    failed.cuda_reason = std::string("cannot ask for CUDA in a child process: fork: ") + std::strerror(errno);
    ::close(fds[0]);
    ::close(fds[1]);
    return failed;
  }
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = encode(probe_here());
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t w = ::write(fds[1], out.data() + done, out.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += static_cast<std::size_t>(w);
    }
    ::_exit(0);  // no atexit handlers: the parent owns the temporary folders
  }
  ::close(fds[1]);
  std::string in;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    in.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  GpuProbe g;
  if (!decode(in, g)) {
    failed.cuda_reason = "the child process asking for CUDA died (" +
                         std::string(WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                         : "status " + std::to_string(WEXITSTATUS(status))) +
                         ")";
    return failed;
  }
  return g;
}

const gpu::CudaApi& api() {
  detail::Status why;
  const gpu::CudaApi* a = gpu::cuda(&why);
  if (a == nullptr) throw Error(why.errnum ? why.errnum : ENOTSUP, "no usable CUDA driver: " + why.message);
  return *a;
}

void check(gpu::CUresult r, const char* what) {
  if (r == gpu::CUDA_SUCCESS) return;
  const detail::Status s = gpu::cuda_status(r, what);
  throw Error(s.errnum, s.message);
}

}  // namespace

GpuProbe probe_gpu(bool isolated) { return isolated ? probe_in_child() : probe_here(); }

std::vector<std::string> gpu_problems(const GpuProbe& g, const char* gpu_flag, const std::vector<int>& devices,
                                      const char* devices_flag) {
  std::vector<std::string> out;
  if (!g.cuda) {
    out.push_back(std::string(gpu_flag) + ": no usable CUDA driver: " + g.cuda_reason);
    return out;
  }
  std::vector<int> reported;
  for (const int d : devices) {
    if (d >= 0 && d < g.device_count) continue;
    bool seen = false;
    for (const int r : reported) seen = seen || r == d;
    if (seen) continue;
    reported.push_back(d);
    out.push_back(std::string(devices_flag) + ": device " + std::to_string(d) + " does not exist (" +
                  std::to_string(g.device_count) + " CUDA device(s))");
  }
  return out;
}

// ---- CudaDevice ----------------------------------------------------------------------------

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  const gpu::CudaApi& a = api();
  gpu::CUdevice dev = 0;
  check(a.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  gpu::CUcontext ctx = nullptr, prev = nullptr;
  check(a.cuCtxGetCurrent(&prev), "cuCtxGetCurrent");
  check(a.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  const gpu::CUresult r = a.cuCtxSetCurrent(ctx);
  if (r != gpu::CUDA_SUCCESS) {
    (void)a.cuDevicePrimaryCtxRelease(dev);
    check(r, "cuCtxSetCurrent");
  }
  previous_ = prev;
}

CudaDevice::~CudaDevice() {
  const gpu::CudaApi* a = gpu::cuda(nullptr);
  if (a == nullptr) return;
  (void)a->cuCtxSetCurrent(static_cast<gpu::CUcontext>(previous_));
  gpu::CUdevice dev = 0;
  if (a->cuDeviceGet(&dev, ordinal_) == gpu::CUDA_SUCCESS) (void)a->cuDevicePrimaryCtxRelease(dev);
}

// ---- DeviceBuffer --------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::size_t nbytes) : nbytes_(nbytes) {
  gpu::CUdeviceptr p = 0;
  check(api().cuMemAlloc(&p, nbytes ? nbytes : 1), "cuMemAlloc");
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == 0) return;
  if (const gpu::CudaApi* a = gpu::cuda(nullptr)) (void)a->cuMemFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), nbytes_(o.nbytes_) {
  o.ptr_ = 0;
  o.nbytes_ = 0;
}

void* DeviceBuffer::data() const noexcept { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr_)); }

void DeviceBuffer::upload(const void* src, std::size_t n) {
  if (n > nbytes_) throw Error(EINVAL, "upload of " + std::to_string(n) + " bytes into a smaller device buffer");
  check(api().cuMemcpyHtoD(ptr_, src, n), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* dst, std::size_t n) const {
  if (n > nbytes_) throw Error(EINVAL, "download of " + std::to_string(n) + " bytes from a smaller device buffer");
  check(api().cuMemcpyDtoH(dst, ptr_, n), "cuMemcpyDtoH");
}

// ---- HostRegistration ----------------------------------------------------------------------

HostRegistration::HostRegistration(void* p, std::size_t nbytes) : p_(p) {
  check(api().cuMemHostRegister(p, nbytes, gpu::CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
}

HostRegistration::~HostRegistration() {
  if (const gpu::CudaApi* a = gpu::cuda(nullptr)) (void)a->cuMemHostUnregister(p_);
}

// ---- copies --------------------------------------------------------------------------------

Sample timed_copy(bool to_device, DeviceBuffer& dev, void* host, std::size_t n) {
  const gpu::CudaApi& a = api();
  const double t0 = now_seconds(), c0 = process_cpu_seconds();
  if (to_device) dev.upload(host, n);
  else dev.download(host, n);
  check(a.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  return Sample{now_seconds() - t0, process_cpu_seconds() - c0, n};
}

}  // namespace deepio::cli
