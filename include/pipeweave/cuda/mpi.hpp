#pragma once
/// \file
/// NCCL across processes: the transport of the multi-process host
/// (mpi/pipeline.hpp) on GPUs, one process per GPU, launched by `mpirun -n P`
/// (P x D with D data-parallel replicas: an NCCL communicator per replica);
/// MPI bootstraps NCCL (each replica's device 0 makes its ncclUniqueId, which
/// every rank gets by a gather) and carries the
/// control plane (mpi/control.hpp: agreements, failure notices); NCCL moves the
/// tensors. Works across machines: each rank takes the GPU of its index on its
/// machine, or the one its launcher gives it (rank_gpu()); two ranks on one GPU
/// are refused at start-up. Any chunk runs on it; the built-in MLP has a factory.
///
/// Message checks: NCCL carries no metadata and the ranks share no memory, so
/// messages are not checked one by one. Instead every rank starts with the
/// start-up agreement: all ranks run the same program and model, and for the same
/// program the verifier proves that every send meets the receive that expects it
/// in FIFO order, with the byte count that the model fixes.
///
/// Failure: a rank that fails aborts its communicator and notifies every other
/// rank; every wait of every rank (NCCL progress, the GPU finishing a step, the
/// agreements) polls for notices and has a timeout, so every rank stops with an
/// error instead of hanging. reset() (called by the next train_step) builds a new
/// communicator on all ranks.
///
/// \code
/// int main(int argc, char** argv) {
///   pipeweave::mpi::MpiSession mpi(argc, argv);
///   const auto spec = pipeweave::MlpSpec::uniform(8, 256, 256, 256);
///   const auto program = pipeweave::make_schedule("1f1b", mpi.size(), 1, 8);
///   auto pipe = pipeweave::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, pipeweave::init_mlp(spec),
///                                            {.rows = 512}, pipeweave::cuda::CudaOptions{});
///   const auto task = pipeweave::make_regression_task(spec, 512, 7);
///   double loss = pipe->train_step(task.inputs, task.targets).loss;  // the same on every rank
/// }
/// \endcode

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/pipeline.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/mpi/group.hpp"
#include "pipeweave/mpi/mlp.hpp"
#include "pipeweave/mpi/pipeline.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::cuda {

/// One rank's end of NCCL across processes: a multi-process transport
/// (pipeweave::mpi::MultiProcessTransport). Built locally on the rank's GPU,
/// bound to the rank's backend (bind), then joined by connect(). Its send and
/// recv (mpi::RankCalls) take device memory.
class MpiEndpoint : public mpi::RankCalls<MpiEndpoint> {
 public:
  /// The endpoint of this rank, on GPU `gpu`; talks to nobody yet.
  MpiEndpoint(std::shared_ptr<mpi::Control> control, int gpu) : s_(std::make_shared<State>()) {
    s_->control = std::move(control);
    s_->gpu = gpu;
  }

  /// The GPU of this rank.
  int gpu() const { return s_->gpu; }

  /// The GPU this rank needs for itself, by UUID: the start-up agreement refuses
  /// two ranks on one GPU however each numbers it (NCCL runs one rank per GPU).
  mpi::ExclusiveResource exclusive_resource() const {
    return {"GPU " + gpu_uuid(s_->gpu),
            "NCCL runs one rank per GPU; start at most as many ranks on a machine as it has GPUs, or give each rank "
            "its own (CUDA_VISIBLE_DEVICES per rank)"};
  }

  /// Orders the transfers against `backend`'s stream and makes its synchronize()
  /// poll for failures of other ranks, NCCL errors and the timeout.
  void bind(CudaBackend& backend) {
    State& s = *s_;
    const DeviceGuard guard(s.gpu);
    s.compute = backend.stream();
    s.comm_stream.emplace();
    s.ready.emplace();
    s.done.emplace();
    std::shared_ptr<State> state = s_;
    backend.set_wait_check([state](std::chrono::steady_clock::duration waited) { state->while_gpu_runs(waited); });
  }

  /// Collective: joins the NCCL communicator of the ranks of this rank's replica
  /// (the id its device 0 made; the ids of all replicas gathered on every rank).
  void connect() { s_->join_nccl(); }

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) { s_->group.begin(device(), step); }
  /// Posts the group as one NCCL group on the communication stream, between an
  /// event of the compute stream and one the compute stream waits for.
  void group_end() {
    State& s = *s_;
    if (!s.group.close(device())) return;
    const int step = s.group.step();
    if (s.compute == nullptr) throw_error(s.where(step), "the endpoint is not bound to a backend (call bind)");
    const DeviceGuard guard(s.gpu);
    char label[48];
    std::snprintf(label, sizeof label, "P2P step %d", step);
    const NvtxRange range(label, kNvtxP2P);
    try {
      s.check(step);
      s.ready->record(s.compute);
      s.comm_stream->wait(s.ready->get());
      run_nccl_group(s.nccl.get(), s.comm_stream->get(), s.group.ops(), s.control->timeout(), [&] { s.check(step); },
                     s.where(step));
      s.done->record(s.comm_stream->get());
      PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(s.compute, s.done->get(), 0));
    } catch (...) {
      s.nccl.abort();
      throw;
    }
  }
  /// True when every rank passes true (polled; see mpi::Control::agree).
  bool agree(bool ok) {
    State& s = *s_;
    try {
      s.check(s.group.step());
      return s.control->agree(ok, s.group.step());
    } catch (...) {
      s.nccl.abort();
      throw;
    }
  }
  /// Aborts this rank's communicator and tells every other rank, whose waits then
  /// stop with an error quoting `reason`.
  void abort(std::string_view reason) noexcept {
    s_->nccl.abort();
    s_->control->abort(reason);
  }
  /// Collective over all ranks: clears a failure and joins a new communicator.
  void reset() {
    State& s = *s_;
    s.control->reset();
    s.group.clear();
    s.nccl.abort();
    // The failed step's transfers end with the aborted communicator's kernels; the
    // new communicator's must not queue behind them on a stream still running.
    if (s.comm_stream) drain_stream(s.comm_stream->get(), s.gpu, s.control->timeout(), s.where(-1));
    s.join_nccl();
  }

 private:
  struct State {
    std::shared_ptr<mpi::Control> control;
    int gpu = 0;
    NcclComm nccl;
    cudaStream_t compute = nullptr;
    std::optional<Stream> comm_stream;
    std::optional<Event> ready, done;
    mpi::RankGroup<RendezvousOp> group;

    ~State() {
      if (nccl.get() != nullptr) {
        NcclComm one[1] = {std::move(nccl)};
        NcclComm::close_all(one, control->timeout());
      }
    }

    Where where(int at_step) const { return {.device = control->device(), .step = at_step}; }

    void join_nccl() {
      ncclUniqueId id{};
      std::vector<char> mine;
      if (control->device() == 0) {
        PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
        mine.assign(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof id);
      }
      const std::vector<std::vector<char>> ids = control->gather(mine, mpi::Control::kEveryRank, group.step());
      const std::vector<char>& ours = ids[static_cast<std::size_t>(control->rank_of(0))];
      if (ours.size() != sizeof id) throw_error(where(group.step()), "the NCCL id of device 0 did not arrive whole");
      std::memcpy(&id, ours.data(), sizeof id);
      nccl = NcclComm(gpu, control->devices(), id, control->device());
      nccl.wait_ready(control->timeout(), control->device());
    }

    // Throws (after aborting the communicator) once another rank has failed.
    void check(int at_step) {
      if (!control->failed()) return;
      nccl.abort();
      control->check(at_step);
    }

    // The backend's wait check: once another rank has failed, the communicator is
    // aborted (ending any NCCL kernel that waits for a peer) and the wait goes on;
    // an NCCL error or the timeout stops it, naming any rank that is lost (the
    // control plane's roll call).
    void while_gpu_runs(std::chrono::steady_clock::duration waited) {
      check_gpu_wait(&nccl, control->failed(), waited, control->timeout(), {.device = control->device()},
                     [&](const std::string& what) {
                       nccl.abort();
                       const std::string why = control->explain_timeout(what);
                       control->abort(why);
                       throw_error({}, why);
                     });
    }

  };

  friend class mpi::RankCalls<MpiEndpoint>;
  std::shared_ptr<State> s_;
};

static_assert(mpi::MultiProcessTransport<MpiEndpoint>);

/// The parts of this rank of a multi-process GPU run: its GPU is selected first,
/// before anything else touches CUDA (so no process opens a context on another
/// GPU), then its backend, its NCCL endpoint (bound to the backend, not yet
/// connected) and the chunks make_chunks(backend) returns. Throws
/// pipeweave::Error when the GPU does not exist; the host turns that into a
/// refusal of every rank at start-up.
template <class C, class MakeChunks>
DeviceParts<CudaBackend, MpiEndpoint, C> make_mpi_device(const std::shared_ptr<mpi::Control>& control,
                                                         const CudaOptions& options, MakeChunks&& make_chunks) {
  if (options.gpus.size() > 1 || options.transport != TransportKind::kAuto)
    throw_error({}, "mpi pipeline: a rank runs one GPU (CudaOptions::gpus holds at most its own, got ",
                options.gpus.size(), ") and NCCL between the ranks (CudaOptions::transport auto, got ",
                transport_name(options.transport), ")");
  const int gpu = rank_gpu(options.gpus.empty() ? -1 : options.gpus.front(), control->rank(), control->local_rank(),
                           gpu_count());
  PIPEWEAVE_CHECK_CUDA(cudaSetDevice(gpu));
  CudaBackend backend(gpu, options);
  MpiEndpoint endpoint(control, gpu);
  endpoint.bind(backend);
  std::vector<C> chunks = make_chunks(backend);
  return {std::move(backend), std::move(endpoint), std::move(chunks)};
}

/// The built-in MLP on GPUs across processes.
using MpiMlpPipeline = mpi::MlpPipeline<CudaBackend, MpiEndpoint, GpuMlpChunk>;

}  // namespace pipeweave::cuda

namespace pipeweave {

/// One rank of the built-in MLP `spec` (from `init`) trained with `program` across
/// processes, one per GPU; collective over `comm` (see the generic
/// make_mlp_pipeline of mpi/mlp.hpp; the arithmetic is a setting the ranks agree
/// on). The backend is chosen by the type of `gpu`, which has no default.
inline std::unique_ptr<cuda::MpiMlpPipeline> make_mlp_pipeline(MPI_Comm comm, const Program& program,
                                                               const MlpSpec& spec, const HostModel& init,
                                                               const PipelineOptions& options,
                                                               const cuda::CudaOptions& gpu) {
  using namespace pipeweave::cuda;
  return pipeweave::make_mlp_pipeline<CudaBackend, MpiEndpoint, GpuMlpChunk>(
      comm, program, spec, init, options, "cuda", math_name(gpu.math),
      [&](const std::shared_ptr<mpi::Control>& control, auto&& make_chunks) {
        return make_mpi_device<GpuMlpChunk>(control, gpu, make_chunks);
      });
}

}  // namespace pipeweave
