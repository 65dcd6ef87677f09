// Overlapped F/B pairs: tokens, the verifier's pair checks word for word,
// lowering (a pair's receives before it, its sends after it), overlap() and
// Overlapped<S>, DualPipeV.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "../common/programs.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

// The seed's schedule with its pairs, proved at compile time: device 0 runs the
// forward of layers 1-2 (chunk 0) with the backward of layers 9-10 (chunk 1).
using Seed = Overlapped<Interleaved1F1B<4, 2, 8>>;
static_assert(Seed::actions[0][10] == fwd(0, 6));
static_assert(Seed::actions[0][11] == fwd(0, 7).paired());
static_assert(Seed::actions[0][12] == bwd(1, 0));
static_assert(Seed::actions[3][5] == fwd(1, 1).paired());  // the last device: B1.0 with the next forward
static_assert(Seed::actions[3][6] == bwd(1, 0));
static_assert(verify(Seed{}));
static_assert(verify(Overlapped<OneFOneB<4, 8>>{}));
static_assert(verify(Overlapped<Interleaved1F1B<2, 2, 4>>{}));
static_assert(verify(DualPipeV<2, 4>{}));
static_assert(verify(DualPipeV<4, 8>{}));
static_assert(verify(Overlapped<DualPipeV<3, 6>>{}));  // DualPipeV's own pairs stay

namespace {

using test::custom;

std::string message(const Program& p) { return test::rejection(p); }


}  // namespace

TEST_CASE("a pair prints as one token, in programs and in steps", "[schedule]") {
  const Program p = custom(1, 1, 2, {{fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)}});
  CHECK(format_actions(p) == "device 0: F0.0 (F0.1;B0.0) B0.1\n");
  const LoweredProgram lp = lower(p);
  CHECK(format_steps(lp) == "device 0: 4 steps\n  step 0: F0.0\n  step 1: (F0.1;\n  step 2: B0.0)\n  step 3: B0.1\n");
  CHECK(to_string(fwd(0, 1).paired()) == "F0.1");
  CHECK(fwd(0, 1).paired().single() == fwd(0, 1));
  CHECK(has_pairs(p));
  CHECK(pair_count(p) == 1);
  CHECK_FALSE(has_pairs(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2)));
  CHECK(pair_count(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2)) == 0);
  // A flagged forward with nothing after it is no pair (verify() refuses it).
  CHECK(pair_count(std::vector<Action>{fwd(0, 0).paired(), bwd(0, 0), fwd(0, 1).paired()}) == 1);
}

TEST_CASE("a pair is a forward and then an independent B or I, word for word", "[schedule]") {
  CHECK(message(custom(1, 1, 2, {{fwd(0, 0), bwd(0, 0).paired(), fwd(0, 1), bwd(0, 1)}})) ==
        "device 0, step 1: B0.0 starts an overlapped pair, but it is not a forward; a pair is a forward and then a "
        "backward (B or I)");
  CHECK(message(custom(1, 1, 1, {{bwd(0, 0), fwd(0, 0).paired()}})) ==
        "device 0, step 1: F0.0 starts an overlapped pair, but it is the device's last action; a pair is a forward and "
        "then a backward (B or I)");
  CHECK(message(custom(1, 1, 2, {{fwd(0, 0), bwd_input(0, 0), fwd(0, 1).paired(), bwd_weight(0, 0), bwd_input(0, 1),
                                  bwd_weight(0, 1)}})) ==
        "device 0, step 2: (F0.1;W0.0) pairs the forward with a weight gradient (W); a pair is a forward and then a "
        "backward (B or I)");
  CHECK(message(custom(1, 1, 2, {{fwd(0, 0).paired(), fwd(0, 1), bwd(0, 0), bwd(0, 1)}})) ==
        "device 0, step 0: (F0.0;F0.1) pairs the forward with another forward; a pair is a forward and then a backward "
        "(B or I)");
  // B(s, m) needs F(s, m) directly, and F(s', m) of every earlier stage through the forwards between.
  CHECK(message(custom(1, 1, 1, {{fwd(0, 0).paired(), bwd(0, 0)}})) ==
        "device 0, step 0: (F0.0;B0.0) pairs B0.0 (stage 0, micro-batch 0) with F0.0 (stage 0, micro-batch 0), whose "
        "result it needs; the halves of a pair must be independent");
  CHECK(message(custom(1, 2, 1, {{fwd(0, 0).paired(), bwd(1, 0), fwd(1, 0), bwd(0, 0)}})) ==
        "device 0, step 0: (F0.0;B1.0) pairs B1.0 (stage 1, micro-batch 0) with F0.0 (stage 0, micro-batch 0), whose "
        "result it needs through the forward of stage 1; the halves of a pair must be independent");
  CHECK(message(custom(2, 2, 1, {{fwd(0, 0).paired(), bwd(1, 0), fwd(1, 0), bwd(0, 0)},
                                 {fwd(0, 0), fwd(1, 0), bwd(1, 0), bwd(0, 0)}})) ==
        "device 0, step 0: (F0.0;B1.0) pairs B1.0 (stage 2, micro-batch 0) with F0.0 (stage 0, micro-batch 0), whose "
        "result it needs through the forwards of stages 1..2; the halves of a pair must be independent");
}

TEST_CASE("both inputs of a pair must be there when it starts: a cycle through the pair", "[schedule]") {
  // 1F1B on 2 devices with each device pairing F1 with B0: device 0's pair
  // waits for device 1's B0, which is in a pair waiting for device 0's F1.
  const Program p = custom(2, 1, 2,
                           {{fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)},
                            {fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)}});
  CHECK(message(p) ==
        "device 0, step 1: B0.0 (stage 0, micro-batch 0), in the pair (F0.1;B0.0), waits for B0.0 on device 1 (its "
        "step 2), which waits behind (F0.1;B0.0) (step 1): the dependencies form a cycle (deadlock)");
  CHECK_THROWS_WITH(lower(p), "lower: the program's dependencies form a cycle; verify() says where");
  // The same pairs with device 0 one step later run.
  const Program ok = custom(2, 1, 2,
                            {{fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)},
                             {fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)}});
  const VerifyResult r = verify(ok);
  INFO(r.what());
  CHECK(r);
}

TEST_CASE("a pair's backward waits for what its own device has not run yet", "[schedule]") {
  // B1.0 needs F1.0 of its own device, which comes after the pair.
  const Program p = custom(2, 2, 2,
                           {{fwd(0, 0), fwd(0, 1), fwd(1, 0), fwd(1, 1), bwd(1, 0), bwd(0, 0), bwd(1, 1), bwd(0, 1)},
                            {fwd(0, 0), fwd(0, 1).paired(), bwd(1, 0), fwd(1, 0), fwd(1, 1), bwd(1, 1), bwd(0, 0),
                             bwd(0, 1)}});
  CHECK(message(p) == "device 1, step 2: B1.0 (stage 3, micro-batch 0) runs before F1.0 (step 3), whose result it needs");
  CHECK_THROWS_WITH(lower(p), "lower: the program's dependencies form a cycle; verify() says where");
}

TEST_CASE("lower() refuses a malformed pair", "[schedule]") {
  CHECK_THROWS_WITH(lower(custom(1, 1, 2, {{fwd(0, 0), bwd(0, 0).paired(), fwd(0, 1), bwd(0, 1)}})),
                    "lower: an overlapped pair must be a forward followed by a backward (B or I); verify() says where");
}

TEST_CASE("a pair's receives complete before it and its sends follow it, P = 2 included", "[schedule]") {
  std::vector<Program> programs;
  for (int P : {2, 3, 4})
    for (int M : {2 * P, 2 * P + 1, 3 * P}) programs.push_back(make_schedule(ScheduleKind::kDualPipeV, P, 2, M));
  for (int P : {2, 3, 4}) {
    programs.push_back(overlap(make_schedule(ScheduleKind::kOneFOneB, P, 1, 2 * P)));
    programs.push_back(overlap(make_schedule(ScheduleKind::kInterleaved1F1B, P, 2, 2 * P)));
  }
  for (const Program& p : programs) {
    INFO(schedule_name(p.shape.kind) << " P=" << p.shape.devices << " M=" << p.shape.micro_batches);
    REQUIRE(pair_count(p) > 0);
    const LoweredProgram lp = lower(p);
    const VerifyResult r = verify(lp);
    INFO(r.what());
    CHECK(r);
    for (int d = 0; d < p.shape.devices; ++d) {
      const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
      for (std::size_t t = 0; t + 1 < steps.size(); ++t) {
        const Step st = steps[t];
        if (!st.has_compute || !st.compute.overlaps_next) continue;
        const Step next = steps[t + 1];
        CHECK(next.ops.empty());  // the backward's step has no group
        REQUIRE(next.has_compute);
        for (const Action& half : {st.compute, next.compute}) {
          const Transfer in = input_of(p.shape, d, half), out = output_of(p.shape, d, half);
          for (std::size_t u = 0; u < steps.size(); ++u) {
            for (const P2POp& op : steps[u].ops) {
              if (in.exists && op.kind == OpKind::kRecv && op.tensor == in.tensor) CHECK(u <= t);
              if (out.exists && op.kind == OpKind::kSend && op.tensor == out.tensor) CHECK(u >= t + 2);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a lowered pair's backward with a group of its own, or apart from its forward, is named", "[schedule]") {
  const Program p = overlap(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4));
  const LoweredProgram lp = lower(p);
  // Device 0: move the group of a pair's forward step to its backward's step.
  std::vector<StepSpec> specs = lp.devices[0].specs();
  std::size_t t = 0;
  while (t < specs.size() && !(specs[t].has_compute && specs[t].compute.overlaps_next && !specs[t].ops.empty())) ++t;
  REQUIRE(t + 1 < specs.size());
  LoweredProgram moved = lp;
  std::swap(specs[t].ops, specs[t + 1].ops);
  moved.devices[0] = StepList(specs);
  const VerifyResult r = verify(moved);
  REQUIRE_FALSE(r);
  CHECK(r.what() == "device 0, step " + std::to_string(t + 1) + ": the backward of the overlapped pair started at step " +
                        std::to_string(t) +
                        " has a group of its own; a pair's receives come before it and its sends after it");
  // An empty step between the halves.
  specs = lp.devices[0].specs();
  specs.insert(specs.begin() + static_cast<std::ptrdiff_t>(t) + 1, StepSpec{});
  LoweredProgram apart = lp;
  apart.devices[0] = StepList(specs);
  const VerifyResult r2 = verify(apart);
  REQUIRE_FALSE(r2);
  CHECK_THAT(r2.what(), Catch::Matchers::Contains("the backward of the pair is at step " + std::to_string(t + 2) +
                                                  "; it must be the step right after the forward's, with no group"));
}

TEST_CASE("overlap() pairs each backward with the next forward, and the result verifies over a grid", "[schedule]") {
  const Program seed = overlap(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8));
  CHECK(format_device_actions(seed, 0) ==
        "device 0: F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 F0.6 (F0.7;B1.0) (F1.4;B1.1) (F1.5;B1.2) "
        "(F1.6;B1.3) (F1.7;B0.0) B0.1 B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7");
  CHECK(format_device_actions(seed, 3) ==
        "device 3: F0.0 F0.1 F0.2 F0.3 F1.0 (F1.1;B1.0) (F1.2;B1.1) (F1.3;B1.2) (F0.4;B1.3) (F0.5;B0.0) (F0.6;B0.1) "
        "(F0.7;B0.2) (F1.4;B0.3) (F1.5;B1.4) (F1.6;B1.5) (F1.7;B1.6) B1.7 B0.4 B0.5 B0.6 B0.7");
  CHECK(seed == Seed::program());
  CHECK(seed.shape == make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8).shape);
  // 1F1B: every steady backward with the next forward, M - 1 pairs on each device.
  const Program one = overlap(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8));
  CHECK(format_device_actions(one, 3) ==
        "device 3: F0.0 (F0.1;B0.0) (F0.2;B0.1) (F0.3;B0.2) (F0.4;B0.3) (F0.5;B0.4) (F0.6;B0.5) (F0.7;B0.6) B0.7");
  CHECK(format_device_actions(one, 0) == "device 0: F0.0 F0.1 F0.2 F0.3 (F0.4;B0.0) (F0.5;B0.1) (F0.6;B0.2) (F0.7;B0.3) "
                                         "B0.4 B0.5 B0.6 B0.7");
  CHECK(overlap(one) == one);  // pairs stay; nothing more to fuse
  int shapes = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B,
                            ScheduleKind::kLoopedBFS, ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleavedZeroBubble,
                            ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV}) {
    for (int P = 1; P <= 6; ++P) {
      for (int V = 1; V <= 3; ++V) {
        for (int M = 1; M <= 14; ++M) {
          const ScheduleShape s{kind, P, V, M, placement_of(kind)};
          if (!shape_error(s).empty()) continue;
          const Program p = make_program(s);
          const Program o = overlap(p);
          {  // fusing alone gives o: no pair of a generated schedule has to be split back
            Program fused = p;
            for (int d = 0; d < P; ++d) {
              auto& row = fused.devices[static_cast<std::size_t>(d)];
              detail::fuse_adjacent(s, d, row.data(), static_cast<int>(row.size()));
            }
            CHECK(fused == o);
          }
          INFO(schedule_name(kind) << " P=" << P << " V=" << V << " M=" << M);
          const VerifyResult r = verify(o);
          INFO(r.what());
          CHECK(r);
          // The same actions per device, in the same order but for the swapped halves of each pair.
          for (int d = 0; d < P; ++d) {
            const auto& a = p.devices[static_cast<std::size_t>(d)];
            const auto& b = o.devices[static_cast<std::size_t>(d)];
            REQUIRE(a.size() == b.size());
            for (std::size_t k = 0; k < a.size(); ++k) {
              if (b[k].overlaps_next && !a[k].overlaps_next) {
                CHECK((a[k] == b[k + 1] && a[k + 1] == b[k].single()));
                ++k;
              } else {
                CHECK(a[k] == b[k]);
              }
            }
          }
          if (kind == ScheduleKind::kOneFOneB) {  // each steady backward but the last pairs with the next forward
            int pairs = 0;
            for (int d = 0; d < P; ++d) pairs += std::max(0, M - std::min(P - d - 1, M) - 1);
            CHECK(pair_count(o) == pairs);
          }
          ++shapes;
        }
      }
    }
  }
  CHECK(shapes > 700);
}

TEST_CASE("overlap() splits a pair back where it would wait for what the program did not", "[schedule]") {
  // Device 1's (F0.1;B0.0) would wait for device 0's F0.1, which is in a pair waiting for device 1's B0.0.
  const Program p = custom(2, 1, 2, {{fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1)}, {fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1)}});
  const Program o = overlap(p);
  CHECK(format_actions(o) == "device 0: F0.0 (F0.1;B0.0) B0.1\ndevice 1: F0.0 B0.0 F0.1 B0.1\n");
  CHECK(verify(o));
}

TEST_CASE("overlap() refuses a program that does not verify", "[schedule]") {
  Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  p.devices[0].pop_back();
  CHECK_THROWS_WITH(overlap(p), "overlap: the program is not correct: device 0: B0.1 (stage 0, micro-batch 1) is missing");
}

TEST_CASE("random pairs: the verifier decides, the lowering agrees, and a lowered program verifies", "[schedule]") {
  std::mt19937 rng(11);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const ScheduleKind kind = trial % 3 == 0   ? ScheduleKind::kOneFOneB
                              : trial % 3 == 1 ? ScheduleKind::kInterleaved1F1B
                                               : ScheduleKind::kZeroBubbleV;
    const int P = 1 + static_cast<int>(rng() % 4), V = kind == ScheduleKind::kOneFOneB ? 1 : 2;
    Program p = make_schedule(kind, P, V, P * (1 + static_cast<int>(rng() % 2)));
    if (trial % 2 == 0) p = overlap(p);
    for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
      auto& row = p.devices[rng() % static_cast<unsigned>(P)];
      const std::size_t k = rng() % row.size();
      if (rng() % 2 == 0) row[k].overlaps_next = !row[k].overlaps_next;
      else if (k + 1 < row.size()) std::swap(row[k], row[k + 1]);
    }
    const VerifyResult r = verify(p);
    INFO(format_actions(p) << r.what());
    if (r) {
      ++accepted;
      const LoweredProgram lp = lower(p);
      const VerifyResult rl = verify(lp);
      INFO(rl.what());
      CHECK(rl);
    } else {
      ++rejected;
      CHECK_FALSE(r.what().empty());
    }
  }
  CHECK(accepted > 300);
  CHECK(rejected > 300);
}
