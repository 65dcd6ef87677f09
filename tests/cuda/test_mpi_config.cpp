// The start-up checks of multi-process runs, on the CPU under mpirun (the program
// starts `mpirun -n 3` on itself): ranks with the same configuration start, ranks
// with different ones all refuse with the same message; polled MPI waits time out
// instead of hanging; every rank finds its index on the machine.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "mpi_launch.hpp"
#include "pipeweave/cuda/mpi_bootstrap.hpp"

using namespace std::chrono_literals;
namespace pc = pipeweave::cuda;

namespace {
int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
}  // namespace

TEST_CASE("ranks with the same configuration hash start", "[cuda]") {
  CHECK_NOTHROW(pc::check_same_config(MPI_COMM_WORLD, 0x1234, 20s));
}

TEST_CASE("ranks with different configurations all refuse to start, naming the ranks", "[cuda]") {
  const int r = rank_of();
  std::string what;
  try {
    pc::check_same_config(MPI_COMM_WORLD, r == 0 ? 7 : 7 + static_cast<unsigned>(r), 20s);
  } catch (const pipeweave::Error& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Contains("the ranks were started with different configurations") &&
                       Catch::Contains("rank 0 has 0x0000000000000007") &&
                       Catch::Contains("ranks 1 (0x0000000000000008), 2 (0x0000000000000009)") &&
                       Catch::Contains("start every rank with the same arguments"));
}

TEST_CASE("a polled MPI wait gives up after its timeout", "[cuda]") {
  int never = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&never, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &request);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(pc::mpi_wait(request, 200ms, [] {}));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  MPI_Cancel(&request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  int calls = 0;
  MPI_Irecv(&never, 1, MPI_INT, MPI_ANY_SOURCE, 998, MPI_COMM_WORLD, &request);
  CHECK_THROWS_WITH(pc::mpi_wait(request, 5s, [&] {
                      if (++calls == 3) throw pipeweave::Error("peer failed");
                    }),
                    "peer failed");
  MPI_Cancel(&request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
}

TEST_CASE("every rank on one machine finds its index there", "[cuda]") {
  CHECK(pc::local_rank(MPI_COMM_WORLD) == rank_of());
}

int main(int argc, char** argv) {
  if (const int status = pipeweave::test::relaunch_under_mpirun(argc, argv, 3); status >= 0) return status;
  pc::MpiSession mpi(argc, argv);
  Catch::Session session;
  if (mpi.rank() != 0) session.configData().outputFilename = "/dev/null";  // one report, from rank 0
  int failed = session.run(argc, argv);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0 ? 1 : 0;
}
