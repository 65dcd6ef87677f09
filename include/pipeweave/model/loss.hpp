#pragma once
/// \file
/// The built-in loss, a model of the Loss concept (runtime/chunk.hpp): the mean
/// squared error. A loss of one's own plugs in the same way (see
/// examples/custom_chunk.cu for a cross-entropy whose kernels are its own).

#include <cstddef>

#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"

namespace pipeweave {

/// Mean squared error over all n = rows x features values of a micro-batch:
/// loss = sum((y - t)^2) / n, gradient 2 (y - t) / n; the target has the output's shape.
struct MseLoss {
  /// The target has as many floats per sample as the output.
  std::size_t target_size(std::size_t features) const { return features; }
  /// Needs no scratch.
  template <Backend B>
  void reserve(B&, int, std::size_t) {}
  /// Writes the loss to `*loss` and its gradient to dy (device memory); y and dy
  /// are fp32 or bf16 (the gradient rounded to nearest even), the arithmetic fp32.
  template <Backend B>
  void forward_backward(B& backend, const LossCall& call, ConstTensorRef y, const float* target, TensorRef dy,
                        float* loss) {
    const std::size_t n = static_cast<std::size_t>(call.rows) * call.features;
    const float inv_n = 1.0f / static_cast<float>(n);
    visit_dtype<FloatingStorageTypes>(y.dtype(), [&]<class T>(T) {
      backend.sum(n, SquaredError<T>{y.as<T>(), target, inv_n}, loss);
      backend.for_each(n, MseGradient<T>{y.as<T>(), target, dy.as<T>(), 2.0f * inv_n});
    });
  }
};

}  // namespace pipeweave
