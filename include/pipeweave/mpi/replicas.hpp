#pragma once
/// \file
/// The data-parallel replicas across processes: the gradient reduction of the
/// D ranks that hold one pipeline device (the multi-process host's
/// ReplicaCollective, runtime/replicas.hpp), by MPI point-to-point on a
/// communicator of its own.
///
/// The sum is the one of ReplicaGroup, in a fixed order rather than MPI's: when a
/// rank reaches R<c> it copies chunk c's gradient tensors, sends the copy to the
/// D - 1 other replicas of its device and posts the receives of theirs; the device
/// goes on with its next action while the messages move (MPI moves them during
/// the rank's later calls: its pipeline transfers and their polls). complete(),
/// before the optimizer, waits for them and adds g_0 + g_1 + ... + g_{D-1}
/// element by element from the left, so every replica gets the same floats as
/// the threads of one process and sequential training do, bit for bit. Each rank
/// sends (D - 1) x its gradients a step, as an all-gather does.
///
/// Every wait polls the control plane (mpi/control.hpp): a failure of any rank
/// of the run, or the timeout, stops it with an error that names the device, the
/// replica and the replicas waited for. reset() (collective, after a failed step)
/// gives the reductions a new communicator on every rank.
///
/// \code
/// // with the rank's Control, its grid set (D replicas):
/// // pipeweave::mpi::ReplicaReduction reduction(control);
/// // reduction.connect();                                   // collective
/// // reduction.all_reduce(control->replica(), 0, tensors);  // starts chunk 0's sum
/// // reduction.complete(control->replica());                // tensors hold it
/// \endcode

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/mpi/control.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::mpi {

/// One rank's part of the gradient reductions among the replicas of its device
/// (see the file comment). Not thread-safe: the rank's thread uses it.
class ReplicaReduction final : public ReplicaCollective {
 public:
  /// The reductions of this rank (its Control's grid set); talks to nobody yet.
  explicit ReplicaReduction(std::shared_ptr<Control> control) : control_(std::move(control)) {}
  ReplicaReduction(const ReplicaReduction&) = delete;
  ReplicaReduction& operator=(const ReplicaReduction&) = delete;
  /// Frees the communicator, unless a failure left messages on it.
  ~ReplicaReduction() override { release(); }

  /// Collective over the control's ranks, after the start-up agreement: the
  /// reductions' communicator.
  void connect() {
    if (comm_ == MPI_COMM_NULL) comm_ = control_->new_communicator();
  }

  int replicas() const override { return control_->grid().replicas; }
  bool deferred() const override { return true; }

  /// Starts the sum of chunk `chunk`'s tensors over the replicas (see the file
  /// comment): sends a copy of them (the reduction's own, so that nothing MPI may
  /// still read belongs to the caller); they must not change until complete().
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    check_replica(replica);
    if (comm_ == MPI_COMM_NULL) throw_error(where(), "the replicas' reduction is not connected (call connect)");
    const int D = replicas(), me = control_->replica();
    std::size_t total = 0;
    for (const std::span<float>& t : tensors) {
      if (t.size() > static_cast<std::size_t>(INT_MAX))
        throw_error(where(), "a gradient tensor of chunk ", chunk, " has ", t.size(),
                    " values, more than one MPI message may carry");
      total += t.size();
    }
    Box& box = this->box(chunk);
    for (std::vector<float>& v : box.of) v.resize(total);
    std::vector<float>& mine = box.of[static_cast<std::size_t>(me)];
    std::size_t at = 0;
    for (const std::span<float>& t : tensors) {
      std::copy(t.begin(), t.end(), mine.begin() + static_cast<std::ptrdiff_t>(at));
      at += t.size();
    }
    started_.push_back({chunk, std::vector<std::span<float>>(tensors.begin(), tensors.end())});
    for (int q = 0; q < D; ++q) {
      if (q == me) continue;
      const int peer = control_->grid().rank(q, control_->device());
      std::vector<float>& from = box.of[static_cast<std::size_t>(q)];
      at = 0;
      for (const std::span<float>& t : tensors) {
        const int n = static_cast<int>(t.size());
        Op& send = ops_.emplace_back(Op{MPI_REQUEST_NULL, chunk, q, false, n});
        check_mpi(MPI_Isend(mine.data() + at, n, MPI_FLOAT, peer, tag(chunk), comm_, &send.request), "MPI_Isend");
        Op& receive = ops_.emplace_back(Op{MPI_REQUEST_NULL, chunk, q, true, n});
        check_mpi(MPI_Irecv(from.data() + at, n, MPI_FLOAT, peer, tag(chunk), comm_, &receive.request), "MPI_Irecv");
        at += t.size();
      }
    }
  }

  /// Waits for every sum started (polled, within one timeout; see the file
  /// comment) and writes each into its tensors, in the order started.
  void complete(int replica) override {
    check_replica(replica);
    std::string problem;  // an MPI error or a message of the wrong size
    const auto done = [&] {
      bool all = true;
      for (Op& op : ops_) {
        if (op.request == MPI_REQUEST_NULL) continue;
        int flag = 0, count = 0;
        MPI_Status status;
        const int code = MPI_Test(&op.request, &flag, &status);
        if (code != MPI_SUCCESS) {
          problem = mpi_error_text(code, "MPI_Test");
          return true;
        }
        if (!flag) {
          all = false;
          continue;
        }
        if (op.receive && (MPI_Get_count(&status, MPI_FLOAT, &count) != MPI_SUCCESS || count != op.floats)) {
          problem = error_text({}, "replica ", op.replica, " sent ", count, " values of a gradient tensor of chunk ",
                               op.chunk, ", where this one has ", op.floats);
          return true;
        }
      }
      return all;
    };
    const bool finished = poll_until(done, control_->timeout(), [&](std::chrono::steady_clock::duration) {
      if (control_->failed()) fail("stopped while waiting for " + pending() + ": " + control_->reason());
    });
    if (!problem.empty()) fail(problem);
    if (!finished)
      fail(control_->explain_timeout(
          error_text({}, "timed out after ", control_->timeout().count(), " ms waiting for ", pending())));
    ops_.clear();
    const int D = replicas();
    for (Started& r : started_) {
      const Box& box = this->box(r.chunk);
      std::size_t at = 0;
      for (const std::span<float>& t : r.tensors) {
        for (std::size_t i = 0; i < t.size(); ++i) {
          float sum = box.of[0][at + i];
          for (int q = 1; q < D; ++q) sum += box.of[static_cast<std::size_t>(q)][at + i];
          t[i] = sum;
        }
        at += t.size();
      }
    }
    started_.clear();
  }

  /// `ok`: the transport's agreement, which the session makes first, spans every
  /// rank of the run, the replicas included.
  bool agree(int replica, bool ok) override {
    check_replica(replica);
    return ok;
  }

  /// Stops the receives of the sums under way; the waits stop on the control
  /// plane's notice, which the host's abort of the transport sends. From the
  /// rank's thread (the collective is deferred: only that thread uses it).
  void abort(std::string_view /*reason*/) noexcept override { cancel_receives(); }

  /// Collective over the control's ranks, after a failed step (Control::reset
  /// first): the reductions get a new communicator on every rank.
  void reset() override {
    cancel_receives();
    release();
    comm_ = control_->new_communicator();
  }

 private:
  struct Started {
    int chunk = 0;
    std::vector<std::span<float>> tensors;  // the caller's, where the sum goes
  };
  struct Op {
    MPI_Request request = MPI_REQUEST_NULL;
    int chunk = 0, replica = 0;  // whose tensor, to or from which replica
    bool receive = false;
    int floats = 0;
  };
  struct Box {
    int chunk = 0;
    std::vector<std::vector<float>> of;  // [replica]: its tensors of the chunk, one after another (this one's: the copy sent)
  };

  static int tag(int chunk) { return 100 + chunk; }

  Where where() const { return {.device = control_->device()}; }

  void check_replica(int replica) const {
    if (replica != control_->replica())
      throw_error(where(), "replica ", replica, " asked the reduction of rank ", control_->rank(), ", which is replica ",
                  control_->replica());
  }

  static std::string mpi_error_text(int code, const char* what) {
    try {
      check_mpi(code, what);
    } catch (const std::exception& e) {
      return e.what();
    }
    return {};
  }

  // What the reductions still wait for: "the gradients of chunk 1 from replica 2, ..." (receives
  // first), or the sends that have not completed.
  std::string pending() const {
    std::string text;
    for (const bool receive : {true, false}) {
      int listed = 0;
      int last_chunk = -1, last_replica = -1;
      for (const Op& op : ops_) {
        if (op.request == MPI_REQUEST_NULL || op.receive != receive) continue;
        if (op.chunk == last_chunk && op.replica == last_replica) continue;  // its other tensors
        last_chunk = op.chunk;
        last_replica = op.replica;
        if (listed++ == 4) {
          text += ", and more";
          break;
        }
        text += (text.empty() ? "" : ", ") +
                (receive ? "the gradients of chunk " + std::to_string(op.chunk) + " from replica " + std::to_string(op.replica)
                         : "replica " + std::to_string(op.replica) + " to receive the gradients of chunk " +
                               std::to_string(op.chunk));
      }
      if (!text.empty()) return text;
    }
    return "the gradient reductions";
  }

  Box& box(int chunk) {
    for (Box& b : boxes_)
      if (b.chunk == chunk) return b;
    Box& b = boxes_.emplace_back();
    b.chunk = chunk;
    b.of.resize(static_cast<std::size_t>(replicas()));
    return b;
  }

  [[noreturn]] void fail(const std::string& why) {
    cancel_receives();
    throw_error(where(), why);
  }

  // Cancels the receives still pending and waits for them to end (together, at
  // most kCancelWait). The buffers of any that did not end, and of any send still
  // pending, are kept until the process ends (release()).
  void cancel_receives() noexcept {
    bool any = false;
    for (Op& op : ops_)
      if (op.receive && op.request != MPI_REQUEST_NULL) {
        MPI_Cancel(&op.request);
        any = true;
      }
    if (!any) return;
    (void)poll_until(
        [&] {
          bool all = true;
          for (Op& op : ops_) {
            if (!op.receive || op.request == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE);
            all = all && flag != 0;
          }
          return all;
        },
        kCancelWait, [](std::chrono::steady_clock::duration) {});
  }

  // Ends the reductions of a failed step: the operations still pending are let
  // go (MPI_Request_free: MPI may still read or write their buffers, which are
  // then kept until the process ends, and their communicator is left alone, as no
  // rank uses it again); otherwise the communicator is freed.
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || comm_ == MPI_COMM_NULL) return;
    bool pending = false;
    for (Op& op : ops_) {
      if (op.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE);
      if (flag) continue;
      MPI_Request_free(&op.request);
      pending = true;
    }
    ops_.clear();
    started_.clear();
    if (pending) {
      try {
        detail::keep_until_exit(std::make_shared<std::vector<Box>>(std::move(boxes_)));
      } catch (...) {
        // the buffers leak rather than be freed under MPI
      }
      boxes_.clear();
    } else {
      MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
  }

  static constexpr std::chrono::milliseconds kCancelWait{200};

  std::shared_ptr<Control> control_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<Started> started_;  // the sums under way, in the order started
  std::vector<Op> ops_;           // ... their sends and receives
  std::vector<Box> boxes_;        // the tensors of every replica, by chunk
};

}  // namespace pipeweave::mpi
