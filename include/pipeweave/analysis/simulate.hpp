#pragma once
/// \file
/// The cost-model simulator: replays a program on every device and writes the
/// Trace a measured run would give, with times from a cost model instead of
/// clocks. It is constexpr, so a schedule's simulated figures can be checked at
/// compile time.
///
/// \code
/// using S = pipeweave::OneFOneB<4, 8>;
/// static_assert(pipeweave::makespan(pipeweave::simulate(S{})) == 33);  // 3 * (M + P - 1)
/// \endcode
///
/// Two replays (ReplayMode):
/// - kSteps, the default, runs the lowered steps as the executors do: a device
///   posts step t's group of sends and receives when its step t-1 is done; a send
///   and its receive (matched in FIFO order per directed pair of devices) start
///   their transfer when both are posted (rendezvous) and end
///   `p2p_latency + activation_bytes / p2p_bandwidth` later; the group ends when
///   its last transfer ends (the transfers of a group run concurrently); then the
///   step's compute runs.
/// - kDataflow runs each device's actions in program order, each as soon as its
///   device is free and its inputs have arrived (the producer's end, plus the
///   transfer time when the producer is on another device). It is the bound the
///   program itself sets, the time a lowering with buffered sends and receives
///   posted just in time would reach; it has no P2P groups, and a compute event's
///   `step` is the action's index in the device's program.
///
/// With free communication and backward = 2 * forward — the costs lower() plans
/// with — GPipe, 1F1B and interleaved 1F1B reach the closed forms of metrics.hpp
/// in both replays (seed example: makespan 57). With other costs the steps replay
/// may run longer than the dataflow bound: a rendezvous needs both devices
/// between two actions.

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// Which program the simulator replays; see the file comment.
enum class ReplayMode : unsigned char {
  kSteps,     ///< the lowered steps under rendezvous, as the executors run them
  kDataflow,  ///< the actions as soon as their inputs allow: the bound of the program itself
};

/// Name used on the command line and in output: "steps" or "dataflow".
constexpr std::string_view replay_name(ReplayMode mode) {
  return mode == ReplayMode::kSteps ? "steps" : "dataflow";
}

/// What each action and each transfer costs, in the trace's time unit, and how to replay.
struct CostModel {
  double forward = 1;             ///< forward of one chunk on a device of speed 1
  double backward = -1;           ///< backward of one chunk; negative means 2 * forward
  double p2p_latency = 0;         ///< fixed time of every transfer
  double p2p_bandwidth = 0;       ///< bytes per time unit; 0 means unlimited
  double activation_bytes = 0;    ///< bytes of one activation; a gradient has the same size
  std::vector<double> device_speed;  ///< [device]: compute times are divided by it; empty: all 1
  ReplayMode replay = ReplayMode::kSteps;  ///< lowered steps (default) or dataflow bound

  /// The backward cost in effect: `backward`, or 2 * forward when it is negative.
  constexpr double backward_cost() const { return backward < 0 ? 2 * forward : backward; }
  /// Speed factor of device d (1 when device_speed is empty).
  constexpr double speed(int device) const {
    return device_speed.empty() ? 1.0 : device_speed[static_cast<std::size_t>(device)];
  }
  /// Time of an action on device d.
  constexpr double compute_time(int device, const Action& a) const {
    return (a.phase == Phase::kForward ? forward : backward_cost()) / speed(device);
  }
  /// A copy with another replay: `bubble_ratio(S{}, CostModel{}.with_replay(ReplayMode::kDataflow))`.
  constexpr CostModel with_replay(ReplayMode mode) const {
    CostModel c = *this;
    c.replay = mode;
    return c;
  }
  /// Time of one transfer once both sides are posted.
  constexpr double transfer_time() const {
    return p2p_latency + (p2p_bandwidth > 0 ? activation_bytes / p2p_bandwidth : 0.0);
  }
};

/// Describes what is wrong with a cost model for P devices; empty when it is usable.
constexpr Text cost_model_error(const CostModel& c, int devices) {
  auto bad = [](double x) { return !(x >= 0) || x > 1e300; };  // negative, NaN or infinite
  Text t;
  if (bad(c.forward)) {
    t << "cost model: the forward cost must be finite and at least 0";
  } else if (c.backward >= 0 ? bad(c.backward) : c.backward != c.backward) {
    t << "cost model: the backward cost must be finite and at least 0 (negative: 2 * forward)";
  } else if (bad(c.p2p_latency)) {
    t << "cost model: the p2p latency must be finite and at least 0";
  } else if (bad(c.p2p_bandwidth) || bad(c.activation_bytes)) {
    t << "cost model: p2p bandwidth and activation bytes must be finite and at least 0";
  } else if (!c.device_speed.empty() && c.device_speed.size() != static_cast<std::size_t>(devices)) {
    t << "cost model: " << static_cast<long long>(c.device_speed.size()) << " device speeds for " << devices
      << " devices";
  } else {
    for (std::size_t d = 0; d < c.device_speed.size(); ++d) {
      if (!(c.device_speed[d] > 0) || c.device_speed[d] > 1e300) {
        t << "cost model: device " << static_cast<long long>(d) << " has speed factor that is not a positive number";
        break;
      }
    }
  }
  return t;
}

namespace detail {

/// For every operation of every step, the step of its matching operation on the peer
/// (FIFO per directed pair). Requires a verified lowered program.
constexpr std::vector<std::vector<std::vector<int>>> partner_steps(const LoweredProgram& lp) {
  const auto P = static_cast<std::size_t>(lp.shape.devices);
  std::vector<std::vector<std::vector<int>>> partner(P);
  for (std::size_t d = 0; d < P; ++d) {
    partner[d].resize(lp.devices[d].size());
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) partner[d][t].assign(lp.devices[d][t].ops.size(), -1);
  }
  const PairQueues queues = pair_queues(lp);
  const auto& sends = queues.sends;
  const auto& recvs = queues.recvs;
  for (std::size_t a = 0; a < P; ++a) {
    for (std::size_t b = 0; b < P; ++b) {
      const auto& out = sends[a * P + b];
      const auto& in = recvs[a * P + b];
      for (std::size_t k = 0; k < out.size() && k < in.size(); ++k) {
        partner[a][static_cast<std::size_t>(out[k].step)][out[k].op] = in[k].step;
        partner[b][static_cast<std::size_t>(in[k].step)][in[k].op] = out[k].step;
      }
    }
  }
  return partner;
}

/// The replay itself, on a lowered program that passed verify().
constexpr Trace replay_steps(const LoweredProgram& lp, const CostModel& cost) {
  const ScheduleShape& s = lp.shape;
  const auto P = static_cast<std::size_t>(s.devices);
  const auto partner = partner_steps(lp);
  Trace trace;
  trace.shape = s;
  trace.source = TraceSource::kSimulated;
  trace.time_unit = "units";
  trace.compute.resize(P);
  trace.comm.resize(P);
  trace.peak_activations.assign(P, 0);
  // posted[d][t]: when device d posted step t (known once at[d] >= t).
  std::vector<std::vector<double>> posted(P);
  std::vector<std::size_t> at(P, 0);
  std::vector<int> live(P, 0);
  for (std::size_t d = 0; d < P; ++d) {
    posted[d].assign(lp.devices[d].size() + 1, 0.0);
    trace.compute[d].reserve(static_cast<std::size_t>(s.actions_per_device()));
  }
  const double transfer = cost.transfer_time();
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t d = 0; d < P; ++d) {
      const auto& steps = lp.devices[d];
      while (at[d] < steps.size()) {
        const std::size_t t = at[d];
        const Step& st = steps[t];
        bool matched = true;
        for (std::size_t i = 0; i < st.ops.size() && matched; ++i)
          matched = at[static_cast<std::size_t>(st.ops[i].peer)] >= static_cast<std::size_t>(partner[d][t][i]);
        if (!matched) break;
        const double begin = posted[d][t];
        double ready = begin;
        int sends = 0;
        for (std::size_t i = 0; i < st.ops.size(); ++i) {
          const auto peer = static_cast<std::size_t>(st.ops[i].peer);
          const double both = std::max(begin, posted[peer][static_cast<std::size_t>(partner[d][t][i])]);
          ready = std::max(ready, both + transfer);
          sends += st.ops[i].kind == OpKind::kSend;
        }
        const int dev = static_cast<int>(d);
        if (!st.ops.empty())
          trace.comm[d].push_back({dev, static_cast<int>(t), sends, static_cast<int>(st.ops.size()) - sends, begin, ready});
        double end = ready;
        if (st.has_compute) {
          end = ready + cost.compute_time(dev, st.compute);
          trace.compute[d].push_back(
              {dev, static_cast<int>(t), st.compute, s.stage_of(dev, st.compute.chunk), ready, end});
          live[d] += st.compute.phase == Phase::kForward ? 1 : -1;
          trace.peak_activations[d] = std::max(trace.peak_activations[d], live[d]);
        }
        posted[d][t + 1] = end;
        ++at[d];
        progress = true;
      }
    }
  }
  for (std::size_t d = 0; d < P; ++d)
    if (at[d] != lp.devices[d].size()) throw Error("simulate: the steps deadlock; verify() says where");
  return trace;
}

/// The dataflow replay, on a program that passed check_actions().
constexpr Trace replay_dataflow(const Program& p, const CostModel& cost) {
  const ScheduleShape& s = p.shape;
  const auto P = static_cast<std::size_t>(s.devices);
  Trace trace;
  trace.shape = s;
  trace.source = TraceSource::kSimulated;
  trace.time_unit = "units";
  trace.compute.resize(P);
  trace.comm.resize(P);
  trace.peak_activations.assign(P, 0);
  const std::size_t count = 2 * static_cast<std::size_t>(s.stages()) * static_cast<std::size_t>(s.micro_batches);
  std::vector<double> finished(count, -1.0);  // end time of each (phase, stage, micro-batch)
  std::vector<std::size_t> pos(P, 0);
  std::vector<double> free_at(P, 0.0);
  std::vector<int> live(P, 0);
  const double transfer = cost.transfer_time();
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t d = 0; d < P; ++d) {
      const int dev = static_cast<int>(d);
      while (pos[d] < p.devices[d].size()) {
        const Action& a = p.devices[d][pos[d]];
        Dependency deps[2] = {};
        const int n = dependencies(s, dev, a, deps);
        double start = free_at[d];
        bool ready = true;
        for (int i = 0; i < n && ready; ++i) {
          const double at = finished[action_index(s, deps[i].phase, deps[i].stage, a.micro_batch)];
          ready = at >= 0;
          start = std::max(start, at + (s.device_of_stage(deps[i].stage) == dev ? 0.0 : transfer));
        }
        if (!ready) break;
        const int stage = s.stage_of(dev, a.chunk);
        const double end = start + cost.compute_time(dev, a);
        trace.compute[d].push_back({dev, static_cast<int>(pos[d]), a, stage, start, end});
        finished[action_index(s, a.phase, stage, a.micro_batch)] = end;
        live[d] += a.phase == Phase::kForward ? 1 : -1;
        trace.peak_activations[d] = std::max(trace.peak_activations[d], live[d]);
        free_at[d] = end;
        ++pos[d];
        progress = true;
      }
    }
  }
  for (std::size_t d = 0; d < P; ++d)
    if (pos[d] != p.devices[d].size()) throw Error("simulate: the actions deadlock; verify() says where");
  return trace;
}

/// `t`, once its times are sound: every time finite, and every action lasting
/// what `cost` says (to 0.1%). A cost model can be usable term by term and still
/// overflow (a huge cost over a tiny speed, a sum of huge costs), or mix
/// magnitudes so far apart that a double loses the small ones (a latency of
/// 1e300 swallows a forward of 1); the metrics of such a trace would be wrong.
constexpr Trace checked_times(Trace t, const CostModel& cost) {
  auto finite = [](double x) { return x - x == 0; };  // false for inf and NaN
  bool ok = true;
  for (const auto& device : t.compute)
    for (const TraceEvent& e : device) ok = ok && finite(e.start) && finite(e.end);
  for (const auto& device : t.comm)
    for (const CommEvent& e : device) ok = ok && finite(e.start) && finite(e.end);
  if (!ok)
    throw Error("simulate: the cost model's times overflow (a cost divided by a device speed, or a sum of costs, "
                "exceeds the largest double); use smaller costs or larger speeds");
  for (const auto& device : t.compute) {
    for (const TraceEvent& e : device) {
      const double want = cost.compute_time(e.device, e.action), off = e.end - e.start - want;
      if (off > 1e-3 * want || -off > 1e-3 * want) {
        Text m("simulate: the cost model's times span more than a double resolves: the duration of ");
        append_token(m, e.action) << " on device " << e.device
                                  << " is lost in the times around it; use costs of closer magnitudes";
        throw Error(m.str());
      }
    }
  }
  return t;
}

}  // namespace detail

/// Simulates a lowered program under a cost model (always ReplayMode::kSteps, as
/// a lowered program has no other replay). Throws pipeweave::Error when the program
/// fails verify() (the message is verify()'s), the cost model is unusable, or its
/// times overflow or lose the actions' durations (detail::checked_times).
constexpr Trace simulate(const LoweredProgram& lp, const CostModel& cost = {}) {
  if (VerifyResult r = verify(lp); !r) {
    Text t("simulate: the program is not correct: ");
    t << r.message;
    throw Error(t.str());
  }
  if (Text e = cost_model_error(cost, lp.shape.devices); !e.empty()) throw Error(e.str());
  return detail::checked_times(detail::replay_steps(lp, cost), cost);
}

/// Simulates a program: lowers it (see lower()) and replays the steps, or replays
/// its actions as dataflow, as `cost.replay` says. Throws pipeweave::Error when the
/// program fails verify(), the cost model is unusable, or its times overflow or
/// lose the actions' durations.
constexpr Trace simulate(const Program& p, const CostModel& cost = {}) {
  if (Text e = detail::shape_problem(p.shape, p.devices.size(), "action"); !e.empty()) {
    Text t("simulate: ");
    t << e;
    throw Error(t.str());
  }
  if (VerifyResult r = detail::check_actions(p.shape, p.devices, {}); !r) {
    Text t("simulate: the program is not correct: ");
    t << r.message;
    throw Error(t.str());
  }
  if (cost.replay == ReplayMode::kDataflow) {
    if (Text e = cost_model_error(cost, p.shape.devices); !e.empty()) throw Error(e.str());
    return detail::checked_times(detail::replay_dataflow(p, cost), cost);
  }
  return simulate(lower(p), cost);
}

/// Simulates a compile-time schedule: `simulate(Interleaved1F1B<4, 2, 8>{})`.
template <StaticScheduleType S>
constexpr Trace simulate(const S&, const CostModel& cost = {}) {
  return simulate(S::program(), cost);
}

}  // namespace pipeweave
