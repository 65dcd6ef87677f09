// The shared functors compile as device code under nvcc (compile only; no GPU needed).
#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/finite.hpp"

__global__ void run_functors(float* a, float* b, float* c, float* d, float* out) {
  const std::size_t i = threadIdx.x;
  pipeweave::BiasActivation<true>{a, b, 4}(i / 4, i % 4);
  pipeweave::BiasActivation<false>{a, b, 4}(i / 4, i % 4);
  pipeweave::detail::AtElement<pipeweave::BiasActivation<true>>{{a, b, 4}, 4}(i);
  pipeweave::detail::ColumnSumOf<pipeweave::ActivationGradient<true>>{{a, b, c, 4}, d, 2}(i);
  pipeweave::detail::ColumnSumOf<pipeweave::ActivationGradient<false>>{{a, b, nullptr, 4}, d, 2}(i);
  pipeweave::MseGradient<float>{a, b, c, 0.5f}(i);
  pipeweave::SgdUpdate{a, b, 0.1f, 0.25f}(i);
  pipeweave::MomentumUpdate{a, b, c, 0.1f, 0.9f, 0.25f}(i);
  pipeweave::AdamUpdate{a, b, c, d, 0.1f, 0.9f, 0.999f, 1e-8f, 0.25f, 0.1f, 0.001f}(i);
  out[i] = pipeweave::SquaredError<float>{a, b, 0.5f}(i) + pipeweave::NonFinite{a}(i) + (pipeweave::is_finite(a[i]) ? 1.0f : 0.0f);
}
