// NCCL across processes, one rank per GPU (the program starts `mpirun -n R` on
// itself, R = the GPUs visible, at most 4; one GPU gives a one-rank pipeline that
// still runs the MPI bootstrap, the NCCL communicator and the agreements): the
// multi-process host with the built-in MLP and with the tests' own chunk and loss
// (runtime/custom_model.hpp) equals sequential training on the GPU, every rank
// reports the same loss, the trace gathers on rank 0, and ranks with different
// configurations refuse to start.
#include "pipeweave/cuda/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "../common/mpi_launch.hpp"
#include "../runtime/custom_model.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pc = pipeweave::cuda;
namespace pw = pipeweave;
using pipeweave::test::world_rank;
using pipeweave::test::world_size;

TEST_CASE("mpi: pipelines across processes equal sequential training on the GPU", "[cuda]") {
  const int P = world_size(), rank = world_rank();
  const pw::MlpSpec spec = pw::MlpSpec::uniform(4 * P, 48, 64, 40, 5);
  const pw::RegressionTask task = pw::make_regression_task(spec, 64, 9);
  const pw::HostModel init = pw::init_mlp(spec);
  const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.003f};
  for (const auto& [kind, V] : {std::tuple{pw::ScheduleKind::kOneFOneB, 1}, std::tuple{pw::ScheduleKind::kInterleaved1F1B, 2}}) {
    const int M = 2 * P;
    const pw::Program program = pw::make_schedule(kind, P, V, M);
    auto pipe = pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, init, {64, opt, std::chrono::seconds(30)},
                                      pc::CudaOptions{});
    CHECK(pipe->rank() == rank);
    std::unique_ptr<pw::SequentialTrainer<pc::CudaBackend>> reference;
    if (rank == 0)
      reference = pc::make_sequential(pipe->parts().transport.gpu(), pc::MathMode::kFp32, spec, init, 64, M, opt);
    for (int step = 0; step < 3; ++step) {
      const double loss = pipe->train_step(task.inputs, task.targets).loss;
      double lowest = loss, highest = loss;
      MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      CHECK(lowest == highest);  // every rank reports the same loss
      if (rank == 0) {
        const double want = reference->train_step(task.inputs, task.targets);
        CHECK(std::fabs(loss - want) <= 1e-6 * std::fabs(want));
      }
    }
    const pw::HostModel got = pw::download_weights(*pipe, spec);
    const pw::Trace trace = pipe->gather_trace();
    if (rank == 0) {
      CHECK(pw::max_abs_difference(got, reference->weights()) <= 1e-6);
      for (int d = 0; d < P; ++d) CHECK(static_cast<int>(trace.compute[static_cast<std::size_t>(d)].size()) == 2 * V * M);
    }
  }
}

TEST_CASE("mpi: a chunk and a loss of one's own run on the multi-process host", "[cuda]") {
  using Chunk = pw::test::TanhChunk<pc::CudaBackend>;
  using Host = pw::mpi::MpiPipeline<pc::CudaBackend, pc::MpiEndpoint, Chunk, pw::test::HuberLoss<pc::CudaBackend>, pw::Sgd>;
  const int P = world_size(), rank = world_rank();
  constexpr std::size_t features = 24;
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, P, 2, 2 * P);
  const int rows = 4 * P;
  auto make_device = [&](const std::shared_ptr<pw::mpi::Control>& control) {
    return pc::make_mpi_device<Chunk>(control, {}, [&](pc::CudaBackend& b) {
      std::vector<Chunk> chunks;
      for (int c = 0; c < 2; ++c) chunks.emplace_back(b, features, program.shape.stage_of(control->rank(), c), 3);
      return chunks;
    });
  };
  Host pipe(MPI_COMM_WORLD, program, make_device, {rows, pw::Sgd{0.05f, 0.9f}},
            pw::RunConfig{}.add("model", "tanh, 24 features, seed 3"));
  pw::Rng rng(4);
  std::vector<float> inputs(static_cast<std::size_t>(rows) * features), targets(inputs.size());
  for (float& v : inputs) v = rng.uniform(-1.0f, 1.0f);
  for (float& v : targets) v = rng.uniform(-2.0f, 2.0f);
  auto stages = [&](pc::CudaBackend& b) {
    std::vector<Chunk> chunks;
    for (int s = 0; s < program.shape.stages(); ++s) chunks.emplace_back(b, features, s, 3);
    return chunks;
  };
  std::unique_ptr<pw::SequentialTrainer<pc::CudaBackend, Chunk, pw::test::HuberLoss<pc::CudaBackend>, pw::Sgd>> reference;
  if (rank == 0)
    reference = std::make_unique<pw::SequentialTrainer<pc::CudaBackend, Chunk, pw::test::HuberLoss<pc::CudaBackend>, pw::Sgd>>(
        pc::CudaBackend(pipe.parts().transport.gpu()), stages, rows, program.shape.micro_batches, pw::Sgd{0.05f, 0.9f});
  for (int step = 0; step < 3; ++step) {
    const double loss = pipe.train_step(inputs, targets).loss;
    if (rank == 0) CHECK(loss == reference->train_step(inputs, targets));
  }
  const std::vector<std::vector<float>> got = pipe.stage_parameters();
  if (rank == 0) CHECK(got == reference->stage_parameters());  // the same kernels in the same order: bit for bit
}

TEST_CASE("mpi: ranks started with different settings refuse to start", "[cuda]") {
  const int P = world_size(), rank = world_rank();
  const pw::MlpSpec spec = pw::MlpSpec::uniform(2 * P, 16, 16, 16);
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P, 1, 2 * P);
  // The last rank asks for another batch size.
  const int rows = rank == P - 1 && P > 1 ? 64 : 32;
  std::string what;
  try {
    pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, pw::init_mlp(spec), {rows}, pc::CudaOptions{});
  } catch (const pw::Error& e) {
    what = e.what();
  }
  if (P > 1)
    CHECK_THAT(what, Catch::Contains("different settings; the first that differs is the batch"));
  else
    CHECK(what.empty());
  // A program for another number of ranks is refused too, on every rank.
  const pw::Program wrong = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P + 1, 1, 2 * (P + 1));
  const pw::MlpSpec wider = pw::MlpSpec::uniform(2 * (P + 1), 16, 16, 16);
  CHECK_THROWS_WITH(pw::make_mlp_pipeline(MPI_COMM_WORLD, wrong, wider, pw::init_mlp(wider), {32}, pc::CudaOptions{}),
                    Catch::Contains("ranks were started"));
}

int main(int argc, char** argv) {
  if (!pipeweave::test::under_mpirun()) {
    const int gpus = pc::gpu_count();
    if (gpus == 0) {
      std::puts("no GPU visible: the multi-process GPU tests are skipped");
      return 77;
    }
    return pipeweave::test::relaunch_under_mpirun(argc, argv, std::min(gpus, 4), std::chrono::seconds(500));
  }
  pw::mpi::MpiSession mpi(argc, argv);
  return pipeweave::test::run_on_every_rank(argc, argv);
}
