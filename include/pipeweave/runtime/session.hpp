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
/// later), then its action, dispatched on what its phase's row says it computes
/// (schedule/phases.hpp; plan.hpp declares what each kind needs):
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
///   waits for the side's (runtime/overlap.hpp). The halves touch different
///   buffers (plan.hpp), and a chunk's backwards still run in program order, so
///   the gradient sums, and the training, stay bit for bit those of running the
///   pair's halves one by one.
/// - O(c, m) and L(c, m), an offload and its reload (OffloadableChunk): the
///   chunk copies what the micro-batch's slot keeps to the session's host
///   memory, and later back into a slot, before its backward; the session moves
///   x and y with it where the plan says (PlannedCompute::moves_x, moves_y);
///   in a weight window (after the I, before the W: WeightOffloadableChunk)
///   the chunk moves what it keeps for the W, and x, y and dy stay. The copies
///   run on the device's copy lane (runtime/copy_lane.hpp), as the simulator
///   times them: an offload's copy is issued when the action that completes the
///   stash ends (its F, or its I), and the device waits for it at the O; a
///   reload's copy is issued at the L, and the next action of its micro-batch
///   waits for it. With a CopyLaneBackend the lane runs beside the compute (a
///   GPU: a stream of its own, to and from page-locked host memory).
/// - R(c), with D replicas: chunk c's gradients are summed over the D devices
///   that hold it. The device hands R to its reducer and goes on with its next
///   action; the optimizer waits for the step's reductions. How R runs (beside
///   the program on a thread of its own, or here; in place, through a host copy,
///   or deferred) is the reducer's, chosen when the session is made
///   (runtime/reducer.hpp).
/// The batch's inputs (at virtual stage 0) and targets (at the last) go to the
/// device a micro-batch at a time, ahead of the forward that reads them, beside
/// the compute where the backend has a copy lane (runtime/batch_feed.hpp).
///
/// After the program the device counts its non-finite gradients (and losses); the
/// devices agree, and only when all are finite does every device apply one
/// optimizer step on the gradients averaged over the M micro-batches (over the
/// D x M of all replicas in data parallelism, where each chunk's R has summed its
/// gradients over the D devices that hold it; runtime/replicas.hpp). A step thus
/// either completes or leaves every parameter, and the optimizer state, as it was.
///
/// Every group and action is time-stamped, on the clock of the backend that ran
/// it, by the device's StepRecorder, which builds the step's trace
/// (runtime/recorder.hpp). Buffers come from the plan and are allocated when the
/// session is made; a step allocates nothing.
///
/// \code
/// // on device d's thread (a host makes one session per device; runtime/pipeline.hpp):
/// // auto session = pipeweave::DeviceSession<B, T, C, L, O>::make(std::move(parts), lowered, d, options, loss);
/// // const bool applied = session->run(inputs, targets);  // one training step
/// // session->record(trace);                              // its events
/// \endcode

#include <algorithm>
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
#include "pipeweave/runtime/batch_feed.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/copy_lane.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/overlap.hpp"
#include "pipeweave/runtime/parameter_copies.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/recorder.hpp"
#include "pipeweave/runtime/reducer.hpp"
#include "pipeweave/runtime/run.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/phases.hpp"

namespace pipeweave {

/// One device's part of a training run (see the file comment).
template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class DeviceSession {
 public:
  /// The parts the session owns.
  using Parts = DeviceParts<B, T, C>;

  /// Neither copied nor moved: its recorder, reducer and threads hold its members
  /// (sessions live behind a unique_ptr).
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  /// Takes the device's parts, allocates every buffer of `plan` for micro-batches
  /// of `rows` samples, reserves the chunks' stash slots and the optimizer state.
  /// `loss` is needed on the device of the last virtual stage only.
  DeviceSession(Parts parts, DevicePlan plan, int rows, const O& optimizer, std::optional<L> loss,
                ReplicaLink replicas = {});

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
  bool run(const float* inputs, const float* targets);

  /// Writes this device's events of the last step into `trace` (its compute,
  /// gradient-reduction and P2P events, in microseconds from the step's start,
  /// and its peak of kept micro-batches). Call after run() on the device's thread.
  void record(Trace& trace) const { recorder_.record(trace); }

  /// Stops every wait of every device with an error quoting `reason`.
  void abort(std::string_view reason) noexcept {
    parts_.transport.abort(reason);
    if (link_.group != nullptr) link_.group->abort(reason);
  }
  /// After a failed step (the run aborted): waits until the device's reducer has
  /// ended what it was given, so that no sum still touches any device's memory,
  /// and until the copies of its batch and of its offloads have ended, so that
  /// none still reads the caller's batch or writes host memory.
  void settle() {
    reducer_->settle();
    settle_copies();
  }
  /// Collective: makes the transport usable again after a failed step (after
  /// waiting for this device's reductions, which the abort has ended), then
  /// waits for the copies the step enqueued. Where the reductions fail to end,
  /// the transport's reset still meets the other devices, so that none waits
  /// for this one until the timeout; then that error is thrown.
  void reset() {
    std::exception_ptr failed;
    try {
      reducer_->reset();
    } catch (...) {
      failed = std::current_exception();
    }
    parts_.transport.reset();
    settle_copies();
    if (failed) std::rethrow_exception(failed);
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
  /// The message of each planned send and receive, in the order of plan().ops.
  std::span<const Message> messages() const { return messages_; }
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
  std::vector<std::vector<float>> chunk_parameters();
  /// Copies local chunk c's parameters and the update rule's state for them to
  /// `out` on the host (reusing its memory).
  void copy_chunk_state(int c, StageState& out) {
    download_stage(parts_.backend, chunk_views(c), optimizer_->buffers(),
                   [&](std::size_t p, int k) { return optimizer_->buffer(first_param(c) + p, k); }, out);
  }
  /// Throws pipeweave::Error, naming `what`, unless `state` fits local chunk c.
  void check_chunk_state(int c, const StageState& state, std::string_view what) const {
    check_stage_state(state, chunk_views(c), optimizer_->buffers(), what);
  }
  /// Sets local chunk c's parameters and rule state from `state` (checked by check_chunk_state).
  void set_chunk_state(int c, const StageState& state) {
    upload_stage(parts_.backend, state, chunk_views(c),
                 [&](std::size_t p, int k) { return optimizer_->buffer(first_param(c) + p, k); });
    copies_.refresh_all(parts_.backend);
  }
  /// Optimizer steps applied so far.
  long long updates() const { return optimizer_->steps(); }
  /// Sets the optimizer steps applied so far (a resumed run).
  void set_updates(long long n) { optimizer_->set_steps(n); }

 private:
  // The walk of one step (run()): a step's group, then its action by kind.
  void exchange(const PlannedStep& st);
  void compute(const PlannedCompute& pc) {
    action_ = &pc;
    const std::size_t start = recorder_.stamp();
    run_action(parts_.backend, pc, step_);
    recorder_.on_action_end(step_, start);
    issue(pc);
  }
  // An overlapped pair: the forward `f` of this step at once with the backward `bw` of the next.
  void pair(const PlannedCompute& f, const PlannedCompute& bw) {
    action_ = &f;
    pairs_->run(step_, [&](B& b) { run_action(b, f, step_); }, [&](B& side) { run_action(side, bw, step_ + 1); });
    issue(f);
    issue(bw);
  }
  void reduce(const PlannedCompute& pc) {
    action_ = &pc;
    reducer_->post(step_);
  }
  // Waits until every copy of the batch and of the offloads has ended.
  void settle_copies() {
    for (auto* feed : {&inputs_feed_, &targets_feed_})
      if (*feed) (*feed)->settle();
    if (lane_) lane_->settle();
  }
  // Before the forward that starts keeping a micro-batch (the first action that reads its part of the batch):
  // the device's work from now on follows the copies of its inputs (stage 0) and targets (the last stage).
  void feed(const PlannedCompute& pc) {
    if (!needs_of(pc.action.phase).keeps) return;
    if (pc.stage == 0) inputs_feed_->ready(parts_.backend, pc.action.micro_batch);
    if (pc.stage == last_stage_) targets_feed_->ready(parts_.backend, pc.action.micro_batch);
  }
  // An offload or a reload at its place: an O's copy was issued before, and the device has waited for it (the
  // step's waits_copy); an L's copy is issued now.
  void copy(const PlannedCompute& pc) {
    action_ = &pc;
    if (!phase_row(pc.action.phase).offloads) lane_->run(step_, pc.copy, [&](B& lane) { run_action(lane, pc, step_); });
    recorder_.on_copy_placed(step_);
  }
  // After the action `pc` that completes a stash an O moves: that O's copy, issued on the copy lane.
  void issue(const PlannedCompute& pc) {
    if (pc.issues < 0) return;
    const PlannedCompute& o = plan_.steps[static_cast<std::size_t>(pc.issues)].compute;
    lane_->run(pc.issues, o.copy, [&](B& lane) { run_action(lane, o, pc.issues); });
  }
  // Runs one compute action on `backend` (the device's, or the side for a
  // pair's backward), dispatched on its phase's row; an error names the step
  // and the action.
  void run_action(B& backend, const PlannedCompute& pc, int step);
  // The chunk's forward of `pc`; at the last stage the loss too, unless it is
  // a recomputation (C), which writes the values y already holds and leaves
  // the loss gradient as the forward made it.
  void forward(B& b, C& chunk, const ChunkCall& call, const PlannedCompute& pc) {
    const auto mb = static_cast<std::size_t>(call.micro_batch);
    const TensorRef y = tensor(pc.y);
    chunk_forward(chunk, b, call, input(pc), y);
    if (pc.stage == last_stage_ && !is_recompute(pc.action.phase))
      loss_forward_backward(*loss_, b, LossCall{call.micro_batch, rows_, output_size_}, y,
                            targets_.data() + mb * floats(target_size_), tensor(pc.dy), losses_.data() + mb);
  }
  // The input x of `pc`'s micro-batch: its buffer, or the batch's at virtual stage 0.
  ConstTensorRef input(const PlannedCompute& pc) {
    const auto mb = static_cast<std::size_t>(pc.action.micro_batch);
    return pc.x == kBatchInput ? ConstTensorRef(inputs_.data() + mb * floats(input_size_)) : ConstTensorRef(tensor(pc.x));
  }
  // An offload (O) or a reload (L): the chunk's stash to or from its host slot,
  // then x, y and dy where the plan moves them (after the chunk's part of the slot).
  void copy_stash(B& b, C& chunk, const ChunkCall& call, const PlannedCompute& pc) {
    if constexpr (OffloadableChunk<C, B>) {
      const int c = pc.action.chunk;
      float* host = lane_->host(c, pc.host);
      const bool out = phase_row(pc.action.phase).offloads;
      float* at = host + chunk_host_size(c);
      auto move = [&](bool moves, int id, BufferRole role) {
        if (!moves) return;
        typename B::Buffer& buffer = buffers_[static_cast<std::size_t>(id)];
        if (out)
          b.download(buffer.data(), at, buffer.size());
        else
          b.upload(at, buffer.data(), buffer.size());
        at += words(c, role);
      };
      move(pc.moves_x, pc.x, BufferRole::kInput);
      move(pc.moves_y, pc.y, BufferRole::kOutput);
      move(pc.moves_dy, pc.dy, BufferRole::kOutputGrad);
      if constexpr (WeightOffloadableChunk<C, B>) {
        if (pc.weight_window) {  // what the slot keeps for its W
          if (out)
            chunk.offload_for_weight(b, call, host);
          else
            chunk.reload_for_weight(b, call, input(pc), ConstTensorRef(tensor(pc.dy)), host);
          return;
        }
      }
      if (out)
        chunk.offload(b, call, host);
      else
        chunk.reload(b, call, input(pc), ConstTensorRef(tensor(pc.y)), host);
    }
  }
  // Floats of a buffer of `role` of local chunk c.
  std::size_t words(int c, BufferRole role) const { return tensor_words(floats(width(c, role)), dtype(c, role)); }
  // Floats of the chunk's own part of a host slot of local chunk c: what it moves before a backward, or,
  // where the program offloads in weight windows, what it moves there, if that is more.
  std::size_t chunk_host_size(int c) const {
    if constexpr (OffloadableChunk<C, B>) {
      const C& chunk = parts_.chunks[static_cast<std::size_t>(c)];
      if constexpr (WeightOffloadableChunk<C, B>)
        if (plan_.weight_windows) return std::max(chunk.offload_size(rows_), chunk.weight_offload_size(rows_));
      return chunk.offload_size(rows_);
    } else {
      return 0;
    }
  }
  // Floats of one host slot of local chunk c: the chunk's part, then x, y and dy.
  std::size_t host_stride(int c) const {
    return chunk_host_size(c) + words(c, BufferRole::kInput) + words(c, BufferRole::kOutput) +
           words(c, BufferRole::kOutputGrad);
  }
  // Sets problem_ from the counts and losses read back; true when all is finite.
  bool local_problem() {
    NonFiniteFinding found = check_->finding(plan_.device, param_chunk_, plan_.shape);
    problem_ = std::move(found.text);
    problem_is_loss_ = found.is_loss;
    return problem_.empty();
  }

  // The parameter tensors of local chunk c, a contiguous run of params_ from first_param(c).
  std::span<const ParameterView> chunk_views(int c) const {
    const auto count = std::count(param_chunk_.begin(), param_chunk_.end(), c);
    return std::span<const ParameterView>(params_).subspan(first_param(c), static_cast<std::size_t>(count));
  }
  std::size_t first_param(int c) const {
    return static_cast<std::size_t>(std::find(param_chunk_.begin(), param_chunk_.end(), c) - param_chunk_.begin());
  }
  std::size_t floats(std::size_t width) const { return width * static_cast<std::size_t>(rows_); }
  static bool at_input(BufferRole role) { return role == BufferRole::kInput || role == BufferRole::kInputGrad; }
  std::size_t width(int chunk, BufferRole role) const {
    const auto c = static_cast<std::size_t>(chunk);
    return at_input(role) ? in_size_[c] : out_size_[c];
  }
  DType dtype(int chunk, BufferRole role) const {
    const BoundaryDTypes& d = dtypes_[static_cast<std::size_t>(chunk)];
    return at_input(role) ? d.input : d.output;
  }
  TensorRef tensor(int id) {
    const auto i = static_cast<std::size_t>(id);
    return pipeweave::tensor(buffers_[i], buffer_dtypes_[i]);
  }
  TensorRef tensor_or_empty(int id) { return id == kNoBuffer ? TensorRef{} : tensor(id); }
  int replica_count() const { return link_.group != nullptr ? link_.group->replicas() : 1; }

  Parts parts_;
  DevicePlan plan_;
  int rows_;  // samples per micro-batch
  std::optional<L> loss_;
  ReplicaLink link_;  // data parallelism: the device's replica group
  int last_stage_ = 0;
  std::size_t input_size_ = 0, output_size_ = 0, target_size_ = 0;  // per sample
  std::vector<std::size_t> in_size_, out_size_;                      // [chunk], per sample
  std::vector<BoundaryDTypes> dtypes_;                               // [chunk]
  std::vector<typename B::Buffer> buffers_;
  std::vector<DType> buffer_dtypes_;  // [buffer]
  std::vector<Message> messages_;  // [planned op]
  typename B::Buffer inputs_, targets_, losses_;
  std::vector<ParameterView> params_;
  std::vector<int> param_chunk_;
  ChunkParameterCopies<B> copies_;  // the low-precision copies of the chunks that ask for them
  std::optional<FiniteCheck<B>> check_;
  std::optional<OptimizerState<B, O>> optimizer_;
  StepRecorder<B> recorder_{plan_, parts_.backend};  // the step's time stamps and trace
  std::optional<OverlapPairs<B>> pairs_;  // with overlapped pairs: the side their backwards run on
  std::unique_ptr<ReplicaReducer<B>> reducer_;  // the gradient reductions (after what its thread reads)
  std::optional<CopyLane<B>> lane_;  // with offloads: the lane their copies run on, and the host slots
  std::optional<BatchFeed<B>> inputs_feed_, targets_feed_;  // at the first and the last stage: the batch's copies
  int step_ = -1;
  long long updates_before_ = 0;  // optimizer updates applied before the step that runs (ChunkCall::step)
  const PlannedCompute* action_ = nullptr;
  std::string problem_;
  bool problem_is_loss_ = false;
};

// Definitions.

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
DeviceSession<B, T, C, L, O>::DeviceSession(Parts parts, DevicePlan plan, int rows, const O& optimizer,
                                            std::optional<L> loss, ReplicaLink replicas)
    : parts_(std::move(parts)), plan_(std::move(plan)), rows_(rows), loss_(std::move(loss)), link_(replicas) {
  B& b = parts_.backend;
  const ScheduleShape& s = plan_.shape;
  const auto M = static_cast<std::size_t>(s.micro_batches);
  last_stage_ = s.stages() - 1;
  if constexpr (!SplitChunk<C, B>) {
    if (plan_.split)
      throw_error({.device = plan_.device}, "the schedule splits backwards into I and W, but the chunk offers only a "
                  "full backward (a SplitChunk has backward_input, backward_weight and reserve_split; see "
                  "runtime/chunk.hpp)");
  }
  if constexpr (!RecomputableChunk<C>) {
    if (plan_.recomputes)
      throw_error({.device = plan_.device}, "the program recomputes micro-batches (C), but the chunk does not say "
                  "that its forward may run twice alike (a RecomputableChunk has static constexpr bool recomputable = "
                  "true; see runtime/chunk.hpp)");
  }
  if constexpr (!OffloadableChunk<C, B>) {
    if (plan_.offloads)
      throw_error({.device = plan_.device}, "the program offloads stashes to host memory (O, L), but the chunk does "
                  "not say how to move what it keeps (an OffloadableChunk has offload_size, offload and reload; see "
                  "runtime/chunk.hpp)");
  }
  if constexpr (!WeightOffloadableChunk<C, B>) {
    if (plan_.weight_windows)
      throw_error({.device = plan_.device}, "the program offloads stashes between an I and its W (O after the I, L "
                  "before the W), but the chunk does not say how to move what it keeps for its weight gradient (a "
                  "WeightOffloadableChunk has weight_offload_size, offload_for_weight and reload_for_weight; see "
                  "runtime/chunk.hpp)");
  }
  bind_thread(b);  // the device's own thread, on which the session is made
  if (plan_.pairs) pairs_.emplace(b, recorder_, plan_.device);
  for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
    in_size_.push_back(parts_.chunks[c].input_size());
    out_size_.push_back(parts_.chunks[c].output_size());
    dtypes_.push_back(chunk_dtypes(parts_.chunks[c]));
    parts_.chunks[c].reserve(b, std::max(1, plan_.slots[c]), rows_);
    if constexpr (SplitChunk<C, B>) {
      if (plan_.split) parts_.chunks[c].reserve_split(b, std::max(1, plan_.slots[c]), rows_);
    }
  }
  if constexpr (OffloadableChunk<C, B>) {
    if (plan_.offloads) {
      std::vector<std::size_t> strides;
      for (std::size_t c = 0; c < parts_.chunks.size(); ++c) strides.push_back(host_stride(static_cast<int>(c)));
      lane_.emplace(b, recorder_, plan_, strides);
    }
  }
  buffers_.reserve(plan_.buffers.size());
  for (const PlannedBuffer& pb : plan_.buffers) {
    buffer_dtypes_.push_back(dtype(pb.chunk, pb.role));
    buffers_.push_back(allocate_tensor(b, floats(width(pb.chunk, pb.role)), buffer_dtypes_.back()));
  }
  if constexpr (SizedChunk<C>) {  // the bytes it holds for its kept micro-batches: slots, and buffers as tensors
    std::vector<std::size_t> slot, split, buffer;
    for (const C& chunk : parts_.chunks) {
      slot.push_back(chunk.slot_bytes(rows_));
      split.push_back(chunk.split_slot_bytes(rows_));
    }
    for (const PlannedBuffer& pb : plan_.buffers) buffer.push_back(words(pb.chunk, pb.role) * sizeof(float));
    recorder_.measure_bytes(HeldMemory(plan_, std::move(slot), std::move(split), std::move(buffer)));
  }
  for (const PlannedOp& op : plan_.ops) {
    const bool act = op.tensor.kind == TensorKind::kActivation;
    const BufferRole role = op.kind == OpKind::kSend ? (act ? BufferRole::kOutput : BufferRole::kInputGrad)
                                                     : (act ? BufferRole::kInput : BufferRole::kOutputGrad);
    const DType d = dtype(op.chunk, role);
    messages_.push_back(Message{op.tensor, floats(width(op.chunk, role)) * dtype_bytes(d), d});
  }
  if (plan_.first_stage) {
    const auto first = static_cast<std::size_t>(s.chunk_of_stage(0));
    input_size_ = in_size_[first];
    inputs_ = b.allocate(floats(input_size_) * M);
  }
  if (plan_.last_stage) {
    if (!loss_) throw_error({.device = plan_.device}, "holds the last virtual stage but was given no loss");
    const auto last = static_cast<std::size_t>(s.chunk_of_stage(last_stage_));
    check_loss_dtype<L, B>(dtypes_[last].output, last_stage_, error_text({.device = plan_.device}, "the loss"));
    output_size_ = out_size_[last];
    target_size_ = loss_->target_size(output_size_);
    loss_->reserve(b, rows_, output_size_);
    targets_ = b.allocate(floats(target_size_) * M);
    losses_ = b.allocate(M);
  }
  const auto forwards_of = [&](int stage) {  // the micro-batches in the order the stage's forwards read them
    std::vector<int> order;
    for (const PlannedStep& st : plan_.steps)
      if (st.has_compute && needs_of(st.compute.action.phase).keeps && st.compute.stage == stage)
        order.push_back(st.compute.action.micro_batch);
    return order;
  };
  if (plan_.first_stage) inputs_feed_.emplace(b, inputs_.data(), floats(input_size_), forwards_of(0));
  if (plan_.last_stage) targets_feed_.emplace(b, targets_.data(), floats(target_size_), forwards_of(last_stage_));
  for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
    for (const ParameterView& p : std::span<const ParameterView>(parts_.chunks[c].parameters())) {
      params_.push_back(p);
      param_chunk_.push_back(static_cast<int>(c));
    }
  }
  copies_.make(b, std::span<C>(parts_.chunks));
  check_.emplace(b, params_, plan_.last_stage ? M : 0);
  optimizer_.emplace(b, params_, optimizer);
  std::vector<std::span<const ParameterView>> chunks;
  for (std::size_t c = 0; c < parts_.chunks.size(); ++c) chunks.push_back(chunk_views(static_cast<int>(c)));
  reducer_ = make_replica_reducer<B>({plan_, b, recorder_, link_, std::move(chunks)});
  b.synchronize();
}

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
bool DeviceSession<B, T, C, L, O>::run(const float* inputs, const float* targets) {
  B& b = parts_.backend;
  T& net = parts_.transport;
  step_ = -1;
  action_ = nullptr;
  problem_.clear();
  problem_is_loss_ = false;
  net.agree(true);  // start together: the trace's origin
  recorder_.on_step_begin();
  reducer_->start();
  updates_before_ = optimizer_->steps();
  for (const ParameterView& p : params_) b.fill(p.gradient, p.count, 0.0f);
  if (plan_.first_stage) inputs_feed_->start(b, inputs);
  if (plan_.last_stage) targets_feed_->start(b, targets);
  for (std::size_t t = 0; t < plan_.steps.size(); ++t) {
    const PlannedStep& st = plan_.steps[t];
    step_ = static_cast<int>(t);
    if (st.waits_copy >= 0) lane_->wait(st.waits_copy);  // an O's copy, or an L's its micro-batch reads
    if (st.op_count > 0) exchange(st);
    if (!st.has_compute) continue;
    feed(st.compute);
    if (st.compute.action.overlaps_next)
      pair(st.compute, plan_.steps[++t].compute);  // the plan checked that step t + 1 is the backward
    else if (is_collective(st.compute.action.phase))
      reduce(st.compute);
    else if (is_copy(st.compute.action.phase))
      copy(st.compute);
    else
      compute(st.compute);
  }
  if (lane_) lane_->wait_all();  // the step ends with its copies
  action_ = nullptr;
  reducer_->finish();
  // Agree that every value is finite before anyone updates anything.
  check_->read(b, losses_.data());
  bool all_ok = net.agree(local_problem());
  if (link_.group != nullptr) all_ok = link_.group->agree(link_.replica, all_ok);  // and over the replicas
  if (all_ok) {
    optimizer_->step(b, 1.0f / static_cast<float>(plan_.shape.micro_batches * replica_count()));
    copies_.refresh_all(b);
    b.synchronize();
  }
  return all_ok;
}

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
void DeviceSession<B, T, C, L, O>::exchange(const PlannedStep& st) {
  T& net = parts_.transport;
  const std::size_t start = recorder_.stamp();
  net.group_begin(step_);
  for (int i = st.first_op; i < st.first_op + st.op_count; ++i) {
    const PlannedOp& op = plan_.ops[static_cast<std::size_t>(i)];
    const Message& m = messages_[static_cast<std::size_t>(i)];
    if (op.kind == OpKind::kSend)
      net.send(op.peer, m, tensor(op.buffer).data());
    else
      net.recv(op.peer, m, tensor(op.buffer).data());
  }
  net.group_end();
  recorder_.on_exchange_end(step_, start);
}

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
void DeviceSession<B, T, C, L, O>::run_action(B& backend, const PlannedCompute& pc, int step) {
  try {
    C& chunk = parts_.chunks[static_cast<std::size_t>(pc.action.chunk)];
    const ChunkCall call{pc.action.micro_batch, pc.slot, rows_, updates_before_};
    // The chunk's call for the gradients the phase's row says the action makes:
    // both, a full backward (B); one, that half of a split backward (I or W);
    // none, the forward (F), or the forward again (C: forward() leaves the loss
    // out). An action of the copy lane (O, L) moves the stash. R never comes
    // here: the reducer runs it (reduce()).
    const PhaseRow& row = phase_row(pc.action.phase);
    if (row.lane == ActionLane::kCopy) {
      copy_stash(backend, chunk, call, pc);
    } else if (row.input_gradient && row.weight_gradient) {
      chunk_backward(chunk, backend, call, tensor(pc.dy), tensor_or_empty(pc.dx));
    } else if (row.input_gradient) {
      if constexpr (SplitChunk<C, B>) chunk_backward_input(chunk, backend, call, tensor(pc.dy), tensor_or_empty(pc.dx));
    } else if (row.weight_gradient) {
      if constexpr (SplitChunk<C, B>) chunk.backward_weight(backend, call);
    } else {
      forward(backend, chunk, call, pc);
    }
  } catch (const std::exception& e) {
    rethrow_at({.device = plan_.device, .step = step, .action = pc.action, .stage = pc.stage}, e,
               replica_count() > 1 ? link_.replica : -1);
  }
}

template <Backend B, Transport T, class C, class L, class O>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
std::vector<std::vector<float>> DeviceSession<B, T, C, L, O>::chunk_parameters() {
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

}  // namespace pipeweave
