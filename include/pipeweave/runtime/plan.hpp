#pragma once
/// \file
/// The device plan: one pass over a device's lowered steps, before the first
/// training step, that decides which buffer every tensor lives in. The device
/// session then runs the steps with table lookups only: no maps, no allocation.
///
/// Each chunk c has four pools of equally sized buffers, one per role of the
/// tensors of its (chunk, micro-batch):
/// - kInput, x: the activation entering the chunk (received, or the previous
///   stage's output when that stage is on the same device; the first stage reads
///   the batch);
/// - kOutput, y: the activation leaving it (sent, or passed on locally);
/// - kOutputGrad, dy: the gradient of its output (received, passed on locally, or
///   the loss gradient at the last stage);
/// - kInputGrad, dx: the gradient of its input (sent, or passed on locally).
///
/// What each action kind does with these roles is declared once, in needs_of():
/// which it reads (they must exist by then), which it writes (a fresh buffer from
/// the pool), whether it starts keeping its micro-batch (a stash slot of the
/// chunk; x and y stay untouched, since the chunk may keep pointers to them, but
/// for an offload, below) or
/// ends it (the slot and every kept buffer go back). The planner and the session
/// read that table; a new kind is a new row and one executor function.
///
/// A buffer is taken from its pool when its tensor first appears (a receive or
/// the action that writes it) and returned after its last use; an input gradient
/// is done once the group that sends it has run. A received tensor may arrive
/// steps before the action that needs it; its buffer is simply taken earlier.
/// Pools grow to the most buffers in use at once.
///
/// An offload (O) moves what its micro-batch's slot keeps to a host slot of
/// the chunk (the session's host memory, runtime/chunk.hpp's OffloadableChunk)
/// and frees the stash slot; the reload (L) takes a stash slot again, perhaps
/// another, and returns the host slot. So the chunk reserves as many stash slots
/// as it keeps micro-batches on the device at once, and the session as many host
/// slots as are away at once. x, y and a kept dy go to the host slot too, and
/// come back into fresh buffers at the L, each where nothing else needs its
/// buffer meanwhile: x unless it is a local neighbour stage's y (a shared
/// buffer) or the batch's, y unless the next stage is local (its forward reads
/// y) or a send of y comes after the O, dy where it is kept (the last stage's
/// loss gradient, from its forward; any stage's from its I to its W). An
/// offload in a weight window (after the micro-batch's I, before its W) moves
/// what the slot keeps for the W (WeightOffloadableChunk), and the L hands the
/// chunk x and dy again.
///
/// The copies run on the device's copy lane, beside its compute
/// (runtime/copy_lane.hpp), as the simulator times them: an offload's copy is
/// issued when the action that completes the stash ends (its forward; in a
/// weight window, its I: PlannedCompute::issues names the O), and the device
/// waits for that copy at the O, from where the stash's memory is free; a
/// reload's copy is issued at the L, and the micro-batch's next action waits
/// for it (PlannedStep::waits_copy). So the host slot of an offload is taken
/// when its copy is issued, and returned at the L: the lane runs its copies in
/// the order issued, so a host slot is written again only after its L has read it.
///
/// An overlapped pair (a forward marked `overlaps_next` and the backward of the
/// next step, which has no group of its own) is planned as its two steps in
/// order. The forward takes its fresh buffers before the backward returns any,
/// and they work on different micro-batches or chunks, so the halves, which run
/// at once, never write a buffer the other reads or writes.

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave {

/// Which tensor of a chunk's micro-batch a buffer holds.
enum class BufferRole : unsigned char { kInput, kOutput, kOutputGrad, kInputGrad };
/// Number of roles.
inline constexpr int kBufferRoles = 4;

/// The needs of each action kind (Use and KindNeeds are its phase's row's, kinds.hpp).
constexpr KindNeeds needs_of(Phase phase) { return phase_row(phase).needs; }

/// "a forward", "a backward": an action kind in error messages.
constexpr std::string_view kind_words(Phase phase) { return phase_row(phase).role; }

/// A buffer to allocate: its chunk and role (its size follows from them).
struct PlannedBuffer {
  int chunk = 0;                         ///< local chunk
  BufferRole role = BufferRole::kInput;  ///< which of its tensors
};

/// Buffer index meaning "micro-batch m of the batch's inputs" (the first stage's input).
inline constexpr int kBatchInput = -2;
/// Buffer index meaning "none".
inline constexpr int kNoBuffer = -1;

/// One operation of a step's group, with the buffer it reads or writes.
struct PlannedOp {
  OpKind kind = OpKind::kSend;  ///< send or receive
  int peer = 0;                 ///< the other device
  TensorId tensor{};            ///< what travels
  int chunk = 0;   ///< the local chunk that produced (send) or consumes (receive) the tensor
  int buffer = kNoBuffer;  ///< index into DevicePlan::buffers
};

/// One compute action with its buffers (kNoBuffer where its kind has no use for a role).
struct PlannedCompute {
  Action action{};     ///< the action
  int stage = 0;       ///< its virtual stage
  int slot = 0;        ///< the chunk's stash slot for the micro-batch
  int x = kNoBuffer;   ///< input activation (kBatchInput at stage 0)
  int y = kNoBuffer;   ///< output activation
  int dy = kNoBuffer;  ///< output gradient (a forward at the last stage: the loss gradient it writes)
  int dx = kNoBuffer;  ///< input gradient
  int host = kNoBuffer;  ///< an offload (O) or reload (L): the chunk's host slot the stash goes to or comes from
  bool moves_x = false;  ///< an O or L: x goes to the host slot with the stash (its buffer free meanwhile) and comes back
  bool moves_y = false;  ///< the same for y
  bool moves_dy = false;  ///< the same for dy, kept with the stash (the last stage's loss gradient, or in a weight window)
  bool recomputed = false;  ///< its (chunk, micro-batch) is recomputed (the program has a C of it)
  bool weight_window = false;  ///< an O or L in its micro-batch's weight window (after its I, before its W)
  int copy = -1;    ///< an O or L: its number among the device's copies, in program order
  int issues = -1;  ///< the step of the O whose copy this action issues when it ends (-1: none)
};

/// One step: ops[first_op, first_op + op_count) then, if has_compute, compute
/// (when compute.action.overlaps_next, at once with the next step's action).
struct PlannedStep {
  int first_op = 0;          ///< index of the group's first operation in DevicePlan::ops
  int op_count = 0;          ///< operations in the group
  int sends = 0;             ///< of which sends
  int recvs = 0;             ///< of which receives
  bool has_compute = false;  ///< whether an action follows the group
  PlannedCompute compute{};  ///< the action
  int waits_copy = -1;  ///< the group and the action start after copy `waits_copy` has ended (-1: none; a pair's first step waits for both halves')
};

/// A device's steps with every tensor placed in a buffer.
struct DevicePlan {
  int device = 0;                      ///< the device
  ScheduleShape shape{};               ///< the schedule's shape
  std::vector<PlannedStep> steps;      ///< [step of the lowered program]
  std::vector<PlannedOp> ops;          ///< every step's operations, in order
  std::vector<PlannedBuffer> buffers;  ///< every buffer to allocate
  std::vector<int> slots;   ///< [chunk]: stash slots the chunk needs (most micro-batches kept on the device at once)
  std::vector<int> host_slots;  ///< [chunk]: host slots the chunk's offloads need (most stashes away at once)
  int copies = 0;           ///< O and L actions (PlannedCompute::copy counts them)
  int peak_kept = 0;        ///< most micro-batches kept at once (forwards whose backward, or W, had not run yet; not while away, from an O to its L)
  bool split = false;       ///< some backward is split into I and W (the chunks need SplitChunk)
  bool pairs = false;       ///< some steps are overlapped pairs (the backend needs OverlapBackend)
  bool recomputes = false;  ///< some micro-batches are recomputed (the chunks need RecomputableChunk)
  bool offloads = false;    ///< some stashes go to host memory and back (the chunks need OffloadableChunk)
  bool weight_windows = false;  ///< some go in a weight window, after an I (the chunks need WeightOffloadableChunk)
  bool first_stage = false; ///< this device holds virtual stage 0 (reads the batch's inputs)
  bool last_stage = false;  ///< this device holds the last virtual stage (computes the loss)
};

namespace detail {

/// The planner's state: the pools, what buffer holds each (role, chunk,
/// micro-batch) now, and the stash slots.
class Planner {
 public:
  Planner(DevicePlan& plan, int chunks, int micro_batches)
      : plan_(plan),
        micro_batches_(micro_batches),
        free_(static_cast<std::size_t>(chunks) * kBufferRoles),
        held_(static_cast<std::size_t>(chunks) * static_cast<std::size_t>(micro_batches) * kBufferRoles, kNoBuffer),
        slot_of_(static_cast<std::size_t>(chunks) * static_cast<std::size_t>(micro_batches), -1),
        host_of_(slot_of_.size(), -1),
        free_slots_(static_cast<std::size_t>(chunks)),
        free_host_(static_cast<std::size_t>(chunks)) {
    plan_.slots.assign(static_cast<std::size_t>(chunks), 0);
    plan_.host_slots.assign(static_cast<std::size_t>(chunks), 0);
  }

  /// The buffer that holds `role` of (chunk, m) now, or kNoBuffer.
  int& held(BufferRole role, int chunk, int m) {
    return held_[(static_cast<std::size_t>(chunk) * static_cast<std::size_t>(micro_batches_) +
                  static_cast<std::size_t>(m)) * kBufferRoles +
                 static_cast<std::size_t>(role)];
  }

  /// A buffer from the pool of (chunk, role), with one reference.
  int take(int chunk, BufferRole role) {
    auto& list = free_[pool(chunk, role)];
    int id;
    if (list.empty()) {
      id = static_cast<int>(plan_.buffers.size());
      plan_.buffers.push_back({chunk, role});
      refs_.push_back(0);
    } else {
      id = list.back();
      list.pop_back();
    }
    refs_[static_cast<std::size_t>(id)] = 1;
    return id;
  }
  /// The references to a buffer now.
  int refs(int id) const { return refs_[static_cast<std::size_t>(id)]; }
  /// One more reference to a buffer (a tensor that two roles share).
  void hold(int id) {
    if (id >= 0) ++refs_[static_cast<std::size_t>(id)];
  }
  /// One reference less; the last returns the buffer to its pool.
  void release(int id) {
    if (id < 0) return;
    if (--refs_[static_cast<std::size_t>(id)] == 0) {
      const PlannedBuffer& b = plan_.buffers[static_cast<std::size_t>(id)];
      free_[pool(b.chunk, b.role)].push_back(id);
    }
  }

  /// The stash slot of (chunk, m): -1 when none is taken.
  int& slot(int chunk, int m) {
    return slot_of_[static_cast<std::size_t>(chunk) * static_cast<std::size_t>(micro_batches_) +
                    static_cast<std::size_t>(m)];
  }
  /// The host slot of (chunk, m) while its stash is away: -1 when none is taken.
  int& host(int chunk, int m) {
    return host_of_[static_cast<std::size_t>(chunk) * static_cast<std::size_t>(micro_batches_) +
                    static_cast<std::size_t>(m)];
  }
  /// A free slot of the chunk (a new one when none is free).
  int take_slot(int chunk) { return take_from(free_slots_, plan_.slots, chunk); }
  /// Returns a slot.
  void release_slot(int chunk, int s) { free_slots_[static_cast<std::size_t>(chunk)].push_back(s); }
  /// A free host slot of the chunk (a new one when none is free).
  int take_host(int chunk) { return take_from(free_host_, plan_.host_slots, chunk); }
  /// Returns a host slot.
  void release_host(int chunk, int s) { free_host_[static_cast<std::size_t>(chunk)].push_back(s); }

 private:
  static int take_from(std::vector<std::vector<int>>& free, std::vector<int>& count, int chunk) {
    auto& fs = free[static_cast<std::size_t>(chunk)];
    if (fs.empty()) return count[static_cast<std::size_t>(chunk)]++;
    const int s = fs.back();
    fs.pop_back();
    return s;
  }
  static std::size_t pool(int chunk, BufferRole role) {
    return static_cast<std::size_t>(chunk) * kBufferRoles + static_cast<std::size_t>(role);
  }
  DevicePlan& plan_;
  int micro_batches_;
  std::vector<std::vector<int>> free_;  // [chunk * roles + role]: free buffers
  std::vector<int> refs_;               // [buffer]
  std::vector<int> held_;               // [(chunk * M + m) * roles + role]
  std::vector<int> slot_of_;            // [chunk * M + m]
  std::vector<int> host_of_;            // [chunk * M + m]
  std::vector<std::vector<int>> free_slots_;  // [chunk]
  std::vector<std::vector<int>> free_host_;   // [chunk]
};

}  // namespace detail

/// Places every tensor of device d's steps in a buffer, for any placement of the
/// stages (a stage whose neighbour is on the same device hands over locally). The
/// lowered program must be verified (verify()); a program that is not consistent
/// throws pipeweave::Error.
inline DevicePlan plan_device(const LoweredProgram& lp, int device) {
  const ScheduleShape& s = lp.shape;
  if (device < 0 || device >= s.devices || lp.devices.size() != static_cast<std::size_t>(s.devices))
    throw_error({}, "plan_device: device ", device, " is not in the program");
  const int V = s.chunks, M = s.micro_batches, last = s.stages() - 1;
  DevicePlan plan;
  plan.device = device;
  plan.shape = s;
  plan.first_stage = s.device_of_stage(0) == device;
  plan.last_stage = s.device_of_stage(last) == device;
  detail::Planner pl(plan, V, M);
  int kept = 0;
  constexpr int kInputOnly = -2;  // the slot "of" a recomputed micro-batch between its forward and its C
  constexpr int kAway = -3;       // the slot "of" an offloaded micro-batch between its O and its L
  std::vector<char> recomputed(static_cast<std::size_t>(V * M), 0);  // [chunk * M + m]: it has a C
  for (const Step& st : lp.devices[static_cast<std::size_t>(device)])
    if (st.has_compute && is_recompute(st.compute.phase) && st.compute.chunk >= 0 && st.compute.chunk < V &&
        st.compute.micro_batch >= 0 && st.compute.micro_batch < M)
      recomputed[static_cast<std::size_t>(st.compute.chunk * M + st.compute.micro_batch)] = 1;
  plan.recomputes = std::find(recomputed.begin(), recomputed.end(), 1) != recomputed.end();
  // [chunk * M + m]: the step of the last send of its y (-1: none); what its O moved (1: x, 2: y, 4: dy).
  std::vector<int> last_send(static_cast<std::size_t>(V * M), -1);
  std::vector<char> moved(last_send.size(), 0);
  std::vector<char> input_done(last_send.size(), 0);  // its I has run: an O or L now is in its weight window
  // [chunk * M + m]: the O steps of its offloads, before its backward and in its weight window (-1: none).
  std::vector<int> offload_before(last_send.size(), -1), offload_window(last_send.size(), -1);
  {
    std::vector<char> after_input(last_send.size(), 0);
    for (std::size_t t = 0; t < lp.devices[static_cast<std::size_t>(device)].size(); ++t) {
      const Step& st = lp.devices[static_cast<std::size_t>(device)][t];
      const Action& a = st.compute;
      if (!st.has_compute || a.chunk < 0 || a.chunk >= V || a.micro_batch < 0 || a.micro_batch >= M) continue;
      const auto unit = static_cast<std::size_t>(a.chunk * M + a.micro_batch);
      if (a.phase == Phase::kBackwardInput) after_input[unit] = 1;
      if (is_copy(a.phase) && phase_row(a.phase).offloads)
        (after_input[unit] ? offload_window : offload_before)[unit] = static_cast<int>(t);
    }
  }
  std::vector<int> issued(last_send.size(), -1);    // the host slot its issued offload copies to (-1: none)
  std::vector<int> reloaded(last_send.size(), -1);  // the L whose copy its next action reads (-1: none)
  for (std::size_t t = 0; t < lp.devices[static_cast<std::size_t>(device)].size(); ++t)
    for (const P2POp& op : lp.devices[static_cast<std::size_t>(device)][t].ops)
      if (op.kind == OpKind::kSend && op.tensor.kind == TensorKind::kActivation && op.tensor.stage >= 0 &&
          op.tensor.stage <= last && s.device_of_stage(op.tensor.stage) == device && op.tensor.micro_batch >= 0 &&
          op.tensor.micro_batch < M)
        last_send[static_cast<std::size_t>(s.chunk_of_stage(op.tensor.stage) * M + op.tensor.micro_batch)] =
            static_cast<int>(t);
  std::vector<int> sent_grads;  // input-gradient buffers to return after the current group
  const auto& steps = lp.devices[static_cast<std::size_t>(device)];
  plan.steps.reserve(steps.size());
  for (std::size_t t = 0; t < steps.size(); ++t) {
    const Step& st = steps[t];
    const Where where{.device = device, .step = static_cast<int>(t)};
    if (st.has_compute && st.compute.overlaps_next) {  // an overlapped pair: this forward and the next step's backward
      const bool last_step = t + 1 == steps.size();
      const Step next = last_step ? Step{} : steps[t + 1];
      if (st.compute.phase != Phase::kForward || last_step || !next.has_compute || !next.ops.empty() ||
          (next.compute.phase != Phase::kBackward && next.compute.phase != Phase::kBackwardInput))
        throw_error(where, to_string(st.compute), " starts an overlapped pair, but the pair is not a forward followed "
                    "by a step with a backward (B or I) and no operations of its own");
      plan.pairs = true;
    }
    PlannedStep ps;
    ps.first_op = static_cast<int>(plan.ops.size());
    sent_grads.clear();
    for (const P2POp& op : st.ops) {
      const TensorId& x = op.tensor;
      if (x.micro_batch < 0 || x.micro_batch >= M || x.stage < 0 || x.stage > last)
        throw_error(where, "a message is out of range: ", x);
      PlannedOp po{op.kind, op.peer, x, 0, kNoBuffer};
      const bool act = x.kind == TensorKind::kActivation;
      if (op.kind == OpKind::kRecv) {
        const int consumer = act ? x.stage + 1 : x.stage - 1;
        if (consumer < 0 || consumer > last || s.device_of_stage(consumer) != device)
          throw_error(where, "receives a tensor no chunk of this device consumes: ", x);
        po.chunk = s.chunk_of_stage(consumer);
        const BufferRole role = act ? BufferRole::kInput : BufferRole::kOutputGrad;
        int& h = pl.held(role, po.chunk, x.micro_batch);
        if (h != kNoBuffer) throw_error(where, "receives a second time: ", x);
        h = pl.take(po.chunk, role);
        po.buffer = h;
        ++ps.recvs;
      } else {
        if (s.device_of_stage(x.stage) != device) throw_error(where, "sends a tensor another device produces: ", x);
        po.chunk = s.chunk_of_stage(x.stage);
        const BufferRole role = act ? BufferRole::kOutput : BufferRole::kInputGrad;
        int& h = pl.held(role, po.chunk, x.micro_batch);
        if (h == kNoBuffer) throw_error(where, "sends a tensor not computed before: ", x);
        po.buffer = h;
        if (!act) {  // the input gradient is done once sent
          sent_grads.push_back(h);
          h = kNoBuffer;
        }
        ++ps.sends;
      }
      plan.ops.push_back(po);
    }
    ps.op_count = static_cast<int>(plan.ops.size()) - ps.first_op;
    for (int id : sent_grads) pl.release(id);
    if (st.has_compute) {
      const Action& a = st.compute;
      if (a.chunk < 0 || a.chunk >= V || a.micro_batch < 0 || a.micro_batch >= M)
        throw_error(where, "an action is out of range");
      const int c = a.chunk, m = a.micro_batch, stage = s.stage_of(device, c);
      plan.split = plan.split || phase_row(a.phase).split;
      const KindNeeds needs = needs_of(a.phase);
      const std::string_view kind = kind_words(a.phase);
      PlannedCompute pc{.action = a, .stage = stage, .recomputed = recomputed[static_cast<std::size_t>(c * M + m)] != 0};
      if (is_recompute(a.phase)) {  // C: the forward again, from the input kept, into a slot of its own
        int& slot = pl.slot(c, m);
        if (slot != kInputOnly) throw_error(where, "runs ", kind, " of a micro-batch whose forward has not run");
        slot = pl.take_slot(c);
        pc.slot = slot;
        pc.x = stage == 0 ? kBatchInput : pl.held(BufferRole::kInput, c, m);
        pc.y = pl.held(BufferRole::kOutput, c, m);
        ps.has_compute = true;
        ps.compute = pc;
        plan.steps.push_back(ps);
        continue;
      }
      if (is_copy(a.phase)) {  // O: the slot's stash to a host slot; L: back, into a slot again
        int& slot = pl.slot(c, m);
        int& host = pl.host(c, m);
        int& x = pl.held(BufferRole::kInput, c, m);
        int& y = pl.held(BufferRole::kOutput, c, m);
        const auto unit = static_cast<std::size_t>(c * M + m);
        plan.offloads = true;
        const bool window = input_done[unit] != 0;
        int& dy = pl.held(BufferRole::kOutputGrad, c, m);
        pc.weight_window = window;
        plan.weight_windows = plan.weight_windows || window;
        pc.copy = plan.copies++;
        if (phase_row(a.phase).offloads) {
          if (slot == kInputOnly) throw_error(where, "runs ", kind, " of a micro-batch it recomputes");
          if (slot < 0) throw_error(where, "runs ", kind, " of a micro-batch it does not keep");
          if (issued[unit] < 0) throw_error(where, "runs ", kind, " of a micro-batch whose stash is not complete");
          pc.slot = slot;
          pc.host = host = std::exchange(issued[unit], -1);
          ps.waits_copy = pc.copy;  // from here on the stash's memory is free: its copy has ended
          pl.release_slot(c, slot);
          slot = kAway;
          --kept;
          // x, y and the kept dy go with the stash where no other tensor shares their buffers and y's sends
          // are done; dy is kept at the last stage (the loss gradient) and in a weight window.
          pc.x = stage == 0 ? kBatchInput : x;
          pc.y = y;
          pc.dy = dy;
          const bool next_local = stage < last && s.device_of_stage(stage + 1) == device;  // its forward reads y
          pc.moves_x = stage > 0 && x >= 0 && pl.refs(x) == 1;
          pc.moves_y = y >= 0 && pl.refs(y) == 1 && !next_local && last_send[unit] <= static_cast<int>(t);
          pc.moves_dy = (stage == last || window) && dy >= 0 && pl.refs(dy) == 1;
          moved[unit] = static_cast<char>((pc.moves_x ? 1 : 0) | (pc.moves_y ? 2 : 0) | (pc.moves_dy ? 4 : 0));
          if (pc.moves_x) pl.release(std::exchange(x, kNoBuffer));
          if (pc.moves_y) pl.release(std::exchange(y, kNoBuffer));
          if (pc.moves_dy) pl.release(std::exchange(dy, kNoBuffer));
        } else {
          if (slot != kAway) throw_error(where, "runs ", kind, " of a micro-batch whose stash is not away");
          pc.slot = slot = pl.take_slot(c);
          pc.host = host;
          pl.release_host(c, host);
          host = -1;
          plan.peak_kept = std::max(plan.peak_kept, ++kept);
          const int was = std::exchange(moved[unit], 0);
          pc.moves_x = (was & 1) != 0;
          pc.moves_y = (was & 2) != 0;
          pc.moves_dy = (was & 4) != 0;
          if (pc.moves_x) x = pl.take(c, BufferRole::kInput);
          if (pc.moves_y) y = pl.take(c, BufferRole::kOutput);
          if (pc.moves_dy) dy = pl.take(c, BufferRole::kOutputGrad);
          pc.x = stage == 0 ? kBatchInput : x;
          pc.y = y;
          pc.dy = dy;
          reloaded[unit] = pc.copy;
        }
        ps.has_compute = true;
        ps.compute = pc;
        plan.steps.push_back(ps);
        continue;
      }
      const auto unit = static_cast<std::size_t>(c * M + m);
      if (!is_collective(a.phase))  // the first action of a micro-batch after its L reads what the L wrote
        ps.waits_copy = std::exchange(reloaded[unit], -1);
      // Reads: each role comes from the batch, a local neighbour stage, or a receive.
      if (needs.x == Use::kRead) {
        int& x = pl.held(BufferRole::kInput, c, m);
        if (stage == 0) {
          x = kBatchInput;
        } else if (s.device_of_stage(stage - 1) == device) {  // the previous stage is local: share its output
          const int y_prev = pl.held(BufferRole::kOutput, s.chunk_of_stage(stage - 1), m);
          if (y_prev == kNoBuffer) throw_error(where, "runs ", kind, " before its input exists");
          pl.hold(y_prev);
          x = y_prev;
        } else if (x == kNoBuffer) {
          throw_error(where, "runs ", kind, " before receiving its input");
        }
        pc.x = x;
      }
      if (needs.dy == Use::kRead) {
        int& dy = pl.held(BufferRole::kOutputGrad, c, m);
        if (stage < last && s.device_of_stage(stage + 1) == device) {  // the next stage is local: take its input gradient
          int& dx_next = pl.held(BufferRole::kInputGrad, s.chunk_of_stage(stage + 1), m);
          if (dx_next == kNoBuffer) throw_error(where, "runs ", kind, " before its gradient exists");
          dy = dx_next;
          dx_next = kNoBuffer;
        } else if (dy == kNoBuffer) {
          throw_error(where, "runs ", kind, " before receiving its gradient");
        }
        pc.dy = dy;
      }
      // The micro-batch's stash slot (a collective, R, works on the chunk and needs none).
      int& slot = pl.slot(c, m);
      if (needs.keeps) {
        if (slot != -1) throw_error(where, "runs ", kind, " of a micro-batch it keeps already");
        slot = pl.take_slot(c);
        plan.peak_kept = std::max(plan.peak_kept, ++kept);
      } else if (slot == kInputOnly && !is_collective(a.phase)) {
        throw_error(where, "runs ", kind, " before the recomputation (C) of its micro-batch");
      } else if (slot == kAway && !is_collective(a.phase)) {
        throw_error(where, "runs ", kind, " before the reload (L) of its micro-batch");
      } else if (slot < 0 && !is_collective(a.phase)) {
        throw_error(where, "runs ", kind, " before its forward");
      }
      pc.slot = is_collective(a.phase) ? -1 : slot;
      if (needs.keeps && pc.recomputed) {  // a recomputed forward keeps nothing in its slot: the next one may take it
        pl.release_slot(c, slot);
        slot = kInputOnly;
      }
      // Writes: fresh buffers.
      if (needs.y == Use::kWrite) {
        pc.y = pl.held(BufferRole::kOutput, c, m) = pl.take(c, BufferRole::kOutput);
        if (stage == last) pc.dy = pl.held(BufferRole::kOutputGrad, c, m) = pl.take(c, BufferRole::kOutputGrad);
      }
      if (needs.dx == Use::kWrite && stage > 0)
        pc.dx = pl.held(BufferRole::kInputGrad, c, m) = pl.take(c, BufferRole::kInputGrad);
      // The end of the micro-batch: everything kept for it is done with.
      if (needs.releases) {
        for (BufferRole role : {BufferRole::kInput, BufferRole::kOutput, BufferRole::kOutputGrad}) {
          int& h = pl.held(role, c, m);
          if (role == BufferRole::kInput && pc.x == kNoBuffer) pc.x = h;
          if (role == BufferRole::kOutput && pc.y == kNoBuffer) pc.y = h;
          pl.release(h);
          h = kNoBuffer;
        }
        pl.release_slot(c, slot);
        slot = -1;
        --kept;
      }
      if (a.phase == Phase::kBackwardInput) input_done[unit] = 1;
      // The action that completes a stash an O moves later issues the O's copy, into a host slot taken now.
      const int o = needs.keeps ? offload_before[unit] : a.phase == Phase::kBackwardInput ? offload_window[unit] : -1;
      if (o >= 0 && !is_collective(a.phase)) {
        pc.issues = o;
        issued[unit] = pl.take_host(c);
      }
      ps.has_compute = true;
      ps.compute = pc;
    }
    plan.steps.push_back(ps);
  }
  for (std::size_t t = 0; t + 1 < plan.steps.size(); ++t)  // a pair waits before its first step for both halves'
    if (plan.steps[t].has_compute && plan.steps[t].compute.action.overlaps_next)
      plan.steps[t].waits_copy = std::max(plan.steps[t].waits_copy, std::exchange(plan.steps[t + 1].waits_copy, -1));
  return plan;
}

}  // namespace pipeweave
