#pragma once
/// \file
/// The data-parallel replicas across processes: the gradient reduction of the
/// D ranks that hold one pipeline device (the multi-process host's
/// ReplicaCollective, runtime/replicas.hpp), by MPI point-to-point on a
/// communicator of its own.
///
/// The sum is the one of ReplicaGroup, in a fixed order rather than MPI's: when a
/// rank reaches R<c> it sends each of chunk c's gradient tensors to the D - 1
/// other replicas of its device and posts the receives of theirs; the device
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
  /// comment); they must not change until complete().
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    check_replica(replica);
    if (comm_ == MPI_COMM_NULL) throw_error(where(), "the replicas' reduction is not connected (call connect)");
    const int D = replicas(), me = control_->replica();
    Started& r = started_.emplace_back();
    r.chunk = chunk;
    r.tensors.assign(tensors.begin(), tensors.end());
    std::size_t total = 0;
    for (const std::span<float>& t : tensors) {
      if (t.size() > static_cast<std::size_t>(INT_MAX))
        throw_error(where(), "a gradient tensor of chunk ", chunk, " has ", t.size(),
                    " values, more than one MPI message may carry");
      total += t.size();
    }
    Inbox& in = inbox(chunk);
    for (int q = 0; q < D; ++q) {
      if (q == me) continue;
      std::vector<float>& from = in.from[static_cast<std::size_t>(q)];
      from.resize(total);
      const int peer = control_->grid().rank(q, control_->device());
      std::size_t at = 0;
      for (const std::span<float>& t : tensors) {
        const int n = static_cast<int>(t.size());
        r.requests.emplace_back();
        check_mpi(MPI_Isend(t.data(), n, MPI_FLOAT, peer, tag(chunk), comm_, &r.requests.back()), "MPI_Isend");
        r.requests.emplace_back();
        r.receives.push_back(r.requests.size() - 1);
        check_mpi(MPI_Irecv(from.data() + at, n, MPI_FLOAT, peer, tag(chunk), comm_, &r.requests.back()), "MPI_Irecv");
        at += t.size();
      }
    }
  }

  /// Waits for every sum started (polled; see the file comment) and writes each
  /// into its tensors, in the order started.
  void complete(int replica) override {
    check_replica(replica);
    for (Started& r : started_) {
      const auto done = [&] {
        for (MPI_Request& q : r.requests) {
          int flag = 0;
          check_mpi(MPI_Test(&q, &flag, MPI_STATUS_IGNORE), "MPI_Test");
          if (!flag) return false;
        }
        return true;
      };
      const std::string what = "the gradients of chunk " + std::to_string(r.chunk) + " from " + others();
      if (!poll_until(done, control_->timeout(), [&](std::chrono::steady_clock::duration) {
            if (control_->failed()) fail("stopped while waiting for " + what + ": " + control_->reason());
          }))
        fail(control_->explain_timeout(error_text({}, "timed out after ", control_->timeout().count(),
                                                    " ms waiting for ", what)));
    }
    const int D = replicas(), me = control_->replica();
    for (Started& r : started_) {
      const Inbox& in = inbox(r.chunk);
      std::size_t at = 0;
      for (const std::span<float>& t : r.tensors) {
        for (std::size_t i = 0; i < t.size(); ++i) {
          float sum = me == 0 ? t[i] : in.from[0][at + i];
          for (int q = 1; q < D; ++q) sum += q == me ? t[i] : in.from[static_cast<std::size_t>(q)][at + i];
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
  /// plane's notice, which the host's abort of the transport sends.
  void abort(std::string_view /*reason*/) noexcept override { cancel_receives(); }

  /// Collective over the control's ranks, after a failed step (Control::reset
  /// first): the reductions get a new communicator on every rank.
  void reset() {
    cancel_receives();
    release();
    comm_ = control_->new_communicator();
  }

 private:
  struct Started {
    int chunk = 0;
    std::vector<std::span<float>> tensors;
    std::vector<MPI_Request> requests;  // a send and a receive per tensor and other replica
    std::vector<std::size_t> receives;  // ... the receives among them
  };
  struct Inbox {
    int chunk = 0;
    std::vector<std::vector<float>> from;  // [replica]: its tensors of the chunk, one after another
  };

  static int tag(int chunk) { return 100 + chunk; }

  Where where() const { return {.device = control_->device()}; }

  void check_replica(int replica) const {
    if (replica != control_->replica())
      throw_error(where(), "replica ", replica, " asked the reduction of rank ", control_->rank(), ", which is replica ",
                  control_->replica());
  }

  // "replica 1" or "replicas 0, 2": the others.
  std::string others() const {
    std::string list;
    int n = 0;
    for (int q = 0; q < replicas(); ++q)
      if (q != control_->replica()) {
        list += (n++ ? ", " : "") + std::to_string(q);
      }
    return (n == 1 ? "replica " : "replicas ") + list;
  }

  Inbox& inbox(int chunk) {
    for (Inbox& in : inboxes_)
      if (in.chunk == chunk) return in;
    Inbox& in = inboxes_.emplace_back();
    in.chunk = chunk;
    in.from.resize(static_cast<std::size_t>(replicas()));
    return in;
  }

  [[noreturn]] void fail(const std::string& why) {
    cancel_receives();
    throw_error(where(), why);
  }

  // Cancels the receives still pending. One that cannot be cancelled (its
  // transfer under way) keeps its buffer until the process ends.
  void cancel_receives() noexcept {
    bool kept = false;
    for (Started& r : started_)
      for (const std::size_t k : r.receives) {
        MPI_Request& q = r.requests[k];
        if (q == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&q);
        const bool ended = poll_until(
            [&] {
              int flag = 0;
              MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
              return flag != 0;
            },
            kCancelWait, [](std::chrono::steady_clock::duration) {});
        kept = kept || !ended;
      }
    if (kept) {
      try {
        detail::keep_until_exit(std::make_shared<std::vector<Inbox>>(std::move(inboxes_)));
      } catch (...) {
        // the buffers leak rather than be freed under MPI
      }
      inboxes_.clear();
    }
  }

  // Frees the communicator, or, with sends of a failed step still pending on it,
  // leaves it (MPI may still read their buffers; no rank receives on it again).
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || comm_ == MPI_COMM_NULL) return;
    bool pending = false;
    for (Started& r : started_)
      for (MPI_Request& q : r.requests) {
        int flag = 1;
        if (q != MPI_REQUEST_NULL) MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
        pending = pending || !flag;
      }
    started_.clear();
    if (!pending) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  static constexpr std::chrono::milliseconds kCancelWait{200};

  std::shared_ptr<Control> control_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<Started> started_;  // the sums under way, in the order started
  std::vector<Inbox> inboxes_;    // the other replicas' tensors, by chunk
};

}  // namespace pipeweave::mpi
