// The worker's lane policy (core/lanes.hpp), without threads: tables of limits and lane
// counters in, shares and decisions out, and a small model of a worker (lanes with requests
// of given sizes arriving, free slots filled by pick_lane() until nothing may issue, requests
// completing) checked against the file comment's rules. The worker's use of it against real
// devices is tests/cpp/test_scheduler.cpp's and test_slow_device.cpp's.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/lanes.hpp"

namespace deepio::detail {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

TEST(Lanes, Reserves) {
  struct Row {
    std::size_t qd, bounce_slots, reserve, bounce_reserve;
  };
  const std::vector<Row> rows = {
      {1, 1, 0, 0},   {2, 2, 1, 1},   {7, 3, 1, 1},     {8, 8, 1, 1},
      {16, 16, 2, 2}, {32, 16, 4, 2}, {128, 16, 16, 2}, {65536, 4, 8192, 1},
  };
  for (const Row& r : rows) {
    const LaneLimits l{.queue_depth = r.qd, .bounce_slots = r.bounce_slots};
    EXPECT_EQ(reserve(l), r.reserve) << r.qd;
    EXPECT_EQ(bounce_reserve(l), r.bounce_reserve) << r.bounce_slots;
  }
}

TEST(Lanes, Shares) {
  struct Row {
    const char* what;
    LaneLimits limits;
    std::size_t demand;
    Shares expected;
  };
  const std::vector<Row> rows = {
      {"no lane in demand: as one", {32, 0, kMiB, 16}, 0, {28, 28 * kMiB, 14}},
      {"a lone lane keeps back the reserve", {32, 0, kMiB, 16}, 1, {28, 28 * kMiB, 14}},
      {"two lanes halve everything", {32, 0, kMiB, 16}, 2, {16, 16 * kMiB, 8}},
      {"three: rounded up, bounce down", {32, 0, kMiB, 16}, 3, {11, (32 * kMiB + 2) / 3, 5}},
      {"more lanes than slots: one each", {4, 0, kMiB, 2}, 9, {1, (4 * kMiB + 8) / 9, 1}},
      {"explicit byte budget", {128, 8 * kMiB, kMiB, 16}, 1, {112, 7 * kMiB, 14}},
      {"explicit byte budget, two lanes", {128, 8 * kMiB, kMiB, 16}, 2, {64, 4 * kMiB, 8}},
      {"depth one: nothing kept back", {1, 0, kMiB, 1}, 1, {1, kMiB - kMiB / 8, 1}},
      {"depth 128, 64 KiB turns", {128, 0, 64 << 10, 16}, 1, {112, 7 * kMiB, 14}},
  };
  for (const Row& r : rows) {
    const Shares s = shares(r.limits, r.demand);
    EXPECT_EQ(s.requests, r.expected.requests) << r.what;
    EXPECT_EQ(s.bytes, r.expected.bytes) << r.what;
    EXPECT_EQ(s.bounces, r.expected.bounces) << r.what;
  }
}

TEST(Lanes, MayIssue) {
  const Shares sh{4, 4 * kMiB, 2};
  struct Row {
    const char* what;
    LaneLoad lane;
    Free free;
    std::size_t reserve;
    bool expected;
  };
  const std::vector<Row> rows = {
      {"nothing waiting", {.waiting = 0}, {8, 0}, 1, false},
      {"stalled this pass", {.waiting = 1, .stalled = true}, {8, 0}, 1, false},
      {"no free slot at all", {.waiting = 1}, {0, 0}, 0, false},
      {"a newcomer takes a reserved slot", {.waiting = 1}, {1, 0}, 4, true},
      {"a newcomer ignores the shares", {.waiting = 1}, {1, 0}, 0, true},
      {"under its share, room beyond the reserve", {1, 3, 3 * kMiB, 0, 0, false}, {5, 0}, 4, true},
      {"holding 3: the reserved slots are not its", {1, 3, 3 * kMiB, 0, 0, false}, {4, 0}, 4, false},
      {"holding 1 of newcomer depth 2: a reserved one", {1, 1, kMiB, 0, 0, false}, {4, 0}, 4, true},
      {"holding 2 of newcomer depth 2: no more", {1, 2, kMiB, 0, 0, false}, {4, 0}, 4, false},
      {"reserve 1: newcomer depth 1", {1, 1, kMiB, 0, 0, false}, {1, 0}, 1, false},
      {"at its share of requests", {1, 4, kMiB, 0, 0, false}, {20, 0}, 1, false},
      {"at its share of bytes", {1, 2, 4 * kMiB, 0, 0, false}, {20, 0}, 1, false},
      {"over its share (issued while alone)", {1, 9, 9 * kMiB, 0, 0, false}, {20, 0}, 1, false},
  };
  for (const Row& r : rows) EXPECT_EQ(may_issue(r.lane, sh, r.free, r.reserve), r.expected) << r.what;
}

TEST(Lanes, MayBounce) {
  const Shares sh{16, 16 * kMiB, 3};
  struct Row {
    const char* what;
    std::size_t held, free;
    bool expected;
  };
  const std::vector<Row> rows = {
      {"none free", 0, 0, false},
      {"holding none: the reserved one too", 0, 1, true},
      {"under share, more than reserved", 1, 2, true},
      {"under share, only the reserved left", 2, 1, false},
      {"at its share", 3, 5, false},
  };
  for (const Row& r : rows) {
    LaneLoad l;
    l.bounces = r.held;
    EXPECT_EQ(may_bounce(l, sh, {8, r.free}, 1), r.expected) << r.what;
  }
}

TEST(Lanes, SliceShare) {
  EXPECT_EQ(slice_share(28, 0), SIZE_MAX);
  EXPECT_EQ(slice_share(28, 1), SIZE_MAX);
  EXPECT_EQ(slice_share(28, 2), 14u);
  EXPECT_EQ(slice_share(28, 3), 10u);
  EXPECT_EQ(slice_share(2, 5), 1u);
}

// A worker's queue as the policy sees it: lanes with requests of one size each, free slots
// and bounce slots. fill() issues as the worker does: one pick_lane() per free slot until
// none may issue; complete() ends one request of a lane.
struct Model {
  struct SimLane {
    LaneLoad load;
    std::uint64_t request_bytes = kMiB;
    std::size_t left = 0;  // requests not issued yet
    bool bounced = false;  // its requests need a bounce slot
    std::string order;     // its name, appended to `issued` per request
  };
  LaneLimits limits;
  std::vector<SimLane> lanes;
  std::vector<SimLane>::iterator turn;
  Free free;
  std::string issued;  // lane names, in issue order

  explicit Model(LaneLimits l) : limits(l), turn(lanes.end()), free{l.queue_depth, l.bounce_slots} {}

  void arrive(const std::string& name, std::size_t requests, std::uint64_t bytes = kMiB, bool bounced = false) {
    const auto at = turn - lanes.begin();
    for (auto& l : lanes) {
      if (l.order != name) continue;
      l.left += requests;
      l.load.waiting = 1;
      return;
    }
    SimLane l;
    l.load.waiting = requests > 0 ? 1 : 0;
    l.request_bytes = bytes;
    l.left = requests;
    l.bounced = bounced;
    l.order = name;
    lanes.push_back(l);
    turn = lanes.begin() + at;
  }
  SimLane& lane(const std::string& name) {
    for (auto& l : lanes) {
      if (l.order == name) return l;
    }
    throw std::runtime_error("no lane " + name);
  }
  void fill() {
    for (auto& l : lanes) l.load.stalled = false;  // as the worker, at each pass
    for (;;) {
      std::size_t demand = 0;
      for (const auto& l : lanes) demand += l.load.waiting > 0 ? 1 : 0;
      const Shares sh = shares(limits, demand);
      auto it = pick_lane(lanes.begin(), lanes.end(), turn, sh, free, reserve(limits), limits.quantum,
                          [](SimLane& l) -> LaneLoad& { return l.load; });
      if (it == lanes.end()) return;
      if (it->bounced && !may_bounce(it->load, sh, free, bounce_reserve(limits))) {
        it->load.stalled = true;  // as the worker: the next lane's turn
        continue;
      }
      charge(it->load, it->request_bytes, it->bounced);
      --free.slots;
      if (it->bounced) --free.bounces;
      if (--it->left == 0) it->load.waiting = 0;
      issued += it->order;
    }
  }
  void complete(const std::string& name) {
    SimLane& l = lane(name);
    discharge(l.load, l.request_bytes, l.bounced);
    ++free.slots;
    if (l.bounced) ++free.bounces;
    for (auto& x : lanes) x.load.stalled = false;
  }
  std::size_t inflight(const std::string& name) { return lane(name).load.inflight; }
};

// One slow drive holds what it was given, and nothing completes; drives arriving afterwards
// are issued requests at once, from the reserve: the first up to the newcomer depth.
TEST(Lanes, ANewcomerIsIssuedWithoutAnyCompletion) {
  struct Row {
    const char* what;
    std::size_t qd;
    std::size_t slow_requests;
    std::size_t slow_inflight;  // after the first fill
    std::size_t newcomers;      // drives arriving one after another, 8 requests each
    std::size_t each_gets;      // requests each newcomer is issued (no completion at all)
  };
  const std::vector<Row> rows = {
      {"48 queued on a depth of 32", 32, 48, 28, 1, 2},
      {"two newcomers share the reserve of four", 32, 48, 28, 2, 2},
      {"a third finds the reserve spent", 32, 48, 28, 3, 0},
      {"depth 128: eight at once", 128, 1000, 112, 1, 8},
      {"depth 8: one", 8, 64, 7, 1, 1},
      {"few requests: room left anyway", 32, 4, 4, 1, 8},
  };
  for (const Row& r : rows) {
    Model m({.queue_depth = r.qd, .quantum = kMiB, .bounce_slots = 16});
    m.arrive("s", r.slow_requests);
    m.fill();
    EXPECT_EQ(m.inflight("s"), r.slow_inflight) << r.what;
    for (std::size_t i = 0; i < r.newcomers; ++i) {
      const std::string name(1, static_cast<char>('a' + i));
      m.arrive(name, 8);
      m.fill();
      if (i + 1 == r.newcomers) {
        EXPECT_EQ(m.inflight(name), r.each_gets) << r.what << ": " << name;
      } else {
        EXPECT_GE(m.inflight(name), 1u) << r.what << ": " << name;
      }
    }
    EXPECT_EQ(m.inflight("s"), r.slow_inflight) << r.what << ": the slow drive issued nothing more";
  }
}

// Without the reserve (depth 1) a newcomer has to wait for a completion: the limit of the rule.
TEST(Lanes, DepthOneHasNoReserve) {
  Model m({.queue_depth = 1, .quantum = kMiB, .bounce_slots = 1});
  m.arrive("s", 4);
  m.fill();
  m.arrive("f", 1);
  m.fill();
  EXPECT_EQ(m.inflight("s"), 1u);
  EXPECT_EQ(m.inflight("f"), 0u);
  m.complete("s");
  m.fill();
  EXPECT_EQ(m.inflight("f"), 1u) << "the freed slot goes to the lane that has none";
}

// Two lanes in demand: each to its share; when one has no more to issue, the other grows to the
// lone share as completions free slots, the reserve still kept.
TEST(Lanes, SharesFollowDemand) {
  Model m({.queue_depth = 32, .quantum = kMiB, .bounce_slots = 16});
  m.arrive("a", 100);
  m.arrive("b", 100);
  m.fill();
  EXPECT_EQ(m.inflight("a"), 14u);  // 16 each, but the last four slots are kept back
  EXPECT_EQ(m.inflight("b"), 14u);
  EXPECT_EQ(m.issued.substr(0, 4), "abab") << "one quantum (one request) each in turn";
  m.lane("b").left = 0;
  m.lane("b").load.waiting = 0;
  for (int i = 0; i < 14; ++i) m.complete("b");
  m.fill();
  EXPECT_EQ(m.inflight("a"), 28u) << "alone: all but the reserve";
  EXPECT_EQ(m.free.slots, 4u);
}

// Byte caps: an explicit budget bounds a lane by bytes before requests; a lane's first
// request is never refused for its size.
TEST(Lanes, ByteBudget) {
  struct Row {
    const char* what;
    std::uint64_t budget;
    std::uint64_t request;
    std::size_t lanes;
    std::size_t each;
  };
  const std::vector<Row> rows = {
      {"alone: 7/8 of 4 MiB, the last request may cross it", 4 * kMiB, kMiB, 1, 4},
      {"two lanes: 2 MiB each", 4 * kMiB, kMiB, 2, 2},
      {"requests larger than a share: one each", 4 * kMiB, 4 * kMiB, 2, 1},
      {"small requests: the budget, not the depth", 4 * kMiB, 256 << 10, 1, 14},
  };
  for (const Row& r : rows) {
    Model m({.queue_depth = 64, .inflight_bytes = r.budget, .quantum = std::max(r.request, kMiB), .bounce_slots = 16});
    for (std::size_t i = 0; i < r.lanes; ++i) m.arrive(std::string(1, static_cast<char>('a' + i)), 100, r.request);
    m.fill();
    for (std::size_t i = 0; i < r.lanes; ++i) {
      EXPECT_EQ(m.inflight(std::string(1, static_cast<char>('a' + i))), r.each) << r.what;
    }
  }
}

// Deficit round-robin by bytes: a lane of 256 KiB requests issues four for each 1 MiB request
// of the other, and the quantum sets the length of a turn.
TEST(Lanes, TurnsAreCountedInBytes) {
  struct Row {
    std::uint64_t quantum;
    std::string order;
  };
  const std::vector<Row> rows = {
      {kMiB, "bbbbabbbbabbbba"},
      {2 * kMiB, "bbbbbbbbaabbbbbbbbaa"},
  };
  for (const Row& r : rows) {
    Model m({.queue_depth = 1024, .quantum = r.quantum, .bounce_slots = 16});
    m.arrive("a", 100, kMiB);
    m.arrive("b", 1000, 256 << 10);
    m.lane("a").load.deficit = 0;
    m.turn = m.lanes.begin() + 1;
    m.fill();
    EXPECT_EQ(m.issued.substr(0, r.order.size()), r.order) << r.quantum;
  }
}

// Bounce slots: a lone lane leaves the reserved one free; a newcomer that needs one gets it at
// once, a newcomer that needs none is not held by them at all.
TEST(Lanes, BounceReserve) {
  Model m({.queue_depth = 32, .quantum = kMiB, .bounce_slots = 4});
  m.arrive("s", 48, kMiB, /*bounced=*/true);
  m.fill();
  EXPECT_EQ(m.inflight("s"), 3u) << "4 slots, one kept back";
  m.arrive("f", 2, kMiB, /*bounced=*/true);
  m.fill();
  EXPECT_EQ(m.inflight("f"), 1u) << "the reserved bounce slot";
  EXPECT_EQ(m.free.bounces, 0u);
  m.arrive("d", 3, kMiB, /*bounced=*/false);
  m.fill();
  EXPECT_EQ(m.inflight("d"), 3u) << "needs no bounce slot";
  EXPECT_EQ(m.inflight("s"), 3u);
}

// ---- Classes: reads ahead of writes, writes never starved -----------------------------------

TEST(Lanes, WriteFloor) {
  struct Row {
    Shares share;
    std::size_t requests;
    std::uint64_t bytes;
  };
  const std::vector<Row> rows = {
      {{112, 112 * kMiB, 14}, 7, 7 * kMiB},  // depth 128 alone
      {{28, 28 * kMiB, 14}, 1, 28 * kMiB / 16},
      {{16, 16 * kMiB, 8}, 1, kMiB},
      {{1, 1, 1}, 1, 1},  // never below one request
  };
  for (const Row& r : rows) {
    const Shares f = write_floor(r.share);
    EXPECT_EQ(f.requests, r.requests) << r.share.requests;
    EXPECT_EQ(f.bytes, r.bytes) << r.share.requests;
  }
}

TEST(Lanes, PickClass) {
  const Shares s{112, 112 * kMiB, 14};  // floor: 7 requests, 7 MiB
  struct Row {
    const char* what;
    LaneLoad l;
    OpClass expected;
  };
  auto lane = [](std::size_t waiting, std::size_t reads_waiting, std::size_t inflight, std::size_t reads_inflight,
                 bool recent = false) {
    LaneLoad l;
    l.waiting = waiting;
    l.reads_waiting = reads_waiting;
    l.inflight = inflight;
    l.inflight_bytes = inflight * (256 << 10);
    l.reads_inflight = reads_inflight;
    l.read_bytes = reads_inflight * (256 << 10);
    l.read_recent = recent;
    return l;
  };
  const std::vector<Row> rows = {
      {"nothing waiting", lane(0, 0, 0, 0), OpClass::None},
      {"writes alone: the whole share", lane(3, 0, 100, 0), OpClass::Write},
      {"reads alone", lane(2, 2, 100, 100), OpClass::Read},
      {"a read first, writes at their floor", lane(4, 1, 7, 0), OpClass::Read},
      {"a read first, writes above their floor", lane(4, 1, 111, 0), OpClass::Read},
      {"writes under their floor keep its slots", lane(4, 1, 110, 105), OpClass::Write},
      {"reads under the share less the writes' floor", lane(4, 1, 104, 100), OpClass::Read},
      {"writes at the floor, reads in flight: nothing", lane(3, 0, 20, 13), OpClass::None},
      {"writes under the floor, reads in flight", lane(3, 0, 20, 14), OpClass::Write},
      {"a read just done: writes held to the floor", lane(3, 0, 7, 0, true), OpClass::None},
      {"reads quiet for the linger: the whole share", lane(3, 0, 7, 0, false), OpClass::Write},
      {"a lane with nothing in flight: a read", lane(5, 1, 0, 0), OpClass::Read},
  };
  for (const Row& r : rows) EXPECT_EQ(pick_class(r.l, s), r.expected) << r.what;
}

// A model of one worker with one lane (depth 128): requests of 256 KiB, reads and writes
// always waiting, the device completing in issue order (FIFO, as a loop device's one thread).
struct ClassModel {
  LaneLimits limits{.queue_depth = 128, .quantum = kMiB};
  LaneLoad l;
  std::vector<bool> queue;  // in issue order: true for a read
  std::size_t reads_done = 0, writes_done = 0;
  std::size_t max_writes_ahead = 0;  // writes in flight when a read was issued, at most

  // Fills free slots as the worker does; returns the classes issued.
  std::vector<OpClass> fill() {
    std::vector<OpClass> out;
    for (;;) {
      const Shares sh = shares(limits, 1);
      const Free free{limits.queue_depth - l.inflight, 16};
      if (!may_issue(l, sh, free, reserve(limits))) return out;
      const OpClass c = pick_class(l, sh);
      const bool read = c == OpClass::Read;
      if (read) max_writes_ahead = std::max(max_writes_ahead, l.inflight - l.reads_inflight);
      charge(l, 256 << 10, false, read);
      queue.push_back(read);
      out.push_back(c);
    }
  }
  void complete_one() {
    const bool read = queue.front();
    queue.erase(queue.begin());
    discharge(l, 256 << 10, false, read);
    (read ? reads_done : writes_done)++;
  }
};

TEST(Lanes, ReadsGoAheadOfQueuedWrites) {
  ClassModel m;
  m.l.waiting = 1;  // a stream of writes, alone
  m.fill();
  EXPECT_EQ(m.l.inflight, 112u);  // the whole share
  // Reads arrive: the first is issued at once (the share is full: after one completion),
  // and no write is issued until the writes are below their floor.
  m.l.waiting = 2;
  m.l.reads_waiting = 1;
  EXPECT_TRUE(m.fill().empty());
  std::size_t writes_issued = 0;
  for (int i = 0; i < 105; ++i) {
    m.complete_one();
    for (OpClass c : m.fill()) writes_issued += c == OpClass::Write ? 1 : 0;
  }
  EXPECT_EQ(writes_issued, 0u);  // 105 writes done, 7 still in flight: none refilled
  EXPECT_EQ(m.l.inflight - m.l.reads_inflight, 7u);
  // From here on a read waits in the device behind at most the writes' floor.
  m.max_writes_ahead = 0;
  for (int i = 0; i < 10000; ++i) {
    m.complete_one();
    m.fill();
  }
  EXPECT_LE(m.max_writes_ahead, write_floor(shares(m.limits, 1)).requests);
}

TEST(Lanes, WritesAreNeverStarvedByReads) {
  ClassModel m;
  m.l.waiting = 2;  // reads and writes both waiting, always
  m.l.reads_waiting = 1;
  m.fill();
  const Shares f = write_floor(shares(m.limits, 1));
  EXPECT_EQ(m.l.inflight, 112u);
  EXPECT_EQ(m.l.inflight - m.l.reads_inflight, f.requests);  // the floor is theirs at once
  for (int i = 0; i < 100000; ++i) {
    m.complete_one();
    m.fill();
    ASSERT_GE(m.l.inflight - m.l.reads_inflight + 1, f.requests) << i;  // at most one slot short, refilled
  }
  // A bounded share below: writes get floor/share of the completions, reads the rest.
  const double share = double(m.writes_done) / double(m.writes_done + m.reads_done);
  EXPECT_NEAR(share, double(f.requests) / 112.0, 0.01);
  EXPECT_GT(m.reads_done, 10 * m.writes_done);
}

TEST(Lanes, ClassesKeepTheNewcomerReserve) {
  // A lane of writes and reads holding its share leaves the reserve to a newcomer lane.
  const LaneLimits limits{.queue_depth = 32, .quantum = kMiB};
  const Shares sh = shares(limits, 1);
  LaneLoad busy;
  busy.waiting = 2;
  busy.reads_waiting = 1;
  busy.inflight = 28;
  busy.inflight_bytes = 28 * kMiB;
  busy.reads_inflight = 27;
  busy.read_bytes = 27 * kMiB;
  const Free free{4, 16};
  EXPECT_FALSE(may_issue(busy, sh, free, reserve(limits)));
  LaneLoad newcomer;
  newcomer.waiting = 1;
  newcomer.reads_waiting = 1;
  EXPECT_TRUE(may_issue(newcomer, shares(limits, 2), free, reserve(limits)));
}

}  // namespace
}  // namespace deepio::detail
