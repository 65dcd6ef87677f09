// train_mlp_mpi's CUDA backend: one process per GPU, NCCL between them
// (bootstrapped by MPI), the sequential reference on rank 0's GPU in the same
// arithmetic. Each rank takes the GPU of its index on its machine (or the one
// its launcher gives it, CUDA_VISIBLE_DEVICES per rank); a rank without one, or
// two on one GPU, make every rank refuse at start-up. Built where the build has CUDA.
#include "pipeweave/cuda/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <string>

#include "train_mlp_mpi.hpp"

namespace train_mlp_mpi {
namespace {

namespace pw = pipeweave;
namespace pc = pipeweave::cuda;

class CudaRanks final : public RankBackend {
 public:
  int visible() const override { return pc::gpu_count(); }
  int train(const Run& run, int rank) const override {
    const pc::MathMode mode = *pc::parse_math(run.settings.math);
    const std::string backend_line = std::string(pw::tool::backend_row(pw::tool::BackendKind::kCuda).name) +
                                     " (cuBLAS " + run.settings.math +
                                     "), one process per GPU, NCCL across processes (bootstrapped by MPI)";
    return train_rank(
        run, rank, backend_line,
        [&] {
          return pw::make_mlp_pipeline(MPI_COMM_WORLD, run.program, run.spec, run.init, run.options(),
                                       pc::CudaOptions{.math = mode});
        },
        [&](pc::MpiMlpPipeline& pipe) {
          return pc::make_sequential(pipe.parts().transport.gpu(), mode, run.spec, run.init, run.settings.batch,
                                     run.reference_micro_batches(), run.optimizer);
        });
  }
};

const CudaRanks backend{};
const Registry::Add registered(pw::tool::BackendKind::kCuda, backend);

}  // namespace
}  // namespace train_mlp_mpi
