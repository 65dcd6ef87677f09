#pragma once
/// \file
/// `--schedule auto` for any program that trains: measure a built-in schedule,
/// fit each virtual stage's costs to its measured trace, synthesize a program
/// for those costs under a memory cap, and train on with it. AutoSchedule
/// decides what to train with and when to switch; the caller keeps its loop and
/// builds its pipelines (any host, any backend), and switch_state() carries the
/// training state from one pipeline to the next, so that the run stays one
/// training run, bit for bit.
///
/// \code
/// pipeweave::AutoSchedule tuner({pipeweave::ScheduleKind::kAuto, 4, 2, 8}, {.memory = 8, .probe_steps = 3});
/// auto pipe = make_pipeline(tuner.program());  // the probe: a built-in schedule that fits the cap
/// for (int step = 1; step <= steps; ++step) {  // steps >= tuner.least_steps()
///   const auto t0 = std::chrono::steady_clock::now();
///   pipe->train_step(inputs, targets);
///   const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
///   if (tuner.after_step(ms.count(), pipe->trace(), steps - step).switched) {
///     auto next = make_pipeline(tuner.program());  // the best built-in under the fitted costs, then the synthesized
///     pipeweave::switch_state(*pipe, *next);
///     pipe = std::move(next);
///   }
/// }
/// tuner.finish();  // tuner.segments(): each schedule's step, simulated under the fitted costs and measured
/// \endcode
///
/// The sequence:
/// 1. **The probe.** The built-in kinds whose rows have a probe rank, in its
///    order (the ones that time I and W apart first): the first whose shape
///    rules hold and whose peak memory fits the cap, else the one that keeps the
///    least (probe_program()). It trains `probe_steps` steps.
/// 2. **The fit and the search.** The last probe step's trace gives each virtual
///    stage's costs (fit_stage_costs()); synthesize() searches a program for
///    them under the cap (in the options' memory model: activations, or the
///    built-in MLP's bytes), recomputing or offloading where the options allow,
///    with overlapped pairs only where the caller says a pair's halves run at
///    once. When the best built-in order under the fitted
///    costs is another than the probe, it trains `probe_steps` steps too.
/// 3. **The synthesized program** to the end.
/// With data-parallel replicas every program handed out has its gradient
/// reductions (with_grad_reduce(), once each). No switch comes with the last
/// step, which nothing would follow. step_report() and segments_report() word
/// what happened, as train_mlp prints it.

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/synthesize.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What AutoSchedule may do.
struct AutoScheduleOptions {
  /// Cap on each device's peak memory in the unit of `model` (SynthesisLimits::memory): stashes plus
  /// the gradients kept from an I to its W; 0: none.
  double memory = 0;
  /// The stash sizes the cap counts: by default one activation each; the built-in MLP's in bytes
  /// with mlp_memory_model() (model/mlp_pipeline.hpp).
  MemoryModel model{};
  /// The synthesized program may recompute micro-batches to meet the cap (SynthesisLimits::recompute;
  /// the chunks must be RecomputableChunk).
  bool recompute = false;
  /// It may offload stashes to host memory (SynthesisLimits::offload; the chunks must be
  /// OffloadableChunk), each copy lasting its size over `copy_bandwidth`.
  bool offload = false;
  /// The copy lane's bandwidth, in the unit of `model` per microsecond (the fitted costs' time unit);
  /// above 0 where `offload` is set.
  double copy_bandwidth = 0;
  /// The steps each measured built-in schedule trains before the next switch, at least 1.
  int probe_steps = 3;
  /// The synthesized program may have overlapped pairs: say false where a pair's halves cannot run at
  /// once (on CPU threads with fewer cores than 2P; the fitted costs do not know of shared cores).
  bool pairs = true;
  /// Data-parallel replicas of the pipeline; above 1 every program handed out has its reductions.
  int replicas = 1;
};

/// The built-in program measured first for the shape (P, V and M; its kind and
/// placement are ignored): of the kinds with a probe rank, in its order, the
/// first whose shape rules hold and whose peak memory under `model` fits
/// `memory` (0: any), else the one that keeps the least; nothing when no such
/// kind takes the shape.
inline std::optional<Program> probe_program(const ScheduleShape& shape, double memory, const MemoryModel& model = {}) {
  std::vector<ScheduleKind> kinds;
  for (const KindRow& r : kKindRows)
    if (r.probe > 0) kinds.push_back(r.kind);
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](ScheduleKind a, ScheduleKind b) { return kind_row(a).probe < kind_row(b).probe; });
  std::optional<Program> least;
  double least_peak = 0;
  for (const ScheduleKind k : kinds) {
    if (!shape_error({k, shape.devices, shape.chunks, shape.micro_batches, placement_of(k)}).empty()) continue;
    Program p = make_schedule(k, shape.devices, shape.chunks, shape.micro_batches);
    const std::vector<double> peaks = peak_memory(p, model);
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    if (memory == 0 || peak <= memory) return p;
    if (!least || peak < least_peak) least = std::move(p), least_peak = peak;
  }
  return least;
}

/// Moves the training state of `from` (parameters, optimizer state, updates
/// applied) into `to`, a pipeline of the same model under another program.
template <class From, class To>
void switch_state(From& from, To& to) {
  TrainingState state;
  from.copy_state(state);
  to.set_state(state);
}

/// The probe -> fit -> synthesize -> switch sequence of a training run (see the file comment).
class AutoSchedule {
 public:
  /// One schedule the run trained with.
  struct Segment {
    std::string name;          ///< a built-in's name ("+overlap" with pairs), or "auto": the synthesized program
    double simulated_ms = 0;   ///< its step simulated under the fitted costs (0 until they are fitted)
    double measured_ms = 0;    ///< the median of its measured steps, once it ended (or after finish())
    int steps = 0;             ///< its measured steps
  };

  /// What after_step() did.
  struct StepOutcome {
    bool fitted = false;    ///< the costs were fitted to this step's trace and a program synthesized
    bool switched = false;  ///< program() changed: train the next step with it
  };

  /// What is wrong with the problem (empty when nothing): the probe steps, the
  /// shape and cap (synthesis_error()), and whether a built-in kind can measure it.
  static Text error(const ScheduleShape& shape, const AutoScheduleOptions& options) {
    Text t;
    if (options.probe_steps < 1) {
      t << "the probe steps must be at least 1 (got " << options.probe_steps << ")";
    } else if (options.replicas < 1) {
      t << "the replicas must be at least 1 (got " << options.replicas << ")";
    } else if (options.offload && !(options.copy_bandwidth > 0 && options.copy_bandwidth < 1e300)) {
      t << "offloading needs the copy lane's bandwidth, in the memory model's unit per microsecond (above 0, got "
        << format_number(options.copy_bandwidth) << ")";
    } else if (Text e = memory_model_error(options.model, shape.stages()); !e.empty()) {
      t << e;
    } else if (!probe_program(shape, options.memory, options.model)) {
      t << "no built-in schedule of " << shape.devices << " devices x " << shape.chunks << " chunks runs "
        << shape.micro_batches << " micro-batches to measure the costs with";
    } else if (Text e = synthesis_error(auto_shape(shape), with_memory({}, options), limits(options)); !e.empty()) {
      t << e;
    }
    return t;
  }

  /// The sequence for the shape: P, V and M, and the placement of the
  /// synthesized program (its kind is ignored), starting with the probe.
  /// Throws pipeweave::Error with error()'s message.
  AutoSchedule(const ScheduleShape& shape, const AutoScheduleOptions& options = {})
      : shape_(auto_shape(shape)), options_(options) {
    if (const Text e = error(shape, options); !e.empty()) throw Error(e.str());
    const Program probe = *probe_program(shape, options.memory, options.model);
    begin(probe, std::string(schedule_name(probe.shape.kind)), 0);
  }

  /// The steps a run needs for the whole sequence: the probe's, the best built-in's and one more.
  int least_steps() const { return 2 * options_.probe_steps + 1; }

  /// What to train with now; with replicas, its reductions placed.
  const Program& program() const { return program_; }

  /// Records a step of program() that took `step_ms` and left `trace` (the pipeline's trace of
  /// that step), with `steps_left` steps still to come. When the current schedule has run its
  /// probe steps: after the probe, fits the costs and synthesizes; then switches to the next
  /// schedule, unless no step is left. Throws pipeweave::Error when the synthesized program
  /// fails verify() (a bug of the search).
  StepOutcome after_step(double step_ms, const Trace& trace, long long steps_left) {
    step_ms_.push_back(step_ms);
    if (static_cast<int>(step_ms_.size()) < options_.probe_steps || steps_left <= 0 || synthesized()) return {};
    end_segment();
    StepOutcome result;
    if (!found_) {
      costs_ = with_memory(fit_stage_costs(trace, shape_.stages()), options_);
      segments_.front().simulated_ms = makespan(simulate(program_, costs_)) / 1e3;
      found_ = synthesize(shape_, costs_, limits(options_));
      if (const VerifyResult r = verify(found_->program); !r) throw Error("auto: the synthesized program: " + r.what());
      result.fitted = true;
      const BuiltinCandidate& best = found_->best_builtin;
      if (!best.name.empty() && best.name != segments_.front().name) {
        begin(best.program, best.name, best.makespan / 1e3);
        result.switched = true;
        return result;
      }
    }
    begin(found_->program, std::string(schedule_name(ScheduleKind::kAuto)), found_->makespan / 1e3);
    synthesized_ = result.switched = true;
    return result;
  }

  /// Ends the measurement of the current schedule (at the end of the run).
  void finish() {
    if (!step_ms_.empty()) end_segment();
  }

  /// Whether program() is the synthesized program.
  bool synthesized() const { return synthesized_; }

  /// The schedules trained with, in order: the probe first.
  const std::vector<Segment>& segments() const { return segments_; }
  /// The search's result, once the costs are fitted.
  const std::optional<Synthesis>& synthesis() const { return found_; }
  /// The costs fitted to the probe's last step (the defaults until then).
  const CostModel& costs() const { return costs_; }
  /// The segment of the best built-in order under the fitted costs, when the run trained with it.
  const Segment* best_builtin_segment() const {
    if (!found_) return nullptr;
    const auto it = std::find_if(segments_.begin(), segments_.end(),
                                 [&](const Segment& s) { return s.name == found_->best_builtin.name; });
    return it == segments_.end() ? nullptr : &*it;
  }

 private:
  static ScheduleShape auto_shape(ScheduleShape s) {
    s.kind = ScheduleKind::kAuto;
    return s;
  }
  // Costs `k` with the options' memory model and copy bandwidth.
  static CostModel with_memory(CostModel k, const AutoScheduleOptions& o) {
    k.memory = o.model;
    k.copy_bandwidth = o.offload ? o.copy_bandwidth : 0;
    return k;
  }
  static SynthesisLimits limits(const AutoScheduleOptions& o) {
    return {.memory = o.memory, .recompute = o.recompute, .offload = o.offload, .pairs = o.pairs};
  }

  void begin(const Program& p, std::string name, double simulated_ms) {
    program_ = options_.replicas > 1 ? with_grad_reduce(p) : p;
    segments_.push_back({std::move(name), simulated_ms, 0, 0});
    step_ms_.clear();
  }
  void end_segment() {
    segments_.back().measured_ms = median(step_ms_);
    segments_.back().steps = static_cast<int>(step_ms_.size());
  }

  ScheduleShape shape_;
  AutoScheduleOptions options_;
  Program program_;
  std::vector<Segment> segments_;
  std::vector<double> step_ms_;  // the current schedule's measured steps
  CostModel costs_;
  std::optional<Synthesis> found_;
  bool synthesized_ = false;
};

/// What a run reports after step `step`, from after_step()'s outcome: after
/// the fit, the costs per virtual stage (F:I:W, ms) and the search's result;
/// at the switch to the synthesized program, the step it trains from. Empty
/// after a step that did neither.
inline std::string step_report(const AutoSchedule& tuner, const AutoSchedule::StepOutcome& outcome, int step) {
  const std::string name(schedule_name(ScheduleKind::kAuto));
  std::string out;
  char line[256];
  if (outcome.fitted && tuner.synthesis()) {
    const CostModel& k = tuner.costs();
    out = name + ": costs fitted to step " + std::to_string(step) + "'s trace, per virtual stage (F:I:W, ms):";
    for (int st = 0; st < static_cast<int>(k.stage_costs.size()); ++st) {
      std::snprintf(line, sizeof line, " %.3f:%.3f:%.3f", k.cost_of(Phase::kForward, st) / 1e3,
                    k.cost_of(Phase::kBackwardInput, st) / 1e3, k.cost_of(Phase::kBackwardWeight, st) / 1e3);
      out += line;
    }
    const Synthesis& found = *tuner.synthesis();
    std::snprintf(line, sizeof line, " (%d programs simulated), simulated step %.3f ms, lower bound %.3f ms; ",
                  found.evaluated, found.makespan / 1e3, found.lower_bound / 1e3);
    out += "\n" + name + ": synthesized " + found.origin + line + "best built-in within the limit: " +
           (found.best_builtin.name.empty() ? std::string("none") : found.best_builtin.name) + "\n";
  }
  if (outcome.switched && tuner.synthesized())
    out += name + ": training on with the synthesized program from step " + std::to_string(step + 1) + "\n";
  return out;
}

/// What a run reports at its end (after finish()): each schedule's step,
/// simulated under the fitted costs and measured, and, when the run trained
/// with both, the synthesized program's step over the best built-in's.
inline std::string segments_report(const AutoSchedule& tuner) {
  const std::string name(schedule_name(ScheduleKind::kAuto));
  std::string out = name + ": each schedule's step, simulated under the fitted costs and measured (the median of "
                           "its steps in this run):\n";
  char line[256];
  for (const AutoSchedule::Segment& m : tuner.segments()) {
    std::snprintf(line, sizeof line, "  %-22s simulated %8.3f ms, measured %8.3f ms over %d steps\n", m.name.c_str(),
                  m.simulated_ms, m.measured_ms, m.steps);
    out += line;
  }
  const AutoSchedule::Segment& synth = tuner.segments().back();
  if (const AutoSchedule::Segment* best = tuner.best_builtin_segment();
      tuner.synthesized() && best != nullptr && best->measured_ms > 0) {
    std::snprintf(line, sizeof line, "%s: synthesized / best built-in (%s): simulated %.3f, measured %.3f\n",
                  name.c_str(), best->name.c_str(), synth.simulated_ms / best->simulated_ms,
                  synth.measured_ms / best->measured_ms);
    out += line;
  }
  return out;
}

}  // namespace pipeweave
