// Fuzz target: verify() on programs decoded from bytes, in three forms:
// - any program: a kind, a placement, P <= 6, V <= 3, M <= 6, any number of
//   device lists and actions of any phase, chunk and micro-batch indices one past
//   either end included;
// - a generated schedule with a few mutations (swaps, replacements, deletions,
//   duplications, overlapped pairs made or undone, gradient reductions placed),
//   which is often still valid;
// - hand-made lowered steps: groups of sends and receives with any peer and
//   tensor, and actions.
// Properties: verify() never throws and explains every rejection; the simulator
// refuses what verify() rejects, with an Error; a program it accepts lowers to
// steps it accepts too, and simulates to a finite makespan.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fuzz.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pf = pipeweave::fuzz;
using namespace pipeweave;

namespace {

enum Form { kAnyProgram, kMutatedSchedule, kHandMadeSteps, kForms };
enum Mutation { kSwapNeighbours, kSwapAny, kReplace, kDelete, kDuplicate, kSwapDevices, kTogglePair, kMutations };

Action any_action(pf::Input& in, const ScheduleShape& s) {
  const auto phase = static_cast<Phase>(in.integer(0, kPhases - 1));
  const int chunk = in.integer(-1, s.chunks), micro_batch = in.integer(-1, s.micro_batches);
  return {phase, chunk, micro_batch};
}

ScheduleShape any_shape(pf::Input& in, int max_devices, int max_chunks, int max_micro_batches) {
  ScheduleShape s;
  s.kind = static_cast<ScheduleKind>(in.integer(0, pf::kKinds));
  s.placement = in.flag() ? Placement::kV : Placement::kLoop;
  s.devices = in.integer(1, max_devices);
  s.chunks = in.integer(1, max_chunks);
  s.micro_batches = in.integer(1, max_micro_batches);
  return s;
}

Program any_program(pf::Input& in) {
  Program p{any_shape(in, 6, 3, 6), {}};
  p.devices.resize(static_cast<std::size_t>(in.integer(std::max(0, p.shape.devices - 1), p.shape.devices + 1)));
  for (auto& actions : p.devices) {
    const int n = in.integer(0, p.shape.actions_per_device() + 2);
    for (int k = 0; k < n; ++k) actions.push_back(any_action(in, p.shape));
  }
  return p;
}

// A generated schedule (its shape made valid) with up to four mutations.
// Kinds whose M this target keeps a multiple of P (interleaved: the rule; the
// zero-bubble kinds with chunks: a multiple of PyTorch's rounds).
bool needs_multiple_of_devices(ScheduleKind kind) {
  return kind == ScheduleKind::kInterleaved1F1B || kind == ScheduleKind::kZeroBubbleH1 ||
         kind == ScheduleKind::kInterleavedZeroBubble;
}

// Kinds that run with exactly two chunks per device: those of the v placement.
bool two_chunks(ScheduleKind kind) { return placement_of(kind) == Placement::kV; }

Program mutated_schedule(pf::Input& in) {
  const auto kind = static_cast<ScheduleKind>(in.integer(0, pf::kKinds - 1));
  const int P = in.integer(1, 5);
  const int V = two_chunks(kind) ? 2 : default_chunks(kind) > 1 ? in.integer(1, 3) : 1;
  const int M = kind == ScheduleKind::kDualPipeV          ? 2 * P + in.integer(0, 2)  // at least 2P
                : needs_multiple_of_devices(kind) ? P * in.integer(1, 2)
                                                  : in.integer(1, 6);
  Program p = make_schedule(kind, P, V, M);
  // One mutation of device lists of `p`; false when it left a list empty.
  auto mutate = [&](Program& q) {
    auto& a = q.devices[static_cast<std::size_t>(in.integer(0, P - 1))];
    const int n = static_cast<int>(a.size());
    const auto at = static_cast<std::size_t>(in.integer(0, n - 1)), other = static_cast<std::size_t>(in.integer(0, n - 1));
    switch (in.integer(0, kMutations - 1)) {
      case kSwapNeighbours:
        if (at + 1 < a.size()) std::swap(a[at], a[at + 1]);
        break;
      case kSwapAny:
        std::swap(a[at], a[other]);
        break;
      case kReplace:
        a[at] = any_action(in, q.shape);
        break;
      case kDelete:
        a.erase(a.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      case kDuplicate:
        a.insert(a.begin() + static_cast<std::ptrdiff_t>(at), a[other]);
        break;
      case kSwapDevices:
        std::swap(a, q.devices[static_cast<std::size_t>(in.integer(0, P - 1))]);
        break;
      case kTogglePair:  // an overlapped pair made or undone, well formed or not
        a[at].overlaps_next = !a[at].overlaps_next;
        break;
    }
    return !a.empty();
  };
  const int mutations = in.integer(0, 4);
  for (int i = 0; i < mutations; ++i)
    if (!mutate(p)) break;
  // Gradient reductions placed in a program that verifies, then at most one more
  // mutation (read last, so that older inputs decode as they did).
  if (in.flag() && verify(p)) {
    p = with_grad_reduce(p);
    if (in.flag()) {
      mutate(p);
      p.shape.kind = ScheduleKind::kCustom;
    }
  }
  if (mutations > 0) p.shape.kind = ScheduleKind::kCustom;
  return p;
}

LoweredProgram hand_made_steps(pf::Input& in) {
  LoweredProgram lp{any_shape(in, 4, 2, 4), {}};
  const ScheduleShape& s = lp.shape;
  lp.devices.resize(static_cast<std::size_t>(in.integer(std::max(0, s.devices - 1), s.devices + 1)));
  for (auto& steps : lp.devices) {
    const int n = in.integer(0, 2 * s.actions_per_device() + 1);
    for (int k = 0; k < n; ++k) {
      StepSpec step;
      const int ops = in.integer(0, 3);
      for (int i = 0; i < ops; ++i) {
        P2POp op;
        op.kind = in.flag() ? OpKind::kRecv : OpKind::kSend;
        op.peer = in.integer(-1, s.devices);
        op.tensor.kind = in.flag() ? TensorKind::kGradient : TensorKind::kActivation;
        op.tensor.stage = in.integer(-1, s.stages());
        op.tensor.micro_batch = in.integer(-1, s.micro_batches);
        step.ops.push_back(op);
      }
      step.has_compute = in.flag();
      if (step.has_compute) step.compute = any_action(in, s);
      steps.push_back(step);
    }
  }
  return lp;
}

void check_finite(const Trace& t) {
  const double m = makespan(t);
  if (!pf::finite(m)) pf::finding("an accepted program simulates to a makespan that is not finite");
}

void check(pf::Input& in) {
  const int form = in.integer(0, kForms - 1);
  if (form == kHandMadeSteps) {
    const LoweredProgram lp = hand_made_steps(in);
    const VerifyResult r = verify(lp);
    if (!r) return pf::refused_by_simulate(lp, r);
    check_finite(simulate(lp));
    return;
  }
  const Program p = form == kAnyProgram ? any_program(in) : mutated_schedule(in);
  const VerifyResult r = verify(p);
  if (!r) return pf::refused_by_simulate(p, r);
  const LoweredProgram lp = lower(p);
  if (const VerifyResult lr = verify(lp); !lr) pf::finding("a verified program lowers to steps verify() rejects: " + lr.what());
  check_finite(simulate(p));
  check_finite(simulate(p, CostModel{}.with_replay(ReplayMode::kDataflow)));
}

}  // namespace

// Every generated kind unmutated and with a swap, and a lowered 1F1B of 2 devices.
pf::Seeds fuzz_seeds() {
  pf::Seeds seeds;
  for (int kind = 0; kind < pf::kKinds; ++kind)
    for (int mutations = 0; mutations <= 1; ++mutations) {
      const auto k = static_cast<ScheduleKind>(kind);
      pf::Output out;
      out.integer(kMutatedSchedule, 0, kForms - 1);
      out.integer(kind, 0, pf::kKinds - 1);
      out.integer(2, 1, 5);                                                  // P
      if (!two_chunks(k) && default_chunks(k) > 1) out.integer(2, 1, 3);  // V
      if (k == ScheduleKind::kDualPipeV) out.integer(0, 0, 2);            // M = 2P
      else if (needs_multiple_of_devices(k)) out.integer(1, 1, 2);        // M = P
      else out.integer(2, 1, 6);                                          // M
      out.integer(mutations, 0, 4);
      if (mutations) {
        out.integer(1, 0, 1);
        out.integer(2, 0, 7);
        out.integer(3, 0, 7);
        out.integer(kSwapNeighbours, 0, kMutations - 1);
      }
      seeds.push_back(out.bytes());
    }
  const LoweredProgram lp = lower(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2));
  pf::Output out;
  out.integer(kHandMadeSteps, 0, kForms - 1);
  out.integer(static_cast<int>(lp.shape.kind), 0, 3);
  out.integer(2, 1, 4);
  out.integer(1, 1, 2);
  out.integer(2, 1, 4);
  out.integer(2, 1, 3);  // device lists
  for (const auto& steps : lp.devices) {
    out.integer(static_cast<int>(steps.size()), 0, 2 * lp.shape.actions_per_device() + 1);
    for (const Step& step : steps) {
      out.integer(static_cast<int>(step.ops.size()), 0, 3);
      for (const P2POp& op : step.ops) {
        out.flag(op.kind == OpKind::kRecv);
        out.integer(op.peer, -1, 2);
        out.flag(op.tensor.kind == TensorKind::kGradient);
        out.integer(op.tensor.stage, -1, 2);
        out.integer(op.tensor.micro_batch, -1, 2);
      }
      out.flag(step.has_compute);
      if (step.has_compute) {
        out.flag(step.compute.phase == Phase::kBackward);
        out.integer(step.compute.chunk, -1, 1);
        out.integer(step.compute.micro_batch, -1, 2);
      }
    }
  }
  seeds.push_back(out.bytes());
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return pf::test_one(data, size, check);
}
