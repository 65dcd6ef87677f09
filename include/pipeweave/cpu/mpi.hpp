#pragma once
/// \file
/// The CPU backend across processes: one process per pipeline device under
/// `mpirun` (across machines too), the multi-process host (mpi/pipeline.hpp) with
/// MPI point-to-point between the ranks (mpi/transport.hpp). Any chunk runs on
/// it; the built-in MLP has a factory. Trains bit for bit like sequential
/// training, as the pipeline of threads does.
///
/// \code
/// int main(int argc, char** argv) {
///   pipeweave::mpi::MpiSession mpi(argc, argv);
///   const auto spec = pipeweave::MlpSpec::uniform(8, 64, 64, 64);
///   const auto program = pipeweave::make_schedule("1f1b", mpi.size(), 1, 8);
///   auto pipe = pipeweave::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, pipeweave::init_mlp(spec),
///                                            {.rows = 256});
///   const auto task = pipeweave::make_regression_task(spec, 256, 7);
///   return pipe->train_step(task.inputs, task.targets).loss > 0 ? 0 : 1;  // the same loss on every rank
/// }
/// \endcode

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/mpi/mlp.hpp"
#include "pipeweave/mpi/transport.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/session.hpp"

namespace pipeweave::cpu {

/// The built-in MLP on CPUs across processes.
using MpiMlpPipeline = mpi::MlpPipeline<CpuBackend, mpi::HostEndpoint>;

/// The parts of this rank of a multi-process CPU run: its backend, its MPI
/// endpoint (not yet connected: the host connects it after the start-up
/// agreement) and the chunks make_chunks(backend) returns.
template <class C, class MakeChunks>
DeviceParts<CpuBackend, mpi::HostEndpoint, C> make_mpi_device(const std::shared_ptr<mpi::Control>& control,
                                                              MakeChunks&& make_chunks) {
  DeviceParts<CpuBackend, mpi::HostEndpoint, C> parts{CpuBackend{}, mpi::HostEndpoint(control), {}};
  parts.chunks = make_chunks(parts.backend);
  return parts;
}

}  // namespace pipeweave::cpu

namespace pipeweave {

/// One rank of the built-in MLP `spec` (from `init`) trained with `program` across
/// processes on CPUs; collective over `comm` (see the generic make_mlp_pipeline of
/// mpi/mlp.hpp). The CPU is the default backend; cuda/mpi.hpp takes
/// cuda::CudaOptions in the last argument.
inline std::unique_ptr<cpu::MpiMlpPipeline> make_mlp_pipeline(MPI_Comm comm, const Program& program,
                                                              const MlpSpec& spec, const HostModel& init,
                                                              const PipelineOptions& options,
                                                              const cpu::CpuOptions& cpu = {}) {
  using namespace pipeweave::cpu;
  if (cpu.transport != TransportKind::kAuto)
    throw_error({}, "mpi pipeline: the transport between ranks is MPI's; leave CpuOptions::transport at auto (got ",
                transport_name(cpu.transport), ")");
  if (cpu.blas_threads > 0) set_blas_threads(cpu.blas_threads);
  return pipeweave::make_mlp_pipeline<CpuBackend, mpi::HostEndpoint>(
      comm, program, spec, init, options, "cpu", "fp32",
      [](const std::shared_ptr<mpi::Control>& control, auto&& make_chunks) {
        return make_mpi_device<MlpChunk<CpuBackend>>(control, make_chunks);
      });
}

}  // namespace pipeweave
