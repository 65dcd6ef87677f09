#pragma once
/// \file
/// P2P lowering: each device's actions become steps, a step being one group of
/// sends and receives followed by at most one compute action. Matching follows
/// NCCL: per directed pair of devices, messages match in FIFO order with no tags,
/// and a group completes only when each of its operations is matched.
///
/// lower() places every send and its receive at one instant of a planned timeline;
/// see there for the rule and why it cannot deadlock.

#include <cstddef>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// What a message carries: a forward activation or a backward gradient.
enum class TensorKind : unsigned char { kActivation, kGradient };

/// A message's identity: its kind, the virtual stage that produced it and its micro-batch.
/// The activation of stage s goes to stage s+1; the gradient of stage s goes to stage s-1.
struct TensorId {
  TensorKind kind = TensorKind::kActivation;
  int stage = 0;
  int micro_batch = 0;
  friend constexpr bool operator==(const TensorId&, const TensorId&) = default;
};

/// Send or receive.
enum class OpKind : unsigned char { kSend, kRecv };

/// One point-to-point operation of a group.
struct P2POp {
  OpKind kind = OpKind::kSend;
  int peer = 0;
  TensorId tensor{};
  friend constexpr bool operator==(const P2POp&, const P2POp&) = default;
};

/// One step: the group `ops` completes first, then `compute` runs if `has_compute`.
struct Step {
  std::vector<P2POp> ops;
  bool has_compute = false;
  Action compute{};
  friend constexpr bool operator==(const Step&, const Step&) = default;
};

/// Every device's steps.
struct LoweredProgram {
  ScheduleShape shape;
  std::vector<std::vector<Step>> devices;
  friend constexpr bool operator==(const LoweredProgram&, const LoweredProgram&) = default;
};

/// Appends "activation(stage 3, micro-batch 1)" or "gradient(...)".
constexpr Text& append_tensor(Text& t, const TensorId& x) {
  t << (x.kind == TensorKind::kActivation ? "activation" : "gradient") << "(stage " << x.stage
    << ", micro-batch " << x.micro_batch << ")";
  return t;
}

/// A tensor an action needs from or gives to another stage.
struct Transfer {
  bool exists = false;  ///< false at the ends of the model (batch input, loss)
  TensorId tensor{};
  int stage = 0;        ///< the other stage: producer of an input, consumer of an output
};

/// The tensor that device d's action needs from another stage before it runs.
constexpr Transfer input_of(const ScheduleShape& s, int device, const Action& a) {
  const int stage = s.stage_of(device, a.chunk);
  if (a.phase == Phase::kForward) {
    if (stage == 0) return {};
    return {true, {TensorKind::kActivation, stage - 1, a.micro_batch}, stage - 1};
  }
  if (stage == s.stages() - 1) return {};
  return {true, {TensorKind::kGradient, stage + 1, a.micro_batch}, stage + 1};
}

/// The tensor that device d's action produces for another stage.
constexpr Transfer output_of(const ScheduleShape& s, int device, const Action& a) {
  const int stage = s.stage_of(device, a.chunk);
  if (a.phase == Phase::kForward) {
    if (stage == s.stages() - 1) return {};
    return {true, {TensorKind::kActivation, stage, a.micro_batch}, stage + 1};
  }
  if (stage == 0) return {};
  return {true, {TensorKind::kGradient, stage, a.micro_batch}, stage - 1};
}

/// Dense index of a tensor, for lookup tables: kind, stage, micro-batch.
constexpr std::size_t tensor_index(const ScheduleShape& s, const TensorId& x) {
  return (static_cast<std::size_t>(x.kind) * static_cast<std::size_t>(s.stages()) +
          static_cast<std::size_t>(x.stage)) *
             static_cast<std::size_t>(s.micro_batches) +
         static_cast<std::size_t>(x.micro_batch);
}

/// Reference costs the lowering plans with: integer durations of a forward and a
/// backward of one chunk. The default, backward = 2 x forward, is the usual ratio
/// for a layer (a backward computes both input and weight gradients).
struct LoweringCosts {
  long long forward = 1;
  long long backward = 2;
};

/// Lowers a program to steps with P2P groups. The program must hold every action
/// once with valid indices and no dependency cycle (verify() checks that first);
/// otherwise throws Error.
///
/// The lowering runs the program on a reference clock (durations from `costs`,
/// free communication) and writes down what happens:
/// - a device starts its next action as soon as it is free and the action's
///   inputs have arrived;
/// - a message is delivered at the first instant, from its production on, at
///   which neither its sender nor its receiver is in the middle of an action; all
///   messages waiting on a pair then move together, oldest first;
/// - a device's steps are, in clock order, its actions and one group per instant
///   at which it delivers or receives; an action that starts at such an instant
///   shares the step of its group.
///
/// A send and its receive thus share one instant, and every device runs its groups
/// in instant order, so the steps cannot deadlock under rendezvous semantics and
/// each directed pair stays in FIFO order (with P = 2 too, where both neighbours
/// are one device). Replaying the steps with the same costs gives back the same
/// clock, no stall added; for GPipe, 1F1B and interleaved 1F1B with the default
/// costs that clock meets the closed-form bubble. A tensor may arrive before the
/// action that needs it; the executor keeps it until then.
constexpr LoweredProgram lower(const Program& p, const LoweringCosts& costs = {}) {
  const ScheduleShape& s = p.shape;
  const auto P = static_cast<std::size_t>(s.devices);
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1 || p.devices.size() != P)
    throw Error("lower: the program's shape does not match its device count");
  if (costs.forward < 1 || costs.backward < 1) throw Error("lower: reference costs must be at least 1");
  for (const auto& actions : p.devices)
    for (const Action& a : actions)
      if (a.chunk < 0 || a.chunk >= s.chunks || a.micro_batch < 0 || a.micro_batch >= s.micro_batches)
        throw Error("lower: an action's chunk or micro-batch is out of range");
  const std::size_t per_phase = static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches);
  auto index = [&](Phase phase, int stage, int m) {
    return static_cast<std::size_t>(phase) * per_phase +
           static_cast<std::size_t>(stage) * static_cast<std::size_t>(s.micro_batches) + static_cast<std::size_t>(m);
  };
  // available[i]: the result of action i is where its consumer needs it (its own
  // device, or delivered there).
  std::vector<char> available(2 * per_phase, 0);
  std::vector<std::size_t> next(P, 0);      // next action of each device
  std::vector<long long> busy_until(P, 0);  // end of the running action
  std::vector<char> running(P, 0);
  // Messages waiting for delivery, per directed pair [from * P + to]. A device
  // only talks to its two neighbours (one when P = 2).
  std::vector<std::vector<TensorId>> waiting(P * P);
  std::vector<std::size_t> last_instant_step(P, 0);
  std::vector<long long> last_instant(P, -1);  // instant of each device's last step if it holds a group
  LoweredProgram lp{s, {}};
  lp.devices.resize(P);
  for (std::size_t d = 0; d < P; ++d) lp.devices[d].reserve(2 * p.devices[d].size());
  auto group_at = [&](std::size_t d, long long now) -> std::vector<P2POp>& {
    auto& steps = lp.devices[d];
    if (last_instant[d] != now) {
      steps.emplace_back();
      last_instant[d] = now;
      last_instant_step[d] = steps.size() - 1;
    }
    return steps[last_instant_step[d]].ops;
  };
  std::size_t remaining = 0;
  for (const auto& actions : p.devices) remaining += actions.size();
  long long now = 0;
  for (;;) {
    // 1. Actions ending now: their results become available or wait for delivery.
    for (std::size_t d = 0; d < P; ++d) {
      if (!running[d] || busy_until[d] != now) continue;
      running[d] = 0;
      --remaining;
      const int dev = static_cast<int>(d);
      const Action& a = p.devices[d][next[d] - 1];
      const Transfer out = output_of(s, dev, a);
      const std::size_t made = index(a.phase, s.stage_of(dev, a.chunk), a.micro_batch);
      if (out.exists && s.device_of_stage(out.stage) != dev)
        waiting[d * P + static_cast<std::size_t>(s.device_of_stage(out.stage))].push_back(out.tensor);
      else
        available[made] = 1;
    }
    if (remaining == 0) break;
    // 2. Deliveries between devices that are both between actions.
    for (std::size_t from = 0; from < P; ++from) {
      if (running[from]) continue;
      const std::size_t peers[2] = {(from + 1) % P, (from + P - 1) % P};
      for (int i = 0; i < (peers[0] == peers[1] ? 1 : 2); ++i) {
        const std::size_t to = peers[i];
        auto& queue = waiting[from * P + to];
        if (queue.empty() || running[to]) continue;
        auto& sends = group_at(from, now);
        auto& recvs = group_at(to, now);
        for (const TensorId& x : queue) {
          sends.push_back({OpKind::kSend, static_cast<int>(to), x});
          recvs.push_back({OpKind::kRecv, static_cast<int>(from), x});
          const Phase made_by = x.kind == TensorKind::kActivation ? Phase::kForward : Phase::kBackward;
          available[index(made_by, x.stage, x.micro_batch)] = 1;
        }
        queue.clear();
      }
    }
    // 3. Starts: each free device runs its next action if its inputs are there.
    for (std::size_t d = 0; d < P; ++d) {
      if (running[d] || next[d] == p.devices[d].size()) continue;
      const Action& a = p.devices[d][next[d]];
      const int stage = s.stage_of(static_cast<int>(d), a.chunk);
      bool ready = true;
      if (a.phase == Phase::kForward) {
        ready = stage == 0 || available[index(Phase::kForward, stage - 1, a.micro_batch)];
      } else {
        ready = available[index(Phase::kForward, stage, a.micro_batch)] &&
                (stage == s.stages() - 1 || available[index(Phase::kBackward, stage + 1, a.micro_batch)]);
      }
      if (!ready) continue;
      auto& steps = lp.devices[d];
      if (last_instant[d] != now) steps.emplace_back();
      last_instant[d] = -1;  // this step now holds an action; later groups get steps of their own
      steps.back().has_compute = true;
      steps.back().compute = a;
      ++next[d];
      running[d] = 1;
      busy_until[d] = now + (a.phase == Phase::kForward ? costs.forward : costs.backward);
    }
    // 4. The next instant: the earliest end of a running action.
    long long soonest = -1;
    for (std::size_t d = 0; d < P; ++d)
      if (running[d] && (soonest < 0 || busy_until[d] < soonest)) soonest = busy_until[d];
    if (soonest < 0) throw Error("lower: the program's dependencies form a cycle; verify() says where");
    now = soonest;
  }
  return lp;
}

namespace detail {

/// Where an operation sits in a lowered program: its step and its index in the group.
struct PostedOp {
  int step = 0;
  std::size_t op = 0;
};

/// The sends and the receives of a lowered program per directed pair
/// [from * P + to], each in posting order: the k-th send of a pair matches its
/// k-th receive (NCCL's FIFO rule). Peers must be valid device indices.
struct PairQueues {
  std::vector<std::vector<PostedOp>> sends;
  std::vector<std::vector<PostedOp>> recvs;
};

constexpr PairQueues pair_queues(const LoweredProgram& lp) {
  const auto P = static_cast<std::size_t>(lp.shape.devices);
  PairQueues q{std::vector<std::vector<PostedOp>>(P * P), std::vector<std::vector<PostedOp>>(P * P)};
  for (std::size_t d = 0; d < P; ++d) {
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) {
      const auto& ops = lp.devices[d][t].ops;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const auto peer = static_cast<std::size_t>(ops[i].peer);
        if (ops[i].kind == OpKind::kSend)
          q.sends[d * P + peer].push_back({static_cast<int>(t), i});
        else
          q.recvs[peer * P + d].push_back({static_cast<int>(t), i});
      }
    }
  }
  return q;
}

}  // namespace detail

}  // namespace pipeweave
