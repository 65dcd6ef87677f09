#pragma once
/// \file
/// The built-in MLP on a GPU pipeline: the runtime's executor (one host thread per
/// device), the CUDA backend, and the transports of one process (NCCL between
/// GPUs, or virtual devices sharing a GPU). Every chunk call is an NVTX range.
///
/// \code
/// const pipeweave::MlpSpec spec = pipeweave::MlpSpec::uniform(8, 256, 256, 256);
/// const auto task = pipeweave::make_regression_task(spec, 512, 7);
/// const auto program = pipeweave::make_schedule(pipeweave::ScheduleKind::kInterleaved1F1B, 2, 2, 4);
/// auto pipe = pipeweave::cuda::make_mlp_pipeline(program, spec, pipeweave::init_mlp(spec), {.rows = 512},
///                                                {.math = pipeweave::cuda::MathMode::kTf32});
/// const double loss = pipe->train_step(task.inputs, task.targets).loss;
/// \endcode

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/cuda/transport.hpp"
#include "pipeweave/runtime/executor.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/sequential.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cuda {

/// The chunk of the GPU pipelines: the built-in MLP's layers inside NVTX ranges.
using GpuMlpChunk = NvtxChunk<MlpChunk<CudaBackend>>;
/// The built-in MLP on a GPU pipeline of one process.
using CudaMlpPipeline = Pipeline<CudaBackend, Endpoint, GpuMlpChunk>;

/// The most pipeline devices one process runs (one host thread each).
inline constexpr int kMaxCudaDevices = 256;

/// GPU-specific settings of a pipeline.
struct CudaOptions {
  TransportKind transport = TransportKind::kAuto;  ///< see resolve_transport()
  MathMode math = MathMode::kFp32;                 ///< the arithmetic of every GEMM
  std::vector<int> gpus;                           ///< [device] -> GPU; empty: place_devices(P, GPUs visible)
  TransportOptions link{};                         ///< the timeout of every wait
};

/// The GPU of every device for `options` and P devices; throws when there is no GPU.
inline std::vector<int> device_gpus(int devices, const CudaOptions& options) {
  if (!options.gpus.empty()) {
    if (options.gpus.size() != static_cast<std::size_t>(devices))
      throw Error("cuda pipeline: " + std::to_string(options.gpus.size()) + " GPUs listed for " +
                  std::to_string(devices) + " devices");
    return options.gpus;
  }
  const int gpus = gpu_count();
  if (gpus == 0) throw Error("cuda pipeline: no GPU is visible");
  return place_devices(devices, gpus);
}

/// Checks what make_mlp_pipeline needs of a program, a model and a batch
/// (the runtime's rules: the layers split evenly into P*V stages, sizes in range).
inline void check_mlp_run(const Program& program, const MlpSpec& spec, const PipelineOptions& options) {
  check_mlp_spec(spec);
  const ScheduleShape& s = program.shape;
  check_layer_split(s, spec.layers());
  if (s.devices < 1 || s.devices > kMaxCudaDevices)
    throw Error("cuda pipeline: devices must be 1.." + std::to_string(kMaxCudaDevices) + " (got " +
                std::to_string(s.devices) + ")");
  const long long rows_per_mb = s.micro_batches > 0 ? options.rows / s.micro_batches : 0;
  for (int w : spec.widths)
    if (rows_per_mb * w > (1LL << 31) - 1)
      throw Error("pipeline: a micro-batch of " + std::to_string(rows_per_mb) + " samples of width " +
                  std::to_string(w) + " is too large");
}

/// The chunks of device d: its V chunks of `spec`, initialised from `init`.
inline std::vector<GpuMlpChunk> make_gpu_chunks(CudaBackend& backend, const ScheduleShape& s, const MlpSpec& spec,
                                                const HostModel& init, int device) {
  std::vector<GpuMlpChunk> chunks;
  chunks.reserve(static_cast<std::size_t>(s.chunks));
  for (int c = 0; c < s.chunks; ++c)
    chunks.emplace_back(MlpChunk<CudaBackend>(backend, spec, chunk_layers(s, spec.layers(), device, c), init), c);
  return chunks;
}

/// The GPU pipeline that trains `spec`, starting from `init`, with `program`: one
/// host thread and one CUDA stream per device, devices placed on GPUs by
/// `cuda.gpus` (or place_devices), the transport chosen by `cuda.transport`.
/// Throws pipeweave::Error for the same mistakes as pipeweave::make_mlp_pipeline,
/// and when there is no GPU or NCCL is asked for devices that share one.
inline std::unique_ptr<CudaMlpPipeline> make_mlp_pipeline(const Program& program, const MlpSpec& spec,
                                                          const HostModel& init, const PipelineOptions& options,
                                                          const CudaOptions& cuda = {}) {
  check_mlp_run(program, spec, options);
  const ScheduleShape& s = program.shape;
  std::shared_ptr<Fabric> fabric = make_fabric(cuda.transport, device_gpus(s.devices, cuda), cuda.link);
  std::vector<Endpoint> ends = fabric->endpoints();
  const BackendOptions backend_options{cuda.math};
  auto make_device = [&](int d) {
    CudaBackend backend = fabric->make_backend(d, backend_options);
    std::vector<GpuMlpChunk> chunks = make_gpu_chunks(backend, s, spec, init, d);
    return DeviceParts<CudaBackend, Endpoint, GpuMlpChunk>{std::move(backend),
                                                           std::move(ends[static_cast<std::size_t>(d)]),
                                                           std::move(chunks)};
  };
  return std::make_unique<CudaMlpPipeline>(program, make_device, options);
}

/// The transport a pipeline uses (never kAuto).
inline TransportKind transport_of(CudaMlpPipeline& pipeline) {
  TransportKind kind = TransportKind::kAuto;
  pipeline.for_each_device([&](int d, DeviceParts<CudaBackend, Endpoint, GpuMlpChunk>& parts) {
    if (d == 0) kind = parts.transport.fabric()->kind();
  });
  return kind;
}

/// The GPU pipeline's parameters gathered into one host model of `spec`'s shape.
inline HostModel download_weights(CudaMlpPipeline& pipeline, const MlpSpec& spec) {
  HostModel model;
  model.layers.resize(static_cast<std::size_t>(spec.layers()));
  // Each device writes its own layers; the host model's layer vectors are distinct.
  pipeline.for_each_device([&](int, DeviceParts<CudaBackend, Endpoint, GpuMlpChunk>& parts) {
    for (const GpuMlpChunk& chunk : parts.chunks) chunk.inner().download(parts.backend, model);
    parts.backend.synchronize();
  });
  return model;
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
