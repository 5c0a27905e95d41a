// The engine's argument checks (engine/checks.hpp), one table per check: each row an input
// and its outcome: accepted (with the value returned, where there is one), or refused with
// an errno, whether it is an InvalidArgument, and a piece of the message the caller reads.
#include <cerrno>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deepio/error.hpp"
#include "engine/checks.hpp"

namespace deepio::detail {
namespace {

constexpr std::uint64_t kNegOne = std::numeric_limits<std::uint64_t>::max();  // -1 as a binding passes it
constexpr std::uint64_t kOffMax = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());

struct Outcome {
  bool accepted = true;
  int errnum = 0;
  bool invalid_argument = false;
  std::string says;  // a substring of the message
};
const Outcome kOk{};
Outcome refused(int errnum, std::string says) { return {false, errnum, errnum == EINVAL, std::move(says)}; }
Outcome overflow(std::string says) { return {false, EOVERFLOW, false, std::move(says)}; }

void expect(const Outcome& want, const std::function<void()>& call) {
  try {
    call();
    EXPECT_TRUE(want.accepted) << "accepted; expected: " << want.says;
  } catch (const Error& e) {
    EXPECT_FALSE(want.accepted) << "refused: " << e.message();
    EXPECT_EQ(e.errnum(), want.errnum) << e.message();
    EXPECT_EQ(e.invalid_argument(), want.invalid_argument) << e.message();
    EXPECT_NE(e.message().find(want.says), std::string::npos)
        << "message: " << e.message() << "; wanted: " << want.says;
  }
}

char buffer[64];

TEST(Checks, AsWritten) {
  EXPECT_EQ(as_written(0), "0");
  EXPECT_EQ(as_written(42), "42");
  EXPECT_EQ(as_written(kMaxCount), "9223372036854775807");
  EXPECT_EQ(as_written(kNegOne), "-1");
  EXPECT_EQ(as_written(kNegOne - 4), "-5");
}

TEST(Checks, FileName) {
  const std::string path = "/data/x.bin";
  EXPECT_EQ(file_name(&path, -1), "/data/x.bin");
  EXPECT_EQ(file_name(nullptr, 7), "fd 7");
}

TEST(Checks, Count) {
  struct Row {
    std::size_t value, max;
    Outcome outcome;
  };
  const std::vector<Row> rows = {
      {1, 65536, kOk},
      {65536, 65536, kOk},
      {kMaxCount, kMaxCount, kOk},
      {0, 65536, refused(EINVAL, "queue_depth must be a positive integer of at most 65536, got 0")},
      {65537, 65536, refused(EINVAL, "of at most 65536, got 65537")},
      {0, kMaxCount, refused(EINVAL, "queue_depth must be a positive integer, got 0")},
      {kNegOne, kMaxCount, refused(EINVAL, "must be a positive integer, got -1")},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.value);
    expect(r.outcome, [&] { check_count("queue_depth", r.value, r.max); });
  }
}

TEST(Checks, Request) {
  struct Row {
    const void* buf;
    std::size_t nbytes;
    std::uint64_t file_offset;
    Outcome outcome;
  };
  const std::vector<Row> rows = {
      {buffer, 64, 0, kOk},
      {nullptr, 0, 0, kOk},  // an empty request needs no buffer
      {nullptr, 0, 4096, kOk},
      {buffer, 0, kOffMax, kOk},
      {buffer, 1, kOffMax - 1, kOk},
      {nullptr, 1, 0, refused(EINVAL, "null buffer")},
      {buffer, 1, kNegOne, refused(EINVAL, "file_offset must be non-negative, got -1")},
      {buffer, 0, kMaxCount + 1, refused(EINVAL, "file_offset must be non-negative, got -9223372036854775808")},
      {buffer, 1, kOffMax, overflow("file_offset + nbytes overflows a file offset")},
      {buffer, 64, kOffMax - 10, overflow("file_offset + nbytes overflows")},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(testing::Message() << "nbytes " << r.nbytes << " at " << r.file_offset);
    expect(r.outcome, [&] { check_request(r.buf, r.nbytes, "f", r.file_offset); });
    EXPECT_EQ(request_valid(r.buf, r.nbytes, r.file_offset), r.outcome.accepted);
    Outcome at = r.outcome;
    if (!at.accepted) at.says = "range 5: " + at.says;
    expect(at, [&] { check_request_at("range 5: ", r.buf, r.nbytes, "f", r.file_offset); });
  }
}

TEST(Checks, Ranges) {
  struct Row {
    const char* what;
    bool write;
    const void* buf;
    std::vector<IoRange> ranges;  // {file_offset, buffer_offset, nbytes}
    Outcome outcome;
    std::uint64_t total = 0;  // when accepted
  };
  const std::vector<Row> rows = {
      {"none", false, buffer, {}, kOk, 0},
      {"one", false, buffer, {{100, 0, 64}}, kOk, 64},
      {"sorted, adjacent", false, buffer, {{0, 0, 32}, {1000, 32, 32}}, kOk, 64},
      {"unsorted read", false, buffer, {{0, 32, 32}, {1000, 0, 32}}, kOk, 64},
      {"read: same file bytes twice is fine", false, buffer, {{0, 0, 32}, {0, 32, 32}}, kOk, 64},
      {"write: same buffer bytes twice is fine", true, buffer, {{0, 0, 32}, {32, 0, 32}}, kOk, 64},
      {"empty ranges overlap nothing", false, buffer, {{0, 10, 0}, {0, 0, 64}, {0, 10, 0}}, kOk, 64},
      {"empty at the buffer's end", false, buffer, {{0, 64, 0}}, kOk, 0},
      {"empty ranges need no buffer", false, nullptr, {{0, 0, 0}}, kOk, 0},
      {"past the buffer",
       false,
       buffer,
       {{0, 32, 33}},
       refused(EINVAL, "range 0: buffer bytes [32, +33) lie outside the buffer of 64 bytes")},
      {"starts past the buffer",
       false,
       buffer,
       {{0, 0, 1}, {0, 65, 0}},
       refused(EINVAL, "range 1: buffer bytes [65, +0) lie outside")},
      {"negative buffer offset",
       false,
       buffer,
       {{0, static_cast<std::size_t>(kNegOne), 1}},
       refused(EINVAL, "buffer bytes [-1, +1)")},
      {"null buffer", false, nullptr, {{0, 0, 1}}, refused(EINVAL, "null buffer")},
      {"negative file offset",
       true,
       buffer,
       {{0, 0, 1}, {kNegOne, 1, 1}},
       refused(EINVAL, "range 1: file_offset must be non-negative, got -1")},
      {"file offset overflows", false, buffer, {{kOffMax, 0, 1}}, overflow("range 0: file_offset + nbytes overflows")},
      {"read overlap in the buffer",
       false,
       buffer,
       {{0, 0, 32}, {1000, 16, 32}},
       refused(EINVAL, "ranges 0 and 1 overlap in the buffer (a read would fill the same bytes twice)")},
      {"write overlap in the file",
       true,
       buffer,
       {{0, 0, 32}, {16, 32, 32}},
       refused(EINVAL, "ranges 0 and 1 overlap in the file")},
      {"unsorted overlap names both",
       true,
       buffer,
       {{100, 0, 8}, {0, 8, 8}, {104, 16, 8}},
       refused(EINVAL, "ranges 0 and 2 overlap in the file")},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    std::uint64_t total = 0;
    expect(r.outcome, [&] { total = check_ranges(r.write, r.buf, sizeof buffer, "f", r.ranges); });
    if (r.outcome.accepted) {
      EXPECT_EQ(total, r.total);
    }
  }
}

TEST(Checks, RangesSizesOverflow) {
  // Every range within a huge "buffer" (never touched: the checks read no memory).
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  const std::vector<IoRange> ranges = {{0, 0, kMaxCount}, {0, kMaxCount, 1}};
  expect(overflow("range 1: the ranges' sizes add up to more than 2^63 - 1 bytes"),
         [&] { check_ranges(false, buffer, huge, "f", ranges); });
}

TEST(Checks, Batch) {
  IoRequest read;
  read.buffer = buffer;
  read.nbytes = 64;
  read.path = "/data/a";
  IoRequest by_fd = read;
  by_fd.path.clear();
  by_fd.fd = 3;
  IoRequest durable = read;
  durable.write = true;
  durable.op.fsync = true;
  IoRequest both = read;
  both.fd = 3;
  IoRequest neither = by_fd;
  neither.fd = -1;
  IoRequest durable_read = read;
  durable_read.op.fsync = true;
  IoRequest null_buffer = by_fd;
  null_buffer.buffer = nullptr;
  IoRequest negative = read;
  negative.file_offset = kNegOne;
  IoRequest overflowing = read;
  overflowing.file_offset = kOffMax;

  struct Row {
    const char* what;
    std::vector<IoRequest> batch;
    Outcome outcome;
  };
  const std::vector<Row> rows = {
      {"empty", {}, kOk},
      {"path, fd, durable write", {read, by_fd, durable}, kOk},
      {"both path and fd", {read, both}, refused(EINVAL, "request 1 of the batch: exactly one of path and fd")},
      {"neither", {neither}, refused(EINVAL, "request 0 of the batch: exactly one of path and fd must name the file")},
      {"fsync on a read",
       {read, read, durable_read},
       refused(EINVAL, "request 2 of the batch: fsync applies to writes only")},
      {"null buffer, by fd", {null_buffer}, refused(EINVAL, "request 0 of the batch: null buffer")},
      {"negative offset",
       {read, negative},
       refused(EINVAL, "request 1 of the batch: file_offset must be non-negative")},
      {"overflow", {overflowing}, overflow("request 0 of the batch: file_offset + nbytes overflows")},
      {"first refusal wins", {neither, durable_read}, refused(EINVAL, "request 0 of the batch")},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    expect(r.outcome, [&] { check_batch(r.batch); });
  }
}

TEST(Checks, RefusalsCarryTheFileAndRange) {
  const auto caught = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "accepted";
    return Error(0, "");
  };
  const Error null = caught([] { check_request_at("request 2 of the batch: ", nullptr, 64, "fd 9", 128); });
  EXPECT_TRUE(null.invalid_argument());
  EXPECT_EQ(null.path(), "fd 9");
  EXPECT_EQ(null.offset(), 128u);
  EXPECT_EQ(null.nbytes(), 64u);
  const Error over = caught([] { check_request_at("range 1: ", buffer, 64, "/data/a", kOffMax); });
  EXPECT_FALSE(over.invalid_argument());
  EXPECT_EQ(over.path(), "/data/a");
  EXPECT_EQ(over.offset(), kOffMax);
  EXPECT_EQ(over.nbytes(), 64u);
}

}  // namespace
}  // namespace deepio::detail
