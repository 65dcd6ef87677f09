#pragma once
/// \file
/// The gradient reductions of data parallelism between GPUs: NcclReplicaGroup,
/// the collective of the D replicas of one pipeline device when each replica
/// holds it on a GPU of its own. Each R is one ncclAllReduce per gradient tensor
/// (one NCCL group), in place in the GPU's memory, on the stream of the device's
/// reducer, so that it runs beside the device's remaining compute; no host copy.
///
/// NCCL picks the order of the sum, not replica order: with D = 2 the sum is
/// g_0 + g_1 either way (one addition, which commutes), so the run is bit for
/// bit with sequential training; with D > 2 it agrees within the GPU tolerance
/// (docs/guide/cuda.md). The pipeline chooses it where every device thread has
/// a GPU of its own (nccl_reductions); elsewhere it keeps the host-staged
/// ReplicaGroup (runtime/replicas.hpp), which sums in replica order.
///
/// Never a hang: the communicators are non-blocking (cuda/nccl.hpp); a
/// reduction's wait polls the GPU, the communicator's state, the run's timeout
/// and the group's abort, and on an abort (a failure elsewhere) it aborts the
/// communicator, which ends its kernels. Before the NCCL calls the D replicas
/// meet on the host (ReplicaGroup::match), so replicas that reach different
/// chunks, or tensors of different sizes, stop with an error instead of summing
/// unrelated memory. reset() rebuilds the communicators after a failure.
///
/// \code
/// // Pipeline device 0's two replicas on GPUs 0 and 1:
/// pipeweave::cuda::NcclReplicaGroup group(/*device=*/0, {0, 1}, std::chrono::seconds(30));
/// // on replica r's reducer thread, with its gradients of chunk c on its GPU:
/// // group.all_reduce_on(reducer, r, c, tensors);
/// \endcode

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/runtime/replicas.hpp"

namespace pipeweave::cuda {

/// Whether a pipeline of `devices` x `replicas` device threads on `gpus` (P x D
/// entries, device d of replica r on gpus[r * P + d]) sums its gradients by NCCL:
/// with replicas, when every device thread has a GPU of its own. Each GPU then
/// takes part in one reduction communicator (its device's replicas) and, with
/// the nccl transport, one transport communicator (its replica's pipeline), whose
/// kernels run at unrelated times on two streams. That relies on the GPU running
/// both at once (they need a few multiprocessors each), as Megatron-LM's
/// DP x PP does; NCCL does not promise it, and where it does not happen the two
/// can wait on each other until the timeout ends the step with an error. Device
/// threads that share GPUs would put several reduction communicators on each:
/// they sum through the host instead.
inline bool nccl_reductions(const std::vector<int>& gpus, int devices, int replicas) {
  if (replicas < 2 || devices < 1 || gpus.size() != static_cast<std::size_t>(devices) * static_cast<std::size_t>(replicas))
    return false;
  return std::set<int>(gpus.begin(), gpus.end()).size() == gpus.size();
}

/// The collective of one pipeline device's D replicas on D GPUs (see the file
/// comment): replica r uses rank r of an NCCL communicator over `gpus`; the
/// replicas meet, agree and abort on the host (InPlaceReplicaGroup).
class NcclReplicaGroup final : public InPlaceReplicaGroup<CudaBackend> {
 public:
  /// The group of pipeline device `device` whose replica r is on GPU gpus[r]
  /// (distinct GPUs); no wait takes longer than `timeout`. Throws
  /// pipeweave::Error when the GPUs repeat or NCCL cannot join them.
  NcclReplicaGroup(int device, std::vector<int> gpus, std::chrono::milliseconds timeout)
      : InPlaceReplicaGroup(device, static_cast<int>(gpus.size()), timeout), gpus_(std::move(gpus)),
        timeout_(timeout), done_(gpus_.size()) {
    if (std::set<int>(gpus_.begin(), gpus_.end()).size() != gpus_.size())
      throw_error({.device = device}, "an NCCL replica group needs a GPU of its own for each of its ", gpus_.size(),
                  " replicas (NCCL refuses two ranks on one GPU); replicas that share a GPU sum through the host");
    connect();
  }
  ~NcclReplicaGroup() override { (void)NcclComm::close_all(comms_, timeout_); }

  NcclReplicaGroup(const NcclReplicaGroup&) = delete;
  NcclReplicaGroup& operator=(const NcclReplicaGroup&) = delete;

  /// The factory a CUDA pipeline gives its devices: device d's group over the
  /// GPUs of its replicas, gpus[r * P + d] (nccl_reductions must hold).
  static MakeReplicaCollective factory(std::vector<int> gpus, int devices) {
    return [gpus = std::move(gpus), devices](int device, int replicas,
                                             std::chrono::milliseconds timeout) -> std::unique_ptr<ReplicaCollective> {
      std::vector<int> mine;
      for (int r = 0; r < replicas; ++r) mine.push_back(gpus.at(static_cast<std::size_t>(r * devices + device)));
      return std::make_unique<NcclReplicaGroup>(device, std::move(mine), timeout);
    };
  }

  /// Chunk `chunk`'s gradient tensors, on replica `replica`'s GPU, summed over
  /// the replicas by NCCL on `b`'s stream; returns once the sum is done. Throws
  /// pipeweave::Error, naming the device and the replica, on a mismatch, an
  /// NCCL error, a timeout, or an abort (the communicator is then aborted).
  void all_reduce_on(CudaBackend& b, int replica, int chunk, std::span<const std::span<float>> tensors) override {
    host().match(replica, chunk, tensors);
    const auto r = static_cast<std::size_t>(replica);
    NcclComm& comm = comms_[r];
    const std::string what = "replica " + std::to_string(replica) + "'s gradient reduction of chunk " +
                             std::to_string(chunk);
    const Where where{.device = host().device()};
    // The run's abort (a failure elsewhere) aborts the communicator, which ends its kernels; an NCCL
    // error or the timeout ends the wait too (check_gpu_wait).
    auto check = [&](std::chrono::steady_clock::duration waited) {
      const bool stop = aborted_.load(std::memory_order_acquire);
      check_gpu_wait(&comm, stop, waited, timeout_, where, [](const std::string&) {});
      if (stop) throw_error(where, "stopped during ", what, " because another device failed");
    };
    try {
      post_nccl_group(
          comm.get(),
          [&] {
            for (const std::span<float> t : tensors) {
              const ncclResult_t e =
                  ncclAllReduce(t.data(), t.data(), t.size(), ncclFloat, ncclSum, comm.get(), b.stream());
              if (e != ncclSuccess && e != ncclInProgress) return e;
            }
            return ncclSuccess;
          },
          timeout_, [&] { check(std::chrono::steady_clock::duration::zero()); }, where, what);
      if (!done_[r]) done_[r].emplace();  // on the reducer's thread, bound to the GPU
      done_[r]->record(b.stream());      // after the group's kernels, which NCCL has enqueued
      poll_until([&] { return done_[r]->done(); }, kNoTimeout, check);
      const ncclResult_t s = comm.state();  // an error NCCL reported as the work ended
      if (s != ncclSuccess && s != ncclInProgress) throw_error(where, "NCCL failed on ", what, ": ", nccl_text(s));
    } catch (...) {
      comm.abort();  // what it posted may never end: its kernels end now, before anyone frees the gradients
      throw;
    }
  }

  /// Ends every wait: those on the host at once, a reduction on the GPU at its
  /// next poll (its communicator is then aborted). Safe from any thread.
  void abort(std::string_view reason) noexcept override {
    aborted_.store(true, std::memory_order_release);
    InPlaceReplicaGroup::abort(reason);
  }

  /// After a failed step, between steps: the host group is usable again, and
  /// when any communicator was aborted or failed, all are rebuilt (a new NCCL
  /// id; the old ones are aborted).
  void reset() override {
    InPlaceReplicaGroup::reset();
    aborted_.store(false, std::memory_order_release);
    bool broken = false;
    for (const NcclComm& c : comms_) {
      const ncclResult_t s = c.state();
      broken = broken || (s != ncclSuccess && s != ncclInProgress);
    }
    if (!broken) return;
    for (NcclComm& c : comms_) c.abort();
    connect();
  }

  /// The GPU of each replica.
  const std::vector<int>& gpus() const { return gpus_; }

 private:
  void connect() {
    try {
      ncclUniqueId id;
      PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
      comms_ = NcclComm::create_all(gpus_, id, timeout_);
    } catch (const std::exception& e) {
      throw_error({.device = host().device()}, "the gradient reductions of its ", gpus_.size(), " replicas: ",
                  e.what());
    }
  }

  std::vector<int> gpus_;  // [replica]
  std::chrono::milliseconds timeout_;
  std::vector<NcclComm> comms_;             // [replica]: its rank of the communicator
  std::vector<std::optional<Event>> done_;  // [replica]: the end of its reduction on its reducer's stream
  std::atomic<bool> aborted_{false};
};

}  // namespace pipeweave::cuda
