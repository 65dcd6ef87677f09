#pragma once
/// \file
/// The built-in layer, written once against the Backend concept: Linear
/// (y = x W^T + b), optionally followed by a ReLU. Matrices are row-major with one
/// sample per row; W is out x in. Every function only enqueues work on the
/// backend. (The MSE loss is in model/loss.hpp.)
///
/// Cost: the GEMMs do the arithmetic; around them each direction makes one pass
/// over the layer's output and nothing else. Forward adds the bias and applies the
/// ReLU in one pass after the GEMM, while its output is in cache; backward masks
/// the incoming gradient with the ReLU and sums its columns into the bias gradient
/// in one pass, before the two GEMMs that read it.
///
/// Backward comes in three parts, so that a schedule may run the input gradient
/// (which the previous stage waits for) apart from the weight gradient (which
/// nobody waits for): backward_activation (dz and the bias gradient), then
/// backward_input (dx, from dz) and backward_weight (dW, from dz and the kept
/// input), in either order.

#include <cstddef>
#include <type_traits>

#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"

namespace pipeweave {

/// A fully connected layer from `in` to `out` features: y = x W^T + b, then
/// y = max(y, 0) when `relu`. With bf16 `activations`, its output y and its input
/// gradient dx are rounded to bf16 (to nearest even) where they are written: fp32
/// words holding bf16 values, so that the tensors between layers are those of a
/// bf16 model; the GEMMs still read and accumulate fp32.
struct Linear {
  int in = 0;         ///< input features
  int out = 0;        ///< output features
  bool relu = false;  ///< a ReLU follows
  DType activations = DType::kF32;  ///< fp32 or bf16: the values y and dx may hold

  /// Floats of W (out x in) followed by b (out).
  constexpr std::size_t parameter_count() const {
    return static_cast<std::size_t>(out) * static_cast<std::size_t>(in) + static_cast<std::size_t>(out);
  }

  /// y (rows x out) = act(x (rows x in) W^T + b); `w` points at W, followed by b.
  template <Backend B>
  void forward(B& backend, int rows, const float* x, const float* w, float* y) const {
    backend.gemm(Transpose::kNo, Transpose::kYes, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    const float* b = bias(w);
    visit_dtype<FloatingStorageTypes>(activations, [&]<class T>(T) {
      if (relu)
        for_each_element(backend, size(rows), size(out), BiasActivation<true, T>{y, b, size(out)});
      else
        for_each_element(backend, size(rows), size(out), BiasActivation<false, T>{y, b, size(out)});
    });
  }

  /// From dy (rows x out), the gradient of y, and the output y itself: the gradient
  /// of the GEMM's output, dz = dy masked by y > 0 with the ReLU (written to `dz`,
  /// which may be dy) or dy itself without; and db += the column sums of dz (rows
  /// in increasing order) in `grad` (laid out like W and b). Returns dz.
  template <Backend B>
  const float* backward_activation(B& backend, int rows, const float* y, const float* dy, float* dz,
                                   float* grad) const {
    float* db = bias(grad);
    if (!relu) {
      column_sums(backend, size(rows), size(out), ActivationGradient<false>{y, dy, nullptr, size(out)}, db);
      return dy;
    }
    column_sums(backend, size(rows), size(out), ActivationGradient<true>{y, dy, dz, size(out)}, db);
    return dz;
  }

  /// dW += dz^T x into `grad` (W's part), for dz from backward_activation and x,
  /// the layer's input (rows x in).
  template <Backend B>
  void backward_weight(B& backend, int rows, const float* x, const float* dz, float* grad) const {
    backend.gemm(Transpose::kYes, Transpose::kNo, out, in, rows, 1.0f, dz, out, x, in, 1.0f, grad, in);
  }

  /// dx (rows x in) = dz W, for dz from backward_activation.
  template <Backend B>
  void backward_input(B& backend, int rows, const float* w, const float* dz, float* dx) const {
    backend.gemm(Transpose::kNo, Transpose::kNo, rows, in, out, 1.0f, dz, out, w, in, 0.0f, dx, in);
    visit_dtype<FloatingStorageTypes>(activations, [&]<class T>(T) {
      if constexpr (!std::is_same_v<T, float>) backend.for_each(size(rows) * size(in), RoundTo<T>{dx});
    });
  }

 private:
  static std::size_t size(int n) { return static_cast<std::size_t>(n); }
  template <class T>
  T* bias(T* w) const {
    return w + static_cast<std::size_t>(out) * static_cast<std::size_t>(in);
  }
};

}  // namespace pipeweave
