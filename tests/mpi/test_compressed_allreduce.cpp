// deepio::comm::compressed_allreduce against the reference simulations, run by CTest under
// mpirun at 2, 3 and 4 ranks. Every rank generates every rank's inputs from a fixed seed, so
// each rank can run the whole simulation locally and compare its own results with it.
//
// Rule for tests that call collectives: no ASSERT_* (an early return on one rank would leave
// the others waiting in the next collective); use EXPECT_* and run the collectives regardless.
#include <deepio/comm.hpp>

#include "reference.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace dc = deepio::comm;
using dc::test::RankState;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int comm_size(MPI_Comm c) {
  int w = 0;
  MPI_Comm_size(c, &w);
  return w;
}
int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

// The seed's inputs: U[0,1) - 0.5 + 0.01 * rank, from a generator keyed by (rank, call, salt).
std::vector<float> make_input(std::size_t n0, int rank, int call, unsigned salt = 0) {
  std::mt19937 gen(static_cast<unsigned>(rank) * 7919u + static_cast<unsigned>(call) * 104729u + salt);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(n0);
  for (float& x : v) x = u(gen) - 0.5f + 0.01f * static_cast<float>(rank);
  return v;
}

bool same_bits(const std::vector<float>& a, const float* b, std::size_t n) {
  return a.size() == n && (n == 0 || std::memcmp(a.data(), b, n * sizeof(float)) == 0);
}

std::size_t first_difference(const std::vector<float>& a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return n;
}

// Runs `calls` consecutive calls on comm with the given sizes and checks output, worker_error
// and server_error bit for bit against simulate_spec. rank_of[k] = the input key of comm
// rank k (the world rank, so sub-communicators get distinct inputs).
void check_against_spec(MPI_Comm comm, const std::vector<int>& rank_of, std::size_t n0, std::size_t n, bool in_place,
                        int calls, unsigned salt) {
  const auto w = static_cast<std::size_t>(comm_size(comm));
  const auto me = static_cast<std::size_t>(comm_rank(comm));
  std::vector<RankState> states(w);
  for (auto& s : states) {
    s.worker_error.assign(n, 0.0f);
    s.server_error.assign(n / w, 0.0f);
  }
  std::vector<float> worker_error(n, 0.0f), server_error(n / w, 0.0f);
  for (int call = 0; call < calls; ++call) {
    std::vector<std::vector<float>> inputs(w);
    for (std::size_t r = 0; r < w; ++r) inputs[r] = make_input(n0, rank_of[r], call, salt);
    const std::vector<float> expected = dc::test::simulate_spec(inputs, states);

    std::vector<float> buffer = inputs[me];
    std::vector<float> out(n0, std::numeric_limits<float>::quiet_NaN());
    if (in_place) {
      dc::compressed_allreduce(std::span<float>(buffer), worker_error, server_error, comm);
      out = buffer;
    } else {
      dc::compressed_allreduce(std::span<const float>(buffer), std::span<float>(out), worker_error, server_error, comm);
      EXPECT_TRUE(same_bits(inputs[me], buffer.data(), n0)) << "input modified by the out-of-place call";
    }
    const std::string where = "W=" + std::to_string(w) + " rank " + std::to_string(me) + " call " +
                              std::to_string(call) + " n0=" + std::to_string(n0) + " n=" + std::to_string(n) +
                              (in_place ? " in place" : " out of place");
    EXPECT_TRUE(same_bits(expected, out.data(), n0))
        << where << ": output differs first at " << first_difference(expected, out.data(), n0);
    EXPECT_TRUE(same_bits(states[me].worker_error, worker_error.data(), n))
        << where << ": worker_error differs first at "
        << first_difference(states[me].worker_error, worker_error.data(), n);
    EXPECT_TRUE(same_bits(states[me].server_error, server_error.data(), n / w))
        << where << ": server_error differs first at "
        << first_difference(states[me].server_error, server_error.data(), n / w);
  }
}

std::vector<int> world_keys(MPI_Comm comm) {
  std::vector<int> keys(static_cast<std::size_t>(comm_size(comm)));
  int me = world_rank();
  MPI_Allgather(&me, 1, MPI_INT, keys.data(), 1, MPI_INT, comm);
  return keys;
}

struct Shape {
  std::size_t chunks_of_8;  // N = 8 * W * chunks_of_8
  std::size_t short_by;     // N0 = N - short_by
};

}  // namespace

// Bit-exact against the specification over 5 consecutive calls (error feedback exercised),
// with and without padding, in place and not. Chunk byte counts are odd so that every
// vector loop has a tail; the largest shape spans more than one of the slices in which the
// residual passes alternate with MPI_Test (65536 elements), on a shorter run of calls.
TEST(CompressedAllreduce, MatchesSpecSimulationBitForBit) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  const std::vector<int> keys = world_keys(MPI_COMM_WORLD);
  const Shape shapes[] = {{1, 0}, {1, 8 * w - 1}, {517, 0}, {517, 13}, {517, 8 * w * 3 + 5}, {4096 + 3, 1}};
  unsigned salt = 0;
  for (const Shape& sh : shapes) {
    const std::size_t n = 8 * w * sh.chunks_of_8;
    const int calls = sh.chunks_of_8 > 1000 ? 2 : 5;
    for (bool in_place : {true, false})
      check_against_spec(MPI_COMM_WORLD, keys, n - sh.short_by, n, in_place, calls, ++salt);
  }
}

// DeepSpeed's own check (tests/onebit/test_mpi_backend.py), made strict: zero errors, N0
// divisible by 8W, compare with DeepSpeed's torch_sim. W = 2: identical bits (onebit.md §1.5).
// W > 2: the summation order differs, so apply onebit.md §4's scheme, two-sided: wherever the
// results differ by more than 1e-6 in this rank's chunk, the compensated server value
// (output + server_error) must be within 1e-6 of zero (a sign decided by rounding); and such
// positions must be rare.
TEST(CompressedAllreduce, MatchesDeepSpeedTorchSim) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  const auto me = static_cast<std::size_t>(comm_rank(MPI_COMM_WORLD));
  const std::size_t n = 8 * w * 4096;
  std::vector<std::vector<float>> inputs(w);
  for (std::size_t r = 0; r < w; ++r) inputs[r] = make_input(n, static_cast<int>(r), 0, 99);
  const auto sim = dc::test::simulate_deepspeed(inputs);

  std::vector<float> buffer = inputs[me];
  std::vector<float> worker_error(n, 0.0f), server_error(n / w, 0.0f);
  dc::compressed_allreduce(std::span<float>(buffer), worker_error, server_error, MPI_COMM_WORLD);

  const std::size_t c = n / w;
  if (w == 2) {
    EXPECT_TRUE(same_bits(sim.out, buffer.data(), n))
        << "first difference at " << first_difference(sim.out, buffer.data(), n);
    EXPECT_TRUE(same_bits(sim.server_error[me], server_error.data(), c));
  }
  std::size_t differing = 0, failing = 0;
  for (std::size_t i = me * c; i < (me + 1) * c; ++i) {
    if (std::fabs(buffer[i] - sim.out[i]) > 1e-6f) {
      ++differing;
      const float server_value = buffer[i] + server_error[i - me * c];
      if (std::fabs(server_value) > 1e-6f) ++failing;
    }
  }
  EXPECT_EQ(failing, 0u) << "rank " << me << ": " << failing << " positions differ from torch_sim away from zero";
  EXPECT_LE(differing, c / 1000) << "rank " << me << ": too many sign flips against torch_sim";
}

// Empty input: residuals zeroed, nothing exchanged, and the communicator still works after.
TEST(CompressedAllreduce, EmptyInputZeroesErrors) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  std::vector<float> worker_error(8 * w * 3, 1.5f), server_error(8 * 3, -2.5f);
  std::vector<float> empty;
  EXPECT_NO_THROW(dc::compressed_allreduce(std::span<float>(empty), worker_error, server_error, MPI_COMM_WORLD));
  for (float e : worker_error) EXPECT_EQ(e, 0.0f);
  for (float e : server_error) EXPECT_EQ(e, 0.0f);
  std::vector<float> none_w, none_s;
  EXPECT_NO_THROW(dc::compressed_allreduce(std::span<float>(empty), none_w, none_s, MPI_COMM_WORLD));
  check_against_spec(MPI_COMM_WORLD, world_keys(MPI_COMM_WORLD), 40, 8 * w * 5, true, 2, 7);
}

// A zero input with zero errors gives exactly zero and keeps the errors zero (the optimizers'
// warm-up call relies on it).
TEST(CompressedAllreduce, ZeroInputStaysZero) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  std::vector<float> buffer(8 * w * 9, 0.0f), worker_error(8 * w * 9, 0.0f), server_error(8 * 9, 0.0f);
  dc::compressed_allreduce(std::span<float>(buffer), worker_error, server_error, MPI_COMM_WORLD);
  for (float v : buffer) EXPECT_EQ(v, 0.0f);
  for (float e : worker_error) EXPECT_EQ(e, 0.0f);
  for (float e : server_error) EXPECT_EQ(e, 0.0f);
}

namespace {

// Calls with sizes that may be wrong on some ranks; expects on EVERY rank the same
// ArgumentError -- a deepio::InvalidArgument (errno EINVAL), caught here as the deepio::Error
// that every deepio failure is -- with reason `reason`, failing rank `bad_rank` (-1: lengths
// differ across ranks) and a message containing `needle`; then proves the communicator is
// still in step with a valid call.
void expect_error_everywhere(std::size_t n0, std::size_t n, std::size_t ns, const std::string& needle,
                             dc::Reason reason, int bad_rank) {
  std::vector<float> buffer(n0, 1.0f), worker_error(n, 0.0f), server_error(ns, 0.0f);
  bool thrown = false;
  try {
    dc::compressed_allreduce(std::span<float>(buffer), worker_error, server_error, MPI_COMM_WORLD);
  } catch (const deepio::Error& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_TRUE(e.invalid_argument());
    EXPECT_NE(dynamic_cast<const deepio::InvalidArgument*>(&e), nullptr);
    const auto* a = dynamic_cast<const dc::ArgumentError*>(&e);
    EXPECT_NE(a, nullptr) << "not a deepio::comm::ArgumentError: " << e.what();
    if (a != nullptr) {
      EXPECT_EQ(a->reason(), reason) << dc::reason_name(a->reason()) << ": " << e.what();
      EXPECT_EQ(a->rank(), bad_rank) << e.what();
    }
  }
  EXPECT_TRUE(thrown) << "rank " << world_rank() << ": no error for n0=" << n0 << " n=" << n << " ns=" << ns;
  int all = thrown ? 1 : 0, min_all = 0;
  MPI_Allreduce(&all, &min_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(min_all, 1) << "some rank did not raise";
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  check_against_spec(MPI_COMM_WORLD, world_keys(MPI_COMM_WORLD), 8 * w, 8 * w, false, 1, 3);
}

}  // namespace

TEST(CompressedAllreduce, SizeViolationsRaiseOnEveryRank) {
  using R = dc::Reason;
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  const auto r = static_cast<std::size_t>(world_rank());
  const std::size_t n = 8 * w * 4;
  const int last = static_cast<int>(w) - 1;
  // worker_error not a multiple of 8W, on every rank (W*(8*4) + W is divisible by W, not 8W):
  // every rank fails its own check; the lowest one, rank 0, is reported.
  expect_error_everywhere(n, n + w, (n + w) / w, "not a multiple of 8 * W", R::worker_not_multiple, 0);
  // ... on the last rank only: the others learn which rank.
  expect_error_everywhere(n, static_cast<int>(r) == last ? n + 8 : n, n / w, "rank " + std::to_string(last),
                          R::worker_not_multiple, last);
  // server_error of the wrong length on rank 0 only.
  expect_error_everywhere(n, n, r == 0 ? n / w + 1 : n / w, "server_error length is not", R::server_size, 0);
  // input longer than worker_error on rank 1 only.
  expect_error_everywhere(r == 1 ? n + 1 : n, n, n / w, "rank 1", R::input_too_long, 1);
  // Lengths that are valid on each rank but differ across ranks.
  expect_error_everywhere(n, r == 0 ? 2 * n : n, r == 0 ? 2 * n / w : n / w, "worker_error length differs across ranks",
                          R::worker_mismatch, -1);
  expect_error_everywhere(r == 0 ? n - 1 : n, n, n / w, "input length differs across ranks", R::input_mismatch, -1);
  // Empty here, not there: an error, not a hang.
  expect_error_everywhere(r == 0 ? 0 : n, n, n / w, "input length differs across ranks", R::input_mismatch, -1);
}

TEST(CompressedAllreduce, AliasingRaisesOnEveryRank) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  const std::size_t n = 8 * w * 4;
  std::vector<float> storage(3 * n, 0.0f);
  std::span<float> worker_error(storage.data(), n);
  std::span<float> server_error(storage.data() + n, n / w);
  // rank 0: the buffer overlaps worker_error; other ranks fine.
  std::span<float> buffer = world_rank() == 0 ? std::span<float>(storage.data() + n / 2, n)
                                              : std::span<float>(storage.data() + 2 * n, n);
  bool thrown = false;
  try {
    dc::compressed_allreduce(buffer, worker_error, server_error, MPI_COMM_WORLD);
  } catch (const dc::ArgumentError& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_EQ(e.reason(), dc::Reason::error_overlap);
    EXPECT_EQ(e.rank(), 0);
  }
  EXPECT_TRUE(thrown);
  // Partial overlap of input and output.
  std::vector<float> big(2 * n, 1.0f), ew(n, 0.0f), es(n / w, 0.0f);
  thrown = false;
  try {
    dc::compressed_allreduce(std::span<const float>(big.data(), n), std::span<float>(big.data() + 1, n), ew, es,
                             MPI_COMM_WORLD);
  } catch (const dc::ArgumentError& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find("partially overlaps"), std::string::npos) << e.what();
    EXPECT_EQ(e.reason(), dc::Reason::output_overlap);
  }
  EXPECT_TRUE(thrown);
  std::vector<float> a(n), b(n + 1);
  EXPECT_THROW(dc::compressed_allreduce(std::span<const float>(a), std::span<float>(b), ew, es, MPI_COMM_WORLD),
               dc::ArgumentError);
  EXPECT_THROW(dc::compressed_allreduce(std::span<float>(a), ew, es, MPI_COMM_NULL), dc::ArgumentError);
}

// Arguments refused on the calling rank alone, before any communication: still an
// ArgumentError (a deepio::InvalidArgument), with Reason::none and no rank.
TEST(CompressedAllreduce, LocalArgumentErrors) {
  std::vector<float> a(64), ew(64), es(64);
  try {
    dc::compressed_allreduce(std::span<float>(a), ew, es, MPI_COMM_NULL);
    ADD_FAILURE() << "MPI_COMM_NULL accepted";
  } catch (const deepio::InvalidArgument& e) {
    const auto* ae = dynamic_cast<const dc::ArgumentError*>(&e);
    ASSERT_NE(ae, nullptr);
    EXPECT_EQ(ae->reason(), dc::Reason::none);
    EXPECT_EQ(ae->rank(), -1);
    EXPECT_EQ(e.errnum(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("MPI_COMM_NULL"), std::string::npos) << e.what();
  }
  EXPECT_THROW(static_cast<void>(dc::padded_size(10, 0)), dc::ArgumentError);
  EXPECT_EQ(dc::padded_size(10, 1), 16u);
}

// A failing MPI call becomes a CommError: a deepio::Error with errno EIO, the MPI error class
// and MPI's text. The failure is real and local: under MPI_ERRORS_RETURN, MPI refuses a
// communicator handle that is neither a communicator nor MPI_COMM_NULL (a zero handle: a null
// pointer in Open MPI, an invalid integer in MPICH), and reports it through MPI_COMM_WORLD's
// error handler, so the world's handler is switched for the call and restored after.
TEST(CompressedAllreduce, MpiFailureIsCommError) {
  std::vector<float> a(64), ew(64), es(64);
  const MPI_Comm not_a_comm{};
  ASSERT_NE(not_a_comm, MPI_COMM_NULL) << "this MPI's null handle is zero; the test needs another invalid handle";
  MPI_Errhandler before = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &before);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  bool thrown = false;
  try {
    dc::compressed_allreduce(std::span<float>(a), ew, es, not_a_comm);
  } catch (const deepio::Error& e) {
    thrown = true;
    EXPECT_EQ(e.errnum(), EIO) << e.what();
    EXPECT_FALSE(e.invalid_argument());
    const auto* ce = dynamic_cast<const dc::CommError*>(&e);
    EXPECT_NE(ce, nullptr) << e.what();
    if (ce != nullptr) {
      EXPECT_EQ(ce->mpi_error_class(), MPI_ERR_COMM) << e.what();
    }
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(MPI_ERR_COMM, text, &len);
    EXPECT_NE(std::string(e.what()).find(std::string(text, static_cast<std::size_t>(len))), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("MPI_Comm_test_inter"), std::string::npos) << e.what();
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, before);
  MPI_Errhandler_free(&before);
  EXPECT_TRUE(thrown);
}

// Error feedback: with the same inputs on every call, sum_k out_k = K*avg - mean_r(e_w,r) - e_s
// exactly (in exact arithmetic), so the running mean of the outputs converges to the true
// average like 1/K. Check the identity and the convergence.
TEST(CompressedAllreduce, ErrorFeedbackRunningMeanConverges) {
  const auto w = static_cast<std::size_t>(comm_size(MPI_COMM_WORLD));
  const int me = comm_rank(MPI_COMM_WORLD);
  const std::size_t n = 8 * w * 64;
  const std::size_t n0 = n - 5;
  std::vector<double> avg(n0, 0.0);
  for (std::size_t r = 0; r < w; ++r) {
    const auto in = make_input(n0, static_cast<int>(r), 0, 4242);
    for (std::size_t i = 0; i < n0; ++i) avg[i] += static_cast<double>(in[i]) / static_cast<double>(w);
  }
  const std::vector<float> input = make_input(n0, me, 0, 4242);
  std::vector<float> worker_error(n, 0.0f), server_error(n / w, 0.0f), out(n0);
  std::vector<double> sum(n0, 0.0);
  double avg_norm = 0.0;
  for (double a : avg) avg_norm += a * a;
  avg_norm = std::sqrt(avg_norm);
  const auto rel_error = [&](int k) {
    double e = 0.0;
    for (std::size_t i = 0; i < n0; ++i) {
      const double d = sum[i] / k - avg[i];
      e += d * d;
    }
    return std::sqrt(e) / avg_norm;
  };
  double err10 = 0.0, err1 = 0.0;
  const int calls = 400;
  for (int k = 1; k <= calls; ++k) {
    dc::compressed_allreduce(std::span<const float>(input), std::span<float>(out), worker_error, server_error,
                             MPI_COMM_WORLD);
    for (std::size_t i = 0; i < n0; ++i) sum[i] += out[i];
    if (k == 1) err1 = rel_error(k);
    if (k == 10) err10 = rel_error(k);
  }
  const double err_final = rel_error(calls);
  EXPECT_GT(err1, 0.1) << "one call should be a coarse approximation";
  EXPECT_LT(err10, err1);
  EXPECT_LT(err_final, err10 / 10.0) << "err1=" << err1 << " err10=" << err10 << " err" << calls << "=" << err_final;
  EXPECT_LT(err_final, 0.02);

  // The telescoping identity, per element of this rank's chunk (padding positions are not
  // in the output, so the identity is checked on the first chunk only where it is unpadded).
  std::vector<float> all_we(w * n);
  MPI_Allgather(worker_error.data(), static_cast<int>(n), MPI_FLOAT, all_we.data(), static_cast<int>(n), MPI_FLOAT,
                MPI_COMM_WORLD);
  const std::size_t c = n / w;
  double worst = 0.0;
  for (std::size_t i = static_cast<std::size_t>(me) * c; i < std::min(n0, (me + 1) * c); ++i) {
    double mean_we = 0.0;
    for (std::size_t r = 0; r < w; ++r) mean_we += all_we[r * n + i];
    mean_we /= static_cast<double>(w);
    const double predicted = calls * avg[i] - mean_we - server_error[i - me * c];
    worst = std::max(worst, std::fabs(sum[i] - predicted));
  }
  EXPECT_LT(worst, 1e-3) << "error feedback identity violated";
}

// Sub-communicators: split the world two ways (by parity, and by halves with the rank order
// reversed) and check each part against the simulation of its own members.
TEST(CompressedAllreduce, SubCommunicators) {
  const int me = world_rank();
  const int world = comm_size(MPI_COMM_WORLD);
  MPI_Comm parity = MPI_COMM_NULL, halves = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &parity);
  MPI_Comm_split(MPI_COMM_WORLD, me < world / 2 ? 0 : 1, -me, &halves);
  for (MPI_Comm comm : {parity, halves}) {
    const auto w = static_cast<std::size_t>(comm_size(comm));
    const std::vector<int> keys = world_keys(comm);
    check_against_spec(comm, keys, 8 * w * 33 - 3, 8 * w * 33, true, 3, 11);
    check_against_spec(comm, keys, 8 * w * 33, 8 * w * 33, false, 3, 12);
  }
  // The two sub-communicators' calls interleave with a world call without interference.
  check_against_spec(MPI_COMM_WORLD, world_keys(MPI_COMM_WORLD), 100, 8 * static_cast<std::size_t>(world) * 13, true, 2,
                     13);
  MPI_Comm_free(&parity);
  MPI_Comm_free(&halves);
}

namespace {

// On ranks other than 0, print only failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = world_rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
