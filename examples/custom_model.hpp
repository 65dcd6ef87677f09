// The model of examples/custom_chunk.cu, shared by its two halves: a stack of
// dense layers y = tanh(x W^T + b) (the last one without the tanh: it gives the
// logits) trained with a softmax cross-entropy over class indices, as a Chunk
// (DenseChunk) and a Loss (CrossEntropy) of the runtime's concepts.
//
// The chunks are bf16 chunks: each gives its output (and takes its output's
// gradient) in bf16, and takes bf16 input, but for the first, which takes the
// batch's fp32 inputs (its dtypes() say so). The engine hands bf16 between them,
// half the bytes of fp32; the arithmetic inside is fp32, and the loss reads the
// bf16 logits. Parameters and their gradients are fp32.
//
// The arithmetic of one output element, one gradient element and one row of the
// loss is written once, below, as functions callable on the host and the device.
// How they run over a tensor is the `Ops` of each half: the GPU half
// (custom_chunk.cu) launches kernels of its own on the backend's stream, the CPU
// half (custom_chunk_cpu.cpp) uses the CPU backend's for_each. This header
// includes no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <math.h>
#include <span>
#include <vector>

#include "pipeweave/model/functors.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"

namespace custom {

/// The run both halves train.
struct Setup {
  int features = 16;           ///< width of every layer, and the number of classes
  int stages = 4;              ///< layers: one per virtual stage (P * V)
  int rows = 64;               ///< samples per batch
  int micro_batches = 4;       ///< M
  int steps = 30;              ///< training steps
  float learning_rate = 0.1f;  ///< SGD with momentum 0.9
  std::uint64_t seed = 5;      ///< the initial parameters and the data
};

using pipeweave::bf16;
using pipeweave::to_float;

/// Output element (r, o) of a dense layer: sum over k in order of x[r][k] w[o][k],
/// plus b[o], through tanh when `activate`; x is fp32 or bf16 (X), the sum fp32.
template <class X>
PIPEWEAVE_HOST_DEVICE inline float dense_out(const X* x, const float* w, const float* b, int r, int o, int in,
                                             bool activate) {
  float acc = b[o];
  for (int k = 0; k < in; ++k) acc += to_float(x[r * in + k]) * w[o * in + k];
  return activate ? tanhf(acc) : acc;
}

/// The gradient before the activation: dy (1 - y^2) after a tanh, else dy.
PIPEWEAVE_HOST_DEVICE inline float dense_dz(const bf16* y, const bf16* dy, int i, bool activate) {
  const float g = to_float(dy[i]), v = to_float(y[i]);
  return activate ? g * (1.0f - v * v) : g;
}

/// dW[o][k] = sum over rows r in order of dz[r][o] x[r][k].
template <class X>
PIPEWEAVE_HOST_DEVICE inline float dense_weight_grad(const float* dz, const X* x, int rows, int in, int out, int o,
                                                     int k) {
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += dz[r * out + o] * to_float(x[r * in + k]);
  return acc;
}

/// db[o] = sum over rows r in order of dz[r][o].
PIPEWEAVE_HOST_DEVICE inline float dense_bias_grad(const float* dz, int rows, int out, int o) {
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += dz[r * out + o];
  return acc;
}

/// dx[r][k] = sum over o in order of dz[r][o] w[o][k].
PIPEWEAVE_HOST_DEVICE inline float dense_input_grad(const float* dz, const float* w, int in, int out, int r, int k) {
  float acc = 0.0f;
  for (int o = 0; o < out; ++o) acc += dz[r * out + o] * w[o * in + k];
  return acc;
}

/// Row r of the softmax cross-entropy of bf16 logits y (rows x classes) against
/// the class index target[r]: writes the gradient (softmax - one-hot) * scale
/// into dy's row, rounded to bf16, and returns the row's loss,
/// log(sum exp y) - y[target].
PIPEWEAVE_HOST_DEVICE inline float cross_entropy_row(const bf16* y, const float* target, bf16* dy, int r, int classes,
                                                     float scale) {
  const bf16* row = y + r * classes;
  float top = to_float(row[0]);
  for (int j = 1; j < classes; ++j) top = to_float(row[j]) > top ? to_float(row[j]) : top;
  float sum = 0.0f;
  for (int j = 0; j < classes; ++j) sum += expf(to_float(row[j]) - top);
  const int t = static_cast<int>(target[r]);
  for (int j = 0; j < classes; ++j)
    dy[r * classes + j] = pipeweave::to_bf16(scale * (expf(to_float(row[j]) - top) / sum - (j == t ? 1.0f : 0.0f)));
  return logf(sum) + top - to_float(row[t]);
}

/// The initial W (features x features) and b of the layer of virtual stage `stage`.
inline std::vector<float> initial_parameters(const Setup& s, int stage) {
  pipeweave::Rng rng(s.seed * 7919 + static_cast<std::uint64_t>(stage));
  const auto f = static_cast<std::size_t>(s.features);
  std::vector<float> p(f * f + f);
  const float bound = 1.5f / sqrtf(static_cast<float>(s.features));
  for (float& v : p) v = rng.uniform(-bound, bound);
  return p;
}

/// The batch: inputs uniform in [-1, 1) and, as each sample's class, the index of
/// its largest input (rows x 1 floats).
struct Batch {
  std::vector<float> inputs, targets;
};
inline Batch make_batch(const Setup& s) {
  pipeweave::Rng rng(s.seed * 31 + 7);
  Batch b;
  b.inputs.resize(static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(s.features));
  for (float& v : b.inputs) v = rng.uniform(-1.0f, 1.0f);
  for (int r = 0; r < s.rows; ++r) {
    const float* row = b.inputs.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(s.features);
    int best = 0;
    for (int j = 1; j < s.features; ++j) best = row[j] > row[best] ? j : best;
    b.targets.push_back(static_cast<float>(best));
  }
  return b;
}

/// One dense layer as a Chunk of bf16 ends (fp32 input at the first stage):
/// parameters W (features x features) then b, its gradients in the same layout;
/// it keeps x and y of each micro-batch in flight (the executor leaves them
/// untouched until backward). `Ops` runs the arithmetic above over whole tensors
/// on backend B (see the file comment), for x of either dtype.
template <pipeweave::Backend B, class Ops>
class DenseChunk {
 public:
  /// The layer of virtual stage `stage`, initialised by initial_parameters().
  DenseChunk(B& backend, const Setup& s, int stage)
      : features_(s.features),
        activate_(stage + 1 < s.stages),
        dtypes_{stage == 0 ? pipeweave::DType::kF32 : pipeweave::DType::kBF16, pipeweave::DType::kBF16},
        params_(backend.allocate(static_cast<std::size_t>(s.features) * (s.features + 1))),
        grads_(backend.allocate(params_.size())) {
    const std::vector<float> init = initial_parameters(s, stage);
    backend.upload(init.data(), params_.data(), init.size());
    backend.synchronize();
    view_ = {params_.data(), grads_.data(), params_.size()};
  }
  std::size_t input_size() const { return static_cast<std::size_t>(features_); }
  std::size_t output_size() const { return static_cast<std::size_t>(features_); }
  pipeweave::BoundaryDTypes dtypes() const { return dtypes_; }
  void reserve(B& backend, int slots, int rows) {
    kept_x_.assign(static_cast<std::size_t>(slots), nullptr);
    kept_y_.assign(static_cast<std::size_t>(slots), nullptr);
    dz_ = backend.allocate(static_cast<std::size_t>(rows) * static_cast<std::size_t>(features_));
  }
  void forward(B& backend, const pipeweave::ChunkCall& call, pipeweave::ConstTensorRef x, pipeweave::TensorRef y) {
    kept_x_[static_cast<std::size_t>(call.slot)] = x;
    kept_y_[static_cast<std::size_t>(call.slot)] = y.as<bf16>();
    pipeweave::visit_dtype<pipeweave::FloatingStorageTypes>(x.dtype(), [&]<class X>(X) {
      Ops::dense_forward(backend, x.as<X>(), weights(), bias(), y.as<bf16>(), call.rows, features_, activate_);
    });
  }
  void backward(B& backend, const pipeweave::ChunkCall& call, pipeweave::ConstTensorRef dy, pipeweave::TensorRef dx) {
    const auto slot = static_cast<std::size_t>(call.slot);
    const pipeweave::ConstTensorRef x = kept_x_[slot];
    pipeweave::visit_dtype<pipeweave::FloatingStorageTypes>(x.dtype(), [&]<class X>(X) {
      Ops::dense_backward(backend, x.as<X>(), kept_y_[slot], dy.as<bf16>(), dz_.data(), weights(), grads_.data(),
                          grads_.data() + weight_count(), dx.as<X>(), call.rows, features_, activate_);
    });
  }
  std::span<const pipeweave::ParameterView> parameters() const { return {&view_, 1}; }

 private:
  std::size_t weight_count() const { return static_cast<std::size_t>(features_) * static_cast<std::size_t>(features_); }
  const float* weights() const { return params_.data(); }
  const float* bias() const { return params_.data() + weight_count(); }

  int features_;
  bool activate_;
  pipeweave::BoundaryDTypes dtypes_;
  typename B::Buffer params_, grads_, dz_;
  pipeweave::ParameterView view_{};
  std::vector<pipeweave::ConstTensorRef> kept_x_;
  std::vector<const bf16*> kept_y_;
};

/// The softmax cross-entropy over class indices (one float per sample) of bf16
/// logits, averaged over the micro-batch's rows, as a Loss; `Ops` as for DenseChunk.
template <pipeweave::Backend B, class Ops>
class CrossEntropy {
 public:
  std::size_t target_size(std::size_t) const { return 1; }
  void reserve(B& backend, int rows, std::size_t) { row_losses_ = backend.allocate(static_cast<std::size_t>(rows)); }
  void forward_backward(B& backend, const pipeweave::LossCall& call, pipeweave::ConstTensorRef y, const float* target,
                        pipeweave::TensorRef dy, float* loss) {
    Ops::cross_entropy(backend, y.as<bf16>(), target, dy.as<bf16>(), row_losses_.data(), loss, call.rows,
                       static_cast<int>(call.features));
  }

 private:
  typename B::Buffer row_losses_;
};

/// What a run gives: every step's loss and the final parameters of every stage.
struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> parameters;
};

/// The same model and data trained on the CPU backend (custom_chunk_cpu.cpp).
Run train_on_cpu(const Setup& setup);

}  // namespace custom
