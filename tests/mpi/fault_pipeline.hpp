// The multi-process host on the CPU with the fault-injecting MLP chunk
// (common/fault_chunk.hpp), for the fault tests under mpirun: test_mpi_cpu.cpp
// and the program that loses a rank (fault_rank.cpp).
#pragma once

#include "pipeweave/cpu/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <memory>
#include <vector>

#include "../common/fault_chunk.hpp"
#include "pipeweave/schedule/allocation.hpp"

namespace pipeweave::test {

/// One rank of the multi-process host whose chunks are FaultChunks.
using FaultPipeline = mpi::MpiPipeline<cpu::CpuBackend, mpi::HostEndpoint, FaultChunk>;

/// The model of a fault test and its batch.
struct FaultModel {
  MlpSpec spec;
  OptimizerConfig optimizer;
  int rows;
};

/// This rank of `program` on `m`, the fault armed in every rank's chunks (it
/// fires on fault->device, of fault->replica, only); collective over
/// MPI_COMM_WORLD. With `replicas` > 1 the program must have its reductions
/// (with_grad_reduce()); `layout` places the P x D ranks.
inline std::unique_ptr<FaultPipeline> make_fault_pipeline(const Program& program, const FaultModel& m,
                                                          std::shared_ptr<Fault> fault,
                                                          std::chrono::milliseconds timeout, int replicas = 1,
                                                          RankLayout layout = RankLayout::kDpAdjacent) {
  const HostModel init = init_mlp(m.spec);
  auto make_device = [&](const std::shared_ptr<mpi::Control>& control) {
    return cpu::make_mpi_device<FaultChunk>(control, [&](cpu::CpuBackend& b) {
      std::vector<FaultChunk> chunks;
      for (int c = 0; c < program.shape.chunks; ++c)
        chunks.emplace_back(
            MlpChunk<cpu::CpuBackend>(b, m.spec, chunk_layers(program.shape, m.spec.allocation(), control->device(), c),
                                      init),
            control->device(), c, fault, control->replica());
      return chunks;
    });
  };
  PipelineOptions options{m.rows, m.optimizer, timeout};
  options.replicas = replicas;
  options.layout = layout;
  return std::make_unique<FaultPipeline>(MPI_COMM_WORLD, program, make_device, options,
                                         mlp_config(m.spec, m.optimizer, "cpu", "fp32"));
}

/// This rank's layers of the model (the other ranks' stay empty).
inline HostModel local_weights(FaultPipeline& pipe, const MlpSpec& spec) {
  HostModel m;
  m.layers.resize(static_cast<std::size_t>(spec.layers()));
  for (const FaultChunk& c : pipe.parts().chunks) c.inner().download(pipe.parts().backend, m);
  return m;
}

}  // namespace pipeweave::test
