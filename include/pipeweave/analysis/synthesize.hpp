#pragma once
/// \file
/// Schedule synthesis: the fastest program found for a shape, measured costs
/// and a cap on each device's memory, verified, with a lower bound beside it.
///
/// \code
/// pipeweave::CostModel cost;                       // F 1, B 2 (I 1 + W 1)
/// cost.stage_costs.assign(8, {1, -1, 1, 1});
/// cost.stage_costs.back() = {1.3, -1, 1.3, 1.3};  // the last stage carries the loss
/// const pipeweave::Synthesis s = pipeweave::synthesize({pipeweave::ScheduleKind::kAuto, 4, 2, 16}, cost, {.memory = 8});
/// // s.program verifies, keeps at most 8 activations per device, and s.makespan <= every built-in that fits.
/// \endcode
///
/// The search (docs/schedules.md says why each part is there):
/// - **Candidates from a list scheduler.** It runs the devices on the cost
///   model's clock: a free device starts one of its ready actions (each
///   stage's forwards, backwards and weight halves in micro-batch order) by a
///   policy: whether backwards are split into I and W, how many micro-batches a
///   device may hold at once (a window scaled by its distance from the last
///   device), how far W may lag behind its I, which forward goes first (the
///   deepest stage, or the oldest micro-batch), whether a ready backward goes
///   before a ready forward, and whether a result reaches another device as
///   soon as it is made or, as lower() delivers it, once both devices are
///   between actions (rendezvous). A memory cap is kept by construction: a
///   device admits a new micro-batch only when everything it holds, plus what
///   its micro-batches in flight will still stash there, plus the V stashes of
///   the new one, fits; a backward that would pass the cap runs whole (B)
///   rather than split, and pending W run first when a forward waits for room.
///   Every micro-batch admitted can thus finish, so no policy deadlocks.
///   Where offload is allowed, each policy runs once more offloading on the
///   same clock: where room is short (for a forward, or a reload), the device
///   first sends to host memory what it holds that is read last (weight
///   windows, then stashes), and brings each back when it is read next and
///   there is room, or, making room, when the gradient its backward reads is on
///   its way (a window when the device is idle); each copy is booked on the
///   device's copy lane, so the order it writes down waits for copies where
///   they cost time and places them beside the compute where they do not.
///   Allowed to recompute as well, these policies run under the smallest cap
///   without recomputation at least, as the others do.
/// - **The built-in orders** of the shape's placement (every generated kind
///   whose rules the shape meets), as further candidates.
/// - **Overlapped pairs**: each built-in order once more through overlap(),
///   and each list candidate too where the overlap efficiency is above 0 or
///   transfers cost (a pair is one step fewer to meet at).
/// - **Reference clocks**: the best candidates again with their steps planned
///   on the costs' own ratios (Program::lowering), and on a clock per stage
///   where the stages' costs differ (Program::stage_lowering).
/// - **Local search** on the best candidate: two neighbouring actions of a
///   device swapped (the W first), kept when the makespan drops, for the rest
///   of the work budget.
/// Every candidate is verified and replayed by simulate() (its replay: the
/// lowered steps by default, as the executors run them), and measured by its
/// peak memory as the simulator counts it; the fastest that fits wins (ties:
/// the lower peak, then the first found). The search is deterministic: its
/// budget counts simulated actions, not seconds.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What a synthesized program must respect, and how much search it may take.
struct SynthesisLimits {
  /// Cap on each device's peak memory, counted as the simulator's peak memory
  /// is (stashes plus the gradients kept from an I to its W) in the cost
  /// model's memory model (CostModel::memory; by default in activations); 0: no cap.
  double memory = 0;
  /// Micro-batches may be recomputed (C, with_recompute()) to meet the cap:
  /// a candidate that passes it recomputes what recompute_to_fit() chooses.
  /// Off by default: a problem without it gets what it got before.
  bool recompute = false;
  /// Stashes may be offloaded to host memory (O, L; with_offload()) to meet
  /// the cap, timed on the cost model's copy lane (CostModel::copy_bandwidth):
  /// the list scheduler's policies run once more offloading where room is
  /// short, on their clock (see the file comment); a candidate that passes
  /// the cap (any other, or one of those under a cap raised for recomputation,
  /// or overlapped) offloads what offload_to_fit() chooses, and with
  /// `recompute` also, of what still passes, recomputes what recompute_to_fit()
  /// chooses; the fastest repair wins. With `recompute` and a cap, the search
  /// also runs with recomputation alone and keeps the faster program (twice
  /// the work), so that allowing offload never costs time. Off by default.
  /// The smallest cap accepted stays smallest_memory_limit()'s.
  bool offload = false;
  /// Backwards may be split into I and W.
  bool split_backward = true;
  /// Overlapped pairs may be used.
  bool pairs = true;
  /// The search's budget in simulated actions; 0: kDefaultSynthesisWork.
  long long work = 0;
};

/// The default budget of the search: about 0.5 s on one core of a 2-core AMD
/// EPYC at P = 8, V = 2, M = 64 (bench/synthesis_bench).
inline constexpr long long kDefaultSynthesisWork = 2'000'000;

/// A built-in order as the search tried it: a candidate, and the mark to beat.
struct BuiltinCandidate {
  std::string name;  ///< its kind's name, with "+overlap" when overlapped; "" for none
  Program program;   ///< the kind's program, through overlap() for "+overlap"; it keeps its own kind
  double makespan = std::numeric_limits<double>::infinity();  ///< simulated under the cost model
};

/// A synthesized program and what the search knows of it.
struct Synthesis {
  Program program;                 ///< kind ScheduleKind::kAuto; it verifies and fits the cap
  double makespan = 0;             ///< simulated under the cost model
  double lower_bound = 0;          ///< synthesis_lower_bound() of the problem
  double peak_memory = 0;          ///< the most any device keeps, in activations
  std::string origin;              ///< the candidate it came from: a policy, or a built-in kind's name
  BuiltinCandidate best_builtin;   ///< the fastest built-in order that fits the cap (name "" when none does)
  int evaluated = 0;               ///< programs simulated
};

/// The smallest memory cap any program of the shape fits in, under a memory
/// model (by default V activations per device). Without recomputation: when a
/// micro-batch's forward reaches the last stage, each device holds a stash for
/// each of its V stages; a program that runs one micro-batch at a time, its
/// backwards whole, holds no more. With recomputation: each device holds its
/// stages' inputs of that micro-batch, and one stash restored at a time (the
/// largest: its stash beyond its input).
constexpr double smallest_memory_limit(const ScheduleShape& s, const MemoryModel& model = {}, bool recompute = false) {
  double most = 0;
  for (int d = 0; d < s.devices; ++d) {
    double held = 0, restored = 0;
    for (int c = 0; c < s.chunks; ++c) {
      const StashSize& z = model.of(s.stage_of(d, c));
      held += recompute ? z.input : z.stash;
      restored = std::max(restored, recompute ? z.stash - z.input : 0.0);
    }
    most = std::max(most, held + restored);
  }
  return most;
}

/// Describes what makes a problem unsolvable or malformed; empty when synthesize() can take it.
inline Text synthesis_error(const ScheduleShape& s, const CostModel& cost, const SynthesisLimits& limits) {
  Text t;
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1) {
    t << "synthesize: devices, chunks and micro-batches must be at least 1 (got " << s.devices << ", " << s.chunks
      << " and " << s.micro_batches << ")";
  } else if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 20)) {
    t << "synthesize: devices * chunks * micro-batches must be at most 2^20 (got "
      << static_cast<long long>(s.devices) * s.chunks * s.micro_batches << ")";
  } else if (Text e = cost_model_error(cost, s.devices, s.stages()); !e.empty()) {
    t << "synthesize: " << e;
  } else if (!(limits.memory >= 0) || !(limits.memory < 1e300)) {
    t << "synthesize: the memory limit must be at least 0 and finite (0: none; got " << format_number(limits.memory)
      << ")";
  } else if (const double least = smallest_memory_limit(s, cost.memory, limits.recompute);
             limits.memory > 0 && limits.memory < least * (1 - 1e-12)) {
    t << "synthesize: no schedule of " << s.devices << " devices x " << s.chunks << " chunks fits a memory limit of "
      << format_number(limits.memory) << (cost.memory == MemoryModel{} ? " activations" : " units")
      << " per device; the smallest feasible limit is " << format_number(least)
      << (limits.recompute ? " (each device's inputs of one micro-batch, with one of its stashes restored at a time)"
                           : " (one stash for each of a device's chunks while a micro-batch turns at the last stage)");
    if (!limits.recompute && smallest_memory_limit(s, cost.memory, true) < least)
      t << "; with recomputation allowed it is " << format_number(smallest_memory_limit(s, cost.memory, true));
  } else if (limits.work < 0) {
    t << "synthesize: the work budget must be at least 0 (0: the default; got " << limits.work << ")";
  }
  return t;
}

namespace detail {

/// The time of `phase` of stage `stage` on the device that holds it.
inline double stage_time(const ScheduleShape& s, const CostModel& c, int stage, Phase phase) {
  return c.compute_time(s.device_of_stage(stage), stage, phase);
}

/// The least a backward of `stage` costs in the search's choices: B, or where splitting is allowed
/// the halves B's row says it splits into (its fallback phases, I + W).
inline double least_backward(const ScheduleShape& s, const CostModel& c, int stage, bool split) {
  const double whole = stage_time(s, c, stage, Phase::kBackward);
  if (!split) return whole;
  const PhaseRow& b = phase_row(Phase::kBackward);
  double halves = 0;
  for (int k = 0; k < b.fallbacks; ++k) halves += stage_time(s, c, stage, b.fallback[k]);
  return std::min(whole, halves);
}

/// The transfer between stages `stage` and `stage + 1`: 0 when one device holds both.
inline double hop_time(const ScheduleShape& s, const CostModel& c, int stage) {
  return s.device_of_stage(stage) == s.device_of_stage(stage + 1) ? 0.0 : c.transfer_time();
}

}  // namespace detail

/// A lower bound on the makespan of every program of the shape under the cost
/// model, whatever the memory (docs/schedules.md):
/// - each device's work (M forwards and M backwards of each of its stages, the
///   cheaper of B and I + W where splitting is allowed) after the earliest a
///   forward can reach its first stage (the forwards and transfers before it);
///   without splitting, plus the backwards and transfers a backward of its
///   lowest stage still sets off below it (with splitting a W can end a device);
///   less what overlapped pairs can hide, the overlap efficiency times the
///   smaller of the device's forwards and its backwards (B or I);
/// - the device of stage 0 runs M forwards of it; the last of them must go
///   through every later stage's forward and every input gradient back (I, or B
///   without splitting), then stage 0's own backward.
inline double synthesis_lower_bound(const ScheduleShape& s, const CostModel& cost, const SynthesisLimits& limits = {}) {
  if (Text e = synthesis_error(s, cost, SynthesisLimits{.split_backward = limits.split_backward}); !e.empty())
    throw Error(e.str());
  const int S = s.stages();
  const double M = s.micro_batches;
  const bool split = limits.split_backward;
  std::vector<double> head(static_cast<std::size_t>(S), 0.0), below(static_cast<std::size_t>(S), 0.0);
  for (int st = 1; st < S; ++st) {
    head[st] = head[st - 1] + detail::stage_time(s, cost, st - 1, Phase::kForward) + detail::hop_time(s, cost, st - 1);
    below[st] = below[st - 1] + detail::stage_time(s, cost, st - 1, Phase::kBackward) + detail::hop_time(s, cost, st - 1);
  }
  const double e = limits.pairs ? cost.overlap_efficiency : 0.0;
  double bound = 0;
  for (int d = 0; d < s.devices; ++d) {
    double work = 0, forwards = 0, gradients = 0;
    int lowest = S;
    for (int c = 0; c < s.chunks; ++c) {
      const int st = s.stage_of(d, c);
      lowest = std::min(lowest, st);
      forwards += M * detail::stage_time(s, cost, st, Phase::kForward);
      gradients += M * std::min(detail::stage_time(s, cost, st, Phase::kBackward),
                                split ? detail::stage_time(s, cost, st, Phase::kBackwardInput) : 1e300);
      work += M * (detail::stage_time(s, cost, st, Phase::kForward) + detail::least_backward(s, cost, st, split));
    }
    // A pair hides e * min(F, its backward) at most: e times the smaller of all forwards and all backwards that pair.
    work -= e * std::min(forwards, gradients);
    bound = std::max(bound, head[lowest] + work + (split ? 0.0 : below[lowest]));
  }
  double chain = M * detail::stage_time(s, cost, 0, Phase::kForward) + detail::least_backward(s, cost, 0, split);
  for (int st = 1; st < S; ++st)
    chain += detail::stage_time(s, cost, st, Phase::kForward) +
             detail::stage_time(s, cost, st, split ? Phase::kBackwardInput : Phase::kBackward) +
             2 * detail::hop_time(s, cost, st - 1);
  return std::max(bound, chain);
}

namespace detail {

/// One policy of the list scheduler (see the file comment).
struct ListPolicy {
  bool split = true;           ///< split backwards into I and W
  double window_scale = 1;     ///< device d holds at most ceil(scale * (P - d)) + extra micro-batches...
  int window_extra = 0;
  bool unbounded = false;      ///< ...or any number
  int w_lag = 0;               ///< W run once more than this many wait on a device; < 0: only when nothing else is ready
  bool depth_first = true;     ///< a forward of the deepest ready stage first; else the oldest micro-batch
  bool backward_first = true;  ///< a ready backward before a ready forward
  /// A result reaches another device only at an instant when both devices are
  /// between actions, as lower() delivers it (steps planned on the costs then
  /// wait for nothing); else as soon as it is made (the dataflow clock).
  bool rendezvous = false;
  /// Which micro-batches a device admits recomputed (its forwards keep their inputs, and a C runs right
  /// before each of its backwards, which run whole): 0 none; 1 those whose stashes do not fit whole; 2
  /// every one, on the devices where the window's micro-batches would not fit whole.
  int recompute = 0;
  /// Stashes and weight windows go to host memory where room is short (O, L on the device's copy lane): a
  /// forward or a reload that would pass the cap first offloads what its device holds that is read last;
  /// what is away comes back (L) when it is read next on its stage and there is room, else, making room, a
  /// stash once the gradient its backward reads is on its way, a window when the device is idle. Its W are
  /// then not run first for room once the device has no forward left.
  bool offload = false;

  /// "split, window 1.5(P-d)+0, W lag 1, deepest forward first, backward first, rendezvous, room made by offload".
  std::string name() const {
    std::string n = split ? "split" : "whole backwards";
    n += unbounded ? ", window all" : ", window " + format_decimal(window_scale, 2) + "(P-d)+" + std::to_string(window_extra);
    if (split) n += w_lag < 0 ? ", W when idle" : ", W lag " + std::to_string(w_lag);
    n += depth_first ? ", deepest forward first" : ", oldest forward first";
    n += backward_first ? ", backward first" : ", forward first";
    if (rendezvous) n += ", rendezvous";
    if (recompute == 1) n += ", admitting recomputed what does not fit whole";
    if (recompute == 2) n += ", admitting all recomputed where the window does not fit whole";
    if (offload) n += ", room made by offload";
    return n;
  }
};

/// The list scheduler: runs the devices on the cost model's clock (each action
/// once its device is free and its inputs have arrived; an input from another
/// device arrives as the policy says, as soon as it is made or at the next
/// rendezvous) and writes down the order its policy chose, and when it ended on
/// that clock (without rendezvous and offload: the program's dataflow bound;
/// offloading, the copies are timed as booked, not as simulate() queues them).
/// Returns false if the policy stalls, which the admission rule prevents (an
/// offloading policy makes a reload's room from what is read after it; no run
/// of test_synthesize's grid of them stalls, and one that did would be left
/// out).
class ListScheduler {
 public:
  ListScheduler(const ScheduleShape& s, const CostModel& cost, double cap)
      : s_(s), cost_(cost), cap_(cap > 0 ? cap * (1 + 1e-12) : std::numeric_limits<double>::infinity()) {
    for (int st = 0; st < s.stages(); ++st)
      for (Phase p : all_phases()) time_.push_back(stage_time(s, cost, st, p));
  }

  bool run(const ListPolicy& policy, Program& out, double& finish) const {
    const ScheduleShape& s = s_;
    const int P = s.devices, V = s.chunks, M = s.micro_batches, S = s.stages();
    const double inf = std::numeric_limits<double>::infinity();
    out = Program{s, std::vector<std::vector<Action>>(static_cast<std::size_t>(P))};
    out.shape.kind = ScheduleKind::kAuto;
    auto at = [M](int row, int m) { return static_cast<std::size_t>(row) * static_cast<std::size_t>(M) + m; };
    // Per stage, the next micro-batch of each kind of action; per (stage, micro-batch), when its results are
    // made and when they are where their consumer runs.
    std::vector<int> next_f(S, 0), next_b(S, 0), next_w(S, 0);
    std::vector<double> f_end(at(S, 0), inf), b_end(at(S, 0), inf), f_there(at(S, 0), inf), b_there(at(S, 0), inf);
    std::vector<char> split_at(at(S, 0), 0);
    // Per device: when it is free, what it keeps (stashes + gradients), the W waiting, the micro-batches in
    // flight, the stashes those will still add; per (device, micro-batch), backwards (B or I) still to run.
    std::vector<double> free_at(P, 0.0);
    std::vector<KeptCount> kept(P);  // what each device keeps (KeptCount::memory)
    // Stashes (or inputs) to come; one micro-batch's stashes, all its stages', its inputs, and the most a C
    // restores; the micro-batches in flight recomputed, and which are.
    std::vector<double> future(P, 0.0), whole(P, 0.0), inputs(P, 0.0), restore(P, 0.0);
    std::vector<int> pending_w(P, 0), inflight(P, 0), inflight_recomputed(P, 0), window(P, M);
    std::vector<char> recomputed(at(P, 0), 0);
    for (int d = 0; d < P; ++d)
      for (int c = 0; c < V; ++c) {
        const StashSize& z = size(s.stage_of(d, c));
        whole[d] += z.stash;
        inputs[d] += z.input;
        restore[d] = std::max(restore[d], z.stash - z.input);
      }
    // Room for one more micro-batch on device d: whole, or recomputed (its inputs, and room for a C); while a
    // recomputed one is in flight the room for its C stays kept.
    auto reserve = [&](int d) { return inflight_recomputed[d] > 0 ? restore[d] : 0.0; };
    auto fits_whole = [&](int d) { return kept[d].memory + future[d] + whole[d] + reserve(d) <= cap_; };
    auto fits_recomputed = [&](int d) {
      return policy.recompute > 0 && kept[d].memory + future[d] + inputs[d] + restore[d] <= cap_;
    };
    std::vector<int> left_b(at(P, 0), -1);
    for (int d = 0; d < P; ++d)
      if (!policy.unbounded)
        window[d] = std::max(1, static_cast<int>(policy.window_scale * (P - d) + 0.999999) + policy.window_extra);
    std::vector<char> all_recomputed(P, 0);  // policy 2: the devices that admit every micro-batch recomputed
    for (int d = 0; d < P; ++d)
      all_recomputed[d] = policy.recompute == 2 && std::min(window[d], M) * whole[d] > cap_ ? 1 : 0;
    long long left = 2LL * S * M;  // forwards and backwards (B or I) still to run; W are counted in pending_w
    double now = 0;
    // Offload: per (stage, micro-batch) and pair (0: before its backward, 1: in its weight window, from its I
    // to its W) whether what the pair moves is on its device (0), away (1) or coming back (2), and when its
    // reload ends; per device the copies on its copy lane (from, to; in order) and its stages, shallowest first.
    auto pair_at = [&](int st, int m, int w) { return 2 * at(st, m) + static_cast<std::size_t>(w); };
    std::vector<char> away(2 * at(S, 0), 0);
    std::vector<double> reload_end(2 * at(S, 0), 0.0);
    std::vector<std::vector<std::pair<double, double>>> lane(P);
    // Books a copy of `length` on device d's copy lane in the first gap from `from` on; returns when it ends. An
    // offload's copy is issued when its forward ends, which may be long before the scheduler places its O.
    auto book = [&](int d, double from, double length) {
      auto it = lane[d].begin();
      for (; it != lane[d].end() && it->first < from + length; ++it) from = std::max(from, it->second);
      lane[d].insert(it, {from, from + length});
      return from + length;
    };
    std::vector<std::vector<int>> own(P);
    for (int d = 0; d < P; ++d) {
      for (int c = 0; c < V; ++c) own[d].push_back(s.stage_of(d, c));
      std::sort(own[d].begin(), own[d].end());
    }
    // Whether device d holds pair w of (stage q, micro-batch k), free to go: a stash whose forward ran and whose
    // backward has not begun, or a weight window whose I ran and whose W has not begun.
    auto movable = [&](int d, int q, int k, int w) {
      if (away[pair_at(q, k, w)] != 0 || offload_keeps_output(s, q)) return false;
      if (w == 0) return f_end[at(q, k)] != inf && k >= next_b[q] && recomputed[at(d, k)] == 0;
      return k < next_b[q] && k >= next_w[q] && split_at[at(q, k)] != 0;
    };
    // Whether pair pw of (stage q, micro-batch k) is read after pair w of (stage st, micro-batch m), as this
    // scheduler orders them: anything after a forward (m < 0); every weight window after a backward; a stash
    // after the stashes and windows of earlier micro-batches (a backward after the deeper stages' of its
    // micro-batch), a window after the windows of earlier ones.
    auto read_after = [&](int q, int k, int pw, int st, int m, int w) {
      if (m < 0 || (w == 0 && pw == 1)) return true;
      return k > m || (k == m && q < st && pw == w);
    };
    // Room on device d for `need` more than it keeps, made by offloading what it holds that is read last, and
    // after pair w of micro-batch m of stage st: weight windows first, then stashes, each the latest micro-batch
    // first (its shallowest stage first). Returns whether the room is there; with `place`, places those O (each
    // copy issued when its forward, or its I, ended; the device waits for it).
    auto make_room = [&](int d, double need, int st, int m, int w, bool place) {
      double over = kept[d].memory + need - cap_;
      std::vector<int> chosen;  // pair_at() of each
      for (int pw = 1; pw >= 0; --pw)
        for (int k = M - 1; k >= 0 && over > 0; --k)
          for (auto it = own[d].begin(); it != own[d].end() && over > 0; ++it) {
            const double freed = size(*it).stash + (pw == 1 ? size(*it).gradient : 0);
            if (freed <= 0 || !read_after(*it, k, pw, st, m, w) || !movable(d, *it, k, pw)) continue;
            over -= freed;
            chosen.push_back(static_cast<int>(pair_at(*it, k, pw)));
          }
      if (over > 0 || !place) return over <= 0;
      for (const int i : chosen) {
        const int q = i / 2 / M, k = i / 2 % M, pw = i % 2;
        const Action o = offload(s.chunk_of_stage(q), k);
        kept[d].after(o, size(q), false, pw == 1);
        out.devices[static_cast<std::size_t>(d)].push_back(o);
        away[static_cast<std::size_t>(i)] = 1;
        const double made_at = pw == 1 ? b_end[at(q, k)] : f_end[at(q, k)];
        free_at[d] = std::max(free_at[d], book(d, made_at, cost_.copy_time(q, pw == 1)));
      }
      return true;
    };
    // Device d's reloads of what is away and read next on its stage, each placed after its action under way (if
    // any): where there is room beside what its micro-batches in flight will still stash there; else where room
    // is made without that (their forwards make room in turn: what waits on the reload is older than they
    // are), for a stash once the gradient its backward reads is on its way (or at once on the last stage), for
    // a weight window while the device has nothing to run (`idle`). Returns when the first copy ends
    // (infinity: none placed).
    auto reload_due = [&](int d, bool idle) {
      double first = inf;
      for (const int st : own[d])
        for (int w = 0; w < 2; ++w) {
          const int m = w == 0 ? next_b[st] : next_w[st];
          if (m >= (w == 0 ? next_f[st] : next_b[st]) || away[pair_at(st, m, w)] != 1) continue;
          const double need = size(st).stash + (w == 1 ? size(st).gradient : 0);
          const bool waits = w == 0 ? st + 1 < S && b_there[at(st + 1, m)] == inf : !idle;
          if (kept[d].memory + future[d] + need > cap_ && (waits || !make_room(d, need, st, m, w, true))) continue;
          const Action l = reload(s.chunk_of_stage(st), m);
          kept[d].after(l, size(st), false, w == 1);
          out.devices[static_cast<std::size_t>(d)].push_back(l);
          away[pair_at(st, m, w)] = 2;
          reload_end[pair_at(st, m, w)] = book(d, std::max(now, free_at[d]), cost_.copy_time(st, w == 1));
          first = std::min(first, reload_end[pair_at(st, m, w)]);
        }
      return first;
    };
    // When what pair w of (stage st, micro-batch m) moves is on its device, from `r` on: never while it is away,
    // once its reload ends.
    auto back_by = [&](double r, int st, int m, int w) {
      const char a = away[pair_at(st, m, w)];
      return a == 0 ? r : a == 1 ? inf : std::max(r, reload_end[pair_at(st, m, w)]);
    };
    auto fits_offloading = [&](int d) {
      return policy.offload && make_room(d, future[d] + whole[d] + reserve(d), -1, -1, 0, false);
    };
    // Rendezvous: the results made for another device and not yet delivered (stage, micro-batch, gradient?),
    // and when each device last started an action (it is between actions then too).
    struct Message {
      int stage, micro_batch;
      bool gradient;
    };
    std::vector<Message> undelivered;
    std::vector<double> started(P, -1.0);
    auto between_actions = [&](int d) { return free_at[static_cast<std::size_t>(d)] <= now || started[d] == now; };
    // Action (stage, m) made its result, ending at `end`: it is there at once on the consumer's device (or
    // where none is), after the transfer on another (or, under rendezvous, once both devices meet).
    auto made = [&](int st, int m, bool gradient, double end) {
      const int to = gradient ? st - 1 : st + 1;
      std::vector<double>& there = gradient ? b_there : f_there;
      if (to < 0 || to >= S) there[at(st, m)] = end;
      else if (!policy.rendezvous || s.device_of_stage(to) == s.device_of_stage(st)) there[at(st, m)] = end + hop(gradient ? to : st);
      else undelivered.push_back({st, m, gradient});
    };
    // What an action needs of its own stage (a backward its forward, a W its I) is there once made; under
    // rendezvous once it has also left, as lower() has it.
    const std::vector<double>& f_own = policy.rendezvous ? f_there : f_end;
    const std::vector<double>& b_own = policy.rendezvous ? b_there : b_end;
    for (;;) {
      // Rendezvous: every result made by now moves where both of its devices are between actions.
      for (std::size_t i = 0; i < undelivered.size();) {
        const Message g = undelivered[i];
        const int to = g.gradient ? g.stage - 1 : g.stage + 1;
        if ((g.gradient ? b_end : f_end)[at(g.stage, g.micro_batch)] <= now && between_actions(s.device_of_stage(g.stage)) &&
            between_actions(s.device_of_stage(to))) {
          (g.gradient ? b_there : f_there)[at(g.stage, g.micro_batch)] = now + hop(g.gradient ? to : g.stage);
          undelivered[i] = undelivered.back();
          undelivered.pop_back();
        } else {
          ++i;
        }
      }
      bool weights = false;
      for (int d = 0; d < P; ++d) weights = weights || pending_w[d] > 0;
      if (left == 0 && !weights) {
        finish = *std::max_element(free_at.begin(), free_at.end());
        return true;
      }
      bool acted = false;
      double next = inf;
      for (int d = 0; d < P; ++d) {
        if (free_at[d] > now) {
          next = std::min(next, free_at[d]);
          continue;
        }
        if (policy.offload) next = std::min(next, reload_due(d, false));  // the copy beside what runs next
        int bf = -1, bb = -1, bw = -1;  // the stage of the best forward, backward and W candidate
        double rf = inf, rb = inf, rw = inf;
        for (int c = 0; c < V; ++c) {
          const int st = s.stage_of(d, c);
          if (const int m = next_f[st]; m < M) {
            const double r = st == 0 ? 0.0 : f_there[at(st - 1, m)];
            const bool admitted = left_b[at(d, m)] >= 0;
            const bool fits = admitted ? !policy.offload || make_room(d, future[d], -1, -1, 0, false)
                                       : inflight[d] < window[d] && ((!all_recomputed[d] && fits_whole(d)) ||
                                                                     fits_recomputed(d) || fits_offloading(d));
            if (fits && better_forward(policy, st, m, r, bf, bf < 0 ? 0 : next_f[bf], rf, now)) {
              bf = st;
              rf = r;
            }
          }
          if (const int m = next_b[st]; m < next_f[st]) {
            double r = f_own[at(st, m)];
            if (st + 1 < S) r = std::max(r, b_there[at(st + 1, m)]);
            r = back_by(r, st, m, 0);
            if (better_backward(st, m, r, bb, bb < 0 ? 0 : next_b[bb], rb, now)) {
              bb = st;
              rb = r;
            }
          }
          if (const int m = next_w[st]; m < next_b[st]) {
            if (const double r = back_by(b_own[at(st, m)], st, m, 1); r < rw) {
              bw = st;
              rw = r;
            }
          }
        }
        const bool f_now = rf <= now, b_now = rb <= now, w_now = rw <= now;
        // Offloading, a W waits for idle time once the device has no forward left: its window goes away where
        // room is short.
        bool forwards_left = false;
        for (const int st : own[d]) forwards_left = forwards_left || next_f[st] < M;
        const bool w_due = w_now && ((!fits_whole(d) && (!policy.offload || forwards_left)) ||
                                     (policy.w_lag >= 0 && pending_w[d] > policy.w_lag));
        // What runs: a W that is due, else a ready backward (first, if the policy says so), a ready forward,
        // a ready W. A backward runs as its input half I where splitting is allowed and I's kept gradient fits.
        std::optional<Phase> phase;
        if (w_due) phase = Phase::kBackwardWeight;
        else if (b_now && (policy.backward_first || !f_now)) phase = Phase::kBackward;
        else if (f_now) phase = Phase::kForward;
        else if (w_now) phase = Phase::kBackwardWeight;
        if (!phase) {
          next = std::min({next, rf, rb, rw});
          continue;
        }
        const int st = *phase == Phase::kForward ? bf : *phase == Phase::kBackward ? bb : bw, c = s.chunk_of_stage(st);
        int m = 0;
        double start = now;  // of the action, after the C a recomputed backward needs first
        if (*phase == Phase::kForward) {
          m = next_f[st]++;
          if (left_b[at(d, m)] < 0) {  // admits the micro-batch: V stashes (or inputs) and V backwards to come here
            bool whole_fits = !all_recomputed[d] && fits_whole(d);
            if (!whole_fits && policy.offload)
              whole_fits = make_room(d, future[d] + whole[d] + reserve(d), -1, -1, 0, true);
            recomputed[at(d, m)] = whole_fits ? 0 : 1;
            left_b[at(d, m)] = V;
            future[d] += whole_fits ? whole[d] : inputs[d];
            ++inflight[d];
            inflight_recomputed[d] += whole_fits ? 0 : 1;
          } else if (policy.offload) {
            make_room(d, future[d], -1, -1, 0, true);  // the room a reload took meanwhile
          }
          future[d] -= recomputed[at(d, m)] ? size(st).input : size(st).stash;
        } else if (*phase == Phase::kBackward) {
          m = next_b[st]++;
          const bool again = recomputed[at(d, m)] != 0;
          if (again) {  // its C first: the stash back, right before the backward, which then runs whole
            const Action r = recompute(c, m);
            kept[d].after(r, size(st), true);
            out.devices[static_cast<std::size_t>(d)].push_back(r);
            start += time(st, r.phase);
          }
          const bool split = policy.split && !again && kept[d].memory + future[d] + size(st).gradient + reserve(d) <= cap_;
          split_at[at(st, m)] = split ? 1 : 0;
          if (split) phase = Phase::kBackwardInput;
          pending_w[d] += split ? 1 : 0;
          if (--left_b[at(d, m)] == 0) {
            --inflight[d];
            inflight_recomputed[d] -= again ? 1 : 0;
          }
        } else {
          m = next_w[st]++;
          --pending_w[d];
        }
        const Action a{*phase, c, m};
        kept[d].after(a, size(st), recomputed[at(d, m)] != 0);
        start = std::max(start, free_at[d]);  // after the copies of the offloads placed before it
        const double end = start + time(st, a.phase);
        // A forward's activation goes down the stages, a backward's input gradient up; a W sends nothing.
        if (const int direction = phase_row(a.phase).flow.direction; direction != 0) {
          (direction > 0 ? f_end : b_end)[at(st, m)] = end;
          made(st, m, direction < 0, end);
          --left;
        }
        while (next_w[st] < next_b[st] && !split_at[at(st, next_w[st])]) ++next_w[st];  // whole backwards have no W
        out.devices[static_cast<std::size_t>(d)].push_back(a);
        started[d] = now;
        free_at[d] = end;
        next = std::min(next, end);
        acted = true;
      }
      for (int d = 0; d < P && policy.offload; ++d) {
        const double first = reload_due(d, free_at[d] <= now);
        if (first == inf) continue;
        acted = true;
        next = std::min({next, first, free_at[d] > now ? free_at[d] : inf});
      }
      if (!acted && next == inf) return false;  // stalled: nothing runs and nothing will arrive
      now = std::max(now, next);
    }
  }

 private:
  double time(int stage, Phase p) const {
    return time_[static_cast<std::size_t>(stage) * kPhases + static_cast<std::size_t>(p)];
  }
  double hop(int stage) const { return hop_time(s_, cost_, stage); }
  const StashSize& size(int stage) const { return cost_.memory.of(stage); }

  /// Ready ones first; among them the policy's order; among the others the earliest.
  static bool better_forward(const ListPolicy& policy, int st, int m, double r, int best_st, int best_m, double best_r,
                             double now) {
    if (best_st < 0) return true;
    const bool ready = r <= now, best_ready = best_r <= now;
    if (ready != best_ready) return ready;
    if (!ready) return r < best_r;
    if (policy.depth_first) return st > best_st || (st == best_st && m < best_m);
    return m < best_m || (m == best_m && st > best_st);
  }
  /// Ready ones first, the oldest micro-batch, then the deepest stage; among the others the earliest.
  static bool better_backward(int st, int m, double r, int best_st, int best_m, double best_r, double now) {
    if (best_st < 0) return true;
    const bool ready = r <= now, best_ready = best_r <= now;
    if (ready != best_ready) return ready;
    if (!ready) return r < best_r;
    return m < best_m || (m == best_m && st > best_st);
  }

  const ScheduleShape& s_;
  const CostModel& cost_;
  double cap_;
  std::vector<double> time_;
};

/// The policies the search tries, in order.
inline std::vector<ListPolicy> list_policies(const SynthesisLimits& limits) {
  std::vector<ListPolicy> out;
  for (const bool split : {true, false}) {
    if (split && !limits.split_backward) continue;
    for (const int w_lag : split ? std::vector<int>{-1, 0, 1, 2, 4} : std::vector<int>{0}) {
      for (const double scale : {1.0, 1.5, 2.0, 3.0, 0.0}) {
        for (const int extra : scale == 0.0 ? std::vector<int>{0} : std::vector<int>{0, 1}) {
          for (const bool depth_first : {true, false}) {
            for (const bool backward_first : {true, false}) {
              for (const bool rendezvous : {false, true}) {
              ListPolicy p;
              p.split = split;
              p.w_lag = w_lag;
              p.unbounded = scale == 0.0;
              p.window_scale = scale;
              p.window_extra = extra;
              p.depth_first = depth_first;
              p.backward_first = backward_first;
              p.rendezvous = rendezvous;
              out.push_back(p);
              for (int recompute = 1; recompute <= 2 && limits.recompute && limits.memory > 0; ++recompute) {
                p.recompute = recompute;  // the same, recomputing
                out.push_back(p);
              }
              if (limits.offload && limits.memory > 0) {
                p.recompute = 0;  // the same, offloading
                p.offload = true;
                out.push_back(p);
              }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

/// One micro-batch at a time: each device runs micro-batch m's forwards of its
/// stages in model order, then their whole backwards in reverse, before m + 1.
/// It holds one micro-batch's stashes per device, the least any program holds.
inline Program one_at_a_time(const ScheduleShape& s) {
  Program p{s, std::vector<std::vector<Action>>(static_cast<std::size_t>(s.devices))};
  for (int d = 0; d < s.devices; ++d) {
    std::vector<int> chunks(static_cast<std::size_t>(s.chunks));  // in model order
    for (int c = 0; c < s.chunks; ++c) chunks[static_cast<std::size_t>(c)] = c;
    std::sort(chunks.begin(), chunks.end(), [&](int a, int b) { return s.stage_of(d, a) < s.stage_of(d, b); });
    auto& row = p.devices[static_cast<std::size_t>(d)];
    for (int m = 0; m < s.micro_batches; ++m) {
      for (const int c : chunks) row.push_back(fwd(c, m));
      for (auto c = chunks.rbegin(); c != chunks.rend(); ++c) row.push_back(bwd(*c, m));
    }
  }
  return p;
}

/// The search's state: the best program so far and the budget left.
class Search {
 public:
  Search(const ScheduleShape& s, const CostModel& cost, const SynthesisLimits& limits)
      : cost_(cost), cap_(limits.memory), recompute_(limits.recompute), offload_(limits.offload),
        budget_(limits.work > 0 ? limits.work : kDefaultSynthesisWork), size_(3LL * s.stages() * s.micro_batches) {}

  bool budget_left() const { return spent_ < budget_; }
  int evaluated() const { return evaluated_; }

  /// Simulates a candidate; returns its makespan, or infinity when it fails verify() or passes the cap.
  double evaluate(const Program& p, double* peak = nullptr) {
    spent_ += size_;
    ++evaluated_;
    try {
      const Trace t = simulate(p, cost_);
      double most = 0;
      for (double m : t.peak_memory) most = std::max(most, m);
      if (peak != nullptr) *peak = most;
      if (over_cap(most)) return std::numeric_limits<double>::infinity();
      return makespan(t);
    } catch (const Error&) {
      return std::numeric_limits<double>::infinity();
    }
  }

  /// Keeps `p` when it is faster than the best so far (or as fast with a lower peak); where `p` passes the
  /// cap and recomputation or offload is allowed, the fastest of its repairs instead: `p` with the
  /// offloads offload_to_fit() chooses, then the recomputations recompute_to_fit() chooses for what still
  /// passes, or with recomputations alone. Returns whether it did; `span`, when given, gets its makespan
  /// (infinity: it fails or passes the cap), and `kept`, when given, the program measured (`p`, or a repair).
  bool offer(const Program& p, const std::string& origin, double* span_out = nullptr, Program* kept = nullptr) {
    double peak = 0;
    double span = evaluate(p, &peak);
    const Program* measured = &p;
    std::optional<Program> repaired;
    if (span == std::numeric_limits<double>::infinity() && (recompute_ || offload_) && over_cap(peak) &&
        verify_actions(p)) {
      auto consider = [&](std::optional<Program> q) {
        spent_ += size_;  // a repair walks the program about once per action it adds
        if (!q) return;
        double q_peak = 0;
        const double q_span = evaluate(*q, &q_peak);
        // As fast: fewer copies first, then the lower peak (as the best is chosen below).
        const int q_copies = offloads(*q), copies = repaired ? offloads(*repaired) : 0;
        if (q_span < span || (q_span == span && q_span < std::numeric_limits<double>::infinity() &&
                              (q_copies < copies || (q_copies == copies && q_peak < peak)))) {
          span = q_span;
          peak = q_peak;
          repaired = std::move(q);
        }
      };
      if (offload_) {
        std::pair<Program, bool> walked = detail::offload_toward(p, cost_.memory, cap_);
        if (walked.second)
          consider(std::move(walked.first));
        else if (recompute_)
          consider(recompute_to_fit(walked.first, cost_.memory, cap_));
      }
      if (recompute_) consider(recompute_to_fit(p, cost_.memory, cap_));
      if (repaired) measured = &*repaired;
    }
    std::string name = without_repairs(origin);
    if (const int n = offloads(*measured); n > 0) name += ", offloading " + std::to_string(n) + " stashes";
    if (const int n = recomputations(*measured); n > 0) name += ", recomputing " + std::to_string(n) + " micro-batches";
    if (span_out != nullptr) *span_out = span;
    if (kept != nullptr) *kept = *measured;
    if (span == std::numeric_limits<double>::infinity()) return false;
    // As fast: fewer copies first (each costs host memory and the copy lane), then the lower peak.
    const int copies = offloads(*measured);
    if (span < best_span_ * (1 - 1e-12) ||
        (span <= best_span_ * (1 + 1e-12) && (copies < best_copies_ || (copies == best_copies_ && peak < best_peak_)))) {
      best_ = *measured;
      best_span_ = span;
      best_peak_ = peak;
      best_copies_ = copies;
      origin_ = name;
      return true;
    }
    return false;
  }

  const Program& best() const { return best_; }
  double best_span() const { return best_span_; }
  /// An origin without the offloads and recomputations a repair named in it (", offloading 12 stashes",
  /// ", recomputing 3 micro-batches"); the rest as it is.
  static std::string without_repairs(std::string origin) {
    for (const std::string marker : {", offloading ", ", recomputing "}) {
      std::size_t at = origin.find(marker);
      while (at != std::string::npos) {
        const std::size_t count = at + marker.size();
        if (count < origin.size() && origin[count] >= '0' && origin[count] <= '9') {
          const std::size_t end = origin.find_first_of(",;", count);
          origin.erase(at, end == std::string::npos ? std::string::npos : end - at);
          at = origin.find(marker, at);
        } else {
          at = origin.find(marker, at + 1);
        }
      }
    }
    return origin;
  }
  double best_peak() const { return best_peak_; }
  const std::string& origin() const { return origin_; }
  bool found() const { return best_span_ < std::numeric_limits<double>::infinity(); }

 private:
  bool over_cap(double peak) const { return cap_ > 0 && peak > cap_ * (1 + 1e-12); }

  const CostModel& cost_;
  double cap_;
  bool recompute_, offload_;
  long long budget_, size_, spent_ = 0;
  int evaluated_ = 0;
  Program best_;
  double best_span_ = std::numeric_limits<double>::infinity();
  double best_peak_ = std::numeric_limits<double>::infinity();
  int best_copies_ = 0;
  std::string origin_;
};

/// A reference clock to plan a program's steps on (Program::lowering and
/// Program::stage_lowering), and its name in a Synthesis's origin.
struct ReferenceClock {
  LoweringCosts all;
  std::vector<LoweringCosts> stages;  ///< one per virtual stage, or empty: `all` for each
  std::string name;

  void apply(Program& p) const {
    p.lowering = all;
    p.stage_lowering = stages;
  }
};

/// The reference clocks worth planning a program's steps on. Under rendezvous a
/// send waits for its receiver; steps planned on a clock whose ratios are the
/// real ones wait the least. The clocks:
/// - the defaults;
/// - the cost model's ratios (its phase costs averaged over the stages) rounded
///   to whole numbers at forward = 1, 2, 3 and 4;
/// - where the stages' costs differ, each stage's own costs on one scale,
///   rounded at a mean forward of 1, 2, 3, 4, 6, 8 and 10 (a stage 1.3 times
///   slower than the rest is 13 to 10 on the last).
inline std::vector<ReferenceClock> reference_clocks(const ScheduleShape& s, const CostModel& cost) {
  const int S = s.stages();
  double mean[kPhases] = {};
  bool equal = true;
  for (int st = 0; st < S; ++st)
    for (const Phase p : compute_phases()) {
      mean[static_cast<int>(p)] += cost.cost_of(p, st) / S;
      equal = equal && cost.cost_of(p, st) == cost.cost_of(p, 0);
    }
  auto word = [](const LoweringCosts& c) {  // "1:2:1:1"
    std::string out;
    for (const Phase p : compute_phases()) out += (out.empty() ? "" : ":") + std::to_string(c[p]);
    return out;
  };
  const std::string letters = [] {  // "F:B:I:W"
    std::string out;
    for (const Phase p : compute_phases()) out += (out.empty() ? "" : ":") + std::string(1, phase_letter(p));
    return out;
  }();
  std::vector<ReferenceClock> out{ReferenceClock{LoweringCosts{}, {}, "steps planned on " + letters + " " + word(LoweringCosts{})}};
  const double forward = mean[static_cast<int>(Phase::kForward)];
  if (!(forward > 0)) return out;
  auto round = [&](double k, auto&& cost_of) {
    LoweringCosts c;
    for (const Phase p : compute_phases()) {
      const double x = k * cost_of(p) / forward;
      c[p] = x < 1 ? 1 : x > 1024 ? 1024 : static_cast<long long>(x + 0.5);
    }
    return c;
  };
  auto add = [&](ReferenceClock c) {
    for (const ReferenceClock& o : out)
      if (o.all == c.all && o.stages == c.stages) return;
    out.push_back(std::move(c));
  };
  for (const int k : {1, 2, 3, 4}) {
    const LoweringCosts c = round(k, [&](Phase p) { return mean[static_cast<int>(p)]; });
    add({c, {}, "steps planned on " + letters + " " + word(c)});
  }
  if (equal) return out;
  for (const int k : {1, 2, 3, 4, 6, 8, 10}) {
    ReferenceClock c{LoweringCosts{}, {},
                     "steps planned on each stage's " + letters + " at a mean F of " + std::to_string(k)};
    for (int st = 0; st < S; ++st) c.stages.push_back(round(k, [&](Phase p) { return cost.cost_of(p, st); }));
    add(std::move(c));
  }
  return out;
}

/// Local search on the best program: two neighbouring actions of a device
/// swapped, kept when the makespan drops, pass after pass until a pass changes
/// nothing or the budget is spent. Each W is tried first (moving a W is always
/// safe), then every other pair; never two halves of a pair, and never two
/// actions of one chunk that add its weight gradients (B or W) or two of its
/// forwards, so that each stage keeps its micro-batch order (gradient_order()).
inline void improve_order(Search& search) {
  auto swappable = [](const Action& a, const Action& b) {
    if (is_copy(a.phase) || is_copy(b.phase)) return false;  // a repair places the copies again
    if (a.chunk != b.chunk) return true;
    const bool weights_a = phase_row(a.phase).weight_gradient, weights_b = phase_row(b.phase).weight_gradient;
    return !(weights_a && weights_b) && a.phase != b.phase;
  };
  for (const bool weights_only : {true, false}) {
    bool improved = true;
    while (improved && search.budget_left()) {
      improved = false;
      Program p = search.best();
      for (std::size_t d = 0; d < p.devices.size() && search.budget_left(); ++d) {
        auto& row = p.devices[d];
        for (std::size_t k = 0; k + 1 < row.size() && search.budget_left(); ++k) {
          const bool has_w = row[k].phase == Phase::kBackwardWeight || row[k + 1].phase == Phase::kBackwardWeight;
          if (weights_only != has_w || row[k].overlaps_next || row[k + 1].overlaps_next ||
              (k > 0 && row[k - 1].overlaps_next) || !swappable(row[k], row[k + 1]))
            continue;
          std::swap(row[k], row[k + 1]);
          std::string moved = Search::without_repairs(search.origin());
          if (!moved.ends_with(" + local moves")) moved += " + local moves";
          if (search.offer(p, moved)) {
            improved = true;
            p = search.best();  // with the repairs the cap needed, where the move needed more
          } else {
            std::swap(row[k], row[k + 1]);
          }
        }
      }
    }
  }
}

}  // namespace detail

/// The fastest program the search finds for the shape (P, V, M and the
/// placement; its kind is ignored), the cost model (per-stage costs,
/// transfers, the overlap efficiency of pairs) and the limits, verified and
/// within the memory cap. Throws pipeweave::Error naming the problem when the
/// input is malformed or no program fits (synthesis_error(): a cap below
/// smallest_memory_limit() names that smallest feasible cap).
inline Synthesis synthesize(const ScheduleShape& shape, const CostModel& cost, const SynthesisLimits& limits = {}) {
  ScheduleShape s = shape;
  s.kind = ScheduleKind::kAuto;
  if (Text e = synthesis_error(s, cost, limits); !e.empty()) throw Error(e.str());
  detail::Search search(s, cost, limits);
  // Pairs hide compute where the overlap efficiency is above 0; where transfers cost, a pair is also one
  // step fewer to meet at. The built-in orders are tried with pairs whenever pairs are allowed.
  const bool pairs = limits.pairs && (cost.overlap_efficiency > 0 || cost.transfer_time() > 0);
  Synthesis out;
  // The candidates to plan again on other reference clocks, ranked by their dataflow bound.
  struct Ranked {
    double span;
    Program program;
    std::string origin;
    bool rendezvous = false;  ///< a list candidate planned with rendezvous (ranked apart: its clock runs later)
  };
  std::vector<Ranked> ranked;
  CostModel dataflow = cost;
  dataflow.replay = ReplayMode::kDataflow;
  // The built-in orders of the shape's placement: candidates, and the mark to beat.
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, s.placement};
    if (!shape_error(ks).empty() || (!limits.split_backward && splits_backward(k))) continue;
    const Program p = make_program(ks);
    for (const bool overlapped : {false, true}) {
      if (overlapped && !limits.pairs) continue;
      // The order as it is (recomputing what the cap needs, where that is allowed), and with every
      // micro-batch of every stage recomputed (Megatron-LM's uniform full recomputation).
      for (const bool uniform : {false, true}) {
        if (uniform && !limits.recompute) continue;
        const Program own = uniform ? with_recompute(overlapped ? overlap(p) : p, all_stages(s))
                                    : overlapped ? overlap(p) : p;
        Program q = own;
        q.shape.kind = ScheduleKind::kAuto;
        const std::string name =
            std::string(schedule_name(k)) + (overlapped ? "+overlap" : "") + (uniform ? "+recompute" : "");
        double span = 0;
        Program kept;
        search.offer(q, name, &span, &kept);
        if (span < std::numeric_limits<double>::infinity())
          ranked.push_back({makespan(simulate(kept, dataflow)), kept, name});
        if (span < out.best_builtin.makespan) {
          kept.shape.kind = k;
          out.best_builtin = {name + (offloads(kept) > 0 ? ", offloading" : "") +
                                  (recomputations(kept) > 0 && !uniform ? ", recomputing" : ""),
                              kept, span};
        }
      }
    }
  }
  // One micro-batch at a time through every stage, with what the cap needs recomputed: it holds the least
  // (smallest_memory_limit()), so a cap that is not refused has a candidate.
  if (limits.recompute && limits.memory > 0) search.offer(detail::one_at_a_time(s), "one micro-batch at a time");
  // The list scheduler keeps the cap by construction, down to the smallest one without recomputation; below
  // it, and unbounded too where recomputation or offload is allowed, its candidates recompute or offload
  // what the cap needs.
  std::vector<double> list_caps{limits.memory};
  if (limits.recompute && limits.memory > 0)
    list_caps[0] = std::max(limits.memory, smallest_memory_limit(s, cost.memory, false));
  if ((limits.recompute || limits.offload) && limits.memory > 0) list_caps.push_back(0);
  std::vector<detail::ListScheduler> lists;
  for (const double list_cap : list_caps) lists.emplace_back(s, cost, list_cap);
  for (const detail::ListPolicy& policy : detail::list_policies(limits)) {
    for (std::size_t i = 0; i < lists.size(); ++i) {  // each policy under each cap, so that the budget meets both
      if (!search.budget_left() && search.found()) break;
      const detail::ListScheduler& list = lists[i];
      const double list_cap = list_caps[i];
      if (list_cap == 0 && (policy.recompute > 0 || policy.offload)) continue;  // with no cap all fits whole
      Program p;
      double bound = 0, span = 0;
      if (!list.run(policy, p, bound)) continue;
      const std::string origin = std::string(list_cap > 0 || limits.memory == 0 ? "list: " : "list, no cap: ") +
                                 policy.name();
      Program kept;
      search.offer(p, origin, &span, &kept);
      if (span < std::numeric_limits<double>::infinity()) ranked.push_back({bound, kept, origin, policy.rendezvous});
      if (pairs && verify(p)) search.offer(overlap(p), origin + ", overlapped");
    }
  }
  // The best few by their own clock's finish (the others by their dataflow bound, those planned with
  // rendezvous apart), again on the other reference clocks.
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.rendezvous != b.rendezvous ? !a.rendezvous : a.span < b.span;
  });
  const std::vector<detail::ReferenceClock> clocks = detail::reference_clocks(s, cost);
  const auto first_rendezvous = std::find_if(ranked.begin(), ranked.end(), [](const Ranked& r) { return r.rendezvous; });
  for (const auto group : {ranked.begin(), first_rendezvous}) {
    const auto end = group == ranked.begin() ? first_rendezvous : ranked.end();
    for (auto r = group; r != end && r - group < 8 && search.budget_left(); ++r) {
      for (std::size_t c = 1; c < clocks.size() && search.budget_left(); ++c) {
        Program p = r->program;
        clocks[c].apply(p);
        search.offer(p, r->origin + "; " + clocks[c].name);
      }
    }
  }
  // Allowed to offload as well as recompute, the search spends its budget on other repairs and may follow
  // other candidates: the program recomputation alone finds is a candidate too, so offload never costs time.
  int evaluated_alone = 0;
  if (limits.offload && limits.recompute && limits.memory > 0) {
    SynthesisLimits alone = limits;
    alone.offload = false;
    const Synthesis r = synthesize(shape, cost, alone);
    search.offer(r.program, r.origin);
    evaluated_alone = r.evaluated;
  }
  if (!search.found())
    throw Error("synthesize: no candidate fits the memory limit; this is a bug: the list scheduler keeps any limit of "
                "at least the smallest feasible one");
  detail::improve_order(search);
  out.program = search.best();
  out.makespan = search.best_span();
  out.peak_memory = search.best_peak();
  out.origin = search.origin();
  out.lower_bound = synthesis_lower_bound(s, cost, limits);
  out.evaluated = search.evaluated() + evaluated_alone;
  return out;
}

}  // namespace pipeweave
