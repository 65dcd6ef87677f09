// P2P lowering: steps, groups, FIFO matching per directed pair.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

namespace {

std::vector<Action> computes(const StepList& steps) {
  std::vector<Action> out;
  for (const Step& s : steps)
    if (s.has_compute) out.push_back(s.compute);
  return out;
}

}  // namespace

TEST_CASE("lowering keeps each device's compute order", "[schedule]") {
  for (int P : {1, 2, 3, 4}) {
    for (int V : {1, 2, 3}) {
      const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, P, V, 2 * P);
      const LoweredProgram lp = lower(p);
      for (std::size_t d = 0; d < p.devices.size(); ++d) CHECK(computes(lp.devices[d]) == p.devices[d]);
    }
  }
}

TEST_CASE("interleaved with one device has no P2P at all", "[schedule]") {
  const LoweredProgram lp = lower(make_schedule(ScheduleKind::kInterleaved1F1B, 1, 4, 3));
  REQUIRE(lp.devices.size() == 1);
  CHECK(lp.devices[0].size() == 2u * 4 * 3);
  for (const Step& s : lp.devices[0]) CHECK(s.ops.empty());
}

TEST_CASE("every message goes from its producer to its consumer, once, in FIFO order", "[schedule]") {
  for (int P : {2, 3, 4, 5}) {
    for (int V : {1, 2, 3}) {
      for (ScheduleKind kind : {ScheduleKind::kInterleaved1F1B, ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
        if (kind != ScheduleKind::kInterleaved1F1B && V != 1) continue;
        const Program p = make_schedule(kind, P, V, 2 * P);
        const LoweredProgram lp = lower(p);
        const ScheduleShape& s = lp.shape;
        INFO(schedule_name(kind) << " P=" << P << " V=" << V);
        // Per directed pair: the sequence sent equals the sequence received.
        std::vector<std::vector<TensorId>> sent(static_cast<std::size_t>(P * P)), got(static_cast<std::size_t>(P * P));
        int sends = 0;
        for (int d = 0; d < P; ++d) {
          for (const Step& st : lp.devices[static_cast<std::size_t>(d)]) {
            for (const P2POp& op : st.ops) {
              if (op.kind == OpKind::kSend) {
                ++sends;
                sent[static_cast<std::size_t>(d * P + op.peer)].push_back(op.tensor);
                CHECK(s.device_of_stage(op.tensor.stage) == d);
              } else {
                got[static_cast<std::size_t>(op.peer * P + d)].push_back(op.tensor);
                const int consumer = op.tensor.kind == TensorKind::kActivation ? op.tensor.stage + 1 : op.tensor.stage - 1;
                CHECK(s.device_of_stage(consumer) == d);
              }
            }
          }
        }
        for (std::size_t i = 0; i < sent.size(); ++i) CHECK(sent[i] == got[i]);
        // Every stage boundary carries one activation and one gradient per micro-batch.
        CHECK(sends == 2 * (P * V - 1) * 2 * P);
      }
    }
  }
}

TEST_CASE("with two devices, activations and gradients share one FIFO and never cross", "[schedule]") {
  const LoweredProgram lp = lower(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 3, 6));
  bool both_kinds = false;
  std::vector<TensorId> sent, got;
  for (const Step& st : lp.devices[0])
    for (const P2POp& op : st.ops)
      if (op.kind == OpKind::kSend) sent.push_back(op.tensor);
  for (const Step& st : lp.devices[1])
    for (const P2POp& op : st.ops)
      if (op.kind == OpKind::kRecv) got.push_back(op.tensor);
  for (const TensorId& x : sent) both_kinds |= x.kind == TensorKind::kGradient;
  CHECK(both_kinds);
  CHECK(sent == got);
  CHECK(verify(lp));
}

TEST_CASE("a send and its receive sit at the same instant of the lowering", "[schedule]") {
  // Device 0 of the seed example sends the activation of F0.0 in the step after
  // computing it; device 1 receives it then and runs F0.0 in that step.
  const LoweredProgram lp = lower(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8));
  const Step& first = lp.devices[0][0];
  CHECK(first.has_compute);
  CHECK(first.compute == fwd(0, 0));
  CHECK(first.ops.empty());
  const Step& second = lp.devices[0][1];
  REQUIRE(second.ops.size() == 1);
  CHECK(second.ops[0] == P2POp{OpKind::kSend, 1, {TensorKind::kActivation, 0, 0}});
  const Step& d1 = lp.devices[1][0];
  REQUIRE(d1.ops.size() == 1);
  CHECK(d1.ops[0] == P2POp{OpKind::kRecv, 0, {TensorKind::kActivation, 0, 0}});
  CHECK(d1.compute == fwd(0, 0));
}

TEST_CASE("lowering refuses a program it cannot lower", "[schedule]") {
  Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  p.devices[0][0].chunk = 3;
  CHECK_THROWS_AS(lower(p), Error);
  Program q = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  q.devices.pop_back();
  CHECK_THROWS_AS(lower(q), Error);
}

TEST_CASE("a program's reference clock: one for all stages, or one per stage", "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kZeroBubbleV, 4, 2, 8);
  // One clock per stage, each the program's own: the same steps.
  Program same = p;
  same.stage_lowering.assign(static_cast<std::size_t>(p.shape.stages()), p.lowering);
  CHECK(lower(same) == lower(p));
  // The last stage (device 0's second chunk) twice as slow: other steps, still correct, each device's
  // actions in program order.
  Program slow = p;
  slow.stage_lowering = same.stage_lowering;
  slow.stage_lowering.back() = {2, 4, 2, 2};
  const LoweredProgram lp = lower(slow);
  CHECK(lp != lower(p));
  CHECK(verify(slow));
  CHECK(verify(lp));
  for (std::size_t d = 0; d < p.devices.size(); ++d) CHECK(computes(lp.devices[d]) == p.devices[d]);
  CHECK(lower_checked(slow) == lp);
  // A clock for each of the wrong number of stages, or a cost below 1: refused, by name.
  Program short_list = p;
  short_list.stage_lowering.resize(3);
  const std::string wrong =
      "the program's reference clock per stage (Program::stage_lowering) must hold one clock for each of its 8 virtual "
      "stages, or none (got 3)";
  CHECK(verify(short_list).message.str() == wrong);
  CHECK_THROWS_WITH(lower(short_list), "lower: " + wrong);
  CHECK_THROWS_WITH(lower_checked(short_list), "lower: " + wrong);
  Program zero = slow;
  zero.stage_lowering[2][Phase::kBackwardWeight] = 0;
  CHECK_THROWS_WITH(lower(zero), Catch::Matchers::Contains("must give every phase a cost of at least 1"));
  CHECK_FALSE(verify(zero));
}

TEST_CASE("a step list stores steps flat and gives them back as views and specs", "[schedule]") {
  const TensorId a0{TensorKind::kActivation, 0, 0}, g0{TensorKind::kGradient, 1, 0};
  StepList list{{{}, true, fwd(0, 0)}, {{{OpKind::kSend, 1, a0}, {OpKind::kRecv, 1, g0}}, false, {}}, {{}, true, bwd(0, 0)}};
  REQUIRE(list.size() == 3);
  CHECK(list[0].ops.empty());
  CHECK(list[0].has_compute);
  CHECK(list[0].compute == fwd(0, 0));
  REQUIRE(list[1].ops.size() == 2);
  CHECK(list[1].ops[1] == P2POp{OpKind::kRecv, 1, g0});
  CHECK_FALSE(list[1].has_compute);
  CHECK(list.back().compute == bwd(0, 0));
  CHECK(list.ops().size() == 2);
  int steps = 0, ops = 0;
  for (const Step& st : list) {
    ++steps;
    ops += static_cast<int>(st.ops.size());
  }
  CHECK(steps == 3);
  CHECK(ops == 2);
  // Written out, edited, built again.
  std::vector<StepSpec> specs = list.specs();
  REQUIRE(specs.size() == 3);
  CHECK(StepList(specs) == list);
  specs[1].ops.pop_back();
  specs.push_back({{{OpKind::kRecv, 1, g0}}, false, {}});
  const StepList edited(specs);
  CHECK_FALSE(edited == list);
  CHECK(edited.size() == 4);
  CHECK(edited[1].ops.size() == 1);
  CHECK(edited[3].ops[0].tensor == g0);
  // A step appended from a view of another list.
  StepList copy;
  for (const Step& st : list) copy.push_back(st.ops, st.has_compute, st.compute);
  CHECK(copy == list);
}

TEST_CASE("lowering costs nothing P x P: 4,096 devices lower and verify", "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kGPipe, 4096, 1, 1);
  const LoweredProgram lp = lower(p);
  REQUIRE(lp.devices.size() == 4096);
  CHECK(lp.devices[0].size() >= 2);
  CHECK(verify(p));
  CHECK(verify(lp));
}
