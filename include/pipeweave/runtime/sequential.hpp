#pragma once
/// \file
/// The sequential reference: the whole MLP on one backend, no pipeline, no
/// threads, no transport. What "sequential training" means here, precisely:
///
/// - one chunk holds all L layers (MlpChunk over [0, L));
/// - a step splits the batch into M micro-batches of equal size and, for m = 0 .. M-1
///   in turn, runs forward, the MSE loss of micro-batch m and its gradient, and
///   backward, adding the parameter gradients into one sum;
/// - then one optimizer step on that sum scaled by 1/M (the gradient averaged
///   over micro-batches; with equal micro-batches, the gradient of the batch's MSE).
///
/// The pipeline runs the very same layer operations on the same micro-batches and
/// adds each chunk's gradients in micro-batch order too (every built-in schedule
/// runs a chunk's backwards in increasing micro-batch order), so its parameters
/// are equal to these bit for bit. With M = 1 this is plain full-batch training;
/// other M give the same result up to fp32 rounding of the gradient sum.

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/functors.hpp"
#include "pipeweave/runtime/layers.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/optimizer.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Trains an MLP without a pipeline, as the reference the pipeline must equal.
template <Backend B>
class SequentialTrainer {
 public:
  /// The model `spec` starting from `init`, trained on batches of `rows` samples
  /// split into `micro_batches` micro-batches.
  SequentialTrainer(B backend, const MlpSpec& spec, const HostModel& init, int rows, int micro_batches,
                    const OptimizerConfig& optimizer)
      : backend_(std::move(backend)),
        spec_(spec),
        chunk_(backend_, spec, LayerRange{0, spec.layers()}, init),
        rows_(rows),
        micro_batches_(micro_batches),
        optimizer_(backend_, chunk_.parameters(), optimizer) {
    if (micro_batches < 1 || rows < 1 || rows % micro_batches != 0)
      throw Error("sequential: the batch of " + std::to_string(rows) + " samples does not split into " +
                  std::to_string(micro_batches) + " equal micro-batches");
    const int mb = rows / micro_batches;
    chunk_.reserve(backend_, 1, mb);
    inputs_ = backend_.allocate(static_cast<std::size_t>(rows) * static_cast<std::size_t>(spec.inputs()));
    targets_ = backend_.allocate(static_cast<std::size_t>(rows) * static_cast<std::size_t>(spec.outputs()));
    output_ = backend_.allocate(static_cast<std::size_t>(mb) * static_cast<std::size_t>(spec.outputs()));
    grad_ = backend_.allocate(static_cast<std::size_t>(mb) * static_cast<std::size_t>(spec.outputs()));
    losses_ = backend_.allocate(static_cast<std::size_t>(micro_batches));
    flag_ = backend_.allocate(1);
    host_losses_.assign(static_cast<std::size_t>(micro_batches), 0.0f);
  }

  /// One training step; returns the mean micro-batch loss. Throws pipeweave::Error,
  /// leaving the parameters as they were, when a loss or gradient is not finite.
  double train_step(std::span<const float> inputs, std::span<const float> targets) {
    const auto rows = static_cast<std::size_t>(rows_);
    if (inputs.size() != rows * static_cast<std::size_t>(spec_.inputs()) ||
        targets.size() != rows * static_cast<std::size_t>(spec_.outputs()))
      throw Error("sequential: the batch does not have " + std::to_string(rows_) + " samples");
    B& b = backend_;
    const int mb = rows_ / micro_batches_;
    const std::size_t in = static_cast<std::size_t>(mb) * static_cast<std::size_t>(spec_.inputs());
    const std::size_t out = static_cast<std::size_t>(mb) * static_cast<std::size_t>(spec_.outputs());
    const ParameterView& p = chunk_.parameters()[0];
    b.fill(p.gradient, p.count, 0.0f);
    b.upload(inputs.data(), inputs_.data(), inputs.size());
    b.upload(targets.data(), targets_.data(), targets.size());
    for (int m = 0; m < micro_batches_; ++m) {
      const ChunkCall call{m, 0, mb};
      const auto mi = static_cast<std::size_t>(m);
      chunk_.forward(b, call, inputs_.data() + mi * in, output_.data());
      MseLoss::forward_backward(b, output_.data(), targets_.data() + mi * out, out, grad_.data(), losses_.data() + mi);
      chunk_.backward(b, call, grad_.data(), nullptr);
    }
    b.sum(p.count, NonFinite{p.gradient}, flag_.data());
    float bad = 0;
    b.download(flag_.data(), &bad, 1);
    b.download(losses_.data(), host_losses_.data(), host_losses_.size());
    b.synchronize();
    double sum = 0;
    for (float l : host_losses_) sum += l;
    if (!is_finite(static_cast<float>(sum)) || bad != 0.0f)
      throw Error("sequential: the loss or " + std::to_string(static_cast<long long>(bad)) +
                  " gradient values are not finite; the step was not applied");
    optimizer_.step(b, 1.0f / static_cast<float>(micro_batches_));
    b.synchronize();
    return sum / static_cast<double>(micro_batches_);
  }

  /// The current parameters.
  HostModel weights() {
    HostModel m;
    m.layers.resize(static_cast<std::size_t>(spec_.layers()));
    chunk_.download(backend_, m);
    backend_.synchronize();
    return m;
  }

  /// The backend (e.g. to count its allocations).
  B& backend() { return backend_; }

 private:
  B backend_;
  MlpSpec spec_;
  MlpChunk<B> chunk_;
  int rows_;
  int micro_batches_;
  Optimizer<B> optimizer_;
  typename B::Buffer inputs_, targets_, output_, grad_, losses_, flag_;
  std::vector<float> host_losses_;
};

}  // namespace pipeweave
