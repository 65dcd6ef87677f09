#pragma once
/// \file
/// The GPU transports of one process, one host thread per pipeline device, each
/// satisfying pipeweave::Transport:
///
/// - kNccl: one NCCL rank per device, one GPU per device. Each step's group of
///   sends and receives is one ncclGroupStart/ncclGroupEnd on the device's
///   communication stream. The communication stream waits (an event) for what the
///   compute stream did before the group, and the compute stream waits (an event)
///   for the group's end: so the host never blocks on a transfer, and one device's
///   transfers run while the other devices compute.
/// - kVirtual: several pipeline devices share a GPU (or a few GPUs), one stream
///   each, since NCCL cannot put two ranks on one GPU. A transfer is a
///   cudaMemcpyAsync on the receiver's communication stream, enqueued at the
///   moment the host-side matcher pairs the send with its receive, after events
///   that mark both sides ready; both compute streams then wait for the copy.
///   Devices on different GPUs work too: every event is recorded on a stream of
///   its own GPU (a stream may wait for another GPU's event), peer access is
///   enabled between the fabric's GPUs where the hardware allows it, and the copy
///   is cudaMemcpyPeerAsync, which the driver stages through host memory where
///   it does not.
///
/// Matching and message checks. NCCL carries no metadata, so both transports first
/// match every group on the host (runtime/matcher.hpp: FIFO per directed pair, the
/// tensor and the byte count of both sides compared) and only then move data; a
/// mismatch is an error naming both sides before a byte moves. The host threads
/// rendezvous per group; the GPU work stays asynchronous.
///
/// Failure. Every wait polls: the host matcher with a timeout, NCCL through its
/// non-blocking communicators (ncclCommGetAsyncError), the backend's synchronize()
/// through a wait check installed by Fabric::make_backend. A device that fails, or
/// sees another device fail, aborts its own communicator (ncclCommAbort, which also
/// ends its kernels on the GPU) and throws; reset() drains every device's
/// communication stream (so that no transfer of the failed step lands in a buffer
/// the next step uses) and builds new communicators.
///
/// \code
/// auto fabric = pipeweave::cuda::make_fabric(pipeweave::TransportKind::kVirtual, {0, 0});
/// std::vector<pipeweave::cuda::Endpoint> ends = fabric->endpoints();
/// // on device d's thread, before its endpoint is used:
/// //   pipeweave::cuda::CudaBackend backend = fabric->make_backend(d, {});
/// \endcode

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cuda {

class Endpoint;

/// The state all devices of one process share: the host matcher, and per device
/// its GPU, its compute stream (the backend's), its communication stream and
/// events, and (kNccl) its communicator. Made by make_fabric(); endpoints and
/// backends keep it alive.
class Fabric : public std::enable_shared_from_this<Fabric> {
  struct Private {};

 public:
  /// Use make_fabric().
  Fabric(Private, TransportKind kind, std::vector<int> gpus, std::chrono::milliseconds timeout)
      : kind_(resolve_gpu_transport(kind, gpus)),
        gpus_(std::move(gpus)),
        timeout_(timeout),
        matcher_(static_cast<int>(gpus_.size()), timeout,
                 [this](const MatchSide& send, const MatchSide& recv) { on_match(send, recv); }),
        devices_(gpus_.size()) {
    const int visible = gpu_count();
    for (std::size_t d = 0; d < gpus_.size(); ++d)
      if (gpus_[d] < 0 || gpus_[d] >= visible)
        throw_error({}, "transport: device ", d, " is placed on GPU ", gpus_[d], ", but ", visible, " GPUs are visible");
    if (kind_ == TransportKind::kNccl) create_comms();
    if (kind_ == TransportKind::kVirtual) enable_peer_access();
  }
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  /// Ends the communicators cleanly (or aborts them when that fails).
  ~Fabric() {
    if (!comms_.empty()) NcclComm::close_all(comms_, timeout_);
  }

  /// The transport in use (never kAuto).
  TransportKind kind() const { return kind_; }
  /// Number of pipeline devices.
  int devices() const { return static_cast<int>(gpus_.size()); }
  /// The GPU of device d.
  int gpu(int device) const { return gpus_.at(static_cast<std::size_t>(device)); }
  /// The longest any wait may take.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// kVirtual: whether copies from GPU `from` to GPU `to` go directly (the same
  /// GPU, or `to` has peer access to `from`'s memory) rather than staged through
  /// the host.
  bool direct_copies(int from, int to) const { return from == to || peer_.count({to, from}) > 0; }

  /// The endpoints of all devices; endpoint d belongs to device d's thread.
  std::vector<Endpoint> endpoints();

  /// Makes device d's backend on its GPU and binds it to endpoint d: the endpoint
  /// orders its transfers against the backend's stream, and the backend's
  /// synchronize() polls the fabric (so a failed peer or a stuck transfer stops it
  /// instead of hanging). Call on device d's thread, before its endpoint is used;
  /// the backend must outlive the use of the endpoint.
  CudaBackend make_backend(int device, const CudaOptions& options = {}) {
    DeviceState& s = state(device);
    CudaBackend backend(gpu(device), options);
    s.compute = backend.stream();
    s.comm.emplace();  // on the backend's GPU, current now
    s.ready.emplace();
    s.done.emplace();
    s.send_done.clear();
    s.bound = true;
    std::shared_ptr<Fabric> self = shared_from_this();
    backend.set_wait_check([self, device](std::chrono::steady_clock::duration waited) {
      self->check_while_waiting(device, waited);
    });
    return backend;
  }

  /// Endpoint::group_begin of device d.
  void group_begin(int device, int step) { matcher_.begin(device, step); }
  /// Endpoint::send of device d.
  void send(int device, int peer, const Message& m, const void* data) {
    matcher_.add(device, OpKind::kSend, peer, m, data, nullptr);
  }
  /// Endpoint::recv of device d.
  void recv(int device, int peer, const Message& m, void* data) {
    matcher_.add(device, OpKind::kRecv, peer, m, nullptr, data);
  }
  /// Endpoint::group_end of device d: matches the group on the host, then
  /// enqueues its transfers between an event of the compute stream and one the
  /// compute stream waits for.
  void group_end(int device) {
    if (!matcher_.close(device)) return;
    DeviceState& s = bound_state(device);
    const DeviceGuard guard(gpu(device));
    char label[48];
    std::snprintf(label, sizeof label, "P2P step %d", matcher_.step(device));
    const NvtxRange range(label, kNvtxP2P);
    try {
      const auto& ops = matcher_.ops(device);
      if (kind_ == TransportKind::kVirtual) prepare_send_events(s, ops);
      s.ready->record(s.compute);
      matcher_.post(device);  // the copies (kVirtual) are enqueued by whoever completes each match
      if (kind_ == TransportKind::kVirtual)
        finish_virtual(s, ops);
      else
        run_nccl(device, s, ops);
    } catch (...) {
      abort_own(device);
      throw;
    }
  }
  /// Endpoint::agree of device d.
  bool agree(int device, bool ok) {
    try {
      return matcher_.agree(device, ok);
    } catch (...) {
      abort_own(device);
      throw;
    }
  }
  /// Endpoint::abort of device d, from any thread: every wait of the fabric
  /// ends at its next poll. A device's communicator is aborted only by the
  /// device's own thread (its waits see the abort; reset() aborts it too), never
  /// under a poll of another thread.
  void abort(int /*device*/, std::string_view reason) noexcept { matcher_.abort(reason); }
  /// Endpoint::reset of device d: drains d's communication stream (after
  /// aborting d's communicator, which ends NCCL kernels that wait for a failed
  /// peer), so that no transfer of a failed group is still queued when the next
  /// step reuses its buffers; then waits for every device, and the last to arrive
  /// builds new NCCL communicators. No device returns before every device has
  /// drained. The drain polls, with the timeout: a stream that does not drain is
  /// an error, not a hang.
  void reset(int device) {
    // A device whose stream does not drain still meets the others, with why: every device's reset then throws
    // naming it, and none waits for it until the timeout.
    std::string failed;
    try {
      if (kind_ == TransportKind::kNccl) abort_own(device);
      drain(device);
    } catch (const std::exception& e) {
      failed = e.what();
      if (failed.empty()) failed = "unknown error";
    }
    matcher_.reset(
        device,
        [this] {
          if (kind_ == TransportKind::kNccl) create_comms();
        },
        failed);
  }

  /// Called by a backend's synchronize() while it waits. Once another device has
  /// failed, device d aborts its communicator, which ends any NCCL kernel of d that
  /// waits for a peer, and the wait goes on (the failure surfaces at the next
  /// agreement). Throws, after aborting d's communicator and telling the other
  /// devices, when d's communicator reports an error or the wait is longer than
  /// the timeout. (Virtual devices only wait for events already recorded, so only
  /// the timeout applies to them.)
  void check_while_waiting(int device, std::chrono::steady_clock::duration waited) {
    NcclComm* own = comms_.empty() ? nullptr : &comms_[static_cast<std::size_t>(device)];
    check_gpu_wait(own, matcher_.aborted(), waited, timeout_, {.device = device}, [&](const std::string& what) {
      abort(device, what);
      abort_own(device);  // on the device's thread, which owns it
    });
  }


  /// Creates a fabric; see make_fabric().
  static std::shared_ptr<Fabric> create(TransportKind kind, std::vector<int> gpus, std::chrono::milliseconds timeout) {
    return std::make_shared<Fabric>(Private{}, kind, std::move(gpus), timeout);
  }

 private:
  // Created by make_backend() on the device's GPU.
  struct DeviceState {
    cudaStream_t compute = nullptr;    // the backend's stream (not owned)
    std::optional<Stream> comm;        // NCCL operations, or the copies into this device
    std::optional<Event> ready, done;  // compute before a group; comm after it
    // kVirtual: [op] the copy of this device's send is done. Recorded on the
    // receiver's communication stream, so made on the receiver's GPU: one event
    // per op and GPU, [op][gpu], made the first time a send goes there.
    std::vector<std::vector<std::optional<Event>>> send_done;
    bool bound = false;
  };

  DeviceState& state(int device) {
    if (device < 0 || device >= devices())
      throw_error({}, "transport: device ", device, " is not one of the ", devices());
    return devices_[static_cast<std::size_t>(device)];
  }
  DeviceState& bound_state(int device) {
    DeviceState& s = state(device);
    if (!s.bound)
      throw_error({.device = device}, "the transport has no backend bound (make the backend with Fabric::make_backend)");
    return s;
  }
  ncclComm_t comm(int device) const {
    return comms_.empty() ? nullptr : comms_[static_cast<std::size_t>(device)].get();
  }

  void create_comms() {
    if (!comms_.empty()) {
      for (NcclComm& c : comms_) c.abort();
      comms_.clear();
    }
    ncclUniqueId id;
    PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
    comms_ = NcclComm::create_all(gpus_, id, timeout_);
  }

  // Device d aborts its own communicator (only d's thread uses it).
  void abort_own(int device) noexcept {
    if (!comms_.empty()) comms_[static_cast<std::size_t>(device)].abort();
  }

  // Waits, polling, until device d's communication stream has run everything
  // queued on it; throws after the timeout or on a CUDA error.
  void drain(int device) {
    DeviceState& s = state(device);
    if (s.comm) drain_stream(s.comm->get(), gpu(device), timeout_, {.device = device});
  }

  // kVirtual: lets every GPU of the fabric read the others' memory where the
  // hardware allows it (cudaDeviceEnablePeerAccess from each side); where it does
  // not, cudaMemcpyPeerAsync stages the copies through the host.
  void enable_peer_access() {
    const std::set<int> used(gpus_.begin(), gpus_.end());
    for (int a : used)
      for (int b : used) {
        if (a == b) continue;
        int can = 0;
        PIPEWEAVE_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
        if (can == 0) continue;
        const DeviceGuard guard(a);
        const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
          (void)cudaGetLastError();  // enabled before, by this process: fine
        else
          PIPEWEAVE_CHECK_CUDA(e);
        peer_.insert({a, b});
      }
  }

  // kVirtual, on the sender's thread before its group is posted: the event each
  // send op's copy will record, on the receiver's GPU.
  void prepare_send_events(DeviceState& s, const std::vector<RendezvousOp>& ops) {
    if (s.send_done.size() < ops.size()) s.send_done.resize(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != OpKind::kSend) continue;
      const auto g = static_cast<std::size_t>(gpu(ops[i].peer));
      auto& per_gpu = s.send_done[i];
      if (per_gpu.size() <= g) per_gpu.resize(g + 1);
      if (!per_gpu[g]) {
        const DeviceGuard guard(gpu(ops[i].peer));
        per_gpu[g].emplace();
      }
    }
  }

  // kVirtual, under the matcher's lock, on the thread that completed the match:
  // the copy runs on the receiver's communication stream after both sides are
  // ready, and marks the send done.
  void on_match(const MatchSide& send, const MatchSide& recv) {
    if (kind_ != TransportKind::kVirtual) return;
    DeviceState& s = devices_[static_cast<std::size_t>(send.device)];
    DeviceState& r = devices_[static_cast<std::size_t>(recv.device)];
    const int from = gpu(send.device), to = gpu(recv.device);
    DeviceGuard guard(to);
    r.comm->wait(s.ready->get());  // may be another GPU's event
    r.comm->wait(r.ready->get());
    const std::size_t bytes = recv.op.message.bytes;
    if (bytes > 0 && from == to)
      PIPEWEAVE_CHECK_CUDA(cudaMemcpyAsync(recv.op.dst, send.op.src, bytes, cudaMemcpyDeviceToDevice, r.comm->get()));
    else if (bytes > 0)
      PIPEWEAVE_CHECK_CUDA(cudaMemcpyPeerAsync(recv.op.dst, to, send.op.src, from, bytes, r.comm->get()));
    send_event(s, send.index, to).record(r.comm->get());
  }

  // kVirtual: the event of device s's send op `op` whose copy runs on GPU `gpu`
  // (made by prepare_send_events).
  static Event& send_event(DeviceState& s, int op, int gpu) {
    return *s.send_done[static_cast<std::size_t>(op)][static_cast<std::size_t>(gpu)];
  }

  // kVirtual, after the group is matched: the compute stream waits for the
  // copies of its sends (events of the receivers' GPUs) and for those into it.
  void finish_virtual(DeviceState& s, const std::vector<RendezvousOp>& ops) {
    bool receives = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == OpKind::kSend)
        PIPEWEAVE_CHECK_CUDA(
            cudaStreamWaitEvent(s.compute, send_event(s, static_cast<int>(i), gpu(ops[i].peer)).get(), 0));
      else
        receives = true;
    }
    if (receives) {
      s.done->record(s.comm->get());
      PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(s.compute, s.done->get(), 0));
    }
  }

  // kNccl, after the group is matched on the host: one NCCL group on the
  // communication stream, between the two events.
  void run_nccl(int device, DeviceState& s, const std::vector<RendezvousOp>& ops) {
    const Where where{.device = device, .step = matcher_.step(device)};
    s.comm->wait(s.ready->get());
    run_nccl_group(comm(device), s.comm->get(), ops, timeout_, [&] {
      if (matcher_.aborted())
        throw_error(where, "stopped while NCCL posted the group because another device failed: ", matcher_.reason());
    }, where);
    s.done->record(s.comm->get());
    PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(s.compute, s.done->get(), 0));
  }

  TransportKind kind_;
  std::vector<int> gpus_;
  std::chrono::milliseconds timeout_;
  RendezvousMatcher matcher_;
  std::vector<DeviceState> devices_;
  std::vector<NcclComm> comms_;  // kNccl: [device]
  std::set<std::pair<int, int>> peer_;  // kVirtual: (a, b) where GPU a reads GPU b's memory directly
};

/// One device's end of a Fabric. Satisfies pipeweave::Transport.
class Endpoint {
 public:
  /// Device `device`'s end of `fabric`.
  Endpoint(std::shared_ptr<Fabric> fabric, int device) : fabric_(std::move(fabric)), device_(device) {}

  /// This device's index.
  int device() const { return device_; }
  /// Number of devices on the fabric.
  int devices() const { return fabric_->devices(); }
  /// The fabric.
  const std::shared_ptr<Fabric>& fabric() const { return fabric_; }

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) { fabric_->group_begin(device_, step); }
  /// Adds a send of `message.bytes` bytes of device memory at `data` to device `peer`.
  void send(int peer, const Message& message, const void* data) { fabric_->send(device_, peer, message, data); }
  /// Adds a receive of `message` from device `peer` into device memory at `data`.
  void recv(int peer, const Message& message, void* data) { fabric_->recv(device_, peer, message, data); }
  /// Matches the group on the host, then enqueues its transfers; returns before
  /// they run (the backend's stream waits for them).
  void group_end() { fabric_->group_end(device_); }
  /// True when every device passes true.
  bool agree(bool ok) { return fabric_->agree(device_, ok); }
  /// Stops every wait on every device with an error quoting `reason`, and aborts
  /// this device's communicator.
  void abort(std::string_view reason) noexcept { fabric_->abort(device_, reason); }
  /// Collective: clears the fabric after a failure (new communicators for kNccl).
  void reset() { fabric_->reset(device_); }

 private:
  std::shared_ptr<Fabric> fabric_;
  int device_;
};

static_assert(Transport<Endpoint>);

inline std::vector<Endpoint> Fabric::endpoints() {
  std::vector<Endpoint> ends;
  ends.reserve(gpus_.size());
  for (int d = 0; d < devices(); ++d) ends.emplace_back(shared_from_this(), d);
  return ends;
}

/// A fabric for devices placed on `gpus` ([device] -> GPU), with transport `kind`
/// (kAuto resolved by resolve_gpu_transport) and waits that give up after
/// `timeout`. For kNccl it creates the communicators.
inline std::shared_ptr<Fabric> make_fabric(TransportKind kind, std::vector<int> gpus,
                                           std::chrono::milliseconds timeout = kDefaultTimeout) {
  return Fabric::create(kind, std::move(gpus), timeout);
}

}  // namespace pipeweave::cuda
