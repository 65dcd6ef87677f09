// A model of the tests' own, written only against the runtime's concepts, so that
// the same types run on the CPU backend (test_custom.cpp) and compile for the
// CUDA backend and the multi-process host (cuda/test_mpi_gpu.cu):
//
// - TanhChunk: y = tanh(a * x + b) per feature, with a learned scale a and shift b
//   per feature (nothing like the built-in Linear/ReLU stack);
// - HuberLoss: the Huber loss with delta = 1 (quadratic near the target, linear
//   beyond), averaged over the micro-batch's values.
//
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

namespace pipeweave::test {

/// y[i] = tanh(a[f] x[i] + b[f]) with f the feature of i.
struct TanhForward {
  const float* x;
  const float* a;
  const float* b;
  float* y;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t f = i % features;
    y[i] = tanhf(a[f] * x[i] + b[f]);
  }
};

/// dz[i] = dy[i] (1 - y[i]^2): the gradient before the tanh.
struct TanhGradient {
  const float* y;
  const float* dy;
  float* dz;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { dz[i] = dy[i] * (1.0f - y[i] * y[i]); }
};

/// da[f] += sum over rows of dz x, db[f] += sum over rows of dz; one call per feature f.
struct TanhParameterGradient {
  const float* dz;
  const float* x;
  float* da;
  float* db;
  std::size_t rows;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t f) const {
    float sa = 0.0f, sb = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
      sa += dz[r * features + f] * x[r * features + f];
      sb += dz[r * features + f];
    }
    da[f] += sa;
    db[f] += sb;
  }
};

/// dx[i] = dz[i] a[f].
struct TanhInputGradient {
  const float* dz;
  const float* a;
  float* dx;
  std::size_t features;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { dx[i] = dz[i] * a[i % features]; }
};

/// One stage: y = tanh(a * x + b) over `features` features. Parameters: a then b.
template <Backend B>
class TanhChunk {
 public:
  /// The chunk of virtual stage `stage`; its initial a and b depend only on the
  /// stage and the seed.
  TanhChunk(B& backend, std::size_t features, int stage, std::uint64_t seed)
      : features_(features), params_(backend.allocate(2 * features)), grads_(backend.allocate(2 * features)) {
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
  void reserve(B& backend, int slots, int rows) {
    kept_x_.assign(static_cast<std::size_t>(slots), nullptr);
    kept_y_.assign(static_cast<std::size_t>(slots), nullptr);
    dz_ = backend.allocate(static_cast<std::size_t>(rows) * features_);
  }
  void forward(B& backend, const ChunkCall& call, const float* x, float* y) {
    kept_x_[static_cast<std::size_t>(call.slot)] = x;  // the executor keeps x and y until backward
    kept_y_[static_cast<std::size_t>(call.slot)] = y;
    backend.for_each(count(call), TanhForward{x, a(), b(), y, features_});
  }
  void backward(B& backend, const ChunkCall& call, const float* dy, float* dx) {
    const auto slot = static_cast<std::size_t>(call.slot);
    backend.for_each(count(call), TanhGradient{kept_y_[slot], dy, dz_.data()});
    backend.for_each(features_, TanhParameterGradient{dz_.data(), kept_x_[slot], grads_.data(),
                                                      grads_.data() + features_,
                                                      static_cast<std::size_t>(call.rows), features_});
    if (dx != nullptr) backend.for_each(count(call), TanhInputGradient{dz_.data(), a(), dx, features_});
  }
  std::span<const ParameterView> parameters() const { return {&view_, 1}; }

 private:
  const float* a() const { return params_.data(); }
  const float* b() const { return params_.data() + features_; }
  std::size_t count(const ChunkCall& call) const { return static_cast<std::size_t>(call.rows) * features_; }
  std::size_t features_;
  typename B::Buffer params_, grads_, dz_;
  ParameterView view_{};
  std::vector<const float*> kept_x_, kept_y_;
};

/// Both terms of the Huber loss of value i: the gradient g[i] = scale * clamp(d, -1, 1)
/// and the loss term[i] = scale * (d^2 / 2 if |d| <= 1, else |d| - 1/2), d = y[i] - t[i].
struct HuberTerms {
  const float* y;
  const float* t;
  float* g;
  float* term;
  float scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float d = y[i] - t[i];
    const float m = d < 0.0f ? -d : d;
    g[i] = scale * (d > 1.0f ? 1.0f : d < -1.0f ? -1.0f : d);
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
  void forward_backward(B& backend, const LossCall& call, const float* y, const float* target, float* dy, float* loss) {
    const std::size_t n = static_cast<std::size_t>(call.rows) * call.features;
    backend.for_each(n, HuberTerms{y, target, dy, terms_.data(), 1.0f / static_cast<float>(n)});
    backend.sum(n, Read{terms_.data()}, loss);
  }

 private:
  typename B::Buffer terms_;
};

}  // namespace pipeweave::test
