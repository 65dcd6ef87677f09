// The GPU path of train_mlp, behind an interface that needs no CUDA header, so
// that train_mlp.cpp stays plain C++: built from train_mlp_gpu.cu where the CUDA
// backend is available, and from train_mlp_no_gpu.cpp elsewhere.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/model/defaults.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"

namespace train_mlp_gpu {

/// Whether this build has the CUDA backend.
bool built();
/// GPUs the CUDA backend can use (0 without the backend or without a GPU).
int gpus();

/// The GPU settings of a run, as given on the command line.
struct Settings {
  std::string transport = "auto";  ///< auto, nccl or virtual
  std::string math = "fp32";       ///< fp32, tf32 or bf16
};

/// What is wrong with the settings for `devices` device threads (P, or P x D with
/// data-parallel replicas; empty when nothing); checks the
/// names and, with GPUs present, whether the transport can run.
std::string check(const Settings& settings, int devices);

/// The backend line of train_mlp's header, e.g. "cuda (NVIDIA H200, cuBLAS fp32,
/// Thrust), 4 devices on 1 GPU, transport virtual (cudaMemcpyAsync and events)".
std::string describe(const Settings& settings, int devices);

/// A pipeline on GPUs: what train_mlp's training loop uses.
class Pipeline {
 public:
  virtual ~Pipeline() = default;
  /// One training step on the batch.
  virtual pipeweave::StepResult train_step(std::span<const float> inputs, std::span<const float> targets) = 0;
  /// The measured trace of the last step.
  virtual const pipeweave::Trace& trace() const = 0;
  /// The plan of device d.
  virtual const pipeweave::DevicePlan& plan(int device) const = 0;
  /// The parameters gathered from all devices.
  virtual pipeweave::HostModel weights(const pipeweave::MlpSpec& spec) = 0;
  /// Copies the run's state to the host into `out` (a checkpoint's content).
  virtual void copy_state(pipeweave::TrainingState& out) = 0;
  /// Sets the run's state (a resumed run).
  virtual void set_state(const pipeweave::TrainingState& state) = 0;
  /// How the replicas' gradients are summed, e.g. "through host memory, in replica order".
  virtual std::string gradient_sums() const = 0;
};

/// The parameters of a GPU pipeline (the name train_mlp's loop calls).
inline pipeweave::HostModel download_weights(Pipeline& pipeline, const pipeweave::MlpSpec& spec) {
  return pipeline.weights(spec);
}

/// Sequential training on one GPU: the reference of a GPU pipeline.
class Reference {
 public:
  virtual ~Reference() = default;
  /// One training step; returns the mean micro-batch loss.
  virtual double train_step(std::span<const float> inputs, std::span<const float> targets) = 0;
  /// The current parameters.
  virtual pipeweave::HostModel weights() = 0;
  /// Adds the gradients in this order of micro-batches (SequentialTrainer::set_gradient_order).
  virtual void set_gradient_order(pipeweave::GradientOrder order) = 0;
  /// The state on the host ([0]: the one chunk of all layers).
  virtual pipeweave::TrainingState state() = 0;
  /// Sets the state (a resumed run).
  virtual void set_state(const pipeweave::TrainingState& state) = 0;
};

/// The GPU pipeline of a run.
std::unique_ptr<Pipeline> make_pipeline(const pipeweave::Program& program, const pipeweave::MlpSpec& spec,
                                        const pipeweave::HostModel& init, const pipeweave::PipelineOptions& options,
                                        const Settings& settings);

/// The sequential GPU reference of a run (on the GPU of device 0, same arithmetic):
/// `micro_batches` per replica; with `replicas` > 1 it adds each replica's
/// gradient sum, then the replicas in order, as the run's reductions do.
std::unique_ptr<Reference> make_reference(const pipeweave::MlpSpec& spec, const pipeweave::HostModel& init, int rows,
                                          int micro_batches, int replicas, const pipeweave::OptimizerConfig& optimizer,
                                          const Settings& settings);

}  // namespace train_mlp_gpu
