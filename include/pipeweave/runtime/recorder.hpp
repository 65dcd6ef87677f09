#pragma once
/// \file
/// The time stamps of a device's step and the trace built from them:
/// StepRecorder, which the device session (runtime/session.hpp) calls as it
/// walks its program, as a scheduler calls an observer (Taskflow's
/// ObserverInterface). The session takes a time stamp where a group of sends and
/// receives or an action starts, on the clock of the backend that runs it (its
/// lane), and says when it has ended; the recorder keeps the marks, counts what
/// the device keeps as the simulator counts it (KeptCount) and the bytes it
/// holds for it (HeldMemory), and after the step
/// writes the device's events into a Trace, in microseconds from the step's start.
///
/// Four lanes, each a backend of the device with its own stamps, all counting
/// from the origin the device's backend set last (OverlapBackend): the device's
/// own, its side (the backward of an overlapped pair), its reducer (the
/// gradient reductions of runtime/reducer.hpp) and its copy lane (offloads and
/// reloads, runtime/copy_lane.hpp). The device's thread writes every
/// mark but the reducer's, which its thread writes and which join the others once
/// the device has waited for its reductions (on_reductions_joined()).
///
/// \code
/// // on the device's thread, with its plan and backend:
/// // pipeweave::StepRecorder<B> recorder(plan, backend);
/// // recorder.on_step_begin();                   // the clocks' origin, no marks
/// // const std::size_t start = recorder.stamp();
/// // ... step t's action, enqueued on the backend ...
/// // recorder.on_action_end(t, start);
/// // backend.synchronize();
/// // recorder.record(trace);                     // the device's events of the step
/// \endcode

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/held_memory.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/kinds.hpp"

namespace pipeweave {

/// The backend of a device that ran an action, whose clock stamped it.
enum class Lane : char {
  kMain,     ///< the device's own
  kSide,     ///< its side: the backward half of an overlapped pair
  kReducer,  ///< its reducer: a gradient reduction
  kCopy,     ///< its copy lane: an offload or a reload
};

/// Two time stamps of one lane's clock: where an action started and ended.
struct Stamps {
  std::size_t start = 0;  ///< the stamp before it
  std::size_t end = 0;    ///< the stamp after it
};

/// The marks of one device's step and its trace (see the file comment).
template <Backend B>
class StepRecorder {
 public:
  /// Records the steps of `plan` on the clock of `device`, the device's backend
  /// (both outlive the recorder).
  StepRecorder(const DevicePlan& plan, B& device) : plan_(&plan), clocks_{&device, nullptr, nullptr, nullptr} {
    compute_.reserve(plan.steps.size());
    comm_.reserve(plan.steps.size());
  }
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  /// Gives `lane` (the side, the reducer or the copy lane) the clock of `backend`, which outlives the recorder.
  void add_lane(Lane lane, B& backend) { clocks_[index(lane)] = &backend; }
  /// Room for `n` reductions a step on the reducer's lane, so that no step allocates.
  void reserve_reductions(std::size_t n) { reductions_.reserve(n); }

  /// A step starts: every lane's clock takes its origin (the device's first),
  /// and the last step's marks and counts are forgotten.
  void on_step_begin();
  /// A time stamp of `lane`'s clock, enqueued on its backend from the thread that drives it.
  std::size_t stamp(Lane lane = Lane::kMain) { return clocks_[index(lane)]->time_stamp(); }
  /// Step `step`'s group of sends and receives, stamped `start`, has ended.
  void on_exchange_end(int step, std::size_t start);
  /// Step `step`'s action, stamped `start` on the device's lane, has ended.
  void on_action_end(int step, std::size_t start);
  /// The copy of step `step` (an O or L), stamped `start` on `lane` (the copy
  /// lane, or the device's own where it has none), has ended; an O's is issued
  /// before its step.
  void on_copy_end(int step, std::size_t start, Lane lane) { compute_.push_back({step, start, stamp(lane), lane}); }
  /// The device has reached step `step`'s O or L: what it keeps changes here.
  void on_copy_placed(int step) { count(step); }
  /// An overlapped pair has ended: step `step`'s forward ran on the device's
  /// lane over `forward`, step `step` + 1's backward on the side over `backward`.
  void on_pair_end(int step, Stamps forward, Stamps backward);
  /// Step `step`'s reduction was handed to the reducer.
  void on_reduction_posted(int step) { count(step); }
  /// On the reducer's thread: step `step`'s reduction, stamped `start` on the reducer's lane, has ended.
  void on_reduction_end(int step, std::size_t start) {
    reductions_.push_back({step, start, stamp(Lane::kReducer), Lane::kReducer});
  }
  /// The device has waited for its reducer: the reductions' marks join the step's.
  void on_reductions_joined();
  /// The deferred reductions of the step have ended now, on the device's lane:
  /// each R's event lasts from its start until now.
  void on_deferred_reductions_end();
  /// Measures the bytes the device holds for its kept micro-batches with `held` (runtime/held_memory.hpp).
  void measure_bytes(HeldMemory held) { held_ = std::move(held); }
  /// After a failed step, once the reducer is idle: forgets its marks.
  void on_reset() { reductions_.clear(); }

  /// Writes the device's events of the last step into `trace` (its compute,
  /// gradient-reduction and P2P events, in microseconds from the step's start,
  /// and its peak of kept micro-batches). Call after the step, on the device's
  /// thread, once its backend is synchronized.
  void record(Trace& trace) const;

 private:
  struct ComputeMark {
    int step;
    std::size_t start, end;  // stamps of its lane's clock
    Lane lane;
  };
  struct CommMark {
    int step, sends, recvs;
    std::size_t start, end;
  };

  static std::size_t index(Lane lane) { return static_cast<std::size_t>(lane); }
  const PlannedCompute& action(int step) const { return plan_->steps[static_cast<std::size_t>(step)].compute; }
  // Counts what step `step`'s action keeps, in activations (the default memory
  // model), a recomputed micro-batch's forward its input alone.
  void count(int step) {
    const PlannedCompute& pc = action(step);
    kept_.after(pc.action, StashSize{}, pc.recomputed, pc.weight_window);
    held_.after(pc);
  }

  const DevicePlan* plan_;
  std::array<B*, 4> clocks_;                // [lane]: its backend (null: the device has no such lane)
  std::vector<ComputeMark> compute_;        // the actions of the step, as they ended
  std::vector<CommMark> comm_;              // its groups
  std::vector<ComputeMark> reductions_;     // the reducer's marks (written on its thread) until they join
  KeptCount kept_;                          // what the device keeps
  HeldMemory held_;                         // and its bytes, where its chunks say their slots' bytes
};

template <Backend B>
void StepRecorder<B>::on_step_begin() {
  for (B* clock : clocks_)
    if (clock != nullptr) clock->reset_clock();
  compute_.clear();
  comm_.clear();
  kept_ = {};
  held_.reset();
}

template <Backend B>
void StepRecorder<B>::on_exchange_end(int step, std::size_t start) {
  const PlannedStep& st = plan_->steps[static_cast<std::size_t>(step)];
  comm_.push_back({step, st.sends, st.recvs, start, stamp()});
}

template <Backend B>
void StepRecorder<B>::on_action_end(int step, std::size_t start) {
  count(step);
  compute_.push_back({step, start, stamp(), Lane::kMain});
}

template <Backend B>
void StepRecorder<B>::on_pair_end(int step, Stamps forward, Stamps backward) {
  count(step);  // both halves' stashes count at once, as the simulator counts them
  count(step + 1);
  compute_.push_back({step, forward.start, forward.end, Lane::kMain});
  compute_.push_back({step + 1, backward.start, backward.end, Lane::kSide});
}

template <Backend B>
void StepRecorder<B>::on_reductions_joined() {
  compute_.insert(compute_.end(), reductions_.begin(), reductions_.end());
  reductions_.clear();
}

template <Backend B>
void StepRecorder<B>::on_deferred_reductions_end() {
  const std::size_t end = stamp();
  for (ComputeMark& m : compute_)
    if (is_collective(action(m.step).action.phase)) m.end = end;
}

template <Backend B>
void StepRecorder<B>::record(Trace& trace) const {
  const int d = plan_->device;
  const B& main = *clocks_[index(Lane::kMain)];
  const auto at = static_cast<std::size_t>(d);
  auto& comm = trace.comm[at];
  comm.clear();
  trace.compute[at].clear();
  for (const SideLane& lane : kSideLanes) lane_events(trace, lane.lane)[at].clear();
  for (const ComputeMark& m : compute_) {  // each on its phase's lane: compute, collective (R) or copy (O, L)
    const PlannedCompute& pc = action(m.step);
    const B& clock = *clocks_[index(m.lane)];
    lane_events(trace, phase_row(pc.action.phase).lane)[at].push_back(
        {d, m.step, pc.action, pc.stage, clock.elapsed_us(m.start), clock.elapsed_us(m.end)});
  }
  for (const CommMark& m : comm_)
    comm.push_back({d, m.step, m.sends, m.recvs, main.elapsed_us(m.start), main.elapsed_us(m.end)});
  trace.peak_activations[static_cast<std::size_t>(d)] = kept_.peak_stashes;
  if (trace.peak_memory.size() == trace.peak_activations.size())
    trace.peak_memory[static_cast<std::size_t>(d)] = kept_.peak_memory;
  if (held_.on() && at < trace.peak_bytes.size()) trace.peak_bytes[at] = static_cast<double>(held_.peak());
}

}  // namespace pipeweave
