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

#include "common/tool.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/mpi.hpp"
#include "pipeweave/model/sequential.hpp"
#include "train_mlp_gpu.hpp"
#include "train_mlp_mpi.hpp"

namespace pw = pipeweave;

int main(int argc, char** argv) {
  pw::mpi::MpiSession mpi(argc, argv);
  const bool root = mpi.rank() == 0;
  CLI::App app{"Trains an MLP through a pipeline schedule, one process per device under mpirun (MPI point-to-point "
               "between CPU ranks, NCCL between GPU ranks), and checks the parameters against sequential training "
               "on rank 0."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  train_mlp_mpi::Settings s;
  std::string backend = "auto";
  app.add_option("--backend", backend, "cpu, cuda or auto: CUDA where the build has it and a GPU is visible (default auto)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--schedule", s.schedule,
                 pw::tool::schedule_help())
      ->check(CLI::IsMember(pw::tool::schedule_names()));
  app.add_flag("--overlap", s.overlapped,
               "Fuse the program's steady phase into overlapped pairs (overlap()): a forward and an independent "
               "backward of a rank at once, on two threads (CUDA: two streams)");
  app.add_option("--chunks", s.chunks,
                 "Chunks per device V (" + pw::tool::chunks_help() + ")")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches", s.micro_batches,
                 "Micro-batches M of each replica; " + pw::tool::micro_batches_help() + ", P the ranks / D (default 8)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--replicas", s.replicas,
                 "Data-parallel replicas D of the pipeline, each on its shard of the batch: P x D ranks, P the "
                 "pipeline devices; each device sums a chunk's gradients over the D ranks that hold it after its "
                 "last backward of it, in replica order (default 1)")
      ->check(CLI::Range(1, 4096));
  std::vector<std::string> layouts;
  std::string layout_help = "With --replicas, which rank holds which device of which replica:";
  for (const pw::RankLayoutRow& r : pw::kRankLayoutRows) {
    layouts.emplace_back(r.name);
    layout_help += " " + std::string(r.name) + ", " + std::string(r.words) + ";";
  }
  app.add_option("--rank-layout", s.rank_layout,
                 layout_help + " default dp-adjacent: the reductions, which move all gradients every step, get the "
                 "nearest ranks")
      ->check(CLI::IsMember(layouts));
  const CLI::Option* layers_flag =
      app.add_option("--layers", s.layers,
                     "Layers, a multiple of ranks * chunks, or the sum of --layers-per-stage (default 16)")
          ->check(CLI::Range(1, pw::kMaxLayers));
  pw::tool::add_layers_per_stage_flag(app, s.layers_per_stage, layers_flag, s.layers, pw::kMaxLayers);
  app.add_option("--hidden", s.hidden, "Features of every layer (default 256)")->check(CLI::Range(1, pw::kMaxWidth));
  app.add_option("--batch", s.batch, "Samples per step, a multiple of D x M (default 1024)")->check(CLI::Range(1, pw::kMaxRows));
  app.add_option("--steps", s.steps, "Training steps (default 50)")->check(CLI::Range(0, 10000000));
  app.add_option("--lr", s.lr, "Learning rate (default 0.003)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", s.optimizer, "sgd or adam (default adam)")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--math", s.math, "CUDA backend: GEMM arithmetic fp32, tf32 or bf16 (default fp32)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--seed", s.seed, "Seed of the model, the teacher and the inputs (default 1)");
  app.add_option("--timeout-ms", s.timeout_ms, "Longest wait before it is an error (default 60000)")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--tolerance", s.tolerance, "Largest accepted parameter difference to sequential training (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", s.log_every, "Print the loss every N steps (default: about 20 lines)")
      ->check(CLI::Range(1, 10000000));
  pw::tool::add_checkpoint_flags(app, s.ckpt, "every rank its own files, on a file system every rank sees",
                                "any schedule, rank count or host wrote it");
  if (const auto status = pw::tool::parse(app, argc, argv, "train_mlp_mpi", root)) return *status;
  auto usage_error = [&](const std::string& message) {
    return root ? pw::tool::usage_error("train_mlp_mpi", message) : 2;
  };
  if (const std::string problem = s.ckpt.problem(); !problem.empty()) return usage_error(problem);
  // --backend auto decides on each rank: ranks that decide differently refuse to
  // start together (the backend is one of the settings they compare).
  const bool gpu = backend == "cuda" || (backend == "auto" && train_mlp_gpu::gpus() > 0);
  if (gpu && !train_mlp_gpu::built()) return usage_error("--backend cuda: this build has no CUDA backend; use --backend cpu");
  if (!gpu && s.math != "fp32") return usage_error("--math applies to the CUDA backend, which this run does not use");
  std::unique_ptr<train_mlp_mpi::Run> run;
  try {
    run = std::make_unique<train_mlp_mpi::Run>(s, mpi.size());
  } catch (const pw::Error& e) {
    return usage_error(e.what());
  }
#ifdef PIPEWEAVE_TRAIN_MLP_MPI_GPU
  if (gpu) return train_mlp_mpi::train_on_gpus(*run, mpi.rank());
#endif
  return train_mlp_mpi::train_rank(
      *run, mpi.rank(), std::string(pw::cpu::CpuBackend{}.name()) + ", one process per device, MPI point-to-point between them",
      [&] {
        return pw::make_mlp_pipeline(MPI_COMM_WORLD, run->program, run->spec, run->init, run->options());
      },
      [&](pw::cpu::MpiMlpPipeline&) {
        return std::make_unique<pw::SequentialTrainer<pw::cpu::CpuBackend>>(
            pw::cpu::CpuBackend{}, run->spec, run->init, s.batch, run->reference_micro_batches(), run->optimizer);
      });
}
