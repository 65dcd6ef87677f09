// train_mlp_mpi: trains the MLP of train_mlp through a pipeline schedule with one
// process per pipeline device, launched by mpirun (across machines too):
//
//   mpirun -n 4 build/examples/train_mlp_mpi --backend cpu --micro-batches 8 --steps 20
//   mpirun -n 2 build/examples/train_mlp_mpi --backend cpu --layers-per-stage 1,3,3,1   # uneven stages
//   mpirun -n 4 build/examples/train_mlp_mpi --backend cpu --replicas 2   # 2 devices x 2 data-parallel replicas
//
// On CPUs (--backend cpu) the ranks exchange tensors by MPI point-to-point; on
// GPUs (--backend cuda, a build with the CUDA backend) by NCCL, one GPU per rank.
// Every rank first checks that all ranks were started with the same settings and
// refuses otherwise, naming the first that differs. Rank 0 prints the losses and,
// at the end, compares the parameters with sequential training of the same model
// (exit status 1 when they differ by more than --tolerance, or when training
// fails on any rank: each rank then prints one line); 2 for bad arguments.
#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <memory>
#include <string>
#include <vector>

#include "common/training.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/mpi.hpp"
#include "pipeweave/model/sequential.hpp"
#include "train_mlp_mpi.hpp"

namespace pw = pipeweave;

namespace {

// The CPU backend: MPI point-to-point between the ranks, the reference on rank 0's CPU.
class CpuRanks final : public train_mlp_mpi::RankBackend {
 public:
  int train(const train_mlp_mpi::Run& run, int rank) const override {
    return train_mlp_mpi::train_rank(
        run, rank, std::string(pw::cpu::CpuBackend{}.name()) + ", one process per device, MPI point-to-point between them",
        [&] { return pw::make_mlp_pipeline(MPI_COMM_WORLD, run.program, run.spec, run.init, run.options()); },
        [&](pw::cpu::MpiMlpPipeline&) {
          return std::make_unique<pw::SequentialTrainer<pw::cpu::CpuBackend>>(
              pw::cpu::CpuBackend{}, run.spec, run.init, run.settings.batch, run.reference_micro_batches(),
              run.optimizer);
        });
  }
};
const CpuRanks cpu_ranks{};
const train_mlp_mpi::Registry::Add registered(pw::tool::BackendKind::kCpu, cpu_ranks);

}  // namespace

int main(int argc, char** argv) {
  pw::mpi::MpiSession mpi(argc, argv);
  const bool root = mpi.rank() == 0;
  CLI::App app{"Trains an MLP through a pipeline schedule, one process per device under mpirun (MPI point-to-point "
               "between CPU ranks, NCCL between GPU ranks), and checks the parameters against sequential training "
               "on rank 0."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  train_mlp_mpi::Settings s;
  pw::tool::add_training_flags(app, s, {.max_chunks = 64, .max_replicas = 4096,
                                        .save_help = "every rank its own files, on a file system every rank sees",
                                        .resume_help = "any schedule, rank count or host wrote it"});
  std::vector<std::string> layouts;
  std::string layout_help = "With --replicas, which rank holds which device of which replica:";
  for (const pw::RankLayoutRow& r : pw::kRankLayoutRows) {
    layouts.emplace_back(r.name);
    layout_help += " " + std::string(r.name) + ", " + std::string(r.words) + ";";
  }
  app.add_option("--rank-layout", s.rank_layout,
                 layout_help + " default " + s.rank_layout + ": the reductions, which move all gradients every step, "
                 "get the nearest ranks")
      ->check(CLI::IsMember(layouts));
  if (const auto status = pw::tool::parse(app, argc, argv, "train_mlp_mpi", root)) return *status;
  auto usage_error = [&](const std::string& message) {
    return root ? pw::tool::usage_error("train_mlp_mpi", message) : 2;
  };
  // --backend auto decides on each rank: ranks that decide differently refuse to
  // start together (the backend is one of the settings they compare).
  const auto backend = pw::tool::choose_backend<train_mlp_mpi::RankBackend>(s, app, false);
  if (!backend.error.empty()) return usage_error(backend.error);
  std::unique_ptr<train_mlp_mpi::Run> run;
  try {
    run = std::make_unique<train_mlp_mpi::Run>(s, mpi.size());
  } catch (const pw::Error& e) {
    return usage_error(e.what());
  }
  return backend.impl->train(*run, mpi.rank());
}
