// Lets a test program that meson starts once run itself under mpirun: outside MPI
// it starts `mpirun -n RANKS` on its own executable and returns that run's exit
// status; under mpirun it returns -1 and the program goes on as one rank, which
// runs the Catch2 session with the others (run_on_every_rank). Also what the
// multi-process tests share: error_of(fn), the error text of one rank.
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "catch_session.hpp"
#include "pipeweave/schedule/error.hpp"

extern char** environ;

namespace pipeweave::test {

/// True when this process was started by mpirun (Open MPI or a PMI launcher).
inline bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

/// Outside mpirun: runs this program under `mpirun -n ranks` and returns its exit
/// status (77 when mpirun cannot be started); a run that takes longer than
/// `limit` is ended (mpirun passes the signal on to its ranks) and fails. Under
/// mpirun: returns -1.
inline int relaunch_under_mpirun(int argc, char** argv, int ranks,
                                 std::chrono::seconds limit = std::chrono::seconds(100)) {
  if (under_mpirun()) return -1;
  if (geteuid() == 0) {  // Open MPI refuses root unless told that it is meant
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  const std::string n = std::to_string(ranks);
  std::vector<std::string> words = {"mpirun", "--oversubscribe", "--bind-to", "none", "-n", n, argv[0]};
  for (int i = 1; i < argc; ++i) words.emplace_back(argv[i]);
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "mpirun", nullptr, nullptr, args.data(), environ) != 0) {
    std::puts("mpirun could not be started: skipped");
    return 77;
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done < 0) return 1;
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("the run under mpirun took longer than %lld s: ended\n", static_cast<long long>(limit.count()));
  kill(pid, SIGTERM);  // mpirun ends its ranks
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 1;
}

/// The text of the pipeweave::Error fn throws on this rank (empty: none).
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

/// This process's rank in MPI_COMM_WORLD.
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
/// Number of processes in MPI_COMM_WORLD.
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// Runs the Catch2 session on every rank (MPI initialised), rank 0 reporting;
/// exits 1 on every rank when a test failed on any.
inline int run_on_every_rank(int argc, char** argv) {
  // One report, from rank 0 (PIPEWEAVE_TEST_ALL_RANKS=1: every rank reports, for a failure on another rank).
  int failed = run_catch_session(argc, argv, world_rank() != 0 && !std::getenv("PIPEWEAVE_TEST_ALL_RANKS"));
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0 ? 1 : 0;
}

}  // namespace pipeweave::test
