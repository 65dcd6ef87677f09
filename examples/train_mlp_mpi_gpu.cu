// train_mlp_mpi on GPUs: one process per GPU, NCCL between them (bootstrapped by
// MPI), the sequential reference on rank 0's GPU in the same arithmetic. Each
// rank takes the GPU of its index on its machine; a rank without one makes every
// rank refuse at start-up.
#include "pipeweave/cuda/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <memory>
#include <string>

#include "train_mlp_mpi.hpp"

namespace train_mlp_mpi {

int train_on_gpus(const Run& run, int rank) {
  namespace pc = pipeweave::cuda;
  const pc::MathMode mode = *pc::parse_math(run.settings.math);
  const std::string backend_line = "cuda (cuBLAS " + run.settings.math +
                                   "), one process per GPU, NCCL across processes (bootstrapped by MPI)";
  return train_rank(
      run, rank, backend_line,
      [&] {
        return pipeweave::make_mlp_pipeline(MPI_COMM_WORLD, run.program, run.spec, run.init, run.options(),
                                            pc::CudaOptions{.math = mode});
      },
      [&](pc::MpiMlpPipeline& pipe) {
        return pc::make_sequential(pipe.parts().transport.gpu(), mode, run.spec, run.init, run.settings.batch,
                                   run.reference_micro_batches(), run.optimizer);
      });
}

}  // namespace train_mlp_mpi
