#pragma once
/// \file
/// NCCL across processes: one process per GPU, launched by `mpirun -n P`, each
/// running one pipeline device with the runtime's executor. MPI bootstraps NCCL
/// (rank 0's ncclUniqueId is broadcast), carries the agreement of the ranks and
/// the notices of a failure; NCCL moves the tensors. Works across machines (each
/// rank takes the GPU of its index on its machine).
///
/// Message checks: NCCL carries no metadata and the ranks share no memory, so
/// messages are not checked one by one. Instead every rank starts with
/// check_same_config: all ranks run the same program and model, and for the same
/// program the verifier proves that every send meets the receive that expects it
/// in FIFO order, with the byte count that the model fixes.
///
/// Failure: a rank that fails aborts its communicator and sends a notice to every
/// other rank; every wait of every rank (NCCL progress, the GPU finishing a step,
/// the agreement) polls for notices and has a timeout, so every rank stops with an
/// error instead of hanging. reset() (called by the next train_step) builds a new
/// communicator on all ranks.
///
/// \code
/// int main(int argc, char** argv) {
///   pipeweave::cuda::MpiSession mpi(argc, argv);
///   const auto spec = pipeweave::MlpSpec::uniform(8, 256, 256, 256);
///   const auto program = pipeweave::make_schedule(pipeweave::ScheduleKind::kOneFOneB, mpi.size(), 1, 8);
///   pipeweave::cuda::MpiMlpPipeline pipe(MPI_COMM_WORLD, program, spec, pipeweave::init_mlp(spec), {.rows = 512});
///   const auto task = pipeweave::make_regression_task(spec, 512, 7);
///   double loss = pipe.train_step(task.inputs, task.targets).loss;  // the same on every rank
/// }
/// \endcode

#include "pipeweave/cuda/mpi_bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/config_hash.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/mpi_bootstrap.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/pipeline.hpp"
#include "pipeweave/runtime/rendezvous.hpp"
#include "pipeweave/cuda/transport.hpp"
#include "pipeweave/runtime/executor.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave::cuda {

/// One rank's end of NCCL across processes. Satisfies pipeweave::Transport.
/// Movable; bind() it to the rank's backend before use.
class MpiEndpoint {
 public:
  /// Joins the NCCL communicator of all ranks of `comm`, this rank on GPU `gpu`.
  /// Collective over `comm`.
  MpiEndpoint(MPI_Comm comm, int gpu, TransportOptions options) : s_(std::make_shared<State>()) {
    State& s = *s_;
    s.gpu = gpu;
    s.options = options;
    MPI_Comm_rank(comm, &s.rank);
    MPI_Comm_size(comm, &s.size);
    check_mpi(MPI_Comm_dup(comm, &s.control), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(s.control, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_dup(comm, &s.agree_comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(s.agree_comm, MPI_ERRORS_RETURN);
    s.join_nccl();
  }

  /// This rank (the pipeline device it runs).
  int device() const { return s_->rank; }
  /// Number of ranks (pipeline devices).
  int devices() const { return s_->size; }
  /// The GPU of this rank.
  int gpu() const { return s_->gpu; }
  /// The communicator (a duplicate of the one given) used for start-up and notices.
  MPI_Comm control() const { return s_->control; }

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

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) {
    State& s = *s_;
    if (s.open) throw Error(s.where(step) + "group_begin inside an open group");
    s.open = true;
    s.step = step;
    s.ops.clear();
  }
  /// Adds a send of `message.bytes` bytes of device memory at `data` to rank `peer`.
  void send(int peer, const Message& message, const void* data) { add(OpKind::kSend, peer, message, data, nullptr); }
  /// Adds a receive of `message` from rank `peer` into device memory at `data`.
  void recv(int peer, const Message& message, void* data) { add(OpKind::kRecv, peer, message, nullptr, data); }
  /// Posts the group as one NCCL group on the communication stream, between an
  /// event of the compute stream and one the compute stream waits for.
  void group_end() {
    State& s = *s_;
    if (!s.open) throw Error(s.where(s.step) + "group_end without group_begin");
    s.open = false;
    if (s.ops.empty()) return;
    if (!s.compute) throw Error(s.where(s.step) + "the endpoint is not bound to a backend (call bind)");
    const DeviceGuard guard(s.gpu);
    char label[48];
    std::snprintf(label, sizeof label, "P2P step %d", s.step);
    const NvtxRange range(label, kNvtxP2P);
    try {
      s.check(s.step);
      s.ready->record(s.compute);
      s.comm_stream->wait(s.ready->get());
      run_nccl_group(s.nccl.get(), s.comm_stream->get(), s.ops, s.options.timeout, [&] { s.check(s.step); },
                     s.where(s.step));
      s.done->record(s.comm_stream->get());
      PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(s.compute, s.done->get(), 0));
    } catch (...) {
      s.nccl.abort();
      throw;
    }
  }
  /// True when every rank passes true (MPI_Iallreduce, polled).
  bool agree(bool ok) {
    State& s = *s_;
    try {
      s.check(s.step);
      auto* buffer = s.agree_buffer.get();
      buffer[0] = ok ? 1 : 0;
      MPI_Request request = MPI_REQUEST_NULL;
      check_mpi(MPI_Iallreduce(&buffer[0], &buffer[1], 1, MPI_INT, MPI_LAND, s.agree_comm, &request),
                "MPI_Iallreduce");
      s.agree_pending = true;
      if (!mpi_wait(request, s.options.timeout, [&] { s.check(s.step); }))
        throw Error("rank " + std::to_string(s.rank) + " (after step " + std::to_string(s.step) + "): timed out after " +
                    std::to_string(s.options.timeout.count()) + " ms waiting for every rank to reach the agreement");
      s.agree_pending = false;
      return buffer[1] != 0;
    } catch (...) {
      s.nccl.abort();
      throw;
    }
  }
  /// Aborts this rank's communicator and tells every other rank, whose waits then
  /// stop with an error quoting `reason`.
  void abort(std::string_view reason) noexcept { s_->abort(reason); }
  /// Collective over all ranks: clears a failure and joins a new communicator.
  void reset() { s_->reset(); }

 private:
  static constexpr int kNoticeTag = 7301;

  struct State {
    int rank = 0, size = 1, gpu = 0;
    TransportOptions options;
    MPI_Comm control = MPI_COMM_NULL, agree_comm = MPI_COMM_NULL;
    // The agreement's send and receive integers; a pending agreement that was
    // abandoned keeps its buffer (and its communicator), which are then leaked.
    std::unique_ptr<int[]> agree_buffer = std::make_unique<int[]>(2);
    bool agree_pending = false;
    NcclComm nccl;
    cudaStream_t compute = nullptr;
    std::optional<Stream> comm_stream;
    std::optional<Event> ready, done;
    std::vector<::pipeweave::detail::RendezvousOp> ops;
    int step = -1;
    bool open = false;
    bool aborted = false;
    std::string reason;
    std::uint64_t generation = 0;
    std::deque<std::string> notices;  // buffers of sent notices (kept until the end)

    ~State() {
      if (nccl.get() != nullptr) {
        NcclComm one[1] = {std::move(nccl)};
        NcclComm::close_all(one, options.timeout);
      }
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
      if (agree_comm != MPI_COMM_NULL && !agree_pending) MPI_Comm_free(&agree_comm);
    }

    std::string where(int at_step) const {
      return "rank " + std::to_string(rank) + ", step " + std::to_string(at_step) + ": ";
    }

    void join_nccl() {
      ncclUniqueId id{};
      if (rank == 0) PIPEWEAVE_CHECK_NCCL(ncclGetUniqueId(&id));
      check_mpi(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, control), "MPI_Bcast");
      nccl = NcclComm(gpu, size, id, rank);
      nccl.wait_ready(options.timeout, rank);
    }

    // Receives the notices that arrived; one of this generation marks the abort.
    void poll_notices() {
      for (;;) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, control, &flag, &status) != MPI_SUCCESS || !flag) return;
        int count = 0;
        MPI_Get_count(&status, MPI_CHAR, &count);
        std::string text(static_cast<std::size_t>(count), '\0');
        MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, kNoticeTag, control, MPI_STATUS_IGNORE);
        if (text.size() < 8) continue;
        std::uint64_t g = 0;
        std::memcpy(&g, text.data(), 8);
        if (g != generation || aborted) continue;
        aborted = true;
        reason = "rank " + std::to_string(status.MPI_SOURCE) + " failed: " + text.substr(8);
      }
    }

    // Throws (after aborting the communicator) once another rank has failed.
    void check(int at_step) {
      poll_notices();
      if (!aborted) return;
      nccl.abort();
      throw Error(where(at_step) + "stopped because another rank failed: " + reason);
    }

    // The backend's wait check: once another rank has failed, the communicator is
    // aborted (ending any NCCL kernel that waits for a peer) and the wait goes on;
    // an NCCL error or the timeout stops it.
    void while_gpu_runs(std::chrono::steady_clock::duration waited) {
      poll_notices();
      if (aborted) nccl.abort();
      const ncclResult_t st = nccl.get() == nullptr ? ncclSuccess : nccl_state(nccl.get());
      if (st != ncclSuccess && st != ncclInProgress) {
        const std::string what = "rank " + std::to_string(rank) + ": NCCL reported an error while the GPU ran: " +
                                 nccl_text(st);
        abort(what);
        throw Error(what);
      }
      if (waited > options.timeout) {
        const std::string what = "rank " + std::to_string(rank) + ": timed out after " +
                                 std::to_string(options.timeout.count()) +
                                 " ms waiting for the GPU to finish (a transfer with a peer may be stuck)";
        abort(what);
        throw Error(what);
      }
    }

    void abort(std::string_view why) noexcept {
      nccl.abort();
      if (aborted) return;
      aborted = true;
      try {
        reason.assign(why);
        std::string text(8, '\0');
        std::memcpy(text.data(), &generation, 8);
        text.append(why.substr(0, 1000));
        notices.push_back(std::move(text));
        const std::string& sent = notices.back();
        for (int r = 0; r < size; ++r) {
          if (r == rank) continue;
          MPI_Request request = MPI_REQUEST_NULL;
          if (MPI_Isend(sent.data(), static_cast<int>(sent.size()), MPI_CHAR, r, kNoticeTag, control, &request) ==
              MPI_SUCCESS)
            MPI_Request_free(&request);
        }
      } catch (...) {
        // the abort stands even when the notice could not be built
      }
    }

    void reset() {
      MPI_Request request = MPI_REQUEST_NULL;
      check_mpi(MPI_Ibarrier(control, &request), "MPI_Ibarrier");
      if (!mpi_wait(request, options.timeout, [] {}))
        throw Error("rank " + std::to_string(rank) + ": timed out after " + std::to_string(options.timeout.count()) +
                    " ms waiting for every rank to reset the transport");
      ++generation;
      aborted = false;
      reason.clear();
      poll_notices();  // drops notices of earlier generations
      open = false;
      ops.clear();
      if (agree_pending) {  // abandon the communicator of an unfinished agreement
        (void)agree_buffer.release();
        agree_buffer = std::make_unique<int[]>(2);
        check_mpi(MPI_Comm_dup(control, &agree_comm), "MPI_Comm_dup");
        MPI_Comm_set_errhandler(agree_comm, MPI_ERRORS_RETURN);
        agree_pending = false;
      }
      nccl.abort();
      join_nccl();
    }
  };

  void add(OpKind kind, int peer, const Message& message, const void* src, void* dst) {
    State& s = *s_;
    if (!s.open) throw Error(s.where(s.step) + (kind == OpKind::kSend ? "send" : "recv") + " outside a group");
    if (peer < 0 || peer >= s.size || peer == s.rank) {
      Text t;
      t << "peer " << peer << " is not another rank (ranks are 0.." << s.size - 1 << ")";
      throw Error(s.where(s.step) + t.str());
    }
    s.ops.push_back({kind, peer, message, src, dst, false});
  }

  std::shared_ptr<State> s_;
};

static_assert(Transport<MpiEndpoint>);

/// Settings of one rank of a multi-process pipeline.
struct MpiOptions {
  MathMode math = MathMode::kFp32;  ///< the arithmetic of every GEMM
  int gpu = -1;                     ///< this rank's GPU; -1: its index among the ranks of its machine
  TransportOptions link{};          ///< the timeout of every wait
};

/// One rank of the built-in MLP on a multi-process GPU pipeline: rank d runs
/// pipeline device d with the runtime's executor on the calling thread. Every
/// call is collective over the communicator's ranks.
class MpiMlpPipeline {
 public:
  /// The parts of this rank.
  using Parts = DeviceParts<CudaBackend, MpiEndpoint, GpuMlpChunk>;

  /// Checks that every rank has the same configuration (refusing to start
  /// otherwise), that the program has one device per rank and fits the model,
  /// then joins NCCL and allocates this rank's buffers. Throws pipeweave::Error.
  MpiMlpPipeline(MPI_Comm comm, const Program& program, const MlpSpec& spec, const HostModel& init,
                 const PipelineOptions& options, const MpiOptions& mpi = {})
      : shape_(program.shape), options_(options) {
    MPI_Comm_rank(comm, &rank_);
    int size = 1;
    MPI_Comm_size(comm, &size);
    check_same_config(comm, run_hash(program, spec, options, mpi.math), mpi.link.timeout);
    if (program.shape.devices != size)
      throw Error("mpi pipeline: the program has " + std::to_string(program.shape.devices) + " devices, but " +
                  std::to_string(size) + " ranks were started (one rank per device: mpirun -n " +
                  std::to_string(program.shape.devices) + ")");
    check_mlp_run(program, spec, options);
    if (const VerifyResult r = verify(program); !r) throw Error("mpi pipeline: the program is not valid: " + r.what());
    check_optimizer(options.optimizer);
    const int M = shape_.micro_batches;
    if (options.rows < 1 || options.rows % M != 0)
      throw Error("mpi pipeline: the batch of " + std::to_string(options.rows) + " samples does not split into " +
                  std::to_string(M) + " equal micro-batches");
    const int gpus = gpu_count();
    gpu_ = mpi.gpu >= 0 ? mpi.gpu : local_rank(comm);
    if (gpu_ >= gpus)
      throw Error("mpi pipeline: rank " + std::to_string(rank_) + " needs GPU " + std::to_string(gpu_) +
                  " of its machine, which has " + std::to_string(gpus) +
                  " (NCCL needs one GPU per rank: start at most that many ranks per machine)");
    MpiEndpoint endpoint(comm, gpu_, mpi.link);
    CudaBackend backend(gpu_, {mpi.math});
    endpoint.bind(backend);
    std::vector<GpuMlpChunk> chunks = make_gpu_chunks(backend, shape_, spec, init, rank_);
    parts_ = std::make_unique<Parts>(Parts{std::move(backend), std::move(endpoint), std::move(chunks)});
    executor_ = std::make_unique<DeviceExecutor<CudaBackend, MpiEndpoint, GpuMlpChunk>>(
        *parts_, plan_device(lower(program), rank_), options.rows / M, options.optimizer);
    input_size_ = static_cast<std::size_t>(spec.inputs());
    output_size_ = static_cast<std::size_t>(spec.outputs());
    trace_.shape = shape_;
    trace_.source = TraceSource::kMeasured;
    trace_.time_unit = "us";
    trace_.compute.resize(static_cast<std::size_t>(size));
    trace_.comm.resize(static_cast<std::size_t>(size));
    trace_.peak_activations.assign(static_cast<std::size_t>(size), 0);
  }

  /// One training step on the whole batch (every rank passes the same batch; only
  /// the first and the last stage read it). Returns the loss on every rank.
  /// Throws pipeweave::Error on every rank when one fails or a value is not
  /// finite; the parameters are then as they were.
  StepResult train_step(std::span<const float> inputs, std::span<const float> targets) {
    const auto rows = static_cast<std::size_t>(options_.rows);
    if (inputs.size() != rows * input_size_ || targets.size() != rows * output_size_)
      throw Error("mpi pipeline: expected " + std::to_string(rows * input_size_) + " input and " +
                  std::to_string(rows * output_size_) + " target values, got " + std::to_string(inputs.size()) +
                  " and " + std::to_string(targets.size()));
    ++step_count_;
    if (needs_reset_) {
      parts_->transport.reset();
      needs_reset_ = false;
    }
    bool applied = false;
    try {
      applied = executor_->run(inputs.data(), targets.data(), trace_);
    } catch (const std::exception& e) {
      parts_->transport.abort(e.what());
      needs_reset_ = true;
      throw Error(std::string(e.what()) + " (the step was not applied: every rank kept its parameters)");
    }
    if (!applied) {
      const std::string what = executor_->problem().empty() ? "another rank found a value that is not finite"
                                                            : executor_->problem();
      throw Error("training step " + std::to_string(step_count_) + ": " + what +
                  "; the step was not applied: every rank kept its parameters");
    }
    double loss = 0;
    const int last = last_rank();
    if (rank_ == last) {
      const auto losses = executor_->losses();
      for (float l : losses) loss += l;
      loss /= static_cast<double>(losses.size());
    }
    check_mpi(MPI_Bcast(&loss, 1, MPI_DOUBLE, last, parts_->transport.control()), "MPI_Bcast");
    return {loss};
  }

  /// This rank (pipeline device).
  int rank() const { return rank_; }
  /// This rank's GPU.
  int gpu() const { return gpu_; }
  /// The schedule's shape.
  const ScheduleShape& shape() const { return shape_; }
  /// This rank's plan.
  const DevicePlan& plan() const { return executor_->plan(); }
  /// The last step's trace with this rank's events only.
  const Trace& trace() const { return trace_; }
  /// The backend of this rank.
  CudaBackend& backend() { return parts_->backend; }

  /// Collective: the last step's trace of all ranks, complete on `root` (each
  /// rank's times are from its own start of the step, which the ranks begin
  /// together after an agreement).
  Trace gather_trace(int root = 0) {
    const MPI_Comm comm = parts_->transport.control();
    const auto d = static_cast<std::size_t>(rank_);
    std::vector<double> mine;
    for (const TraceEvent& e : trace_.compute[d])
      mine.insert(mine.end(), {0.0, static_cast<double>(e.step), static_cast<double>(e.action.phase),
                               static_cast<double>(e.action.chunk), static_cast<double>(e.action.micro_batch),
                               static_cast<double>(e.stage), e.start, e.end});
    for (const CommEvent& e : trace_.comm[d])
      mine.insert(mine.end(), {1.0, static_cast<double>(e.step), static_cast<double>(e.sends),
                               static_cast<double>(e.recvs), 0.0, 0.0, e.start, e.end});
    mine.push_back(static_cast<double>(trace_.peak_activations[d]));
    const int size = shape_.devices;
    int count = static_cast<int>(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
    check_mpi(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm), "MPI_Gather");
    int total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    std::vector<double> all(rank_ == root ? static_cast<std::size_t>(total) : 0);
    check_mpi(MPI_Gatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), offsets.data(), MPI_DOUBLE, root,
                          comm),
              "MPI_Gatherv");
    Trace t = trace_;
    if (rank_ != root) return t;
    for (int r = 0; r < size; ++r) {
      auto& compute = t.compute[static_cast<std::size_t>(r)];
      auto& comm_events = t.comm[static_cast<std::size_t>(r)];
      compute.clear();
      comm_events.clear();
      const double* p = all.data() + offsets[static_cast<std::size_t>(r)];
      const double* end = p + counts[static_cast<std::size_t>(r)] - 1;
      for (; p < end; p += 8) {
        if (p[0] == 0.0)
          compute.push_back({r, static_cast<int>(p[1]),
                             Action{static_cast<Phase>(static_cast<int>(p[2])), static_cast<int>(p[3]),
                                    static_cast<int>(p[4])},
                             static_cast<int>(p[5]), p[6], p[7]});
        else
          comm_events.push_back({r, static_cast<int>(p[1]), static_cast<int>(p[2]), static_cast<int>(p[3]), p[6], p[7]});
      }
      t.peak_activations[static_cast<std::size_t>(r)] = static_cast<int>(*end);
    }
    return t;
  }

  /// Collective: the parameters of all ranks gathered into one host model of
  /// `spec`'s shape, complete on `root` (other ranks get their own layers only).
  HostModel gather_weights(const MlpSpec& spec, int root = 0) {
    const MPI_Comm comm = parts_->transport.control();
    HostModel model;
    model.layers.resize(static_cast<std::size_t>(spec.layers()));
    for (const GpuMlpChunk& chunk : parts_->chunks) chunk.inner().download(parts_->backend, model);
    parts_->backend.synchronize();
    for (int d = 0; d < shape_.devices; ++d) {
      if (d == root) continue;
      for (int c = 0; c < shape_.chunks; ++c) {
        const LayerRange range = chunk_layers(shape_, spec.layers(), d, c);
        for (int layer = range.begin; layer < range.end; ++layer) {
          auto& p = model.layers[static_cast<std::size_t>(layer)];
          const int n = static_cast<int>(layer_parameters(spec, layer));
          if (rank_ == d)
            check_mpi(MPI_Send(p.data(), n, MPI_FLOAT, root, layer, comm), "MPI_Send");
          else if (rank_ == root) {
            p.resize(static_cast<std::size_t>(n));
            check_mpi(MPI_Recv(p.data(), n, MPI_FLOAT, d, layer, comm, MPI_STATUS_IGNORE), "MPI_Recv");
          }
        }
      }
    }
    return model;
  }

 private:
  int last_rank() const { return shape_.device_of_stage(shape_.stages() - 1); }

  ScheduleShape shape_;
  PipelineOptions options_;
  int rank_ = 0, gpu_ = 0;
  std::unique_ptr<Parts> parts_;
  std::unique_ptr<DeviceExecutor<CudaBackend, MpiEndpoint, GpuMlpChunk>> executor_;
  std::size_t input_size_ = 0, output_size_ = 0;
  Trace trace_;
  bool needs_reset_ = false;
  long long step_count_ = 0;
};

}  // namespace pipeweave::cuda
