#pragma once
/// \file
/// The built-in MLP on the multi-process host, for any backend and
/// multi-process transport: each rank builds its parts (backend, endpoint) and
/// the chunks of its virtual stages, and the ranks agree on the model, the
/// optimizer, the backend and the arithmetic besides the program and the batch.
/// cpu/mpi.hpp and cuda/mpi.hpp call it with their parts.
///
/// \code
/// // auto pipe = pipeweave::make_mlp_pipeline<B, T>(MPI_COMM_WORLD, program, spec, init,
/// //     {.rows = 512, .timeout = std::chrono::seconds(30)}, "cpu", "fp32",
/// //     [&](const std::shared_ptr<pipeweave::mpi::Control>& control, auto&& make_chunks) {
/// //       ... parts.chunks = make_chunks(parts.backend); return parts; });
/// \endcode

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/mpi/pipeline.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave::mpi {

/// One rank of the built-in MLP across processes; C is MlpChunk<B> or a wrapper
/// of it (see make_mlp_chunks).
template <Backend B, MultiProcessTransport T, class C = MlpChunk<B>>
using MlpPipeline = MpiPipeline<B, T, C>;

}  // namespace pipeweave::mpi

namespace pipeweave {

/// One rank of the built-in MLP `spec` (from `init`) trained with `program`
/// across processes; collective over `comm`: the factory of the multi-process
/// host for any backend. cpu/mpi.hpp and cuda/mpi.hpp give it their parts, chosen
/// by the type of the backend options (cpu::CpuOptions, cuda::CudaOptions). make_parts(control, make_chunks)
/// returns this rank's DeviceParts<B, T, C>, its chunks from make_chunks(backend). The ranks must agree on the program, the batch, the
/// model, the optimizer, the backend and the arithmetic, or all refuse to start,
/// naming the first setting that differs.
template <Backend B, mpi::MultiProcessTransport T, class C = MlpChunk<B>, class MakeParts>
std::unique_ptr<mpi::MlpPipeline<B, T, C>> make_mlp_pipeline(MPI_Comm comm, const Program& program, const MlpSpec& spec,
                                                          const HostModel& init, const PipelineOptions& options,
                                                          std::string_view backend, std::string_view arithmetic,
                                                          MakeParts&& make_parts) {
  auto make_device = [&](const std::shared_ptr<mpi::Control>& control) {
    check_mlp_run(program.shape, spec, options.rows, "mpi pipeline");
    return make_parts(control, [&](B& backend) {
      return make_mlp_chunks<C>(backend, program.shape, spec, init, control->device());
    });
  };
  return std::make_unique<mpi::MlpPipeline<B, T, C>>(comm, program, make_device, options,
                                                     mlp_config(spec, options.optimizer, backend, arithmetic));
}

}  // namespace pipeweave
