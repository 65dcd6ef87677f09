// custom_chunk: a model of one's own on GPUs, with one's own CUDA kernels. Each
// virtual stage is a dense layer y = tanh(x W^T + b) (the last gives logits) and
// the loss is a softmax cross-entropy over class indices (custom_model.hpp); their
// forward and backward are kernels of this file, launched with <<<...>>> on the
// stream the CUDA backend hands them. The pipeline is the library's: the
// default schedule (2 devices x 2 chunks, 4 micro-batches) on the CUDA
// backend with the virtual transport, so that one GPU suffices. At the end the
// losses and parameters are checked against the same model trained on the CPU
// backend (custom_chunk_cpu.cpp); exit status 1 when they differ by more than
// the rounding of bf16 hand-overs allows, 77 when no GPU is visible. The chunks
// are bf16 chunks (custom_model.hpp): the engine hands bf16 between them.
//
//   build/examples/custom_chunk
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "custom_model.hpp"
#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/transport.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pw = pipeweave;
namespace pc = pipeweave::cuda;

namespace {

constexpr int kThreads = 128;
int blocks(int n) { return (n + kThreads - 1) / kThreads; }

using pw::bf16;

template <class X>
__global__ void dense_forward_kernel(const X* x, const float* w, const float* bias, bf16* y, int rows, int f,
                                     bool activate) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * f) y[i] = pw::to_bf16(custom::dense_out(x, w, bias, i / f, i % f, f, activate));
}

__global__ void dense_dz_kernel(const bf16* y, const bf16* dy, float* dz, int n, bool activate) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dz[i] = custom::dense_dz(y, dy, i, activate);
}

// One thread per weight (o, k) and, for k == f, per bias o: the gradients add up over micro-batches.
template <class X>
__global__ void dense_parameter_grad_kernel(const float* dz, const X* x, float* grad_w, float* grad_b, int rows,
                                            int f) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= f * (f + 1)) return;
  const int o = i / (f + 1), k = i % (f + 1);
  if (k < f)
    grad_w[o * f + k] += custom::dense_weight_grad(dz, x, rows, f, f, o, k);
  else
    grad_b[o] += custom::dense_bias_grad(dz, rows, f, o);
}

template <class X>
__global__ void dense_input_grad_kernel(const float* dz, const float* w, X* dx, int rows, int f) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * f) dx[i] = pw::from_float<X>(custom::dense_input_grad(dz, w, f, f, i / f, i % f));
}

__global__ void cross_entropy_kernel(const bf16* y, const float* target, bf16* dy, float* row_losses, int rows,
                                     int classes, float scale) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) row_losses[r] = custom::cross_entropy_row(y, target, dy, r, classes, scale);
}

// The mean of the rows' losses, summed in row order by one thread (a handful of rows).
__global__ void mean_kernel(const float* row_losses, float* loss, int rows, float scale) {
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += scale * row_losses[r];
  *loss = sum;
}

// The arithmetic of custom_model.hpp over whole tensors: kernels of this file on
// the backend's stream (the runtime's built-in functors are not used).
struct GpuOps {
  template <class X>
  static void dense_forward(pc::CudaBackend& b, const X* x, const float* w, const float* bias, bf16* y, int rows,
                            int f, bool activate) {
    dense_forward_kernel<<<blocks(rows * f), kThreads, 0, b.stream()>>>(x, w, bias, y, rows, f, activate);
    PIPEWEAVE_CHECK_CUDA(cudaGetLastError());
  }
  template <class X>
  static void dense_backward(pc::CudaBackend& b, const X* x, const bf16* y, const bf16* dy, float* dz,
                             const float* w, float* grad_w, float* grad_b, X* dx, int rows, int f, bool activate) {
    dense_dz_kernel<<<blocks(rows * f), kThreads, 0, b.stream()>>>(y, dy, dz, rows * f, activate);
    dense_parameter_grad_kernel<<<blocks(f * (f + 1)), kThreads, 0, b.stream()>>>(dz, x, grad_w, grad_b, rows, f);
    if (dx != nullptr) dense_input_grad_kernel<<<blocks(rows * f), kThreads, 0, b.stream()>>>(dz, w, dx, rows, f);
    PIPEWEAVE_CHECK_CUDA(cudaGetLastError());
  }
  static void cross_entropy(pc::CudaBackend& b, const bf16* y, const float* target, bf16* dy, float* row_losses,
                            float* loss, int rows, int classes) {
    const float scale = 1.0f / static_cast<float>(rows);
    cross_entropy_kernel<<<blocks(rows), kThreads, 0, b.stream()>>>(y, target, dy, row_losses, rows, classes, scale);
    mean_kernel<<<1, 1, 0, b.stream()>>>(row_losses, loss, rows, scale);
    PIPEWEAVE_CHECK_CUDA(cudaGetLastError());
  }
};

using Chunk = custom::DenseChunk<pc::CudaBackend, GpuOps>;
using Loss = custom::CrossEntropy<pc::CudaBackend, GpuOps>;
static_assert(pw::Chunk<Chunk, pc::CudaBackend> && pw::Loss<Loss, pc::CudaBackend>);

}  // namespace

int main() {
  if (pc::gpu_count() == 0) {
    std::puts("custom_chunk: no GPU visible: skipped");
    return 77;
  }
  const custom::Setup setup;
  const pw::Program program = pw::make_schedule(pw::preferred_kind(), 2, 2, setup.micro_batches);
  try {
    // Two pipeline devices on GPU 0: the virtual transport (copies and events between streams).
    auto fabric = pc::make_fabric(pw::TransportKind::kVirtual, {0, 0});
    std::vector<pc::Endpoint> ends = fabric->endpoints();
    auto make_device = [&](int d) {
      pw::DeviceParts<pc::CudaBackend, pc::Endpoint, Chunk> parts{fabric->make_backend(d),
                                                                  std::move(ends[static_cast<std::size_t>(d)]), {}};
      for (int c = 0; c < program.shape.chunks; ++c) parts.chunks.emplace_back(parts.backend, setup, program.shape.stage_of(d, c));
      return parts;
    };
    pw::Pipeline<pc::CudaBackend, pc::Endpoint, Chunk, Loss, pw::Sgd> pipe(
        program, make_device, {setup.rows, pw::Sgd{setup.learning_rate, 0.9f}});
    const custom::Batch batch = custom::make_batch(setup);
    custom::Run gpu;
    for (int step = 0; step < setup.steps; ++step) gpu.losses.push_back(pipe.train_step(batch.inputs, batch.targets).loss);
    gpu.parameters = pipe.stage_parameters();

    const custom::Run cpu = custom::train_on_cpu(setup);
    double loss_gap = 0, parameter_gap = 0;
    for (int step = 0; step < setup.steps; ++step)
      loss_gap = std::max(loss_gap, std::fabs(gpu.losses[static_cast<std::size_t>(step)] -
                                              cpu.losses[static_cast<std::size_t>(step)]) /
                                        std::fabs(cpu.losses[static_cast<std::size_t>(step)]));
    for (std::size_t s = 0; s < cpu.parameters.size(); ++s)
      for (std::size_t k = 0; k < cpu.parameters[s].size(); ++k)
        parameter_gap = std::max(parameter_gap, static_cast<double>(std::fabs(gpu.parameters[s][k] - cpu.parameters[s][k])));
    std::string backend;
    pipe.for_each_device([&](int d, auto& parts) {
      if (d == 0) backend = parts.backend.name();
    });
    // bf16 hand-overs: a value that the GPU's tanhf, expf or fused multiply-adds leave one fp32 ulp
    // from the CPU's may round to the neighbouring bf16 (2^-8 apart). The CPU run with tanh, exp and
    // log in double (rounded to fp32) and contracted multiply-adds ends 4e-4 (loss, relative) and
    // 3e-4 (parameters) from the plain one; the tolerance leaves a margin of 25 over that.
    const double tolerance = 1e-2;
    // Every hand-over between the devices is bf16: half the bytes of fp32.
    std::size_t messages = 0, bf16_messages = 0, bytes = 0;
    for (int d = 0; d < program.shape.devices; ++d)
      for (const pw::Message& m : pipe.messages(d)) {
        ++messages;
        bf16_messages += m.dtype == pw::DType::kBF16 ? 1 : 0;
        bytes = std::max(bytes, m.bytes);
      }
    const bool ok = loss_gap <= tolerance && parameter_gap <= tolerance && messages > 0 && bf16_messages == messages;
    std::printf("custom_chunk: %d dense layers of %d features with kernels of their own, bf16 between them, "
                "softmax cross-entropy, %s on 2 virtual devices x 2 chunks, %d micro-batches, on %s\n",
                setup.stages, setup.features, std::string(pw::kind_row(program.shape.kind).title).c_str(),
                setup.micro_batches, backend.c_str());
    std::printf("hand-overs: %zu of %zu messages in bf16, %zu bytes each (a micro-batch of %d samples x %d features)\n",
                bf16_messages, messages, bytes, setup.rows / setup.micro_batches, setup.features);
    std::printf("loss %.6f -> %.6f over %d steps (CPU backend: %.6f -> %.6f)\n", gpu.losses.front(), gpu.losses.back(),
                setup.steps, cpu.losses.front(), cpu.losses.back());
    std::printf("largest difference to the CPU backend: loss %.2e (relative), parameters %.2e (tolerance %.0e): %s\n",
                loss_gap, parameter_gap, tolerance, ok ? "ok" : "FAILED");
    return ok && gpu.losses.back() < gpu.losses.front() ? 0 : 1;
  } catch (const pw::Error& e) {
    std::fprintf(stderr, "custom_chunk: %s\n", e.what());
    return 1;
  }
}
