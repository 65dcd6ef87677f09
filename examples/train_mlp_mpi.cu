// train_mlp_mpi: trains the MLP of train_mlp through a pipeline schedule with one
// process per GPU, NCCL between them, launched by mpirun (across machines too):
//
//   mpirun -n 4 build/examples/train_mlp_mpi --schedule interleaved --micro-batches 8 --steps 100
//
// Rank d runs pipeline device d on the GPU of its index on its machine. Every rank
// first checks that all ranks were started with the same configuration and
// refuses otherwise. Rank 0 prints the losses and, at the end, compares the
// parameters with sequential training of the same model on its GPU (exit status
// 1 when they differ by more than --tolerance); 2 for bad arguments.
#include "pipeweave/cuda/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "common/tool.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pw = pipeweave;
namespace pc = pipeweave::cuda;

int main(int argc, char** argv) {
  pw::mpi::MpiSession mpi(argc, argv);
  const bool root = mpi.rank() == 0;
  CLI::App app{"Trains an MLP through a pipeline schedule, one process per GPU under mpirun, NCCL between them, and "
               "checks the parameters against sequential training on rank 0's GPU."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::string schedule = "interleaved", math = "fp32", optimizer = "adam";
  int chunks = 0, micro_batches = 8, layers = 16, hidden = 256, batch = 1024, steps = 50, timeout_ms = 60000;
  float lr = 0.003f;
  double tolerance = 0;
  std::uint64_t seed = 1;
  app.add_option("--schedule", schedule, "gpipe, 1f1b or interleaved (default interleaved)")
      ->check(CLI::IsMember(pw::tool::schedule_names()));
  app.add_option("--chunks", chunks, "Chunks per device V (default 2 for interleaved, else 1)")->check(CLI::Range(1, 64));
  app.add_option("--micro-batches", micro_batches, "Micro-batches M; a multiple of the ranks for interleaved (default 8)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--layers", layers, "Layers, a multiple of ranks * chunks (default 16)")->check(CLI::Range(1, pw::kMaxLayers));
  app.add_option("--hidden", hidden, "Features of every layer (default 256)")->check(CLI::Range(1, pw::kMaxWidth));
  app.add_option("--batch", batch, "Samples per step, a multiple of M (default 1024)")->check(CLI::Range(1, pw::kMaxRows));
  app.add_option("--steps", steps, "Training steps (default 50)")->check(CLI::Range(0, 10000000));
  app.add_option("--lr", lr, "Learning rate (default 0.003)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "sgd or adam (default adam)")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--math", math, "GEMM arithmetic fp32, tf32 or bf16 (default fp32)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--seed", seed, "Seed of the model, the teacher and the inputs (default 1)");
  app.add_option("--timeout-ms", timeout_ms, "Longest wait before it is an error (default 60000)")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--tolerance", tolerance, "Largest accepted parameter difference to sequential training (default 0)")
      ->check(CLI::NonNegativeNumber);
  if (const auto status = pw::tool::parse(app, argc, argv, "train_mlp_mpi", root)) return *status;
  const pw::ScheduleKind kind = *pw::parse_schedule(schedule);
  if (chunks == 0) chunks = kind == pw::ScheduleKind::kInterleaved1F1B ? 2 : 1;
  try {
    const pw::Program program = pw::make_schedule(kind, mpi.size(), chunks, micro_batches);
    const pw::MlpSpec spec = pw::MlpSpec::uniform(layers, hidden, hidden, hidden, seed);
    const pw::OptimizerConfig opt{optimizer == "adam" ? pw::OptimizerKind::kAdam : pw::OptimizerKind::kSgd, lr,
                                  optimizer == "sgd" ? 0.9f : 0.0f};
    const pc::MathMode mode = *pc::parse_math(math);
    const pw::HostModel init = pw::init_mlp(spec);
    const pw::RegressionTask task = pw::make_regression_task(spec, batch, seed);
    auto pipe = pc::make_mpi_mlp_pipeline(MPI_COMM_WORLD, program, spec, init, {batch, opt},
                                          {mode, -1, std::chrono::milliseconds(timeout_ms)});
    if (root) {
      std::printf("schedule: %s, %d ranks (devices) x %d chunks = %d virtual stages, %d micro-batches of %d samples\n",
                  schedule.c_str(), mpi.size(), chunks, mpi.size() * chunks, micro_batches, batch / micro_batches);
      std::printf("model: %d layers of %d features, optimizer %s, learning rate %g, seed %llu\n", layers, hidden,
                  optimizer.c_str(), static_cast<double>(lr), static_cast<unsigned long long>(seed));
      std::printf("backend: %s, one process per GPU, NCCL across processes (bootstrapped by MPI)\n\n",
                  std::string(pipe->parts().backend.name()).c_str());
    }
    std::unique_ptr<pw::SequentialTrainer<pc::CudaBackend>> reference;
    if (root) reference = pc::make_sequential(pipe->parts().transport.gpu(), mode, spec, init, batch, micro_batches, opt);
    const int log_every = std::max(1, steps / 20);
    for (int step = 1; step <= steps; ++step) {
      const double loss = pipe->train_step(task.inputs, task.targets).loss;
      if (root) {
        const double ref = reference->train_step(task.inputs, task.targets);
        if (step == 1 || step == steps || step % log_every == 0)
          std::printf("step %5d  loss %.6f%s\n", step, loss, loss == ref ? "" : "  (reference differs)");
      }
    }
    const pw::HostModel got = pw::download_weights(*pipe, spec);  // complete on rank 0
    int status = 0;
    if (root) {
      const pw::HostModel want = reference->weights();
      const double diff = pw::max_abs_difference(got, want);
      status = diff <= tolerance ? 0 : 1;
      std::printf("\ncheck against sequential training on rank 0's GPU: max |pipelined - sequential| = %g%s "
                  "(tolerance %g): %s\n",
                  diff, got == want ? " (bit-for-bit equal)" : "", tolerance, status == 0 ? "ok" : "FAILED");
    }
    // Rank 0's verdict on every rank (polled like every collective after start-up).
    return static_cast<int>(pipe->control().broadcast(status, 0, steps));
  } catch (const pw::Error& e) {
    std::fflush(stdout);
    // One write per line, so that the ranks' lines do not interleave.
    std::fprintf(stderr, "train_mlp_mpi: rank %d: %s\n", mpi.rank(), e.what());
    return 1;
  }
}
