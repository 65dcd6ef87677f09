#pragma once
/// \file
/// The device plan: one pass over a device's lowered steps, before the first
/// training step, that decides which buffer every tensor lives in. The executor
/// then runs the steps with table lookups only: no maps, no allocation.
///
/// Each chunk c has four pools of equally sized buffers:
/// - kInput: the activation entering the chunk (received, or the previous stage's
///   output when that stage is on the same device; the first stage reads the batch);
/// - kOutput: the activation leaving it (sent, or passed on locally);
/// - kOutputGrad: the gradient of its output (received, passed on locally, or the
///   loss gradient at the last stage);
/// - kInputGrad: the gradient of its input (sent, or passed on locally).
///
/// A buffer is taken from its pool when its tensor first appears (a receive or the
/// action that computes it) and returned after its last use: B(c, m) for the
/// tensors the chunk keeps for backward, the group that sends it for an input
/// gradient. A received tensor may arrive steps before the action that needs it;
/// its buffer is simply taken earlier. Pools grow to the most buffers in use at
/// once, and chunk stash slots are handed out the same way (F takes one, B
/// returns it).

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// Which tensor of a chunk a buffer holds.
enum class BufferRole : unsigned char { kInput, kOutput, kOutputGrad, kInputGrad };

/// A buffer the executor allocates: its chunk and role (its size follows from them).
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

/// One compute action with its buffers: x, y for a forward (and dy, the loss
/// gradient, at the last stage); dy, dx for a backward (dx = kNoBuffer at stage 0).
struct PlannedCompute {
  Action action{};     ///< F or B of (chunk, micro-batch)
  int stage = 0;       ///< its virtual stage
  int slot = 0;        ///< the chunk's stash slot for the micro-batch
  int x = kNoBuffer;   ///< input activation (kBatchInput at stage 0)
  int y = kNoBuffer;   ///< output activation
  int dy = kNoBuffer;  ///< output gradient
  int dx = kNoBuffer;  ///< input gradient
};

/// One step: ops[first_op, first_op + op_count) then, if has_compute, compute.
struct PlannedStep {
  int first_op = 0;          ///< index of the group's first operation in DevicePlan::ops
  int op_count = 0;          ///< operations in the group
  int sends = 0;             ///< of which sends
  int recvs = 0;             ///< of which receives
  bool has_compute = false;  ///< whether an action follows the group
  PlannedCompute compute{};  ///< the action
};

/// A device's steps with every tensor placed in a buffer.
struct DevicePlan {
  int device = 0;                      ///< the device
  ScheduleShape shape{};               ///< the schedule's shape
  std::vector<PlannedStep> steps;      ///< [step of the lowered program]
  std::vector<PlannedOp> ops;          ///< every step's operations, in order
  std::vector<PlannedBuffer> buffers;  ///< every buffer to allocate
  std::vector<int> slots;   ///< [chunk]: stash slots the chunk needs (most micro-batches in flight)
  int peak_kept = 0;        ///< most forwards whose backward had not run yet, at once
  bool first_stage = false; ///< this device holds virtual stage 0 (reads the batch's inputs)
  bool last_stage = false;  ///< this device holds the last virtual stage (computes the loss)
};

namespace detail {

/// Free lists of the plan's pools and the reference counts of its buffers.
class PlanPools {
 public:
  explicit PlanPools(DevicePlan& plan, int chunks) : plan_(plan), free_(static_cast<std::size_t>(chunks) * 4) {}
  int take(int chunk, BufferRole role) {
    auto& list = free_[index(chunk, role)];
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
  void hold(int id) {
    if (id >= 0) ++refs_[static_cast<std::size_t>(id)];
  }
  void release(int id) {
    if (id < 0) return;
    if (--refs_[static_cast<std::size_t>(id)] == 0) {
      const PlannedBuffer& b = plan_.buffers[static_cast<std::size_t>(id)];
      free_[index(b.chunk, b.role)].push_back(id);
    }
  }

 private:
  static std::size_t index(int chunk, BufferRole role) {
    return static_cast<std::size_t>(chunk) * 4 + static_cast<std::size_t>(role);
  }
  DevicePlan& plan_;
  std::vector<std::vector<int>> free_;
  std::vector<int> refs_;
};

inline Error plan_error(int device, int step, const char* what, const TensorId* x = nullptr) {
  Text t;
  t << "device " << device << ", step " << step << ": " << what;
  if (x != nullptr) append_tensor(t << " ", *x);
  return Error(t.str());
}

}  // namespace detail

/// Places every tensor of device d's steps in a buffer. The lowered program must
/// be verified (verify()); a program that is not consistent throws pipeweave::Error.
inline DevicePlan plan_device(const LoweredProgram& lp, int device) {
  const ScheduleShape& s = lp.shape;
  if (device < 0 || device >= s.devices || lp.devices.size() != static_cast<std::size_t>(s.devices))
    throw Error("plan_device: device " + std::to_string(device) + " is not in the program");
  const int V = s.chunks, M = s.micro_batches, last = s.stages() - 1;
  DevicePlan plan;
  plan.device = device;
  plan.shape = s;
  plan.slots.assign(static_cast<std::size_t>(V), 0);
  plan.first_stage = s.device_of_stage(0) == device;
  plan.last_stage = s.device_of_stage(last) == device;
  detail::PlanPools pools(plan, V);
  // Per (role, chunk, micro-batch): the buffer holding that tensor now.
  const auto cm = static_cast<std::size_t>(V) * static_cast<std::size_t>(M);
  std::vector<int> held[4];
  for (auto& h : held) h.assign(cm, kNoBuffer);
  auto at = [&](BufferRole role, int chunk, int m) -> int& {
    return held[static_cast<int>(role)][static_cast<std::size_t>(chunk) * static_cast<std::size_t>(M) +
                                        static_cast<std::size_t>(m)];
  };
  std::vector<int> slot_of(cm, -1);
  std::vector<std::vector<int>> free_slots(static_cast<std::size_t>(V));
  int kept = 0;
  std::vector<int> sent_grads;  // input-gradient buffers to return after the current group
  const auto& steps = lp.devices[static_cast<std::size_t>(device)];
  plan.steps.reserve(steps.size());
  for (std::size_t t = 0; t < steps.size(); ++t) {
    const Step& st = steps[t];
    const int step = static_cast<int>(t);
    PlannedStep ps;
    ps.first_op = static_cast<int>(plan.ops.size());
    sent_grads.clear();
    for (const P2POp& op : st.ops) {
      const TensorId& x = op.tensor;
      if (x.micro_batch < 0 || x.micro_batch >= M || x.stage < 0 || x.stage > last)
        throw detail::plan_error(device, step, "a message is out of range:", &x);
      PlannedOp po{op.kind, op.peer, x, 0, kNoBuffer};
      const bool act = x.kind == TensorKind::kActivation;
      if (op.kind == OpKind::kRecv) {
        const int consumer = act ? x.stage + 1 : x.stage - 1;
        if (consumer < 0 || consumer > last || s.device_of_stage(consumer) != device)
          throw detail::plan_error(device, step, "receives a tensor no chunk of this device consumes:", &x);
        po.chunk = s.chunk_of_stage(consumer);
        const BufferRole role = act ? BufferRole::kInput : BufferRole::kOutputGrad;
        int& h = at(role, po.chunk, x.micro_batch);
        if (h != kNoBuffer) throw detail::plan_error(device, step, "receives a second time:", &x);
        h = pools.take(po.chunk, role);
        po.buffer = h;
        ++ps.recvs;
      } else {
        if (s.device_of_stage(x.stage) != device)
          throw detail::plan_error(device, step, "sends a tensor another device produces:", &x);
        po.chunk = s.chunk_of_stage(x.stage);
        const BufferRole role = act ? BufferRole::kOutput : BufferRole::kInputGrad;
        int& h = at(role, po.chunk, x.micro_batch);
        if (h == kNoBuffer) throw detail::plan_error(device, step, "sends a tensor not computed before:", &x);
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
    for (int id : sent_grads) pools.release(id);
    if (st.has_compute) {
      const Action& a = st.compute;
      if (a.chunk < 0 || a.chunk >= V || a.micro_batch < 0 || a.micro_batch >= M)
        throw detail::plan_error(device, step, "an action is out of range");
      const int c = a.chunk, m = a.micro_batch, stage = s.stage_of(device, c);
      PlannedCompute pc{a, stage, 0, kNoBuffer, kNoBuffer, kNoBuffer, kNoBuffer};
      int& slot = slot_of[static_cast<std::size_t>(c) * static_cast<std::size_t>(M) + static_cast<std::size_t>(m)];
      if (a.phase == Phase::kForward) {
        if (slot >= 0) throw detail::plan_error(device, step, "runs a forward twice");
        auto& fs = free_slots[static_cast<std::size_t>(c)];
        if (fs.empty()) {
          slot = plan.slots[static_cast<std::size_t>(c)]++;
        } else {
          slot = fs.back();
          fs.pop_back();
        }
        pc.slot = slot;
        int& x = at(BufferRole::kInput, c, m);
        if (stage == 0) {
          x = kBatchInput;
        } else if (s.device_of_stage(stage - 1) == device) {  // previous stage is local: share its output
          const int prev = s.chunk_of_stage(stage - 1);
          const int y_prev = at(BufferRole::kOutput, prev, m);
          if (y_prev == kNoBuffer) throw detail::plan_error(device, step, "runs a forward before its input exists");
          pools.hold(y_prev);
          x = y_prev;
        } else if (x == kNoBuffer) {
          throw detail::plan_error(device, step, "runs a forward before receiving its input");
        }
        pc.x = x;
        int& y = at(BufferRole::kOutput, c, m);
        y = pools.take(c, BufferRole::kOutput);
        pc.y = y;
        if (stage == last) {
          int& dy = at(BufferRole::kOutputGrad, c, m);
          dy = pools.take(c, BufferRole::kOutputGrad);
          pc.dy = dy;
        }
        plan.peak_kept = std::max(plan.peak_kept, ++kept);
      } else {
        if (slot < 0) throw detail::plan_error(device, step, "runs a backward before its forward");
        pc.slot = slot;
        int& dy = at(BufferRole::kOutputGrad, c, m);
        if (stage < last && s.device_of_stage(stage + 1) == device) {  // next stage is local: take its input gradient
          int& dx_next = at(BufferRole::kInputGrad, s.chunk_of_stage(stage + 1), m);
          if (dx_next == kNoBuffer) throw detail::plan_error(device, step, "runs a backward before its gradient exists");
          dy = dx_next;
          dx_next = kNoBuffer;
        } else if (dy == kNoBuffer) {
          throw detail::plan_error(device, step, "runs a backward before receiving its gradient");
        }
        pc.dy = dy;
        pc.x = at(BufferRole::kInput, c, m);
        pc.y = at(BufferRole::kOutput, c, m);
        if (stage > 0) {
          int& dx = at(BufferRole::kInputGrad, c, m);
          dx = pools.take(c, BufferRole::kInputGrad);
          pc.dx = dx;
        }
        // Everything kept for this micro-batch is done with after the backward.
        pools.release(pc.x);
        pools.release(pc.y);
        pools.release(pc.dy);
        at(BufferRole::kInput, c, m) = kNoBuffer;
        at(BufferRole::kOutput, c, m) = kNoBuffer;
        at(BufferRole::kOutputGrad, c, m) = kNoBuffer;
        free_slots[static_cast<std::size_t>(c)].push_back(slot);
        --kept;
      }
      ps.has_compute = true;
      ps.compute = pc;
    }
    plan.steps.push_back(ps);
  }
  return plan;
}

}  // namespace pipeweave
