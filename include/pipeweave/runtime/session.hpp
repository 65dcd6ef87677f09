#pragma once
/// \file
/// The device session: everything one device does in a training run, whatever
/// hosts it. It owns the device's parts (backend, transport endpoint, chunks), its
/// plan and buffers, the loss (on the device of the last virtual stage), the
/// optimizer state, the step loop, the finiteness agreement, abort and reset, and
/// the context of its errors. Hosts are thin: runtime/pipeline.hpp runs one
/// session per thread in one process, mpi/pipeline.hpp one per process.
///
/// A step walks the device's lowered steps. A step's group of sends and receives
/// runs first (sends of tensors computed earlier, receives of tensors needed now or
/// later), then its action, dispatched on its kind (plan.hpp declares what each
/// kind needs):
/// - F(c, m): the input is micro-batch m of the batch (virtual stage 0), a
///   received activation, or the output of the previous stage on this device; the
///   chunk runs forward and keeps what backward needs; at the last virtual stage
///   the loss and its gradient are computed at once.
/// - B(c, m): the output gradient is the loss gradient, a received gradient, or
///   the input gradient of the next stage on this device; the chunk runs backward
///   and adds its parameter gradients; its input gradient (not at stage 0) waits
///   for a later group or the previous local stage.
/// - I(c, m) and W(c, m), a backward split in two (SplitChunk): I reads the
///   output gradient as B does and writes the input gradient; W, later, adds the
///   parameter gradients and ends the micro-batch.
/// - An overlapped pair, (F;B) or (F;I): a forward marked `overlaps_next` and the
///   next step's backward start together and the pair ends when both have. The
///   backward runs on the backend's side (OverlapBackend: on a GPU its second
///   stream, ordered after the main stream's work so far by an event) from the
///   device's second thread (SideThread), the forward here; then the main stream
///   waits for the side's. The halves touch different buffers (plan.hpp), and a
///   chunk's backwards still run in program order, so the gradient sums, and the
///   training, stay bit for bit those of running the pair's halves one by one.
/// - R(c), with D replicas: chunk c's gradients are summed over the D devices
///   that hold it (runtime/replicas.hpp). The device hands the reduction to its
///   reducer, a side backend driven by a thread of its own (QueueThread), and goes
///   on with its next action: the reduction starts once every action before it is
///   done, runs beside the rest of the program, and the reductions of a device run
///   in program order, the same on every replica. The optimizer waits for them. A
///   backend without a side() runs R on the device's thread. An in-place
///   collective (the CPU's HostReplicaGroup, NCCL's in cuda/replicas.hpp) sums the
///   gradients where they lie; any other gets a host copy of them. A deferred
///   collective (across processes: mpi/replicas.hpp) is started by R on the
///   device's thread and moves the gradients while the device goes on; the
///   optimizer ends it.
/// After the program the device counts its non-finite gradients (and losses); the
/// devices agree, and only when all are finite does every device apply one
/// optimizer step on the gradients averaged over the M micro-batches (over the
/// D x M of all replicas in data parallelism, where each chunk's R has summed its
/// gradients over the D devices that hold it; runtime/replicas.hpp). A step thus
/// either completes or leaves every parameter, and the optimizer state, as it was.
///
/// Buffers come from the plan and are allocated when the session is made; a step
/// allocates nothing.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "pipeweave/runtime/side_thread.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What one device owns: its backend, its transport endpoint and its V chunks;
/// chunks[c] is virtual stage shape.stage_of(d, c).
template <Backend B, Transport T, class C>
  requires Chunk<C, B>
struct DeviceParts {
  B backend;              ///< the device's memory and compute
  T transport;            ///< its end of the P2P fabric
  std::vector<C> chunks;  ///< [c]: the device's local chunk c
};

/// The most samples a batch may have.
inline constexpr int kMaxRows = 1 << 24;

/// Settings of a training run, the same on every host and backend: the batch,
/// the update rule `O` (a model of the Optimizer concept) and how long waits may
/// take. What only one backend has is in its own options, passed beside these
/// (cpu::CpuOptions, cuda::CudaOptions). The built-in rules are the default
/// (model/defaults.hpp: PipelineOptions = BasicPipelineOptions<OptimizerConfig>).
template <class O>
struct BasicPipelineOptions {
  int rows = 0;   ///< samples per batch; a multiple of D x M (each replica's shard splits into M micro-batches)
  O optimizer{};  ///< the update applied after every step
  std::chrono::milliseconds timeout = kDefaultTimeout;  ///< the longest any wait may take (a match, a transfer, an agreement)
  std::chrono::microseconds spin = kDefaultSpin;  ///< how long a device thread waiting for another of its process spins before it parks
  int replicas = 1;  ///< data-parallel replicas D of the pipeline, each on its shard of the batch (runtime/pipeline.hpp)
  RankLayout layout = RankLayout::kDpAdjacent;  ///< the multi-process host with replicas: which rank holds which (replica, device)
};
/// The outcome of one training step.
struct StepResult {
  double loss = 0;  ///< mean of the micro-batch losses
};

/// Throws pipeweave::Error, starting with `who`, unless a batch of `rows` samples
/// splits into `micro_batches` equal micro-batches within kMaxRows.
inline void check_batch_rows(int rows, int micro_batches, std::string_view who) {
  if (rows > kMaxRows) throw_error({}, who, ": a batch of ", rows, " samples is more than the limit of ", kMaxRows);
  if (rows < 1 || micro_batches < 1 || rows % micro_batches != 0)
    throw_error({}, who, ": the batch of ", rows, " samples does not split into ", micro_batches,
                " equal micro-batches of at least 1 sample");
}

/// The checks of a run before any device is built, the same on every host:
/// the program verifies, the update rule's hyper-parameters are in range, and
/// the batch splits into the micro-batches. Returns the program's lowering, the
/// one the run uses (lower_checked(): one lowering, verified). Throws
/// pipeweave::Error starting with `who`.
template <class O>
LoweredProgram check_run(const Program& program, const BasicPipelineOptions<O>& options, std::string_view who) {
  LoweredProgram lowered;
  try {
    lowered = lower_checked(program);
  } catch (const Error& e) {
    throw_error({}, who, ": the program is not valid: ", e.what());
  }
  check_optimizer(options.optimizer);
  if (options.replicas < 1 || options.replicas > 4096)
    throw_error({}, who, ": replicas must be 1..4096, got ", options.replicas);
  if (options.replicas > 1 && options.rows % options.replicas != 0)
    throw_error({}, who, ": the batch of ", options.rows, " samples does not split into ", options.replicas,
                " equal shards, one per replica");
  if (options.replicas > 1 && !has_grad_reduce(program))
    throw_error({}, who, ": ", options.replicas, " replicas, but the program has no gradient reduction R: use "
                "with_grad_reduce(program)");
  check_batch_rows(options.rows / options.replicas, program.shape.micro_batches, who);
  return lowered;
}

/// Throws pipeweave::Error unless a batch of `rows` samples has rows x
/// input_size inputs and rows x target_size targets (a size of 0 is not checked:
/// a device that does not read them).
inline void check_batch(std::span<const float> inputs, std::span<const float> targets, int rows, std::size_t input_size,
                        std::size_t target_size) {
  const auto n = static_cast<std::size_t>(rows);
  if ((input_size > 0 && inputs.size() != n * input_size) || (target_size > 0 && targets.size() != n * target_size))
    throw_error({}, "train_step: expected ", n * input_size, " input and ", n * target_size, " target values (", rows,
                " samples), got ", inputs.size(), " and ", targets.size());
}

/// Throws pipeweave::Error, starting with `who`, unless device d's parts fit the
/// shape: V chunks, and the endpoint of device d of P.
template <Backend B, Transport T, class C>
void check_parts(const DeviceParts<B, T, C>& parts, const ScheduleShape& s, int device, std::string_view who) {
  const int chunks = static_cast<int>(parts.chunks.size());
  if (chunks != s.chunks)
    throw_error({}, who, ": device ", device, " has ", chunks, " chunks, but the program has ", s.chunks,
                " per device");
  if (parts.transport.device() != device || parts.transport.devices() != s.devices)
    throw_error({}, who, ": the transport of device ", device, " is device ", parts.transport.device(), " of ",
                parts.transport.devices(), "; the program has ", s.devices, " devices");
}

/// A measured trace of `shape` with no event yet (times in microseconds).
inline Trace measured_trace(const ScheduleShape& shape) { return empty_trace(shape, TraceSource::kMeasured, "us"); }

/// The end of the error of a step that was not applied: "the step was not
/// applied: every device kept its parameters" (`units`: "device" or "rank").
inline std::string not_applied(std::string_view units) {
  return error_text({}, "the step was not applied: every ", units, " kept its parameters");
}

namespace detail {

/// B::Mark for an OverlapBackend (which has one); a placeholder for any other.
template <class B>
struct MarkType {
  using type = char;
};
template <OverlapBackend B>
struct MarkType<B> {
  using type = typename B::Mark;
};
template <class B>
using MarkOf = typename MarkType<B>::type;

}  // namespace detail

/// Where a device's replica group is (data parallelism): the group of the D
/// devices that hold the same pipeline device, and this one's replica index;
/// no group for a run of one replica.
struct ReplicaLink {
  ReplicaCollective* group = nullptr;
  int replica = 0;
};

/// One device's part of a training run (see the file comment).
template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class DeviceSession {
 public:
  /// The parts the session owns.
  using Parts = DeviceParts<B, T, C>;

  /// Neither copied nor moved: its reducer thread holds `this` (sessions live behind a unique_ptr).
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  /// Takes the device's parts, allocates every buffer of `plan` for micro-batches
  /// of `rows` samples, reserves the chunks' stash slots and the optimizer state.
  /// `loss` is needed on the device of the last virtual stage only.
  DeviceSession(Parts parts, DevicePlan plan, int rows, const O& optimizer, std::optional<L> loss,
                ReplicaLink replicas = {})
      : parts_(std::move(parts)), plan_(std::move(plan)), rows_(rows), loss_(std::move(loss)), link_(replicas) {
    B& b = parts_.backend;
    const ScheduleShape& s = plan_.shape;
    const auto M = static_cast<std::size_t>(s.micro_batches);
    last_stage_ = s.stages() - 1;
    if constexpr (!SplitChunk<C, B>) {
      if (plan_.split)
        throw_error({.device = plan_.device}, "the schedule splits backwards into I and W, but the chunk offers only a "
                    "full backward (a SplitChunk has backward_input, backward_weight and reserve_split; see "
                    "runtime/backend.hpp)");
    }
    bind_thread(b);  // the device's own thread, on which the session is made
    if (plan_.pairs) {
      if constexpr (OverlapBackend<B>) {
        side_.emplace(b.side());
        side_thread_ = std::make_unique<SideThread>();
        auto bind = [this] { bind_thread(*side_); };  // once, before the thread runs any half of a pair
        side_thread_->start(bind);
        if (const std::exception_ptr e = side_thread_->finish()) std::rethrow_exception(e);
      } else {
        throw_error({.device = plan_.device}, "the schedule runs overlapped pairs, but the backend has no second "
                    "stream to run a pair's backward on (an OverlapBackend has side() and wait_for(); see "
                    "runtime/backend.hpp)");
      }
    }
    for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
      in_size_.push_back(parts_.chunks[c].input_size());
      out_size_.push_back(parts_.chunks[c].output_size());
      parts_.chunks[c].reserve(b, std::max(1, plan_.slots[c]), rows_);
      if constexpr (SplitChunk<C, B>) {
        if (plan_.split) parts_.chunks[c].reserve_split(b, std::max(1, plan_.slots[c]), rows_);
      }
    }
    buffers_.reserve(plan_.buffers.size());
    for (const PlannedBuffer& pb : plan_.buffers) buffers_.push_back(b.allocate(floats(width(pb.chunk, pb.role))));
    for (const PlannedOp& op : plan_.ops) {
      const bool act = op.tensor.kind == TensorKind::kActivation;
      const BufferRole role = op.kind == OpKind::kSend ? (act ? BufferRole::kOutput : BufferRole::kInputGrad)
                                                       : (act ? BufferRole::kInput : BufferRole::kOutputGrad);
      messages_.push_back(Message{op.tensor, floats(width(op.chunk, role)) * sizeof(float)});
    }
    if (plan_.first_stage) {
      input_size_ = in_size_[static_cast<std::size_t>(s.chunk_of_stage(0))];
      inputs_ = b.allocate(floats(input_size_) * M);
    }
    if (plan_.last_stage) {
      if (!loss_) throw_error({.device = plan_.device}, "holds the last virtual stage but was given no loss");
      output_size_ = out_size_[static_cast<std::size_t>(s.chunk_of_stage(last_stage_))];
      target_size_ = loss_->target_size(output_size_);
      loss_->reserve(b, rows_, output_size_);
      targets_ = b.allocate(floats(target_size_) * M);
      losses_ = b.allocate(M);
    }
    for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
      for (const ParameterView& p : std::span<const ParameterView>(parts_.chunks[c].parameters())) {
        params_.push_back(p);
        param_chunk_.push_back(static_cast<int>(c));
      }
    }
    check_.emplace(b, params_, plan_.last_stage ? M : 0);
    optimizer_.emplace(b, params_, optimizer);
    if (replica_count() > 1) start_reductions();
    compute_marks_.reserve(plan_.steps.size());
    comm_marks_.reserve(plan_.steps.size());
    b.synchronize();
  }

  /// The session of device `device` of the lowered program: plans the device,
  /// splits batches of options.rows samples into its micro-batches, and takes
  /// `loss` when the device holds the last virtual stage.
  static std::unique_ptr<DeviceSession> make(Parts parts, const LoweredProgram& lp, int device,
                                             const BasicPipelineOptions<O>& options, L& loss, ReplicaLink replicas = {}) {
    const ScheduleShape& s = lp.shape;
    const bool last = s.device_of_stage(s.stages() - 1) == device;
    return std::make_unique<DeviceSession>(std::move(parts), plan_device(lp, device),
                                           options.rows / (s.micro_batches * std::max(1, options.replicas)),
                                           options.optimizer, last ? std::optional<L>(std::move(loss)) : std::nullopt,
                                           replicas);
  }

  /// Runs one training step; `inputs` and `targets` are the whole batch on the
  /// host (read only by the devices of the first and the last virtual stage).
  /// Returns true when the update was applied; false when some device found a
  /// non-finite value (problem() says what this device found). Throws
  /// pipeweave::Error, naming the device, step and action, when this device fails;
  /// the host then aborts the transport (abort()) so that every device stops.
  bool run(const float* inputs, const float* targets) {
    B& b = parts_.backend;
    T& net = parts_.transport;
    step_ = -1;
    action_ = nullptr;
    problem_.clear();
    problem_is_loss_ = false;
    net.agree(true);  // start together: the trace's origin
    b.reset_clock();
    if (side_) side_->reset_clock();
    if (reducer_) reducer_->reset_clock();
    for (const ParameterView& p : params_) b.fill(p.gradient, p.count, 0.0f);
    if (plan_.first_stage) b.upload(inputs, inputs_.data(), inputs_.size());
    if (plan_.last_stage) b.upload(targets, targets_.data(), targets_.size());
    compute_marks_.clear();
    comm_marks_.clear();
    started_.clear();
    posted_ = 0;
    kept_ = {};
    for (std::size_t t = 0; t < plan_.steps.size(); ++t) {
      const PlannedStep& st = plan_.steps[t];
      step_ = static_cast<int>(t);
      if (st.op_count > 0) exchange(st);
      if (!st.has_compute) continue;
      if (st.compute.action.overlaps_next)
        pair(st.compute, plan_.steps[++t].compute);  // the plan checked that step t + 1 is the backward
      else if (reduce_thread_ && is_collective(st.compute.action.phase))
        post_reduction(st.compute);
      else
        compute(st.compute);
    }
    action_ = nullptr;
    finish_reductions();
    // Agree that every value is finite before anyone updates anything.
    check_->read(b, losses_.data());
    bool all_ok = net.agree(local_problem());
    if (link_.group != nullptr) all_ok = link_.group->agree(link_.replica, all_ok);  // and over the replicas
    if (all_ok) {
      optimizer_->step(b, 1.0f / static_cast<float>(plan_.shape.micro_batches * replica_count()));
      b.synchronize();
    }
    return all_ok;
  }

  /// Writes this device's events of the last step into `trace` (its compute,
  /// gradient-reduction and P2P events, in microseconds from the step's start,
  /// and its peak of kept micro-batches). Call after run() on the device's thread.
  void record(Trace& trace) const {
    const B& b = parts_.backend;
    const int d = plan_.device;
    auto& compute = trace.compute[static_cast<std::size_t>(d)];
    auto& comm = trace.comm[static_cast<std::size_t>(d)];
    auto& collective = trace.collective[static_cast<std::size_t>(d)];
    compute.clear();
    comm.clear();
    collective.clear();
    for (const ComputeMark& m : compute_marks_) {
      const PlannedCompute& pc = plan_.steps[static_cast<std::size_t>(m.step)].compute;
      const B& clock = m.lane == Lane::kSide ? *side_ : m.lane == Lane::kReducer ? *reducer_ : b;
      (is_collective(pc.action.phase) ? collective : compute)
          .push_back({d, m.step, pc.action, pc.stage, clock.elapsed_us(m.start), clock.elapsed_us(m.end)});
    }
    for (const CommMark& m : comm_marks_)
      comm.push_back({d, m.step, m.sends, m.recvs, b.elapsed_us(m.start), b.elapsed_us(m.end)});
    trace.peak_activations[static_cast<std::size_t>(d)] = kept_.peak_stashes;
    if (trace.peak_memory.size() == trace.peak_activations.size())
      trace.peak_memory[static_cast<std::size_t>(d)] = kept_.peak_memory;
  }

  /// Stops every wait of every device with an error quoting `reason`.
  void abort(std::string_view reason) noexcept {
    parts_.transport.abort(reason);
    if (link_.group != nullptr) link_.group->abort(reason);
  }
  /// After a failed step (the run aborted): waits until the device's reducer has
  /// ended what it was given, so that no sum still touches any device's memory.
  void settle() {
    if (reduce_thread_) (void)reduce_thread_->drain();
  }
  /// Collective: makes the transport usable again after a failed step (after
  /// waiting for this device's reductions, which the abort has ended).
  void reset() {
    if (reduce_thread_) (void)reduce_thread_->drain();
    reduce_marks_.clear();
    parts_.transport.reset();
  }

  /// What this device found non-finite in the last step (empty when nothing).
  const std::string& problem() const { return problem_; }
  /// True when problem() is about the loss (which explains every other finding).
  bool problem_is_loss() const { return problem_is_loss_; }
  /// The micro-batch losses of the last step (the last virtual stage's device only).
  std::span<const float> losses() const { return check_->losses(); }
  /// The mean of losses().
  double loss() const {
    double sum = 0;
    for (float l : losses()) sum += l;
    return losses().empty() ? 0.0 : sum / static_cast<double>(losses().size());
  }
  /// The plan this device runs.
  const DevicePlan& plan() const { return plan_; }
  /// Floats per sample of the batch's inputs this device reads (0: none, it does
  /// not hold the first virtual stage).
  std::size_t input_size() const { return input_size_; }
  /// Floats per sample of the batch's targets this device reads (0: none, it does
  /// not hold the last virtual stage).
  std::size_t target_size() const { return target_size_; }
  /// The device's parts.
  Parts& parts() { return parts_; }
  /// The device's parts.
  const Parts& parts() const { return parts_; }
  /// Where the device is: its step and action while one runs.
  Where where() const {
    Where w{.device = plan_.device, .step = step_};
    if (action_ != nullptr) {
      w.action = action_->action;
      w.stage = action_->stage;
    }
    return w;
  }
  /// The parameters of each local chunk, copied to the host: [chunk] = the floats
  /// of its parameter tensors in order.
  std::vector<std::vector<float>> chunk_parameters() {
    B& b = parts_.backend;
    std::vector<std::vector<float>> out(parts_.chunks.size());
    for (std::size_t k = 0; k < params_.size(); ++k) {
      auto& v = out[static_cast<std::size_t>(param_chunk_[k])];
      const std::size_t at = v.size();
      v.resize(at + params_[k].count);
      b.synchronize();
      b.download(params_[k].value, v.data() + at, params_[k].count);
    }
    b.synchronize();
    return out;
  }

  /// Copies local chunk c's parameters and the update rule's state for them to
  /// `out` on the host (reusing its memory).
  void copy_chunk_state(int c, StageState& out) {
    const std::span<const ParameterView> views = chunk_views(c);
    const std::size_t first = static_cast<std::size_t>(views.data() - params_.data());
    download_stage(parts_.backend, views, optimizer_->buffers(),
                   [&](std::size_t p, int k) { return optimizer_->buffer(first + p, k); }, out);
  }
  /// Throws pipeweave::Error, naming `what`, unless `state` fits local chunk c.
  void check_chunk_state(int c, const StageState& state, std::string_view what) const {
    check_stage_state(state, chunk_views(c), optimizer_->buffers(), what);
  }
  /// Sets local chunk c's parameters and rule state from `state` (checked by check_chunk_state).
  void set_chunk_state(int c, const StageState& state) {
    const std::span<const ParameterView> views = chunk_views(c);
    const std::size_t first = static_cast<std::size_t>(views.data() - params_.data());
    upload_stage(parts_.backend, state, views, [&](std::size_t p, int k) { return optimizer_->buffer(first + p, k); });
  }
  /// Optimizer steps applied so far.
  long long updates() const { return optimizer_->steps(); }
  /// Sets the optimizer steps applied so far (a resumed run).
  void set_updates(long long n) { optimizer_->set_steps(n); }

 private:
  enum class Lane : char { kMain, kSide, kReducer };  // the backend an action ran on
  struct ComputeMark {
    int step;
    std::size_t start, end;  // stamps of that backend's clock (all count from the main one's origin)
    Lane lane;
  };
  struct CommMark {
    int step, sends, recvs;
    std::size_t start, end;
  };

  // The parameter tensors of local chunk c, a contiguous run of params_.
  std::span<const ParameterView> chunk_views(int c) const {
    const auto first = std::find(param_chunk_.begin(), param_chunk_.end(), c);
    const auto count = std::count(param_chunk_.begin(), param_chunk_.end(), c);
    return std::span<const ParameterView>(params_).subspan(static_cast<std::size_t>(first - param_chunk_.begin()),
                                                           static_cast<std::size_t>(count));
  }
  std::size_t floats(std::size_t width) const { return width * static_cast<std::size_t>(rows_); }
  std::size_t width(int chunk, BufferRole role) const {
    const auto c = static_cast<std::size_t>(chunk);
    return role == BufferRole::kInput || role == BufferRole::kInputGrad ? in_size_[c] : out_size_[c];
  }
  float* buffer(int id) { return buffers_[static_cast<std::size_t>(id)].data(); }

  // The group of one step.
  void exchange(const PlannedStep& st) {
    B& b = parts_.backend;
    T& net = parts_.transport;
    const std::size_t start = b.time_stamp();
    net.group_begin(step_);
    for (int i = st.first_op; i < st.first_op + st.op_count; ++i) {
      const PlannedOp& op = plan_.ops[static_cast<std::size_t>(i)];
      const Message& m = messages_[static_cast<std::size_t>(i)];
      if (op.kind == OpKind::kSend)
        net.send(op.peer, m, buffer(op.buffer));
      else
        net.recv(op.peer, m, buffer(op.buffer));
    }
    net.group_end();
    comm_marks_.push_back({step_, st.sends, st.recvs, start, b.time_stamp()});
  }

  // The action of one step.
  void compute(const PlannedCompute& pc) {
    B& b = parts_.backend;
    action_ = &pc;
    const std::size_t start = b.time_stamp();
    run_action(b, pc, step_);
    kept_.after(pc.action.phase);
    compute_marks_.push_back({step_, start, b.time_stamp(), Lane::kMain});
  }

  // An overlapped pair: the forward `f` of this step here, at once with the
  // backward `bw` of the next on the side (see the file comment). Both halves
  // end before anything fails out of it; the forward's error comes first.
  void pair(const PlannedCompute& f, const PlannedCompute& bw) {
    if constexpr (OverlapBackend<B>) {
      B& b = parts_.backend;
      B& side = *side_;
      action_ = &f;
      side.wait_for(b);  // the side's work follows the group's receives and every earlier action
      std::size_t side_start = 0, side_end = 0;
      auto backward_half = [&] {
        side_start = side.time_stamp();
        run_action(side, bw, step_ + 1);
        side_end = side.time_stamp();
      };
      side_thread_->start(backward_half);
      const std::size_t start = b.time_stamp();
      std::exception_ptr error;
      try {
        run_action(b, f, step_);
      } catch (...) {
        error = std::current_exception();
      }
      const std::size_t end = b.time_stamp();
      const std::exception_ptr side_error = side_thread_->finish();
      // Later work (the groups that send the pair's outputs; after a failure, the
      // next step's zeroing of the gradients) follows both halves.
      try {
        b.wait_for(side);
      } catch (...) {
        if (!error && !side_error) throw;
      }
      if (error) std::rethrow_exception(error);
      if (side_error) std::rethrow_exception(side_error);
      kept_.after(f.action.phase);  // both halves' stashes count at once, as the simulator counts them
      kept_.after(bw.action.phase);
      compute_marks_.push_back({step_, start, end, Lane::kMain});
      compute_marks_.push_back({step_ + 1, side_start, side_end, Lane::kSide});
    }
  }

  // Runs one action on `backend` (the device's, or the side for a pair's
  // backward), dispatched on its kind; an error names the step and the action.
  void run_action(B& backend, const PlannedCompute& pc, int step) {
    try {
      C& chunk = parts_.chunks[static_cast<std::size_t>(pc.action.chunk)];
      const ChunkCall call{pc.action.micro_batch, pc.slot, rows_};
      switch (pc.action.phase) {
        case Phase::kForward:
          forward(backend, chunk, call, pc);
          break;
        case Phase::kBackward:
          chunk.backward(backend, call, buffer(pc.dy), output_or_null(pc.dx));
          break;
        case Phase::kBackwardInput:
          if constexpr (SplitChunk<C, B>) chunk.backward_input(backend, call, buffer(pc.dy), output_or_null(pc.dx));
          break;
        case Phase::kBackwardWeight:
          if constexpr (SplitChunk<C, B>) chunk.backward_weight(backend, call);
          break;
        case Phase::kReduce:
          reduce_gradients(backend, pc.action.chunk);
          break;
      }
    } catch (const std::exception& e) {
      // A collective's error names the device and the replica itself: the prefix here says them once.
      std::string_view what = without_prefix(e.what(), error_text({.device = plan_.device}));
      if (replica_count() > 1) what = without_prefix(what, "replica " + std::to_string(link_.replica) + ": ");
      throw_error(Where{.device = plan_.device, .step = step, .action = pc.action, .stage = pc.stage}, what);
    }
  }

  void forward(B& b, C& chunk, const ChunkCall& call, const PlannedCompute& pc) {
    const auto mb = static_cast<std::size_t>(call.micro_batch);
    const float* x = pc.x == kBatchInput ? inputs_.data() + mb * floats(input_size_) : buffer(pc.x);
    float* y = buffer(pc.y);
    chunk.forward(b, call, x, y);
    if (pc.stage == last_stage_)
      loss_->forward_backward(b, LossCall{call.micro_batch, rows_, output_size_}, y,
                              targets_.data() + mb * floats(target_size_), buffer(pc.dy), losses_.data() + mb);
  }

  float* output_or_null(int id) { return id == kNoBuffer ? nullptr : buffer(id); }

  int replica_count() const { return link_.group != nullptr ? link_.group->replicas() : 1; }

  // R: local chunk c's gradients summed over the replicas (runtime/replicas.hpp),
  // through a host copy (the backend's memory may be a GPU's); one replica: its
  // gradients are the sum already. `b` is the reducer (its own thread and stream)
  // or, for a backend without a side(), the device's.
  void reduce_gradients(B& b, int c) {
    if (replica_count() == 1) return;
    Staging& host = staging_[static_cast<std::size_t>(c)];
    if (in_place_ != nullptr) {  // the sum runs on the gradients where they are
      in_place_->all_reduce_on(b, link_.replica, c, host.tensors);
      return;
    }
    const std::span<const ParameterView> views = chunk_views(c);
    std::size_t at = 0;
    b.synchronize();  // the chunk's backwards are done
    for (const ParameterView& p : views) {
      b.download(p.gradient, host.floats.data() + at, p.count);
      at += p.count;
    }
    b.synchronize();
    link_.group->all_reduce(link_.replica, c, host.tensors);
    if (link_.group->deferred())
      started_.push_back(c);  // its sum lands in finish_reductions()
    else
      take_sum(b, c);
  }

  // Copies local chunk c's reduced gradients from its host copy to the backend.
  void take_sum(B& b, int c) {
    const Staging& host = staging_[static_cast<std::size_t>(c)];
    std::size_t at = 0;
    for (const ParameterView& p : chunk_views(c)) {
      b.upload(host.floats.data() + at, p.gradient, p.count);
      at += p.count;
    }
    b.synchronize();
  }

  // With replicas: each chunk's tensors for the collective (its gradients
  // themselves for an in-place collective, a host copy otherwise); with a backend
  // that has a side(), the reducer (a side backend) and its thread, which run the
  // reductions beside the device's compute, in program order (the same order on
  // every replica).
  void start_reductions() {
    in_place_ = dynamic_cast<InPlaceReplicaCollective<B>*>(link_.group);
    staging_.resize(parts_.chunks.size());
    for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
      Staging& host = staging_[c];
      const std::span<const ParameterView> views = chunk_views(static_cast<int>(c));
      if (in_place_ != nullptr) {
        for (const ParameterView& p : views) host.tensors.emplace_back(p.gradient, p.count);
        continue;
      }
      std::size_t n = 0;
      for (const ParameterView& p : views) n += p.count;
      host.floats.assign(n, 0.0f);
      n = 0;
      for (const ParameterView& p : views) {
        host.tensors.emplace_back(host.floats.data() + n, p.count);
        n += p.count;
      }
    }
    if (link_.group->deferred()) {
      if (in_place_ != nullptr)
        throw_error({.device = plan_.device}, "a replica collective is either deferred or in place, not both");
      return;  // the device's thread starts and ends them
    }
    if constexpr (OverlapBackend<B>) {
      for (std::size_t t = 0; t < plan_.steps.size(); ++t)
        if (plan_.steps[t].has_compute && is_collective(plan_.steps[t].compute.action.phase))
          reduce_steps_.push_back(static_cast<int>(t));
      const std::size_t reductions = reduce_steps_.size();
      reduce_marks_.reserve(reductions);
      reduce_ready_.resize(reductions);
      reducer_.emplace(parts_.backend.side());
      reduce_thread_ = std::make_unique<QueueThread>([this](int k) { reduce_step(k); }, reductions);
      reduce_thread_->post(kBindReducer);  // binds the thread to the device before any reduction
      if (const std::exception_ptr e = reduce_thread_->drain()) std::rethrow_exception(e);
    }
  }

  // On the reducer's thread: the device's reduction number k of the step (or the
  // thread's binding). It starts after the point the device marked when it
  // reached the R.
  void reduce_step(int k) {
    if (k == kBindReducer) {
      bind_thread(*reducer_);
      return;
    }
    const int step = reduce_steps_[static_cast<std::size_t>(k)];
    const PlannedCompute& pc = plan_.steps[static_cast<std::size_t>(step)].compute;
    if constexpr (OverlapBackend<B>) reducer_->wait_for(reduce_ready_[static_cast<std::size_t>(k)]);
    const std::size_t start = reducer_->time_stamp();
    run_action(*reducer_, pc, step);
    reduce_marks_.push_back({step, start, reducer_->time_stamp(), Lane::kReducer});
  }

  // Hands the reduction `pc` (this step's) to the reducer: it starts after every
  // action enqueued so far (marked here; the reducer's thread takes the wait when
  // it takes the R, so a reduction queued behind another does not also wait for
  // the device's later work), and the device goes on at once.
  void post_reduction(const PlannedCompute& pc) {
    action_ = &pc;
    const int k = posted_++;
    if constexpr (OverlapBackend<B>) parts_.backend.mark(reduce_ready_[static_cast<std::size_t>(k)]);
    kept_.after(pc.action.phase);
    reduce_thread_->post(k);
  }

  // Waits for the device's reductions (the optimizer reads their sums); the
  // first that failed is the step's error. A deferred collective's reductions
  // end here: each R's event then lasts from its start to their end.
  void finish_reductions() {
    if (!started_.empty()) {
      B& b = parts_.backend;
      link_.group->complete(link_.replica);
      for (const int c : started_) take_sum(b, c);
      const std::size_t end = b.time_stamp();
      for (ComputeMark& m : compute_marks_)
        if (is_collective(plan_.steps[static_cast<std::size_t>(m.step)].compute.action.phase)) m.end = end;
      started_.clear();
    }
    if (!reduce_thread_) return;
    // The device's own work first, in a wait that polls the transport (a GPU
    // transfer that stalls is caught there, not in a reducer waiting behind it).
    parts_.backend.synchronize();
    const std::exception_ptr e = reduce_thread_->drain();
    if (e) std::rethrow_exception(e);
    if constexpr (OverlapBackend<B>) parts_.backend.wait_for(*reducer_);
    compute_marks_.insert(compute_marks_.end(), reduce_marks_.begin(), reduce_marks_.end());
    reduce_marks_.clear();
  }

  // Builds problem_ from the counts and losses read back; true when all is finite.
  bool local_problem() {
    const int d = plan_.device;
    const std::span<const float> losses = check_->losses(), counts = check_->counts();
    for (std::size_t m = 0; m < losses.size(); ++m) {
      if (is_finite(losses[m])) continue;
      problem_ = error_text({.device = d}, "the loss of micro-batch ", m, " is ",
                            losses[m] != losses[m] ? "nan" : "infinite");
      problem_is_loss_ = true;
      return false;
    }
    for (std::size_t k = 0; k < counts.size(); ++k) {
      if (counts[k] == 0.0f) continue;
      const int c = param_chunk_[k];
      problem_ = error_text({.device = d}, static_cast<long long>(counts[k]), " gradient values of chunk ", c,
                            " (stage ", plan_.shape.stage_of(d, c), ") are not finite");
      return false;
    }
    return true;
  }

  Parts parts_;
  DevicePlan plan_;
  int rows_;  // samples per micro-batch
  std::optional<L> loss_;
  struct Staging {
    std::vector<float> floats;               // the host copy of a chunk's gradients that its reduction sums
    std::vector<std::span<float>> tensors;   // ... its tensors in it (in place: the gradients themselves)
  };
  static constexpr int kBindReducer = -1;  // the reducer thread's first item: bind it to the device
  ReplicaLink link_;                // data parallelism: the device's replica group
  InPlaceReplicaCollective<B>* in_place_ = nullptr;  // ... the group, where it sums in the backend's memory
  std::vector<Staging> staging_;    // ... [local chunk]
  std::vector<int> started_;        // ... the chunks whose deferred sums were started this step, in order
  int last_stage_ = 0;
  std::size_t input_size_ = 0, output_size_ = 0, target_size_ = 0;  // per sample
  std::vector<std::size_t> in_size_, out_size_;                      // [chunk], per sample
  std::vector<typename B::Buffer> buffers_;
  std::vector<Message> messages_;  // [planned op]
  typename B::Buffer inputs_, targets_, losses_;
  std::vector<ParameterView> params_;
  std::vector<int> param_chunk_;
  std::optional<FiniteCheck<B>> check_;
  std::optional<OptimizerState<B, O>> optimizer_;
  std::vector<ComputeMark> compute_marks_;
  std::vector<CommMark> comm_marks_;
  std::optional<B> side_;                    // with overlapped pairs: the backend their backwards run on
  std::unique_ptr<SideThread> side_thread_;  // ... from this thread
  std::optional<B> reducer_;                 // with replicas: the backend the reductions run on
  std::vector<ComputeMark> reduce_marks_;    // ... their marks (written on its thread)
  std::vector<int> reduce_steps_;            // ... [k]: the step of the device's reduction number k
  std::vector<detail::MarkOf<B>> reduce_ready_;  // ... [k]: where the device's work stood when it reached it
  int posted_ = 0;                           // ... how many were posted in this step
  std::unique_ptr<QueueThread> reduce_thread_;  // ... from this thread (last: it reads the members above)
  KeptCount kept_;  // what the device keeps, counted as the simulator counts it
  int step_ = -1;
  const PlannedCompute* action_ = nullptr;
  std::string problem_;
  bool problem_is_loss_ = false;
};

}  // namespace pipeweave
