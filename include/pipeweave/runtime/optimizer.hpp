#pragma once
/// \file
/// The optimizer step, written once against the Backend concept: SGD with optional
/// momentum, or Adam, applied to gradients summed over the micro-batches and scaled
/// by 1/M, i.e. averaged.

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/functors.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Which update rule.
enum class OptimizerKind : unsigned char { kSgd, kAdam };

/// "sgd" or "adam".
constexpr std::string_view optimizer_name(OptimizerKind kind) { return kind == OptimizerKind::kSgd ? "sgd" : "adam"; }

/// The optimizer and its hyper-parameters.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;  ///< the update rule
  float learning_rate = 0.01f;               ///< step size, positive
  float momentum = 0.0f;  ///< SGD only; 0 is plain SGD
  float beta1 = 0.9f;     ///< Adam only
  float beta2 = 0.999f;   ///< Adam only
  float epsilon = 1e-8f;  ///< Adam only
};

/// Throws pipeweave::Error when a hyper-parameter is out of range.
inline void check_optimizer(const OptimizerConfig& c) {
  auto in_unit = [](float x) { return x >= 0.0f && x < 1.0f; };
  if (!(c.learning_rate > 0.0f) || !std::isfinite(c.learning_rate))
    throw Error("optimizer: the learning rate must be positive and finite (got " + std::to_string(c.learning_rate) + ")");
  if (c.kind == OptimizerKind::kSgd && !in_unit(c.momentum))
    throw Error("optimizer: momentum must be in [0, 1) (got " + std::to_string(c.momentum) + ")");
  if (c.kind == OptimizerKind::kAdam && (!in_unit(c.beta1) || !in_unit(c.beta2) || !(c.epsilon > 0.0f)))
    throw Error("optimizer: Adam needs beta1, beta2 in [0, 1) and epsilon > 0");
}

/// The optimizer state of one device's parameters (momentum or Adam moments) and
/// the update. Its buffers are allocated once, in the constructor.
template <Backend B>
class Optimizer {
 public:
  /// State for `params` (which must outlive the optimizer), zero-initialised.
  Optimizer(B& backend, std::span<const ParameterView> params, const OptimizerConfig& config)
      : config_(config), params_(params.begin(), params.end()) {
    check_optimizer(config);
    const int moments = config.kind == OptimizerKind::kAdam ? 2 : config.momentum > 0.0f ? 1 : 0;
    for (const ParameterView& p : params_) {
      for (int i = 0; i < moments; ++i) {
        state_.push_back(backend.allocate(p.count));
        backend.fill(state_.back().data(), p.count, 0.0f);
      }
    }
  }

  /// One update of every parameter with its gradient times `grad_scale`.
  void step(B& backend, float grad_scale) {
    ++steps_;
    const OptimizerConfig& c = config_;
    std::size_t k = 0;
    if (c.kind == OptimizerKind::kSgd) {
      for (const ParameterView& p : params_) {
        float* velocity = c.momentum > 0.0f ? state_[k++].data() : nullptr;
        backend.for_each(p.count, SgdUpdate{p.value, p.gradient, velocity, c.learning_rate, c.momentum, grad_scale});
      }
      return;
    }
    const auto t = static_cast<double>(steps_);
    const auto correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), t));
    const auto correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), t));
    for (const ParameterView& p : params_) {
      float* m = state_[k++].data();
      float* v = state_[k++].data();
      backend.for_each(p.count, AdamUpdate{p.value, p.gradient, m, v, c.learning_rate, c.beta1, c.beta2, c.epsilon,
                                           grad_scale, correction1, correction2});
    }
  }

  /// Updates applied so far.
  long long steps() const { return steps_; }
  /// The configuration.
  const OptimizerConfig& config() const { return config_; }

 private:
  OptimizerConfig config_;
  std::vector<ParameterView> params_;
  std::vector<typename B::Buffer> state_;
  long long steps_ = 0;
};

}  // namespace pipeweave
