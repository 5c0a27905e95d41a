// Completed puts survive a crash (issue 47, the review's first case): after a reopen, new puts
// take generations above every one the store ever handed out, also when the newest headers
// are gone (their folder came back empty, as a replaced drive does). Otherwise a crash before
// the next checkpoint makes the scan after it read the new pages as freed before the old
// checkpoint.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/support.hpp"
#include "deepio/kv.hpp"
#include "kv/layout.hpp"
#include "kv_support.hpp"

namespace deepio::test {
namespace {

using kv::Store;

/// n keys starting with `prefix` that a store over two folders places first on folder `fi`.
std::vector<std::string> keys_on(std::uint32_t fi, const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; static_cast<int>(keys.size()) < n; ++i) {
    std::string k = prefix + std::to_string(i);
    if (kv::internal::fnv1a(k) % 2 == fi) keys.push_back(std::move(k));
  }
  return keys;
}

std::vector<std::vector<unsigned char>> pages_for(const std::vector<std::string>& keys) {
  std::vector<std::vector<unsigned char>> p;
  for (const auto& k : keys) p.push_back(page_for(k, kPage));
  return p;
}

TEST(KvCrash, PutsAfterTheNewestHeadersWereLostSurviveTheNextCrash) {
  TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  const auto opts = small_options({a, b}, 256);
  const auto old_a = keys_on(0, "old-a-", 32), old_b = keys_on(1, "old-b-", 32);
  {
    Store s(opts);
    auto pa = pages_for(old_a), pb = pages_for(old_b);
    // The newest generations go to folder b.
    for (bool ok : put_pages(s, old_a, pa)) ASSERT_TRUE(ok);
    for (bool ok : put_pages(s, old_b, pb)) ASSERT_TRUE(ok);
  }                                // closed: both folders' checkpoints bound every generation handed out
  std::filesystem::remove_all(b);  // b comes back empty
  std::filesystem::create_directories(b);
  const auto fresh = keys_on(0, "new-", 32);  // all on folder a
  const int rc = in_watched_child([&] {
    Store s(opts);
    auto p = pages_for(fresh);
    for (bool ok : put_pages(s, fresh, p)) {
      if (!ok) return 2;
    }
    ::_exit(0);  // a crash: the store is never closed, no checkpoint after these puts
  });
  ASSERT_EQ(rc, 0);
  Store s(opts);
  std::vector<std::vector<unsigned char>> out(fresh.size(), std::vector<unsigned char>(kPage));
  const auto got = get_pages(s, fresh, out);
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_TRUE(got[i]) << fresh[i] << ": a completed put lost in the crash";
    if (got[i]) {
      EXPECT_EQ(out[i], page_for(fresh[i], kPage)) << fresh[i];
    }
  }
  // The pages of folder a from before are there too.
  std::vector<std::vector<unsigned char>> old_out(old_a.size(), std::vector<unsigned char>(kPage));
  for (bool ok : get_pages(s, old_a, old_out)) EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace deepio::test
