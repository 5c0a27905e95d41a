// kv::inspect_folder (include/deepio/kv_inspect.hpp): a read-only look at a store's folder with
// plain reads of its files, decoded by layout.hpp's pure functions, and the live pages counted
// as a reopen counts them (recovery.cpp scan_folder): a whole header above the generation floor
// is live if it is newer than the checkpoint's bound or the checkpoint lists it.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "deepio/kv_inspect.hpp"
#include "kv/layout.hpp"
#include "platform/fd.hpp"

namespace deepio::kv {

namespace {

using internal::kHeaderBytes;

/// The whole file, or nullopt with `why` set.
std::optional<std::vector<unsigned char>> read_file(const std::string& path, std::string* why) {
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    *why = path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::vector<unsigned char> out;
  unsigned char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = path + ": " + std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  return out;
}

/// The pid holding a flock on `path` (/proc/locks names the file by device and inode).
std::optional<std::int64_t> lock_holder(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, kind, mode, rw, pid, file;
    if (!(in >> id >> kind >> mode >> rw >> pid >> file)) continue;
    if (kind == "FLOCK" && file == want) return std::stoll(pid);
  }
  return std::nullopt;
}

std::string slab_path(const std::string& folder, std::uint64_t s) {
  char name[32];
  std::snprintf(name, sizeof name, "/slab-%04llu.bin", static_cast<unsigned long long>(s));
  return folder + name;
}

/// Counts the live pages by reading every slot header (r has the layout); false if a slab
/// cannot be read (r.problem says why).
bool scan(FolderReport& r, const internal::Meta& m, const std::optional<internal::Ckpt>& ck) {
  std::unordered_map<std::uint64_t, std::uint64_t> listed;  // slot -> generation
  if (ck) {
    for (const internal::CkptRecord& rec : ck->records) listed[rec.slot] = rec.gen;
  }
  const std::uint64_t bound = ck ? ck->bound : 0;
  std::vector<unsigned char> h(kHeaderBytes);
  for (std::uint64_t s = 0; s < r.slabs; ++s) {
    const std::string path = slab_path(r.folder, s);
    detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      r.problem = path + ": " + std::strerror(errno);
      return false;
    }
    const std::uint64_t in_slab = std::min(m.per_slab, m.slots - s * m.per_slab);
    for (std::uint64_t k = 0; k < in_slab; ++k) {
      const ssize_t n = ::pread(fd.get(), h.data(), kHeaderBytes, static_cast<off_t>(k * m.slot_bytes));
      auto d = n == static_cast<ssize_t>(kHeaderBytes) ? internal::decode_header(h.data(), m.page_bytes) : std::nullopt;
      if (!d) {
        ++r.unreadable_headers;
        continue;
      }
      if (d->gen <= m.gen_floor) continue;
      const std::uint64_t slot = s * m.per_slab + k;
      auto it = listed.find(slot);
      if (d->gen > bound || (it != listed.end() && it->second == d->gen)) ++r.pages;
    }
  }
  return true;
}

}  // namespace

FolderReport inspect_folder(const std::string& folder, bool do_scan) {
  FolderReport r;
  r.folder = folder;
  r.held_by_pid = lock_holder(folder + "/kv.lock");
  std::string why;
  auto meta_bytes = read_file(folder + "/kv.meta", &why);
  if (!meta_bytes) {
    r.problem = "not a deepio.kv folder (" + why + ")";
    return r;
  }
  auto m = internal::decode_meta(*meta_bytes);
  if (!m) {
    r.problem = folder + "/kv.meta is not whole (" + std::to_string(meta_bytes->size()) + " bytes)";
    return r;
  }
  r.meta_format = m->version;
  r.page_bytes = m->page_bytes;
  r.slot_bytes = m->slot_bytes;
  r.slots = m->slots;
  r.slabs = m->per_slab == 0 ? 0 : (m->slots + m->per_slab - 1) / m->per_slab;
  r.capacity_bytes = m->slots * m->page_bytes;
  r.fingerprint = m->fingerprint;
  r.generation_floor = m->gen_floor;
  for (std::uint64_t s = 0; s < r.slabs; ++s) {
    struct stat st {};
    if (::stat(slab_path(folder, s).c_str(), &st) == 0) r.disk_bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  std::optional<internal::Ckpt> ck;
  const std::string ck_path = folder + "/index.ckpt";
  if (auto b = read_file(ck_path, &why)) {
    ck = internal::decode_checkpoint(*b);
    if (ck) {
      r.checkpoint = true;
      r.checkpoint_pages = ck->records.size();
      r.checkpoint_bound = ck->bound;
      struct stat st {};
      if (::stat(ck_path.c_str(), &st) == 0) {
        const auto written = std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
        const auto now = std::chrono::system_clock::now().time_since_epoch();
        r.checkpoint_age_seconds = std::chrono::duration<double>(now - written).count();
      }
    } else {
      r.checkpoint_problem = ck_path + " is not whole";
    }
  } else {
    r.checkpoint_problem = "no checkpoint (" + why + ")";
  }
  r.pages = r.checkpoint_pages;
  if (do_scan && r.slabs > 0) {
    r.pages = 0;
    r.scanned = scan(r, *m, ck);
    if (!r.scanned) r.pages = r.checkpoint_pages;
  }
  r.free_slots = r.slots >= r.pages ? r.slots - r.pages : 0;
  return r;
}

}  // namespace deepio::kv
