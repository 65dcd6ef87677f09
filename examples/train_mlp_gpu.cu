// train_mlp's GPU path: the CUDA backend's pipeline and sequential reference
// behind the CUDA-free interface of train_mlp_gpu.hpp.
#include "train_mlp_gpu.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/cuda/pipeline.hpp"

namespace train_mlp_gpu {
namespace {

namespace pc = pipeweave::cuda;
using pipeweave::TransportKind;

pc::CudaOptions options(const Settings& s, int devices) {
  pc::CudaOptions o;
  o.transport = pipeweave::parse_transport(s.transport).value_or(TransportKind::kAuto);
  o.math = pc::parse_math(s.math).value_or(pc::MathMode::kFp32);
  o.gpus = pc::device_gpus(devices, o);
  return o;
}

class GpuPipeline final : public Pipeline {
 public:
  explicit GpuPipeline(std::unique_ptr<pc::CudaMlpPipeline> p) : p_(std::move(p)) {}
  pipeweave::StepResult train_step(std::span<const float> inputs, std::span<const float> targets) override {
    return p_->train_step(inputs, targets);
  }
  const pipeweave::Trace& trace() const override { return p_->trace(); }
  const pipeweave::DevicePlan& plan(int device) const override { return p_->plan(device); }
  pipeweave::HostModel weights(const pipeweave::MlpSpec& spec) override { return pipeweave::download_weights(*p_, spec); }
  void copy_state(pipeweave::TrainingState& out) override { p_->copy_state(out); }
  void set_state(const pipeweave::TrainingState& state) override { p_->set_state(state); }
  std::string gradient_sums() const override {
    return pc::reduces_with_nccl(*p_) ? "by NCCL all-reduce (every device thread on a GPU of its own)"
                                      : "through host memory, in replica order";
  }

 private:
  std::unique_ptr<pc::CudaMlpPipeline> p_;
};

class GpuReference final : public Reference {
 public:
  explicit GpuReference(std::unique_ptr<pipeweave::SequentialTrainer<pc::CudaBackend>> r) : r_(std::move(r)) {}
  double train_step(std::span<const float> inputs, std::span<const float> targets) override {
    return r_->train_step(inputs, targets);
  }
  pipeweave::HostModel weights() override { return r_->weights(); }
  void set_gradient_order(pipeweave::GradientOrder order) override { r_->set_gradient_order(order); }
  pipeweave::TrainingState state() override { return r_->state(); }
  void set_state(const pipeweave::TrainingState& state) override { r_->set_state(state); }

 private:
  std::unique_ptr<pipeweave::SequentialTrainer<pc::CudaBackend>> r_;
};

}  // namespace

bool built() { return true; }
int gpus() { return pc::gpu_count(); }

std::string check(const Settings& s, int devices) {
  if (!pipeweave::parse_transport(s.transport)) return "--transport " + s.transport + ": use auto, nccl or virtual";
  if (!pc::parse_math(s.math)) return "--math " + s.math + ": use fp32, tf32 or bf16";
  if (gpus() == 0) return "";
  try {
    (void)pipeweave::resolve_gpu_transport(*pipeweave::parse_transport(s.transport), options(s, devices).gpus);
  } catch (const pipeweave::Error& e) {
    return e.what();
  }
  return "";
}

std::string describe(const Settings& s, int devices) {
  const pc::CudaOptions o = options(s, devices);
  const TransportKind kind = pipeweave::resolve_gpu_transport(o.transport, o.gpus);
  cudaDeviceProp prop{};
  PIPEWEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, o.gpus.front()));
  const std::set<int> used(o.gpus.begin(), o.gpus.end());
  const int n = static_cast<int>(used.size());
  return "cuda (" + std::string(prop.name) + ", cuBLAS " + std::string(pc::math_name(o.math)) + ", Thrust), " +
         std::to_string(devices) + (devices == 1 ? " device" : " devices") + " on " + std::to_string(n) +
         (n == 1 ? " GPU" : " GPUs") + ", transport " + std::string(pipeweave::transport_name(kind)) +
         (kind == TransportKind::kNccl ? " (NCCL send/recv, one rank per GPU)"
                                           : " (cudaMemcpyAsync and events between streams)");
}

std::unique_ptr<Pipeline> make_pipeline(const pipeweave::Program& program, const pipeweave::MlpSpec& spec,
                                        const pipeweave::HostModel& init, const pipeweave::PipelineOptions& opts,
                                        const Settings& settings) {
  return std::make_unique<GpuPipeline>(
      pipeweave::make_mlp_pipeline(program, spec, init, opts,
                                   options(settings, program.shape.devices * std::max(1, opts.replicas))));
}

std::unique_ptr<Reference> make_reference(const pipeweave::MlpSpec& spec, const pipeweave::HostModel& init, int rows,
                                          int micro_batches, int replicas, const pipeweave::OptimizerConfig& optimizer,
                                          const Settings& settings) {
  const pc::CudaOptions o = options(settings, 1);
  auto reference = pc::make_sequential(o.gpus.front(), o.math, spec, init, rows, micro_batches * replicas, optimizer);
  reference->set_replicas(replicas);  // each replica's gradient sum, then the replicas in order
  return std::make_unique<GpuReference>(std::move(reference));
}

}  // namespace train_mlp_gpu
