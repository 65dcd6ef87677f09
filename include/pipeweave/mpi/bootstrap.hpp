#pragma once
/// \file
/// MPI for the multi-process host, without CUDA: the process's MPI session, the
/// status check of MPI calls, polled waits on MPI requests (with a timeout, so no
/// rank hangs), and the rank's index on its machine (which picks its GPU). Needs
/// an MPI implementation (Open MPI: `libopenmpi-dev`); launch with `mpirun -n P`.
///
/// \code
/// int main(int argc, char** argv) {
///   pipeweave::mpi::MpiSession mpi(argc, argv);
///   return pipeweave::mpi::local_rank(MPI_COMM_WORLD) >= 0 ? 0 : 1;
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

#include <atomic>
#include <chrono>
#include <string>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::mpi {

/// Throws pipeweave::Error naming `what` and MPI's text unless `code` is MPI_SUCCESS.
inline void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw_error({}, "MPI error: ", what, " returned ", std::string(text, static_cast<std::size_t>(length)));
}

namespace detail {

/// Set once this process knows that a rank of its run was lost (its process
/// ended without a word: mpi/control.hpp's roll call, or another rank's notice).
inline std::atomic<bool>& rank_lost() {
  static std::atomic<bool> lost{false};
  return lost;
}

}  // namespace detail

/// MPI for this process: initialises it (each thread may call it, one at a time:
/// MPI_THREAD_SERIALIZED) unless that was done already, and finalizes it at the end
/// when it did, unless a rank of the run was lost: MPI_Finalize waits for every
/// process of the run, so the process then ends without it (under `mpirun
/// --enable-recovery`, the only launcher that lets the other ranks live on).
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
  /// Finalizes MPI if this session initialised it and no rank was lost.
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized && !detail::rank_lost().load()) MPI_Finalize();
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
  return poll_until(
      [&] {
        int done = 0;
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
      },
      timeout, [&](std::chrono::steady_clock::duration) { check(); });
}

/// This process's index among the ranks of `comm` on the same machine.
/// Collective over `comm`.
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

}  // namespace pipeweave::mpi
