// A multi-process run that loses a rank: `mpirun -n P*D fault_rank --kill-rank R
// --kill-step K --timeout-ms T --token X [--replicas D]` trains the CPU MLP
// through 1F1B (D data-parallel replicas of it, the ranks dp-adjacent), and at
// step K rank R ends its own process with SIGKILL in the middle of the step (in
// the forward of micro-batch 1). Each rank prints, on stderr, one line per event
// with the time on the machine's monotonic clock, for kill_check.py:
//   fault_rank: rank R: killed at NS
//   fault_rank: rank r: error: MESSAGE
//   fault_rank: rank r: exit S at NS          (after MPI_Finalize; S is the exit status)
// --token is only a mark to find the processes by.
#include "fault_pipeline.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"

namespace pw = pipeweave;

namespace {

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int kill_rank = 1, kill_step = 2, timeout_ms = 1000, steps = 4, replicas = 1, rank = -1, status = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--kill-rank") kill_rank = value;
    if (flag == "--kill-step") kill_step = value;
    if (flag == "--timeout-ms") timeout_ms = value;
    if (flag == "--steps") steps = value;
    if (flag == "--replicas") replicas = value;
  }
  {
    pw::mpi::MpiSession mpi(argc, argv);
    rank = mpi.rank();
    try {
      const int P = mpi.size() / replicas;
      const pw::test::FaultModel m{pw::MlpSpec::uniform(P, 16, 32, 8, 3), {pw::OptimizerKind::kSgd, 0.05f, 0.9f},
                                   32 * replicas};
      pw::Program program = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P, 1, 4);
      if (replicas > 1) program = pw::with_grad_reduce(program);
      const pw::RegressionTask task = pw::make_regression_task(m.spec, m.rows, 5);
      const pw::RankGrid grid{P, replicas, pw::RankLayout::kDpAdjacent};
      auto fault = std::make_shared<pw::test::Fault>();
      fault->device = grid.device(kill_rank);
      fault->replica = grid.replica(kill_rank);
      fault->action = pw::fwd(0, 1);
      fault->act = [&] {
        std::fprintf(stderr, "fault_rank: rank %d: killed at %lld\n", rank, now_ns());
        std::fflush(stderr);
        std::raise(SIGKILL);
      };
      auto pipe = pw::test::make_fault_pipeline(program, m, fault, std::chrono::milliseconds(timeout_ms), replicas);
      for (int step = 1; step <= steps; ++step) {
        fault->armed = step == kill_step;
        pipe->train_step(task.inputs, task.targets);
      }
    } catch (const pw::Error& e) {
      std::fprintf(stderr, "fault_rank: rank %d: error: %s\n", rank, e.what());
      status = 1;
    }
  }
  std::fprintf(stderr, "fault_rank: rank %d: exit %d at %lld\n", rank, status, now_ns());
  return status;
}
