#pragma once
/// \file
/// The vocabulary of schedules: phases, actions, schedule kinds, placements and
/// shapes, and the Program (every device's ordered actions).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The kind of an action: a forward, a full backward, or one of the two halves
/// of a split backward (the zero-bubble schedules): I, the gradient with
/// respect to the chunk's input (what the previous stage waits for), and W, the
/// gradient with respect to its parameters (what nobody waits for). A full
/// backward B is I then W in one action.
enum class Phase : unsigned char { kForward, kBackward, kBackwardInput, kBackwardWeight };

/// Number of phases: tables indexed by (phase, stage) have kPhases * P * V rows.
inline constexpr int kPhases = 4;

/// The letter of a phase in tokens and in PyTorch's notation: F, B, I or W.
constexpr char phase_letter(Phase phase) {
  switch (phase) {
    case Phase::kForward: return 'F';
    case Phase::kBackward: return 'B';
    case Phase::kBackwardInput: return 'I';
    case Phase::kBackwardWeight: return 'W';
  }
  return '?';
}

/// True for the phases that compute an input gradient (B and I).
constexpr bool makes_input_gradient(Phase phase) {
  return phase == Phase::kBackward || phase == Phase::kBackwardInput;
}

/// Number of results of one (stage, micro-batch): its activation (made by F),
/// its input gradient (made by B or I) and its weight gradient (made by B or W).
/// The flat tables of the verifier, the lowering and the simulator have one
/// entry per result: kResults * P * V * M (see ScheduleShape::action_index).
inline constexpr int kResults = 3;

/// The result an action of `phase` is known by: 0 activation (F), 1 input
/// gradient (B, I), 2 weight gradient (W). B makes the weight gradient too, but
/// what other actions wait for is its input gradient.
constexpr int result_of(Phase phase) {
  return phase == Phase::kForward ? 0 : phase == Phase::kBackwardWeight ? 2 : 1;
}

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

/// Which generator made a program; kCustom for hand-written or imported ones.
enum class ScheduleKind : unsigned char {
  kGPipe,
  kOneFOneB,
  kInterleaved1F1B,
  kLoopedBFS,
  kZeroBubbleH1,
  kInterleavedZeroBubble,
  kZeroBubbleV,
  kDualPipeV,
  kCustom,
};

/// Name used on the command line and in output: "gpipe", "1f1b", "interleaved",
/// "looped-bfs", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "custom".
constexpr std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved";
    case ScheduleKind::kLoopedBFS: return "looped-bfs";
    case ScheduleKind::kZeroBubbleH1: return "zb-h1";
    case ScheduleKind::kInterleavedZeroBubble: return "interleaved-zb";
    case ScheduleKind::kZeroBubbleV: return "zb-v";
    case ScheduleKind::kDualPipeV: return "dualpipe-v";
    case ScheduleKind::kCustom: return "custom";
  }
  return "unknown";
}

/// The generated kind that schedule_name() calls `name` (every kind before
/// kCustom); nothing for any other name.
constexpr std::optional<ScheduleKind> parse_schedule(std::string_view name) {
  for (int k = 0; k < static_cast<int>(ScheduleKind::kCustom); ++k)
    if (schedule_name(static_cast<ScheduleKind>(k)) == name) return static_cast<ScheduleKind>(k);
  return std::nullopt;
}

/// True for the kinds whose backwards are split into I and W (the zero-bubble
/// family; DualPipeV splits those of its tail).
constexpr bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleH1 || kind == ScheduleKind::kInterleavedZeroBubble ||
         kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV;
}

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

/// The placement a generated kind uses: kV for ZB-V and DualPipeV, kLoop for every other.
constexpr Placement placement_of(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleV || kind == ScheduleKind::kDualPipeV ? Placement::kV : Placement::kLoop;
}

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
  constexpr int actions_per_device() const { return (splits_backward(kind) ? 3 : 2) * chunks * micro_batches; }
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

/// Every device's ordered compute actions: `devices[d][k]` is device d's k-th action.
struct Program {
  ScheduleShape shape;
  std::vector<std::vector<Action>> devices;

  friend constexpr bool operator==(const Program&, const Program&) = default;
};

/// Appends an action token, `<kind><chunk>.<micro-batch>` with kind F, B, I or W.
constexpr Text& append_token(Text& t, const Action& a) {
  const char letter[1] = {phase_letter(a.phase)};
  t.append(std::string_view(letter, 1)).append(a.chunk).append(".").append(a.micro_batch);
  return t;
}

/// The token of an action as a string, e.g. "F1.3".
inline std::string to_string(const Action& a) {
  Text t;
  append_token(t, a);
  return t.str();
}

/// Appends the token of the compute step that starts at row[k] of a device's n
/// actions, and returns how many actions it holds: "F1.3" (1), or an
/// overlapped pair "(F0.6;B1.0)" (2).
constexpr int append_step_token(Text& t, const Action* row, int k, int n) {
  if (!row[k].overlaps_next || k + 1 >= n) {
    append_token(t, row[k]);
    return 1;
  }
  append_token(t << "(", row[k]) << ";";
  append_token(t, row[k + 1]) << ")";
  return 2;
}

/// A device's actions as tokens separated by spaces, a pair as one token
/// "(F0.6;B1.0)".
inline std::string format_tokens(const std::vector<Action>& row) {
  std::string out;
  const int n = static_cast<int>(row.size());
  for (int k = 0; k < n;) {
    Text t;
    k += append_step_token(t, row.data(), k, n);
    out += (out.empty() ? "" : " ") + t.str();
  }
  return out;
}

/// The overlapped pairs of one device's actions: forwards marked overlaps_next
/// with an action after them (append_step_token() makes each one token).
constexpr int pair_count(const std::vector<Action>& row) {
  int pairs = 0;
  for (std::size_t k = 0; k + 1 < row.size(); ++k) pairs += row[k].overlaps_next ? 1 : 0;
  return pairs;
}

/// The overlapped pairs of every device's program.
constexpr int pair_count(const Program& p) {
  int pairs = 0;
  for (const auto& row : p.devices) pairs += pair_count(row);
  return pairs;
}

/// True when some device's program has an overlapped pair.
constexpr bool has_pairs(const Program& p) { return pair_count(p) > 0; }

}  // namespace pipeweave
