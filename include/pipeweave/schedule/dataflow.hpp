#pragma once
/// \file
/// The data flow of the model: what each action needs and what it makes, read
/// from its phase's row (kPhaseRows, kinds.hpp). The lowering, the verifier and
/// the simulator all ask these functions.
///
/// - `F(s, m)` needs the activation of `F(s-1, m)` (none at stage 0) and makes
///   the activation of stage s, consumed by `F(s+1, m)`;
/// - `B(s, m)` needs `F(s, m)` (on its own device) and the input gradient of
///   stage s+1 (none at the last stage), and makes the input gradient of stage
///   s, consumed by the backward of stage s-1;
/// - `I(s, m)`, the input half of a split backward, needs and makes what
///   `B(s, m)` does (its input gradient is what stage s-1 waits for);
/// - `W(s, m)`, the weight half, needs `I(s, m)` on its own device and makes the
///   weight gradient, which no other action needs.
///
/// The input gradient of stage s+1 comes from its B or its I, whichever the
/// program has: both are known by one result (result_of()).
///
/// Where a stage lives is the shape's business (ScheduleShape::device_of_stage);
/// a result crosses devices exactly when its consumer's stage lives elsewhere.
/// A new kind of action states its flow in its phase's row.

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// What a message carries: a forward activation or a backward gradient.
enum class TensorKind : unsigned char { kActivation, kGradient };

/// A message's identity: its kind, the virtual stage that produced it and its micro-batch.
/// The activation of stage s goes to stage s+1; the gradient of stage s goes to stage s-1.
/// A plain aggregate: `TensorId{}` is the activation of stage 0, micro-batch 0.
struct TensorId {
  TensorKind kind;
  int stage;
  int micro_batch;
  friend constexpr bool operator==(const TensorId&, const TensorId&) = default;
};

/// Appends "activation(stage 3, micro-batch 1)" or "gradient(...)".
constexpr Text& append_tensor(Text& t, const TensorId& x) {
  t << (x.kind == TensorKind::kActivation ? "activation" : "gradient") << "(stage " << x.stage
    << ", micro-batch " << x.micro_batch << ")";
  return t;
}

/// What an action needs and makes, as dense indices (ScheduleShape::action_index()).
/// flow_of() is the one statement of the data-flow rules above; the lowering,
/// the verifier and the simulator all read it, once per action.
struct Flow {
  int self;           ///< action_index() of the action, also tensor_index() of what it makes
  int needs;          ///< how many results it needs (0, 1 or 2)
  int need[2];        ///< their action_index()
  int need_stage[2];  ///< their virtual stages
  int in_stage;       ///< the stage whose tensor it takes; -1 for none (the batch)
  TensorId in;        ///< that tensor
  int out_stage;      ///< the stage that takes what it makes; -1 for none (the loss)
  TensorId out;       ///< that tensor
};

/// The data flow of device d's action `a`, whose chunk and micro-batch are in
/// range, from its phase's row (PhaseFlow): the results it waits for that lie
/// inside the model, and the message it takes and the one it sends.
constexpr Flow flow_of(const ScheduleShape& s, int device, const Action& a) {
  const PhaseRow& row = phase_row(a.phase);
  const int S = s.stages(), M = s.micro_batches, m = a.micro_batch;
  const int stage = s.stage_of(device, a.chunk);
  Flow f{(row.result * S + stage) * M + m, 0, {0, 0}, {0, 0}, -1, {}, -1, {}};
  for (int i = 0; i < row.flow.needs; ++i) {
    const int at = stage + row.flow.need_offset[i];
    if (at < 0 || at >= S) continue;
    f.need[f.needs] = (row.flow.need_result[i] * S + at) * M + m;
    f.need_stage[f.needs++] = at;
  }
  if (row.flow.direction != 0) {
    const TensorKind kind = row.flow.direction > 0 ? TensorKind::kActivation : TensorKind::kGradient;
    const int from = stage - row.flow.direction, to = stage + row.flow.direction;
    if (from >= 0 && from < S) {
      f.in_stage = from;
      f.in = {kind, from, m};
    }
    if (to >= 0 && to < S) {
      f.out_stage = to;
      f.out = {kind, stage, m};
    }
  }
  return f;
}

/// True when device d's backward `b` (B or I) does not need its forward `f`,
/// directly or through other stages: the halves of an overlapped pair must be
/// so. B(s', m') needs F(s, m) exactly when m' = m and s' >= s (directly when
/// s' = s, else through the forwards of stages s+1..s' and the backwards back).
constexpr bool independent_halves(const ScheduleShape& s, int device, const Action& f, const Action& b) {
  return b.micro_batch != f.micro_batch || s.stage_of(device, b.chunk) < s.stage_of(device, f.chunk);
}

/// A tensor an action needs from or gives to another stage.
struct Transfer {
  bool exists = false;  ///< false at the ends of the model (batch input, loss)
  TensorId tensor{};
  int stage = 0;        ///< the other stage: producer of an input, consumer of an output
};

/// The tensor that device d's action needs from another stage before it runs.
constexpr Transfer input_of(const ScheduleShape& s, int device, const Action& a) {
  const Flow f = flow_of(s, device, a);
  return f.in_stage < 0 ? Transfer{} : Transfer{true, f.in, f.in_stage};
}

/// The tensor that device d's action produces for another stage.
constexpr Transfer output_of(const ScheduleShape& s, int device, const Action& a) {
  const Flow f = flow_of(s, device, a);
  return f.out_stage < 0 ? Transfer{} : Transfer{true, f.out, f.out_stage};
}

/// The phase of the action that produces a tensor (B for an input gradient: I
/// makes the same result).
constexpr Phase producer_phase(TensorKind kind) {
  return kind == TensorKind::kActivation ? Phase::kForward : Phase::kBackward;
}

/// Dense index of a tensor: the action_index() of the action that produces it
/// (an activation is result 0, an input gradient result 1).
constexpr int tensor_index(const ScheduleShape& s, const TensorId& x) {
  return (static_cast<int>(x.kind) * s.stages() + x.stage) * s.micro_batches + x.micro_batch;
}

/// The tensor with dense index i < 2 * P * V * M (the inverse of tensor_index()).
constexpr TensorId tensor_at(const ScheduleShape& s, int i) {
  const int per_result = s.stages() * s.micro_batches;
  return {static_cast<TensorKind>(i / per_result), (i % per_result) / s.micro_batches, i % s.micro_batches};
}

/// The action with dense index i (the inverse of action_index()), as device
/// device_of_stage() holds it: F, B (an input gradient, which a program may make
/// with I instead) or W.
constexpr Action action_at(const ScheduleShape& s, int i) {
  const int per_result = s.stages() * s.micro_batches, result = i / per_result;
  Phase phase = Phase::kForward;  // the first phase known by that result: F, B or W
  for (const PhaseRow& row : kPhaseRows)
    if (row.result == result) {
      phase = row.phase;
      break;
    }
  return {phase, s.chunk_of_stage((i % per_result) / s.micro_batches), i % s.micro_batches};
}

/// The stage that consumes a tensor: s+1 for an activation, s-1 for a gradient.
constexpr int consumer_stage(const TensorId& x) {
  return x.kind == TensorKind::kActivation ? x.stage + 1 : x.stage - 1;
}

namespace detail {

/// The shape's placement as a table: device_of_stage() evaluated once per
/// virtual stage, so that the loops over every action and operation look the
/// device up instead of dividing.
class StageDevices {
 public:
  constexpr explicit StageDevices(const ScheduleShape& s) : device_(s.stages()) {
    for (int st = 0; st < s.stages(); ++st) device_[st] = s.device_of_stage(st);
  }
  /// The device of virtual stage `stage` (0 <= stage < P * V).
  constexpr int operator[](int stage) const { return device_[stage]; }
  /// The table, for loops that index it directly.
  constexpr const int* data() const { return device_.data(); }

 private:
  Buffer<int> device_;
};

/// flow_of() of every (phase, chunk, device), at micro-batch 0, with the
/// devices of the stages it names. An action's flow is its row with every
/// index shifted by its micro-batch (action_index() is row * M + micro-batch).
/// The loops over every action read a row instead of calling flow_of(), which
/// costs about 230 operations of GCC's constant-evaluation budget per call, a
/// row read about 40.
struct FlowRow {
  int stage;
  int self;            ///< action_index() at micro-batch 0
  int needs;
  int need[2];         ///< action_index() at micro-batch 0
  int need_device[2];
  int in_stage;        ///< -1: none
  int in_device;
  int in;              ///< tensor_index() of the input at micro-batch 0
  int out_stage;       ///< -1: none
  int out_device;
  TensorKind in_kind;
  TensorKind out_kind;
};

/// The rows of FlowRow, indexed by what an action holds: (phase * V + chunk) *
/// P + device, so that no loop maps a (device, chunk) to its stage (with the
/// loop placement the index is phase * P * V + stage).
class FlowTable {
 public:
  constexpr explicit FlowTable(const ScheduleShape& s) : rows_(kPhases * s.stages()) {
    for (int ph = 0; ph < kPhases; ++ph) {
      for (int c = 0; c < s.chunks; ++c) {
        for (int d = 0; d < s.devices; ++d) {
          const Flow f = flow_of(s, d, Action{static_cast<Phase>(ph), c, 0});
          FlowRow& r = rows_[index(s, static_cast<Phase>(ph), c, d)];
          r = {s.stage_of(d, c), f.self, f.needs, {f.need[0], f.need[1]}, {0, 0}, f.in_stage, 0, 0, f.out_stage, 0,
               f.in.kind, f.out.kind};
          for (int j = 0; j < f.needs; ++j) r.need_device[j] = s.device_of_stage(f.need_stage[j]);
          if (f.in_stage >= 0) {
            r.in_device = s.device_of_stage(f.in_stage);
            r.in = tensor_index(s, f.in);
          }
          if (f.out_stage >= 0) r.out_device = s.device_of_stage(f.out_stage);
        }
      }
    }
  }
  /// The row of device d's action of `phase` on its chunk c.
  static constexpr int index(const ScheduleShape& s, Phase phase, int chunk, int device) {
    return (static_cast<int>(phase) * s.chunks + chunk) * s.devices + device;
  }
  /// The rows, indexed by index().
  constexpr const FlowRow* data() const { return rows_.data(); }

 private:
  Buffer<FlowRow> rows_;
};

}  // namespace detail

}  // namespace pipeweave
