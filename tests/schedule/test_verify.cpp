// The verifier on correct programs and on broken ones, message by message.
#include <catch2/catch.hpp>

#include <random>
#include <utility>

#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;

namespace {

Program seed() { return make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8); }

std::size_t find(const std::vector<Action>& v, const Action& a) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] == a) return i;
  FAIL("action not found");
  return 0;
}

}  // namespace

TEST_CASE("a hand-written program verifies", "[schedule]") {
  Program p{{ScheduleKind::kCustom, 2, 1, 2}, {}};
  p.devices = {{fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)}, {fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1)}};
  const VerifyResult r = verify(p);
  INFO(r.what());
  CHECK(r);
  CHECK(r.what() == "ok");
}

TEST_CASE("a missing action", "[schedule]") {
  Program p = seed();
  auto& d1 = p.devices[1];
  d1.erase(d1.begin() + static_cast<std::ptrdiff_t>(find(d1, bwd(0, 3))));
  const VerifyResult r = verify(p);
  CHECK_FALSE(r);
  CHECK(r.device == 1);
  CHECK_THAT(r.what(), Contains("device 1: B0.3 (stage 1, micro-batch 3) is missing"));
}

TEST_CASE("an action twice", "[schedule]") {
  Program p = seed();
  p.devices[2][5] = fwd(0, 1);
  const VerifyResult r = verify(p);
  CHECK_FALSE(r);
  CHECK_THAT(r.what(), Contains("device 2, step 5: F0.1 (stage 2, micro-batch 1) appears a second time (first at step 1)"));
}

TEST_CASE("indices out of range", "[schedule]") {
  Program p = seed();
  p.devices[0][3] = fwd(2, 3);
  CHECK_THAT(verify(p).what(), Contains("device 0, step 3: F2.3 has chunk 2; chunks are 0..1"));
  p = seed();
  p.devices[0][3] = fwd(0, 9);
  CHECK_THAT(verify(p).what(), Contains("micro-batches are 0..7"));
}

TEST_CASE("two actions swapped on one device", "[schedule]") {
  Program p = seed();
  auto& d3 = p.devices[3];
  const std::size_t f = find(d3, fwd(1, 0)), b = find(d3, bwd(1, 0));
  std::swap(d3[f], d3[b]);
  const VerifyResult r = verify(p);
  CHECK_FALSE(r);
  CHECK(r.device == 3);
  CHECK(r.step == static_cast<int>(f));
  CHECK_THAT(r.what(), Contains("device 3, step 4: B1.0 (stage 7, micro-batch 0) runs before F1.0 (step 5), whose result it needs"));
}

TEST_CASE("two actions swapped across devices form a cycle", "[schedule]") {
  Program p{{ScheduleKind::kCustom, 2, 1, 2}, {}};
  // Device 0 runs B0.0 before F0.1, but device 1 needs F0.1's activation before B0.0.
  p.devices = {{fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1)}, {fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)}};
  const VerifyResult r = verify(p);
  CHECK_FALSE(r);
  CHECK_THAT(r.what(), Contains("device 0, step 1: B0.0 (stage 0, micro-batch 0) waits for B0.0 on device 1 (its step 2), "
                                "which waits behind F0.1 (step 1): the dependencies form a cycle (deadlock)"));
}

TEST_CASE("the wrong number of devices or an empty shape", "[schedule]") {
  Program p = seed();
  p.devices.pop_back();
  CHECK_THAT(verify(p).what(), Contains("the program has 3 action lists for 4 devices"));
  p.shape.micro_batches = 0;
  CHECK_THAT(verify(p).what(), Contains("at least 1"));
}

namespace {

// 1F1B, P = 2, M = 2, lowered by hand: each device receives only when it needs a
// tensor and sends right after computing it.
LoweredProgram lazy_lowering() {
  LoweredProgram lp{{ScheduleKind::kCustom, 2, 1, 2}, {}};
  const TensorId a0{TensorKind::kActivation, 0, 0}, a1{TensorKind::kActivation, 0, 1};
  const TensorId g0{TensorKind::kGradient, 1, 0}, g1{TensorKind::kGradient, 1, 1};
  auto compute = [](Action a) { return StepSpec{{}, true, a}; };
  auto group = [](std::vector<P2POp> ops) { return StepSpec{std::move(ops), false, {}}; };
  lp.devices.resize(2);
  lp.devices[0] = {compute(fwd(0, 0)),
                   group({{OpKind::kSend, 1, a0}}),
                   compute(fwd(0, 1)),
                   group({{OpKind::kSend, 1, a1}}),
                   group({{OpKind::kRecv, 1, g0}}),
                   compute(bwd(0, 0)),
                   group({{OpKind::kRecv, 1, g1}}),
                   compute(bwd(0, 1))};
  lp.devices[1] = {group({{OpKind::kRecv, 0, a0}}),
                   compute(fwd(0, 0)),
                   compute(bwd(0, 0)),
                   group({{OpKind::kSend, 0, g0}}),
                   group({{OpKind::kRecv, 0, a1}}),
                   compute(fwd(0, 1)),
                   compute(bwd(0, 1)),
                   group({{OpKind::kSend, 0, g1}})};
  return lp;
}

}  // namespace

TEST_CASE("a hand-written lowering whose order works verifies", "[schedule]") {
  LoweredProgram lp = lazy_lowering();
  // Device 1 sends g0 and receives a1 in one group: no deadlock.
  std::vector<StepSpec> d1 = lp.devices[1].specs();
  d1[3].ops.push_back(d1[4].ops[0]);
  d1.erase(d1.begin() + 4);
  lp.devices[1] = StepList(d1);
  const VerifyResult r = verify(lp);
  INFO(r.what());
  CHECK(r);
}

TEST_CASE("a lowering whose steps run an action before one of its own device it needs fails", "[schedule]") {
  // One device: no operation at all, so only the order of the computes is wrong.
  const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, 1, 2, 2);
  std::vector<StepSpec> steps = lower(p).devices[0].specs();
  std::size_t f = 0, b = 0;
  for (std::size_t t = 0; t < steps.size(); ++t) {
    if (steps[t].compute == fwd(1, 0)) f = t;
    if (steps[t].compute == bwd(1, 0)) b = t;
  }
  std::swap(steps[f], steps[b]);
  LoweredProgram lp{p.shape, {StepList(steps)}};
  const VerifyResult r = verify(lp);
  CHECK_FALSE(r);
  CHECK(r.step == static_cast<int>(f));
  Text want;
  want << "device 0, step " << static_cast<int>(f) << ": B1.0 (stage 1, micro-batch 0) runs before F1.0 (step "
       << static_cast<int>(b) << "), whose result it needs";
  CHECK_THAT(r.what(), Contains(want.str()));
}

TEST_CASE("a program and its lowering verify together, without a second lowering", "[schedule]") {
  const Program p = seed();
  const LoweredProgram lp = lower(p);
  CHECK(verify(p, lp));
  // The program's actions must be the lowering's computes, in order.
  Program other = p;
  std::swap(other.devices[2][0], other.devices[2][1]);
  VerifyResult r = verify(other, lp);
  CHECK_FALSE(r);
  CHECK(r.device == 2);
  CHECK_THAT(r.what(), Contains("device 2, step 0: the lowered program's action F0.0 is not the program's action 0 (F0.1); "
                                "a lowering keeps each device's actions, in program order"));
  other = p;
  other.devices[1].pop_back();
  r = verify(other, lp);
  CHECK_FALSE(r);
  CHECK_THAT(r.what(), Contains("is one more than the program's 31 actions"));
  other = p;
  other.devices[1].push_back(fwd(0, 0));
  CHECK_THAT(verify(other, lp).what(), Contains("device 1: the lowered program's steps end before the program's action 32 (F0.0)"));
  other = p;
  other.shape.micro_batches = 4;
  CHECK_THAT(verify(other, lp).what(), Contains("the lowered program's shape is not the program's"));
  // A failure of the lowering itself is verify(lp)'s.
  LoweredProgram broken = lazy_lowering();
  Program lazy{broken.shape, {}};
  for (const StepList& steps : broken.devices) {
    lazy.devices.emplace_back();
    for (const Step& st : steps)
      if (st.has_compute) lazy.devices.back().push_back(st.compute);
  }
  CHECK(verify(lazy, broken).what() == verify(broken).what());
}

TEST_CASE("crossed sends deadlock under rendezvous semantics", "[schedule]") {
  const VerifyResult r = verify(lazy_lowering());
  CHECK_FALSE(r);
  CHECK_THAT(r.what(), Contains("deadlock: device 0 at step 3 waits for device 1 (at step 3) to receive activation(stage 0, "
                                "micro-batch 1) at its step 4; device 1 at step 3 waits for device 0 (at step 3) to "
                                "receive gradient(stage 1, micro-batch 0) at its step 4"));
}

TEST_CASE("a missing receive", "[schedule]") {
  LoweredProgram lp = lower(seed());
  // Drop device 2's receive of the activation of stage 1, micro-batch 0.
  bool dropped = false;
  std::vector<StepSpec> d2 = lp.devices[2].specs();
  for (StepSpec& st : d2) {
    for (std::size_t i = 0; i < st.ops.size() && !dropped; ++i) {
      if (st.ops[i].kind == OpKind::kRecv && st.ops[i].tensor == TensorId{TensorKind::kActivation, 1, 0}) {
        st.ops.erase(st.ops.begin() + static_cast<std::ptrdiff_t>(i));
        dropped = true;
      }
    }
  }
  REQUIRE(dropped);
  lp.devices[2] = StepList(d2);
  const VerifyResult r = verify(lp);
  CHECK_FALSE(r);
  CHECK(r.device == 2);
  CHECK_THAT(r.what(), Contains("F0.0 (stage 2, micro-batch 0) needs activation(stage 1, micro-batch 0) from device 1, "
                                "but no step up to this one receives it"));
}

TEST_CASE("a send nobody receives", "[schedule]") {
  LoweredProgram lp = lazy_lowering();
  // An extra send of a gradient device 0 never computes is caught as such...
  std::vector<StepSpec> d1 = lp.devices[1].specs();
  d1.back().ops.push_back({OpKind::kSend, 0, {TensorKind::kGradient, 1, 1}});
  lp.devices[1] = StepList(d1);
  CHECK_THAT(verify(lp).what(), Contains("a second time"));
  // ...and a receive removed leaves its send unmatched.
  LoweredProgram lq = lower(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 1));
  std::vector<StepSpec> d0 = lq.devices[0].specs();
  for (StepSpec& st : d0)
    for (std::size_t i = 0; i < st.ops.size(); ++i)
      if (st.ops[i].kind == OpKind::kRecv) st.ops.erase(st.ops.begin() + static_cast<std::ptrdiff_t>(i));
  lq.devices[0] = StepList(d0);
  // Device 0's backward now lacks its input: the data-flow check names it.
  CHECK_THAT(verify(lq).what(), Contains("needs gradient(stage 1, micro-batch 0) from device 1"));
}

TEST_CASE("a gradient received where an activation was expected", "[schedule]") {
  // P = 2: device 0 sends device 1 both activations (stages 0 and 2) and gradients
  // (stage 2). Move one gradient's receive ahead of an activation's receive.
  LoweredProgram lp = lower(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2));
  std::vector<StepSpec> d1 = lp.devices[1].specs();
  std::size_t grad_step = 0, grad_op = 0;
  bool found = false;
  for (std::size_t t = 0; t < d1.size() && !found; ++t)
    for (std::size_t i = 0; i < d1[t].ops.size() && !found; ++i)
      if (d1[t].ops[i].kind == OpKind::kRecv && d1[t].ops[i].tensor.kind == TensorKind::kGradient) {
        grad_step = t;
        grad_op = i;
        found = true;
      }
  REQUIRE(found);
  std::size_t act_step = grad_step;
  for (std::size_t t = 0; t < grad_step; ++t)
    for (const P2POp& op : d1[t].ops)
      if (op.kind == OpKind::kRecv && op.tensor.kind == TensorKind::kActivation) act_step = t;
  REQUIRE(act_step < grad_step);
  const P2POp grad = d1[grad_step].ops[grad_op];
  d1[grad_step].ops.erase(d1[grad_step].ops.begin() + static_cast<std::ptrdiff_t>(grad_op));
  auto& ops = d1[act_step].ops;
  ops.insert(ops.begin(), grad);
  lp.devices[1] = StepList(d1);
  const VerifyResult r = verify(lp);
  CHECK_FALSE(r);
  CHECK(r.device == 1);
  CHECK_THAT(r.what(), Contains("from device 0 expects gradient(stage 2, micro-batch 0), but the message it matches"));
  CHECK_THAT(r.what(), Contains("is activation(stage 2, micro-batch 1)"));
}

TEST_CASE("a receive from the wrong device or of a foreign tensor", "[schedule]") {
  LoweredProgram lp = lower(make_schedule(ScheduleKind::kOneFOneB, 3, 1, 3));
  std::vector<StepSpec> d2 = lp.devices[2].specs();
  for (StepSpec& st : d2)
    for (P2POp& op : st.ops)
      if (op.kind == OpKind::kRecv) op.peer = 0;
  lp.devices[2] = StepList(d2);
  CHECK_THAT(verify(lp).what(), Contains("device 2, step 0: receives activation(stage 1, micro-batch 0) from device 0, but stage 1 is on device 1"));
  LoweredProgram lq = lower(make_schedule(ScheduleKind::kOneFOneB, 3, 1, 3));
  std::vector<StepSpec> e2 = lq.devices[2].specs();
  e2[0].ops[0].tensor = {TensorKind::kActivation, 0, 0};
  lq.devices[2] = StepList(e2);
  CHECK_THAT(verify(lq).what(), Contains("but its consumer, stage 1, is on device 1"));
}

TEST_CASE("the verifier's run and its wording agree on edited lowerings", "[schedule]") {
  // Random edits of lowered programs: each result is ok, or says what is wrong;
  // the run that decides and the pass that words it never disagree.
  std::mt19937 rng(20240612);
  int failed = 0, passed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int P = 2 + static_cast<int>(rng() % 3), V = 1 + static_cast<int>(rng() % 2);
    LoweredProgram lp = lower(make_schedule(ScheduleKind::kInterleaved1F1B, P, V, P));
    const auto d = static_cast<std::size_t>(rng() % static_cast<unsigned>(P));
    std::vector<StepSpec> steps = lp.devices[d].specs();
    const std::size_t t = rng() % steps.size(), u = rng() % steps.size();
    switch (rng() % 5) {
      case 0:  // drop an operation
        if (!steps[t].ops.empty()) steps[t].ops.erase(steps[t].ops.begin());
        break;
      case 1:  // move an operation to another step
        if (!steps[t].ops.empty()) {
          steps[u].ops.push_back(steps[t].ops.back());
          steps[t].ops.pop_back();
        }
        break;
      case 2:  // swap two steps
        std::swap(steps[t], steps[u]);
        break;
      case 3:  // send to, or receive from, another device
        if (!steps[t].ops.empty()) steps[t].ops[0].peer = static_cast<int>(rng() % static_cast<unsigned>(P + 1)) - 1;
        break;
      default:  // another tensor
        if (!steps[t].ops.empty()) steps[t].ops[0].tensor.micro_batch = static_cast<int>(rng() % static_cast<unsigned>(P));
        break;
    }
    lp.devices[d] = StepList(steps);
    const VerifyResult r = verify(lp);
    INFO(r.what());
    CHECK_THAT(r.what(), !Contains("cannot locate"));
    (r ? passed : failed)++;
  }
  CHECK(failed > 100);
  CHECK(passed > 0);
}

namespace {

Program zb_h1() { return make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 2); }  // device 0: F0.0 F0.1 I0.0 W0.0 I0.1 W0.1

}  // namespace

TEST_CASE("a split backward needs its I and its W, and not a B besides", "[schedule]") {
  Program p = zb_h1();
  REQUIRE(p.devices[0] == std::vector<Action>{fwd(0, 0), fwd(0, 1), bwd_input(0, 0), bwd_weight(0, 0), bwd_input(0, 1),
                                              bwd_weight(0, 1)});
  p.devices[0].pop_back();
  CHECK_THAT(verify(p).what(), Contains("device 0: W0.1 (stage 0, micro-batch 1) is missing"));
  p = zb_h1();
  p.devices[0].erase(p.devices[0].begin() + 4);
  CHECK_THAT(verify(p).what(), Contains("device 0: I0.1 (stage 0, micro-batch 1) is missing"));
  p = zb_h1();
  p.devices[0][4] = bwd(0, 0);
  const VerifyResult r = verify(p);
  CHECK(r.device == 0);
  CHECK(r.step == 4);
  CHECK_THAT(r.what(), Contains("device 0, step 4: B0.0 (stage 0, micro-batch 0) and I0.0 (step 2) both compute the input "
                                "gradient; a backward is one B, or one I and one W"));
  p = zb_h1();
  p.devices[0][4] = bwd(0, 1);  // B0.1, then W0.1
  CHECK_THAT(verify(p).what(), Contains("device 0, step 5: W0.1 (stage 0, micro-batch 1) and B0.1 (step 4) both compute the "
                                        "weight gradient; a backward is one B, or one I and one W"));
  p = zb_h1();
  p.devices[0][5] = bwd_input(0, 1);
  CHECK_THAT(verify(p).what(), Contains("device 0, step 5: I0.1 (stage 0, micro-batch 1) appears a second time (first at step 4)"));
  // A mix of full and split backwards is a program too.
  p = zb_h1();
  p.devices[0] = {fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd_input(0, 1), bwd_weight(0, 1)};
  const VerifyResult mixed = verify(p);
  INFO(mixed.what());
  CHECK(mixed);
}

TEST_CASE("a W before its I, and a cycle through an I, are named with their kinds", "[schedule]") {
  Program p = zb_h1();
  std::swap(p.devices[0][2], p.devices[0][3]);
  CHECK_THAT(verify(p).what(), Contains("device 0, step 2: W0.0 (stage 0, micro-batch 0) runs before I0.0 (step 3), whose "
                                        "result it needs"));
  // Device 0 runs I0.0 before F0.1; device 1 needs F0.1 before its I0.0.
  p = zb_h1();
  p.devices[0] = {fwd(0, 0), bwd_input(0, 0), fwd(0, 1), bwd_weight(0, 0), bwd_input(0, 1), bwd_weight(0, 1)};
  p.devices[1] = {fwd(0, 0), fwd(0, 1), bwd_input(0, 0), bwd_weight(0, 0), bwd_input(0, 1), bwd_weight(0, 1)};
  CHECK_THAT(verify(p).what(), Contains("device 0, step 1: I0.0 (stage 0, micro-batch 0) waits for I0.0 on device 1 (its "
                                        "step 2), which waits behind F0.1 (step 1): the dependencies form a cycle (deadlock)"));
  p = zb_h1();
  p.devices[1][1].phase = static_cast<Phase>(9);
  CHECK_THAT(verify(p).what(), Contains("device 1, step 1: an action has kind 9; kinds are F, B, I, W, C, R, O and L"));
}

TEST_CASE("with the v placement a stage hands over to the next on its device without a message", "[schedule]") {
  for (int P : {1, 2, 3, 4}) {
    const Program p = make_schedule(ScheduleKind::kZeroBubbleV, P, 2, 2 * P);
    const LoweredProgram lp = lower(p);
    INFO("P=" << P);
    CHECK(verify(lp));
    int sends = 0;
    for (int d = 0; d < P; ++d)
      for (const Step& st : lp.devices[static_cast<std::size_t>(d)])
        for (const P2POp& op : st.ops) {
          if (op.kind != OpKind::kSend) continue;
          ++sends;
          CHECK(op.tensor.stage != (op.tensor.kind == TensorKind::kActivation ? P - 1 : P));  // the turn is local
          CHECK((op.peer == d + 1 || op.peer == d - 1));  // neighbours only
        }
    // 2P - 1 stage boundaries, one of them on device P-1: 2P - 2 carry an activation and a gradient each.
    CHECK(sends == 2 * (2 * P - 2) * 2 * P);
  }
  // A send of a tensor that stays on its device is refused.
  const Program p = make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 2);
  LoweredProgram lp = lower(p);
  std::vector<StepSpec> d1 = lp.devices[1].specs();
  d1.back().ops.push_back({OpKind::kSend, 1, {TensorKind::kActivation, 1, 0}});
  lp.devices[1] = StepList(d1);
  CHECK_THAT(verify(lp).what(), Contains("sends activation(stage 1, micro-batch 0) to device 1, which is not another device"));
}
