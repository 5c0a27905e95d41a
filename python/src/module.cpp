// The `deepio._deepio` extension module: thin bindings over include/deepio. The public
// Python API (deepio.aio_handle, deepio.File, deepio.compat, ...) is written in Python on
// top of it; see python/deepio/ and docs/python.md.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"

namespace deepio::py {
namespace {

nb::dict capabilities_dict() {
  Capabilities caps;
  {
    nb::gil_scoped_release release;  // probing sets up and tears down small queues
    caps = capabilities();
  }
  nb::dict d;
  d["version"] = caps.version;
  nb::list backends;
  for (const auto& b : caps.backends) {
    nb::dict e;
    e["name"] = std::string(to_string(b.kind));
    e["compiled"] = b.compiled;
    e["available"] = b.available;
    e["reason"] = b.reason;
    backends.append(e);
  }
  d["backends"] = backends;
  d["auto_backend"] = std::string(to_string(caps.auto_choice));
  if (caps.memlock_limit_bytes == std::numeric_limits<std::uint64_t>::max()) {
    d["memlock_limit_bytes"] = nb::none();
  } else {
    d["memlock_limit_bytes"] = caps.memlock_limit_bytes;
  }
  return d;
}

nb::dict probe_dict(const std::string& folder) {
  DirectIoInfo info;
  {
    nb::gil_scoped_release release;
    info = probe_direct_io(folder);
  }
  nb::dict d;
  d["supported"] = info.supported;
  d["mem_align"] = info.mem_align;
  d["offset_align"] = info.offset_align;
  d["from_statx"] = info.from_statx;
  d["filesystem"] = info.filesystem;
  d["reason"] = info.reason;
  return d;
}

// Index of the first byte where the file range [offset, offset + nbytes) differs from the
// buffer (a short file differs where it ends), or -1 when identical. Reads through the page
// cache (a descriptor is reopened without O_DIRECT). Raises OSError when the file cannot be read.
std::int64_t compare_with_file(nb::handle buffer, nb::handle file, std::int64_t offset) {
  if (offset < 0) throw nb::value_error("file_offset must be non-negative");
  Buffer buf = import_buffer(buffer, false, "buffer");
  Target t = parse_target(file);
  const std::string path = t.fd >= 0 ? "/proc/self/fd/" + std::to_string(t.fd) : t.path;
  int err = 0;
  std::int64_t result = -1;
  {
    nb::gil_scoped_release release;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      err = errno;
    } else {
      std::vector<unsigned char> chunk(std::size_t{1} << 20);
      const auto* mem = static_cast<const unsigned char*>(buf.data);
      std::size_t done = 0;
      while (done < buf.nbytes) {
        const std::size_t want = std::min(chunk.size(), buf.nbytes - done);
        const ssize_t r = ::pread(fd, chunk.data(), want,
                                  static_cast<off_t>(static_cast<std::uint64_t>(offset) + done));
        if (r < 0) {
          if (errno == EINTR) continue;
          err = errno;
          break;
        }
        const auto got = static_cast<std::size_t>(r);
        if (std::memcmp(chunk.data(), mem + done, got) != 0) {
          std::size_t i = 0;
          while (chunk[i] == mem[done + i]) ++i;
          result = static_cast<std::int64_t>(done + i);
          break;
        }
        if (got == 0) {
          result = static_cast<std::int64_t>(done);
          break;
        }
        done += got;
      }
      ::close(fd);
    }
  }
  if (err != 0) {
    raise_error(Error(err, "cannot read the file back for validation",
                      t.fd >= 0 ? "fd " + std::to_string(t.fd) : t.path, static_cast<std::uint64_t>(offset),
                      buf.nbytes));
  }
  return result;
}

}  // namespace
}  // namespace deepio::py

NB_MODULE(_deepio, m) {
  using namespace deepio::py;
  m.doc() = "deepio's native extension. Use the `deepio` package, not this module.";
  m.attr("__version__") = deepio::version();
  // Locked allocations are owned by arrays of other frameworks (a torch tensor in a module
  // global may outlive this module at interpreter exit); that is not a leak worth a warning.
  nb::set_leak_warnings(false);
  init_errors(m);
  init_handle(m);
  init_memory(m);
#ifdef DEEPIO_TEST_HOOKS
  init_fault(m);  // test builds only (python/CMakeLists.txt, DEEPIO_TEST_HOOKS)
#endif
  init_gds(m);
  init_kv(m);
  m.def("live_handles", &deepio::live_handles,
        "How many engine handles exist in this process now (deepio::live_handles()).");
  m.def("compare_with_file", &compare_with_file, nb::arg("buffer"), nb::arg("file"), nb::arg("file_offset") = 0,
        "Index of the first byte where the file range differs from the buffer, or -1 (validate=True).");
  m.def(
      "memcpy",
      [](nb::handle dest, nb::handle src) {
        Buffer d = import_buffer(dest, true, "dest");
        Buffer s = import_buffer(src, false, "src");
        if (s.nbytes < d.nbytes) {
          throw nb::value_error(
              ("src holds " + std::to_string(s.nbytes) + " bytes, fewer than dest's " + std::to_string(d.nbytes))
                  .c_str());
        }
        nb::gil_scoped_release release;
        std::memmove(d.data, s.data, d.nbytes);
      },
      nb::arg("dest"), nb::arg("src"), "Copies dest.nbytes bytes from src into dest (GIL released).");
  m.def("capabilities", &capabilities_dict, "What this build and machine can do (backends, why one is unavailable).");
  m.def(
      "probe_direct_io",
      [](nb::handle folder) {
        Target t = parse_target(folder);
        if (t.fd >= 0) throw nb::type_error("probe_direct_io takes a folder or file path, not a descriptor");
        return probe_dict(t.path);
      },
      nb::arg("folder"), "Direct-I/O facts for files in `folder` (or the file itself).");
}
