// Reads ahead of writes (core/lanes.hpp's classes, issue 46 item 3) on a real device: a test's
// fault hook holds back the completions of writes (kFaultHold: the request keeps its queue
// slot, as a drive busy with writes), many write ops wait in the lane, and a read op arrives
// behind them. The read must be issued into the first slot a write gives back, before any of
// the writes queued ahead of it; FIFO scheduling gives that slot to the next write. No clock
// decides an outcome: the timeouts only bound how long a broken scheduler makes a test wait.
// The hook is tests/cpp/write_gate.hpp.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/support.hpp"
#include "write_gate.hpp"

namespace deepio {
namespace {

using test::eventually;
using test::pattern;
using test::WriteGate;

constexpr std::size_t kBlock = 64 << 10;

class ReadPriority : public test::GatedBackendTest<WriteGate> {};

// 16 write ops of 4 requests each fill the queue (7 of 8 slots: one kept for a newcomer) and
// are held; a read of 2 requests on the same device comes after them. One write given back:
// its slot goes to the read, whose requests complete one after the other, and no write is
// issued meanwhile (the writes above their floor, core/lanes.hpp, are not refilled while reads
// are active). Then everything completes with the right bytes.
void read_overtakes_queued_writes(ReadPriority& t, WriteGate& gate, Handle& h, const std::string& dir) {
  constexpr int kWrites = 16;
  constexpr std::size_t kWriteBytes = 4 * kBlock, kReadBytes = 2 * kBlock;
  WriteGate::OpenAtExit open_at_exit{gate};
  const std::string read_path = dir + "/r-file";
  test::put(read_path, pattern(kReadBytes, 5));
  std::vector<std::vector<std::byte>> data;
  std::vector<Future> writes;
  for (int i = 0; i < kWrites; ++i) data.push_back(pattern(kWriteBytes, 100 + static_cast<std::uint32_t>(i)));
  for (int i = 0; i < kWrites; ++i) {
    writes.push_back(h.async_pwrite(data[i].data(), kWriteBytes, dir + "/w-" + std::to_string(i)));
  }
  ASSERT_TRUE(eventually([&] { return gate.held() == 7; })) << "the writes take 7 of 8 slots: " << gate.held();
  std::vector<std::byte> out(kReadBytes);
  Future read = h.async_pread(out.data(), out.size(), read_path);
  gate.release(1);  // one write comes back: its slot is the read's
  EXPECT_TRUE(read.wait_for(std::chrono::seconds(5))) << "the read waited behind the queued writes (FIFO)";
  EXPECT_EQ(gate.writes_before_read(), 7) << "a write was issued ahead of the read";
  for (const Future& w : writes) EXPECT_FALSE(w.done());
  gate.open();
  for (auto& w : writes) {
    ASSERT_TRUE(w.wait_for(std::chrono::seconds(30)));
    w.get();
  }
  read.get();
  EXPECT_EQ(out, pattern(kReadBytes, 5));
  for (int i = 0; i < kWrites; ++i) EXPECT_EQ(test::slurp(dir + "/w-" + std::to_string(i)), data[i]) << i;
  (void)t;
}

TEST_P(ReadPriority, AReadOvertakesQueuedWrites) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  read_overtakes_queued_writes(*this, *gate_, h, dir_.path().string());
}

TEST_P(ReadPriority, WithOverlapEventsToo) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .overlap_events = true, .direct_io = DirectIo::Off}));
  read_overtakes_queued_writes(*this, *gate_, h, dir_.path().string());
}

// Writes are not starved by reads: while a stream of reads keeps the lane busy, a write op
// queued behind them completes (its requests keep the writes' floor of the queue).
TEST_P(ReadPriority, WritesProgressUnderAStreamOfReads) {
  Handle h(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  gate_->open();
  const std::string dir = dir_.path().string();
  constexpr std::size_t kReadBytes = 16 * kBlock, kWriteBytes = 8 * kBlock;
  test::put(dir + "/r-file", pattern(kReadBytes, 6));
  const auto data = pattern(kWriteBytes, 7);
  std::vector<std::vector<std::byte>> outs(32, std::vector<std::byte>(kReadBytes));
  std::vector<Future> reads;
  for (auto& o : outs) reads.push_back(h.async_pread(o.data(), o.size(), dir + "/r-file"));
  Future write = h.async_pwrite(data.data(), data.size(), dir + "/w-x");
  // More reads keep coming while the write is out; it completes all the same.
  for (int round = 0; round < 200 && !write.done(); ++round) {
    for (auto& r : reads) r.get();
    reads.clear();
    for (auto& o : outs) reads.push_back(h.async_pread(o.data(), o.size(), dir + "/r-file"));
  }
  ASSERT_TRUE(write.wait_for(std::chrono::seconds(30)));
  write.get();
  for (auto& r : reads) r.get();
  EXPECT_EQ(test::slurp(dir + "/w-x"), data);
  EXPECT_EQ(outs[0], pattern(kReadBytes, 6));
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(ReadPriority);

}  // namespace
}  // namespace deepio
