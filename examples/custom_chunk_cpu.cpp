// The CPU half of examples/custom_chunk.cu: the model of custom_model.hpp run by
// the CPU backend's for_each (its Ops below) and trained sequentially, the whole
// model on one thread, as the reference of the GPU run.
#include <cstddef>
#include <vector>

#include "custom_model.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"

namespace custom {
namespace {

using pipeweave::cpu::CpuBackend;

// The arithmetic of custom_model.hpp over whole tensors, one functor call per element.
struct CpuOps {
  template <class X>
  static void dense_forward(CpuBackend& b, const X* x, const float* w, const float* bias, bf16* y, int rows, int f,
                            bool activate) {
    b.for_each(static_cast<std::size_t>(rows * f), [=](std::size_t i) {
      y[i] = pipeweave::to_bf16(dense_out(x, w, bias, static_cast<int>(i) / f, static_cast<int>(i) % f, f, activate));
    });
  }
  template <class X>
  static void dense_backward(CpuBackend& b, const X* x, const bf16* y, const bf16* dy, float* dz, const float* w,
                             float* grad_w, float* grad_b, X* dx, int rows, int f, bool activate) {
    b.for_each(static_cast<std::size_t>(rows * f), [=](std::size_t i) { dz[i] = dense_dz(y, dy, static_cast<int>(i), activate); });
    b.for_each(static_cast<std::size_t>(f * f), [=](std::size_t i) {
      grad_w[i] += dense_weight_grad(dz, x, rows, f, f, static_cast<int>(i) / f, static_cast<int>(i) % f);
    });
    b.for_each(static_cast<std::size_t>(f), [=](std::size_t o) { grad_b[o] += dense_bias_grad(dz, rows, f, static_cast<int>(o)); });
    if (dx != nullptr)
      b.for_each(static_cast<std::size_t>(rows * f), [=](std::size_t i) {
        dx[i] = pipeweave::from_float<X>(dense_input_grad(dz, w, f, f, static_cast<int>(i) / f, static_cast<int>(i) % f));
      });
  }
  static void cross_entropy(CpuBackend& b, const bf16* y, const float* target, bf16* dy, float* row_losses,
                            float* loss, int rows, int classes) {
    const float scale = 1.0f / static_cast<float>(rows);
    b.for_each(static_cast<std::size_t>(rows), [=](std::size_t r) {
      row_losses[r] = cross_entropy_row(y, target, dy, static_cast<int>(r), classes, scale);
    });
    b.sum(static_cast<std::size_t>(rows), [=](std::size_t r) { return scale * row_losses[r]; }, loss);
  }
};

}  // namespace

Run train_on_cpu(const Setup& s) {
  using Chunk = DenseChunk<CpuBackend, CpuOps>;
  auto stages = [&](CpuBackend& b) {
    std::vector<Chunk> chunks;
    for (int stage = 0; stage < s.stages; ++stage) chunks.emplace_back(b, s, stage);
    return chunks;
  };
  pipeweave::SequentialTrainer<CpuBackend, Chunk, CrossEntropy<CpuBackend, CpuOps>, pipeweave::Sgd> trainer(
      CpuBackend{}, stages, s.rows, s.micro_batches, pipeweave::Sgd{s.learning_rate, 0.9f});
  const Batch batch = make_batch(s);
  Run run;
  for (int step = 0; step < s.steps; ++step) run.losses.push_back(trainer.train_step(batch.inputs, batch.targets));
  run.parameters = trainer.stage_parameters();
  return run;
}

}  // namespace custom
