// Every loop of the CPU backend with each functor the library runs through it;
// tests/cpu/vectorize_check.py compiles this file with the compiler's
// vectorization report and checks that the compiler vectorizes each loop.
#include <cstddef>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/functors.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/finite.hpp"

using pipeweave::cpu::CpuBackend;

void layer_forward(CpuBackend& b, float* y, const float* bias, std::size_t rows, std::size_t cols) {
  pipeweave::for_each_element(b, rows, cols, pipeweave::BiasActivation<true>{y, bias, cols});
  pipeweave::for_each_element(b, rows, cols, pipeweave::BiasActivation<false>{y, bias, cols});
}

void layer_backward(CpuBackend& b, const float* y, const float* dy, float* dz, float* db, std::size_t rows,
                    std::size_t cols) {
  pipeweave::column_sums(b, rows, cols, pipeweave::ActivationGradient<true>{y, dy, dz, cols}, db);
  pipeweave::column_sums(b, rows, cols, pipeweave::ActivationGradient<false>{y, dy, nullptr, cols}, db);
}

void loss_and_check(CpuBackend& b, const float* y, const float* t, float* g, float* out, std::size_t n) {
  b.sum(n, pipeweave::SquaredError<float>{y, t, 0.5f}, out);
  b.for_each(n, pipeweave::MseGradient<float>{y, t, g, 0.5f});
  b.sum(n, pipeweave::NonFinite{g}, out + 1);
}

void updates(CpuBackend& b, float* w, const float* g, float* m, float* v, std::size_t n) {
  b.fill(w, n, 0.5f);
  b.for_each(n, pipeweave::SgdUpdate{w, g, 0.1f, 0.5f});
  b.for_each(n, pipeweave::MomentumUpdate{w, g, m, 0.1f, 0.9f, 0.5f});
  b.for_each(n, pipeweave::AdamUpdate{w, g, m, v, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 0.1f, 0.001f});
}
