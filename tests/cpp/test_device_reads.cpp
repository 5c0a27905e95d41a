// Read activity shared by every worker of a device (core/device_reads.hpp, issue 46 item 3):
// the table alone, then on a real device two handles (two workers, one device queue): while a
// read of one handle is in flight, the other handle refills its writes only up to their floor
// (core/lanes.hpp), not the whole queue, so that the read does not wait behind them. The
// drive busy with writes and the read in flight are tests/cpp/write_gate.hpp.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/support.hpp"
#include "core/device_reads.hpp"
#include "write_gate.hpp"

namespace deepio {
namespace {

using detail::DeviceReads;
using detail::DeviceReadsTable;
using test::eventually;
using test::pattern;
using test::WriteGate;
using namespace std::chrono_literals;

TEST(DeviceReads, OneEntryPerDeviceUntilTheTableIsFull) {
  auto table = std::make_unique<DeviceReadsTable>();
  DeviceReads* a = table->find(7);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(table->find(7), a);
  EXPECT_NE(table->find(8), a);
  EXPECT_EQ(table->find(~std::uint64_t{0}), nullptr) << "a key the table cannot store";
  for (std::uint64_t k = 100; k < 100 + DeviceReadsTable::kMaxDevices - 2; ++k) ASSERT_NE(table->find(k), nullptr) << k;
  EXPECT_EQ(table->find(5000), nullptr) << "the table is full";
  EXPECT_EQ(table->find(7), a) << "entries stay";
  EXPECT_NE(table->find(100), nullptr);
}

TEST(DeviceReads, ThreadsFindingOneNewDeviceShareItsEntry) {
  auto table = std::make_unique<DeviceReadsTable>();
  for (std::uint64_t key = 1; key < 40; ++key) {
    std::vector<DeviceReads*> got(8);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = table->find(key * 1000); });
    for (auto& t : threads) t.join();
    for (DeviceReads* g : got) ASSERT_EQ(g, got[0]) << key;
  }
}

TEST(DeviceReads, RecentWhileReadsAreActiveOrEndedWithinTheLinger) {
  DeviceReads d;
  const auto now = std::chrono::steady_clock::now();
  EXPECT_FALSE(d.recent(now, 5ms));
  d.active = 1;
  EXPECT_TRUE(d.recent(now, 5ms));
  d.active = 0;
  d.ended(now);
  EXPECT_TRUE(d.recent(now + 4ms, 5ms));
  EXPECT_FALSE(d.recent(now + 6ms, 5ms));
}

class SharedReadActivity : public test::GatedBackendTest<WriteGate> {};

// Handle W's writes fill its queue (7 of 8 slots, held). A read through handle R, on the same
// device, is held in flight. Then W's 7 writes come back: W refills only its writes' floor (1
// slot of a depth of 8), since reads of the device are active in R's worker. Once R's read is
// done and the linger has passed, W's writes fill the queue again; all bytes are right.
TEST_P(SharedReadActivity, AnotherHandlesReadHoldsTheWritesOfTheDeviceToTheirFloor) {
  WriteGate& gate = *gate_;
  WriteGate::OpenAtExit open_at_exit{gate};
  const std::string dir = dir_.path().string();
  constexpr std::size_t kBlock = 64 << 10, kWriteBytes = 4 * kBlock;
  Handle w(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  Handle r(opts({.block_size = kBlock, .queue_depth = 8, .direct_io = DirectIo::Off}));
  test::put(dir + "/rh-file", pattern(kBlock, 3));
  std::vector<std::vector<std::byte>> data;
  std::vector<Future> writes;
  for (int i = 0; i < 16; ++i) data.push_back(pattern(kWriteBytes, 200 + static_cast<std::uint32_t>(i)));
  for (int i = 0; i < 16; ++i)
    writes.push_back(w.async_pwrite(data[i].data(), kWriteBytes, dir + "/w-" + std::to_string(i)));
  ASSERT_TRUE(eventually([&] { return gate.held() == 7; })) << "W's writes take 7 of 8 slots: " << gate.held();
  std::vector<std::byte> out(kBlock);
  Future read = r.async_pread(out.data(), out.size(), dir + "/rh-file");
  ASSERT_TRUE(eventually([&] { return gate.reads_held(); }));
  gate.release(7);
  ASSERT_TRUE(eventually([&] { return gate.tokens() == 0 && gate.held() >= 1; }))
      << "the 7 writes came back and W refilled: " << gate.held();
  std::this_thread::sleep_for(50ms);  // room for a refill beyond the floor, were it allowed
  EXPECT_EQ(gate.held(), 1u) << "W refilled its writes beyond their floor while R's read was in flight";
  gate.reads_open();
  ASSERT_TRUE(read.wait_for(30s));
  read.get();
  EXPECT_EQ(out, pattern(kBlock, 3));
  // Reads quiet: W's writes take the queue again (the one held write's completion is what
  // wakes W; it is released once the linger has passed).
  std::this_thread::sleep_for(20ms);
  gate.release(1);
  ASSERT_TRUE(eventually([&] { return gate.held() == 7; })) << "writes back at full depth: " << gate.held();
  gate.open();
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(writes[i].wait_for(30s));
    writes[i].get();
    EXPECT_EQ(test::slurp(dir + "/w-" + std::to_string(i)), data[i]) << i;
  }
}

DEEPIO_INSTANTIATE_FOR_BACKENDS(SharedReadActivity);

}  // namespace
}  // namespace deepio
