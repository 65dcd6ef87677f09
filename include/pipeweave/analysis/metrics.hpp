#pragma once
/// \file
/// Metrics of schedules: makespan, bubble ratio and peak activations, simulated
/// (usable in static_assert) or from closed forms.
///
/// \code
/// using S = pipeweave::OneFOneB<4, 16>;
/// static_assert(pipeweave::bubble_ratio(S{}) < 0.2);                // 3/16, simulated
/// static_assert(pipeweave::closed_form_bubble_ratio(S::shape) == 3.0 / 16);
/// \endcode
///
/// Closed forms, for free communication and equal stages (any forward and
/// backward costs F and B):
/// - makespan (V*M + P - 1) * (F + B), so bubble ratio (P - 1) / (V*M), with V = 1
///   for GPipe and 1F1B;
/// - peak activations of device d: min(W_d + 1, V*M), W_d = warmup_forwards():
///   M for GPipe, min(P - d, M) for 1F1B, min(2*(P-d-1) + (V-1)*P + 1, V*M) for
///   interleaved (Megatron-LM's warm-up, which it keeps for V = 1 too).
///
/// The simulator's dataflow replay meets the bubble closed forms for every
/// generated schedule. The steps replay (what the executors run) meets them for
/// GPipe and 1F1B, and for interleaved only when B = F; see simulate.hpp.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/schedules.hpp"

namespace pipeweave {

/// Closed-form bubble ratio of a generated schedule: (P - 1) / (V * M).
/// Throws pipeweave::Error for a custom shape, which has no closed form.
constexpr double closed_form_bubble_ratio(const ScheduleShape& s) {
  if (s.kind == ScheduleKind::kCustom) throw Error("closed_form_bubble_ratio: a custom schedule has no closed form");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  return static_cast<double>(s.devices - 1) / (static_cast<double>(s.chunks) * s.micro_batches);
}

/// Closed-form makespan of a generated schedule under a cost model with free
/// communication and speed 1 everywhere: (V*M + P - 1) * (F + B).
constexpr double closed_form_makespan(const ScheduleShape& s, const CostModel& cost = {}) {
  if (s.kind == ScheduleKind::kCustom) throw Error("closed_form_makespan: a custom schedule has no closed form");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  return (static_cast<double>(s.chunks) * s.micro_batches + s.devices - 1) * (cost.forward + cost.backward_cost());
}

/// Closed-form peak activations of device d: min(warmup_forwards(s, d) + 1, V * M).
constexpr int closed_form_peak_activations(const ScheduleShape& s, int device) {
  if (s.kind == ScheduleKind::kCustom) throw Error("closed_form_peak_activations: a custom schedule has no closed form");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  return std::min(warmup_forwards(s, device) + 1, s.chunks * s.micro_batches);
}

/// Peak activations of each device from a program's order: the most forwards
/// whose backward has not run yet, counted after each action.
constexpr std::vector<int> peak_activations(const Program& p) {
  std::vector<int> peak(p.devices.size(), 0);
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    int live = 0;
    for (const Action& a : p.devices[d]) {
      live += a.phase == Phase::kForward ? 1 : -1;
      peak[d] = std::max(peak[d], live);
    }
  }
  return peak;
}

/// The largest peak over a trace's devices.
constexpr int max_peak_activations(const Trace& t) {
  int most = 0;
  for (int v : t.peak_activations) most = std::max(most, v);
  return most;
}

/// Simulated makespan of a program (see simulate()).
constexpr double makespan(const Program& p, const CostModel& cost = {}) { return makespan(simulate(p, cost)); }

/// Simulated bubble ratio of a program: (makespan - busiest device's compute) / that compute.
constexpr double bubble_ratio(const Program& p, const CostModel& cost = {}) {
  return bubble_ratio(simulate(p, cost));
}

/// Simulated makespan of a compile-time schedule.
template <StaticScheduleType S>
constexpr double makespan(const S&, const CostModel& cost = {}) {
  return makespan(S::program(), cost);
}

/// Simulated bubble ratio of a compile-time schedule:
/// `static_assert(bubble_ratio(OneFOneB<4, 16>{}) < 0.2)`.
template <StaticScheduleType S>
constexpr double bubble_ratio(const S&, const CostModel& cost = {}) {
  return bubble_ratio(S::program(), cost);
}

/// Peak activations of device d of a compile-time schedule, from its order.
template <StaticScheduleType S>
constexpr int peak_activations(const S&, int device) {
  return peak_activations(S::program()).at(static_cast<std::size_t>(device));
}

}  // namespace pipeweave
