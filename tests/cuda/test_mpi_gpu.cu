// NCCL across processes, one rank per GPU (the program starts `mpirun -n R` on
// itself, R = the GPUs visible, at most 4; one GPU gives a one-rank pipeline that
// still runs the MPI bootstrap, the NCCL communicator and the agreement): pipelines
// equal sequential training on the GPU, every rank reports the same loss, the
// trace gathers on rank 0, and ranks with different configurations refuse to start.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "mpi_launch.hpp"
#include "pipeweave/cuda/mpi.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pc = pipeweave::cuda;
namespace pw = pipeweave;

namespace {
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
}  // namespace

TEST_CASE("mpi: pipelines across processes equal sequential training on the GPU", "[cuda]") {
  const int P = world_size(), rank = world_rank();
  const pw::MlpSpec spec = pw::MlpSpec::uniform(4 * P, 48, 64, 40, 5);
  const pw::RegressionTask task = pw::make_regression_task(spec, 64, 9);
  const pw::HostModel init = pw::init_mlp(spec);
  const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.003f};
  for (const auto& [kind, V] : {std::tuple{pw::ScheduleKind::kOneFOneB, 1}, std::tuple{pw::ScheduleKind::kInterleaved1F1B, 2}}) {
    const int M = 2 * P;
    const pw::Program program = pw::make_schedule(kind, P, V, M);
    pc::MpiMlpPipeline pipe(MPI_COMM_WORLD, program, spec, init, {64, opt}, {.link = {std::chrono::seconds(30)}});
    CHECK(pipe.rank() == rank);
    std::unique_ptr<pw::SequentialTrainer<pc::CudaBackend>> reference;
    if (rank == 0) reference = pc::make_sequential(pipe.gpu(), pc::MathMode::kFp32, spec, init, 64, M, opt);
    for (int step = 0; step < 3; ++step) {
      const double loss = pipe.train_step(task.inputs, task.targets).loss;
      double lowest = loss, highest = loss;
      MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      CHECK(lowest == highest);  // every rank reports the same loss
      if (rank == 0) {
        const double want = reference->train_step(task.inputs, task.targets);
        CHECK(std::fabs(loss - want) <= 1e-6 * std::fabs(want));
      }
    }
    const pw::HostModel got = pipe.gather_weights(spec);
    const pw::Trace trace = pipe.gather_trace();
    if (rank == 0) {
      CHECK(pw::max_abs_difference(got, reference->weights()) <= 1e-6);
      for (int d = 0; d < P; ++d) CHECK(static_cast<int>(trace.compute[static_cast<std::size_t>(d)].size()) == 2 * V * M);
    }
  }
}

TEST_CASE("mpi: ranks started with different configurations refuse to start", "[cuda]") {
  const int P = world_size(), rank = world_rank();
  const pw::MlpSpec spec = pw::MlpSpec::uniform(2 * P, 16, 16, 16);
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P, 1, 2 * P);
  // The last rank asks for another batch size.
  const int rows = rank == P - 1 && P > 1 ? 64 : 32;
  std::string what;
  try {
    pc::MpiMlpPipeline pipe(MPI_COMM_WORLD, program, spec, pw::init_mlp(spec), {rows}, {});
  } catch (const pw::Error& e) {
    what = e.what();
  }
  if (P > 1)
    CHECK_THAT(what, Catch::Contains("different configurations"));
  else
    CHECK(what.empty());
  // A program for another number of ranks is refused too.
  const pw::Program wrong = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P + 1, 1, 2 * (P + 1));
  CHECK_THROWS_WITH(pc::MpiMlpPipeline(MPI_COMM_WORLD, wrong, pw::MlpSpec::uniform(2 * (P + 1), 16, 16, 16),
                                       pw::init_mlp(pw::MlpSpec::uniform(2 * (P + 1), 16, 16, 16)), {32}, {}),
                    Catch::Contains("ranks were started"));
}

int main(int argc, char** argv) {
  if (!pipeweave::test::under_mpirun()) {
    const int gpus = pc::gpu_count();
    if (gpus == 0) {
      std::puts("no GPU visible: the multi-process GPU tests are skipped");
      return 77;
    }
    return pipeweave::test::relaunch_under_mpirun(argc, argv, std::min(gpus, 4));
  }
  pc::MpiSession mpi(argc, argv);
  Catch::Session session;
  if (mpi.rank() != 0) session.configData().outputFilename = "/dev/null";  // one report, from rank 0
  int failed = session.run(argc, argv);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0 ? 1 : 0;
}
