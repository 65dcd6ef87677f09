// Schedule synthesis: every program verifies and keeps the memory cap, is never
// slower than a built-in order that fits, never beats the lower bound, and is the
// same for the same input; the golden programs; errors; costs per stage.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/programs.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/synthesize.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

// The golden headers prove themselves where they are compiled: static_assert(verify(...)).
#include "../data/synthesized/last_slow_p4_v2_m8.hpp"
#include "../data/synthesized/uniform_v_p2_v2_m6.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;
using test::most;

namespace {


// The fastest built-in order of the shape's placement whose peak memory fits `cap` (0: none), with and
// without overlapped pairs; infinity when none fits.
double best_builtin(const ScheduleShape& s, const CostModel& cost, double cap) {
  double best = std::numeric_limits<double>::infinity();
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, s.placement};
    if (!shape_error(ks).empty()) continue;
    const Program p = make_program(ks);
    for (const Program& q : {p, overlap(p)}) {
      const Trace t = simulate(q, cost);
      if (cap == 0 || most(t.peak_memory) <= cap) best = std::min(best, makespan(t));
    }
  }
  return best;
}

CostModel last_slow(int stages) {
  CostModel c;
  c.stage_costs.assign(static_cast<std::size_t>(stages), StageCost{1, 2, 1, 1});
  c.stage_costs.back() = {1.3, 2.6, 1.3, 1.3};
  return c;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The grid of shapes, costs and caps for one placement and its chunk counts (see the first test case).
void check_grid(Placement placement, std::initializer_list<int> chunks) {
  int cases = 0;
  for (int P = 1; P <= 4; ++P) {
    for (const int V : chunks) {
      for (int M : {1, 3, 8}) {
        const ScheduleShape s{ScheduleKind::kAuto, P, V, M, placement};
        CostModel uniform, comm, paired;
        comm.p2p_latency = 0.1;
        paired.overlap_efficiency = 0.5;
        for (const CostModel& cost : {uniform, last_slow(P * V), comm, paired}) {
          for (const double cap : {smallest_memory_limit(s), static_cast<double>(P + V), 0.0}) {
            INFO("P=" << P << " V=" << V << " M=" << M << " " << placement_name(placement) << " cap " << cap);
            const Synthesis r = synthesize(s, cost, {.memory = cap});
            CHECK(r.program.shape.kind == ScheduleKind::kAuto);
            CHECK(r.program.shape.devices == P);
            CHECK(r.program.shape.placement == placement);
            REQUIRE(verify(r.program));
            const Trace t = simulate(r.program, cost);
            CHECK(makespan(t) == Approx(r.makespan));
            CHECK(most(t.peak_memory) == r.peak_memory);
            if (cap > 0) CHECK(r.peak_memory <= cap);
            CHECK(r.makespan <= best_builtin(s, cost, cap) * (1 + 1e-9));
            CHECK(r.makespan >= r.lower_bound * (1 - 1e-9));
            CHECK(r.lower_bound == Approx(synthesis_lower_bound(s, cost, {.memory = cap})));
            ++cases;
          }
        }
      }
    }
  }
  CHECK(cases == 4 * static_cast<int>(chunks.size()) * 3 * 4 * 3);
}

}  // namespace

// The tags [2] and [3] split this program's test cases into three meson tests of about equal time (those without
// either tag are the first), which run side by side: under a sanitizer the searches take minutes.
TEST_CASE("synthesize: verified, within the cap, no slower than a built-in that fits, never below the bound (loop, V 1)") {
  check_grid(Placement::kLoop, {1});
}

TEST_CASE("synthesize: verified, within the cap, no slower than a built-in that fits, never below the bound (loop, V 2)",
          "[2]") {
  check_grid(Placement::kLoop, {2});
}

TEST_CASE("synthesize: verified, within the cap, no slower than a built-in that fits, never below the bound (V)", "[3]") {
  check_grid(Placement::kV, {2});
}

TEST_CASE("synthesize: recomputes to meet caps below what any program without recomputation needs", "[2]") {
  for (const int P : {2, 4})
    for (const int V : {1, 2}) {
      const ScheduleShape s{ScheduleKind::kAuto, P, V, 8};
      CostModel uniform, sized = last_slow(P * V);
      sized.memory.stages.assign(static_cast<std::size_t>(P * V), {.stash = 8, .input = 1, .gradient = 2});
      sized.memory.stages.front() = {.stash = 12, .input = 1, .gradient = 2};  // the first stage embeds
      for (const CostModel& cost : {uniform, sized}) {
        const double least = smallest_memory_limit(s, cost.memory, true), whole = smallest_memory_limit(s, cost.memory);
        if (!(least < whole)) continue;  // one chunk of uniform stashes: one stash either way (1/8 + 7/8)
        for (const double cap : {least, (least + whole) / 2, whole}) {
          INFO("P=" << P << " V=" << V << " cap " << cap << (cost.memory == MemoryModel{} ? "" : " sized"));
          const Synthesis r = synthesize(s, cost, {.memory = cap, .recompute = true});
          REQUIRE(verify(r.program));
          const Trace t = simulate(r.program, cost);
          CHECK(makespan(t) == Approx(r.makespan));
          CHECK(most(t.peak_memory) == Approx(r.peak_memory));
          CHECK(most(peak_memory(r.program, cost.memory)) == Approx(r.peak_memory));
          CHECK(r.peak_memory <= cap * (1 + 1e-9));
          if (cap < whole) CHECK(has_recompute(r.program));
          CHECK(r.makespan >= r.lower_bound * (1 - 1e-9));
          // Never slower than a built-in order with every micro-batch recomputed, where that fits.
          for (const ScheduleKind k : generated_kinds()) {
            const ScheduleShape ks{k, P, V, 8, s.placement};
            if (!shape_error(ks).empty()) continue;
            const Program all = with_recompute(make_program(ks), all_stages(ks));
            const Trace u = simulate(all, cost);
            if (most(u.peak_memory) <= cap) CHECK(r.makespan <= makespan(u) * (1 + 1e-9));
          }
        }
        // Without recomputation the same caps below `whole` are refused, naming both smallest limits.
        CHECK_THROWS_WITH(synthesize(s, cost, {.memory = least}),
                          Contains("the smallest feasible limit is ") && Contains("; with recomputation allowed it is "));
        CHECK_THROWS_WITH(synthesize(s, cost, {.memory = least * 0.99, .recompute = true}),
                          Contains("(each device's inputs of one micro-batch, with one of its stashes restored at a "
                                   "time)"));
      }
    }
  // What the smallest limits are: V stashes without recomputation; V inputs and one stash beyond its input with it.
  CHECK(smallest_memory_limit({ScheduleKind::kAuto, 4, 2, 8}) == 2);
  CHECK(smallest_memory_limit({ScheduleKind::kAuto, 4, 2, 8}, {}, true) == 0.125 + 1);
}

TEST_CASE("synthesize: offloads to meet a cap, free where the copy lane is, and beside recomputation") {
  const CostModel free_copies;
  const CostModel slow_copies = [] {  // a copy lasts two forwards
    CostModel c;
    c.copy_bandwidth = 0.5;
    return c;
  }();
  for (const int V : {1, 2})
    for (const bool split : {false, true}) {
      const ScheduleShape s{ScheduleKind::kAuto, 4, V, 8};
      const Program one_f_one_b = make_schedule(V == 1 ? ScheduleKind::kOneFOneB : ScheduleKind::kInterleaved1F1B, 4, V, 8);
      const double cap = most(peak_memory(one_f_one_b)) / 2;  // half of 1F1B's peak
      INFO("V=" << V << " cap " << cap << (split ? " split" : " whole backwards"));
      REQUIRE(cap >= smallest_memory_limit(s));
      const double uncapped = synthesize(s, free_copies, {.split_backward = split}).makespan;
      const Synthesis kept = synthesize(s, free_copies, {.memory = cap, .split_backward = split});
      const Synthesis recomputed = synthesize(s, free_copies, {.memory = cap, .recompute = true, .split_backward = split});
      const Synthesis moved = synthesize(s, free_copies, {.memory = cap, .offload = true, .split_backward = split});
      const Synthesis slow = synthesize(s, slow_copies, {.memory = cap, .offload = true, .split_backward = split});
      const Synthesis either =
          synthesize(s, slow_copies, {.memory = cap, .recompute = true, .offload = true, .split_backward = split});
      for (const auto& [r, cost] : {std::pair{&moved, &free_copies}, std::pair{&slow, &slow_copies},
                                    std::pair{&either, &slow_copies}}) {
        REQUIRE(verify(r->program));
        const Trace t = simulate(r->program, *cost);
        CHECK(makespan(t) == Approx(r->makespan));
        CHECK(most(t.peak_memory) == Approx(r->peak_memory));
        CHECK(r->peak_memory <= cap * (1 + 1e-9));
      }
      // Copies beside the compute at no cost: faster than keeping every stash or recomputing, and with whole
      // backwards within 5% of no cap at all (split ones keep the gradient from an I to its W, which no
      // offload moves).
      CHECK(offloads(moved.program) > 0);
      CHECK(moved.origin.find(", offloading ") != std::string::npos);
      CHECK(moved.makespan < kept.makespan);
      CHECK(moved.makespan <= recomputed.makespan);
      if (!split) CHECK(moved.makespan <= uncapped * 1.05);
      // Slow copies cost time; allowed to recompute as well, the search is no slower, nor slower than recomputing
      // alone (which has no copies: the same under either cost model).
      CHECK(slow.makespan >= moved.makespan);
      CHECK(either.makespan <= slow.makespan * (1 + 1e-9));
      CHECK(either.makespan <= recomputed.makespan * (1 + 1e-9));
    }
}

TEST_CASE("synthesize: the list scheduler's offloading policies end, verify and keep the cap", "[3]") {
  // Every offloading policy (a fifth of them in each case, in turn) on shapes of both placements, even and uneven
  // stash sizes, free and slow copies, and caps from the smallest feasible one: the run ends, and its program
  // verifies and keeps the cap; most of them offload, none a stage whose next stage is on its device.
  int runs = 0, offloading = 0, keeping = 0;
  std::size_t turn = 0;
  for (const Placement placement : {Placement::kLoop, Placement::kV})
    for (const int P : {2, 4})
      for (const int V : {1, 2, 3}) {
        if (placement == Placement::kV && V != 2) continue;
        for (const int M : {5, 8}) {
          const ScheduleShape s{ScheduleKind::kAuto, P, V, M, placement};
          for (const bool uneven : {false, true}) {
            CostModel cost = last_slow(P * V);
            if (uneven) {  // the first stage stashes three times as much, and every gradient is half a stash
              cost.memory.stages.assign(static_cast<std::size_t>(P * V), {.stash = 1, .input = 0.25, .gradient = 0.5});
              cost.memory.stages.front() = {.stash = 3, .input = 0.5, .gradient = 1.5};
            }
            for (const double bandwidth : {0.0, 1.0}) {
              cost.copy_bandwidth = bandwidth;
              const double least = smallest_memory_limit(s, cost.memory);
              for (const double cap : {least, 2 * least}) {
                const detail::ListScheduler list(s, cost, cap);
                const std::vector<detail::ListPolicy> policies = detail::list_policies({.memory = cap, .offload = true});
                for (std::size_t i = turn++ % 5; i < policies.size(); i += 5) {
                  if (!policies[i].offload) continue;
                  INFO("P=" << P << " V=" << V << " M=" << M << " " << placement_name(placement) << (uneven ? " uneven" : "")
                            << " bandwidth " << bandwidth << " cap " << cap << ": " << policies[i].name());
                  Program p;
                  double finish = 0;
                  REQUIRE(list.run(policies[i], p, finish));
                  REQUIRE(verify(p));
                  CHECK(most(peak_memory(p, cost.memory)) <= cap * (1 + 1e-9));
                  ++runs;
                  offloading += offloads(p) > 0 ? 1 : 0;
                  for (std::size_t d = 0; d < p.devices.size(); ++d)  // none leaves an output on its device
                    for (const Action& a : p.devices[d])
                      keeping += phase_row(a.phase).offloads &&
                                 offload_keeps_output(s, s.stage_of(static_cast<int>(d), a.chunk));
                }
              }
            }
          }
        }
      }
  CHECK(runs > 5000);
  CHECK(offloading > runs / 2);
  CHECK(keeping == 0);  // the v placement's turn: stage P - 1's output is stage P's input, on its device
}

TEST_CASE("synthesize: copies placed on the list's clock meet half of 1F1B's peak within 5% of no cap") {
  // The last stage 1.3 times slower, a copy as long as a forward (recompute_bench's last-1.3x row at P 4, V 1):
  // the offloads offload_to_fit() adds to any built-in order (by memory alone) cost at least 71.4, 9% over no
  // cap; the list scheduler's, placed where its clock has room, 68.2 (no cap: 65.4).
  const ScheduleShape s{ScheduleKind::kAuto, 4, 1, 16};
  CostModel cost = last_slow(4);
  cost.copy_bandwidth = 1;
  const double cap = 2;
  REQUIRE(cap == most(peak_memory(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 16))) / 2);
  double repaired = std::numeric_limits<double>::infinity();
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, 4, 1, 16};
    if (!shape_error(ks).empty()) continue;
    for (const Program& q : {make_program(ks), overlap(make_program(ks))})
      if (const std::optional<Program> fitted = offload_to_fit(q, cost.memory, cap))
        repaired = std::min(repaired, makespan(simulate(*fitted, cost)));
  }
  const double uncapped = synthesize(s, cost).makespan;
  const Synthesis r = synthesize(s, cost, {.memory = cap, .offload = true});
  REQUIRE(verify(r.program));
  CHECK(r.peak_memory <= cap);
  CHECK(r.origin.rfind("list: ", 0) == 0);
  CHECK(r.origin.find(", room made by offload") != std::string::npos);  // an offloading policy's program
  CHECK(offloads(r.program) > 0);
  CHECK(repaired == Approx(71.4));
  CHECK(repaired > 1.05 * uncapped);
  CHECK(r.makespan <= 1.05 * uncapped);
  CHECK(r.makespan < repaired);
}

TEST_CASE("synthesize: allowed to offload as well as recompute, never slower than recomputing alone", "[2]") {
  // recompute_bench's uneven profile: four layers per stage but the first, which has six; each layer F 1, I 1, W 1;
  // a stash of 8 layer tensors (12 on the first stage), its input 1; copies at 1 tensor per time unit, slower than
  // the compute. The search with offload allowed followed other candidates here and ended 1.3% slower (612 to 604).
  const ScheduleShape s{ScheduleKind::kAuto, 4, 2, 16};
  CostModel c;
  c.stage_costs.assign(8, StageCost{4, -1, 4, 4});
  c.stage_costs[0] = StageCost{6, -1, 6, 6};
  c.memory.stages.assign(8, {.stash = 8, .input = 1, .gradient = 1});
  c.memory.stages[0] = {.stash = 12, .input = 1, .gradient = 1};
  c.copy_bandwidth = 1;
  const Synthesis alone = synthesize(s, c, {.memory = 30, .recompute = true});
  const Synthesis both = synthesize(s, c, {.memory = 30, .recompute = true, .offload = true});
  REQUIRE(verify(both.program));
  CHECK(both.peak_memory <= 30);
  CHECK(both.makespan <= alone.makespan * (1 + 1e-9));
}

TEST_CASE("synthesize: reaches the lower bound where no cap stands in the way", "[3]") {
  // Free communication, no cap: a zero bubble is there to find (uniform, the last stage slower,
  // the zero-bubble paper's measured ratios); within 2% of the bound.
  CostModel zb;  // Qi et al., "Zero Bubble Pipeline Parallelism", appendix D: 1.5B model, p = 8, m = 24
  zb.compute[Phase::kForward] = 18.522;
  zb.compute[Phase::kBackwardInput] = 18.086;
  zb.compute[Phase::kBackwardWeight] = 9.337;
  for (const auto& [P, V, M, placement] :
       {std::tuple{4, 1, 16, Placement::kLoop}, std::tuple{4, 2, 16, Placement::kLoop},
        std::tuple{4, 2, 16, Placement::kV}, std::tuple{8, 2, 32, Placement::kLoop}}) {
    const ScheduleShape s{ScheduleKind::kAuto, P, V, M, placement};
    for (const CostModel& cost : {CostModel{}, last_slow(P * V), zb}) {
      INFO("P=" << P << " V=" << V << " M=" << M << " " << placement_name(placement));
      const Synthesis r = synthesize(s, cost);
      CHECK(r.makespan <= 1.02 * r.lower_bound);
    }
  }
  // With a cap at 1F1B's peak, the search beats 1F1B, which is all that fits there.
  const ScheduleShape s{ScheduleKind::kAuto, 4, 1, 16};
  const Synthesis capped = synthesize(s, CostModel{}, {.memory = 4});
  CHECK(capped.best_builtin.name == "1f1b");
  CHECK(capped.best_builtin.program == make_schedule(ScheduleKind::kOneFOneB, 4, 1, 16));
  CHECK(capped.makespan < 0.95 * capped.best_builtin.makespan);
}

TEST_CASE("synthesize: a list candidate planned with rendezvous ends when its steps, planned on the costs, end") {
  // Integer costs, the last stage slower: the rendezvous policies run the devices as lower() does on
  // those costs, so the steps replay of their program, planned on each stage's costs, ends on the
  // list's own finish; the dataflow policies' finish is a bound the replay never beats.
  int runs = 0;
  for (const Placement placement : {Placement::kLoop, Placement::kV}) {
    for (const int P : {2, 4}) {
      for (const int V : {1, 2}) {
        if (placement == Placement::kV && V != 2) continue;
        const ScheduleShape s{ScheduleKind::kAuto, P, V, 6, placement};
        CostModel cost;
        cost.stage_costs.assign(static_cast<std::size_t>(s.stages()), StageCost{1, 2, 1, 1});
        cost.stage_costs.back() = {2, 3, 2, 1};
        const detail::ListScheduler list(s, cost, 0);
        for (const detail::ListPolicy& policy : detail::list_policies({})) {
          Program p;
          double finish = 0;
          REQUIRE(list.run(policy, p, finish));
          for (const StageCost& c : cost.stage_costs) {
            LoweringCosts clock;
            for (const Phase ph : compute_phases()) clock[ph] = static_cast<long long>(c[ph]);
            p.stage_lowering.push_back(clock);
          }
          INFO("P=" << P << " V=" << V << " " << placement_name(placement) << ": " << policy.name());
          const double replay = makespan(simulate(p, cost));
          if (policy.rendezvous) CHECK(replay == finish);
          else CHECK(replay >= finish);
          ++runs;
        }
      }
    }
  }
  CHECK(runs == 6 * static_cast<int>(detail::list_policies({}).size()));
}

TEST_CASE("synthesize: the reference clocks, one per stage where the stages' costs differ") {
  const ScheduleShape s{ScheduleKind::kAuto, 2, 2, 4};
  const std::vector<detail::ReferenceClock> equal = detail::reference_clocks(s, CostModel{});
  REQUIRE(!equal.empty());
  CHECK(equal.front().all == LoweringCosts{});
  for (const detail::ReferenceClock& c : equal) CHECK(c.stages.empty());
  const std::vector<detail::ReferenceClock> uneven = detail::reference_clocks(s, last_slow(4));
  // At a mean forward of 10 the last stage (F 1.3 against a mean of 1.075) is 12 to the others' 9.
  const auto ten = std::find_if(uneven.begin(), uneven.end(), [](const detail::ReferenceClock& c) {
    return c.name == "steps planned on each stage's F:B:I:W at a mean F of 10";
  });
  REQUIRE(ten != uneven.end());
  REQUIRE(ten->stages.size() == 4);
  CHECK(ten->stages.front() == LoweringCosts{9, 19, 9, 9});
  CHECK(ten->stages.back() == LoweringCosts{12, 24, 12, 12});
}

TEST_CASE("synthesize: a repair renamed keeps the policy and the clock its origin names") {
  using detail::Search;
  CHECK(Search::without_repairs("list: split, W lag 0, room made by offload, offloading 28 stashes") ==
        "list: split, W lag 0, room made by offload");
  CHECK(Search::without_repairs("list: split, admitting recomputed what does not fit whole, recomputing 3 micro-batches"
                                "; steps planned on F:B:I:W 2:3:2:1") ==
        "list: split, admitting recomputed what does not fit whole; steps planned on F:B:I:W 2:3:2:1");
  CHECK(Search::without_repairs("1f1b + local moves, offloading 4 stashes, recomputing 2 micro-batches") ==
        "1f1b + local moves");
  CHECK(Search::without_repairs("looped-bfs") == "looped-bfs");
}

TEST_CASE("synthesize: the same input gives the same program") {
  const ScheduleShape s{ScheduleKind::kAuto, 4, 2, 8};
  const CostModel cost = last_slow(8);
  const Synthesis a = synthesize(s, cost, {.memory = 8});
  const Synthesis b = synthesize(s, cost, {.memory = 8});
  CHECK(a.program == b.program);
  CHECK(a.origin == b.origin);
  CHECK(a.evaluated == b.evaluated);
}

TEST_CASE("synthesize: the golden programs, as CSV and as compile-time tables") {
  const std::string dir = std::string(PIPEWEAVE_TEST_DATA) + "/synthesized/";
  const Synthesis last = synthesize({ScheduleKind::kAuto, 4, 2, 8}, last_slow(8), {.memory = 8});
  const Program golden = load_pytorch_csv(dir + "last_slow_p4_v2_m8.csv", {.shape = last.program.shape});
  CHECK(golden.devices == last.program.devices);
  CHECK(SynthesizedLastSlow::program() == last.program);
  CHECK(format_cpp(last.program, "SynthesizedLastSlow") == read(dir + "last_slow_p4_v2_m8.hpp"));

  const Synthesis v = synthesize({ScheduleKind::kAuto, 2, 2, 6, Placement::kV}, CostModel{}, {.memory = 4});
  CHECK(load_pytorch_csv(dir + "uniform_v_p2_v2_m6.csv", {.shape = v.program.shape}).devices == v.program.devices);
  CHECK(SynthesizedV::program() == v.program);
  // The compile-time tables verify and simulate like any schedule type.
  static_assert(verify(SynthesizedV{}));
  CHECK(makespan(simulate(SynthesizedV{})) == Approx(v.makespan));
}

TEST_CASE("synthesize: refuses what no schedule can meet, and malformed input, by name") {
  const ScheduleShape s{ScheduleKind::kAuto, 4, 2, 8};
  CHECK_THROWS_WITH(synthesize(s, CostModel{}, {.memory = 1}),
                    "synthesize: no schedule of 4 devices x 2 chunks fits a memory limit of 1 activations per device; "
                    "the smallest feasible limit is 2 (one stash for each of a device's chunks while a micro-batch "
                    "turns at the last stage); with recomputation allowed it is 1.125");
  CHECK_THROWS_WITH(synthesize(s, CostModel{}, {.memory = -1}), Contains("the memory limit must be at least 0"));
  CostModel three;
  three.stage_costs.assign(3, StageCost{});
  CHECK_THROWS_WITH(synthesize(s, three), "synthesize: cost model: 3 stage costs for 8 virtual stages (one per stage, P * V)");
  CostModel negative = last_slow(8);
  negative.stage_costs[5][Phase::kBackwardWeight] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(synthesize(s, negative), Contains("cost model: stage 5: the weight (W) cost must be finite"));
  CHECK_THROWS_WITH(synthesize({ScheduleKind::kAuto, 0, 1, 1}, CostModel{}),
                    Contains("devices, chunks and micro-batches must be at least 1"));
  // The smallest feasible limit is feasible.
  const Synthesis tight = synthesize(s, CostModel{}, {.memory = smallest_memory_limit(s)});
  CHECK(tight.peak_memory == 2);
  // Without splitting, no I or W.
  const Synthesis whole = synthesize(s, CostModel{}, {.split_backward = false});
  for (const auto& row : whole.program.devices)
    for (const Action& a : row) CHECK((a.phase == Phase::kForward || a.phase == Phase::kBackward));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kAuto, 4, 2, 8), Contains("use synthesize()"));
}

TEST_CASE("costs per stage: the simulator times each stage's actions, and fit_stage_costs() reads them back") {
  const Program p = make_schedule(ScheduleKind::kInterleavedZeroBubble, 2, 2, 4);
  CostModel cost;
  cost.stage_costs = {{1, -1, 0.5, 0.25}, {2, -1, 1, 0.5}, {1.5, -1, 1.5, 1}, {3, -1, 2, 2}};
  const Trace t = simulate(p, cost);
  for (const auto& events : t.compute)
    for (const TraceEvent& e : events)
      CHECK(e.end - e.start == Approx(cost.stage_costs[static_cast<std::size_t>(e.stage)].cost_of(e.action.phase)));
  const CostModel fitted = fit_stage_costs(t, 4);
  REQUIRE(fitted.stage_costs.size() == 4);
  for (int st = 0; st < 4; ++st)
    for (const Phase ph : {Phase::kForward, Phase::kBackwardInput, Phase::kBackwardWeight})
      CHECK(fitted.cost_of(ph, st) == Approx(cost.cost_of(ph, st)));
  CHECK(makespan(simulate(p, fitted)) == Approx(makespan(t)));
  // A wrong count is refused by name; the closed forms do not take costs per stage.
  CostModel wrong;
  wrong.stage_costs.assign(3, StageCost{});
  CHECK_THROWS_WITH(simulate(p, wrong), Contains("3 stage costs for 4 virtual stages"));
  CHECK_THAT(closed_form_error(p.shape, cost).str(), Contains("not for costs per stage"));
}
