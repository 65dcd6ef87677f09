#pragma once
/// \file
/// The CPU pipeline: one thread per device (runtime/pipeline.hpp), the CPU backend
/// and the rendezvous transport; and the built-in MLP on it.
///
/// \code
/// const pipeweave::MlpSpec spec = pipeweave::MlpSpec::uniform(8, 16, 32, 4);
/// const auto task = pipeweave::make_regression_task(spec, 64, 7);
/// const auto program = pipeweave::make_schedule("1f1b", 2, 1, 4);
/// auto pipe = pipeweave::make_mlp_pipeline(program, spec, pipeweave::init_mlp(spec), {.rows = 64});
/// const double loss = pipe->train_step(task.inputs, task.targets).loss;
/// \endcode

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/transport.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/runtime/replicas.hpp"

namespace pipeweave::cpu {

/// The built-in MLP on the CPU pipeline.
using CpuMlpPipeline = MlpPipeline<CpuBackend, RendezvousEndpoint>;

/// The most devices (threads) the CPU pipeline runs.
inline constexpr int kMaxCpuDevices = 256;

}  // namespace pipeweave::cpu

namespace pipeweave {

/// The CPU pipeline that trains `spec`, starting from `init`, with `program`: the
/// factory of the pipeline of one process, its backend chosen by the type of the
/// last argument (cuda/pipeline.hpp takes cuda::CudaOptions there); the CPU is
/// the default. See the generic make_mlp_pipeline (model/mlp_pipeline.hpp) for
/// the checks it makes.
inline std::unique_ptr<cpu::CpuMlpPipeline> make_mlp_pipeline(const Program& program, const MlpSpec& spec,
                                                              const HostModel& init, const PipelineOptions& options,
                                                              const cpu::CpuOptions& cpu = {}) {
  using namespace pipeweave::cpu;
  (void)resolve_cpu_transport(cpu.transport);
  if (cpu.blas_threads > 0) set_blas_threads(cpu.blas_threads);
  const int devices = program.shape.devices;
  if (devices < 1 || devices > kMaxCpuDevices)
    throw_error({}, "cpu pipeline: devices must be 1..", kMaxCpuDevices, " (one thread each; got ", devices, ")");
  if (devices * std::max(1, options.replicas) > kMaxCpuDevices)
    throw_error({}, "cpu pipeline: devices x replicas must be at most ", kMaxCpuDevices, " (one thread each; got ",
                devices, " x ", options.replicas, ")");
  std::vector<std::vector<RendezvousEndpoint>> endpoints;  // a transport of its own for each replica's pipeline
  for (int r = 0; r < std::max(1, options.replicas); ++r)
    endpoints.push_back(make_rendezvous(devices, options.timeout, options.spin));
  return pipeweave::make_mlp_pipeline<CpuBackend, RendezvousEndpoint>(
      program, spec, init, std::move(endpoints), [](int) { return CpuBackend{}; }, options,
      HostReplicaGroup<CpuBackend>::factory());  // the CPU's memory is the host's: the sums need no copy
}

}  // namespace pipeweave
