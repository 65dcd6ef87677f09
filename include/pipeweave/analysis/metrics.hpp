#pragma once
/// \file
/// Metrics of schedules: makespan, bubble ratio, peak activations and peak
/// memory, simulated (usable in static_assert) or from closed forms.
///
/// \code
/// using S = pipeweave::OneFOneB<4, 16>;
/// static_assert(pipeweave::bubble_ratio(S{}) < 0.2);                // 3/16, simulated
/// static_assert(pipeweave::closed_form_bubble_ratio(S::shape) == 3.0 / 16);
/// \endcode
///
/// Closed forms, for free communication and equal stages; F, B, I, W are the
/// costs of a chunk's forward, backward and backward halves (CostModel). The
/// bubble ratio is (makespan - V*M*(F + B)) / (V*M*(F + B)), with I + W for B
/// where the backward is split.
/// - GPipe, 1F1B, interleaved 1F1B (any F and B): makespan (V*M + P - 1)(F + B),
///   so bubble ratio (P - 1) / (V*M), with V = 1 for GPipe and 1F1B;
/// - looped BFS (any F and B): (V*max(M, P) + min(M, P) - 1)(F + B);
/// - ZB-H1 and interleaved ZB, when W <= F and W <= I: V*M(F + I + W) + (P - 1)(F
///   + I - W) for M >= P (ZB-H1: a bubble of (P - 1)(F + I - W) against 1F1B's
///   (P - 1)(F + I + W), a third when F = I = W); for ZB-H1 with M < P,
///   (M + P - 1)(F + I) + W; none for interleaved ZB with M < P;
/// - ZB-V, when M >= 2P - 1, I = F and F/2 <= W <= F (PyTorch tunes its order
///   for F = I = W): 2M(F + I + W) + (P - 1)F, a bubble ratio of (P - 1) / (6M)
///   when F = I = W;
/// - peak activations of device d (forward stashes, see Trace): min(W_d + 1,
///   V*M), W_d = warmup_forwards(), for GPipe, 1F1B and interleaved (M, min(P -
///   d, M), min(2(P-d-1) + (V-1)P + 1, V*M): Megatron-LM's warm-up, which it
///   keeps for V = 1 too); V*M for looped BFS; min(W_d + d + 1, V*M) for ZB-H1
///   and interleaved ZB (a W runs d micro-batches behind its I); min(M + d + 1,
///   2P, 2M) for ZB-V;
/// - peak memory of device d (stashes and the gradients kept for a W): the peak
///   activations where no backward is split; min(W_d + d + 1, V*M) + min(d, V*M
///   - 1) + 1 for ZB-H1 and interleaved ZB; max(2P + 1, P + 3d + 1) for ZB-V
///   with M >= 2P - 1, none for smaller M.
///
/// The simulator's dataflow replay meets the makespan closed forms for every
/// generated schedule under the costs above. The steps replay (what the
/// executors run) meets them with the costs lower() plans generated programs
/// with (forward 1, backward 2, I 1, W 1, the simulator's defaults, or any
/// multiple of them),
/// and never beats them; see simulate.hpp.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/phases.hpp"
#include "pipeweave/schedule/schedules.hpp"

namespace pipeweave {

namespace detail {

/// A cost model's costs in effect, as the closed forms take them.
constexpr UnitCosts unit_costs(const CostModel& c) {
  UnitCosts u;
  for (const Phase p : compute_phases()) u[p] = c.cost_of(p);
  return u;
}

}  // namespace detail

/// Why a shape has no closed-form makespan under a cost model (see the file
/// comment and its kind's row); empty when it has one.
constexpr Text closed_form_error(const ScheduleShape& s, const CostModel& cost = {}) {
  Text t;
  const KindRow& row = kind_row(s.kind);
  if (!row.generated) {
    t << "a custom schedule has no closed form";
  } else if (Text e = shape_error(s); !e.empty()) {
    t << e;
  } else if (!row.has_makespan) {
    t << row.name << " has no closed form; simulate it";
  } else if (!cost.stage_costs.empty()) {
    t << row.name << " has a closed form for one cost per phase only, not for costs per stage";
  } else {
    row.makespan_limits(t, s, detail::unit_costs(cost), row.name);
  }
  return t;
}

/// Closed-form makespan of a generated schedule under a cost model with free
/// communication and speed 1 everywhere (see the file comment). Throws
/// pipeweave::Error where there is none (closed_form_error()).
constexpr double closed_form_makespan(const ScheduleShape& s, const CostModel& cost = {}) {
  if (Text e = closed_form_error(s, cost); !e.empty()) {
    Text t("closed_form_makespan: ");
    t << e;
    throw Error(t.str());
  }
  return kind_row(s.kind).makespan(s, detail::unit_costs(cost));
}

/// Closed-form bubble ratio of a generated schedule: (P - 1) / (V * M) for GPipe,
/// 1F1B and interleaved 1F1B, whatever the costs; for the other kinds from
/// closed_form_makespan(). Throws pipeweave::Error where there is none.
constexpr double closed_form_bubble_ratio(const ScheduleShape& s, const CostModel& cost = {}) {
  const KindRow& row = kind_row(s.kind);
  if (!row.generated) throw Error("closed_form_bubble_ratio: a custom schedule has no closed form");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  if (row.bubble_of_shape) return static_cast<double>(s.devices - 1) / (static_cast<double>(s.chunks) * s.micro_batches);
  double per_chunk = 0;  // one (chunk, micro-batch): F + B, or F + I + W where the backwards are split
  for (const Phase p : compute_phases())
    if (runs_per_micro_batch(p, row.split_backward)) per_chunk += cost.cost_of(p);
  const double busy = static_cast<double>(s.chunks) * s.micro_batches * per_chunk;
  return (closed_form_makespan(s, cost) - busy) / busy;
}

/// Closed-form peak activations (forward stashes kept at once) of device d; see
/// the file comment. Throws pipeweave::Error for a kind without one (custom, DualPipeV).
constexpr int closed_form_peak_activations(const ScheduleShape& s, int device) {
  const KindRow& row = kind_row(s.kind);
  if (!row.has_peaks) {
    Text t("closed_form_peak_activations: ");
    t << (row.generated ? row.name : "a custom") << " schedule has no closed form";
    throw Error(t.str());
  }
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  return row.peak_activations(s, device, warmup_forwards(s, device));
}

/// Why device d's peak memory has no closed form; empty when it has one.
constexpr Text closed_form_memory_error(const ScheduleShape& s) {
  Text t;
  const KindRow& row = kind_row(s.kind);
  if (!row.generated) t << "a custom schedule has no closed form";
  else if (!row.has_peaks) t << row.name << " has no closed form; simulate it";
  else if (Text e = shape_error(s); !e.empty()) t << e;
  else row.memory_limits(t, s, row.name);
  return t;
}

/// Closed-form peak memory (stashes and gradients kept for a W, see Trace) of
/// device d; see the file comment. Throws pipeweave::Error where there is none
/// (closed_form_memory_error()).
constexpr int closed_form_peak_memory(const ScheduleShape& s, int device) {
  if (Text e = closed_form_memory_error(s); !e.empty()) {
    Text t("closed_form_peak_memory: ");
    t << e;
    throw Error(t.str());
  }
  const KindRow& row = kind_row(s.kind);
  const int peak = closed_form_peak_activations(s, device);
  return row.peak_memory(s, device, peak);
}

/// The largest peak over a trace's devices.
constexpr int max_peak_activations(const Trace& t) {
  int most = 0;
  for (int v : t.peak_activations) most = std::max(most, v);
  return most;
}

namespace detail {

/// Calls f(device, event) for every event of a trace outside an overlapped
/// pair (a pair's halves are stretched: see simulate()).
template <class F>
constexpr void each_single_event(const Trace& t, F&& f) {
  for (std::size_t d = 0; d < t.compute.size(); ++d) {
    const auto& events = t.compute[d];
    for (std::size_t k = 0; k < events.size(); ++k) {
      if (events[k].action.overlaps_next && k + 1 < events.size()) ++k;
      else f(d, events[k]);
    }
  }
}

}  // namespace detail

/// A cost model fitted to a measured trace, to simulate what a program allows
/// with the costs a run really had (free communication, so that the simulated
/// run is the bound the compute sets):
/// - the cost of each phase is the mean duration of its events over all
///   devices; a phase with no event keeps the default (B: I + W, I and W: F);
/// - device d's speed is what its events cost under those means over what they
///   took, so a device that computes more (the last stage with the loss, a first
///   stage without an input gradient) keeps its share;
/// - the halves of overlapped pairs are left out (their durations are stretched,
///   see simulate()), and overlap_efficiency stays 0;
/// - a gradient reduction costs the mean of the trace's (`reduce`).
///
/// When every device's phases took the same time, up to one factor per device,
/// the fitted model times every action as the run did.
constexpr CostModel fit_cost_model(const Trace& t) {
  double sum[kPhases] = {};
  long long count[kPhases] = {};
  detail::each_single_event(t, [&](std::size_t, const TraceEvent& e) {
    sum[static_cast<int>(e.action.phase)] += e.end - e.start;
    ++count[static_cast<int>(e.action.phase)];
  });
  auto mean = [&](Phase p, double none) {
    const int i = static_cast<int>(p);
    return count[i] > 0 ? sum[i] / static_cast<double>(count[i]) : none;
  };
  CostModel c;
  for (const Phase p : compute_phases()) c.compute[p] = mean(p, PhaseCosts<double>::following()[p]);
  long long reductions = 0;
  for (const auto& device : t.collective)
    for (const TraceEvent& e : device) {
      c.reduce += e.end - e.start;
      ++reductions;
    }
  if (reductions > 0) c.reduce /= static_cast<double>(reductions);
  std::vector<double> model(t.compute.size(), 0.0), took(t.compute.size(), 0.0);
  detail::each_single_event(t, [&](std::size_t d, const TraceEvent& e) {
    model[d] += c.cost_of(e.action.phase);
    took[d] += e.end - e.start;
  });
  c.device_speed.assign(t.compute.size(), 1.0);
  for (std::size_t d = 0; d < t.compute.size(); ++d)
    if (model[d] > 0 && took[d] > 0) c.device_speed[d] = model[d] / took[d];
  return c;
}

/// A cost model of one cost per (virtual stage, phase), fitted to a measured
/// trace: each stage's phase costs the mean duration of its events (a stage
/// held by a slower device, or with more layers, or with the loss, keeps its
/// own); a phase a stage never ran falls back as StageCost's does (B: I + W,
/// I and W: F), but where a stage ran whole backwards and no halves, each half
/// takes half of its B. Overlapped pairs are left out, as fit_cost_model() leaves them;
/// device speeds stay 1 and communication free. When every (stage, phase) took
/// one time, the fitted model times every action as the run did.
/// `stages` is the shape's P * V (a stage without a single event keeps the
/// defaults).
constexpr CostModel fit_stage_costs(const Trace& t, int stages) {
  std::vector<double> sum(static_cast<std::size_t>(stages) * kPhases, 0.0);
  std::vector<long long> count(sum.size(), 0);
  detail::each_single_event(t, [&](std::size_t, const TraceEvent& e) {
    if (e.stage < 0 || e.stage >= stages) throw Error("fit_stage_costs: the trace has an event of a stage past the shape's");
    const std::size_t i = static_cast<std::size_t>(e.stage) * kPhases + static_cast<std::size_t>(e.action.phase);
    sum[i] += e.end - e.start;
    ++count[i];
  });
  CostModel c;
  c.stage_costs.assign(static_cast<std::size_t>(stages), StageCost{});
  for (std::size_t st = 0; st < c.stage_costs.size(); ++st) {
    StageCost& sc = c.stage_costs[st];
    for (const Phase p : compute_phases()) {
      const std::size_t i = st * kPhases + static_cast<std::size_t>(p);
      sc[p] = count[i] > 0 ? sum[i] / static_cast<double>(count[i]) : PhaseCosts<double>::following()[p];
    }
    // Only whole backwards ran: each half (a phase the whole follows) takes its share of one.
    for (const Phase p : compute_phases()) {
      if (!is_whole_backward(p) || sc[p] < 0) continue;
      const PhaseRow& row = phase_row(p);
      const auto halves = std::span(row.fallback, static_cast<std::size_t>(row.fallbacks));
      if (std::all_of(halves.begin(), halves.end(), [&](Phase h) { return sc[h] < 0; }))
        for (const Phase h : halves) sc[h] = sc[p] / row.fallbacks;
    }
  }
  return c;
}

/// The median of measured values, e.g. the step times of a run (the first
/// step also makes its buffers: the median leaves it out); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
