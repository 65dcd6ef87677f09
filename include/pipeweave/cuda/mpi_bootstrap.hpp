#pragma once
/// \file
/// The MPI side of a multi-process run, without CUDA: the process's MPI session,
/// polled waits on MPI requests (with a timeout, so no rank hangs), the rank's
/// index on its machine (which picks its GPU), and the start-up check that every
/// rank runs the same configuration (config_hash.hpp). Needs an MPI
/// implementation (Open MPI: `libopenmpi-dev`); launch with `mpirun -n P`.
///
/// \code
/// int main(int argc, char** argv) {
///   pipeweave::cuda::MpiSession mpi(argc, argv);
///   pipeweave::cuda::check_same_config(MPI_COMM_WORLD, /*hash=*/42, std::chrono::seconds(30));
/// }
/// \endcode

// Only MPI's C interface is used: keep Open MPI's (and MPICH's) C++ bindings out.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "pipeweave/cuda/config_hash.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cuda {

/// Throws pipeweave::Error naming `what` and MPI's text unless `code` is MPI_SUCCESS.
inline void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("MPI error: ") + what + " returned " + std::string(text, static_cast<std::size_t>(length)));
}

/// MPI for this process: initialises it (each thread may call it, one at a time:
/// MPI_THREAD_SERIALIZED) unless that was done already, and finalizes it at the end
/// when it did.
class MpiSession {
 public:
  /// Initialises MPI with the program's arguments.
  MpiSession(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owner_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  /// Finalizes MPI if this session initialised it.
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }
  /// This process's rank in MPI_COMM_WORLD.
  int rank() const { return rank_; }
  /// Number of processes in MPI_COMM_WORLD.
  int size() const { return size_; }

 private:
  bool owner_ = false;
  int rank_ = 0;
  int size_ = 1;
};

/// Polls `request` until it completes, calling check() between polls (it may
/// throw). Returns false when `timeout` runs out first (the request stays pending).
template <class Check>
bool mpi_wait(MPI_Request& request, std::chrono::milliseconds timeout, Check&& check) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    check();
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 200));
  }
}

/// This process's index among the ranks of `comm` on the same machine.
inline int local_rank(MPI_Comm comm) {
  MPI_Comm local = MPI_COMM_NULL;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  int local_index = 0;
  MPI_Comm_rank(local, &local_index);
  MPI_Comm_free(&local);
  return local_index;
}

/// Collective over `comm`: every rank passes the hash of its configuration (see
/// run_hash). Returns when all are equal; otherwise throws pipeweave::Error on
/// every rank, naming each rank whose hash differs from rank 0's, so that a run
/// started with different arguments on different ranks refuses to start.
inline void check_same_config(MPI_Comm comm, std::uint64_t hash, std::chrono::milliseconds timeout) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<unsigned long long> all(static_cast<std::size_t>(size), 0);
  unsigned long long mine = hash;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm, &request),
            "MPI_Iallgather");
  if (!mpi_wait(request, timeout, [] {}))
    throw Error("start-up: timed out after " + std::to_string(timeout.count()) +
                " ms waiting for every rank to report its configuration");
  std::string differ;
  int count = 0;
  for (int r = 1; r < size; ++r) {
    if (all[static_cast<std::size_t>(r)] == all[0]) continue;
    if (count++ < 8) differ += (differ.empty() ? "" : ", ") + std::to_string(r) + " (" + hash_text(all[static_cast<std::size_t>(r)]) + ")";
  }
  if (count == 0) return;
  throw Error("start-up: the ranks were started with different configurations (schedule, model, batch, optimizer or "
              "math): rank 0 has " + hash_text(all[0]) + ", rank" + (count > 1 ? "s " : " ") + differ +
              (count > 8 ? " and more" : "") + "; start every rank with the same arguments");
}

}  // namespace pipeweave::cuda
