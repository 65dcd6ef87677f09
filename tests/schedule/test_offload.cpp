// Activation offload: O's and L's tokens and rows, with_offload() and
// WithOffload<S, Stages...>, the verifier's rules for O and L word for word,
// peak memory exact for the order, the simulator's copy lane (an offload's
// copy from its forward's end, the device waiting at the O; a reload's copy
// from the L, the backward waiting for it), offloads in weight windows (from
// an I to its W, with the output gradient), the renderers' copy lane, and the
// refusals: PyTorch's CSV has no O or L; offload_to_fit(), the offloads a
// memory cap needs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "../common/programs.hpp"
#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/chrome_trace.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/svg.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/tokens.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

// Proved at compile time: device 0 of 1F1B offloads micro-batch 0 after F0.1
// and reloads it before F0.3, the action before B0.0.
using O = WithOffload<OneFOneB<4, 8>, 0>;
static_assert(O::actions[0][2] == offload(0, 0));
static_assert(O::actions[0][5] == reload(0, 0));
static_assert(verify(O{}));
static_assert(verify(WithOffload<Interleaved1F1B<4, 2, 8>, 0, 1, 2, 3, 4, 5, 6, 7>{}));
static_assert(verify(WithOffload<ZeroBubbleH1<4, 8>, 0, 1>{}));
static_assert(verify(WithOffload<ZeroBubbleV<4, 8>, 0, 7>{}));
static_assert(verify(WithOffload<DualPipeV<4, 8>, 0, 7>{}));
static_assert(verify(WithOffload<Overlapped<Interleaved1F1B<4, 2, 8>>, 0, 4>{}));
static_assert(verify(WithGradReduce<WithOffload<Interleaved1F1B<4, 2, 8>, 0, 4>>{}));
static_assert(verify(WithOffload<WithRecompute<OneFOneB<4, 8>, 0>, 0, 1>{}));  // recomputed ones stay
// Device 0 of 1F1B keeps four stashes at once; offloaded, three.
static_assert(peak_memory(OneFOneB<4, 8>::program())[0] == 4);
static_assert(peak_memory(O::program())[0] == 3);
static_assert(phase_row(Phase::kOffload).letter == 'O' && phase_row(Phase::kReload).letter == 'L');
static_assert(is_copy(Phase::kOffload) && is_copy(Phase::kReload) && !is_copy(Phase::kRecompute));
static_assert(beside_compute(Phase::kReload) && beside_compute(Phase::kReduce) && !beside_compute(Phase::kRecompute));
static_assert(acts_on_stash(Phase::kOffload) && acts_on_stash(Phase::kReload) && acts_on_stash(Phase::kRecompute));
static_assert(!runs_per_micro_batch(Phase::kOffload, false) && !runs_per_micro_batch(Phase::kReload, true));
static_assert(LoweringCosts{2, 4, 2, 2}.cost_of(Phase::kOffload) == 0);  // no time on the compute clock

namespace {

using test::custom;
using test::most;

std::string message(const Program& p) { return test::rejection(p); }

// One device's row from its tokens, "F0.0 I0.0 ...": a letter, the chunk, a dot, the micro-batch.
std::vector<Action> tokens(const std::string& text) {
  std::vector<Action> row;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find(' ', at), text.size()), dot = text.find('.', at);
    row.push_back({*phase_of_letter(text[at]), std::stoi(text.substr(at + 1, dot - at - 1)),
                   std::stoi(text.substr(dot + 1, end - dot - 1))});
    at = end + 1;
  }
  return row;
}

// GPipe on one device, four micro-batches, every stash offloaded.
Program offloaded_gpipe() { return with_offload(make_schedule(ScheduleKind::kGPipe, 1, 1, 4), {0}); }

}  // namespace

TEST_CASE("O and L print as O<chunk>.<micro-batch> and L<chunk>.<micro-batch>, in programs and C++", "[schedule]") {
  CHECK(to_string(offload(1, 3)) == "O1.3");
  CHECK(to_string(reload(0, 2)) == "L0.2");
  CHECK(phase_of_letter('O') == Phase::kOffload);
  CHECK(phase_of_letter('L') == Phase::kReload);
  const Program p = offloaded_gpipe();
  CHECK(format_actions(p) == "device 0: F0.0 F0.1 O0.0 F0.2 O0.1 L0.0 F0.3 O0.2 L0.1 B0.0 O0.3 L0.2 B0.1 L0.3 B0.2 B0.3\n");
  const std::string cpp = format_cpp(p, "S");
  CHECK(cpp.find("pipeweave::fwd(0, 1), pipeweave::offload(0, 0), pipeweave::fwd(0, 2),") != std::string::npos);
  CHECK(cpp.find("pipeweave::reload(0, 0)") != std::string::npos);
  CHECK(offloads(p) == 4);
  CHECK(with_offload(p, {}) == make_schedule(ScheduleKind::kGPipe, 1, 1, 4));
}

TEST_CASE("with_offload() offloads every long-lived stash of the chosen stages, over a grid", "[schedule]") {
  for (const ScheduleKind kind : generated_kinds()) {
    const KindRow& row = kind_row(kind);
    const int V = row.default_chunks, M = 8;
    const Program p = make_schedule(kind, 4, V, M);
    const Program o = with_offload(p, all_stages(p.shape));
    INFO(row.name);
    REQUIRE(verify(o));
    CHECK(offloads(o) > 0);
    const std::vector<double> before = peak_memory(p), after = peak_memory(o);
    for (std::size_t d = 0; d < before.size(); ++d) CHECK(after[d] <= before[d]);
    // Each O comes after the action that follows its forward (or its I), with an action between it and its L.
    for (const auto& r : o.devices) {
      for (std::size_t k = 0; k < r.size(); ++k) {
        if (r[k].phase != Phase::kOffload) continue;
        const auto f = std::find_if(r.begin(), r.end(), [&](const Action& a) {
          return a.phase == Phase::kForward && a.chunk == r[k].chunk && a.micro_batch == r[k].micro_batch;
        });
        const auto l = std::find(r.begin() + static_cast<std::ptrdiff_t>(k), r.end(), reload(r[k].chunk, r[k].micro_batch));
        REQUIRE((f != r.end() && l != r.end()));
        CHECK(static_cast<std::size_t>(f - r.begin()) + 2 <= k);
        CHECK(std::count_if(r.begin() + static_cast<std::ptrdiff_t>(k), l,
                            [](const Action& a) { return !is_copy(a.phase); }) >= 1);
      }
    }
    // The compile-time forms say the same: spot-checked by kind for the first stage.
    CHECK(with_offload(o, {}) == p);
  }
  CHECK(O::program() == with_offload(OneFOneB<4, 8>::program(), {0}));
  CHECK_THROWS_WITH(with_offload(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4), {2}),
                    "with_offload: stage 2 is not a virtual stage of 2 devices x 1 chunks (stages are 0..1)");
  // recompute_to_fit() never recomputes an offloaded micro-batch: with every one offloaded, a cap below the
  // offloaded peak (3) cannot be met, and one at it needs nothing more.
  const Program gp = with_offload(make_schedule(ScheduleKind::kGPipe, 1, 1, 4), {0});
  CHECK_FALSE(recompute_to_fit(gp, {}, 2));
  const std::optional<Program> fit = recompute_to_fit(gp, {}, 3);
  REQUIRE(fit);
  CHECK(*fit == gp);
  // With stage 1 of 1F1B offloaded, a cap of 3 recomputes on device 0 and leaves device 1's offloads.
  const Program op = with_offload(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8), {1});
  const std::optional<Program> tight = recompute_to_fit(op, {}, 3);
  REQUIRE(tight);
  CHECK(verify(*tight));
  CHECK(offloads(*tight) == offloads(op));
  CHECK(recomputations(*tight) > 0);
  for (const double peak : peak_memory(*tight)) CHECK(peak <= 3);
  // A recomputed micro-batch stays on the device.
  const Program r = with_recompute(make_schedule(ScheduleKind::kGPipe, 1, 1, 4), {0});
  CHECK(offloads(with_offload(r, {0})) == 0);
}

TEST_CASE("the verifier's rules for O and L, word for word", "[schedule]") {
  const Program p = offloaded_gpipe();
  REQUIRE(verify(p));
  auto row0 = [](Program& q) -> std::vector<Action>& { return q.devices[0]; };
  auto at = [](const Program& q, const Action& a) {
    return static_cast<int>(std::find(q.devices[0].begin(), q.devices[0].end(), a) - q.devices[0].begin());
  };
  {  // L0.3 after its B: the B runs while the stash is away
    Program q = p;
    auto& r = row0(q);
    r.erase(r.begin() + at(q, reload(0, 3)));
    r.insert(r.begin() + at(q, bwd(0, 3)) + 1, reload(0, 3));
    CHECK(message(q) == "device 0, step 14: B0.3 (stage 0, micro-batch 3) runs while its stash is away: O0.3 (step 10) "
                        "has no reload (L) before it; a reload brings the stash back before the action that reads it");
  }
  {  // O0.3 after its B
    Program q = p;
    auto& r = row0(q);
    r.erase(r.begin() + at(q, offload(0, 3)));
    r.push_back(offload(0, 3));
    CHECK(message(q) == "device 0, step 15: O0.3 (stage 0, micro-batch 3) comes after B0.3 (step 14); an offload moves "
                        "its stash off the device before the backward (B or I) that reads it, or between an I and its "
                        "W");
  }
  {  // L0.0 before its O: check 3, an action before one of its own device it needs
    Program q = p;
    auto& r = row0(q);
    r.erase(r.begin() + at(q, reload(0, 0)));
    r.insert(r.begin() + at(q, offload(0, 0)), reload(0, 0));
    CHECK(message(q) == "device 0, step 2: L0.0 (stage 0, micro-batch 0) runs before O0.0 (step 3), whose result it "
                        "needs");
  }
  {  // an offload without its reload, a reload without its offload
    Program q = p;
    row0(q).erase(row0(q).begin() + at(q, reload(0, 1)));
    CHECK(message(q) == "device 0, step 11: B0.1 (stage 0, micro-batch 1) runs while its stash is away: O0.1 (step 4) "
                        "has no reload (L) before it; a reload brings the stash back before the action that reads it");
    row0(q).erase(row0(q).begin() + at(q, bwd(0, 1)));  // no backward to read it: the pair is incomplete
    CHECK(message(q) == "device 0: L0.1 (stage 0, micro-batch 1) is missing; an offloaded stash (O0.1) is reloaded (L) "
                        "before its backward");
    Program u = p;
    row0(u).erase(row0(u).begin() + at(u, offload(0, 1)));
    CHECK(message(u) == "device 0: O0.1 (stage 0, micro-batch 1) is missing; a reload (L0.1) brings back a stash its "
                        "offload (O) moved off the device");
  }
  {  // recomputed and reloaded
    Program q = p;
    row0(q).insert(row0(q).begin() + at(q, bwd(0, 0)), recompute(0, 0));
    CHECK(message(q) == "device 0, step 9: C0.0 (stage 0, micro-batch 0) and L0.0 (step 5) both restore its stash; a "
                        "stash is recomputed (C) or offloaded and reloaded (O, L), not both");
  }
  {  // twice, and before its forward
    Program q = p;
    row0(q).insert(row0(q).begin() + 3, offload(0, 0));
    CHECK(message(q) == "device 0, step 3: O0.0 (stage 0, micro-batch 0) appears a second time (first at step 2)");
    Program e = p;
    row0(e).erase(row0(e).begin() + at(e, offload(0, 0)));
    row0(e).insert(row0(e).begin(), offload(0, 0));
    CHECK(message(e) == "device 0, step 0: O0.0 (stage 0, micro-batch 0) runs before F0.0 (step 1), whose result it "
                        "needs");
  }
  {  // neither starts an overlapped pair
    Program q = p;
    row0(q)[static_cast<std::size_t>(at(q, offload(0, 0)))].overlaps_next = true;
    CHECK_THAT(message(q), Catch::Matchers::Contains("O0.0 starts an overlapped pair, but it is not a forward"));
  }
}

TEST_CASE("an offload in a weight window moves the stash and the output gradient from the I to the W", "[schedule]") {
  // One device, three split micro-batches; micro-batch 0 away from its I until its W.
  const Program p = custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 O0.0 I0.1 W0.1 I0.2 W0.2 L0.0 W0.0")});
  REQUIRE(verify(p));
  const Program kept = custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 I0.1 W0.1 I0.2 W0.2 W0.0")});
  // Stashes 1, 2, 3, and at I0.0 its gradient: 4; the O frees both (2), I0.1 holds 3 where, kept, it would hold 5.
  CHECK(peak_memory(kept) == std::vector<double>{5});
  CHECK(peak_memory(p) == std::vector<double>{4});
  CHECK(peak_memory(p, MemoryModel{.all = {.stash = 10, .input = 1, .gradient = 2}}) == std::vector<double>{32});
  CHECK(peak_memory(kept, MemoryModel{.all = {.stash = 10, .input = 1, .gradient = 2}}) == std::vector<double>{34});
  const StashFates fates(p);
  CHECK((!fates.offloaded(0, 0, 0) && fates.weight_window(0, 0, 0) && !fates.weight_window(0, 0, 1)));
  // The copy of stash and gradient (2 at 1 per unit) starts when I0.0 ends; W0.0 waits for its reload.
  for (const ReplayMode mode : {ReplayMode::kSteps, ReplayMode::kDataflow}) {
    CostModel cost;
    cost.replay = mode;
    cost.copy_bandwidth = 1;
    const Trace t = simulate(p, cost);
    std::vector<std::string> copies;
    for (const TraceEvent& e : t.copies[0])
      copies.push_back(to_string(e.action) + " " + format_decimal(e.start, 3) + "-" + format_decimal(e.end, 3));
    // F [0,3], I0.0 [3,4], O0.0 waits to 6, I0.1 W0.1 I0.2 W0.2 [6,10], L0.0 [10,12], W0.0 [12,13].
    CHECK(copies == std::vector<std::string>{"O0.0 4-6", "L0.0 10-12"});
    CHECK(makespan(t) == 13);
    CHECK(t.peak_memory == peak_memory(p));
  }
  // Both pairs of one micro-batch: away from F0.0 to I0.0's reload, and again from I0.0 to W0.0.
  const Program both = custom(1, 1, 3, {tokens("F0.0 F0.1 O0.0 F0.2 L0.0 I0.0 O0.0 I0.1 W0.1 I0.2 W0.2 L0.0 W0.0")});
  REQUIRE(verify(both));
  const StashFates both_fates(both);
  CHECK((both_fates.offloaded(0, 0, 0) && both_fates.weight_window(0, 0, 0)));
  // After each action: 1 2 1 2 3 4 2 3 1 2 0 2 0; at I0.0 all three stashes and its gradient are there.
  CHECK(peak_memory(both) == std::vector<double>{4});
  // A recomputed micro-batch goes away in its weight window: the C restores its stash for the I, the L for
  // the W. Its input 1/8 until C0.0; 4 at I0.0 (three stashes and a gradient); kept, I0.1 would hold 5.
  const Program recomputed = custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 C0.0 I0.0 O0.0 I0.1 W0.1 I0.2 W0.2 L0.0 W0.0")});
  REQUIRE(verify(recomputed));
  CHECK(peak_memory(recomputed) == std::vector<double>{4});
  CHECK(simulate(recomputed).peak_memory == std::vector<double>{4});
  // offload_to_fit() sends recomputed micro-batches away in their weight windows: ZB-H1 (P 4, M 8) recomputing
  // everything peaks at 2.375, 4.25, 6.125 and 8, its Ws lagging; with them every device fits 3.
  const Program zb_plain = make_schedule(ScheduleKind::kZeroBubbleH1, 4, 1, 8);
  const std::optional<Program> both_ways = offload_to_fit(with_recompute(zb_plain, all_stages(zb_plain.shape)), {}, 3);
  REQUIRE(both_ways);
  REQUIRE(verify(*both_ways));
  const StashFates both_fates_zb(*both_ways);
  int recomputed_and_away = 0;
  for (int d = 0; d < 4; ++d)
    for (int m = 0; m < 8; ++m)
      recomputed_and_away += both_fates_zb.recomputed(d, 0, m) && both_fates_zb.weight_window(d, 0, m) ? 1 : 0;
  CHECK(recomputed_and_away == offloads(*both_ways));
  CHECK(peak_memory(*both_ways) == std::vector<double>{2.375, 2.25, 2.125, 2});
  // The rules: no W while the stash is away, no O after the W, no third O.
  CHECK(message(custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 O0.0 I0.1 W0.1 I0.2 W0.2 W0.0 L0.0")})) ==
        "device 0, step 9: W0.0 (stage 0, micro-batch 0) runs while its stash is away: O0.0 (step 4) has no reload "
        "(L) before it; a reload brings the stash back before the action that reads it");
  CHECK(message(custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 I0.1 W0.1 I0.2 W0.2 W0.0 O0.0 L0.0")})) ==
        "device 0, step 9: O0.0 (stage 0, micro-batch 0) comes after W0.0 (step 8); an offload moves its stash off "
        "the device before the backward (B or I) that reads it, or between an I and its W");
  CHECK(message(custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 O0.0 I0.1 L0.0 O0.0 W0.1 I0.2 W0.2 L0.0 W0.0")})) ==
        "device 0, step 7: O0.0 (stage 0, micro-batch 0) appears a second time (first at step 4)");
  CHECK(message(custom(1, 1, 3, {tokens("F0.0 O0.0 F0.1 F0.2 I0.0 L0.0 I0.1 W0.1 I0.2 W0.2 W0.0")})) ==
        "device 0, step 4: I0.0 (stage 0, micro-batch 0) runs while its stash is away: O0.0 (step 1) has no reload "
        "(L) before it; a reload brings the stash back before the action that reads it");
  CHECK(message(custom(1, 1, 3, {tokens("F0.0 F0.1 F0.2 I0.0 C0.0 I0.1 W0.1 I0.2 W0.2 W0.0")})) ==
        "device 0, step 4: C0.0 (stage 0, micro-batch 0) comes after I0.0 (step 3); a recomputation restores its "
        "stash before the backward (B or I) that reads it");
  // with_offload() takes the longer window: on ZB-H1's last stage each I follows its F at once and its W comes
  // later, so that stage offloads in weight windows.
  const Program zb = make_schedule(ScheduleKind::kZeroBubbleH1, 4, 1, 8);
  const Program zo = with_offload(zb, all_stages(zb.shape));
  REQUIRE(verify(zo));
  const StashFates zf(zo);
  int windows = 0;
  for (int m = 0; m < 8; ++m) windows += zf.weight_window(3, 0, m) ? 1 : 0;
  CHECK(windows > 0);
  CHECK(peak_memory(zb) == std::vector<double>{5, 6, 7, 8});
  CHECK(peak_memory(zo) == std::vector<double>{3, 5, 6, 6});
  // offload_to_fit() chooses either window, and runs a W no earlier than its reload.
  const std::optional<Program> fit = offload_to_fit(zb, {}, 6);
  REQUIRE(fit);
  REQUIRE(verify(*fit));
  for (const double peak : peak_memory(*fit)) CHECK(peak <= 6);
}

TEST_CASE("peak memory frees an offloaded stash at its O and holds it again from its L", "[schedule]") {
  const Program p = offloaded_gpipe();
  // F0 F1 O0 F2 O1 L0 F3 ...: 1, 2, 1, 2, 1, 2, 3 stashes: three at most, not four.
  CHECK(peak_memory(p) == std::vector<double>{3});
  CHECK(peak_activations(p) == std::vector<int>{3});
  CHECK(peak_memory(p, MemoryModel{.all = {.stash = 10, .input = 1, .gradient = 1}}) == std::vector<double>{30});
  CHECK(peak_memory(make_schedule(ScheduleKind::kGPipe, 1, 1, 4)) == std::vector<double>{4});
}

TEST_CASE("the simulator runs O and L on the copy lane, the device waiting at the O, the backward for its L",
          "[analysis]") {
  const Program p = offloaded_gpipe();
  // Copies take no time: the order is GPipe's, F 1 and B 2.
  CHECK(makespan(simulate(p)) == 12);
  for (const ReplayMode mode : {ReplayMode::kSteps, ReplayMode::kDataflow}) {
    CostModel cost;
    cost.replay = mode;
    cost.copy_bandwidth = 0.5;  // a stash of 1 in 2 units
    const Trace t = simulate(p, cost);
    // F0 [0,1], its copy [1,3]; F1 [1,2], copy [3,5]; O0 waits to 3; F2 [3,4], copy [5,7]; O1 waits to 5; L0's copy
    // [7,9]; F3 [5,6], copy [9,11]; O2 waits to 7; L1 [11,13]; B0 waits for L0: [9,11]; O3 waits to 11; L2 [13,15];
    // B1 [13,15]; L3 [15,17]; B2 [15,17]; B3 [17,19].
    CHECK(makespan(t) == 19);
    std::vector<double> backward_starts;
    for (const TraceEvent& e : t.compute[0])
      if (e.action.phase == Phase::kBackward) backward_starts.push_back(e.start);
    CHECK(backward_starts == std::vector<double>{9, 13, 15, 17});
    REQUIRE(t.copies[0].size() == 8);
    std::vector<std::string> copies;
    for (const TraceEvent& e : t.copies[0])
      copies.push_back(to_string(e.action) + " " + format_decimal(e.start, 3) + "-" + format_decimal(e.end, 3));
    CHECK(copies == std::vector<std::string>{"O0.0 1-3", "O0.1 3-5", "L0.0 7-9", "O0.2 5-7", "L0.1 11-13", "O0.3 9-11",
                                             "L0.2 13-15", "L0.3 15-17"});
    CHECK(t.peak_memory == peak_memory(p));
    CHECK(t.peak_activations == std::vector<int>{3});
  }
  // Per-stage stash sizes set the copies' lengths.
  CostModel sized;
  sized.copy_bandwidth = 4;
  sized.memory.all.stash = 2;
  const Trace sized_trace = simulate(p, sized);
  for (const TraceEvent& e : sized_trace.copies[0]) CHECK(e.end - e.start == 0.5);
  // A bad bandwidth is refused by name.
  CostModel bad;
  bad.copy_bandwidth = -1;
  CHECK(cost_model_error(bad, 1).str() ==
        "cost model: the copy bandwidth (offload O, reload L) must be finite and at least 0 (0: unlimited)");
  // Offloading every stage of 1F1B with copies as long as a forward holds the makespan.
  const Program q = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8);
  CostModel fast;
  fast.copy_bandwidth = 1;
  CHECK(makespan(simulate(with_offload(q, all_stages(q.shape)), fast)) == makespan(simulate(q)));
}

TEST_CASE("the renderers draw the copy lane, and PyTorch's CSV refuses O and L by name", "[analysis]") {
  const Program p = offloaded_gpipe();
  CostModel cost;
  cost.copy_bandwidth = 0.5;
  const Trace t = simulate(p, cost);
  const std::string ascii = render_ascii(t);
  CHECK(ascii.find("device 0 copy") != std::string::npos);
  CHECK(ascii.find("O0.0>") != std::string::npos);
  CHECK(ascii.find("its offloads O<c>.<m> ('>') and reloads L<c>.<m> ('<')") != std::string::npos);
  CHECK(render_svg(t).find("offload to host (O) of chunk 0 (stage 0), micro-batch 0, 1–3") != std::string::npos);
  CHECK(render_chrome_trace(t).find("\"device 0 (offloads and reloads)\"") != std::string::npos);
  CHECK(render_summary(t).find("offloads and reloads (copy lane): time 16 units") != std::string::npos);
  CHECK_THROWS_WITH(to_pytorch_csv(p), "csv: device 0's O0.0 is an offload (O), which PyTorch's schedules and CSV do "
                                       "not have; export the program without it");
  CHECK_THROWS_WITH(parse_pytorch_csv("0F0,0O0,0B0\n"),
                    Catch::Matchers::StartsWith("csv line 1, column 5 ('0O0'): unknown action kind 'O'"));
}

TEST_CASE("offload_to_fit() offloads what a cap needs, device by device, or says it cannot", "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8);  // peaks 4, 3, 2, 1
  for (const double cap : {3.0, 2.0, 1.5, 1.0}) {
    INFO("cap " << cap);
    const std::optional<Program> r = offload_to_fit(p, {}, cap);
    REQUIRE(r);
    REQUIRE(verify(*r));
    const std::vector<double> peaks = peak_memory(*r);
    for (int d = 0; d < 4; ++d) {
      const auto& row = r->devices[static_cast<std::size_t>(d)];
      CHECK(peaks[static_cast<std::size_t>(d)] <= cap);
      // A device within the cap already is left as it was.
      if (peak_memory(p)[static_cast<std::size_t>(d)] <= cap) CHECK(row == p.devices[static_cast<std::size_t>(d)]);
      else CHECK(std::count_if(row.begin(), row.end(), [](const Action& a) { return a.phase == Phase::kOffload; }) > 0);
    }
    // Without its O and L, the other actions keep their order.
    CHECK(with_offload(*r, {}) == p);
  }
  // Copies beside actions where they meet the cap: device 0 at 3 offloads micro-batch 1 as with_offload()
  // does (O after F0.2, L before F0.4); tight where they must be: at 1, O right after each forward.
  const Program at3 = *offload_to_fit(p, {}, 3), at1 = *offload_to_fit(p, {}, 1);
  const auto& row3 = at3.devices[0];
  const auto o1 = std::find(row3.begin(), row3.end(), offload(0, 1));
  REQUIRE(o1 != row3.end());
  CHECK(*(o1 - 1) == fwd(0, 2));
  CHECK(*(std::find(row3.begin(), row3.end(), reload(0, 1)) + 1) == fwd(0, 4));
  const auto& row1 = at1.devices[0];
  for (std::size_t k = 0; k < row1.size(); ++k)
    if (row1[k].phase == Phase::kOffload) CHECK(row1[k - 1] == fwd(row1[k].chunk, row1[k].micro_batch));
  // Fewer offloads for a looser cap; none where the program fits.
  CHECK(offloads(*offload_to_fit(p, {}, 3)) < offloads(*offload_to_fit(p, {}, 2)));
  CHECK(*offload_to_fit(p, {}, 4) == p);
  // A forward holds its stash at least until its O.
  CHECK_FALSE(offload_to_fit(p, {}, 0.9));
  // Recomputed micro-batches stay as they are; recompute_to_fit() on what offload left combines the two.
  const Program r0 = with_recompute(p, {0});  // device 0 keeps inputs and one stash: 1.375
  const std::optional<Program> o0 = offload_to_fit(r0, {}, 2);
  REQUIRE(o0);
  CHECK(o0->devices[0] == r0.devices[0]);
  CHECK(with_offload(*o0, {}) == r0);
  CHECK(offloads(*o0) > 0);
  const std::optional<Program> both = recompute_to_fit(at3, {}, 2.25);
  REQUIRE(both);
  CHECK(verify(*both));
  CHECK(most(peak_memory(*both)) <= 2.25);
  CHECK(with_recompute(*both, {}) == at3);
  CHECK(offloads(*both) > 0);
  CHECK(recomputations(*both) > 0);
  // Sizes per stage: the cap counts in their unit.
  MemoryModel bytes;
  bytes.all = {.stash = 1000, .input = 100, .gradient = 1000};
  const std::optional<Program> b = offload_to_fit(p, bytes, 2000);
  REQUIRE(b);
  CHECK(peak_memory(*b, bytes)[0] <= 2000);
  CHECK_THROWS_WITH(offload_to_fit(Program{}, {}, 1), Catch::Contains("offload_to_fit"));
  // A stage whose next stage is on its device keeps its output there for it (the runtime moves no tensor another
  // stage holds): one device of looped BFS offloads stage 1's stashes alone, and where that is not enough, none.
  const Program one = make_schedule(ScheduleKind::kLoopedBFS, 1, 2, 4);  // stages 0 and 1: peak 8
  CHECK(offload_keeps_output(one.shape, 0));
  CHECK_FALSE(offload_keeps_output(one.shape, 1));
  CHECK_FALSE(offload_keeps_output(p.shape, 0));
  const std::optional<Program> fit6 = offload_to_fit(one, {}, 6);
  REQUIRE(fit6);
  CHECK(most(peak_memory(*fit6)) <= 6);
  for (const Action& a : fit6->devices[0])
    if (phase_row(a.phase).offloads) CHECK(a.chunk == 1);
  CHECK_FALSE(offload_to_fit(one, {}, 3));  // stage 0's four stashes are kept
}

TEST_CASE("offload_to_fit() keeps the copies a program has, tight or beside, and fits what it fitted", "[schedule]") {
  // GPipe on one device, M 4, cap 2: some copies beside actions, some tight (an O after another
  // micro-batch's O that shares its action); walked again, every copy stays where it is.
  const Program p = make_schedule(ScheduleKind::kGPipe, 1, 1, 4);
  const std::optional<Program> once = offload_to_fit(p, {}, 2);
  REQUIRE(once);
  REQUIRE(most(peak_memory(*once)) <= 2);
  const std::optional<Program> twice = offload_to_fit(*once, {}, 2);
  REQUIRE(twice);
  CHECK(*twice == *once);
  for (const double cap : {3.0, 1.0}) {
    INFO("cap " << cap);
    const std::optional<Program> a = offload_to_fit(p, {}, cap);
    REQUIRE(a);
    CHECK(offload_to_fit(*a, {}, cap) == a);
  }
}
