#pragma once
/// \file
/// Elementwise functors shared by every backend: ReLU and its gradient, the bias
/// add, column sums, the MSE loss and its gradient, the finiteness count and the
/// optimizer updates. Each is a small aggregate of device pointers and scalars with
/// an `operator()(std::size_t i)`; a backend runs it over an index range with its
/// `for_each` (one call per index) or `sum` (adds up the returned values). The CPU
/// backend runs them with Thrust's host policy, the CUDA backend with
/// `thrust::cuda::par.on(stream)`, so the arithmetic is written once.
///
/// This header includes no CUDA header; under nvcc, PIPEWEAVE_HOST_DEVICE makes the
/// call operators callable on the device as well.

#include <cmath>
#include <cstddef>

/// Marks a function as callable on the host and, under nvcc, on the device.
#if defined(__CUDACC__)
#define PIPEWEAVE_HOST_DEVICE __host__ __device__
#else
#define PIPEWEAVE_HOST_DEVICE
#endif

namespace pipeweave {

/// True for a finite float. Written without library calls so that it means the
/// same on the host and the device: NaN and infinities give NaN when subtracted
/// from themselves.
PIPEWEAVE_HOST_DEVICE inline bool is_finite(float x) { return x - x == 0.0f; }

/// y[i] = max(y[i], 0) in place; NaN stays NaN so that a non-finite value is not hidden.
struct ReluForward {
  float* y;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { y[i] = y[i] <= 0.0f ? 0.0f : y[i]; }
};

/// dx[i] = y[i] > 0 ? dy[i] : 0, where y is the ReLU's output and dy the gradient
/// of its output; dx may be dy (in place).
struct ReluBackward {
  const float* y;
  const float* dy;
  float* dx;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
};

/// y[i] += bias[i % cols] for a row-major matrix with `cols` columns.
struct AddBias {
  float* y;
  const float* bias;
  std::size_t cols;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { y[i] += bias[i % cols]; }
};

/// out[j] += sum over rows r, in increasing r, of x[r][j]; one call per column j.
/// The fixed order makes the result the same on every backend and every run.
struct ColumnSum {
  const float* x;
  float* out;
  std::size_t rows;
  std::size_t cols;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t j) const {
    float s = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) s += x[r * cols + j];
    out[j] += s;
  }
};

/// scale * (y[i] - t[i])^2, to be summed: with scale = 1/n the sum is the MSE.
struct SquaredError {
  const float* y;
  const float* t;
  float scale;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t i) const {
    const float d = y[i] - t[i];
    return scale * d * d;
  }
};

/// g[i] = scale * (y[i] - t[i]): with scale = 2/n, the gradient of the MSE.
struct MseGradient {
  const float* y;
  const float* t;
  float* g;
  float scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { g[i] = scale * (y[i] - t[i]); }
};

/// 1 for a non-finite x[i], else 0, to be summed into a count.
struct NonFinite {
  const float* x;
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t i) const { return is_finite(x[i]) ? 0.0f : 1.0f; }
};

/// SGD with optional momentum on gradients scaled by `grad_scale` (1/M averages
/// gradients summed over M micro-batches):
/// g = grad_scale * grad; v = momentum * v + g (when velocity is set); w -= lr * v (or g).
struct SgdUpdate {
  float* w;
  const float* grad;
  float* velocity;  ///< nullptr: plain SGD
  float lr;
  float momentum;
  float grad_scale;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const {
    float g = grad_scale * grad[i];
    if (velocity != nullptr) {
      velocity[i] = momentum * velocity[i] + g;
      g = velocity[i];
    }
    w[i] -= lr * g;
  }
};

/// Adam (Kingma and Ba) on gradients scaled by `grad_scale`. `correction1` and
/// `correction2` are 1 - beta1^t and 1 - beta2^t for step t, computed by the caller:
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr (m / c1) / (sqrt(v / c2) + eps).
struct AdamUpdate {
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
