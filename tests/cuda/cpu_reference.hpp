// Training on the CPU backend, for the GPU tests to compare with. Compiled by g++
// (OpenBLAS, Thrust's host system) in its own translation unit, so that nvcc
// never sees the CPU backend.
#pragma once

#include <vector>

#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"

namespace pipeweave::test {

/// What a CPU run gives: the loss of every step and the final parameters.
struct CpuRun {
  std::vector<double> losses;
  HostModel weights;
};

/// `steps` steps of sequential training of `spec` from `init` on the CPU backend.
CpuRun train_on_cpu(const MlpSpec& spec, const HostModel& init, const RegressionTask& task, int micro_batches,
                    const OptimizerConfig& optimizer, int steps);

}  // namespace pipeweave::test
