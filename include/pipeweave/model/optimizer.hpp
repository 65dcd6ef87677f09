#pragma once
/// \file
/// The built-in update rules, models of the Optimizer concept
/// (runtime/chunk.hpp): SGD with optional momentum and Adam, each applied to
/// gradients summed over the micro-batches and scaled by 1/M, i.e. averaged;
/// and OptimizerConfig, the run-time choice between the two (what the command-line
/// tools and PipelineOptions use). The engine keeps a rule's state and applies it
/// (OptimizerState, runtime/optimizer_state.hpp).
///
/// \code
/// // A rule of one's own: SGD whose step size halves every 100 updates, no state.
/// struct HalvingSgd {
///   float learning_rate = 0.01f;
///   int state_buffers() const { return 0; }
///   template <pipeweave::Backend B>
///   void update(B& b, const pipeweave::ParameterView& p, std::span<float* const>,
///               const pipeweave::OptimizerStep& s) const {
///     const float lr = learning_rate * std::ldexp(1.0f, -static_cast<int>((s.t - 1) / 100));
///     b.for_each(p.count, pipeweave::SgdUpdate{p.value, p.gradient, lr, s.grad_scale});
///   }
/// };
/// \endcode

#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// SGD with optional momentum: v = momentum v + g; w -= learning_rate v (or g).
struct Sgd {
  float learning_rate = 0.01f;  ///< step size, positive
  float momentum = 0.0f;        ///< in [0, 1); 0 is plain SGD (and keeps no state)

  /// Throws pipeweave::Error when a hyper-parameter is out of range.
  void check() const {
    if (!(learning_rate > 0.0f) || !std::isfinite(learning_rate))
      throw_error({}, "optimizer: the learning rate must be positive and finite (got ", learning_rate, ")");
    if (!(momentum >= 0.0f && momentum < 1.0f))
      throw_error({}, "optimizer: momentum must be in [0, 1) (got ", momentum, ")");
  }
  /// The velocity, with momentum.
  int state_buffers() const { return momentum > 0.0f ? 1 : 0; }
  /// One update of `p`: one pass over its values, gradients and velocity.
  template <Backend B>
  void update(B& b, const ParameterView& p, std::span<float* const> state, const OptimizerStep& s) const {
    if (state.empty())
      b.for_each(p.count, SgdUpdate{p.value, p.gradient, learning_rate, s.grad_scale});
    else
      b.for_each(p.count, MomentumUpdate{p.value, p.gradient, state[0], learning_rate, momentum, s.grad_scale});
  }
};

/// Adam (Kingma and Ba) with bias correction.
struct Adam {
  float learning_rate = 0.001f;  ///< step size, positive
  float beta1 = 0.9f;            ///< decay of the first moment, in [0, 1)
  float beta2 = 0.999f;          ///< decay of the second moment, in [0, 1)
  float epsilon = 1e-8f;         ///< added to the root of the second moment, positive

  /// Throws pipeweave::Error when a hyper-parameter is out of range.
  void check() const {
    Sgd{learning_rate, 0.0f}.check();
    auto in_unit = [](float x) { return x >= 0.0f && x < 1.0f; };
    if (!in_unit(beta1) || !in_unit(beta2) || !(epsilon > 0.0f))
      throw_error({}, "optimizer: Adam needs beta1, beta2 in [0, 1) and epsilon > 0");
  }
  /// The two moments.
  int state_buffers() const { return 2; }
  /// One update of `p`, one pass over its values, gradients and moments; `s.t` is
  /// the number of this update.
  template <Backend B>
  void update(B& b, const ParameterView& p, std::span<float* const> state, const OptimizerStep& s) const {
    const auto t = static_cast<double>(s.t);
    const auto correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
    const auto correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
    b.for_each(p.count, AdamUpdate{p.value, p.gradient, state[0], state[1], learning_rate, beta1, beta2, epsilon,
                                   s.grad_scale, correction1, correction2});
  }
};

/// Which built-in rule.
enum class OptimizerKind : unsigned char { kSgd, kAdam };

/// Everything a built-in rule's name says, in one row.
struct OptimizerRow {
  OptimizerKind kind;
  std::string_view name;  ///< on the command line, in output and in a checkpoint's manifest
  bool momentum;          ///< it takes a momentum (OptimizerConfig::momentum)
};

/// One row per built-in rule, in the order of OptimizerKind.
inline constexpr OptimizerRow kOptimizerRows[] = {
    {OptimizerKind::kSgd, "sgd", true},
    {OptimizerKind::kAdam, "adam", false},
};

/// The row of a rule.
constexpr const OptimizerRow& optimizer_row(OptimizerKind kind) { return kOptimizerRows[static_cast<int>(kind)]; }

/// "sgd" or "adam".
constexpr std::string_view optimizer_name(OptimizerKind kind) { return optimizer_row(kind).name; }

/// The rule of that name; nothing for any other name.
constexpr std::optional<OptimizerKind> parse_optimizer(std::string_view name) {
  for (const OptimizerRow& r : kOptimizerRows)
    if (r.name == name) return r.kind;
  return std::nullopt;
}

/// One of the built-in rules chosen at run time, with its hyper-parameters: a
/// model of the Optimizer concept that applies Sgd or Adam.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;  ///< the update rule
  float learning_rate = 0.01f;               ///< step size, positive
  float momentum = 0.0f;  ///< SGD only; 0 is plain SGD
  float beta1 = 0.9f;     ///< Adam only
  float beta2 = 0.999f;   ///< Adam only
  float epsilon = 1e-8f;  ///< Adam only

  /// The SGD rule of these settings.
  Sgd sgd() const { return {learning_rate, momentum}; }
  /// The Adam rule of these settings.
  Adam adam() const { return {learning_rate, beta1, beta2, epsilon}; }
  /// Throws pipeweave::Error when a hyper-parameter of the chosen rule is out of range.
  void check() const { kind == OptimizerKind::kSgd ? sgd().check() : adam().check(); }
  /// The chosen rule's state.
  int state_buffers() const { return kind == OptimizerKind::kSgd ? sgd().state_buffers() : adam().state_buffers(); }
  /// One update with the chosen rule.
  template <Backend B>
  void update(B& b, const ParameterView& p, std::span<float* const> state, const OptimizerStep& s) const {
    if (kind == OptimizerKind::kSgd)
      sgd().update(b, p, state, s);
    else
      adam().update(b, p, state, s);
  }
};

}  // namespace pipeweave
