#pragma once
/// \file
/// The vocabulary of schedules: phases, actions, schedule kinds and shapes, and
/// the Program (every device's ordered actions).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Forward or backward pass of one (chunk, micro-batch).
enum class Phase : unsigned char { kForward, kBackward };

/// Number of phases: the flat tables indexed by (phase, stage, micro-batch) have
/// kPhases * stages * micro-batches entries (see ScheduleShape::action_index).
inline constexpr int kPhases = 2;

/// One compute action on a device. `chunk` is local to the device (0..V-1);
/// the model-order position is the virtual stage `chunk * devices + device`.
/// A plain aggregate (so that tables of them cost nothing to allocate in a
/// constant expression): `Action{}` is F0.0.
struct Action {
  Phase phase;
  int chunk;
  int micro_batch;

  friend constexpr bool operator==(const Action&, const Action&) = default;
};

/// Shorthand constructors, handy in hand-written programs and tests.
constexpr Action fwd(int chunk, int micro_batch) { return {Phase::kForward, chunk, micro_batch}; }
constexpr Action bwd(int chunk, int micro_batch) { return {Phase::kBackward, chunk, micro_batch}; }

/// Which generator made a program; kCustom for hand-written or imported ones.
enum class ScheduleKind : unsigned char { kGPipe, kOneFOneB, kInterleaved1F1B, kCustom };

/// Name used on the command line and in output: "gpipe", "1f1b", "interleaved", "custom".
constexpr std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved";
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

/// The parameters of a schedule: devices P, chunks per device V, micro-batches M.
struct ScheduleShape {
  ScheduleKind kind = ScheduleKind::kCustom;
  int devices = 1;
  int chunks = 1;
  int micro_batches = 1;

  /// Number of virtual stages, P * V.
  constexpr int stages() const { return devices * chunks; }
  /// Number of compute actions on each device, 2 * V * M.
  constexpr int actions_per_device() const { return 2 * chunks * micro_batches; }
  /// Virtual stage of a device's chunk: s = c * P + d.
  constexpr int stage_of(int device, int chunk) const { return chunk * devices + device; }
  /// Device that holds virtual stage s.
  constexpr int device_of_stage(int stage) const { return stage % devices; }
  /// Local chunk index of virtual stage s on its device.
  constexpr int chunk_of_stage(int stage) const { return stage / devices; }
  /// Number of (phase, virtual stage, micro-batch) triples, kPhases * P * V * M.
  constexpr int action_count() const { return kPhases * stages() * micro_batches; }
  /// Dense index of (phase, virtual stage, micro-batch) in 0 .. action_count() - 1:
  /// the key of every flat per-action table (verifier, lowering, simulator).
  constexpr int action_index(Phase phase, int stage, int micro_batch) const {
    return (static_cast<int>(phase) * stages() + stage) * micro_batches + micro_batch;
  }

  friend constexpr bool operator==(const ScheduleShape&, const ScheduleShape&) = default;
};

/// Every device's ordered compute actions: `devices[d][k]` is device d's k-th action.
struct Program {
  ScheduleShape shape;
  std::vector<std::vector<Action>> devices;

  friend constexpr bool operator==(const Program&, const Program&) = default;
};

/// Appends an action token, `F<chunk>.<micro-batch>` or `B<chunk>.<micro-batch>`.
constexpr Text& append_token(Text& t, const Action& a) {
  t.append(a.phase == Phase::kForward ? "F" : "B").append(a.chunk).append(".").append(a.micro_batch);
  return t;
}

/// The token of an action as a string, e.g. "F1.3".
inline std::string to_string(const Action& a) {
  Text t;
  append_token(t, a);
  return t.str();
}

}  // namespace pipeweave
