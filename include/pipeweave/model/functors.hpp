#pragma once
/// \file
/// The built-in model's elementwise functors, run by every backend: a Linear
/// layer's bias and ReLU and their gradient, the MSE loss and its gradient, and
/// the optimizer updates (ParameterUpdates, runtime/backend.hpp). Each is a small aggregate of device pointers and scalars
/// with a call operator for one element: `(std::size_t i)` for a flat range, run
/// by a backend's `for_each` (one call per index) or `sum` (adds up the returned
/// values); `(std::size_t r, std::size_t c)` for an element of a row-major
/// matrix, run by for_each_element and column_sums (runtime/backend.hpp). The CPU
/// backend runs them in loops of its own that the compiler vectorizes, the CUDA
/// backend with Thrust on its stream, so the arithmetic is written once. A call
/// touches only its own element of every array it writes, so the calls may run
/// in any order or at once.
///
/// This header includes no CUDA header; under nvcc, PIPEWEAVE_HOST_DEVICE
/// (runtime/backend.hpp) makes the call operators callable on the device as well.

#include <cmath>
#include <cstddef>

#include "pipeweave/runtime/backend.hpp"

namespace pipeweave {

/// The pass after a Linear layer's GEMM, one call per element (r, c) of the
/// rows x cols output: y[r][c] += bias[c], then, with `Relu`, y = max(y, 0) (NaN
/// stays NaN, so that a non-finite value is not hidden), then rounded to T's
/// precision (bf16 activations; nothing for fp32). With the bias, the ReLU and
/// the rounding in one pass, the output is read and written once, while the GEMM
/// has just left it in cache.
template <bool Relu, class T = float>
struct BiasActivation {
  float* y;
  const float* bias;
  std::size_t cols;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const std::size_t i = r * cols + c;
    const float v = y[i] + bias[c];
    y[i] = to_float(from_float<T>(Relu && v <= 0.0f ? 0.0f : v));
  }
};

/// The first pass of a Linear layer's backward, one call per element (r, c): from
/// dy, the gradient of the layer's output y, the gradient of the GEMM's output,
/// dz = dy where y > 0 and 0 elsewhere with `Relu` (written to dz, which may be
/// dy), dz = dy without (nothing is written). Returns dz[r][c] for the column sums
/// that make the bias gradient, so that dz is computed, stored and summed in one pass.
template <bool Relu>
struct ActivationGradient {
  const float* y;
  const float* dy;
  float* dz;  ///< with Relu: where dz goes (may be dy); unused without
  std::size_t cols;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t r, std::size_t c) const {
    const std::size_t i = r * cols + c;
    if constexpr (!Relu) {
      return dy[i];
    } else {
      const float g = dy[i];  // read unconditionally: a select, not a branch
      const float d = y[i] > 0.0f ? g : 0.0f;
      dz[i] = d;
      return d;
    }
  }
};

/// scale * (y[i] - t[i])^2, to be summed: with scale = 1/n the sum is the MSE.
/// y holds T (fp32 or bf16), read as fp32.
template <class T>
struct SquaredError {
  const T* y;
  const float* t;
  float scale;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t i) const {
    const float d = to_float(y[i]) - t[i];
    return scale * d * d;
  }
};

/// g[i] = scale * (y[i] - t[i]), stored as T (rounded to nearest even for bf16):
/// with scale = 2/n, the gradient of the MSE.
template <class T>
struct MseGradient {
  const T* y;
  const float* t;
  T* g;
  float scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { g[i] = from_float<T>(scale * (to_float(y[i]) - t[i])); }
};

/// to[i] = from[i] as To: fp32 to bf16 rounds to nearest even, bf16 to fp32 is exact.
template <class From, class To>
struct Convert {
  const From* from;
  To* to;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { to[i] = from_float<To>(to_float(from[i])); }
};

/// v[i] = v[i] rounded to T and back (bf16: to nearest even); fp32 words that
/// hold T's values.
template <class T>
struct RoundTo {
  float* v;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { v[i] = to_float(from_float<T>(v[i])); }
};

/// Plain SGD on gradients scaled by `grad_scale` (1/M averages gradients summed
/// over M micro-batches): w -= lr * (grad_scale * grad).
struct SgdUpdate {
  static constexpr bool kUpdatesParameters = true;  ///< a ParameterUpdate (runtime/backend.hpp)
  float* w;
  const float* grad;
  float lr;
  float grad_scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { w[i] -= lr * (grad_scale * grad[i]); }
};

/// SGD with momentum on gradients scaled by `grad_scale`:
/// v = momentum * v + grad_scale * grad; w -= lr * v.
struct MomentumUpdate {
  static constexpr bool kUpdatesParameters = true;  ///< a ParameterUpdate (runtime/backend.hpp)
  float* w;
  const float* grad;
  float* velocity;
  float lr;
  float momentum;
  float grad_scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = momentum * velocity[i] + grad_scale * grad[i];
    velocity[i] = v;
    w[i] -= lr * v;
  }
};

/// Adam (Kingma and Ba) on gradients scaled by `grad_scale`. `correction1` and
/// `correction2` are 1 - beta1^t and 1 - beta2^t for step t, computed by the caller:
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr (m / c1) / (sqrt(v / c2) + eps).
struct AdamUpdate {
  static constexpr bool kUpdatesParameters = true;  ///< a ParameterUpdate (runtime/backend.hpp)
  float* w;
  const float* grad;
  float* m;
  float* v;
  float lr;
  float beta1;
  float beta2;
  float epsilon;
  float grad_scale;
  float correction1;
  float correction2;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    const float g = grad_scale * grad[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float m_hat = m[i] / correction1;
    const float v_hat = v[i] / correction2;
    w[i] -= lr * m_hat / (sqrtf(v_hat) + epsilon);
  }
};

}  // namespace pipeweave
