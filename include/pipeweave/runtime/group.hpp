#pragma once
/// \file
/// The group one device is building for a step (Transport concept: group_begin,
/// send and recv, group_end): its open or closed state, its step and its
/// operations, with the three errors of a call out of turn worded here once.
/// The rendezvous matcher of one process (runtime/matcher.hpp) and the rank
/// group of the multi-process host (mpi/group.hpp) both build their groups with
/// it; each checks its own peers. Standard library only.
///
/// \code
/// pipeweave::GroupBuilder<pipeweave::RendezvousOp> g;
/// g.begin(/*device=*/0, /*step=*/3);
/// g.add(0, op, [&](const pipeweave::Where& where) { /* throw_error(where, ...) for a bad peer */ });
/// if (g.close(0)) { /* post g.ops() */ }
/// \endcode

#include <utility>
#include <vector>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// The open or last group of one device; Op has `kind` (OpKind).
template <class Op>
class GroupBuilder {
 public:
  /// Opens device `device`'s group of the lowered program's step `step`.
  void begin(int device, int step) {
    if (open_) throw_error({.device = device, .step = step}, "group_begin inside an open group");
    open_ = true;
    step_ = step;
    ops_.clear();
  }
  /// Adds `op` to the open group once check_peer(where) has returned (it
  /// throws, with `where`, for a peer the caller does not accept).
  template <class CheckPeer>
  void add(int device, Op op, CheckPeer&& check_peer) {
    const Where where{.device = device, .step = step_};
    if (!open_) throw_error(where, op.kind == OpKind::kSend ? "send" : "recv", " outside a group");
    check_peer(where);
    ops_.push_back(std::move(op));
  }
  /// Closes the group; false when it has no operation (nothing to post).
  bool close(int device) {
    if (!open_) throw_error({.device = device, .step = step_}, "group_end without group_begin");
    open_ = false;
    return !ops_.empty();
  }
  /// Forgets the group (after a reset); the step stays.
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

}  // namespace pipeweave
