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
/// A gradient reduction R (data parallelism, grad_reduce.hpp) takes no compute
/// time: when the device reaches it, it starts on the device's collective lane,
/// after the lane's previous reduction, and lasts CostModel::reduce while the
/// device computes on (ring_allreduce_time() models one from bytes and a link).
/// Its events are the trace's `collective` lists; the makespan counts them, and
/// exposed_reduction() says how long a device's reductions outlast its compute.
///
/// An offload O and a reload L run on the device's copy lane, one copy at a
/// time in the order they are issued, each lasting the stage's stash size over
/// CostModel::copy_bandwidth. An offload's copy is issued when its forward
/// ends; where the program places O the device waits for that copy to end, and
/// from then on no longer holds the stash. A reload's copy is issued where the
/// program places L (the device holds the stash again from then on, and goes
/// on at once); the backward (B or I) that reads the stash starts no earlier
/// than that copy's end. An offload in a weight window (its O after the I, its
/// L before the W) moves the output gradient too (the stash size plus the
/// gradient size): its copy is issued when the I ends, and the W waits for its
/// reload. Their events are the trace's `copies` lists, each from its copy's
/// start to its end.
///
/// An overlapped pair of a forward F and a backward B (or I) starts once the
/// inputs of both are there and lasts `max(F, B) + (1 - e) * min(F, B)`, with e
/// the cost model's overlap_efficiency (0: the halves take as long as one after
/// the other; 1: the shorter is hidden entirely). Its halves run side by side at
/// one rate: each lasts its own cost times pair time / max(F, B), so the longer
/// ends with the pair. The trace has an event for each half, the forward first
/// (so that the activations kept count both).
///
/// With free communication and backward = 2 * forward — the reference clock
/// lower() plans every generated program on — GPipe, 1F1B and interleaved 1F1B
/// reach the closed forms of metrics.hpp in both replays (seed example: makespan
/// 57). With other costs the steps replay may run longer than the dataflow bound:
/// a rendezvous needs both devices between two actions. A program planned on its
/// own costs (Program::lowering, or Program::stage_lowering per stage) waits the
/// least; synthesize() does that.
///
/// Each replay is an observer of the verifier's own run (StepRun for the steps,
/// run_dataflow() for the dataflow bound): simulate() verifies and replays in one
/// pass, and of a program of actions it never stores the lowered steps. Its cost
/// is linear in the number of actions; what it keeps besides the trace is O(P).

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/tokens.hpp"
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

/// What the actions of one virtual stage cost, where stages differ (the first
/// stage without an input gradient, the last with the loss, an uneven split of
/// the layers): `{F, B, I, W}`, a negative one following others as
/// CostModel::compute's do (cost_of()).
using StageCost = PhaseCosts<double>;

/// What each action and each transfer costs, in the trace's time unit, and how to replay.
struct CostModel {
  /// Each compute phase's cost for one chunk on a device of speed 1,
  /// `compute[Phase::kForward]`: F 1, and the others negative, which follow it
  /// as their rows say (B: I + W; I and W: F; PhaseCosts::cost_of()).
  PhaseCosts<double> compute = PhaseCosts<double>::following();
  double p2p_latency = 0;         ///< fixed time of every transfer
  double p2p_bandwidth = 0;       ///< bytes per time unit; 0 means unlimited
  double activation_bytes = 0;    ///< bytes of one activation; a gradient has the same size
  std::vector<double> device_speed;  ///< [device]: compute times are divided by it; empty: all 1
  /// [virtual stage]: each stage's own costs, in place of `compute`; empty:
  /// every stage costs those. Its size must be the shape's P * V.
  std::vector<StageCost> stage_costs;
  ReplayMode replay = ReplayMode::kSteps;  ///< lowered steps (default) or dataflow bound
  double overlap_efficiency = 0;  ///< e in [0, 1]: an overlapped pair lasts max(F, B) + (1 - e) * min(F, B)
  double reduce = 0;  ///< a chunk's gradient all-reduce (R) on the collective lane (ring_allreduce_time())
  MemoryModel memory{};  ///< what each stage keeps of a micro-batch: the unit of the trace's peak memory
  /// The copy lane's bandwidth between a device and host memory, in the memory
  /// model's unit per time unit: an offload (O) or a reload (L) of a stash
  /// lasts its size over it; 0 means unlimited (copies take no time).
  double copy_bandwidth = 0;

  /// The I cost in effect: its entry, or forward when that is negative.
  constexpr double input_cost() const { return cost_of(Phase::kBackwardInput); }
  /// The W cost in effect: its entry, or forward when that is negative.
  constexpr double weight_cost() const { return cost_of(Phase::kBackwardWeight); }
  /// The backward cost in effect: its entry, or I + W (2 * forward by default) when that is negative.
  constexpr double backward_cost() const { return cost_of(Phase::kBackward); }
  /// The cost of an action of `phase` on a device of speed 1, from `compute`.
  constexpr double cost_of(Phase phase) const { return compute.cost_of(phase); }
  /// The cost of an action of `phase` of virtual stage `stage` on a device of
  /// speed 1: the stage's own (stage_costs) or the scalar one.
  constexpr double cost_of(Phase phase, int stage) const {
    return stage_costs.empty() ? cost_of(phase) : stage_costs[static_cast<std::size_t>(stage)].cost_of(phase);
  }
  /// Speed factor of device d (1 when device_speed is empty).
  constexpr double speed(int device) const {
    return device_speed.empty() ? 1.0 : device_speed[static_cast<std::size_t>(device)];
  }
  /// Time of an action of `phase` of virtual stage `stage` on device d.
  constexpr double compute_time(int device, int stage, Phase phase) const {
    return cost_of(phase, stage) / speed(device);
  }
  /// Time of an event's action on its device.
  constexpr double compute_time(const TraceEvent& e) const { return compute_time(e.device, e.stage, e.action.phase); }
  /// Time of an overlapped pair whose halves alone take f and b.
  constexpr double pair_time(double f, double b) const {
    return std::max(f, b) + (1 - overlap_efficiency) * std::min(f, b);
  }
  /// How much longer each half of that pair runs than alone: pair time / max(f, b) (1 when both are 0).
  constexpr double pair_stretch(double f, double b) const {
    const double longer = std::max(f, b);
    return longer > 0 ? pair_time(f, b) / longer : 1.0;
  }
  /// A copy with another replay: `bubble_ratio(S{}, CostModel{}.with_replay(ReplayMode::kDataflow))`.
  constexpr CostModel with_replay(ReplayMode mode) const {
    CostModel c = *this;
    c.replay = mode;
    return c;
  }
  /// Time of one offload or reload of a stash of virtual stage `stage` on the
  /// copy lane; in a weight window (after an I, before its W) with the output
  /// gradient the W reads.
  constexpr double copy_time(int stage, bool weight_window = false) const {
    const StashSize& z = memory.of(stage);
    return copy_bandwidth > 0 ? (z.stash + (weight_window ? z.gradient : 0)) / copy_bandwidth : 0.0;
  }
  /// Time of one transfer once both sides are posted.
  constexpr double transfer_time() const {
    return p2p_latency + (p2p_bandwidth > 0 ? activation_bytes / p2p_bandwidth : 0.0);
  }
};

/// A ring all-reduce of `bytes` among `replicas` devices: latency + 2(D - 1)/D x
/// bytes / bandwidth (each device sends and receives 2(D - 1) chunks of bytes /
/// D); 0 for one replica, and no bandwidth term where bandwidth is 0 (unlimited).
constexpr double ring_allreduce_time(int replicas, double bytes, double latency, double bandwidth) {
  if (replicas <= 1) return 0;
  const double share = 2.0 * (replicas - 1) / replicas;
  return latency + (bandwidth > 0 ? share * bytes / bandwidth : 0.0);
}

namespace detail {

/// Appends what is wrong with a table of costs (`who` names it), the first
/// phase in order with a wrong cost: "the input (I) cost must be finite and at
/// least 0 (negative: forward)"; nothing when they are usable. A phase whose
/// row has fallbacks may be negative (it follows them), no other.
constexpr void phase_costs_error(Text& t, const PhaseCosts<double>& c, std::string_view who) {
  auto bad = [](double x) { return !(x >= 0) || x > 1e300; };  // negative, NaN or infinite
  for (const Phase p : compute_phases()) {
    const PhaseRow& row = phase_row(p);
    const double x = c[p];
    if (row.fallbacks == 0 ? !bad(x) : x >= 0 ? !bad(x) : x == x) continue;
    t << who << ": the " << row.cost;
    if (row.split) t << " (" << std::string_view(&row.letter, 1) << ")";
    t << " cost must be finite and at least 0";
    if (row.fallbacks > 0) {
      t << " (negative: ";
      for (int k = 0; k < row.fallbacks; ++k) t << (k ? " + " : "") << phase_row(row.fallback[k]).cost;
      t << ")";
    }
    return;
  }
}

}  // namespace detail

/// Describes what is wrong with a cost model for P devices (and, when `stages`
/// is given, P * V virtual stages); empty when it is usable.
constexpr Text cost_model_error(const CostModel& c, int devices, int stages = -1) {
  auto bad = [](double x) { return !(x >= 0) || x > 1e300; };  // negative, NaN or infinite
  Text t;
  detail::phase_costs_error(t, c.compute, "cost model");
  if (!t.empty()) return t;
  if (bad(c.p2p_latency)) {
    t << "cost model: the p2p latency must be finite and at least 0";
  } else if (bad(c.p2p_bandwidth) || bad(c.activation_bytes)) {
    t << "cost model: p2p bandwidth and activation bytes must be finite and at least 0";
  } else if (bad(c.reduce)) {
    t << "cost model: the reduction (R) cost must be finite and at least 0";
  } else if (bad(c.copy_bandwidth)) {
    t << "cost model: the copy bandwidth (offload O, reload L) must be finite and at least 0 (0: unlimited)";
  } else if (!(c.overlap_efficiency >= 0 && c.overlap_efficiency <= 1)) {
    t << "cost model: the overlap efficiency must be between 0 and 1 (0: a pair's halves take as long as one after "
         "the other, 1: the shorter is hidden)";
  } else if (!c.device_speed.empty() && c.device_speed.size() != static_cast<std::size_t>(devices)) {
    t << "cost model: " << static_cast<long long>(c.device_speed.size()) << " device speeds for " << devices
      << " devices";
  } else if (stages >= 0 && !c.stage_costs.empty() && c.stage_costs.size() != static_cast<std::size_t>(stages)) {
    t << "cost model: " << static_cast<long long>(c.stage_costs.size()) << " stage costs for " << stages
      << " virtual stages (one per stage, P * V)";
  } else {
    for (std::size_t d = 0; d < c.device_speed.size(); ++d) {
      if (!(c.device_speed[d] > 0) || c.device_speed[d] > 1e300) {
        t << "cost model: device " << static_cast<long long>(d) << " has speed factor that is not a positive number";
        return t;
      }
    }
    for (std::size_t s = 0; s < c.stage_costs.size() && t.empty(); ++s) {
      Text who("cost model: stage ");
      who << static_cast<long long>(s);
      detail::phase_costs_error(t, c.stage_costs[s], who.view());
    }
  }
  if (t.empty()) t << memory_model_error(c.memory, stages >= 0 ? stages : static_cast<int>(c.memory.stages.size()));
  return t;
}

namespace detail {

/// What both replays keep of each device, and how they place an action once
/// they know when its device could start it: a gradient reduction goes on the
/// device's collective lane, after the lane's previous one, and the device goes
/// on at once; an offload's copy goes on the copy lane when its forward ends,
/// and the device waits for it at the O; a reload's copy goes on the copy lane
/// at the L, and the device goes on at once; a pair's forward waits for its
/// backward, the device's next action, and the pair starts when both halves
/// could; any other action runs alone, a backward no earlier than its stash's
/// reload. The replays differ only in how they find that start.
class ReplayLanes {
 protected:
  constexpr ReplayLanes(const ScheduleShape& s, const CostModel& cost, Trace& trace, StashFates fates)
      : cost_(cost), trace_(trace), transfer_(cost.transfer_time()), free_at_(s.devices, 0.0),
        lane_free_(s.devices, 0.0), copy_free_(s.devices, 0.0), kept_(s.devices, KeptCount{}),
        pair_forward_(s.devices, TraceEvent{}), fates_(std::move(fates)), chunks_(s.chunks),
        micro_batches_(s.micro_batches) {
    if (fates_.any_offloaded()) {  // [2 * (device, chunk, micro-batch) + pair]: its offload's copy, its reload's end
      const int n = s.devices * s.chunks * s.micro_batches;
      offload_start_ = Buffer<double>(2 * n, 0.0);
      offload_end_ = Buffer<double>(2 * n, 0.0);
      reload_end_ = Buffer<double>(2 * n, 0.0);
      input_done_ = Buffer<unsigned char>(n, 0);
    }
  }

  /// Places device d's action `a` (its step, or its index in the program, t),
  /// of virtual stage `stage`, that could start at `start`; the device is free
  /// again at free_at_[d]. Returns the action's end: a reduction's on the
  /// collective lane; for a pair's forward its start (its end is the pair's,
  /// returned with its backward).
  constexpr double place(int d, int t, const Action& a, int stage, double start) {
    if (is_collective(a.phase)) {  // beside the compute: the device goes on at once
      const double at = std::max(start, lane_free_[d]);
      lane_free_[d] = at + cost_.reduce;
      trace_.collective[static_cast<std::size_t>(d)].push_back({d, t, a, stage, at, lane_free_[d]});
      free_at_[d] = start;
      return lane_free_[d];
    }
    if (is_copy(a.phase)) {
      const bool window = input_done_[at(d, a)] != 0;  // after its I: the weight window's pair
      const int i = 2 * at(d, a) + (window ? 1 : 0);
      const bool offloads = phase_row(a.phase).offloads;
      const TraceEvent e = offloads ? TraceEvent{d, t, a, stage, offload_start_[i], offload_end_[i]}  // issued at its F (I)
                                    : issue_copy(d, t, a, stage, start, window);
      if (!offloads) reload_end_[i] = e.end;
      trace_.copies[static_cast<std::size_t>(d)].push_back(e);
      count(d, a, stage);
      free_at_[d] = offloads ? std::max(start, e.end) : start;  // the device waits for an offload's copy
      return e.end;
    }
    if (const int pair = copy_pair(d, a, false); pair >= 0)
      start = std::max(start, reload_end_[2 * at(d, a) + pair]);  // its stash back on the device
    TraceEvent& forward = pair_forward_[d];
    double end = start;
    if (a.overlaps_next) {  // a pair's forward: it starts with its backward
      forward = {d, t, a, stage, start, start};
    } else if (forward.action.overlaps_next && forward.step == t - 1) {
      end = run_pair(forward, {d, t, a, stage, 0, 0}, std::max(start, forward.start));
      forward.action = Action{};
    } else {
      end = start + cost_.compute_time(d, stage, a.phase);
      record_compute({d, t, a, stage, start, end});
    }
    free_at_[d] = end;
    return end;
  }

  const CostModel& cost_;
  Trace& trace_;
  double transfer_;  // of one message
  Buffer<double> free_at_;  // [device]: when it can start its next action

 private:
  // The index of (device, chunk, micro-batch) in the copy tables.
  constexpr int at(int d, const Action& a) const { return (d * chunks_ + a.chunk) * micro_batches_ + a.micro_batch; }
  // The copy pair of device d's (chunk, micro-batch) whose offload its compute action `a` issues (`opens`: its
  // F, the pair before the backward, 0; its I, the weight window's, 1) or whose reload it waits for (its B or I:
  // 0; its W: 1); -1 for none.
  constexpr int copy_pair(int d, const Action& a, bool opens) const {
    const bool before = fates_.offloaded(d, a.chunk, a.micro_batch);
    const bool window = fates_.weight_window(d, a.chunk, a.micro_batch);
    if (opens) return before && a.phase == Phase::kForward ? 0 : window && a.phase == Phase::kBackwardInput ? 1 : -1;
    return before && makes_input_gradient(a.phase) ? 0 : window && a.phase == Phase::kBackwardWeight ? 1 : -1;
  }
  // Puts a copy of device d's stash of `a`'s (chunk, micro-batch) on its copy lane, issued at `issued` (in the
  // weight window, with the output gradient).
  constexpr TraceEvent issue_copy(int d, int t, const Action& a, int stage, double issued, bool window) {
    const double begin = std::max(issued, copy_free_[d]);
    copy_free_[d] = begin + cost_.copy_time(stage, window);
    return {d, t, a, stage, begin, copy_free_[d]};
  }
  // Counts what device d keeps after its action `a` of virtual stage `stage`.
  constexpr void count(int d, const Action& a, int stage) {
    KeptCount& k = kept_[d];
    k.after(a, cost_.memory.of(stage), fates_.recomputed(d, a.chunk, a.micro_batch),
            is_copy(a.phase) && input_done_[at(d, a)] != 0);
    trace_.peak_activations[static_cast<std::size_t>(d)] = k.peak_stashes;
    trace_.peak_memory[static_cast<std::size_t>(d)] = k.peak_memory;
  }
  // Adds a compute event to the trace and counts what its device keeps; the
  // forward (or I) after which the program offloads a stash issues the copy.
  constexpr void record_compute(const TraceEvent& e) {
    trace_.compute[static_cast<std::size_t>(e.device)].push_back(e);
    count(e.device, e.action, e.stage);
    if (const int pair = copy_pair(e.device, e.action, true); pair >= 0) {
      const int i = 2 * at(e.device, e.action) + pair;
      const TraceEvent copy = issue_copy(e.device, e.step, e.action, e.stage, e.end, pair == 1);
      offload_start_[i] = copy.start;
      offload_end_[i] = copy.end;
    }
    if (e.action.phase == Phase::kBackwardInput && input_done_.size() > 0) input_done_[at(e.device, e.action)] = 1;
  }
  // Adds an overlapped pair, its halves' events starting at `start`, and returns its end.
  constexpr double run_pair(const TraceEvent& forward, const TraceEvent& backward, double start) {
    const TraceEvent halves[2] = {forward, backward};
    const double f = cost_.compute_time(halves[0]), b = cost_.compute_time(halves[1]);
    const double stretch = cost_.pair_stretch(f, b);
    for (TraceEvent e : halves) {
      e.start = start;
      e.end = start + cost_.compute_time(e) * stretch;
      record_compute(e);
    }
    return start + cost_.pair_time(f, b);
  }

  Buffer<double> lane_free_;         // [device]: when its collective lane is free
  Buffer<double> copy_free_;         // [device]: when its copy lane is free
  Buffer<KeptCount> kept_;           // [device]: what it keeps
  Buffer<TraceEvent> pair_forward_;  // [device]: the forward of the pair it is running (flagged), or F0.0
  StashFates fates_;                 // what the program recomputes and offloads: the memory its forwards keep
  int chunks_, micro_batches_;
  Buffer<double> offload_start_, offload_end_, reload_end_;  // [2 * (device, chunk, micro-batch) + pair], where it offloads
  Buffer<unsigned char> input_done_;  // [(device, chunk, micro-batch)]: its I has run (where it offloads)
};

/// The steps replay, as the observer of the verifier's rendezvous run of the
/// steps (StepRun): a step's group starts when its device posts it (the end of
/// its previous step), each transfer once both sides are posted, and the group
/// ends when its last transfer does; then the step's action runs. The run only
/// matches operations of the two devices' current steps, so per-device state is
/// all the replay keeps.
class StepsReplay : ReplayLanes {
 public:
  constexpr StepsReplay(const ScheduleShape& s, const CostModel& cost, Trace& trace, StashFates fates)
      : ReplayLanes(s, cost, trace, std::move(fates)), s_(s), begin_(s.devices), ready_(s.devices), sends_(s.devices),
        recvs_(s.devices) {}

  constexpr void posted(int d, int) {
    begin_[d] = ready_[d] = free_at_[d];
    sends_[d] = recvs_[d] = 0;
  }
  constexpr void matched(int from, int to) {
    const double end = std::max(begin_[from], begin_[to]) + transfer_;
    ready_[from] = std::max(ready_[from], end);
    ready_[to] = std::max(ready_[to], end);
    ++sends_[from];
    ++recvs_[to];
  }
  constexpr void completed(int d, int t, bool has_compute, const Action& a, int ops) {
    if (ops > 0) trace_.comm[static_cast<std::size_t>(d)].push_back({d, t, sends_[d], recvs_[d], begin_[d], ready_[d]});
    if (has_compute) place(d, t, a, s_.stage_of(d, a.chunk), ready_[d]);  // a pair's backward step has no group
    else free_at_[d] = ready_[d];
  }

 private:
  const ScheduleShape& s_;
  Buffer<double> begin_, ready_;  // [device]: its current group's posting and end
  Buffer<int> sends_, recvs_;
};

/// The dataflow replay, as the observer of the verifier's run of the actions
/// (run_dataflow): each action starts when its device is free and its inputs
/// have arrived (the producer's end, plus the transfer across devices).
class DataflowReplay : ReplayLanes {
 public:
  constexpr DataflowReplay(const ScheduleShape& s, const CostModel& cost, Trace& trace, StashFates fates)
      : ReplayLanes(s, cost, trace, std::move(fates)), finish_(s.action_count()) {}

  constexpr void operator()(int d, int k, const Action& a, const FlowRow& f) {
    const int m = a.micro_batch;
    double start = free_at_[d];
    for (int i = 0; i < f.needs; ++i)  // none for a reduction
      start = std::max(start, finish_[f.need[i] + m] + (f.need_device[i] == d ? 0.0 : transfer_));
    const double end = place(d, k, a, f.stage, start);
    if (a.overlaps_next) {  // its result is the pair's, made with its backward: observed next
      pair_self_ = f.self + m;
      return;
    }
    if (pair_self_ >= 0) finish_[std::exchange(pair_self_, -1)] = end;
    finish_[f.self + m] = end;
  }

 private:
  Buffer<double> finish_;  // end time of each result (ScheduleShape::action_index()) made
  int pair_self_ = -1;     // the result of the pair's forward placed last, until its backward comes
};

/// "simulate: the program is not correct: <what verify() says>".
constexpr Text not_correct(const VerifyResult& r) {
  Text t("simulate: the program is not correct: ");
  t << r.message;
  return t;
}

/// `t`, once its times are sound: every time finite, and every action lasting
/// what `cost` says (to 0.1%). A cost model can be usable term by term and still
/// overflow (a huge cost over a tiny speed, a sum of huge costs), or mix
/// magnitudes so far apart that a double loses the small ones (a latency of
/// 1e300 swallows a forward of 1); the metrics of such a trace would be wrong.
constexpr Trace checked_times(Trace t, const CostModel& cost) {
  auto finite = [](double x) { return x - x == 0; };  // false for inf and NaN
  bool ok = true;
  const TraceEvent* lost = nullptr;  // the first action whose duration is lost
  for (const auto& device : t.compute) {
    const std::size_t n = device.size();
    for (std::size_t k = 0; k < n; ++k) {
      const TraceEvent& e = device[k];
      ok = ok && finite(e.start) && finite(e.end);
      // A pair's halves: each its own cost, stretched (see ReplayLanes::run_pair()).
      const bool first_half = e.action.overlaps_next && k + 1 < n, second_half = k > 0 && device[k - 1].action.overlaps_next;
      double want = cost.compute_time(e);
      if (first_half || second_half) {
        const TraceEvent& forward = first_half ? e : device[k - 1];
        want *= cost.pair_stretch(cost.compute_time(forward), cost.compute_time(device[first_half ? k + 1 : k]));
      }
      const double off = e.end - e.start - want;
      if (lost == nullptr && (off > 1e-3 * want || -off > 1e-3 * want)) lost = &e;
    }
  }
  for (const auto& device : t.comm)
    for (const CommEvent& e : device) ok = ok && finite(e.start) && finite(e.end);
  for (const SideLane& lane : kSideLanes)
    for (const auto& device : lane.events(t))
      for (const TraceEvent& e : device) ok = ok && finite(e.start) && finite(e.end);
  if (!ok)
    throw Error("simulate: the cost model's times overflow (a cost divided by a device speed, or a sum of costs, "
                "exceeds the largest double); use smaller costs or larger speeds");
  if (lost != nullptr) {
    Text m("simulate: the cost model's times span more than a double resolves: the duration of ");
    append_token(m, lost->action) << " on device " << lost->device
                                  << " is lost in the times around it; use costs of closer magnitudes";
    throw Error(m.str());
  }
  return t;
}

/// Verifies a program of actions and replays it in the same run: the steps
/// replay on its lowering (never stored, or `fixed`: a compile-time schedule's
/// stored one), or the dataflow replay.
template <class Fixed = std::nullptr_t>
constexpr Trace simulate_table(const ActionTable& table, std::size_t device_lists, const CostModel& cost,
                               const Fixed* fixed = nullptr) {
  const ScheduleShape& s = table.shape;
  if (Text e = shape_problem(s, device_lists, "action"); !e.empty()) {
    Text t("simulate: ");
    t << e;
    throw Error(t.str());
  }
  const Text cost_error = cost_model_error(cost, s.devices, s.stages());
  Trace trace = empty_trace(s, TraceSource::kSimulated, "units");
  for (int d = 0; d < s.devices; ++d) {  // an event per action, and about one P2P group per action
    trace.compute[static_cast<std::size_t>(d)].reserve(static_cast<std::size_t>(table.counts[d]));
    if (cost.replay == ReplayMode::kSteps)
      trace.comm[static_cast<std::size_t>(d)].reserve(static_cast<std::size_t>(step_capacity(table.counts[d])));
  }
  NoObserver none;
  VerifyResult r;
  StashFates fates(s);
  for (int d = 0; d < s.devices; ++d)
    for (int k = 0; k < table.counts[d]; ++k) fates.mark(d, table.rows[d][k]);
  if (cost.replay == ReplayMode::kDataflow) {
    if (cost_error.empty()) r = check_actions(table, DataflowReplay(s, cost, trace, std::move(fates)));
    else r = check_actions(table, none);
  } else if (cost_error.empty()) {
    StepsReplay replay(s, cost, trace, std::move(fates));
    if constexpr (std::is_same_v<Fixed, std::nullptr_t>) r = verify_table(table, replay);
    else r = verify_fixed(table, *fixed, replay);
  } else {
    if constexpr (std::is_same_v<Fixed, std::nullptr_t>) r = verify_table(table, none);
    else r = verify_fixed(table, *fixed, none);
  }
  if (!r) throw Error(not_correct(r).str());
  if (!cost_error.empty()) throw Error(cost_error.str());
  return checked_times(std::move(trace), cost);
}

}  // namespace detail

/// Simulates a lowered program under a cost model (always ReplayMode::kSteps, as
/// a lowered program has no other replay). Throws pipeweave::Error when the program
/// fails verify() (the message is verify()'s), the cost model is unusable, or its
/// times overflow or lose the actions' durations (detail::checked_times).
constexpr Trace simulate(const LoweredProgram& lp, const CostModel& cost = {}) {
  const Text cost_error = cost_model_error(cost, lp.shape.devices, lp.shape.stages());
  if (!cost_error.empty() || !detail::shape_problem(lp.shape, lp.devices.size(), "step").empty()) {
    if (VerifyResult r = verify(lp); !r) throw Error(detail::not_correct(r).str());
    throw Error(cost_error.str());
  }
  Trace trace = empty_trace(lp.shape, TraceSource::kSimulated, "units");
  for (std::size_t d = 0; d < lp.devices.size(); ++d) {  // at most an event and a P2P group per step
    trace.compute[d].reserve(lp.devices[d].size());
    trace.comm[d].reserve(lp.devices[d].size());
  }
  StashFates fates(lp.shape);
  for (std::size_t d = 0; d < lp.devices.size(); ++d)
    for (const Step& step : lp.devices[d])
      if (step.has_compute) fates.mark(static_cast<int>(d), step.compute);
  detail::StepsReplay replay(lp.shape, cost, trace, std::move(fates));
  if (VerifyResult r = detail::verify_lowered(lp, replay); !r) throw Error(detail::not_correct(r).str());
  return detail::checked_times(std::move(trace), cost);
}

/// Simulates a program: lowers it (see lower()) and replays the steps, or replays
/// its actions as dataflow, as `cost.replay` says. Throws pipeweave::Error when the
/// program fails verify(), the cost model is unusable, or its times overflow or
/// lose the actions' durations.
constexpr Trace simulate(const Program& p, const CostModel& cost = {}) {
  return detail::simulate_table(detail::action_table(p), p.devices.size(), cost);
}

/// Simulates a compile-time schedule: `simulate(Interleaved1F1B<4, 2, 8>{})`.
/// It reads the schedule's arrays in place.
template <StaticScheduleType S>
constexpr Trace simulate(const S&, const CostModel& cost = {}) {
  if constexpr (requires { typename S::Base; S::lowered().complete; })
    return detail::simulate_table(detail::static_table<S>(), S::actions.size(), cost, &S::lowered());
  else
    return detail::simulate_table(detail::static_table<S>(), S::actions.size(), cost);
}

}  // namespace pipeweave
