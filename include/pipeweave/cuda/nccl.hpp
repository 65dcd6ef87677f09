#pragma once
/// \file
/// NCCL communicators that never make the host hang: every communicator is
/// created non-blocking (`ncclConfig_t::blocking = 0`), so an NCCL call returns at
/// once and its progress is polled with ncclCommGetAsyncError, with a timeout and
/// a caller's check between polls; a failed communicator is aborted
/// (ncclCommAbort), which also stops its kernels on the GPU.
///
/// \code
/// // One process, two GPUs (one communicator per GPU):
/// ncclUniqueId id;
/// PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
/// std::vector<pipeweave::cuda::NcclComm> comms = pipeweave::cuda::NcclComm::create_all({0, 1}, id,
///                                                                                    std::chrono::seconds(30));
/// \endcode

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::cuda {

/// The state of a non-blocking communicator: ncclSuccess, ncclInProgress or an
/// error; an aborted or empty communicator reads ncclInvalidArgument.
inline ncclResult_t nccl_state(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

/// The text of an NCCL status with NCCL's last error message.
inline std::string nccl_text(ncclResult_t r) {
  std::string text = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

/// Polls `comm` until it is no longer in progress. Calls check() between polls
/// (it may throw). Returns the final state: ncclSuccess, an error, or
/// ncclInProgress when `timeout` ran out first.
template <class Check>
ncclResult_t wait_nccl(ncclComm_t comm, std::chrono::milliseconds timeout, Check&& check) {
  ncclResult_t s = ncclInProgress;
  poll_until([&] { return (s = nccl_state(comm)) != ncclInProgress; }, timeout,
             [&](std::chrono::steady_clock::duration) { check(); });
  return s;
}

/// Posts one NCCL group on `comm`: post() makes the group's calls between
/// ncclGroupStart and ncclGroupEnd and returns the first result that is neither
/// ncclSuccess nor ncclInProgress (ncclSuccess when none), and this polls until
/// NCCL has taken the group (a non-blocking communicator says ncclInProgress
/// until then; only after that is the group's work on its streams), calling
/// check() between polls. Throws pipeweave::Error, starting with `where`'s
/// prefix and naming `what`, when NCCL fails or `timeout` runs out.
template <class Post, class Check>
void post_nccl_group(ncclComm_t comm, Post&& post, std::chrono::milliseconds timeout, Check&& check,
                     const Where& where, std::string_view what) {
  if (comm == nullptr) throw_error(where, "the NCCL communicator of ", what, " was aborted; reset it first");
  PIPEWEAVE_CHECK_NCCL(ncclGroupStart());
  const ncclResult_t posted = post();
  const ncclResult_t ended = ncclGroupEnd();
  if (posted != ncclSuccess && posted != ncclInProgress)
    throw_error(where, "NCCL could not post ", what, ": ", nccl_text(posted));
  if (ended != ncclSuccess && ended != ncclInProgress)
    throw_error(where, "ncclGroupEnd failed for ", what, ": ", nccl_text(ended));
  const ncclResult_t state = wait_nccl(comm, timeout, check);
  if (state == ncclInProgress) throw_error(where, "timed out after ", timeout.count(), " ms while NCCL posted ", what);
  if (state != ncclSuccess) throw_error(where, "NCCL failed on ", what, ": ", nccl_text(state));
}

/// Posts one group of sends and receives on `stream` (post_nccl_group). Each op
/// has `kind` (OpKind), `peer`, `src`, `dst` and `message.bytes`.
template <class Ops, class Check>
void run_nccl_group(ncclComm_t comm, cudaStream_t stream, const Ops& ops, std::chrono::milliseconds timeout,
                    Check&& check, const Where& where) {
  post_nccl_group(
      comm,
      [&] {
        for (const auto& op : ops) {
          const ncclResult_t r = op.kind == OpKind::kSend
                                     ? ncclSend(op.src, op.message.bytes, ncclUint8, op.peer, comm, stream)
                                     : ncclRecv(op.dst, op.message.bytes, ncclUint8, op.peer, comm, stream);
          if (r != ncclSuccess && r != ncclInProgress) return r;
        }
        return ncclSuccess;
      },
      timeout, check, where, "the group");
}

/// An owning, non-blocking NCCL communicator of one rank. Move-only. Destroying
/// it aborts it (local, never waits); close() or close_all() end it cleanly.
class NcclComm {
 public:
  NcclComm() = default;
  /// Starts joining rank `rank` of `ranks` with `id` on GPU `gpu`; the
  /// communicator is usable once ready() (see create_all and wait_ready).
  NcclComm(int gpu, int ranks, const ncclUniqueId& id, int rank) : gpu_(gpu) {
    DeviceGuard guard(gpu);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId copy = id;
    PIPEWEAVE_CHECK_NCCL(ncclCommInitRankConfig(&comm_, ranks, copy, rank, &config));
  }
  NcclComm(NcclComm&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)), gpu_(o.gpu_) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(gpu_, o.gpu_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() { abort(); }

  /// The communicators of one process, rank r on GPU gpus[r], created together
  /// (one NCCL group) and waited for; throws when one fails or `timeout` runs out.
  static std::vector<NcclComm> create_all(const std::vector<int>& gpus, const ncclUniqueId& id,
                                          std::chrono::milliseconds timeout) {
    const int ranks = static_cast<int>(gpus.size());
    std::vector<NcclComm> comms(gpus.size());
    PIPEWEAVE_CHECK_NCCL(ncclGroupStart());
    try {
      for (int r = 0; r < ranks; ++r) comms[static_cast<std::size_t>(r)] = NcclComm(gpus[static_cast<std::size_t>(r)], ranks, id, r);
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    PIPEWEAVE_CHECK_NCCL(ncclGroupEnd());
    for (int r = 0; r < ranks; ++r) comms[static_cast<std::size_t>(r)].wait_ready(timeout, r);
    return comms;
  }

  /// The raw handle (nullptr when empty or aborted).
  ncclComm_t get() const { return comm_; }
  /// The GPU of this rank.
  int gpu() const { return gpu_; }
  /// ncclSuccess, ncclInProgress or an error.
  ncclResult_t state() const { return nccl_state(comm_); }

  /// Waits until initialisation has finished; throws pipeweave::Error (after
  /// aborting) on an error or when `timeout` runs out.
  void wait_ready(std::chrono::milliseconds timeout, int rank) {
    const ncclResult_t s = wait_nccl(comm_, timeout, [] {});
    if (s == ncclSuccess) return;
    const std::string text = s == ncclInProgress ? "timed out after " + std::to_string(timeout.count()) + " ms"
                                                 : nccl_text(s);
    abort();
    throw_error({}, "NCCL: rank ", rank, " on GPU ", gpu_, " could not join the communicator: ", text);
  }

  /// Aborts the communicator and its pending operations (also those running on
  /// the GPU); local, never waits for peers. Nothing happens when it is empty.
  void abort() noexcept {
    if (comm_ == nullptr) return;
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(gpu_);
    (void)ncclCommAbort(comm_);
    if (previous >= 0) (void)cudaSetDevice(previous);
    comm_ = nullptr;
  }

  /// Ends the communicators of one process cleanly: waits for each to be idle,
  /// finalizes all (on a non-blocking communicator ncclCommFinalize returns
  /// ncclInProgress: the flush has started and is polled to its end), waits up to
  /// `timeout` for all to be quiescent, destroys them. Aborts any that fails or
  /// does not finish in time; returns how many it had to abort.
  static int close_all(std::span<NcclComm> comms, std::chrono::milliseconds timeout) noexcept {
    int aborted = 0;
    auto give_up = [&](NcclComm& c) {
      c.abort();
      ++aborted;
    };
    for (NcclComm& c : comms) {
      if (c.comm_ == nullptr) continue;
      if (wait_nccl(c.comm_, timeout, [] {}) != ncclSuccess || !finalize_started(ncclCommFinalize(c.comm_)))
        give_up(c);
    }
    for (NcclComm& c : comms) {
      if (c.comm_ == nullptr) continue;
      if (wait_nccl(c.comm_, timeout, [] {}) != ncclSuccess) {
        give_up(c);
        continue;
      }
      int previous = -1;
      (void)cudaGetDevice(&previous);
      (void)cudaSetDevice(c.gpu_);
      (void)ncclCommDestroy(c.comm_);
      if (previous >= 0) (void)cudaSetDevice(previous);
      c.comm_ = nullptr;
    }
    return aborted;
  }

  /// Whether ncclCommFinalize's result means the flush is under way: ncclSuccess
  /// (a blocking communicator, done) or ncclInProgress (a non-blocking one, to be
  /// polled with ncclCommGetAsyncError).
  static constexpr bool finalize_started(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

 private:
  ncclComm_t comm_ = nullptr;
  int gpu_ = 0;
};

/// The check a backend's synchronize() runs while the GPU may wait on the
/// transfers of `comm` (none: only the timeout applies): once `peer_failed`, the
/// communicator is aborted, which ends its kernels, and the wait goes on; an error
/// of the communicator, or a wait longer than `timeout`, calls fail(what) (which
/// aborts and tells the other devices) and throws pipeweave::Error.
template <class Fail>
void check_gpu_wait(NcclComm* comm, bool peer_failed, std::chrono::steady_clock::duration waited,
                    std::chrono::milliseconds timeout, const Where& where, Fail&& fail) {
  std::string what;
  if (comm != nullptr) {
    if (peer_failed) comm->abort();
    const ncclResult_t s = comm->get() == nullptr ? ncclSuccess : comm->state();
    if (s != ncclSuccess && s != ncclInProgress)
      what = error_text(where, "NCCL reported an error while the GPU ran: ", nccl_text(s));
  }
  if (what.empty() && waited > timeout)
    what = error_text(where, "timed out after ", timeout.count(),
                      " ms waiting for the GPU to finish (a transfer with a peer may be stuck)");
  if (what.empty()) return;
  fail(what);
  throw_error({}, what);
}

/// Waits, polling up to `timeout`, until the communication stream `stream` of GPU
/// `gpu` has run everything queued on it: after a failed step, before a new
/// communicator is built (the transfers of the aborted one end once its kernels
/// do). Throws pipeweave::Error at `where` when the stream reports an error or
/// does not drain in time: an error, never a hang.
inline void drain_stream(cudaStream_t stream, int gpu, std::chrono::milliseconds timeout, const Where& where) {
  const DeviceGuard guard(gpu);
  const bool drained = poll_until(
      [&] {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q != cudaSuccess && q != cudaErrorNotReady)
          throw_error(where, "the communication stream failed while draining it: ", detail::cuda_error_text(q));
        return q == cudaSuccess;
      },
      timeout, [](std::chrono::steady_clock::duration) {});
  if (!drained)
    throw_error(where, "timed out after ", timeout.count(), " ms draining the communication stream of the failed step");
}

}  // namespace pipeweave::cuda
