// The tune search against synthetic storage: a measure function with a known optimum, no disk.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

#include <gtest/gtest.h>

#include "tune.hpp"

namespace deepio::cli {
namespace {

/// A device model: throughput grows with bytes in flight (block_size x queue_depth x
/// io_parallel) up to a knee, then falls slowly (contention); overlap_events and
/// single_submit shift it a little. Each knob value gets its own factor so the optimum is one
/// known configuration.
struct Model {
  double knee = 128.0 * (1 << 20);  // bytes in flight where the device saturates
  double peak_read = 3.0, peak_write = 2.0;
  bool overlap_best = true, single_best = false;
  double gib(const TuneConfig& c, bool read) const {
    const double inflight = static_cast<double>(c.block_size * c.queue_depth * c.io_parallel);
    const double x = inflight / knee;
    double v = (read ? peak_read : peak_write) * (x <= 1 ? x : 1.0 / (1.0 + 0.2 * (x - 1)));
    v *= c.overlap_events == overlap_best ? 1.0 : 0.9;
    v *= c.single_submit == single_best ? 1.0 : 0.95;
    v *= 1.0 - 0.01 * static_cast<double>(c.io_parallel);  // threads cost a little
    return v;
  }
  TuneConfig best_of(const std::vector<TuneConfig>& all) const {
    return *std::max_element(all.begin(), all.end(), [&](const TuneConfig& a, const TuneConfig& b) {
      return gib(a, true) + gib(a, false) < gib(b, true) + gib(b, false);
    });
  }
};

struct Recorder {
  const Model& model;
  std::vector<TuneRun> runs;
  double operator()(const TuneRun& r) {
    runs.push_back(r);
    return model.gib(r.cfg, r.read);
  }
};

TEST(Tune, SearchFindsTheKnownOptimumWithinItsBudget) {
  const TuneSpace space;  // DeepSpeed's 64 configurations
  const Model model;
  Recorder rec{model, {}};
  const TuneResult r = tune_search(space, {.io_size = 400ULL << 20, .loops = 2}, std::ref(rec));
  const TuneConfig best = model.best_of(space.all());
  EXPECT_EQ(best, (TuneConfig{1 << 20, 128, false, true, 1})) << "the model's optimum is not the first tried";
  EXPECT_EQ(r.outcome.best, best) << r.outcome.best.label() << " vs " << best.label();
  EXPECT_DOUBLE_EQ(r.outcome.read, model.gib(best, true));
  EXPECT_DOUBLE_EQ(r.outcome.write, model.gib(best, false));
  EXPECT_EQ(r.runs, rec.runs.size());
  EXPECT_LE(r.runs, search_budget(space, true, true));
  EXPECT_EQ(search_budget(space, true, true), 68U);
  EXPECT_LT(r.runs, space.all().size() * 2) << "the point of the search: fewer runs than the sweep";
  EXPECT_LT(r.distinct_configs(), space.all().size());
}

TEST(Tune, TheOptimumMayNeedTheSubmissionKnobs) {
  TuneSpace space;
  Model model;
  model.overlap_best = false;  // the screen (overlap on, single off) cannot see it; refine must
  model.single_best = true;
  Recorder rec{model, {}};
  const TuneResult r = tune_search(space, {.io_size = 64ULL << 20}, std::ref(rec));
  EXPECT_EQ(r.outcome.best, model.best_of(space.all())) << r.outcome.best.label();
  EXPECT_FALSE(r.outcome.best.overlap_events);
  EXPECT_TRUE(r.outcome.best.single_submit);
}

TEST(Tune, StagesUseTheirSizesLoopsAndOrder) {
  const TuneSpace space;
  const Model model;
  Recorder rec{model, {}};
  const TuneOptions opt{.io_size = 400ULL << 20, .loops = 3};
  const TuneResult r = tune_search(space, opt, std::ref(rec));
  const StageSizes sz = stage_sizes(space, opt.io_size);
  EXPECT_EQ(sz.screen, 64ULL << 20) << "max(io/8, 8M x 8 workers)";
  EXPECT_EQ(sz.confirm, 100ULL << 20);
  EXPECT_EQ(sz.full, opt.io_size);
  std::size_t k = 0;  // walk the runs beside the records: read then write per configuration
  for (const auto& rec_ : r.records) {
    const std::uint64_t want = rec_.stage == "screen" ? sz.screen : rec_.stage == "final" ? sz.full : sz.confirm;
    EXPECT_EQ(rec_.io_size, want) << rec_.stage;
    ASSERT_LT(k, rec.runs.size());
    EXPECT_TRUE(rec.runs[k].read);
    EXPECT_EQ(rec.runs[k].cfg, rec_.cfg);
    EXPECT_EQ(rec.runs[k].loops, rec_.stage == "final" ? 3U : 1U);
    k += rec_.pruned ? 1 : 2;
  }
  EXPECT_EQ(k, rec.runs.size());
  // Stages in order; six finals (three finalists, two interleaved rounds).
  std::vector<std::string> stages;
  for (const auto& x : r.records) {
    if (stages.empty() || stages.back() != x.stage) stages.push_back(x.stage);
  }
  EXPECT_EQ(stages, (std::vector<std::string>{"screen", "confirm", "refine", "final"}));
  std::vector<TuneConfig> finals;
  for (const auto& x : r.records) {
    if (x.stage == "final") finals.push_back(x.cfg);
  }
  ASSERT_EQ(finals.size(), 6U);
  EXPECT_TRUE(std::equal(finals.begin(), finals.begin() + 3, finals.begin() + 3)) << "A B C A B C";
}

TEST(Tune, WeakReadsArePrunedBeforeTheirWrite) {
  const TuneSpace space;
  const Model model;
  Recorder rec{model, {}};
  const TuneResult r = tune_search(space, {.io_size = 400ULL << 20}, std::ref(rec));
  double best_read = 0;
  std::size_t pruned = 0;
  for (const auto& x : r.records) {
    if (x.stage != "screen") continue;
    EXPECT_EQ(x.pruned, x.read < 0.5 * best_read) << x.cfg.label();
    EXPECT_EQ(x.write < 0, x.pruned) << "a pruned configuration is not written";
    best_read = std::max(best_read, x.read);
    pruned += x.pruned ? 1 : 0;
  }
  EXPECT_GT(pruned, 0U) << "this model has weak configurations";
  for (const auto& x : r.records) {
    if (x.stage == "confirm" || x.stage == "final") {
      EXPECT_FALSE(x.pruned);
      for (const auto& y : r.records) {
        if (y.stage == "screen" && y.cfg == x.cfg) {
          EXPECT_FALSE(y.pruned) << "pruned configurations leave the search";
        }
      }
    }
  }
}

TEST(Tune, ReadOnlyAndWriteOnly) {
  const TuneSpace space;
  const Model model;
  Recorder reads{model, {}}, writes{model, {}};
  const TuneResult r = tune_search(space, {.io_size = 400ULL << 20, .write = false}, std::ref(reads));
  const TuneResult w = tune_search(space, {.io_size = 400ULL << 20, .read = false}, std::ref(writes));
  for (const auto& x : reads.runs) EXPECT_TRUE(x.read);
  for (const auto& x : writes.runs) EXPECT_FALSE(x.read);
  for (const auto& x : w.records) EXPECT_FALSE(x.pruned) << "no read, nothing to prune on";
  EXPECT_LE(reads.runs.size(), search_budget(space, true, false));
  EXPECT_EQ(writes.runs.size(), search_budget(space, false, true)) << "without pruning the budget is exact";
  EXPECT_EQ(r.outcome.write, 0.0);
  EXPECT_GT(r.outcome.read, 0.0);
}

TEST(Tune, ExhaustiveMeasuresEverythingOnceAndKeepsTheFirstBest) {
  TuneSpace space;
  space.block_size = {1 << 20};
  space.queue_depth = {32, 64};
  const Model model;
  Recorder rec{model, {}};
  std::size_t callbacks = 0;
  const TuneResult r = tune_exhaustive(
      space, {.io_size = 8 << 20, .loops = 2, .on_record = [&](const TuneRecord&) { ++callbacks; }}, std::ref(rec));
  EXPECT_EQ(rec.runs.size(), space.all().size() * 2);
  EXPECT_EQ(callbacks, space.all().size());
  EXPECT_EQ(r.distinct_configs(), space.all().size());
  EXPECT_EQ(r.outcome.best, model.best_of(space.all()));
  for (const auto& x : rec.runs) {
    EXPECT_EQ(x.io_size, 8U << 20);
    EXPECT_EQ(x.loops, 2U);
  }
  // Equal scores: the first in ds_nvme_tune's order wins.
  Recorder flat{model, {}};
  const TuneResult f = tune_exhaustive(space, {.io_size = 8 << 20}, [&](const TuneRun& run) {
    flat.runs.push_back(run);
    return 1.0;
  });
  EXPECT_EQ(f.outcome.best, space.all().front());
}

TEST(Tune, AFailedMeasurementEndsTheSearch) {
  int calls = 0;
  auto failing = [&](const TuneRun&) -> double {
    if (++calls == 5) throw std::runtime_error("EIO on the device");
    return 1.0;
  };
  EXPECT_THROW(tune_search(TuneSpace{}, {.io_size = 400ULL << 20}, failing), std::runtime_error);
  EXPECT_EQ(calls, 5);
}

TEST(Tune, PickFinalTakesMediansPerConfiguration) {
  const TuneConfig a{1 << 20, 32, false, true, 1}, b{8 << 20, 32, false, true, 1};
  const std::vector<TuneRecord> recs = {
      {a, "final", 1, 1.0, 1.0, false},      {b, "final", 1, 5.0, 0.1, false}, {a, "final", 1, 3.0, 1.0, false},
      {b, "final", 1, 0.1, 0.1, false},      {a, "final", 1, 2.0, 1.0, false}, {b, "final", 1, 0.2, 0.1, false},
      {b, "screen", 1, 100.0, 100.0, false},  // other stages do not count
  };
  const TuneOutcome o = pick_final(recs, "final");
  EXPECT_EQ(o.best, a);
  EXPECT_DOUBLE_EQ(o.read, 2.0);
  EXPECT_DOUBLE_EQ(o.write, 1.0);
  EXPECT_EQ(pick_final(recs, "screen").best, b);
}

TEST(Tune, SweepConfigParsing) {
  std::vector<std::string> errors;
  const TuneSpace s = parse_sweep_config(
      R"({"block_size": ["256K", 1048576], "queue_depth": 8, "io_parallel": [1, "2"],
          "sequential_requests": ["False", true], "single_submit": [false]})",
      "s.json", errors);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(s.block_size, (std::vector<std::uint64_t>{256 << 10, 1 << 20}));
  EXPECT_EQ(s.queue_depth, (std::vector<std::uint64_t>{8}));
  EXPECT_EQ(s.io_parallel, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(s.sequential_requests, (std::vector<bool>{false, true}));
  EXPECT_EQ(s.all().size(), 2U * 1 * 2 * 1 * 2);

  const TuneSpace d = parse_sweep_config("{}", "empty.json", errors);
  EXPECT_EQ(d.all().size(), 64U) << "keys left out keep DeepSpeed's defaults";

  parse_sweep_config(R"({"block_size": [], "queue_depth": [1.5], "single_submit": ["yes"], "bogus": 1})", "b.json",
                     errors);
  parse_sweep_config("[1, 2]", "list.json", errors);
  parse_sweep_config("{", "cut.json", errors);
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "--sweep_config: \"block_size\" has no values",
                        "--sweep_config: bad value for \"queue_depth\"",
                        "--sweep_config: bad value for \"single_submit\"",
                        "--sweep_config: unsupported key \"bogus\" (block_size, queue_depth, io_parallel, "
                        "sequential_requests, single_submit)",
                        "--sweep_config: 'list.json' is not a JSON object",
                        "--sweep_config: 'cut.json' is not a JSON object (expected a string key at offset 1)",
                    }));
  errors.clear();
  load_sweep_config("/no/such/file.json", errors);
  EXPECT_EQ(errors, (std::vector<std::string>{"--sweep_config: cannot read '/no/such/file.json'"}));
}

TEST(Tune, SpaceProblems) {
  TuneSpace s;
  EXPECT_TRUE(space_problems(s, 400ULL << 20).empty());
  s.queue_depth = {0, 8};
  s.io_parallel = {0};
  EXPECT_EQ(space_problems(s, 4 << 20), (std::vector<std::string>{
                                            "--io_size (4M) is smaller than the largest block_size searched (8M)",
                                            "--sweep_config: queue_depth must be at least 1",
                                            "--sweep_config: io_parallel must be at least 1",
                                        }));
}

TEST(Tune, LabelsAndLogNames) {
  const TuneConfig c{8 << 20, 128, true, false, 4};
  EXPECT_EQ(c.label(), "bs8M qd128 p4 sequential single");
  EXPECT_EQ(c.log_name("read", 2), "read_single_sequential_ftd2_d128_bs8M_p4.txt");  // ds_nvme_tune's names
}

TEST(Tune, SmallRandomSpacesStayWithinBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    TuneSpace s;
    auto pick = [&](std::vector<std::uint64_t> from) {
      std::vector<std::uint64_t> out;
      for (auto v : from) {
        if (rng() % 2 != 0) out.push_back(v);
      }
      if (out.empty()) out.push_back(from[rng() % from.size()]);
      return out;
    };
    s.block_size = pick({64 << 10, 256 << 10, 1 << 20, 4 << 20});
    s.queue_depth = pick({1, 4, 16, 64});
    s.io_parallel = pick({1, 2, 4});
    s.sequential_requests = rng() % 2 ? std::vector<bool>{true, false} : std::vector<bool>{rng() % 2 != 0};
    s.single_submit = rng() % 2 ? std::vector<bool>{false, true} : std::vector<bool>{rng() % 2 != 0};
    Model m;
    m.knee = static_cast<double>((rng() % 64 + 1) << 20);
    Recorder rec{m, {}};
    const TuneResult r = tune_search(s, {.io_size = 64 << 20}, std::ref(rec));
    EXPECT_LE(rec.runs.size(), search_budget(s, true, true)) << trial;
    // The winner was measured in the final stage and reports its medians.
    const TuneOutcome again = pick_final(r.records, "final");
    EXPECT_EQ(r.outcome.best, again.best);
    // Never worse than the best configuration that survived the screen by more than the
    // submission knobs can explain (the screen only varies bytes in flight).
    const double found = m.gib(r.outcome.best, true) + m.gib(r.outcome.best, false);
    const TuneConfig opt = m.best_of(s.all());
    EXPECT_GE(found, 0.5 * (m.gib(opt, true) + m.gib(opt, false))) << trial;
  }
}

}  // namespace
}  // namespace deepio::cli
