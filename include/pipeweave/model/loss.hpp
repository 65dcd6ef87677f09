#pragma once
/// \file
/// The built-in loss, a model of the Loss concept (runtime/backend.hpp): the mean
/// squared error. A loss of one's own plugs in the same way (see
/// examples/custom_chunk.cu for a cross-entropy whose kernels are its own).

#include <cstddef>

#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"

namespace pipeweave {

/// Mean squared error over all n = rows x features values of a micro-batch:
/// loss = sum((y - t)^2) / n, gradient 2 (y - t) / n; the target has the output's shape.
struct MseLoss {
  /// The target has as many floats per sample as the output.
  std::size_t target_size(std::size_t features) const { return features; }
  /// Needs no scratch.
  template <Backend B>
  void reserve(B&, int, std::size_t) {}
  /// Writes the loss to `*loss` and its gradient to dy (device memory).
  template <Backend B>
  void forward_backward(B& backend, const LossCall& call, const float* y, const float* target, float* dy,
                        float* loss) {
    const std::size_t n = static_cast<std::size_t>(call.rows) * call.features;
    const float inv_n = 1.0f / static_cast<float>(n);
    backend.sum(n, SquaredError{y, target, inv_n}, loss);
    backend.for_each(n, MseGradient{y, target, dy, 2.0f * inv_n});
  }
};

}  // namespace pipeweave
