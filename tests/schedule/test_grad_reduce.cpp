// Gradient reductions (data parallelism around the pipeline): R's token and row,
// with_grad_reduce() and WithGradReduce<S>, the verifier's rules for R word for
// word, its lowering (a step of its own, no message), and the simulator's
// collective lane with the exposed reduction.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "../common/programs.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

// A data-parallel interleaved schedule, proved at compile time: device 0 reduces
// chunk 1 after B1.7 and chunk 0 last, after B0.7.
using DP = WithGradReduce<Interleaved1F1B<4, 2, 8>>;
static_assert(DP::counts[0] == 2 * 2 * 8 + 2);
static_assert(DP::actions[0][DP::counts[0] - 1] == reduce_grad(0));
static_assert(DP::actions[0][DP::counts[0] - 2] == bwd(0, 7));
static_assert(verify(DP{}));
static_assert(verify(WithGradReduce<OneFOneB<4, 8>>{}));
static_assert(verify(WithGradReduce<GPipe<2, 4>>{}));
static_assert(verify(WithGradReduce<ZeroBubbleH1<4, 8>>{}));
static_assert(verify(WithGradReduce<ZeroBubbleV<4, 8>>{}));
static_assert(verify(WithGradReduce<DualPipeV<4, 8>>{}));
static_assert(verify(WithGradReduce<Overlapped<Interleaved1F1B<4, 2, 8>>>{}));
static_assert(phase_row(Phase::kReduce).letter == 'R' && is_collective(Phase::kReduce));
static_assert(LoweringCosts{}.cost_of(Phase::kReduce) == 0);

namespace {

using test::custom;

std::string message(const Program& p) { return test::rejection(p); }

// The position of device d's R of chunk c, and of its last action that adds to that chunk's gradient.
std::pair<std::ptrdiff_t, std::ptrdiff_t> reduce_and_last_weight(const std::vector<Action>& row, int c) {
  std::ptrdiff_t r = -1, w = -1;
  for (std::size_t k = 0; k < row.size(); ++k) {
    if (row[k] == reduce_grad(c)) r = static_cast<std::ptrdiff_t>(k);
    if (phase_row(row[k].phase).weight_gradient && row[k].chunk == c) w = static_cast<std::ptrdiff_t>(k);
  }
  return {r, w};
}

}  // namespace

TEST_CASE("R prints as R<chunk>, in programs, steps and C++", "[schedule]") {
  const Program p = with_grad_reduce(custom(1, 1, 2, {{fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)}}));
  CHECK(format_actions(p) == "device 0: F0.0 F0.1 B0.0 B0.1 R0\n");
  CHECK(format_steps(lower(p)) ==
        "device 0: 5 steps\n  step 0: F0.0\n  step 1: F0.1\n  step 2: B0.0\n  step 3: B0.1\n  step 4: R0\n");
  CHECK(to_string(reduce_grad(3)) == "R3");
  CHECK(to_string(Action{Phase::kReduce, 1, 2}) == "R1.2");  // shown as it is, for the verifier's message
  CHECK(format_cpp(p, "S").find("pipeweave::reduce_grad(0, 0)") != std::string::npos);
  CHECK(has_grad_reduce(p));
  CHECK_FALSE(has_grad_reduce(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2)));
}

TEST_CASE("with_grad_reduce() puts one R per (device, chunk) right after its last B or W, over a grid", "[schedule]") {
  for (const ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B, ScheduleKind::kLoopedBFS,
        ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kZeroBubbleV,
        ScheduleKind::kDualPipeV}) {
    for (const int P : {1, 2, 3, 4}) {
      for (const int M : {1, 2, 4, 8}) {
        const ScheduleShape s{kind, P, default_chunks(kind), M};
        if (!shape_error(s).empty()) continue;
        const Program plain = make_schedule(kind, P, s.chunks, M);
        for (const Program& base : {plain, overlap(plain)}) {
          INFO(schedule_name(kind) << " P=" << P << " M=" << M << (has_pairs(base) ? " overlapped" : ""));
          const Program p = with_grad_reduce(base);
          REQUIRE(verify(p));
          CHECK(with_grad_reduce(p) == p);  // placed afresh: the same
          for (int d = 0; d < P; ++d) {
            const auto& row = p.devices[static_cast<std::size_t>(d)];
            CHECK(row.size() == base.devices[static_cast<std::size_t>(d)].size() + static_cast<std::size_t>(s.chunks));
            for (int c = 0; c < s.chunks; ++c) {
              const auto [r, w] = reduce_and_last_weight(row, c);
              // Right after it, or after the R of another chunk placed at the same point.
              CHECK(r > w);
              for (std::ptrdiff_t k = w + 1; k < r; ++k) CHECK(is_collective(row[static_cast<std::size_t>(k)].phase));
            }
          }
          // Costless reductions change no time; each adds a step of its own and no message.
          CHECK(makespan(simulate(p)) == makespan(simulate(base)));
          const LoweredProgram lp = lower(p), lb = lower(base);
          for (int d = 0; d < P; ++d) {
            const auto& a = lp.devices[static_cast<std::size_t>(d)];
            const auto& b = lb.devices[static_cast<std::size_t>(d)];
            int computes = 0, ops_a = 0, ops_b = 0;
            for (std::size_t t = 0; t < a.size(); ++t) {
              computes += a[t].has_compute ? 1 : 0;
              ops_a += static_cast<int>(a[t].ops.size());
            }
            for (std::size_t t = 0; t < b.size(); ++t) ops_b += static_cast<int>(b[t].ops.size());
            CHECK(computes == static_cast<int>(p.devices[static_cast<std::size_t>(d)].size()));
            CHECK(ops_a == ops_b);
          }
        }
      }
    }
  }
}

TEST_CASE("the verifier's rules for R, word for word", "[schedule]") {
  const Program p = with_grad_reduce(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4));
  CHECK(format_actions(p) ==
        "device 0: F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 R1 B0.2 B0.3 R0\n"
        "device 1: F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 R1 B0.2 B0.3 R0\n");
  Program early = p;  // R0 before B0.3
  std::swap(early.devices[0][16], early.devices[0][17]);
  CHECK(message(early) == "device 0, step 17: B0.3 (stage 0, micro-batch 3) comes after R0 (step 16); a chunk's "
                          "gradient reduction follows its every backward and weight action");
  Program missing = p;
  missing.devices[1].pop_back();
  CHECK(message(missing) == "device 1: R0 (stage 1) is missing; a program with 3 gradient reductions has one per "
                            "(device, chunk), 4 in all");
  Program micro = p;
  micro.devices[1].back().micro_batch = 2;
  CHECK(message(micro) == "device 1, step 17: R0.2 has micro-batch 2; a gradient reduction (R) is one per chunk, at "
                          "micro-batch 0");
  Program twice = p;
  twice.devices[1].push_back(reduce_grad(0));
  CHECK(message(twice) == "device 1, step 18: R0 (stage 1, micro-batch 0) appears a second time (first at step 17)");
  Program range = p;
  range.devices[0].back() = reduce_grad(5);
  CHECK(message(range) == "device 0, step 17: R5 has chunk 5; chunks are 0..1");
  Program paired = p;
  paired.devices[0][14].overlaps_next = true;  // R1 starting a pair
  CHECK_THAT(message(paired), Catch::Matchers::Contains("R1 starts an overlapped pair, but it is not a forward"));
  // Under a wrong placement, with_grad_reduce() says what verify() says.
  Program bad = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  bad.devices[0].pop_back();
  CHECK_THROWS_WITH(with_grad_reduce(bad), Catch::Matchers::StartsWith("with_grad_reduce: the program is not correct: "));
}

TEST_CASE("the simulator runs R on the collective lane and reports the exposed reduction", "[analysis]") {
  CostModel c;
  c.reduce = 3;
  // 1F1B, V = 1: the one reduction of each device follows its last action, all of it exposed.
  const Trace one = simulate(with_grad_reduce(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8)), c);
  CHECK(makespan(one) == 33 + 3);
  for (int d = 0; d < 4; ++d) {
    CHECK(exposed_reduction(one, d) == 3);
    CHECK(reduction_time(one, d) == 3);
    REQUIRE(one.collective[static_cast<std::size_t>(d)].size() == 1);
  }
  // Interleaved, V = 2: chunk 1's reduction runs beside chunk 0's cool-down backwards.
  const Program dp = with_grad_reduce(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8));
  const Trace two = simulate(dp, c);
  CHECK(makespan(two) == 57 + 3);  // only the last chunk's reduction shows
  CHECK(max_exposed_reduction(two) == 3);
  CHECK(hidden_reduction_share(two) == 0.5);  // R1 hidden, R0 exposed, on every device
  CHECK(hidden_reduction_share(one) == 0);
  CHECK(hidden_reduction_share(simulate(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8))) == 1);  // no reduction
  for (const auto& lane : two.collective) {
    REQUIRE(lane.size() == 2);
    CHECK(lane[0].action == reduce_grad(1));
    CHECK(lane[1].start >= lane[0].end);  // one reduction at a time on the lane
  }
  // The dataflow replay agrees here, and a reduction costs no compute time.
  CHECK(makespan(simulate(dp, c.with_replay(ReplayMode::kDataflow))) == 60);
  for (int d = 0; d < 4; ++d) CHECK(busy_time(two, d) == busy_time(simulate(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8)), d));
  // A slow reduction: chunk 1's runs into chunk 0's on the lane.
  c.reduce = 20;
  const Trace slow = simulate(dp, c);
  for (std::size_t d = 0; d < 4; ++d) CHECK(slow.collective[d][1].start == slow.collective[d][0].end);
  // The ring model: latency + 2(D - 1)/D x bytes / bandwidth.
  CHECK(ring_allreduce_time(1, 1e6, 5, 1e3) == 0);
  CHECK(ring_allreduce_time(2, 1e6, 5, 1e3) == 5 + 1e3);
  CHECK(ring_allreduce_time(4, 1e6, 5, 1e3) == 5 + 1.5e3);
  CHECK(ring_allreduce_time(4, 1e6, 5, 0) == 5);
  c.reduce = -1;
  CHECK_THROWS_WITH(simulate(dp, c), "cost model: the reduction (R) cost must be finite and at least 0");
  // The fitted model takes the mean reduction of a trace.
  c.reduce = 3;
  CHECK(fit_cost_model(simulate(dp, c)).reduce == 3);
  // The text timeline draws the lane under each device.
  const std::string text = render_ascii(two);
  CHECK(text.find("device 0 R") != std::string::npos);
  CHECK(text.find("R1##") != std::string::npos);
}
