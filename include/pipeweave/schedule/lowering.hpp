#pragma once
/// \file
/// P2P lowering: each device's actions become steps, a step being one group of
/// sends and receives followed by at most one compute action. Matching follows
/// NCCL: per directed pair of devices, messages match in FIFO order with no tags,
/// and a group completes only when each of its operations is matched.
///
/// A received tensor may arrive before the action that needs it; the executor
/// keeps it until then. See lower() for the rule that places each operation.

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

/// Lowers a program to steps with P2P groups. The program must hold every action
/// once with valid indices and no dependency cycle (verify() checks that first);
/// otherwise throws Error.
///
/// The lowering replays the program in rounds: in round r each device first runs a
/// group that sends what it computed in round r-1 and receives what its peers
/// send in round r, then runs its next action if its inputs are there. A send and
/// its receive are thus always in the same round, which makes the steps free of
/// deadlock under rendezvous semantics and keeps each directed pair in FIFO order
/// (one send per device per round). A device that has neither an operation nor a
/// compute in a round has no step for it.
constexpr LoweredProgram lower(const Program& p) {
  const ScheduleShape& s = p.shape;
  const auto P = static_cast<std::size_t>(s.devices);
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1 || p.devices.size() != P)
    throw Error("lower: the program's shape does not match its device count");
  for (const auto& actions : p.devices)
    for (const Action& a : actions)
      if (a.chunk < 0 || a.chunk >= s.chunks || a.micro_batch < 0 || a.micro_batch >= s.micro_batches)
        throw Error("lower: an action's chunk or micro-batch is out of range");
  const std::size_t per_phase = static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches);
  // ready[i]: the output of action i (phase, stage, micro-batch) is usable by its consumer.
  std::vector<char> ready(2 * per_phase, 0);
  auto index = [&](Phase phase, int stage, int m) {
    return static_cast<std::size_t>(phase) * per_phase + static_cast<std::size_t>(stage) * static_cast<std::size_t>(s.micro_batches) + static_cast<std::size_t>(m);
  };
  std::vector<std::size_t> pos(P, 0);
  std::vector<Transfer> outbox(P);  // computed last round, to send this round
  std::size_t remaining = 0;
  for (const auto& actions : p.devices) remaining += actions.size();
  LoweredProgram lp{s, {}};
  lp.devices.resize(P);
  std::vector<Step> round(P);
  while (remaining > 0) {
    bool progress = false;
    for (auto& st : round) st = Step{};
    for (std::size_t d = 0; d < P; ++d) {
      if (!outbox[d].exists) continue;
      const Transfer& out = outbox[d];
      const auto to = static_cast<std::size_t>(s.device_of_stage(out.stage));
      round[d].ops.push_back({OpKind::kSend, static_cast<int>(to), out.tensor});
      round[to].ops.push_back({OpKind::kRecv, static_cast<int>(d), out.tensor});
      const Phase made_by = out.tensor.kind == TensorKind::kActivation ? Phase::kForward : Phase::kBackward;
      ready[index(made_by, out.tensor.stage, out.tensor.micro_batch)] = 1;
      outbox[d] = Transfer{};
      progress = true;
    }
    std::vector<std::size_t> finished;  // actions computed this round become ready next round
    for (std::size_t d = 0; d < P; ++d) {
      if (pos[d] == p.devices[d].size()) continue;
      const Action& a = p.devices[d][pos[d]];
      const int dev = static_cast<int>(d);
      const int stage = s.stage_of(dev, a.chunk);
      bool runnable = true;
      if (a.phase == Phase::kForward) {
        if (stage > 0 && !ready[index(Phase::kForward, stage - 1, a.micro_batch)]) runnable = false;
      } else {
        if (!ready[index(Phase::kForward, stage, a.micro_batch)]) runnable = false;
        if (stage < s.stages() - 1 && !ready[index(Phase::kBackward, stage + 1, a.micro_batch)]) runnable = false;
      }
      if (!runnable) continue;
      round[d].has_compute = true;
      round[d].compute = a;
      ++pos[d];
      --remaining;
      progress = true;
      const Transfer out = output_of(s, dev, a);
      if (out.exists && s.device_of_stage(out.stage) != dev)
        outbox[d] = out;
      else
        finished.push_back(index(a.phase, stage, a.micro_batch));
    }
    for (std::size_t i : finished) ready[i] = 1;
    for (std::size_t d = 0; d < P; ++d)
      if (round[d].has_compute || !round[d].ops.empty()) lp.devices[d].push_back(round[d]);
    if (!progress) throw Error("lower: the program's dependencies form a cycle; verify() says where");
  }
  // Every cross-device output was sent: its consumer could not have run otherwise.
  return lp;
}

}  // namespace pipeweave
