// The failed-folder list (issue 47, the review's case 3): what keeps a failed folder's stale
// checkpoint from bringing pages back after a crash.
//
// A failed folder is left out of checkpoints (its drive does not answer), so its index.ckpt
// stays the one from before the failure and lists the pages the failure dropped. Were the
// store to crash before a probe rewrites it, a reopen that finds the drive readable again
// would take those pages back: a key re-put on another folder and removed since would return
// with its old bytes, though a checkpoint covered the removal. So every checkpoint also writes,
// to each healthy folder, the list of the folders failed at that time, each with the highest
// generation handed out when it failed ("failed.list", replaced durably, after the folders'
// index.ckpt). At open, a folder named in any folder's list takes that generation as a floor:
// its pages at or below it are dead whatever its own checkpoint says (recovery.cpp's scan), as
// they were dead in the store that wrote the list. Pages the folder took after it came back
// have higher generations and are unaffected; a probe's own checkpoint of the folder already
// drops the old ones, so a list naming a folder that has come back since is harmless.
//
// failed.list: magic "DKVF" | u32 1 | u32 count | count x (u64 generation, u32 path bytes,
// path) | u32 CRC-32C of everything before it. Little-endian. A folder is named by its
// absolute path (symbolic links resolved) at the open that wrote the list.
//
// Not covered: a folder that failed at open holding generations that no other folder ever
// recorded (its newest puts, after the last checkpoint) gets a floor below them; those pages
// can come back with their own (completed, never removed) bytes.
#include <filesystem>

#include "kv/impl.hpp"

namespace deepio::kv {

namespace {

constexpr char kMagic[4] = {'D', 'K', 'V', 'F'};
constexpr const char* kName = "failed.list";

using internal::get_le;

void put_u32(std::vector<unsigned char>& b, std::uint32_t v) {
  b.resize(b.size() + 4);
  internal::put_le<std::uint32_t>(b.data() + b.size() - 4, v);
}
void put_u64(std::vector<unsigned char>& b, std::uint64_t v) {
  b.resize(b.size() + 8);
  internal::put_le<std::uint64_t>(b.data() + b.size() - 8, v);
}

std::vector<unsigned char> encode(const std::vector<std::pair<std::string, std::uint64_t>>& failed) {
  std::vector<unsigned char> b(kMagic, kMagic + 4);
  put_u32(b, 1);
  put_u32(b, static_cast<std::uint32_t>(failed.size()));
  for (const auto& [id, gen] : failed) {
    put_u64(b, gen);
    put_u32(b, static_cast<std::uint32_t>(id.size()));
    b.insert(b.end(), id.begin(), id.end());
  }
  put_u32(b, crc32c(b.data(), b.size()));
  return b;
}

/// The entries, or nothing for a file that is not a whole list (torn, another format).
std::vector<std::pair<std::string, std::uint64_t>> decode(const std::vector<unsigned char>& b) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  if (b.size() < 16 || !std::equal(kMagic, kMagic + 4, b.begin()) || get_le<std::uint32_t>(b.data() + 4) != 1)
    return {};
  const std::size_t body = b.size() - 4;
  if (crc32c(b.data(), body) != get_le<std::uint32_t>(b.data() + body)) return {};
  const std::uint64_t count = get_le<std::uint32_t>(b.data() + 8);
  std::size_t at = 12;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (at + 12 > body) return {};
    const std::uint64_t gen = get_le<std::uint64_t>(b.data() + at);
    const std::uint64_t len = get_le<std::uint32_t>(b.data() + at + 8);
    at += 12;
    if (len > body - at) return {};
    out.emplace_back(
        std::string(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + len)),
        gen);
    at += len;
  }
  return out;
}

}  // namespace

std::string internal::folder_id(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  return ec ? path : p.string();
}

void Store::Impl::read_failed_lists() {
  for (Folder& f : folders) f.id = internal::folder_id(f.path);
  for (Folder& f : folders) {
    std::optional<std::vector<unsigned char>> bytes;
    try {
      bytes = internal::read_whole(*handle, f.path + "/" + kName);
    } catch (const Error&) {
      continue;  // unreadable: open_folder fails the folder for its own reasons
    }
    if (!bytes) continue;
    f.failed_list = *bytes;
    for (const auto& [id, gen] : decode(*bytes)) {
      for (Folder& g : folders) {
        if (g.id == id) g.stale_floor = std::max(g.stale_floor, gen);
      }
    }
  }
}

void Store::Impl::write_failed_lists() {
  std::vector<std::pair<std::string, std::uint64_t>> failed;
  std::vector<std::uint32_t> healthy;
  {
    std::lock_guard lk(mu);
    for (std::uint32_t fi = 0; fi < folders.size(); ++fi) {
      if (model.failed(fi)) {
        failed.emplace_back(folders[fi].id, folders[fi].failed_gen);
      } else if (folders[fi].opened) {
        healthy.push_back(fi);
      }
    }
  }
  const std::vector<unsigned char> bytes = encode(failed);
  const std::vector<unsigned char> none = encode({});
  std::optional<Error> first;
  for (std::uint32_t fi : healthy) {
    Folder& f = folders[fi];
    // An empty list is as good as no file: nothing written for a store that never failed.
    const bool same = f.failed_list == bytes || (f.failed_list.empty() && bytes == none);
    if (same) continue;
    try {
      internal::replace_durably(*handle, f.path, kName, bytes);
      f.failed_list = bytes;
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      fail_folder(fi, e.errnum(), e.what());
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

}  // namespace deepio::kv
