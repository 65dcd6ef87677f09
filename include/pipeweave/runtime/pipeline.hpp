#pragma once
/// \file
/// The pipeline of one process: P device sessions (runtime/session.hpp), one
/// long-lived thread each. It builds each device's parts on that device's thread,
/// checks that they fit the program, and runs training steps. The CPU pipeline
/// and the GPU pipelines of one process are this host with their backends and
/// transports; mpi/pipeline.hpp hosts the same session one process per device.
///
/// With D > 1 replicas (BasicPipelineOptions::replicas, data parallelism) it runs
/// P x D sessions: replica r is a pipeline of its own (its own transport
/// endpoints, make_device(d, r)) on shard r of the batch (the rows r * rows / D
/// onwards), and the D sessions of pipeline device d share a ReplicaGroup that
/// sums each chunk's gradients at its R (with_grad_reduce()). Thread g runs
/// device g mod P of replica g / P.
///
/// An error on one device (a transport mismatch or timeout, an exception of a
/// chunk) aborts the transports and the replica groups, which makes every other
/// device stop promptly; the first error reaches the caller of train_step() as
/// pipeweave::Error, with the device (and replica), step and action where it
/// happened, and no device applies the step.

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/device_threads.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// A pipeline of P devices running one schedule in one process. L is the loss and
/// O the update rule; model/defaults.hpp makes the built-in ones (MseLoss,
/// OptimizerConfig) their defaults.
///
/// \code
/// // make_device(d) returns DeviceParts{backend, transport, chunks of device d}:
/// // pipeweave::Pipeline<B, T, C> pipe(program, make_device, {.rows = 64, .optimizer = {}});  // model/defaults.hpp
/// // double loss = pipe.train_step(inputs, targets).loss;
/// // With a loss and an update rule of one's own:
/// // pipeweave::Pipeline<B, T, C, MyLoss, MyRule> pipe(program, make_device, {.rows = 64, .optimizer = MyRule{}}, MyLoss{});
/// \endcode
template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class Pipeline {
 public:
  /// The parts of one device.
  using Parts = DeviceParts<B, T, C>;
  /// One device's session.
  using Session = DeviceSession<B, T, C, L, O>;
  /// The settings.
  using Options = BasicPipelineOptions<O>;
  /// The loss.
  using LossFunction = L;

  /// Verifies `program`, calls make_device(d) on device d's thread for every d
  /// (make_device(d, r) for replica r where options.replicas > 1), checks that
  /// the parts match the program (V chunks per device, each stage's output size
  /// equal to the next stage's input size, transports numbered 0..P-1) and makes
  /// the sessions, `loss` going to the device of the last virtual stage (a copy
  /// to each replica's). Throws pipeweave::Error on any mismatch.
  /// With replicas, the D sessions of each device share the collective
  /// make_replicas(device, D, options.timeout) gives (none: a ReplicaGroup, which
  /// sums a host copy of the gradients; runtime/replicas.hpp).
  template <class MakeDevice>
  Pipeline(const Program& program, MakeDevice&& make_device, const Options& options, L loss = L{},
           const MakeReplicaCollective& make_replicas = {});

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  /// Releases each device's session and parts on its own thread.
  ~Pipeline() {
    if (!threads_) return;
    std::vector<std::unique_ptr<Parts>> none;
    release(none);
  }

  /// One training step on the batch: `inputs` is rows x input size, `targets` rows
  /// x the loss's target size, both row-major on the host; replica r trains on
  /// the rows [r * rows / D, (r + 1) * rows / D). Returns the loss, the mean over
  /// every micro-batch of every replica. Throws pipeweave::Error when a device
  /// fails or a loss or gradient is not finite; the parameters and the optimizer
  /// state are then as they were.
  StepResult train_step(std::span<const float> inputs, std::span<const float> targets);

  /// The measured trace of the last step (times in microseconds from its start).
  const Trace& trace() const { return trace_; }
  /// The schedule's shape.
  const ScheduleShape& shape() const { return shape_; }
  /// The options the pipeline was built with.
  const Options& options() const { return options_; }
  /// The plan of device d.
  const DevicePlan& plan(int device) const { return sessions_.at(static_cast<std::size_t>(device))->plan(); }
  /// The messages of device `device`'s sends and receives, in the order of
  /// plan(device).ops: each one's tensor, dtype and bytes.
  std::span<const Message> messages(int device) const {
    return sessions_.at(static_cast<std::size_t>(device))->messages();
  }
  /// The micro-batch losses of the last step, replica by replica.
  std::span<const float> micro_batch_losses() const { return losses_; }
  /// The number of data-parallel replicas D.
  int replicas() const { return options_.replicas; }
  /// The collective the D replicas of pipeline device `device` share (nullptr
  /// for a run of one replica).
  const ReplicaCollective* replica_collective(int device) const {
    return groups_.empty() ? nullptr : groups_.at(static_cast<std::size_t>(device)).get();
  }

  /// The parameters of every virtual stage on the host: [stage] = the floats of
  /// its chunk's parameter tensors, in order.
  std::vector<std::vector<float>> stage_parameters() {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(shape_.stages()));
    on_devices([&](int d) {  // each device of replica 0 writes its own stages (every replica holds the same)
      if (d >= shape_.devices) return;
      std::vector<std::vector<float>> mine = session(d).chunk_parameters();
      for (int c = 0; c < shape_.chunks; ++c)
        out[static_cast<std::size_t>(shape_.stage_of(d, c))] = std::move(mine[static_cast<std::size_t>(c)]);
    });
    return out;
  }

  /// The run's state on the host: every stage's parameters and update-rule
  /// state, and the updates applied (runtime/state.hpp).
  TrainingState state() {
    TrainingState out;
    copy_state(out);
    return out;
  }
  /// state() into `out`, reusing its memory: a second copy into the same
  /// TrainingState touches no new page (what a checkpoint every few steps wants).
  void copy_state(TrainingState& out) {
    out.stages.resize(static_cast<std::size_t>(shape_.stages()));
    on_devices([&](int d) {  // each device of replica 0 writes its own stages
      if (d >= shape_.devices) return;
      for (int c = 0; c < shape_.chunks; ++c)
        session(d).copy_chunk_state(c, out.stages[static_cast<std::size_t>(shape_.stage_of(d, c))]);
    });
    out.updates = session(0).updates();
  }

  /// Sets every stage's parameters and update-rule state and the updates applied
  /// from `state` (a checkpoint's, or another run's with the same stages). Throws
  /// pipeweave::Error, changing nothing, unless every stage of `state` fits.
  void set_state(const TrainingState& state) {
    if (state.stages.size() != static_cast<std::size_t>(shape_.stages()))
      throw_error({}, "state: ", state.stages.size(), " stages; the pipeline has ", shape_.stages());
    if (state.updates < 0) throw_error({}, "state: ", state.updates, " updates applied; at least 0");
    for (int stage = 0; stage < shape_.stages(); ++stage)
      session(shape_.device_of_stage(stage))
          .check_chunk_state(shape_.chunk_of_stage(stage), state.stages[static_cast<std::size_t>(stage)],
                             "stage " + std::to_string(stage));
    on_devices([&](int g) {  // every replica
      const int d = g % shape_.devices;
      for (int c = 0; c < shape_.chunks; ++c)
        session(g).set_chunk_state(c, state.stages[static_cast<std::size_t>(shape_.stage_of(d, c))]);
      session(g).set_updates(state.updates);
    });
    step_count_ = state.updates;
  }

  /// Calls fn(d, parts) on device d's thread for every device (e.g. to count
  /// allocations); with several replicas, replica 0's devices (every replica holds
  /// the same parameters). Rethrows the first exception.
  template <class F>
  void for_each_device(F&& fn) {
    on_devices([&](int g) {
      if (g < shape_.devices) fn(g, session(g).parts());
    });
  }

 private:
  // The chunk of virtual stage `stage` among the parts of all devices.
  const C& chunk_of(const std::vector<std::unique_ptr<Parts>>& parts, int stage) const {
    return parts[static_cast<std::size_t>(shape_.device_of_stage(stage))]
        ->chunks[static_cast<std::size_t>(shape_.chunk_of_stage(stage))];
  }
  // The session of thread g: device g mod P of replica g / P.
  Session& session(int g) { return *sessions_[static_cast<std::size_t>(g)]; }
  // The session of replica r's device of the last virtual stage.
  const Session& last_session(int r = 0) const {
    return *sessions_[static_cast<std::size_t>(r * shape_.devices + shape_.device_of_stage(shape_.stages() - 1))];
  }
  // ", replica r" where the run has several.
  std::string replica_words(int r) const {
    return options_.replicas > 1 ? ", replica " + std::to_string(r) : std::string();
  }

  template <class F>
  void on_devices(F&& fn) {
    rethrow_first(threads_->run(fn));
  }

  // Destroys the sessions and any parts not yet handed to one, each on its device's thread.
  void release(std::vector<std::unique_ptr<Parts>>& parts) {
    auto destroy = [&](int d) {
      const auto i = static_cast<std::size_t>(d);
      if (i < sessions_.size()) sessions_[i].reset();
      if (i < parts.size()) parts[i].reset();
    };
    threads_->run(destroy);
  }

  // Records thread g's error; the first to fail aborts every transport and
  // replica group (each replica's pipeline has a transport of its own).
  void fail(std::atomic<int>& first, int g, const std::string& what) noexcept {
    std::string text;
    try {
      text = options_.replicas > 1 ? "replica " + std::to_string(g / shape_.devices) + ": " + what : what;
      errors_[static_cast<std::size_t>(g)] = text;
    } catch (...) {
    }
    int none = -1;
    if (first.compare_exchange_strong(none, g))
      for (auto& s : sessions_) s->abort(text);
  }

  static void rethrow_first(const std::vector<std::exception_ptr>& errors) {
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& x) {
        throw_error({}, x.what());
      }
    }
  }

  ScheduleShape shape_;
  Options options_;
  std::unique_ptr<DeviceThreads> threads_;
  std::vector<std::unique_ptr<ReplicaCollective>> groups_;  // [device]: with several replicas, the D sessions of it
  std::vector<std::unique_ptr<Session>> sessions_;          // [g]: device g mod P of replica g / P (they point into groups_)
  std::vector<float> losses_;                               // the last step's micro-batch losses, replica by replica
  Trace trace_;
  std::vector<std::string> errors_;
  std::vector<char> applied_;  // [device]: the last step's update was applied
  bool needs_reset_ = false;
  std::string broken_;  // why a reset failed: the run cannot go on
  long long step_count_ = 0;
};

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
template <class MakeDevice>
Pipeline<B, T, C, L, O>::Pipeline(const Program& program, MakeDevice&& make_device, const Options& options, L loss,
                                  const MakeReplicaCollective& make_replicas)
    : shape_(program.shape), options_(options) {
  const LoweredProgram lp = check_run(program, options, "pipeline");
  const int P = shape_.devices, D = options.replicas, G = P * D;
  if constexpr (!std::invocable<MakeDevice&, int, int>) {
    if (D > 1)
      throw_error({}, "pipeline: ", D, " replicas, but make_device(d) builds one; data parallelism needs "
                  "make_device(device, replica)");
  }
  if constexpr (!std::copy_constructible<L>) {
    if (D > 1) throw_error({}, "pipeline: ", D, " replicas need a loss of each replica: the loss must be copyable");
  }
  threads_ = std::make_unique<DeviceThreads>(G);
  std::vector<std::unique_ptr<Parts>> parts(static_cast<std::size_t>(G));
  sessions_.resize(static_cast<std::size_t>(G));
  if (D > 1)
    for (int d = 0; d < P; ++d) {
      groups_.push_back(make_replicas ? make_replicas(d, D, options.timeout)
                                      : std::make_unique<ReplicaGroup>(d, D, options.timeout));
      if (groups_.back() == nullptr || groups_.back()->replicas() != D)
        throw_error({}, "pipeline: the replica collective of device ", d, " is not one of ", D, " replicas");
    }
  try {
    on_devices([&](int g) {
      const int d = g % P, r = g / P;
      try {
        if constexpr (std::invocable<MakeDevice&, int, int>)
          parts[static_cast<std::size_t>(g)] = std::make_unique<Parts>(make_device(d, r));
        else
          parts[static_cast<std::size_t>(g)] = std::make_unique<Parts>(make_device(d));
      } catch (const std::exception& e) {
        throw_error({}, "pipeline: building device ", d, replica_words(r), ": ", e.what());
      }
    });
    for (int g = 0; g < G; ++g) check_parts(*parts[static_cast<std::size_t>(g)], shape_, g % P, "pipeline");
    for (int stage = 0; stage + 1 < shape_.stages(); ++stage)
      check_neighbours(stage_ends(chunk_of(parts, stage)), stage_ends(chunk_of(parts, stage + 1)), stage, "pipeline");
    std::vector<std::optional<L>> losses(static_cast<std::size_t>(D));  // each replica's (the last: `loss` itself)
    if constexpr (std::copy_constructible<L>)
      for (int r = 0; r + 1 < D; ++r) losses[static_cast<std::size_t>(r)].emplace(loss);
    losses.back().emplace(std::move(loss));
    on_devices([&](int g) {
      const auto i = static_cast<std::size_t>(g);
      const int d = g % P, r = g / P;
      try {
        const ReplicaLink link{D > 1 ? groups_[static_cast<std::size_t>(d)].get() : nullptr, r};
        sessions_[i] = Session::make(std::move(*parts[i]), lp, d, options, *losses[static_cast<std::size_t>(r)], link);
      } catch (const std::exception& e) {
        throw_error({}, "pipeline: allocating the buffers of device ", d, replica_words(r), ": ", e.what());
      }
      parts[i].reset();
    });
  } catch (...) {
    release(parts);
    throw;
  }
  trace_ = measured_trace(shape_);
  if constexpr (SizedChunk<C>) trace_.peak_bytes.assign(static_cast<std::size_t>(shape_.devices), 0.0);
  errors_.resize(static_cast<std::size_t>(G));
  applied_.assign(static_cast<std::size_t>(G), 0);
}

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
StepResult Pipeline<B, T, C, L, O>::train_step(std::span<const float> inputs, std::span<const float> targets) {
  const std::size_t in_size = session(shape_.device_of_stage(0)).input_size();
  const std::size_t target_size = last_session().target_size();
  check_batch(inputs, targets, options_.rows, in_size, target_size);
  ++step_count_;
  if (!broken_.empty()) throw_error({}, "training step ", step_count_, ": the run cannot go on: ", broken_);
  if (needs_reset_) {
    // The first device to fail names the cause; a device whose reset fails still meets the others in the
    // transport's reset (Session::reset), so none waits for it.
    std::atomic<int> first{-1};
    std::vector<std::string> why(sessions_.size());
    on_devices([&](int g) {
      try {
        session(g).reset();
      } catch (const std::exception& e) {
        why[static_cast<std::size_t>(g)] = e.what();
        int none = -1;
        first.compare_exchange_strong(none, g);
      }
    });
    std::string failed = first.load() >= 0 ? why[static_cast<std::size_t>(first.load())] : std::string();
    try {
      if (failed.empty())
        for (auto& group : groups_) group->reset();
    } catch (const std::exception& e) {
      failed = e.what();
    }
    if (!failed.empty()) {
      // A reset that fails leaves the devices where they stopped (a CUDA error after which nothing of the process
      // can run, a device stuck): no later step tries again, each says why.
      broken_ = error_text({}, "making the run usable again after the failed step: ", failed);
      throw_error({}, "training step ", step_count_, ": the run cannot go on: ", broken_);
    }
    needs_reset_ = false;
  }
  std::atomic<int> first{-1};
  std::fill(applied_.begin(), applied_.end(), 0);
  const auto shard = static_cast<std::size_t>(options_.rows / options_.replicas);
  auto work = [&](int g) {
    Session& s = session(g);
    const auto r = static_cast<std::size_t>(g / shape_.devices);
    try {
      const float* x = inputs.empty() ? inputs.data() : inputs.data() + r * shard * in_size;
      const float* y = targets.empty() ? targets.data() : targets.data() + r * shard * target_size;
      applied_[static_cast<std::size_t>(g)] = s.run(x, y) ? 1 : 0;
      if (r == 0) s.record(trace_);
    } catch (const std::exception& e) {
      fail(first, g, e.what());
    } catch (...) {
      fail(first, g, error_text(s.where(), "unknown exception"));
    }
  };
  on_devices(work);
  if (first.load() >= 0) {
    // A device's reducer may still be in a sum that writes into other devices' gradients (in place) or
    // copies (the abort ends its waits, not its writes): all end before the caller may free anything.
    on_devices([&](int g) { session(g).settle(); });
    needs_reset_ = true;
    throw_error({}, errors_[static_cast<std::size_t>(first.load())], " (", not_applied("device"), ")");
  }
  if (!std::all_of(applied_.begin(), applied_.end(), [](char a) { return a != 0; })) {
    std::string what;  // a loss's problem explains every other; then the first in device order
    for (int pass = 0; pass < 2 && what.empty(); ++pass)
      for (std::size_t g = 0; g < sessions_.size() && what.empty(); ++g)
        if (!sessions_[g]->problem().empty() && (pass == 1 || sessions_[g]->problem_is_loss()))
          what = (options_.replicas > 1 ? "replica " + std::to_string(g / static_cast<std::size_t>(shape_.devices)) +
                                              ": "
                                        : std::string()) +
                 sessions_[g]->problem();
    throw_error({}, "training step ", step_count_, ": ", what, "; ", not_applied("device"));
  }
  losses_.clear();
  for (int r = 0; r < options_.replicas; ++r)
    for (const float l : last_session(r).losses()) losses_.push_back(l);
  double sum = 0;
  for (const float l : losses_) sum += l;
  return {losses_.empty() ? 0.0 : sum / static_cast<double>(losses_.size())};
}

}  // namespace pipeweave
