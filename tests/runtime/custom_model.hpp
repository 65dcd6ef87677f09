// A model of the tests' own, written only against the runtime's concepts, so that
// the same types run on the CPU backend (test_custom.cpp) and compile for the
// CUDA backend and the multi-process host (cuda/test_mpi_gpu.cu):
//
// - TanhChunk: y = tanh(a * x + b) per feature, with a learned scale a and shift b
//   per feature (nothing like the built-in Linear/ReLU stack);
// - HuberLoss: the Huber loss with delta = 1 (quadratic near the target, linear
//   beyond), averaged over the micro-batch's values.
//
// Both are typed: a chunk's ends have the dtype it is made with (fp32 or bf16;
// the first stage takes the batch's fp32), the loss reads the last stage's.
// Every sum runs in a fixed order (rows in increasing order), so pipelined
// training equals sequential training bit for bit.
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

namespace pipeweave::test {

/// y[i] = tanh(a[f] x[i] + b[f]) with f the feature of i; x of dtype X, y of Y,
/// a and b of W (the fp32 masters or their bf16 copies).
template <class X, class Y, class W>
struct TanhForward {
  const X* x;
  const W* a;
  const W* b;
  Y* y;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t f = i % features;
    y[i] = from_float<Y>(tanhf(to_float(a[f]) * to_float(x[i]) + to_float(b[f])));
  }
};

/// dz[i] = dy[i] (1 - y[i]^2): the gradient before the tanh.
template <class Y>
struct TanhGradient {
  const Y* y;
  const Y* dy;
  float* dz;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = to_float(y[i]);
    dz[i] = to_float(dy[i]) * (1.0f - v * v);
  }
};

/// da[f] += sum over rows of dz x, db[f] += sum over rows of dz; one call per feature f.
template <class X>
struct TanhParameterGradient {
  const float* dz;
  const X* x;
  float* da;
  float* db;
  std::size_t rows;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t f) const {
    float sa = 0.0f, sb = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
      sa += dz[r * features + f] * to_float(x[r * features + f]);
      sb += dz[r * features + f];
    }
    da[f] += sa;
    db[f] += sb;
  }
};

/// dx[i] = dz[i] a[f], stored as X; a of W.
template <class X, class W>
struct TanhInputGradient {
  const float* dz;
  const W* a;
  X* dx;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    dx[i] = from_float<X>(dz[i] * to_float(a[i % features]));
  }
};

/// One stage: y = tanh(a * x + b) over `features` features. Parameters: a then b.
/// Its ends have `dtype` (its input fp32 at stage 0, the batch's); the arithmetic is
/// fp32. It computes with a and b in `weights`: the fp32 masters, or the engine's
/// bf16 copies of them (CopiesParameters, runtime/parameter_copies.hpp).
template <Backend B>
class TanhChunk {
 public:
  /// The chunk of virtual stage `stage`; its initial a and b depend only on the
  /// stage and the seed.
  TanhChunk(B& backend, std::size_t features, int stage, std::uint64_t seed, DType dtype = DType::kF32,
            DType weights = DType::kF32)
      : features_(features),
        dtypes_{stage == 0 ? DType::kF32 : dtype, dtype},
        weights_(weights),
        params_(backend.allocate(2 * features)),
        grads_(backend.allocate(2 * features)) {
    Rng rng(seed * 7919 + static_cast<std::uint64_t>(stage));
    std::vector<float> init(2 * features);
    for (std::size_t f = 0; f < features; ++f) {
      init[f] = rng.uniform(0.5f, 1.5f);
      init[features + f] = rng.uniform(-0.2f, 0.2f);
    }
    backend.upload(init.data(), params_.data(), init.size());
    backend.synchronize();
    view_ = {params_.data(), grads_.data(), 2 * features};
  }
  std::size_t input_size() const { return features_; }
  std::size_t output_size() const { return features_; }
  BoundaryDTypes dtypes() const { return dtypes_; }
  DType parameter_copy_dtype() const { return weights_; }
  void use_parameter_copies(std::span<const ConstTensorRef> copies) { copy_ = copies[0]; }
  /// The engine's copy of a and b (empty with fp32 weights).
  ConstTensorRef parameter_copy() const { return copy_; }
  /// Its forward keeps only pointers to x and y, which the session keeps: run
  /// again, it keeps the same (RecomputableChunk).
  static constexpr bool recomputable = true;

  void reserve(B& backend, int slots, int rows) {
    kept_x_.assign(static_cast<std::size_t>(slots), nullptr);
    kept_y_.assign(static_cast<std::size_t>(slots), nullptr);
    dz_ = backend.allocate(static_cast<std::size_t>(rows) * features_);
  }
  void forward(B& backend, const ChunkCall& call, ConstTensorRef x, TensorRef y) {
    kept_x_[static_cast<std::size_t>(call.slot)] = x;  // the executor keeps x and y until backward
    kept_y_[static_cast<std::size_t>(call.slot)] = y;
    const ConstTensorRef w = weights();
    visit_dtype<FloatingStorageTypes>(x.dtype(), [&]<class X>(X) {
      visit_dtype<FloatingStorageTypes>(y.dtype(), [&]<class Y>(Y) {
        visit_dtype<FloatingStorageTypes>(w.dtype(), [&]<class W>(W) {
          const W* ab = w.as<W>();
          backend.for_each(count(call), TanhForward<X, Y, W>{x.as<X>(), ab, ab + features_, y.as<Y>(), features_});
        });
      });
    });
  }
  /// What a slot keeps is x and y, which stay on the device: an offload moves
  /// nothing, and a reload, into another slot perhaps, keeps x and y again
  /// (OffloadableChunk).
  std::size_t offload_size(int) const { return 0; }
  void offload(B&, const ChunkCall& call, float*) {
    kept_x_[static_cast<std::size_t>(call.slot)] = kept_y_[static_cast<std::size_t>(call.slot)] = nullptr;
  }
  void reload(B&, const ChunkCall& call, ConstTensorRef x, ConstTensorRef y, const float*) {
    kept_x_[static_cast<std::size_t>(call.slot)] = x;
    kept_y_[static_cast<std::size_t>(call.slot)] = y;
  }
  void backward(B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    const auto slot = static_cast<std::size_t>(call.slot);
    const ConstTensorRef x = kept_x_[slot], y = kept_y_[slot];
    visit_dtype<FloatingStorageTypes>(y.dtype(), [&]<class Y>(Y) {
      backend.for_each(count(call), TanhGradient<Y>{y.as<Y>(), dy.as<Y>(), dz_.data()});
    });
    visit_dtype<FloatingStorageTypes>(x.dtype(), [&]<class X>(X) {
      backend.for_each(features_, TanhParameterGradient<X>{dz_.data(), x.as<X>(), grads_.data(),
                                                           grads_.data() + features_,
                                                           static_cast<std::size_t>(call.rows), features_});
      if (!dx) return;
      const ConstTensorRef w = weights();
      visit_dtype<FloatingStorageTypes>(w.dtype(), [&]<class W>(W) {
        backend.for_each(count(call), TanhInputGradient<X, W>{dz_.data(), w.as<W>(), dx.as<X>(), features_});
      });
    });
  }
  std::span<const ParameterView> parameters() const { return {&view_, 1}; }

 private:
  // a then b: the engine's copy, or the masters.
  ConstTensorRef weights() const { return copy_ ? copy_ : ConstTensorRef(params_.data()); }
  std::size_t count(const ChunkCall& call) const { return static_cast<std::size_t>(call.rows) * features_; }
  std::size_t features_;
  BoundaryDTypes dtypes_;
  DType weights_;
  ConstTensorRef copy_;
  typename B::Buffer params_, grads_, dz_;
  ParameterView view_{};
  std::vector<ConstTensorRef> kept_x_, kept_y_;
};

/// Both terms of the Huber loss of value i: the gradient g[i] = scale * clamp(d, -1, 1)
/// and the loss term[i] = scale * (d^2 / 2 if |d| <= 1, else |d| - 1/2), d = y[i] - t[i];
/// y and g of dtype Y.
template <class Y>
struct HuberTerms {
  const Y* y;
  const float* t;
  Y* g;
  float* term;
  float scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float d = to_float(y[i]) - t[i];
    const float m = d < 0.0f ? -d : d;
    g[i] = from_float<Y>(scale * (d > 1.0f ? 1.0f : d < -1.0f ? -1.0f : d));
    term[i] = scale * (m <= 1.0f ? 0.5f * d * d : m - 0.5f);
  }
};

/// Reads a buffer: x[i].
struct Read {
  const float* x;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t i) const { return x[i]; }
};

/// The Huber loss (delta = 1), averaged over the micro-batch's values; the target
/// has the output's shape. Its terms go through scratch memory of its own.
template <Backend B>
class HuberLoss {
 public:
  std::size_t target_size(std::size_t features) const { return features; }
  void reserve(B& backend, int rows, std::size_t features) {
    terms_ = backend.allocate(static_cast<std::size_t>(rows) * features);
  }
  void forward_backward(B& backend, const LossCall& call, ConstTensorRef y, const float* target, TensorRef dy,
                        float* loss) {
    const std::size_t n = static_cast<std::size_t>(call.rows) * call.features;
    visit_dtype<FloatingStorageTypes>(y.dtype(), [&]<class Y>(Y) {
      backend.for_each(n, HuberTerms<Y>{y.as<Y>(), target, dy.as<Y>(), terms_.data(), 1.0f / static_cast<float>(n)});
    });
    backend.sum(n, Read{terms_.data()}, loss);
  }

 private:
  typename B::Buffer terms_;
};

}  // namespace pipeweave::test
