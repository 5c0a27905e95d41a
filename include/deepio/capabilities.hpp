// What this build and this machine can do, and why not when they cannot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepio/export.hpp"
#include "deepio/options.hpp"

namespace deepio {

struct BackendStatus {
  BackendKind kind = BackendKind::Threads;
  bool compiled = false;   ///< built into this library
  bool available = false;  ///< a queue could be set up on this machine just now
  std::string reason;      ///< why not, when not available; empty otherwise
};

struct Capabilities {
  std::string version;
  std::vector<BackendStatus> backends;  ///< io_uring, libaio, threads, in Auto's order
  BackendKind auto_choice = BackendKind::Threads;
  std::uint64_t memlock_limit_bytes = 0;  ///< RLIMIT_MEMLOCK soft limit (UINT64_MAX: unlimited)
};

/// Probes every backend (sets up and tears down a tiny queue). Thread-safe; never throws
/// except std::bad_alloc.
[[nodiscard]] DEEPIO_API Capabilities capabilities();

/// Direct-I/O facts about a folder or file: what deepio will use for files there.
struct DirectIoInfo {
  bool supported = false;          ///< O_DIRECT accepted by the file system
  std::uint32_t mem_align = 0;     ///< buffer address alignment O_DIRECT needs
  std::uint32_t offset_align = 0;  ///< file offset / length alignment O_DIRECT needs
  bool from_statx = false;         ///< alignment reported by statx(STATX_DIOALIGN)
  std::string filesystem;          ///< e.g. "ext4", "tmpfs", "xfs"
  std::string reason;              ///< why not supported, or how alignment was found
};

/// Creates and removes a small probe file in `folder` (or inspects `folder` if it is a file).
/// Throws deepio::Error when the folder cannot be used (ENOENT, EACCES, ...).
[[nodiscard]] DEEPIO_API DirectIoInfo probe_direct_io(const std::string& folder);

}  // namespace deepio
