#include "cpu_reference.hpp"

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/sequential.hpp"

namespace pipeweave::test {

CpuRun train_on_cpu(const MlpSpec& spec, const HostModel& init, const RegressionTask& task, int micro_batches,
                    const OptimizerConfig& optimizer, int steps) {
  cpu::set_blas_threads(1);
  SequentialTrainer<cpu::CpuBackend> trainer(cpu::CpuBackend{}, spec, init, task.rows, micro_batches, optimizer);
  CpuRun run;
  for (int s = 0; s < steps; ++s) run.losses.push_back(trainer.train_step(task.inputs, task.targets));
  run.weights = trainer.weights();
  return run;
}

}  // namespace pipeweave::test
