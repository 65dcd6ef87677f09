// Activation recomputation: C's token and row, with_recompute() and
// WithRecompute<S, Stages...>, the verifier's rules for C word for word, the
// memory model (stash sizes per stage, peak memory exact for the order), the
// simulator (C costs its stage's forward), the renderers, and the refusals:
// PyTorch's CSV has no C, and the runtime does not run one yet.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "../common/programs.hpp"
#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/svg.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

// Proved at compile time: every stage of an interleaved schedule recomputed, C
// right before each backward. Device 0 ends C0.7 B0.7.
using R = WithRecompute<Interleaved1F1B<4, 2, 8>, 0, 1, 2, 3, 4, 5, 6, 7>;
static_assert(R::counts[0] == 3 * 2 * 8);
static_assert(R::actions[0][R::counts[0] - 1] == bwd(0, 7));
static_assert(R::actions[0][R::counts[0] - 2] == recompute(0, 7));
static_assert(verify(R{}));
static_assert(verify(WithRecompute<OneFOneB<4, 8>, 0>{}));
static_assert(verify(WithRecompute<ZeroBubbleH1<4, 8>, 1, 3>{}));
static_assert(verify(WithRecompute<ZeroBubbleV<4, 8>, 0, 7>{}));
static_assert(verify(WithRecompute<DualPipeV<4, 8>, 2>{}));
static_assert(verify(WithRecompute<Overlapped<Interleaved1F1B<4, 2, 8>>, 4>{}));
static_assert(verify(WithGradReduce<WithRecompute<Interleaved1F1B<4, 2, 8>, 0, 4>>{}));
// Device 0 of 1F1B keeps two stashes at once; recomputed, two inputs, and one stash restored at a time.
static_assert(peak_memory(OneFOneB<2, 4>::program())[0] == 2);
static_assert(peak_memory(WithRecompute<OneFOneB<2, 4>, 0>::program())[0] == 1.125);
static_assert(phase_row(Phase::kRecompute).letter == 'C' && !is_collective(Phase::kRecompute));
static_assert(LoweringCosts{2, 4, 2, 2}.cost_of(Phase::kRecompute) == 2);  // a recomputation costs its forward

namespace {

using test::custom;

std::string message(const Program& p) { return test::rejection(p); }

int count_recomputations(const std::vector<Action>& row) {
  return static_cast<int>(std::count_if(row.begin(), row.end(), [](const Action& a) { return a.phase == Phase::kRecompute; }));
}

}  // namespace

TEST_CASE("C prints as C<chunk>.<micro-batch>, in programs, steps and C++", "[schedule]") {
  const Program p = with_recompute(custom(1, 1, 2, {{fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)}}), {0});
  CHECK(format_actions(p) == "device 0: F0.0 F0.1 C0.0 B0.0 C0.1 B0.1\n");
  CHECK(format_steps(lower(p)) == "device 0: 6 steps\n  step 0: F0.0\n  step 1: F0.1\n  step 2: C0.0\n  step 3: B0.0\n"
                                  "  step 4: C0.1\n  step 5: B0.1\n");
  CHECK(to_string(recompute(1, 3)) == "C1.3");
  CHECK(format_cpp(p, "S").find("pipeweave::recompute(0, 0)") != std::string::npos);
  CHECK(has_recompute(p));
  CHECK_FALSE(has_recompute(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2)));
  CHECK(with_recompute(p, {}) == custom(1, 1, 2, {{fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)}}));
  CHECK(actions_per_micro_batch(false) == 2);  // a C is the program's choice, not a required action
}

TEST_CASE("with_recompute() puts a C right before each backward of the chosen stages, over a grid", "[schedule]") {
  for (const KindRow& row : kKindRows) {
    if (!row.generated) continue;
    for (const int P : {2, 4})
      for (const int M : {P, 2 * P})
        for (const int V : {1, 2}) {
          if (!shape_error({row.kind, P, V, M, row.placement}).empty()) continue;
          Program base = make_schedule(row.kind, P, V, M);
          for (const bool paired : {false, true}) {
            const Program p = paired ? overlap(base) : base;
            INFO(row.name << " P " << P << " V " << p.shape.chunks << " M " << M << (paired ? " overlapped" : ""));
            const Program all = with_recompute(p, all_stages(p.shape));
            REQUIRE(verify(all));
            CHECK(peak_activations(all) == peak_activations(p));
            const std::vector<double> before = peak_memory(p), after = peak_memory(all);
            for (int d = 0; d < P; ++d) {
              const auto& out = all.devices[static_cast<std::size_t>(d)];
              CHECK(count_recomputations(out) == p.shape.chunks * M);
              CHECK(after[static_cast<std::size_t>(d)] < before[static_cast<std::size_t>(d)] + 1e-12);
              for (std::size_t k = 0; k < out.size(); ++k) {
                if (out[k].phase != Phase::kRecompute) continue;
                // the backward it restores for: the next action, or the second half of the pair that follows
                REQUIRE(k + 1 < out.size());
                const Action& next = out[k + 1].overlaps_next ? out[k + 2] : out[k + 1];
                CHECK(makes_input_gradient(next.phase));
                CHECK((next.chunk == out[k].chunk && next.micro_batch == out[k].micro_batch));
              }
            }
            CHECK(with_recompute(all, {}) == p);
            // One stage only: only its device changes.
            const Program one = with_recompute(p, {1});
            const int holder = p.shape.device_of_stage(1);
            for (int d = 0; d < P; ++d)
              CHECK(count_recomputations(one.devices[static_cast<std::size_t>(d)]) == (d == holder ? M : 0));
          }
        }
  }
  CHECK_THROWS_WITH(with_recompute(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), {2}),
                    "with_recompute: stage 2 is not a virtual stage of 2 devices x 1 chunks (stages are 0..1)");
  Program bad = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  bad.devices[0].pop_back();
  CHECK_THROWS_WITH(with_recompute(bad, {0}), Catch::Matchers::StartsWith("with_recompute: the program is not correct: "));
}

TEST_CASE("the verifier's rules for C, word for word", "[schedule]") {
  const Program p = with_recompute(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4), {0});
  CHECK(format_actions(p) == "device 0: F0.0 F0.1 C0.0 B0.0 F0.2 C0.1 B0.1 F0.3 C0.2 B0.2 C0.3 B0.3\n"
                             "device 1: F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3\n");
  Program late = p;  // C0.0 after its B
  std::swap(late.devices[0][2], late.devices[0][3]);
  CHECK(message(late) == "device 0, step 3: C0.0 (stage 0, micro-batch 0) comes after B0.0 (step 2); a recomputation "
                         "restores its stash before the backward (B or I) that reads it");
  Program twice = p;
  twice.devices[0].insert(twice.devices[0].begin() + 3, recompute(0, 0));
  CHECK(message(twice) == "device 0, step 3: C0.0 (stage 0, micro-batch 0) appears a second time (first at step 2)");
  Program early = p;  // C0.0 before its F: check 3, an action before one of its own device it needs
  early.devices[0].erase(early.devices[0].begin() + 2);
  early.devices[0].insert(early.devices[0].begin(), recompute(0, 0));
  CHECK_THAT(message(early), Catch::Matchers::StartsWith("device 0, step 0: C0.0 (stage 0, micro-batch 0)"));
  CHECK_THAT(message(early), Catch::Matchers::Contains("F0.0"));
  Program range = p;
  range.devices[0][2] = recompute(0, 9);
  CHECK(message(range) == "device 0, step 2: C0.9 has micro-batch 9; micro-batches are 0..3");
  Program paired = p;
  paired.devices[0][2].overlaps_next = true;  // C starting a pair
  CHECK_THAT(message(paired), Catch::Matchers::Contains("C0.0 starts an overlapped pair, but it is not a forward"));
  // A split backward: C before the I, never between the I and its W.
  const Program split = with_recompute(make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 2), {0});
  REQUIRE(verify(split));
  Program between = split;
  auto& row = between.devices[0];
  const auto c = std::find(row.begin(), row.end(), recompute(0, 0));
  const auto i = std::find(row.begin(), row.end(), bwd_input(0, 0));
  REQUIRE((c != row.end() && i == c + 1));
  std::iter_swap(c, i);
  CHECK(message(between) == "device 0, step " + std::to_string(i - row.begin()) +
                                ": C0.0 (stage 0, micro-batch 0) comes after I0.0 (step " +
                                std::to_string(c - row.begin()) +
                                "); a recomputation restores its stash before the backward (B or I) that reads it");
}

TEST_CASE("peak memory counts each stage's stash, its input where it recomputes, and the kept gradients",
          "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4);
  const Program r = with_recompute(p, {0});
  // Device 0: F0.0 F0.1 C0.0 B0.0 ...: two inputs of 1/8, then one of them restored to a whole stash.
  CHECK(peak_memory(r) == std::vector<double>{1.125, 1});
  CHECK(peak_activations(r) == std::vector<int>{2, 1});
  MemoryModel sizes;  // bytes: stage 0 embeds, stage 1 computes the loss
  sizes.stages = {{.stash = 600, .input = 40, .gradient = 50}, {.stash = 300, .input = 50, .gradient = 50}};
  CHECK(peak_memory(p, sizes) == std::vector<double>{1200, 300});
  CHECK(peak_memory(r, sizes) == std::vector<double>{640, 300});
  // A split backward keeps the output gradient from its I to its W.
  const Program zb = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 4);
  const std::vector<double> units = peak_memory(zb);
  const std::vector<double> bytes = peak_memory(zb, MemoryModel{.all = {.stash = 10, .input = 1, .gradient = 0}});
  for (std::size_t d = 0; d < 2; ++d) CHECK(bytes[d] == 10.0 * peak_activations(zb)[d]);
  CHECK(units[1] > peak_activations(zb)[1]);
  // The simulator counts the same, under its cost model's memory model.
  CostModel cost;
  cost.memory = sizes;
  CHECK(simulate(r, cost).peak_memory == peak_memory(r, sizes));
  CHECK(simulate(r, cost).peak_activations == peak_activations(r));
  // Bad sizes are refused by name.
  CHECK(memory_model_error(MemoryModel{.all = {.stash = 1, .input = 2}}, 2).str() ==
        "memory model: the input is a part of the stash, so it cannot be larger than the stash");
  CHECK(memory_model_error(MemoryModel{.all = {.stash = -1}}, 2).str() ==
        "memory model: the stash, input and gradient sizes must be finite and at least 0");
  CHECK(memory_model_error(MemoryModel{.stages = {{}, {}, {}}}, 2).str() ==
        "memory model: 3 stash sizes for 2 virtual stages; give one per stage, or none");
  CHECK(memory_model_error(MemoryModel{.stages = {{}, {.stash = 1, .input = 3}}}, 2).str() ==
        "memory model, stage 1: the input is a part of the stash, so it cannot be larger than the stash");
  cost.memory.stages.pop_back();
  CHECK_THROWS_WITH(simulate(r, cost), "memory model: 1 stash sizes for 2 virtual stages; give one per stage, or none");
}

TEST_CASE("the simulator runs C on the compute lane at its stage's forward cost", "[analysis]") {
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 1, 1, 2);
  const Program r = with_recompute(p, {0});
  CHECK(makespan(simulate(p)) == 6);  // F F B B with F 1, B 2
  CHECK(makespan(simulate(r)) == 8);  // two more forwards
  CostModel cost;
  cost.stage_costs = {StageCost{3, 5, 2, 3}};
  CHECK(makespan(simulate(r, cost)) == 2 * (3 + 3 + 5));
  // Recomputing the first stage of 1F1B delays the pipeline by one forward per micro-batch on device 0.
  const Program q = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8);
  const Program rq = with_recompute(q, all_stages(q.shape));
  for (const ReplayMode mode : {ReplayMode::kSteps, ReplayMode::kDataflow}) {
    CostModel c;
    c.replay = mode;
    const Trace t = simulate(rq, c);
    CHECK(makespan(t) > makespan(simulate(q, c)));
    CHECK(t.peak_memory == peak_memory(rq));
    int recomputed = 0;
    for (const auto& events : t.compute)
      for (const TraceEvent& e : events)
        if (e.action.phase == Phase::kRecompute) {
          ++recomputed;
          CHECK(e.end - e.start == 1);
        }
    CHECK(recomputed == 4 * 8);
  }
}

TEST_CASE("the renderers draw C, and PyTorch's CSV refuses it by name", "[analysis]") {
  const Program r = with_recompute(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), {0});
  const Trace t = simulate(r);
  CHECK(render_ascii(t).find('*') != std::string::npos);
  CHECK(render_svg(t).find("recomputed forward (C)") != std::string::npos);
  CHECK_THROWS_WITH(to_pytorch_csv(r), "csv: device 0's C0.0 is a recomputed forward (C), which PyTorch's schedules "
                                       "and CSV do not have; export the program without it");
  CHECK_THROWS_WITH(parse_pytorch_csv("0F0,0C0,0B0\n"),
                    Catch::Matchers::StartsWith("csv line 1, column 5 ('0C0'): unknown action kind 'C'"));
}

TEST_CASE("recompute_to_fit() recomputes what a cap needs, device by device, or says it cannot", "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8);  // peaks 4, 3, 2, 1
  for (const double cap : {3.0, 2.0, 1.5, 1.375}) {
    INFO("cap " << cap);
    const std::optional<Program> r = recompute_to_fit(p, {}, cap);
    REQUIRE(r);
    REQUIRE(verify(*r));
    const std::vector<double> peaks = peak_memory(*r);
    for (int d = 0; d < 4; ++d) {
      const auto& row = r->devices[static_cast<std::size_t>(d)];
      CHECK(peaks[static_cast<std::size_t>(d)] <= cap);
      // A device within the cap already is left as it was.
      if (peak_memory(p)[static_cast<std::size_t>(d)] <= cap) CHECK(row == p.devices[static_cast<std::size_t>(d)]);
      else CHECK(count_recomputations(row) > 0);
    }
    // Without its C, the other actions keep their order.
    CHECK(with_recompute(*r, {}) == p);
  }
  // Device 0 keeps 4 micro-batches at once in this order: 3 inputs and one restored stash are the least, 1.375.
  CHECK(peak_memory(*recompute_to_fit(p, {}, 1.375))[0] == 1.375);
  CHECK_FALSE(recompute_to_fit(p, {}, 1.3));
  CHECK(count_recomputations(recompute_to_fit(p, {}, 3)->devices[0]) < count_recomputations(recompute_to_fit(p, {}, 2)->devices[0]));
  // Recomputations already there stay.
  const Program r0 = with_recompute(p, {3});
  CHECK(count_recomputations(recompute_to_fit(r0, {}, 100)->devices[3]) == 8);
  // Sizes per stage: the cap counts in their unit.
  MemoryModel bytes;
  bytes.all = {.stash = 1000, .input = 100, .gradient = 1000};
  const std::optional<Program> b = recompute_to_fit(p, bytes, 2000);
  REQUIRE(b);
  CHECK(peak_memory(*b, bytes)[0] <= 2000);
}
