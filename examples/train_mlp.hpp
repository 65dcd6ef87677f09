// The backends of train_mlp, behind an interface that needs no backend header,
// so that train_mlp.cpp is plain C++ in every build. Each backend is a
// translation unit of its own that registers itself (train_mlp_cpu.cpp,
// train_mlp_cuda.cu where the build has CUDA); --backend finds them by the rows
// of tool::kBackendRows.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/training.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/model/defaults.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/run.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"

namespace train_mlp {

/// A pipeline of one process: what train_mlp's training loop uses of it.
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  /// One training step on the batch.
  virtual pipeweave::StepResult train_step(std::span<const float> inputs, std::span<const float> targets) = 0;
  /// The measured trace of the last step.
  virtual const pipeweave::Trace& trace() const = 0;
  /// The plan of device d.
  virtual const pipeweave::DevicePlan& plan(int device) const = 0;
  /// Each virtual stage's parameters on the host (pipeweave::download_weights() reads them).
  virtual std::vector<std::vector<float>> stage_parameters() = 0;
  /// Copies the run's state to the host into `out` (a checkpoint's content).
  virtual void copy_state(pipeweave::TrainingState& out) = 0;
  /// Sets the run's state (a resumed run, a switch of programs).
  virtual void set_state(const pipeweave::TrainingState& state) = 0;
  /// How the replicas' gradients are summed, e.g. "in place in host memory, in replica order".
  virtual const std::string& gradient_sums() const = 0;
};

/// Sequential training on one device: the reference of a pipeline.
class Reference {
 public:
  virtual ~Reference() = default;
  /// One training step; returns the mean micro-batch loss.
  virtual double train_step(std::span<const float> inputs, std::span<const float> targets) = 0;
  /// The current parameters.
  virtual pipeweave::HostModel weights() = 0;
  /// Adds the gradients in this order of micro-batches (SequentialTrainer::set_gradient_order).
  virtual void set_gradient_order(pipeweave::GradientOrder order) = 0;
  /// Sets the state (a resumed run).
  virtual void set_state(const pipeweave::TrainingState& state) = 0;
};

/// A pipeline of the library (any backend) as a Pipeline.
template <class P>
class PipelineOf final : public Pipeline {
 public:
  PipelineOf(std::unique_ptr<P> p, std::string gradient_sums) : p_(std::move(p)), sums_(std::move(gradient_sums)) {}
  pipeweave::StepResult train_step(std::span<const float> inputs, std::span<const float> targets) override {
    return p_->train_step(inputs, targets);
  }
  const pipeweave::Trace& trace() const override { return p_->trace(); }
  const pipeweave::DevicePlan& plan(int device) const override { return p_->plan(device); }
  std::vector<std::vector<float>> stage_parameters() override { return p_->stage_parameters(); }
  void copy_state(pipeweave::TrainingState& out) override { p_->copy_state(out); }
  void set_state(const pipeweave::TrainingState& state) override { p_->set_state(state); }
  const std::string& gradient_sums() const override { return sums_; }

 private:
  std::unique_ptr<P> p_;
  std::string sums_;
};

/// A sequential trainer of the library (any backend) as a Reference; `replicas`
/// > 1 makes it add each replica's gradient sum, then the replicas in order, as
/// the pipeline's reductions do.
template <class R>
class ReferenceOf final : public Reference {
 public:
  ReferenceOf(std::unique_ptr<R> r, int replicas) : r_(std::move(r)) { r_->set_replicas(replicas); }
  double train_step(std::span<const float> inputs, std::span<const float> targets) override {
    return r_->train_step(inputs, targets);
  }
  pipeweave::HostModel weights() override { return r_->weights(); }
  void set_gradient_order(pipeweave::GradientOrder order) override { r_->set_gradient_order(order); }
  void set_state(const pipeweave::TrainingState& state) override { r_->set_state(state); }

 private:
  std::unique_ptr<R> r_;
};

/// A backend of train_mlp. `devices` counts the device threads, P x D with
/// data-parallel replicas.
class Backend : public pipeweave::tool::BackendImpl {
 public:
  /// What is wrong with the flags for it beyond what training_flags_problem() sees (empty: nothing).
  virtual std::string check(const pipeweave::tool::TrainingFlags&, int /*devices*/) const { return ""; }
  /// The backend line of train_mlp's header.
  virtual std::string describe(const pipeweave::tool::TrainingFlags& flags, int devices) const = 0;
  /// Whether the two halves of an overlapped pair run at once on `devices` pipeline devices.
  virtual bool pairs_at_once(int devices) const = 0;
  /// How fast a pipelined step can be at best against the sequential one, given the
  /// program's simulated bubble; empty where nothing bounds it but the bubble.
  virtual std::string step_bound(int /*devices*/, double /*bubble*/) const { return ""; }
  /// The pipeline of a run (`options.replicas` replicas of the program).
  virtual std::unique_ptr<Pipeline> make_pipeline(const pipeweave::Program& program, const pipeweave::MlpSpec& spec,
                                                  const pipeweave::HostModel& init,
                                                  const pipeweave::PipelineOptions& options,
                                                  const pipeweave::tool::TrainingFlags& flags) const = 0;
  /// Its sequential reference on one device, in the same arithmetic: `micro_batches` of each of `replicas`.
  virtual std::unique_ptr<Reference> make_reference(const pipeweave::MlpSpec& spec, const pipeweave::HostModel& init,
                                                    int rows, int micro_batches, int replicas,
                                                    const pipeweave::OptimizerConfig& optimizer,
                                                    const pipeweave::tool::TrainingFlags& flags) const = 0;
};

/// train_mlp's backends in this build.
using Registry = pipeweave::tool::BackendRegistry<Backend>;

}  // namespace train_mlp
