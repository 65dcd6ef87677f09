#pragma once
/// \file
/// One rank's group of sends and receives as a transport of the multi-process
/// host builds it (Transport concept: group_begin(step), send and recv to other
/// ranks, group_end), whatever then moves the bytes: MPI point-to-point
/// (mpi/transport.hpp) or NCCL (cuda/mpi.hpp); and the calls of those
/// transports' endpoints that only add to it (RankCalls). Standard library only.
///
/// \code
/// pipeweave::mpi::RankGroup<pipeweave::RendezvousOp> g;
/// g.begin(/*rank=*/0, /*step=*/3);
/// g.add(0, /*ranks=*/2, {pipeweave::OpKind::kSend, /*peer=*/1, message, data, nullptr});
/// if (g.close(0)) { /* post g.ops() */ }
/// \endcode

#include <utility>

#include "pipeweave/runtime/backend.hpp"
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

/// The calls of a multi-process transport's endpoint that only place the rank
/// and add to its group: device(), devices(), send and recv, written once for
/// the endpoints of mpi/transport.hpp and cuda/mpi.hpp. `Endpoint` derives
/// from it and befriends it; its member `s_` points to its state, whose
/// `control` (a Control) places the rank in its replica and whose `group` is a
/// RankGroup of operations made as `{kind, peer, message, src, dst}`. The
/// memory that `data` points to is the endpoint's kind (host memory for MPI,
/// device memory for NCCL).
template <class Endpoint>
class RankCalls {
 public:
  /// The pipeline device this rank runs.
  int device() const { return state().control->device(); }
  /// Number of pipeline devices (the ranks of this rank's replica).
  int devices() const { return state().control->devices(); }
  /// Adds a send of `message.bytes` bytes at `data` to rank `peer`.
  void send(int peer, const Message& message, const void* data) {
    state().group.add(device(), devices(), {OpKind::kSend, peer, message, data, nullptr});
  }
  /// Adds a receive of `message` from rank `peer` into `data`.
  void recv(int peer, const Message& message, void* data) {
    state().group.add(device(), devices(), {OpKind::kRecv, peer, message, nullptr, data});
  }

 private:
  auto& state() const { return *static_cast<const Endpoint&>(*this).s_; }
};

}  // namespace pipeweave::mpi
