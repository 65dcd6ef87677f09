#pragma once
/// \file
/// One rank's group of sends and receives as a transport of the multi-process
/// host builds it (Transport concept: group_begin(step), send and recv to other
/// ranks, group_end), whatever then moves the bytes: MPI point-to-point
/// (mpi/transport.hpp) or NCCL (cuda/mpi.hpp). Standard library only.
///
/// \code
/// pipeweave::mpi::RankGroup<pipeweave::RendezvousOp> g;
/// g.begin(/*rank=*/0, /*step=*/3);
/// g.add(0, /*ranks=*/2, {pipeweave::OpKind::kSend, /*peer=*/1, message, data, nullptr});
/// if (g.close(0)) { /* post g.ops() */ }
/// \endcode

#include <utility>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/group.hpp"

namespace pipeweave::mpi {

/// The open or last group of one rank; Op has `kind` (OpKind) and `peer`. The
/// group's state and its errors are GroupBuilder's (runtime/group.hpp, shared
/// with the rendezvous matcher); a rank group adds the check of its peers.
template <class Op>
class RankGroup : public GroupBuilder<Op> {
 public:
  /// Adds an operation; its peer must be another of the `ranks` ranks.
  void add(int rank, int ranks, Op op) {
    const int peer = op.peer;
    GroupBuilder<Op>::add(rank, std::move(op), [&](const Where& where) {
      if (peer < 0 || peer >= ranks || peer == rank)
        throw_error(where, "peer ", peer, " is not another rank (ranks are 0..", ranks - 1, ")");
    });
  }
};

}  // namespace pipeweave::mpi
