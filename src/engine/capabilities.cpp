#include "deepio/capabilities.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>

#include "backends/factory.hpp"
#include "deepio/version.hpp"
#include "platform/sys.hpp"

namespace deepio {

Capabilities capabilities() {
  Capabilities caps;
  caps.version = version();
  bool chosen = false;
  for (BackendKind kind : {BackendKind::IoUring, BackendKind::Libaio, BackendKind::Threads}) {
    BackendStatus st;
    st.kind = kind;
    st.compiled = detail::backend_compiled(kind);
    detail::Status why;
    auto b = detail::make_backend(kind, 4, &why);
    st.available = b != nullptr;
    if (!st.available) st.reason = why.message;
    if (st.available && !chosen) {
      caps.auto_choice = kind;
      chosen = true;
    }
    caps.backends.push_back(std::move(st));
  }
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    caps.memlock_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max() : rl.rlim_cur;
  }
  return caps;
}

DirectIoInfo probe_direct_io(const std::string& folder) {
  DirectIoInfo info;
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) detail::throw_error(errno, "cannot inspect", folder);
  detail::UniqueFd fd;
  std::string probe;
  if (S_ISDIR(st.st_mode)) {
    probe = folder + "/.deepio-probe-" + std::to_string(::getpid());
    detail::throw_if_error(detail::open_file(probe, O_RDWR | O_CREAT | O_EXCL, 0600, &fd));
    ::unlink(probe.c_str());
  } else {
    detail::throw_if_error(detail::open_file(folder, O_RDONLY, 0, &fd));
  }
  info.filesystem = detail::filesystem_name(fd.get());
  detail::FileFacts facts;
  detail::throw_if_error(detail::file_facts(fd.get(), folder, &facts));
  // The real test: can this file be switched to O_DIRECT?
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0) detail::throw_error(errno, "cannot read the descriptor's flags (fcntl F_GETFL) of", folder);
  const int after = ::fcntl(fd.get(), F_SETFL, flags | O_DIRECT) == 0 ? ::fcntl(fd.get(), F_GETFL) : -1;
  const bool accepted = after >= 0 && (after & O_DIRECT) != 0;
  info.from_statx = facts.from_statx;
  if (facts.from_statx) {
    info.supported = accepted && facts.dio_offset_align != 0;
    info.mem_align = facts.dio_mem_align;
    info.offset_align = facts.dio_offset_align;
    info.reason = info.supported ? "alignment from statx(STATX_DIOALIGN)"
                                 : "statx reports no direct-I/O support for files here";
  } else {
    info.supported = accepted;
    info.mem_align = info.offset_align = static_cast<std::uint32_t>(detail::page_size());
    info.reason = accepted ? "kernel without STATX_DIOALIGN: assuming page alignment"
                           : "the file system refuses O_DIRECT";
  }
  if (!accepted && info.reason.empty()) info.reason = "the file system refuses O_DIRECT";
  return info;
}

const char* version() noexcept { return DEEPIO_VERSION_STRING; }

}  // namespace deepio
