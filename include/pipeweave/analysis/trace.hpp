#pragma once
/// \file
/// The trace: what ran where and when, per device. The simulator writes it from a
/// cost model, the executors write it from clocks or CUDA events; every renderer
/// reads it, so a simulated and a measured run can be drawn side by side.

#include <algorithm>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/memory.hpp"

namespace pipeweave {

/// Where a trace's times come from.
enum class TraceSource : unsigned char { kSimulated, kMeasured };

/// One compute action as it ran: device, step of the lowered program, times.
struct TraceEvent {
  int device = 0;
  int step = 0;       ///< index into the device's lowered steps
  Action action{};
  int stage = 0;      ///< virtual stage (ScheduleShape::stage_of())
  double start = 0;   ///< in the trace's time unit, from the start of the run
  double end = 0;
  friend constexpr bool operator==(const TraceEvent&, const TraceEvent&) = default;
};

/// One P2P group as it ran on a device: from its posting to its completion.
struct CommEvent {
  int device = 0;
  int step = 0;
  int sends = 0;
  int recvs = 0;
  double start = 0;
  double end = 0;
  friend constexpr bool operator==(const CommEvent&, const CommEvent&) = default;
};

/// A run of one schedule: per device, its compute events and its P2P groups in
/// the order they ran, and the most it kept at once.
///
/// What a device keeps: the stash of each forward (the chunk's input and what
/// its backward reads) until that micro-batch's weight gradient is done (its B,
/// or its W when the backward is split: W needs the input), or only its input
/// until its recomputation (C); and, between an I and its W, the output
/// gradient that W needs too (KeptCount, memory.hpp). peak_activations counts
/// the stashes; peak_memory sums their sizes and the kept gradients' in the
/// memory model's unit (MemoryModel; by default one activation, a gradient of
/// the same size: then it equals peak_activations when no backward is split
/// and nothing is recomputed).
struct Trace {
  ScheduleShape shape{};
  TraceSource source = TraceSource::kSimulated;
  std::string_view time_unit = "units";  ///< "units" for a cost model, "us" for a measured run
  std::vector<std::vector<TraceEvent>> compute;  ///< [device][k]
  std::vector<std::vector<CommEvent>> comm;      ///< [device][k]
  /// [device][k]: its gradient reductions (R) on its collective lane, which runs
  /// beside its compute; empty lists where the program has none.
  std::vector<std::vector<TraceEvent>> collective;
  /// [device][k]: its offloads (O) and reloads (L) on its copy lane, which runs
  /// beside its compute, each from its copy's start to its end; empty lists
  /// where the program has none.
  std::vector<std::vector<TraceEvent>> copies;
  std::vector<int> peak_activations;             ///< [device]: forward stashes kept at once, at most
  std::vector<double> peak_memory;               ///< [device]: stashes and gradients kept for a W, at most, in the memory model's unit (may be empty)
  /// [device]: a measured run's most bytes held at once for the micro-batches
  /// it keeps (runtime/held_memory.hpp): its chunks' stash slots and the
  /// buffers kept with them. Empty where nothing measured them (a simulated
  /// trace, whose peak_memory under a memory model in bytes predicts them; a
  /// chunk that does not say its slots' bytes).
  std::vector<double> peak_bytes;
};

/// A trace of a shape with no event yet: one (empty) event list per device and
/// peaks of 0; `unit` names its time unit ("units", "us").
constexpr Trace empty_trace(const ScheduleShape& s, TraceSource source, std::string_view unit) {
  Trace trace;
  trace.shape = s;
  trace.source = source;
  trace.time_unit = unit;
  trace.compute.resize(static_cast<std::size_t>(s.devices));
  trace.comm.resize(static_cast<std::size_t>(s.devices));
  trace.collective.resize(static_cast<std::size_t>(s.devices));
  trace.copies.resize(static_cast<std::size_t>(s.devices));
  trace.peak_activations.assign(static_cast<std::size_t>(s.devices), 0);
  trace.peak_memory.assign(static_cast<std::size_t>(s.devices), 0.0);
  return trace;
}

/// A lane beside the compute, as the trace and its pictures have it: the
/// lane, the function that gives its events' lists in a Trace, its tag after "device d" in text
/// timelines, its name in event lists, its words in track names and its
/// legend. One row per such lane (kSideLanes).
struct SideLane {
  using Lists = std::vector<std::vector<TraceEvent>>;  ///< [device][k]
  ActionLane lane;
  const Lists& (*events)(const Trace&);
  std::string_view tag;
  std::string_view name;
  std::string_view words;
  std::string_view legend;
};

/// The lanes beside the compute: the collective lane (R) and the copy lane (O, L).
inline constexpr SideLane kSideLanes[] = {
    {ActionLane::kCollective, [](const Trace& t) -> const SideLane::Lists& { return t.collective; }, "R", "collective",
     "gradient reductions", "its gradient reductions R<c> ('#') beside its compute"},
    {ActionLane::kCopy, [](const Trace& t) -> const SideLane::Lists& { return t.copies; }, "copy", "copy",
     "offloads and reloads",
     "its offloads O<c>.<m> ('>') and reloads L<c>.<m> ('<') between it and host memory, beside its compute"},
};

/// The row of a lane beside the compute (the collective one for kCompute, which has none).
constexpr const SideLane& side_lane(ActionLane lane) {
  for (const SideLane& s : kSideLanes)
    if (s.lane == lane) return s;
  return kSideLanes[0];
}

/// The event lists of a lane of a trace, to fill: the compute's, or those of a lane beside it.
constexpr SideLane::Lists& lane_events(Trace& t, ActionLane lane) {
  return lane == ActionLane::kCompute ? t.compute : const_cast<SideLane::Lists&>(side_lane(lane).events(t));
}

/// The events of device d on a lane beside the compute; null where the trace has no list for d.
constexpr const std::vector<TraceEvent>* side_events(const Trace& t, const SideLane& lane, std::size_t d) {
  const auto& lists = lane.events(t);
  return d < lists.size() ? &lists[d] : nullptr;
}

/// True when a trace has events on a lane beside the compute.
constexpr bool has_side_events(const Trace& t, const SideLane& lane) {
  for (const auto& device : lane.events(t))
    if (!device.empty()) return true;
  return false;
}

/// True when the trace's peak memory says more than its peak activations: it
/// has one per device, and some device's differs (a gradient kept for a W, a
/// recomputed stash, a stash size of its own).
constexpr bool memory_differs(const Trace& t) {
  if (t.peak_memory.size() != t.peak_activations.size()) return false;
  for (std::size_t d = 0; d < t.peak_memory.size(); ++d)
    if (t.peak_memory[d] != t.peak_activations[d]) return true;
  return false;
}

/// The lane of a device's k-th compute event in the renderers: 1 for the
/// backward half of an overlapped pair (the event after a pair's forward), which
/// runs beside the forward; 0 for every other.
constexpr int event_lane(const std::vector<TraceEvent>& events, std::size_t k) {
  return k > 0 && events[k - 1].action.overlaps_next ? 1 : 0;
}

/// True when a device's events have a second lane (an overlapped pair).
constexpr bool has_second_lane(const std::vector<TraceEvent>& events) {
  for (std::size_t k = 0; k < events.size(); ++k)
    if (event_lane(events, k) == 1) return true;
  return false;
}

/// Latest end time over all events (the trace starts at 0).
constexpr double makespan(const Trace& t) {
  double end = 0;
  for (const auto& device : t.compute)
    for (const TraceEvent& e : device) end = std::max(end, e.end);
  for (const auto& device : t.comm)
    for (const CommEvent& e : device) end = std::max(end, e.end);
  for (const SideLane& lane : kSideLanes)
    for (const auto& device : lane.events(t))
      for (const TraceEvent& e : device) end = std::max(end, e.end);
  return end;
}

/// The exposed reduction of device d: how long its gradient reductions run on
/// after its last compute action ends (0 when they end before it, or when it has
/// none). The optimizer step of a device waits for all of its reductions; what
/// the cool-down hides is the rest.
constexpr double exposed_reduction(const Trace& t, int device) {
  const auto d = static_cast<std::size_t>(device);
  if (d >= t.collective.size() || t.collective[d].empty()) return 0;
  double compute_end = 0, reduce_end = 0;
  for (const TraceEvent& e : t.compute[d]) compute_end = std::max(compute_end, e.end);
  for (const TraceEvent& e : t.collective[d]) reduce_end = std::max(reduce_end, e.end);
  return std::max(0.0, reduce_end - compute_end);
}

/// The most exposed reduction over the devices: how much later the step ends
/// because of its reductions, where the device that ends last is that one.
constexpr double max_exposed_reduction(const Trace& t) {
  double most = 0;
  for (std::size_t d = 0; d < t.collective.size(); ++d) most = std::max(most, exposed_reduction(t, static_cast<int>(d)));
  return most;
}

/// Total time of device d's gradient reductions on its collective lane.
constexpr double reduction_time(const Trace& t, int device) {
  double total = 0;
  const auto d = static_cast<std::size_t>(device);
  if (d < t.collective.size())
    for (const TraceEvent& e : t.collective[d]) total += e.end - e.start;
  return total;
}

/// The share of the reductions' time that ran beside compute, over every device:
/// 1 - (sum of exposed_reduction) / (sum of reduction_time); 1 when the trace has
/// no reduction (nothing was exposed).
constexpr double hidden_reduction_share(const Trace& t) {
  double exposed = 0, total = 0;
  for (std::size_t d = 0; d < t.collective.size(); ++d) {
    exposed += exposed_reduction(t, static_cast<int>(d));
    total += reduction_time(t, static_cast<int>(d));
  }
  return total > 0 ? 1.0 - exposed / total : 1.0;
}

/// Total compute time of one device; an overlapped pair counts once, from its
/// start to the end of its longer half.
constexpr double busy_time(const Trace& t, int device) {
  double busy = 0;
  const auto& events = t.compute.at(static_cast<std::size_t>(device));
  for (std::size_t k = 0; k < events.size(); ++k) {
    const TraceEvent& e = events[k];
    if (e.action.overlaps_next && k + 1 < events.size()) {  // an overlapped pair: the time both halves span
      const TraceEvent& other = events[++k];
      busy += std::max(e.end, other.end) - std::min(e.start, other.start);
    } else {
      busy += e.end - e.start;
    }
  }
  return busy;
}

/// (makespan - busy time of the busiest device) / that busy time.
constexpr double bubble_ratio(const Trace& t) {
  double busiest = 0;
  for (std::size_t d = 0; d < t.compute.size(); ++d) busiest = std::max(busiest, busy_time(t, static_cast<int>(d)));
  return busiest > 0 ? (makespan(t) - busiest) / busiest : 0.0;
}

/// The busy time of all devices over the makespan: how many times faster the run
/// is than its compute on one device, P / (1 + bubble ratio) when every device
/// is equally busy.
constexpr double parallel_speedup(const Trace& t) {
  double busy = 0;
  for (std::size_t d = 0; d < t.compute.size(); ++d) busy += busy_time(t, static_cast<int>(d));
  const double span = makespan(t);
  return span > 0 ? busy / span : 0.0;
}

}  // namespace pipeweave
