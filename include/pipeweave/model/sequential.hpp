#pragma once
/// \file
/// The sequential reference: a model's chunks, in model order, on one backend; no
/// pipeline, no threads, no transport. What "sequential training" means here,
/// precisely:
///
/// - a step splits the batch into M micro-batches of equal size and, for
///   m = 0 .. M-1 in turn (or M-1 .. 0: set_gradient_order()), runs the forward of every chunk, the loss of micro-batch
///   m and its gradient, and the backward of every chunk in reverse order, each
///   chunk adding its parameter gradients into one sum;
/// - then one optimizer step on that sum scaled by 1/M (the gradient averaged
///   over micro-batches; with equal micro-batches and a mean loss, the gradient of
///   the batch's loss).
///
/// A pipeline runs the very same chunk operations on the same micro-batches and
/// adds each chunk's gradients in micro-batch order too (every built-in schedule
/// runs a chunk's backwards, or W's, in increasing micro-batch order, but
/// looped-bfs, which runs them in decreasing order: set_gradient_order() makes
/// the reference do the same), so its parameters are equal to these bit for bit.
/// The built-in MLP's reference is one MlpChunk
/// holding all L layers, which computes exactly what its stages' chunks compute
/// in turn. With M = 1 this is plain full-batch training; other M give the same
/// result up to fp32 rounding of the gradient sum.
///
/// The batch reaches the backend as a pipeline's does: a micro-batch at a time,
/// ahead of its forward (runtime/batch_feed.hpp).

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/batch_feed.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/parameter_copies.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The order in which a chunk adds its micro-batches' parameter gradients.
enum class GradientOrder : unsigned char {
  kIncreasing,  ///< micro-batch 0 first (every built-in schedule but looped-bfs)
  kDecreasing,  ///< micro-batch M-1 first (looped-bfs runs its backwards in reverse)
  kMixed,       ///< some other order, or chunks that differ (only a custom schedule)
};

/// The order in which every chunk of `p` adds its parameter gradients (its B or
/// W actions, by micro-batch). SequentialTrainer::set_gradient_order() makes the
/// reference add them in the same order; then training through `p` equals it bit
/// for bit. Orders that are neither (kMixed) differ from it by the rounding of a
/// sum taken in another order.
inline GradientOrder gradient_order(const Program& p) {
  bool up = true, down = true;
  for (const auto& device : p.devices) {
    std::vector<int> last(static_cast<std::size_t>(p.shape.chunks), -1);
    for (const Action& a : device) {
      if (!phase_row(a.phase).weight_gradient) continue;
      int& l = last.at(static_cast<std::size_t>(a.chunk));
      if (l >= 0) {
        up = up && a.micro_batch > l;
        down = down && a.micro_batch < l;
      }
      l = a.micro_batch;
    }
  }
  return up ? GradientOrder::kIncreasing : down ? GradientOrder::kDecreasing : GradientOrder::kMixed;
}

/// Trains a model without a pipeline, as the reference a pipeline must equal.
template <Backend B, class C = MlpChunk<B>, class L = MseLoss, class O = OptimizerConfig>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class SequentialTrainer {
 public:
  /// The chunks make_chunks(backend) returns (in model order), trained on batches
  /// of `rows` samples split into `micro_batches` micro-batches.
  template <class MakeChunks>
    requires std::invocable<MakeChunks&, B&>
  SequentialTrainer(B backend, MakeChunks&& make_chunks, int rows, int micro_batches, const O& optimizer,
                    L loss = L{})
      : backend_(std::move(backend)),
        chunks_(make_chunks(backend_)),
        loss_(std::move(loss)),
        rows_(rows),
        micro_batches_(micro_batches) {
    if (micro_batches < 1 || rows < 1 || rows % micro_batches != 0)
      throw_error({}, "sequential: the batch of ", rows, " samples does not split into ", micro_batches,
                  " equal micro-batches");
    if (chunks_.empty()) throw_error({}, "sequential: the model has no chunk");
    B& b = backend_;
    const std::size_t mb = static_cast<std::size_t>(rows / micro_batches);
    const int stages = static_cast<int>(chunks_.size());
    for (int s = 0; s < stages; ++s) {
      const C& c = chunks_[static_cast<std::size_t>(s)];
      check_chunk_dtypes<B>(c, s, stages, "sequential");
      if (s + 1 < stages)
        check_neighbours(stage_ends(c), stage_ends(chunks_[static_cast<std::size_t>(s) + 1]), s, "sequential");
    }
    check_loss_dtype<L, B>(chunk_dtypes(chunks_.back()).output, stages - 1, "sequential");
    for (C& c : chunks_) {
      const BoundaryDTypes d = chunk_dtypes(c);
      c.reserve(b, 1, static_cast<int>(mb));
      outputs_.push_back(allocate_tensor(b, mb * c.output_size(), d.output));
      input_grads_.push_back(allocate_tensor(b, mb * c.input_size(), d.input));
      dtypes_.push_back(d);
      chunk_first_.push_back(params_.size());
      for (const ParameterView& p : std::span<const ParameterView>(c.parameters())) params_.push_back(p);
    }
    chunk_first_.push_back(params_.size());
    loss_.reserve(b, static_cast<int>(mb), chunks_.back().output_size());
    target_size_ = loss_.target_size(chunks_.back().output_size());
    inputs_ = b.allocate(static_cast<std::size_t>(rows) * chunks_.front().input_size());
    targets_ = b.allocate(static_cast<std::size_t>(rows) * target_size_);
    grad_ = allocate_tensor(b, mb * chunks_.back().output_size(), dtypes_.back().output);
    losses_ = b.allocate(static_cast<std::size_t>(micro_batches));
    copies_.make(b, std::span<C>(chunks_));
    check_.emplace(b, params_, static_cast<std::size_t>(micro_batches));
    optimizer_.emplace(b, params_, optimizer);
  }

  /// The built-in MLP `spec` starting from `init`: one chunk holding all its layers.
  SequentialTrainer(B backend, const MlpSpec& spec, const HostModel& init, int rows, int micro_batches,
                    const O& optimizer)
    requires std::same_as<C, MlpChunk<B>>
      : SequentialTrainer(
            std::move(backend),
            [&](B& b) {
              std::vector<C> one;
              one.emplace_back(b, spec, LayerRange{0, spec.layers()}, init);
              return one;
            },
            rows, micro_batches, optimizer) {}

  /// One training step; returns the mean micro-batch loss. Throws pipeweave::Error,
  /// leaving the parameters as they were, when a loss or gradient is not finite.
  double train_step(std::span<const float> inputs, std::span<const float> targets) {
    const auto rows = static_cast<std::size_t>(rows_);
    if (inputs.size() != rows * chunks_.front().input_size() || targets.size() != rows * target_size_)
      throw_error({}, "sequential: the batch does not have ", rows_, " samples");
    B& b = backend_;
    const int mb = rows_ / micro_batches_;
    const std::size_t in = static_cast<std::size_t>(mb) * chunks_.front().input_size();
    const std::size_t target = static_cast<std::size_t>(mb) * target_size_;
    for (const ParameterView& p : params_) b.fill(p.gradient, p.count, 0.0f);
    if (!inputs_feed_) {  // the first step, or the first in another order: feeds in it
      feed_order_ = micro_batch_order();
      inputs_feed_.emplace(b, inputs_.data(), in, feed_order_);
      targets_feed_.emplace(b, targets_.data(), target, feed_order_);
    }
    inputs_feed_->start(b, inputs.data());
    targets_feed_->start(b, targets.data());
    const std::size_t last = chunks_.size() - 1;
    const int per_replica = micro_batches_ / replicas_;
    try {
      for (int k = 0; k < micro_batches_; ++k) {
        const int j = k % per_replica;  // replica k / per_replica's j-th
        const int m = feed_order_[static_cast<std::size_t>(k)];
        inputs_feed_->ready(b, m);
        targets_feed_->ready(b, m);
        const ChunkCall call{m, 0, mb, optimizer_->steps()};
        const auto mi = static_cast<std::size_t>(m);
        ConstTensorRef x = inputs_.data() + mi * in;
        for (std::size_t s = 0; s < chunks_.size(); ++s) {
          const TensorRef y = tensor(outputs_[s], dtypes_[s].output);
          chunk_forward(chunks_[s], b, call, x, y);
          x = y;
        }
        const TensorRef grad = tensor(grad_, dtypes_[last].output);
        loss_forward_backward(loss_, b, LossCall{m, mb, chunks_.back().output_size()},
                              tensor(outputs_[last], dtypes_[last].output), targets_.data() + mi * target, grad,
                              losses_.data() + mi);
        ConstTensorRef dy = grad;
        for (std::size_t s = chunks_.size(); s-- > 0;) {
          const TensorRef dx = s > 0 ? tensor(input_grads_[s], dtypes_[s].input) : TensorRef{};
          chunk_backward(chunks_[s], b, call, dy, dx);
          dy = dx;
        }
        if (replicas_ > 1 && j == per_replica - 1) fold_replica(k / per_replica);
      }
    } catch (...) {  // no copy of the caller's batch outlives the step
      for (auto* feed : {&inputs_feed_, &targets_feed_}) (*feed)->settle();
      throw;
    }
    check_->read(b, losses_.data());
    double sum = 0;
    for (float l : check_->losses()) sum += l;
    const double bad = check_->bad_values();
    if (!is_finite(static_cast<float>(sum)) || bad != 0)
      throw_error({}, "sequential: the loss or ", static_cast<long long>(bad),
                  " gradient values are not finite; the step was not applied");
    optimizer_->step(b, 1.0f / static_cast<float>(micro_batches_));
    copies_.refresh_all(b);
    b.synchronize();
    return sum / static_cast<double>(micro_batches_);
  }

  /// Sums the gradients as D data-parallel replicas do (runtime/replicas.hpp):
  /// the batch's micro-batches are D shards of M / D in turn, each replica's
  /// gradients are summed over its own micro-batches from zero, and the D sums
  /// are added in replica order, g_0 + g_1 + ... + g_{D-1}. The micro-batches
  /// must split into the D shards.
  void set_replicas(int replicas) {
    if (replicas < 1 || micro_batches_ % replicas != 0)
      throw_error({}, "sequential: ", micro_batches_, " micro-batches do not split into ", replicas, " replicas");
    replicas_ = replicas;
    drop_feeds();
    if (replicas > 1) {
      std::size_t n = 0;
      for (const ParameterView& p : params_) n += p.count;
      replica_sum_.assign(n, 0.0f);
      replica_grad_.assign(n, 0.0f);
    }
  }

  /// The parameters of each chunk on the host: [chunk] = the floats of its
  /// parameter tensors, in order.
  std::vector<std::vector<float>> stage_parameters() {
    std::vector<std::vector<float>> out;
    for (C& c : chunks_) {
      std::vector<float>& v = out.emplace_back();
      for (const ParameterView& p : std::span<const ParameterView>(c.parameters())) {
        const std::size_t at = v.size();
        v.resize(at + p.count);
        backend_.synchronize();
        backend_.download(p.value, v.data() + at, p.count);
      }
    }
    backend_.synchronize();
    return out;
  }

  /// The state on the host (runtime/state.hpp): [chunk] as the stages.
  TrainingState state() {
    TrainingState out;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::size_t first = chunk_first_[c];
      out.stages.push_back(download_stage(backend_, views(c), optimizer_->buffers(),
                                          [&](std::size_t p, int k) { return optimizer_->buffer(first + p, k); }));
    }
    out.updates = optimizer_->steps();
    return out;
  }

  /// Sets the parameters, the rule's state and the updates applied from `state`
  /// ([chunk] as the stages). Throws pipeweave::Error, changing nothing, unless it fits.
  void set_state(const TrainingState& state) {
    if (state.stages.size() != chunks_.size())
      throw_error({}, "sequential: the state has ", state.stages.size(), " stages; the model has ", chunks_.size(),
                  " chunks");
    if (state.updates < 0) throw_error({}, "sequential: ", state.updates, " updates applied; at least 0");
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      check_stage_state(state.stages[c], views(c), optimizer_->buffers(), "chunk " + std::to_string(c));
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::size_t first = chunk_first_[c];
      upload_stage(backend_, state.stages[c], views(c),
                   [&](std::size_t p, int k) { return optimizer_->buffer(first + p, k); });
    }
    copies_.refresh_all(backend_);
    optimizer_->set_steps(state.updates);
  }

  /// The built-in MLP's parameters.
  HostModel weights()
    requires std::same_as<C, MlpChunk<B>>
  {
    HostModel m;
    m.layers.resize(static_cast<std::size_t>(chunks_.front().layers().end));
    backend_.synchronize();
    chunks_.front().download(backend_, m);
    backend_.synchronize();
    return m;
  }

  /// Runs the micro-batches of a step in increasing order (the default) or in
  /// decreasing order, so that each chunk's gradient sum is taken in the order of
  /// a schedule's (gradient_order()). kMixed is refused with pipeweave::Error: no
  /// single order of micro-batches matches it.
  void set_gradient_order(GradientOrder order) {
    if (order == GradientOrder::kMixed)
      throw_error({}, "sequential: no order of micro-batches adds the gradients as this schedule does");
    order_ = order;
    drop_feeds();
  }

  /// The backend (e.g. to count its allocations).
  B& backend() { return backend_; }
  /// The chunks.
  std::vector<C>& chunks() { return chunks_; }

 private:
  std::span<const ParameterView> views(std::size_t c) const {
    return std::span<const ParameterView>(params_).subspan(chunk_first_[c], chunk_first_[c + 1] - chunk_first_[c]);
  }

  // Replica r's micro-batches are done: its gradient sum joins the sum of the
  // replicas before it (replica 0's is that sum), and the gradients start again
  // from zero; after the last replica, the sum is the gradients.
  void fold_replica(int r) {
    B& b = backend_;
    std::size_t at = 0;
    b.synchronize();
    for (const ParameterView& p : params_) {
      b.download(p.gradient, replica_grad_.data() + at, p.count);
      at += p.count;
    }
    b.synchronize();
    for (std::size_t i = 0; i < replica_sum_.size(); ++i)
      replica_sum_[i] = r == 0 ? replica_grad_[i] : replica_sum_[i] + replica_grad_[i];
    const bool last = r + 1 == replicas_;
    at = 0;
    for (const ParameterView& p : params_) {
      if (last) b.upload(replica_sum_.data() + at, p.gradient, p.count);
      else b.fill(p.gradient, p.count, 0.0f);
      at += p.count;
    }
    b.synchronize();
  }

  // Another order of micro-batches: the next step makes feeds in it (after the copies of the last have ended).
  void drop_feeds() {
    for (auto* feed : {&inputs_feed_, &targets_feed_})
      if (*feed) (*feed)->settle();
    inputs_feed_.reset();
    targets_feed_.reset();
  }
  // The micro-batches in the order a step runs them: each replica's in turn, increasing or decreasing.
  std::vector<int> micro_batch_order() const {
    std::vector<int> order;
    const int per_replica = micro_batches_ / replicas_;
    for (int k = 0; k < micro_batches_; ++k) {
      const int base = k / per_replica * per_replica, j = k % per_replica;
      order.push_back(base + (order_ == GradientOrder::kDecreasing ? per_replica - 1 - j : j));
    }
    return order;
  }

  B backend_;
  std::vector<C> chunks_;
  L loss_;
  int rows_;
  int micro_batches_;
  GradientOrder order_ = GradientOrder::kIncreasing;
  int replicas_ = 1;                      // set_replicas()
  std::vector<float> replica_sum_, replica_grad_;  // with several: the sum so far, one replica's gradients
  std::size_t target_size_ = 0;
  std::vector<ParameterView> params_;
  std::vector<std::size_t> chunk_first_;  // [chunk]: its first tensor in params_; [chunks]: params_.size()
  std::vector<typename B::Buffer> outputs_, input_grads_;  // [chunk]
  std::vector<BoundaryDTypes> dtypes_;                      // [chunk]
  ChunkParameterCopies<B> copies_;  // the low-precision copies of the chunks that ask for them
  typename B::Buffer inputs_, targets_, grad_, losses_;
  std::optional<FiniteCheck<B>> check_;
  std::optional<OptimizerState<B, O>> optimizer_;
  std::vector<int> feed_order_;                             // micro_batch_order(), when the feeds were made
  std::optional<BatchFeed<B>> inputs_feed_, targets_feed_;  // the batch's copies, a micro-batch at a time
};

}  // namespace pipeweave
