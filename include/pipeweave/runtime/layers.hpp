#pragma once
/// \file
/// The built-in layer set, written once against the Backend concept: Linear
/// (y = x W^T + b) and ReLU. Matrices are row-major with one sample per row; W is
/// out x in. Every function only enqueues work on the backend. (The MSE loss is in
/// runtime/loss.hpp.)

#include <cstddef>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/functors.hpp"

namespace pipeweave {

/// A fully connected layer from `in` to `out` features: y = x W^T + b.
struct Linear {
  int in = 0;   ///< input features
  int out = 0;  ///< output features

  /// Floats of W (out x in) followed by b (out).
  constexpr std::size_t parameter_count() const {
    return static_cast<std::size_t>(out) * static_cast<std::size_t>(in) + static_cast<std::size_t>(out);
  }

  /// y (rows x out) = x (rows x in) W^T + b; `w` points at W, followed by b.
  template <Backend B>
  void forward(B& backend, int rows, const float* x, const float* w, float* y) const {
    backend.gemm(Transpose::kNo, Transpose::kYes, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    backend.for_each(static_cast<std::size_t>(rows) * static_cast<std::size_t>(out),
                     AddBias{y, w + static_cast<std::size_t>(out) * static_cast<std::size_t>(in),
                             static_cast<std::size_t>(out)});
  }

  /// From dy (rows x out), the gradient of y: adds dW += dy^T x and db += the column
  /// sums of dy (rows in increasing order) into `grad` (laid out like `w`), and
  /// writes dx = dy W (rows x in) unless dx is nullptr.
  template <Backend B>
  void backward(B& backend, int rows, const float* x, const float* w, const float* dy, float* grad, float* dx) const {
    backend.gemm(Transpose::kYes, Transpose::kNo, out, in, rows, 1.0f, dy, out, x, in, 1.0f, grad, in);
    backend.for_each(static_cast<std::size_t>(out),
                     ColumnSum{dy, grad + static_cast<std::size_t>(out) * static_cast<std::size_t>(in),
                               static_cast<std::size_t>(rows), static_cast<std::size_t>(out)});
    if (dx != nullptr) backend.gemm(Transpose::kNo, Transpose::kNo, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  }
};

/// The rectifier, max(x, 0), applied in place.
struct Relu {
  /// y = max(y, 0) over n values, in place.
  template <Backend B>
  static void forward(B& backend, float* y, std::size_t n) {
    backend.for_each(n, ReluForward{y});
  }
  /// dx = dy where the output y is positive, else 0; dx may be dy.
  template <Backend B>
  static void backward(B& backend, const float* y, const float* dy, float* dx, std::size_t n) {
    backend.for_each(n, ReluBackward{y, dy, dx});
  }
};

}  // namespace pipeweave
