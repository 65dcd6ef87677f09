#pragma once
/// \file
/// The vocabulary of schedules: the kinds of schedules, the placements of
/// stages, the periods of a program, an Action, a ScheduleShape and a Program
/// (with the reference clock its steps are planned on). The phases and their
/// table are in phases.hpp, the table of schedule kinds in kinds.hpp.
///
/// \code
/// static_assert(pipeweave::fwd(1, 3) == pipeweave::Action{pipeweave::Phase::kForward, 1, 3});
/// static_assert(pipeweave::ScheduleShape{pipeweave::ScheduleKind::kCustom, 4, 2, 8}.stage_of(1, 1) == 5);
/// \endcode

#include <optional>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/costs.hpp"
#include "pipeweave/schedule/phases.hpp"

namespace pipeweave {

/// Which generator made a program; kAuto for one synthesized for measured
/// costs (pipeweave::synthesize(), in the analysis layer), kCustom for
/// hand-written or imported ones.
/// One row of kKindRows each, in this order.
enum class ScheduleKind : unsigned char {
  kGPipe,
  kOneFOneB,
  kInterleaved1F1B,
  kLoopedBFS,
  kZeroBubbleH1,
  kInterleavedZeroBubble,
  kZeroBubbleV,
  kDualPipeV,
  kAuto,
  kCustom,
};

/// Number of schedule kinds, kCustom included.
inline constexpr int kScheduleKinds = static_cast<int>(ScheduleKind::kCustom) + 1;

/// Which device holds each virtual stage.
/// - kLoop: stage s on device s mod P, as its chunk s / P (GPipe, 1F1B, the
///   interleaved and looped schedules);
/// - kV: down the devices and back up: stages 0..P-1 on devices 0..P-1, stages
///   P..2P-1 on devices P-1..0, and so on (PyTorch's
///   `generate_stage_to_rank_mapping(style="v")`); stage s is still chunk s / P
///   of its device. Consecutive stages P-1 and P (and every turn) sit on one
///   device and hand over without a message.
enum class Placement : unsigned char { kLoop, kV };

/// "loop" or "v".
constexpr std::string_view placement_name(Placement placement) {
  return placement == Placement::kLoop ? "loop" : "v";
}

/// The placement placement_name() calls `name`; none for any other name.
constexpr std::optional<Placement> parse_placement(std::string_view name) {
  for (const Placement p : {Placement::kLoop, Placement::kV})
    if (placement_name(p) == name) return p;
  return std::nullopt;
}

/// Where an action falls in a device's program: the warm-up forwards, the
/// steady period (each forward with a backward), and the cool-down.
enum class Period : unsigned char { kWarmUp, kSteady, kCoolDown };

/// One compute action on a device. `chunk` is local to the device (0..V-1);
/// the model-order position is the virtual stage ScheduleShape::stage_of(device,
/// chunk). A plain aggregate (so that tables of them cost nothing to allocate in
/// a constant expression): `Action{}` is F0.0.
///
/// An overlapped pair is two actions of one device that start together and
/// end when both have ended: a forward, marked `overlaps_next`, and the action
/// right after it in the device's program, a backward (B or I) independent of
/// it. A program stays one flat list of actions per device, its pairs marked in
/// place; a lowered program likewise has the pair's forward in one step (with
/// the pair's group) and its backward in the next step, which has no group.
struct Action {
  Phase phase;
  int chunk;
  int micro_batch;
  bool overlaps_next = false;  ///< a forward that runs at once with the next action of its device

  /// This action as the forward of an overlapped pair: `fwd(0, 6).paired()`, then the backward.
  constexpr Action paired() const { return {phase, chunk, micro_batch, true}; }
  /// This action alone (the flag cleared).
  constexpr Action single() const { return {phase, chunk, micro_batch, false}; }

  friend constexpr bool operator==(const Action&, const Action&) = default;
};

/// Shorthand constructors, handy in hand-written programs and tests.
constexpr Action fwd(int chunk, int micro_batch) { return {Phase::kForward, chunk, micro_batch}; }
constexpr Action bwd(int chunk, int micro_batch) { return {Phase::kBackward, chunk, micro_batch}; }
constexpr Action bwd_input(int chunk, int micro_batch) { return {Phase::kBackwardInput, chunk, micro_batch}; }
constexpr Action bwd_weight(int chunk, int micro_batch) { return {Phase::kBackwardWeight, chunk, micro_batch}; }
/// The gradient all-reduce of a chunk (R); its micro-batch is 0 (`reduce_grad(c, 0)` is the same).
constexpr Action reduce_grad(int chunk, int micro_batch = 0) { return {Phase::kReduce, chunk, micro_batch}; }

/// The parameters of a schedule: devices P, chunks per device V, micro-batches
/// M, and where the stages sit.
struct ScheduleShape {
  ScheduleKind kind = ScheduleKind::kCustom;
  int devices = 1;
  int chunks = 1;
  int micro_batches = 1;
  Placement placement = Placement::kLoop;

  /// Number of virtual stages, P * V.
  constexpr int stages() const { return devices * chunks; }
  /// Number of compute actions on each device of a generated schedule: 3 * V * M
  /// when its backwards are split (F, I, W), else 2 * V * M. For DualPipeV,
  /// whose backwards are some B and some I and W, the most a device can have.
  /// Which kinds split is said in their rows: defined with the table (kinds.hpp).
  constexpr int actions_per_device() const;
  /// Virtual stage of a device's chunk: c * P + d (loop), or c * P + P-1-d for
  /// an odd chunk of the v placement.
  constexpr int stage_of(int device, int chunk) const {
    return chunk * devices + (placement == Placement::kV && chunk % 2 == 1 ? devices - 1 - device : device);
  }
  /// Device that holds virtual stage s.
  constexpr int device_of_stage(int stage) const {
    const int d = stage % devices;
    return placement == Placement::kV && (stage / devices) % 2 == 1 ? devices - 1 - d : d;
  }
  /// Local chunk index of virtual stage s on its device.
  constexpr int chunk_of_stage(int stage) const { return stage / devices; }
  /// Number of results of all (stage, micro-batch) pairs, kResults * P * V * M.
  constexpr int action_count() const { return kResults * stages() * micro_batches; }
  /// Dense index of the result of an action of `phase` at (virtual stage,
  /// micro-batch), in 0 .. action_count() - 1 (see result_of(): B and I share
  /// one): the key of every flat per-action table (verifier, lowering, simulator).
  constexpr int action_index(Phase phase, int stage, int micro_batch) const {
    return (result_of(phase) * stages() + stage) * micro_batches + micro_batch;
  }

  friend constexpr bool operator==(const ScheduleShape&, const ScheduleShape&) = default;
};

/// Every device's ordered compute actions: `devices[d][k]` is device d's k-th
/// action; and the reference clock its steps are planned on. The sends and
/// receives are placed where that clock's run of the program needs them; under
/// rendezvous a send waits for its receiver, so a clock whose ratios are the
/// real ones' keeps the steps from waiting (a synthesized program plans on its
/// costs; every generated one on the defaults).
struct Program {
  ScheduleShape shape;
  std::vector<std::vector<Action>> devices;
  LoweringCosts lowering{};  ///< the reference clock of every stage...
  /// ...unless this holds one per virtual stage (ScheduleShape::stages()), for
  /// stages whose costs differ (a slower last stage); empty: `lowering` for all.
  std::vector<LoweringCosts> stage_lowering{};

  friend constexpr bool operator==(const Program&, const Program&) = default;
};

/// How many actions of `phase` a program has, on all its devices.
constexpr int count_actions(const Program& p, Phase phase) {
  int n = 0;
  for (const auto& row : p.devices)
    for (const Action& a : row) n += a.phase == phase ? 1 : 0;
  return n;
}

}  // namespace pipeweave
