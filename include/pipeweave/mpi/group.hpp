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
#include <vector>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::mpi {

/// The open or last group of one rank; Op has `kind` (OpKind) and `peer`.
template <class Op>
class RankGroup {
 public:
  /// Opens a group of the lowered program's step `step`.
  void begin(int rank, int step) {
    if (open_) throw_error({.device = rank, .step = step}, "group_begin inside an open group");
    open_ = true;
    step_ = step;
    ops_.clear();
  }
  /// Adds an operation; its peer must be another of the `ranks` ranks.
  void add(int rank, int ranks, Op op) {
    const Where where{.device = rank, .step = step_};
    if (!open_) throw_error(where, op.kind == OpKind::kSend ? "send" : "recv", " outside a group");
    if (op.peer < 0 || op.peer >= ranks || op.peer == rank)
      throw_error(where, "peer ", op.peer, " is not another rank (ranks are 0..", ranks - 1, ")");
    ops_.push_back(std::move(op));
  }
  /// Closes the group; false when it has no operation (nothing to post).
  bool close(int rank) {
    if (!open_) throw_error({.device = rank, .step = step_}, "group_end without group_begin");
    open_ = false;
    return !ops_.empty();
  }
  /// Forgets the group (after a reset).
  void clear() {
    open_ = false;
    ops_.clear();
  }
  /// The group's operations.
  std::vector<Op>& ops() { return ops_; }
  /// The group's operations.
  const std::vector<Op>& ops() const { return ops_; }
  /// The step of the group (-1 before the first).
  int step() const { return step_; }

 private:
  std::vector<Op> ops_;
  int step_ = -1;
  bool open_ = false;
};

}  // namespace pipeweave::mpi
