#pragma once
/// \file
/// The engine's side of an update rule (any model of the Optimizer concept,
/// runtime/chunk.hpp): the check of its hyper-parameters before a run starts,
/// and the state it keeps for one device's parameters (momentum, Adam's moments),
/// allocated once and zeroed, with the update of every parameter tensor.

#include <cstddef>
#include <span>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"

namespace pipeweave {

/// Throws pipeweave::Error when a hyper-parameter of `rule` is out of range (rules
/// without a check() are taken as they are).
template <class O>
void check_optimizer(const O& rule) {
  if constexpr (requires { rule.check(); }) rule.check();
}

/// The state of an update rule for one device's parameters (e.g. momentum or
/// Adam's moments, zeroed at the start) and its updates. Its buffers are
/// allocated once, in the constructor.
template <Backend B, class O>
  requires Optimizer<O, B>
class OptimizerState {
 public:
  /// State for `params` (whose memory must outlive this object).
  OptimizerState(B& backend, std::span<const ParameterView> params, const O& rule)
      : rule_(rule), params_(params.begin(), params.end()) {
    check_optimizer(rule_);
    per_parameter_ = static_cast<std::size_t>(rule_.state_buffers());
    for (const ParameterView& p : params_) {
      for (std::size_t i = 0; i < per_parameter_; ++i) {
        state_.push_back(backend.allocate(p.count));
        backend.fill(state_.back().data(), p.count, 0.0f);
      }
    }
    for (auto& buffer : state_) pointers_.push_back(buffer.data());
  }

  /// One update of every parameter with its gradient times `grad_scale`.
  void step(B& backend, float grad_scale) {
    ++steps_;
    for (std::size_t k = 0; k < params_.size(); ++k)
      rule_.update(backend, params_[k], std::span<float* const>(pointers_.data() + k * per_parameter_, per_parameter_),
                   OptimizerStep{steps_, grad_scale});
  }

  /// Updates applied so far.
  long long steps() const { return steps_; }
  /// Sets the updates applied so far (a run resumed from a checkpoint).
  void set_steps(long long steps) { steps_ = steps; }
  /// State buffers per parameter tensor.
  int buffers() const { return static_cast<int>(per_parameter_); }
  /// Device memory of buffer k of parameter tensor `param` (as many floats as the tensor).
  float* buffer(std::size_t param, int k) const { return pointers_[param * per_parameter_ + static_cast<std::size_t>(k)]; }
  /// The rule.
  const O& rule() const { return rule_; }

 private:
  O rule_;
  std::vector<ParameterView> params_;
  std::size_t per_parameter_ = 0;
  std::vector<typename B::Buffer> state_;  // per_parameter_ buffers per parameter tensor, in order
  std::vector<float*> pointers_;           // their data
  long long steps_ = 0;
};

}  // namespace pipeweave
