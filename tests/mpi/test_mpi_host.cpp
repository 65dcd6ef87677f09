// The multi-process host's start-up and failure protocol (mpi/control.hpp), on
// the CPU under mpirun (the program starts `mpirun -n 3` on itself): the ranks
// start together or refuse together (different settings, the first that differs
// named; a rank that cannot start, e.g. without its GPU; two ranks on one GPU); the GPU of a rank follows
// its index on the machine; every collective after start-up is polled, so a rank that fails after
// an agreement stops the others in their next collective instead of hanging them,
// and reset() brings every rank back to a working state.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "../common/mpi_launch.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/runtime/options.hpp"

using namespace std::chrono_literals;
namespace pm = pipeweave::mpi;
using pipeweave::test::error_of;
using pipeweave::test::world_rank;

TEST_CASE("ranks with the same settings start", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  CHECK_NOTHROW(pm::agree_to_start(control, pipeweave::RunConfig{}.add("model", "a").add("seed", 3), ""));
}

TEST_CASE("ranks with different settings all refuse to start, naming the first that differs and the ranks", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  const int r = world_rank();
  // Ranks 1 and 2 differ from rank 0 in the seed, rank 2 in the learning rate too.
  pipeweave::RunConfig config;
  config.add("model", "mlp").add("seed", r == 0 ? 7 : 8).add("learning rate", r == 2 ? 0.5f : 0.25f);
  CHECK(error_of([&] { pm::agree_to_start(control, config, ""); }) ==
        "start-up: the ranks were started with different settings; the first that differs is the seed: rank 0 has 7, "
        "rank 1 has 8, rank 2 has 8; start every rank with the same arguments");
  // A rank with another setting in that place, or fewer settings, is named with it.
  pipeweave::RunConfig other;
  other.add("model", "mlp");
  if (r == 1) other.add("arithmetic", "bf16");
  if (r == 0) other.add("seed", 7);
  CHECK(error_of([&] { pm::agree_to_start(control, other, ""); }) ==
        "start-up: the ranks were started with different settings; the first that differs is the seed: rank 0 has 7, "
        "rank 1 has arithmetic bf16, rank 2 has no such setting; start every rank with the same arguments");
}

TEST_CASE("a rank without its GPU makes every rank refuse to start, and none is left in a collective", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  // Rank 2 sees no GPU (its launcher gave it none).
  std::string problem;
  int gpu = -1;
  try {
    gpu = pipeweave::rank_gpu(-1, control.rank(), control.local_rank(), world_rank() < 2 ? 2 : 0);
  } catch (const pipeweave::Error& e) {
    problem = e.what();
  }
  CHECK(gpu == (world_rank() < 2 ? world_rank() : -1));
  const std::string what = error_of([&] { pm::agree_to_start(control, pipeweave::RunConfig{}.add("batch", 42), problem); });
  CHECK(what ==
        "start-up: rank 2 cannot start: rank 2 sees no GPU (on its machine, or in CUDA_VISIBLE_DEVICES); each rank "
        "needs one");
  // Every rank left the start-up at the same point: the next collective matches on all.
  CHECK(control.agree(true, 0));
  // A GPU asked for explicitly is taken as it is.
  CHECK(pipeweave::rank_gpu(1, control.rank(), control.local_rank(), 2) == 1);
}

TEST_CASE("two ranks on one GPU make every rank refuse to start, named by the GPU's identity", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  const pipeweave::RunConfig config = pipeweave::RunConfig{}.add("batch", 42);
  // Three ranks on a machine with two GPUs that every rank sees: rank 2 lands on GPU 0 with rank 0. The identity is
  // what the transport gives (NCCL: the GPU's UUID); here a stand-in per GPU.
  const int gpu = pipeweave::rank_gpu(-1, control.rank(), control.local_rank(), 2);
  const auto owned = [](int g) { return pm::ExclusiveResource{"GPU GPU-" + std::to_string(g), "give each rank its own"}; };
  CHECK(error_of([&] { pm::agree_to_start(control, config, "", owned(gpu)); }) ==
        "start-up: ranks 0 and 2 are both on GPU GPU-0, which a rank needs for itself: give each rank its own");
  CHECK(control.agree(true, 0));
  // A launcher that gives each rank a GPU of its own (CUDA_VISIBLE_DEVICES per rank): each sees one GPU, numbered 0,
  // and the identities differ: the ranks start. Ranks that need nothing for themselves (the CPU) start too.
  CHECK(pipeweave::rank_gpu(-1, control.rank(), control.local_rank(), 1) == 0);
  CHECK_NOTHROW(pm::agree_to_start(control, config, "", owned(10 + world_rank())));
  CHECK_NOTHROW(pm::agree_to_start(control, config, ""));
  CHECK(control.agree(true, 0));
}

TEST_CASE("a problem every rank has is named once", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  CHECK(error_of([&] { pm::agree_to_start(control, {}, "the program is not valid: B0.1 is missing"); }) ==
        "start-up: every rank cannot start: the program is not valid: B0.1 is missing");
}

TEST_CASE("a polled MPI wait gives up after its timeout", "[mpi]") {
  int never = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&never, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &request);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(pm::mpi_wait(request, 200ms, [] {}));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  MPI_Cancel(&request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  int calls = 0;
  MPI_Irecv(&never, 1, MPI_INT, MPI_ANY_SOURCE, 998, MPI_COMM_WORLD, &request);
  CHECK_THROWS_WITH(pm::mpi_wait(request, 5s, [&] {
                      if (++calls == 3) throw pipeweave::Error("peer failed");
                    }),
                    "peer failed");
  MPI_Cancel(&request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
}

TEST_CASE("every rank on one machine finds its index there", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  CHECK(control.local_rank() == world_rank());
  CHECK(control.size() == 3);
}

TEST_CASE("a rank that fails after the agreement stops the others in the loss's broadcast; reset brings all back",
          "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 20s);
  const int r = world_rank();
  CHECK(control.agree(true, 5));
  // Rank 2 holds the loss but fails in its optimizer step, after agreeing: it never broadcasts.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = error_of([&] {
    if (r == 2) {
      control.abort("rank 2, step 5: the optimizer step failed");
      return;
    }
    control.broadcast(0.5, 2, 5);
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // the notice, not the 20 s timeout
  if (r != 2)
    CHECK(what == "rank " + std::to_string(r) +
                      " (step 5): stopped while waiting for a broadcast from rank 2 because another rank failed: rank "
                      "2 failed: rank 2, step 5: the optimizer step failed");
  // Ranks 0 and 1 abandoned a collective that rank 2 never started: every rank resets,
  // and the run goes on, its collectives matching again.
  CHECK(error_of([&] { control.reset(); }).empty());
  CHECK(control.agree(r != 1, 6) == false);
  CHECK(control.agree(true, 7));
  CHECK(control.broadcast(r == 2 ? 0.25 : -1.0, 2, 7) == 0.25);
  CHECK_FALSE(control.failed());
}

TEST_CASE("a rank that never reaches an agreement makes the others time out, naming it", "[mpi]") {
  pm::Control control(MPI_COMM_WORLD, 300ms);
  const int r = world_rank();
  const std::string what = error_of([&] {
    if (r != 1) control.agree(true, 3);
  });
  if (r != 1)
    CHECK(what == "rank " + std::to_string(r) +
                      " (step 3): timed out after 300 ms waiting for every rank to reach the agreement of all ranks");
  CHECK(error_of([&] { control.reset(); }).empty());
  // A failure notice of an earlier generation is dropped by the next reset: it stops nobody.
  if (r == 0) control.abort("an old failure");
  CHECK(error_of([&] { control.reset(); }).empty());
  CHECK(control.agree(true, 4));
}

int main(int argc, char** argv) {
  if (const int status = pipeweave::test::relaunch_under_mpirun(argc, argv, 3); status >= 0) return status;
  pm::MpiSession mpi(argc, argv);
  return pipeweave::test::run_on_every_rank(argc, argv);
}
