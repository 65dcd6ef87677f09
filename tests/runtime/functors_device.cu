// The shared functors compile as device code under nvcc (compile only; no GPU needed).
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/functors.hpp"

__global__ void run_functors(float* a, float* b, float* c, float* d, float* out) {
  const std::size_t i = threadIdx.x;
  pipeweave::ReluForward{a}(i);
  pipeweave::ReluBackward{a, b, c}(i);
  pipeweave::AddBias{a, b, 4}(i);
  pipeweave::ColumnSum{a, b, 2, 4}(i);
  pipeweave::MseGradient{a, b, c, 0.5f}(i);
  pipeweave::SgdUpdate{a, b, c, 0.1f, 0.9f, 0.25f}(i);
  pipeweave::AdamUpdate{a, b, c, d, 0.1f, 0.9f, 0.999f, 1e-8f, 0.25f, 0.1f, 0.001f}(i);
  out[i] = pipeweave::SquaredError{a, b, 0.5f}(i) + pipeweave::NonFinite{a}(i) + (pipeweave::is_finite(a[i]) ? 1.0f : 0.0f);
}
