#pragma once
/// \file
/// The rendezvous step engine: lowered steps run as the devices run them, each
/// device posting its current step's group, each operation waiting in its ring
/// pair's FIFO, a step completing when all its operations have matched (StepRun).
/// The verifier decides checks 5-7 with it (verify.hpp words what fails) and the
/// simulator's steps replay observes it (simulate.hpp).

#include <cstddef>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::detail {

/// What check 5 remembers of each tensor: the step of its compute (when it
/// crosses devices), of its send and of its receive; -1 for none. ExactMarks
/// keeps the steps, for the messages; FlagMarks one byte per tensor (bits 1, 2,
/// 4), which is all the run needs to decide (it words nothing: see
/// report_steps()).
class ExactMarks {
 public:
  constexpr explicit ExactMarks(int n) : steps_(3 * n, -1), n_(n) {}
  constexpr int computed(int x) const { return steps_[x]; }
  constexpr int sent(int x) const { return steps_[n_ + x]; }
  constexpr int received(int x) const { return steps_[2 * n_ + x]; }
  constexpr void set_computed(int x, int t) { steps_[x] = t; }
  constexpr void set_sent(int x, int t) { steps_[n_ + x] = t; }
  constexpr void set_received(int x, int t) { steps_[2 * n_ + x] = t; }

 private:
  Buffer<int> steps_;
  int n_;
};

struct FlagMarks {
  unsigned char* flags;
  constexpr int computed(int x) const { return flags[x] & 1 ? 0 : -1; }
  constexpr int sent(int x) const { return flags[x] & 2 ? 0 : -1; }
  constexpr int received(int x) const { return flags[x] & 4 ? 0 : -1; }
  constexpr void set_computed(int x, int) const { flags[x] |= 1; }
  constexpr void set_sent(int x, int) const { flags[x] |= 2; }
  constexpr void set_received(int x, int) const { flags[x] |= 4; }
};

/// Which rule of check 5 an operation breaks first, in the order the messages
/// are given.
enum class OpFault : unsigned char {
  kNone,
  kNotAnotherDevice,   ///< its peer is not another device
  kNotConsumed,        ///< no stage of the model consumes its tensor
  kSendsForeign,       ///< sends a tensor another device produces
  kSendsElsewhere,     ///< sends to a device that does not consume it
  kSendsUncomputed,    ///< sends before the step that computes it
  kSendsTwice,
  kReceivesForeign,    ///< receives a tensor another device consumes
  kReceivesElsewhere,  ///< receives from a device that does not produce it
  kReceivesTwice,
};

/// Check 5 of one operation of device d, decided: the first rule it breaks, the
/// tensor's index and the devices that produce and consume it (when in range).
struct OpCheck {
  OpFault fault;
  int tensor;
  int producer_device;
  int consumer_device;
  int consumer_stage;
};

template <class Marks>
constexpr OpCheck check_op(const ScheduleShape& s, const int* device_of, int d, const P2POp& op,
                           const Marks& marks) {
  const TensorId& x = op.tensor;
  const bool activation = x.kind == TensorKind::kActivation;
  const int consumer = activation ? x.stage + 1 : x.stage - 1;
  if (op.peer < 0 || op.peer >= s.devices || op.peer == d) return {OpFault::kNotAnotherDevice, 0, 0, 0, consumer};
  if (x.stage < 0 || x.stage >= s.stages() || consumer < 0 || consumer >= s.stages() || x.micro_batch < 0 ||
      x.micro_batch >= s.micro_batches || (!activation && x.kind != TensorKind::kGradient))
    return {OpFault::kNotConsumed, 0, 0, 0, consumer};
  OpCheck c{OpFault::kNone, tensor_index(s, x), device_of[x.stage], device_of[consumer], consumer};
  if (op.kind == OpKind::kSend) {
    if (c.producer_device != d) c.fault = OpFault::kSendsForeign;
    else if (op.peer != c.consumer_device) c.fault = OpFault::kSendsElsewhere;
    else if (marks.computed(c.tensor) < 0) c.fault = OpFault::kSendsUncomputed;
    else if (marks.sent(c.tensor) >= 0) c.fault = OpFault::kSendsTwice;
  } else {
    if (c.consumer_device != d) c.fault = OpFault::kReceivesForeign;
    else if (op.peer != c.producer_device) c.fault = OpFault::kReceivesElsewhere;
    else if (marks.received(c.tensor) >= 0) c.fault = OpFault::kReceivesTwice;
  }
  return c;
}

/// Check 5 of the action of step t of device d (after the step's group),
/// decided: -1 when its input from another device was not received by now,
/// else the index of the tensor it computes for another device (marked
/// computed), or -2 for none.
template <class Marks>
constexpr int check_compute(const ScheduleShape& s, const FlowRow* rows, int d, int t, const Action& a,
                            Marks& marks) {
  const FlowRow& r = rows[FlowTable::index(s, a.phase, a.chunk, d)];
  if (r.in_stage >= 0 && r.in_device != d) {
    const int got = marks.received(r.in + a.micro_batch);
    if (got < 0 || got > t) return -1;
  }
  if (r.out_stage < 0 || r.out_device == d) return -2;
  marks.set_computed(r.self + a.micro_batch, t);
  return r.self + a.micro_batch;
}

/// A posted operation waiting for its counterpart on its ring pair.
struct PostedOp {
  int device;
  int tensor;  // tensor_index()
  int next;
};

/// The sends and the receives posted on a ring pair and not yet matched.
struct PairFifo {
  int send_head;
  int send_tail;
  int recv_head;
  int recv_tail;
};

/// What the run keeps of one device.
struct RunLane {
  int cursor;     // the next step of its steps to post
  int at;         // the number of its steps completed: the current step
  int unmatched;  // operations of the posted step not matched yet
  int ops;        // operations of the posted step
  Action compute;
  unsigned char posted;
  unsigned char has_compute;
  unsigned char queued;
  unsigned char pair_open;  // its last step was a pair's forward: the next, the backward, has no group
};

/// Where the run keeps its state: Buffers at run time (RunStorage), or the
/// arrays of a compile-time chunk, so that a run too long for one constant
/// evaluation is carried on by the next.
struct RunMemory {
  unsigned char* flags;  // [action_count]: 1 computed for another device, 2 sent, 4 received
  RunLane* lanes;        // [P]
  PairFifo* fifos;       // [2P]
  PostedOp* nodes;       // [operations posted and unmatched at once, at most + 1]
  int* ready;            // [P]: devices that may move on
};

/// The run's scalars.
struct RunClock {
  int free_node;
  int fresh_node;
  int ready_count;
  int sent;      // sends posted
  int crossing;  // computes of a tensor for another device
  bool failed;
};

/// Sets up a run's memory for a shape: every device ready at its first step.
constexpr void run_begin(const ScheduleShape& s, const RunMemory& mem, RunClock& clock) {
  const int results = s.action_count();
  for (int x = 0; x < results; ++x) mem.flags[x] = 0;
  for (int d = 0; d < s.devices; ++d) {
    mem.lanes[d] = {0, 0, 0, 0, Action{}, 0, 0, 1, 0};
    mem.ready[d] = s.devices - 1 - d;
  }
  for (int p = 0; p < 2 * s.devices; ++p) mem.fifos[p] = {-1, -1, -1, -1};
  clock = {-1, 0, s.devices, 0, 0, false};
}

/// Checks 5-7 in one run of the steps under rendezvous semantics, as the devices
/// run them: a device posts its current step's group (check 5 for each
/// operation and the step's action), each operation waits in its ring pair's
/// FIFO of sends or of receives, the heads of the two FIFOs match (check 6: they
/// must carry one tensor), and a step completes when all of its operations have
/// matched; then the device posts its next step. If every step completes, no
/// deadlock exists (check 7). The run costs O(1) per step and per operation; it
/// keeps one byte per tensor and the operations posted but not yet matched.
///
/// It reads stored steps in place (views), or steps handed to it one at a time
/// in each device's order (step(), the sink of lower_steps()), keeping only
/// those not yet completed. It decides; it does not word: when it fails,
/// report_steps() finds the first violation in the order of the checks.
///
/// `observe.posted(d, t)`, `observe.matched(from, to)` (between the current
/// steps of the two devices) and `observe.completed(d, t, has_compute, action,
/// operations)` follow the run: the simulator's steps replay.
///
/// With `kLocalInputs`, the run also decides checks 3 and 4 of stored steps:
/// each action's inputs from its own device must be computed at an earlier step
/// (flag 8 marks every result computed). A run that completes is then an order
/// in which every action comes after all of its inputs, so no cycle exists, and
/// verify_lowered() needs no run of the actions apart. Steps made by
/// lower_steps() hold that by construction, so the other runs leave it out.
template <class Observer, bool kLocalInputs = false>
class StepRun {
 public:
  /// Over `mem` and `clock` (run_begin() first); reads `views[d]` for device d's
  /// steps, or, with null views, the steps handed to step().
  constexpr StepRun(const ScheduleShape& s, Observer& observe, const RunMemory& mem, RunClock& clock,
                    const StepsView* views)
      : s_(s), flows_(s), devices_(s), ring_(s.devices), observe_(observe), mem_(mem), clock_(clock), views_(views) {
    if (views == nullptr) windows_ = Buffer<StepList>(s.devices);
  }

  /// Takes device d's next step (a sink of lower_steps()) and runs as far as it
  /// can. A device free to post it posts it at once; otherwise it waits in the
  /// device's window.
  constexpr void step(int d, const P2POp* ops, int n, bool has_compute, const Action& a) {
    if (clock_.failed) return;
    if (!mem_.lanes[d].posted && windows_[d].empty()) {
      post(d, ops, n, has_compute, a);
      wake(d);
    } else {
      windows_[d].append(ops, n, has_compute, a);
    }
    run(-1);
  }

  /// Runs the ready devices until none can move, a check fails, or `budget`
  /// steps completed (a negative budget: no bound). False when a check failed.
  constexpr bool run(int budget) {
    RunLane* lane = mem_.lanes;
    int completed = 0;
    while (!clock_.failed && clock_.ready_count > 0) {
      if (completed == budget) return true;
      const int d = mem_.ready[--clock_.ready_count];
      RunLane& l = lane[d];
      l.queued = 0;
      for (;;) {
        if (!l.posted) {
          const StepsView v = view(d);
          if (l.cursor >= v.steps) break;
          const StepRecord& r = v.records[l.cursor];
          const int begin = l.cursor == 0 ? 0 : v.records[l.cursor - 1].op_end;
          if (!std::is_constant_evaluated()) {  // the device's steps a few visits ahead, while other devices run
            prefetch(v.records, l.cursor + 16, v.steps);
            if (l.cursor + 4 < v.steps) prefetch(v.ops, v.records[l.cursor + 4].op_end, v.records[v.steps - 1].op_end);
          }
          ++l.cursor;
          post(d, v.ops + begin, r.op_end - begin, r.has_compute, r.compute());
        }
        if (clock_.failed || l.unmatched > 0) break;
        observe_.completed(d, l.at, l.has_compute != 0, l.compute, l.ops);
        l.posted = 0;
        ++l.at;
        ++completed;
        if (views_ == nullptr && l.cursor == static_cast<int>(windows_[d].size()) && l.cursor > 0) {
          windows_[d].clear();  // a window fully run: empty it
          l.cursor = 0;
        }
        if (completed == budget) {  // to go on later, from the ready list
          wake(d);
          return true;
        }
      }
    }
    return !clock_.failed;
  }

  /// True when every step completed, every tensor computed for another device
  /// was sent, and no check failed.
  constexpr bool complete() const {
    for (int d = 0; d < s_.devices; ++d)
      if (mem_.lanes[d].posted || mem_.lanes[d].cursor != view(d).steps) return false;
    return !clock_.failed && clock_.sent == clock_.crossing;
  }

 private:
  constexpr StepsView view(int d) const { return views_ != nullptr ? views_[d] : windows_[d].view(); }

  constexpr void wake(int d) {
    if (mem_.lanes[d].queued) return;
    mem_.lanes[d].queued = 1;
    mem_.ready[clock_.ready_count++] = d;
  }

  /// Posts device d's current step: check 5 for each operation (here only
  /// decided; report_steps() words it) and the action, each operation into its
  /// pair's FIFO, and the FIFOs matched.
  constexpr void post(int d, const P2POp* ops, int n, bool has_compute, const Action& a) {
    RunLane& l = mem_.lanes[d];
    const FlowRow* rows = flows_.data();
    const int* device_of = devices_.data();
    FlagMarks marks{mem_.flags};
    PairFifo* fifos = mem_.fifos;
    PostedOp* nodes = mem_.nodes;
    observe_.posted(d, l.at);
    if (l.pair_open && n > 0) {
      clock_.failed = true;
      return;
    }
    l = {l.cursor, l.at, n, n, a, 1, static_cast<unsigned char>(has_compute), l.queued,
         static_cast<unsigned char>(has_compute && a.overlaps_next)};
    for (int i = 0; i < n; ++i) {
      const OpCheck c = check_op(s_, device_of, d, ops[i], marks);
      if (c.fault != OpFault::kNone) {
        clock_.failed = true;
        return;
      }
      const bool is_send = ops[i].kind == OpKind::kSend;
      if (is_send) {
        marks.set_sent(c.tensor, l.at);
        ++clock_.sent;
      } else {
        marks.set_received(c.tensor, l.at);
      }
      // At most one of a pair's two FIFOs holds operations: one posted when the
      // other FIFO has some meets its head (FIFO order), else it waits at its own tail.
      PairFifo& q = fifos[ring_.index(c.producer_device, c.consumer_device)];
      int& other_head = is_send ? q.recv_head : q.send_head;
      if (other_head < 0) {
        int node = clock_.free_node;
        if (node >= 0) clock_.free_node = nodes[node].next;
        else node = clock_.fresh_node++;
        nodes[node] = {d, c.tensor, -1};
        int& head = is_send ? q.send_head : q.recv_head;
        int& tail = is_send ? q.send_tail : q.recv_tail;
        if (head < 0) head = node;
        else nodes[tail].next = node;
        tail = node;
        continue;
      }
      const int node = other_head;
      PostedOp& waiting = nodes[node];
      if (waiting.tensor != c.tensor) {
        clock_.failed = true;
        return;
      }
      const int peer = waiting.device;
      other_head = waiting.next;
      waiting.next = clock_.free_node;  // the node back to the free list
      clock_.free_node = node;
      const int from = is_send ? d : peer, to = is_send ? peer : d;
      observe_.matched(from, to);
      if (--mem_.lanes[from].unmatched == 0) wake(from);
      if (--mem_.lanes[to].unmatched == 0) wake(to);
    }
    if (has_compute) {
      const int made = check_compute(s_, rows, d, l.at, a, marks);
      if (made == -1) clock_.failed = true;
      clock_.crossing += made >= 0;
      if constexpr (kLocalInputs) {
        const FlowRow& r = rows[FlowTable::index(s_, a.phase, a.chunk, d)];
        unsigned char* flags = mem_.flags;
        for (int j = 0; j < r.needs; ++j)
          if (r.need_device[j] == d && (flags[r.need[j] + a.micro_batch] & 8) == 0) clock_.failed = true;
        flags[r.self + a.micro_batch] |= 8;
      }
    }
  }

  const ScheduleShape s_;  // a copy: the run's byte stores cannot alias it
  FlowTable flows_;
  StageDevices devices_;
  RingPairs ring_;
  Observer& observe_;
  RunMemory mem_;
  RunClock& clock_;
  const StepsView* views_;    // stored steps, or
  Buffer<StepList> windows_;  // streamed steps handed over before their device was free
};

/// A run's memory in Buffers (run time, and one constant evaluation).
struct RunStorage {
  Buffer<unsigned char> flags;
  Buffer<RunLane> lanes;
  Buffer<PairFifo> fifos;
  Buffer<PostedOp> nodes;
  Buffer<int> ready;
  RunClock clock{};
  constexpr RunStorage(const ScheduleShape& s, int max_ops)
      : flags(s.action_count()), lanes(s.devices), fifos(2 * s.devices), nodes(max_ops + 1), ready(s.devices) {
    run_begin(s, memory(), clock);
  }
  constexpr RunMemory memory() { return {flags.data(), lanes.data(), fifos.data(), nodes.data(), ready.data()}; }
};

/// Views of every device's stored steps, and how many operations they hold.
struct StepViews {
  Buffer<StepsView> views;
  int ops = 0;
  constexpr explicit StepViews(const LoweredProgram& lp) : views(static_cast<int>(lp.devices.size())) {
    for (int d = 0; d < views.size(); ++d) {
      views[d] = lp.devices[static_cast<std::size_t>(d)].view();
      ops += lp.devices[static_cast<std::size_t>(d)].op_count();
    }
  }
  constexpr const StepsView* data() const { return views.data(); }
};

}  // namespace pipeweave::detail
