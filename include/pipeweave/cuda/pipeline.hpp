#pragma once
/// \file
/// The GPU pipeline of one process: the runtime's host (one host thread per
/// device), the CUDA backend, and the transports of one process (NCCL between
/// GPUs, or virtual devices sharing a GPU); and the built-in MLP on it. Every
/// chunk call is an NVTX range.
///
/// \code
/// const pipeweave::MlpSpec spec = pipeweave::MlpSpec::uniform(8, 256, 256, 256);
/// const auto task = pipeweave::make_regression_task(spec, 512, 7);
/// const auto program = pipeweave::make_schedule("interleaved", 2, 2, 4);
/// auto pipe = pipeweave::make_mlp_pipeline(program, spec, pipeweave::init_mlp(spec), {.rows = 512},
///                                          pipeweave::cuda::CudaOptions{.math = pipeweave::cuda::MathMode::kTf32});
/// const double loss = pipe->train_step(task.inputs, task.targets).loss;
/// \endcode

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/cuda/replicas.hpp"
#include "pipeweave/cuda/transport.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cuda {

/// The chunk of the GPU pipelines: the built-in MLP's layers inside NVTX ranges.
using GpuMlpChunk = NvtxChunk<MlpChunk<CudaBackend>>;
/// The built-in MLP on a GPU pipeline of one process.
using CudaMlpPipeline = Pipeline<CudaBackend, Endpoint, GpuMlpChunk>;

/// The most pipeline devices one process runs (one host thread each).
inline constexpr int kMaxCudaDevices = 256;

/// The GPU of every device for `options` and P devices; throws when there is no GPU.
inline std::vector<int> device_gpus(int devices, const CudaOptions& options) {
  if (!options.gpus.empty()) {
    if (options.gpus.size() != static_cast<std::size_t>(devices))
      throw_error({}, "cuda pipeline: ", options.gpus.size(), " GPUs listed for ", devices, " devices");
    return options.gpus;
  }
  const int gpus = gpu_count();
  if (gpus == 0) throw_error({}, "cuda pipeline: no GPU is visible");
  return place_devices(devices, gpus);
}

/// The transport a pipeline uses (never kAuto).
inline TransportKind transport_of(CudaMlpPipeline& pipeline) {
  TransportKind kind = TransportKind::kAuto;
  pipeline.for_each_device([&](int d, DeviceParts<CudaBackend, Endpoint, GpuMlpChunk>& parts) {
    if (d == 0) kind = parts.transport.fabric()->kind();
  });
  return kind;
}

/// Whether `pipeline` sums its gradients over the replicas by NCCL (its
/// replicas' device threads all on GPUs of their own: nccl_reductions) rather
/// than through host memory.
inline bool reduces_with_nccl(const CudaMlpPipeline& pipeline) {
  return dynamic_cast<const NcclReplicaGroup*>(pipeline.replica_collective(0)) != nullptr;
}

/// Sequential training of `spec` on one GPU (the reference the GPU pipeline must
/// equal): the runtime's SequentialTrainer on a CUDA backend.
inline std::unique_ptr<SequentialTrainer<CudaBackend>> make_sequential(int gpu, MathMode math, const MlpSpec& spec,
                                                                       const HostModel& init, int rows,
                                                                       int micro_batches,
                                                                       const OptimizerConfig& optimizer) {
  return std::make_unique<SequentialTrainer<CudaBackend>>(CudaBackend(gpu, {math}), spec, init, rows, micro_batches,
                                                          optimizer);
}

}  // namespace pipeweave::cuda

namespace pipeweave {

/// The GPU pipeline that trains `spec`, starting from `init`, with `program`: one
/// host thread and one CUDA stream per device, devices placed on GPUs by
/// `cuda.gpus` (or place_devices), the transport chosen by `cuda.transport`.
/// With D = options.replicas data-parallel replicas, each replica's P devices
/// have a transport of their own (device d of replica r is device thread r * P +
/// d of `cuda.gpus`), and each R sums a chunk's gradients over the replicas on a
/// stream of its own beside the compute: by an NCCL all-reduce where every device
/// thread has a GPU of its own (cuda/replicas.hpp), otherwise
/// through host memory in replica order (runtime/replicas.hpp); see
/// nccl_reductions() and reduces_with_nccl().
/// Throws pipeweave::Error for the same mistakes as the generic make_mlp_pipeline
/// (model/mlp_pipeline.hpp), and when there is no GPU or NCCL is asked for
/// devices that share one. The backend is chosen by the type of `cuda`, which
/// therefore has no default (the CPU pipeline's factory takes cpu::CpuOptions).
inline std::unique_ptr<cuda::CudaMlpPipeline> make_mlp_pipeline(const Program& program, const MlpSpec& spec,
                                                                const HostModel& init, const PipelineOptions& options,
                                                                const cuda::CudaOptions& cuda) {
  using namespace pipeweave::cuda;
  const ScheduleShape& s = program.shape;
  const int D = std::max(1, options.replicas);
  if (s.devices < 1 || s.devices * D > kMaxCudaDevices)
    throw_error({}, "cuda pipeline: devices x replicas must be 1..", kMaxCudaDevices, " (got ", s.devices, " x ", D,
                ")");
  check_mlp_run(s, spec, options.rows / D, "pipeline");
  const std::vector<int> gpus = device_gpus(s.devices * D, cuda);
  std::vector<std::shared_ptr<Fabric>> fabrics;  // [replica]: the transport of its pipeline
  std::vector<std::vector<Endpoint>> ends;
  for (int r = 0; r < D; ++r) {
    const auto first = gpus.begin() + static_cast<std::ptrdiff_t>(r) * s.devices;
    fabrics.push_back(make_fabric(cuda.transport, std::vector<int>(first, first + s.devices), options.timeout));
    ends.push_back(fabrics.back()->endpoints());
  }
  auto make_device = [&](int d, int r) {
    CudaBackend backend = fabrics[static_cast<std::size_t>(r)]->make_backend(d, cuda);
    std::vector<GpuMlpChunk> chunks = make_mlp_chunks<GpuMlpChunk>(backend, s, spec, init, d);
    return DeviceParts<CudaBackend, Endpoint, GpuMlpChunk>{
        std::move(backend), std::move(ends[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)]),
        std::move(chunks)};
  };
  const MakeReplicaCollective reductions =
      nccl_reductions(gpus, s.devices, D) ? NcclReplicaGroup::factory(gpus, s.devices) : nullptr;
  return std::make_unique<CudaMlpPipeline>(program, make_device, options, CudaMlpPipeline::LossFunction{}, reductions);
}

}  // namespace pipeweave
