// train_mlp's CUDA backend: the pipeline's devices on the visible GPUs (one
// each, or several sharing one), the sequential reference on the GPU of device
// 0 in the same arithmetic. Built where the build has CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include "pipeweave/cuda/pipeline.hpp"
#include "train_mlp.hpp"

namespace train_mlp {
namespace {

namespace pw = pipeweave;
namespace pc = pipeweave::cuda;
using pw::TransportKind;

pc::CudaOptions options(const pw::tool::TrainingFlags& f, int devices) {
  pc::CudaOptions o;
  o.transport = *pw::parse_transport(f.transport);
  o.math = *pc::parse_math(f.math);
  o.gpus = pc::device_gpus(devices, o);
  return o;
}

class CudaThreads final : public Backend {
 public:
  int visible() const override { return pc::gpu_count(); }
  std::string check(const pw::tool::TrainingFlags& f, int devices) const override {
    try {
      (void)pw::resolve_gpu_transport(*pw::parse_transport(f.transport), options(f, devices).gpus);
    } catch (const pw::Error& e) {
      return e.what();
    }
    return "";
  }
  std::string describe(const pw::tool::TrainingFlags& f, int devices) const override {
    const pc::CudaOptions o = options(f, devices);
    const TransportKind kind = pw::resolve_gpu_transport(o.transport, o.gpus);
    cudaDeviceProp prop{};
    PIPEWEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, o.gpus.front()));
    const std::set<int> used(o.gpus.begin(), o.gpus.end());
    const int n = static_cast<int>(used.size());
    return std::string(pw::tool::backend_row(pw::tool::BackendKind::kCuda).name) + " (" + std::string(prop.name) +
           ", cuBLAS " + std::string(pc::math_name(o.math)) + ", Thrust), " + std::to_string(devices) +
           (devices == 1 ? " device" : " devices") + " on " + std::to_string(n) + (n == 1 ? " GPU" : " GPUs") +
           ", transport " + std::string(pw::transport_name(kind)) +
           (kind == TransportKind::kNccl ? " (NCCL send/recv, one rank per GPU)"
                                         : " (cudaMemcpyAsync and events between streams)");
  }
  // A pair's halves run on the device's two streams.
  bool pairs_at_once(int) const override { return true; }
  std::unique_ptr<Pipeline> make_pipeline(const pw::Program& program, const pw::MlpSpec& spec, const pw::HostModel& init,
                                          const pw::PipelineOptions& opts,
                                          const pw::tool::TrainingFlags& f) const override {
    auto p = pw::make_mlp_pipeline(program, spec, init, opts,
                                   options(f, program.shape.devices * std::max(1, opts.replicas)));
    const bool nccl = pc::reduces_with_nccl(*p);
    return std::make_unique<PipelineOf<pc::CudaMlpPipeline>>(
        std::move(p), nccl ? "by NCCL all-reduce (every device thread on a GPU of its own)"
                           : "through host memory, in replica order");
  }
  std::unique_ptr<Reference> make_reference(const pw::MlpSpec& spec, const pw::HostModel& init, int rows,
                                            int micro_batches, int replicas, const pw::OptimizerConfig& optimizer,
                                            const pw::tool::TrainingFlags& f) const override {
    const pc::CudaOptions o = options(f, 1);
    return std::make_unique<ReferenceOf<pw::SequentialTrainer<pc::CudaBackend>>>(
        pc::make_sequential(o.gpus.front(), o.math, spec, init, rows, micro_batches * replicas, optimizer), replicas);
  }
};

const CudaThreads backend{};
const Registry::Add registered(pw::tool::BackendKind::kCuda, backend);

}  // namespace
}  // namespace train_mlp
