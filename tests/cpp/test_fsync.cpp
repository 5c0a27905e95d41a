// Durable writes (OpOptions::fsync): the sync really runs (HandleStats::synced, the Sync fault
// point), after the write's blocks and before the op completes; a sync failure fails that
// op alone, naming its file; reads refuse the option; option off changes nothing.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "common/support.hpp"
#include "platform/fault.hpp"

namespace deepio {
namespace {

using detail::FaultPoint;
using detail::FaultSite;
using test::pattern;
using test::slurp;

using Fsync = test::BackendTest;

OpOptions durable() {
  OpOptions o;
  o.fsync = true;
  return o;
}

struct HookGuard {
  ~HookGuard() { detail::set_fault_hook({}); }
};

TEST_P(Fsync, BatchOfDurableWritesSyncsEachFileAndReadsBack) {
  Handle h(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 2}));
  constexpr std::size_t kFiles = 64;
  std::vector<std::vector<std::byte>> data;
  std::vector<IoRequest> reqs;
  for (std::size_t i = 0; i < kFiles; ++i)
    data.push_back(pattern(4096 * (1 + i % 5) + i, static_cast<std::uint32_t>(i)));
  // The sync runs after the blocks: every Sync site sees the file already holding its bytes.
  std::atomic<int> early{0};
  HookGuard guard;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point != FaultPoint::Sync) return std::nullopt;
    if (slurp(s.path).size() != s.nbytes) ++early;
    return std::nullopt;
  });
  for (std::size_t i = 0; i < kFiles; ++i) {
    IoRequest r;
    r.write = true;
    r.buffer = data[i].data();
    r.nbytes = data[i].size();
    r.path = dir_.file("t" + std::to_string(i));
    r.op = durable();
    reqs.push_back(std::move(r));
  }
  auto futures = h.submit_batch(std::move(reqs));
  EXPECT_EQ(h.wait(), kFiles);
  EXPECT_EQ(early.load(), 0) << "no sync before the write's blocks were done";
  EXPECT_EQ(h.stats().synced, kFiles);
  for (std::size_t i = 0; i < kFiles; ++i) EXPECT_EQ(slurp(dir_.file("t" + std::to_string(i))), data[i]) << i;
}

TEST_P(Fsync, OptionOffNeverSyncs) {
  Handle h(opts());
  const auto data = pattern(1 << 20, 3);
  std::atomic<int> syncs{0};
  HookGuard guard;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Sync) ++syncs;
    return std::nullopt;
  });
  h.async_pwrite(data.data(), data.size(), dir_.file("a"));
  EXPECT_EQ(h.sync_pwrite(data.data(), data.size(), dir_.file("b")), 1u);  // its own op only
  EXPECT_EQ(h.wait(), 1u);
  EXPECT_EQ(syncs.load(), 0);
  EXPECT_EQ(h.stats().synced, 0u);
  EXPECT_EQ(slurp(dir_.file("a")), data);
}

TEST_P(Fsync, SyncFailureFailsOnlyThatWriteNamingTheFile) {
  Handle h(opts({.block_size = 65536, .queue_depth = 8}));
  HookGuard guard;
  detail::set_fault_hook([](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Sync && std::string(s.path).ends_with("/t5")) return -EIO;
    return std::nullopt;
  });
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < 12; ++i) data.push_back(pattern(200000, static_cast<std::uint32_t>(i)));
  std::vector<Future> fs;
  for (int i = 0; i < 12; ++i) {
    fs.push_back(h.async_pwrite(data[i].data(), data[i].size(), dir_.file("t" + std::to_string(i)), 0, durable()));
  }
  WaitResult r = h.collect();
  EXPECT_EQ(r.count, 12u);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].errnum(), EIO);
  EXPECT_EQ(r.errors[0].path(), dir_.file("t5"));
  EXPECT_EQ(r.errors[0].nbytes(), 200000u);
  EXPECT_NE(std::string(r.errors[0].what()).find("fdatasync"), std::string::npos) << r.errors[0].what();
  EXPECT_EQ(h.stats().synced, 11u);
  EXPECT_EQ(h.stats().ops_failed, 1u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(slurp(dir_.file("t" + std::to_string(i))), data[i]) << "nothing else lost";
  // The synchronous form throws it itself.
  try {
    h.sync_pwrite(data[5].data(), data[5].size(), dir_.file("t5"), 0, /*fsync=*/true);
    FAIL() << "expected EIO";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), dir_.file("t5"));
  }
}

TEST_P(Fsync, WriteThatFailedIsNotSyncedAndReportsItsOwnError) {
  Handle h(opts());
  std::atomic<int> syncs{0};
  HookGuard guard;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Sync) ++syncs;
    if (s.point == FaultPoint::Write && s.result > 0) return -ENOSPC;
    return std::nullopt;
  });
  const auto data = pattern(1 << 20, 9);
  h.async_pwrite(data.data(), data.size(), dir_.file("w"), 0, durable());
  try {
    h.wait();
    FAIL() << "expected ENOSPC";
  } catch (const Error& e) {
    EXPECT_EQ(e.errnum(), ENOSPC);
  }
  EXPECT_EQ(syncs.load(), 0);
}

TEST_P(Fsync, CompletesOnlyAfterTheSyncAndOnDescriptorsAndEmptyWrites) {
  Handle h(opts());
  std::atomic<bool> release{false};
  std::atomic<int> syncs{0};
  HookGuard guard;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point != FaultPoint::Sync) return std::nullopt;
    ++syncs;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return std::nullopt;
  });
  const auto data = pattern(300000, 4);
  const std::string path = dir_.file("fd");
  test::put(path, {});
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  Future a = h.async_pwrite(data.data(), data.size(), fd, 4096, durable());
  Future b = h.async_pwrite(data.data(), 0, dir_.file("empty"), 0, durable());
  while (syncs.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(a.done()) << "a durable write is not complete before its sync returned";
  EXPECT_FALSE(b.done());
  release = true;
  EXPECT_EQ(a.get(), data.size());
  EXPECT_EQ(b.get(), 0u);
  ::close(fd);
  EXPECT_EQ(h.stats().synced, 2u);
  const auto back = slurp(path);
  ASSERT_EQ(back.size(), 4096 + data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin() + 4096));
}

TEST_P(Fsync, DurableWritesToOneFileShareSyncsAndAFailedSyncFailsItsWholeGroup) {
  Handle h(opts({.block_size = 65536, .queue_depth = 16, .intra_op_parallelism = 2}));
  constexpr int kOps = 64;
  const auto data = pattern(kOps * 65536, 21);
  const std::string path = dir_.file("one");
  // The order is forced, not waited for: each round writes op 0 alone and holds its sync (the
  // file's first, whose round is op 0 alone) until the other ops have been submitted and their
  // blocks written. So every other op finishes while a sync of its file runs and must be
  // covered by a later one, started after its blocks were done. Only the syncer thread is held,
  // never a worker; the 60 s bounds only guard against a hang.
  std::atomic<int> syncs{0};
  // Bytes of Write completions this round (an op may be split in several requests).
  std::atomic<std::int64_t> written{0};
  std::atomic<bool> release{false};     // the first sync of the round may go on
  std::atomic<int> fail_from{1 << 30};  // the syncs from this one on fail with EIO
  const auto until = [](const auto& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  HookGuard guard;
  detail::set_fault_hook([&](const FaultSite& s) -> std::optional<std::int64_t> {
    if (s.point == FaultPoint::Write && s.result > 0) written += s.result;
    if (s.point != FaultPoint::Sync) return std::nullopt;
    const int n = ++syncs;
    if (n == 1) until([&] { return release.load(); });
    if (n >= fail_from.load()) return -EIO;
    return std::nullopt;
  });
  const auto submit = [&](int from, int to) {
    std::vector<IoRequest> reqs;
    for (int i = from; i < to; ++i) {
      reqs.push_back(IoRequest{.write = true,
                               .buffer = const_cast<std::byte*>(data.data()) + i * 65536,
                               .nbytes = 65536,
                               .path = path,
                               .file_offset = static_cast<std::uint64_t>(i) * 65536,
                               .op = durable()});
    }
    return h.submit_batch(std::move(reqs));
  };
  std::vector<Future> futures;
  const auto submit_all = [&] {
    syncs = 0;
    written = 0;
    release = false;
    futures = submit(0, 1);
    until([&] { return syncs.load() >= 1; });
    for (Future& f : submit(1, kOps)) futures.push_back(std::move(f));
    until([&] { return written.load() >= std::int64_t{kOps} * 65536; });
    release = true;
  };
  submit_all();
  EXPECT_EQ(h.wait(), static_cast<std::size_t>(kOps));
  EXPECT_EQ(h.stats().synced, static_cast<std::uint64_t>(kOps)) << "every write counts as synced";
  EXPECT_GE(syncs.load(), 2) << "the writes done while the first sync ran need a sync of their own";
  EXPECT_LE(syncs.load(), kOps / 4) << "writes of one file share their syncs";
  EXPECT_EQ(slurp(path), data);
  // Again, with every sync after the first failing: the first sync covered op 0 alone, which
  // succeeds; every other write is of a failed group and fails with EIO naming the file;
  // none is lost or counted twice.
  fail_from = 2;
  submit_all();
  const WaitResult r = h.collect();
  EXPECT_EQ(r.count, static_cast<std::size_t>(kOps));
  EXPECT_EQ(r.errors.size(), static_cast<std::size_t>(kOps - 1));
  for (const Error& e : r.errors) {
    EXPECT_EQ(e.errnum(), EIO);
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find("fdatasync"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.stats().synced, static_cast<std::uint64_t>(2 * kOps - r.errors.size()));
  // Every sync failing: every write fails, each once, and none counts as synced.
  const std::uint64_t synced_before = h.stats().synced;
  fail_from = 1;
  submit_all();
  const WaitResult all = h.collect();
  EXPECT_EQ(all.count, static_cast<std::size_t>(kOps));
  EXPECT_EQ(all.errors.size(), static_cast<std::size_t>(kOps));
  for (const Error& e : all.errors) EXPECT_EQ(e.errnum(), EIO);
  EXPECT_EQ(h.stats().synced, synced_before);
}

TEST_P(Fsync, ReadsRefuseTheOption) {
  Handle h(opts());
  const std::string path = dir_.file("r");
  test::put(path, pattern(8192, 1));
  std::vector<std::byte> buf(8192);
  EXPECT_THROW(h.async_pread(buf.data(), buf.size(), path, 0, durable()), InvalidArgument);
  IoRequest w{.write = true, .buffer = buf.data(), .nbytes = buf.size(), .path = path};
  IoRequest r{.write = false, .buffer = buf.data(), .nbytes = buf.size(), .path = path, .op = durable()};
  try {
    h.submit_batch({w, r});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.pending(), 0u) << "nothing of a refused batch is submitted";
}

TEST_P(Fsync, ManyThreadsDurableWritesAndDestroyFinishesThem) {
  constexpr int kThreads = 8, kPerThread = 24;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kThreads * kPerThread; ++i)
    data.push_back(pattern(70000 + 512 * i, static_cast<std::uint32_t>(i)));
  {
    Handle h(opts({.block_size = 65536, .queue_depth = 32, .intra_op_parallelism = 2}));
    std::vector<std::thread> threads;
    std::atomic<std::size_t> counted{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const int i = t * kPerThread + k;
          const std::string p = dir_.file("m" + std::to_string(i));
          if (k % 3 == 0) {
            h.sync_pwrite(data[i].data(), data[i].size(), p, 0, true);
          } else if (k % 3 == 1) {
            h.async_pwrite(data[i].data(), data[i].size(), p, 0, durable());
          } else {
            IoRequest r{.write = true, .buffer = data[i].data(), .nbytes = data[i].size(), .path = p, .op = durable()};
            h.submit_batch({r});
          }
        }
        counted += h.collect().count;
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(h.stats().synced, static_cast<std::uint64_t>(kThreads * kPerThread));
    // Durable writes still in flight when the handle goes: finished, synced, never dropped.
    for (int i = 0; i < 16; ++i)
      h.async_pwrite(data[i].data(), data[i].size(), dir_.file("d" + std::to_string(i)), 0, durable());
  }
  for (int i = 0; i < kThreads * kPerThread; ++i) EXPECT_EQ(slurp(dir_.file("m" + std::to_string(i))), data[i]) << i;
  for (int i = 0; i < 16; ++i) EXPECT_EQ(slurp(dir_.file("d" + std::to_string(i))), data[i]) << i;
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(Fsync);

}  // namespace
}  // namespace deepio
