#pragma once
/// \file
/// P2P lowering: each device's actions become steps, a step being one group of
/// sends and receives followed by at most one compute action. Matching follows
/// NCCL: per directed pair of devices, messages match in FIFO order with no tags,
/// and a group completes only when each of its operations is matched.
///
/// lower() places every send and its receive at one instant of a planned timeline;
/// see there for the rule and why it cannot deadlock. Its cost is linear in the
/// number of actions: no table is P x P, and no instant looks at a device that
/// has nothing happening at it.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Send or receive.
enum class OpKind : unsigned char { kSend, kRecv };

/// One point-to-point operation of a group. A plain aggregate: `P2POp{}` is a
/// send to device 0 of the activation of stage 0, micro-batch 0.
struct P2POp {
  OpKind kind;
  int peer;
  TensorId tensor;
  friend constexpr bool operator==(const P2POp&, const P2POp&) = default;
};

/// One step as a device runs it: the group `ops` completes first, then `compute`
/// runs if `has_compute`. A view into its StepList, valid while the list lives
/// unchanged.
struct Step {
  std::span<const P2POp> ops;
  bool has_compute = false;
  Action compute{};
  friend constexpr bool operator==(const Step& a, const Step& b) {
    return a.has_compute == b.has_compute && a.compute == b.compute && std::ranges::equal(a.ops, b.ops);
  }
};

/// A step written out with its own operations: the form to write a lowered
/// program by hand or to edit one (`StepList(list.specs())` builds it back).
struct StepSpec {
  std::vector<P2POp> ops;
  bool has_compute = false;
  Action compute{};
  friend constexpr bool operator==(const StepSpec&, const StepSpec&) = default;
};

namespace detail {

/// A step as stored: its group is the list's operations [previous op_end,
/// op_end); its action, when it has one, is (phase, chunk, micro_batch,
/// overlaps_next).
struct StepRecord {
  int op_end;
  int chunk;
  int micro_batch;
  Phase phase;
  bool has_compute;
  bool overlaps_next;
  constexpr Action compute() const { return {phase, chunk, micro_batch, overlaps_next}; }
  friend constexpr bool operator==(const StepRecord&, const StepRecord&) = default;
};

/// The record of a step whose group ends at operation `op_end`.
constexpr StepRecord step_record(int op_end, bool has_compute, const Action& a) {
  return has_compute ? StepRecord{op_end, a.chunk, a.micro_batch, a.phase, true, a.overlaps_next}
                     : StepRecord{op_end, 0, 0, Phase::kForward, false, false};
}

/// One device's steps in place: records[0, steps), whose operations are in
/// ops (record t's group is ops[record t-1's op_end, record t's op_end)).
struct StepsView {
  const StepRecord* records;
  int steps;
  const P2POp* ops;
};

}  // namespace detail

/// One device's steps, stored flat: one array of step records and one of all
/// their operations, so that a device's program is two allocations however long
/// it is. Indexing and iteration give Step views.
class StepList {
 public:
  /// Iterates the steps as Step values.
  class iterator {
   public:
    using value_type = Step;
    using difference_type = std::ptrdiff_t;
    constexpr iterator() = default;
    constexpr iterator(const StepList* list, std::size_t t) : list_(list), t_(t) {}
    constexpr Step operator*() const { return (*list_)[t_]; }
    constexpr iterator& operator++() {
      ++t_;
      return *this;
    }
    constexpr iterator operator++(int) {
      iterator old = *this;
      ++t_;
      return old;
    }
    friend constexpr bool operator==(const iterator&, const iterator&) = default;

   private:
    const StepList* list_ = nullptr;
    std::size_t t_ = 0;
  };

  constexpr StepList() = default;
  /// Steps written out: `StepList{{{ops...}, true, fwd(0, 0)}, {{}, true, bwd(0, 0)}}`.
  constexpr StepList(std::initializer_list<StepSpec> steps) {
    for (const StepSpec& s : steps) push_back(s);
  }
  constexpr explicit StepList(const std::vector<StepSpec>& steps) {
    for (const StepSpec& s : steps) push_back(s);
  }

  constexpr std::size_t size() const { return static_cast<std::size_t>(records_.size()); }
  constexpr bool empty() const { return records_.empty(); }
  /// Step t as a view.
  constexpr Step operator[](std::size_t t) const {
    const int i = static_cast<int>(t);
    const int begin = op_begin(i);
    const detail::StepRecord& r = records_[i];
    return {std::span<const P2POp>(ops_.data() + begin, static_cast<std::size_t>(r.op_end - begin)), r.has_compute,
            r.compute()};
  }
  constexpr Step back() const { return (*this)[size() - 1]; }
  constexpr iterator begin() const { return {this, 0}; }
  constexpr iterator end() const { return {this, size()}; }
  /// Every operation of every step, in step order.
  constexpr std::span<const P2POp> ops() const {
    return std::span<const P2POp>(ops_.data(), static_cast<std::size_t>(ops_.size()));
  }
  /// The steps written out, to edit: change the vector, then `StepList(specs)`.
  constexpr std::vector<StepSpec> specs() const {
    std::vector<StepSpec> out;
    out.reserve(size());
    for (const Step& st : *this) out.push_back({std::vector<P2POp>(st.ops.begin(), st.ops.end()), st.has_compute, st.compute});
    return out;
  }

  /// Appends a step: the group `ops` (empty for none), then `compute` if `has_compute`.
  constexpr void push_back(std::span<const P2POp> ops, bool has_compute = false, const Action& compute = {}) {
    append(ops.data(), static_cast<int>(ops.size()), has_compute, compute);
  }
  constexpr void push_back(const StepSpec& step) { push_back(step.ops, step.has_compute, step.compute); }
  /// Appends a step whose group is ops[0, n).
  constexpr void append(const P2POp* ops, int n, bool has_compute, const Action& compute) {
    ops_.append(ops, n);
    records_.push_back(detail::step_record(ops_.size(), has_compute, compute));
  }
  /// Removes every step, keeping the storage.
  constexpr void clear() {
    records_.clear();
    ops_.clear();
  }
  /// Room for `steps` steps and `ops` operations.
  constexpr void reserve(int steps, int ops) {
    records_.reserve(steps);
    ops_.reserve(ops);
  }

  /// The storage, for the loops of the verifier and the simulator: step t's group
  /// is op_data()[op_begin(t), record_data()[t].op_end).
  constexpr const detail::StepRecord* record_data() const { return records_.data(); }
  constexpr const P2POp* op_data() const { return ops_.data(); }
  constexpr int op_count() const { return ops_.size(); }
  constexpr int op_begin(int t) const { return t == 0 ? 0 : records_[t - 1].op_end; }
  constexpr detail::StepsView view() const { return {records_.data(), records_.size(), ops_.data()}; }

  friend constexpr bool operator==(const StepList&, const StepList&) = default;

 private:
  detail::Buffer<detail::StepRecord> records_;
  detail::Buffer<P2POp> ops_;
};

/// Every device's steps.
struct LoweredProgram {
  ScheduleShape shape;
  std::vector<StepList> devices;
  friend constexpr bool operator==(const LoweredProgram&, const LoweredProgram&) = default;
};

namespace detail {

/// The error of a program or costs that lower() cannot take: "lower: " and
/// what is wrong (the one place that words the prefix).
inline Error lower_error(std::string_view what) { return Error(Text("lower: ").append(what).str()); }

/// Whether every cost of a reference clock is at least 1.
constexpr bool costs_valid(const LoweringCosts& c) {
  for (const long long x : c.cost)
    if (x < 1) return false;
  return true;
}

/// Every device's actions as flat rows: device d's k-th action is rows[d][k]
/// (k < counts[d]), at step steps[d][k] of its device (the index k itself where
/// steps[d] is null: a program of actions). Built in O(P) over a Program or a
/// compile-time schedule's arrays, without copying an action.
struct ActionTable {
  ScheduleShape shape;
  Buffer<const Action*> rows;
  Buffer<int> counts;
  Buffer<const int*> steps;
  int total = 0;  ///< actions over all devices
  LoweringCosts costs{};  ///< the reference clock the program's steps are planned on (Program::lowering)...
  const LoweringCosts* stage_costs = nullptr;  ///< ...or one per virtual stage (Program::stage_lowering)
  int stage_cost_count = 0;                    ///< how many stage_costs holds (0: `costs` for all)

  constexpr int step_of(int device, int k) const { return steps[device] == nullptr ? k : steps[device][k]; }
  /// The clock of one virtual stage.
  constexpr const LoweringCosts& clock_of(int stage) const {
    return stage < stage_cost_count ? stage_costs[stage] : costs;  // clock_error() says when the count is wrong
  }
};

/// Describes what is wrong with a table's reference clock; empty when lower_steps() can take it.
constexpr Text clock_error(const ActionTable& t) {
  Text e;
  // The count, not the pointer, says whether there are clocks per stage: under AddressSanitizer GCC does not
  // take a compile-time schedule's array address as a constant to compare.
  if (t.stage_cost_count > 0 && t.stage_cost_count != t.shape.stages()) {
    e << "the program's reference clock per stage (Program::stage_lowering) must hold one clock for each of its "
      << t.shape.stages() << " virtual stages, or none (got " << t.stage_cost_count << ")";
    return e;
  }
  bool ok = costs_valid(t.costs);
  for (int st = 0; st < t.stage_cost_count; ++st) ok = ok && costs_valid(t.stage_costs[st]);
  if (!ok) e << "the program's reference clock (Program::lowering and Program::stage_lowering) must give every phase a cost of at least 1";
  return e;
}

/// The table of any container of per-device action arrays (vectors or std::arrays).
template <class Rows>
constexpr ActionTable action_table(const ScheduleShape& s, const Rows& devices) {
  const int P = static_cast<int>(devices.size());
  ActionTable t{s, Buffer<const Action*>(P), Buffer<int>(P), Buffer<const int*>(P, nullptr), 0, {}};
  for (int d = 0; d < P; ++d) {
    const auto& row = devices[static_cast<std::size_t>(d)];
    t.rows[d] = row.data();
    t.counts[d] = static_cast<int>(row.size());
    t.total += t.counts[d];
  }
  return t;
}

/// Sets a table's reference clock: `costs` for every stage, or one per stage
/// where `stages` is not empty.
template <class StageClocks>
constexpr void set_clock(ActionTable& t, const LoweringCosts& costs, const StageClocks& stages) {
  t.costs = costs;
  t.stage_costs = stages.empty() ? nullptr : stages.data();
  t.stage_cost_count = static_cast<int>(stages.size());
}

/// The table of a program, with its reference clock.
constexpr ActionTable action_table(const Program& p) {
  ActionTable t = action_table(p.shape, p.devices);
  set_clock(t, p.lowering, p.stage_lowering);
  return t;
}

/// The directed pairs of devices a message can travel on: consecutive stages sit
/// on the same device or on ring neighbours (d -> d+1 or d -> d-1, mod P; one
/// pair when P = 2). Pair (from, side) has index 2 * from + side, side 0 towards
/// from+1 and side 1 towards from-1, so that pair indices sort as (from, to) do
/// around one device.
class RingPairs {
 public:
  constexpr explicit RingPairs(int devices) : devices_(devices) {}
  constexpr int next(int d) const { return d + 1 == devices_ ? 0 : d + 1; }
  constexpr int prev(int d) const { return d == 0 ? devices_ - 1 : d - 1; }
  /// The pair from -> to; -1 when `to` is not a ring neighbour of `from`.
  constexpr int index(int from, int to) const {
    if (to == next(from)) return 2 * from;
    if (to == prev(from)) return 2 * from + 1;
    return -1;
  }
  constexpr int to(int pair) const { return pair % 2 == 0 ? next(pair / 2) : prev(pair / 2); }
  /// How many pairs a device sends or receives on: 4, 2 when P = 2, 0 when P = 1.
  constexpr int around_count() const { return devices_ < 2 ? 0 : devices_ == 2 ? 2 : 4; }
  /// The j-th of the pairs device d sends or receives on, in index order.
  constexpr int around(int d, int j) const {
    if (devices_ == 2) return 2 * j;  // 0 -> 1, then 1 -> 0
    // prev -> d, d -> next, d -> prev, next -> d; only the ring's wrap puts one out of place.
    constexpr int first[4] = {0, 1, 3, -2}, last[4] = {1, -2, 0, 1}, middle[4] = {-2, 0, 1, 3};
    if (d == 0) return j == 3 ? 2 * devices_ - 2 : first[j];
    if (d == devices_ - 1) return j == 0 ? 1 : 2 * d + last[j];
    return 2 * d + middle[j];
  }
  /// The position of `pair` among the pairs device d sends or receives on (see around()).
  constexpr int slot(int d, int pair) const {
    for (int j = 0; j < around_count(); ++j)
      if (around(d, j) == pair) return j;
    return -1;
  }

 private:
  int devices_ = 1;
};

/// The rank of a compute step among those that end at one instant: its phase,
/// then the overlapped pairs of a forward and a B, then those of a forward and
/// an I; steps of one rank end in the order they started.
constexpr int run_rank(const Action& a, const Action& second) {
  return !a.overlaps_next ? static_cast<int>(a.phase) : second.phase == Phase::kBackward ? kPhases : kPhases + 1;
}

/// Number of ranks (run_rank()): one FIFO each when every stage has one clock.
inline constexpr int kRunQueues = kPhases + 2;

/// A message waiting for delivery, in a pool of nodes linked per ring pair.
struct MessageNode {
  TensorId tensor;
  int index;  // tensor_index()
  int next;
};

/// What the lowering keeps of one device.
struct LoweringLane {
  const Action* row;     // its actions
  int pos;               // the next action to start
  int count;
  long long busy_until;  // end of the running action
  long long step_at;     // the instant of the step it is making, if any
  int group_begin;       // that step's group in the scratch operations
  int group_end;
  Action compute;        // that step's action, if has_compute (a pair's forward)
  Action second;         // a pair's backward
  int self[2];           // the running action's index (a pair: of each half)
  int out_to[2];         // the device its result goes to (itself: no message)
  TensorId out[2];       // the message
  int awaited;           // while blocked: the result it waits for
  int next_waiter;       // the next device waiting on the same producer
  int first_waiter;      // the first device waiting for a result of this one
  int around[4];         // the pairs it sends or receives on, RingPairs::around(d, j)
  unsigned char running;
  unsigned char halves;     // actions of the running step: 1, or 2 for a pair
  unsigned char has_compute;
  unsigned char pending;    // bit j: pair around[j] holds undelivered messages
  unsigned char delivered;  // bit j: pair around[j] delivered at this instant
  int rank;                 // the running step's run_rank()
  long long started;        // and its place in start order
};

/// What the lowering keeps of one ring pair: its waiting messages (head..tail),
/// those it delivered at the current instant, its devices and its slot among the
/// pairs of each (RingPairs::around()).
struct LoweringPair {
  int head;
  int tail;
  int delivered;
  int delivered_tail;
  int unread;  // of the two devices, how many have not written the delivered operations yet
  int from;
  int to;
  int from_slot;
  int to_slot;
};

/// Where the lowering keeps its state between instants: Buffers at run time,
/// or the arrays of a compile-time chunk (StaticSchedule), so that a lowering
/// too long for one constant evaluation is carried on by the next.
struct LoweringMemory {
  LoweringLane* lanes;       // [P]
  LoweringPair* pairs;       // [2P]
  unsigned char* available;  // [action_count]: the result is where its consumer needs it
  MessageNode* nodes;        // [actions + 1]: at most one message per action is in flight
  int* running;              // [kRunQueues * P]: the running devices (see LoweringClock::one_clock)
};

/// The lowering's scalars between instants.
struct LoweringClock {
  long long now;
  int remaining;  // actions not finished
  int free_node;
  int fresh_node;
  int running;        // devices running
  long long started;  // steps started so far
  bool begun;         // instant 0 is done
  // One clock for every stage: each rank's steps last alike, so they end in the
  // order they started, and the running devices wait in one FIFO per rank
  // (rank r: a ring at running + r * P), O(1) each. Else a clock per stage: a
  // binary heap by end, then rank, then start order (the first P of running),
  // O(log P) each. Both hand the steps ending at one instant over in the same
  // order: by rank, then start.
  bool one_clock;
  int queue_head[kRunQueues];
  int queue_size[kRunQueues];
};

/// What lower_steps() says of its run.
enum class LoweringStatus : unsigned char {
  kDone,     ///< every action ran
  kStalled,  ///< no device can go on while some have actions left (a cycle, or a missing action)
  kPaused,   ///< the budget is spent; call again to go on
};

/// Sets up the lowering's memory for a table.
constexpr void lower_begin(const ActionTable& table, const LoweringMemory& mem, LoweringClock& clock) {
  const ScheduleShape& s = table.shape;
  const int P = s.devices;
  const RingPairs ring(P);
  for (int d = 0; d < P; ++d) {
    mem.lanes[d] = {table.rows[d], 0, table.counts[d], 0, -1, 0, 0, Action{}, Action{}, {0, 0}, {0, 0}, {TensorId{}, TensorId{}},
                    -1, -1, -1, {0, 0, 0, 0}, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < ring.around_count(); ++j) mem.lanes[d].around[j] = ring.around(d, j);
  }
  for (int p = 0; p < 2 * P; ++p) {
    const int from = p / 2, to = ring.to(p);
    mem.pairs[p] = {-1, -1, -1, -1, 0, from, to, ring.slot(from, p), ring.slot(to, p)};
  }
  const int results = s.action_count();
  unsigned char* available = mem.available;
  for (int x = 0; x < results; ++x) available[x] = 0;
  for (int i = 0; i < kRunQueues * P; ++i) mem.running[i] = 0;
  clock = {0, table.total, -1, 0, 0, 0, false, table.stage_cost_count == 0, {}, {}};
}

/// The lowering itself, on a table whose actions are in range and unique (see
/// lower()), from the state in `mem` and `clock` (lower_begin() first), until
/// every action ran, none can, or `budget` more actions finished (then it stops
/// between two instants). It hands each step to `sink.step(device, ops,
/// op_count, has_compute, action)`, every device's steps in order, at the end of
/// the instant at which the step is made.
///
/// An overlapped pair starts once the inputs of both of its halves are there,
/// runs forward + backward long (the reference clock runs the halves one after
/// the other), and hands over the results of both when it ends; its step is
/// handed to the sink as two, the forward's (with the group) and the
/// backward's (without).
///
/// Each stage's actions take their durations from its own clock
/// (ActionTable::clock_of()). The clock is driven by events: running steps sit
/// in one FIFO per rank when every stage has the same clock (a rank's steps
/// then end in the order they started), else in a binary heap by end time (at
/// most one per device; LoweringClock::one_clock); messages wait in a
/// linked list per ring pair, each device keeps a bit per pair it is on that
/// holds messages, and a device blocked on a missing result waits in the list of
/// the device that makes that result (at most three devices ever wait on one).
/// Each message and wake-up costs O(1) and each action O(1) on one clock, O(log
/// P) on a clock per stage, so the
/// lowering is nearly linear in the number of actions whatever P; its tables are one byte per result of each
/// (stage, micro-batch) (ScheduleShape::action_index()), one node per message
/// in flight, and O(P). The loops index raw
/// pointers and read a FlowTable row per action: in a constant expression every
/// call and every subscript counts against the compiler's budget.
template <class Sink>
constexpr LoweringStatus lower_steps(const ActionTable& table, Sink& sink, const LoweringMemory& mem, LoweringClock& clock,
                                     int budget) {
  const ScheduleShape s = table.shape;  // a copy: the loops' byte stores cannot alias it
  const int P = s.devices, V = s.chunks, S = s.stages();
  const RingPairs ring(P);
  const FlowTable flow_table(s);
  Buffer<long long> duration(kPhases * S);  // [phase * S + stage]
  for (int st = 0; st < S; ++st)
    for (int ph = 0; ph < kPhases; ++ph) duration[ph * S + st] = table.clock_of(st).cost_of(static_cast<Phase>(ph));
  const FlowRow* rows = flow_table.data();
  LoweringLane* lane = mem.lanes;
  LoweringPair* pairs = mem.pairs;
  unsigned char* available = mem.available;
  MessageNode* nodes = mem.nodes;
  int* heap = mem.running;   // a clock per stage
  int* queue = mem.running;  // one clock: the FIFO of rank q from q * P
  const bool one_clock = clock.one_clock;
  // The heap's order: the earlier end, then the lower rank, then the earlier start.
  auto before = [&](int a, int b) {
    const LoweringLane& x = lane[a];
    const LoweringLane& y = lane[b];
    if (x.busy_until != y.busy_until) return x.busy_until < y.busy_until;
    if (x.rank != y.rank) return x.rank < y.rank;
    return x.started < y.started;
  };
  auto push = [&](int d) {
    if (one_clock) {
      const int q = lane[d].rank;
      const int at = clock.queue_head[q] + clock.queue_size[q]++;
      queue[q * P + (at < P ? at : at - P)] = d;
      ++clock.running;
      return;
    }
    int i = clock.running++;
    while (i > 0 && before(d, heap[(i - 1) / 2])) {
      heap[i] = heap[(i - 1) / 2];
      i = (i - 1) / 2;
    }
    heap[i] = d;
  };
  auto pop = [&] {  // removes heap[0]
    const int last = heap[--clock.running];
    int i = 0;
    for (int c = 1; c < clock.running; c = 2 * i + 1) {
      if (c + 1 < clock.running && before(heap[c + 1], heap[c])) ++c;
      if (!before(heap[c], last)) break;
      heap[i] = heap[c];
      i = c;
    }
    heap[i] = last;
  };
  Buffer<P2POp> scratch_storage(2 * table.total + 2);  // the groups made at one instant
  P2POp* scratch = scratch_storage.data();
  int scratch_size = 0;
  // Devices to try to start, that made a step, that finished, that got a group: each at most once.
  Buffer<int> list_storage(4 * P);
  int* candidates = list_storage.data();
  int* made = candidates + P;
  int* finished = made + P;
  int* grouped = finished + P;
  int candidate_count = 0, made_count = 0, finished_count = 0, grouped_count = 0;
  const int stop_at = clock.remaining - budget;
  long long now = clock.now;
  // Device d waits for result x of device `producer`.
  auto wait_for = [&](int d, int producer, int x) {
    lane[d].awaited = x;
    lane[d].next_waiter = lane[producer].first_waiter;
    lane[producer].first_waiter = d;
  };
  // A result becomes available: the devices waiting for it become candidates.
  auto arrive = [&](int x, int producer) {
    available[x] = 1;
    for (int* link = &lane[producer].first_waiter; *link >= 0;) {
      LoweringLane& w = lane[*link];
      if (w.awaited == x) {
        candidates[candidate_count++] = *link;
        *link = w.next_waiter;
      } else {
        link = &w.next_waiter;
      }
    }
  };
  if (!clock.begun) {
    clock.begun = true;
    for (int d = 0; d < P; ++d) candidates[candidate_count++] = d;
  }
  for (;;) {
    // Starts: a free device runs its next action if its inputs are there, or
    // waits for the first one missing.
    for (int i = 0; i < candidate_count; ++i) {
      const int d = candidates[i];
      LoweringLane& l = lane[d];
      if (l.running || l.pos == l.count) continue;
      const Action& a = l.row[l.pos];
      if (!std::is_constant_evaluated()) prefetch(l.row, l.pos + 8, l.count);  // its actions a few visits ahead
      const FlowRow& r = rows[(static_cast<int>(a.phase) * V + a.chunk) * P + d];
      const int m = a.micro_batch;
      int j = 0;
      while (j < r.needs && available[r.need[j] + m]) ++j;
      if (j < r.needs) {
        wait_for(d, r.need_device[j], r.need[j] + m);
        continue;
      }
      if (beside_compute(a.phase)) {  // R, O, L: no time on the compute clock, no message; a step of its own now
        const bool grouped_now = l.step_at == now;  // this instant's group, made and not handed over, goes with it
        sink.step(d, scratch + (grouped_now ? l.group_begin : 0), grouped_now ? l.group_end - l.group_begin : 0, true, a);
        if (grouped_now) l.group_begin = l.group_end;
        arrive(r.self + m, d);
        ++l.pos;
        --clock.remaining;
        --i;  // the same device again: its next action may start now too
        continue;
      }
      long long span = duration[static_cast<int>(a.phase) * S + r.stage];
      l.rank = static_cast<int>(a.phase);  // run_rank()
      if (a.overlaps_next) {  // check_lowerable(): a pair's backward follows; it waits for its inputs too
        const Action& b = l.row[l.pos + 1];
        const FlowRow& rb = rows[(static_cast<int>(b.phase) * V + b.chunk) * P + d];
        j = 0;
        while (j < rb.needs && available[rb.need[j] + b.micro_batch]) ++j;
        if (j < rb.needs) {
          wait_for(d, rb.need_device[j], rb.need[j] + b.micro_batch);
          continue;
        }
        l.second = b;
        l.self[1] = rb.self + b.micro_batch;
        l.out_to[1] = rb.out_stage < 0 ? d : rb.out_device;
        l.out[1] = {rb.out_kind, rb.stage, b.micro_batch};
        span += duration[static_cast<int>(b.phase) * S + rb.stage];
        l.rank = run_rank(a, b);
      }
      if (l.step_at != now) {
        l.step_at = now;
        l.group_begin = l.group_end = scratch_size;
        made[made_count++] = d;
      }
      const int halves = a.overlaps_next ? 2 : 1;
      l.has_compute = 1;
      l.compute = a;
      l.halves = static_cast<unsigned char>(halves);
      l.self[0] = r.self + m;
      l.out_to[0] = r.out_stage < 0 ? d : r.out_device;
      l.out[0] = {r.out_kind, r.stage, m};
      l.pos += halves;
      l.running = 1;
      l.busy_until = now + span;
      l.started = clock.started++;
      push(d);
    }
    candidate_count = 0;
    // Every step made at this instant is complete: hand it over.
    for (int i = 0; i < made_count; ++i) {
      LoweringLane& l = lane[made[i]];
      if (!l.has_compute && l.group_end == l.group_begin) continue;  // its group went with an R
      sink.step(made[i], scratch + l.group_begin, l.group_end - l.group_begin, l.has_compute != 0, l.compute);
      if (l.has_compute && l.halves == 2) sink.step(made[i], scratch, 0, true, l.second);
      l.has_compute = 0;
    }
    made_count = 0;
    scratch_size = 0;
    clock.now = now;
    // The next instant: the earliest end among the running actions.
    long long soonest = -1;
    if (one_clock) {
      for (int q = 0; q < kRunQueues; ++q) {
        if (clock.queue_size[q] == 0) continue;
        const long long end = lane[queue[q * P + clock.queue_head[q]]].busy_until;
        if (soonest < 0 || end < soonest) soonest = end;
      }
    } else if (clock.running > 0) {
      soonest = lane[heap[0]].busy_until;
    }
    if (soonest < 0) return clock.remaining == 0 ? LoweringStatus::kDone : LoweringStatus::kStalled;
    if (clock.remaining <= stop_at) return LoweringStatus::kPaused;
    now = soonest;
    // Actions ending now: their results become available or wait for delivery.
    if (one_clock) {
      for (int q = 0; q < kRunQueues; ++q) {
        int& head = clock.queue_head[q];
        while (clock.queue_size[q] > 0 && lane[queue[q * P + head]].busy_until == now) {
          finished[finished_count++] = queue[q * P + head];
          head = head + 1 == P ? 0 : head + 1;
          --clock.queue_size[q];
          --clock.running;
        }
      }
    } else {
      while (clock.running > 0 && lane[heap[0]].busy_until == now) {
        finished[finished_count++] = heap[0];
        pop();
      }
    }
    for (int i = 0; i < finished_count; ++i) {
      const int d = finished[i];
      LoweringLane& l = lane[d];
      l.running = 0;
      clock.remaining -= l.halves;
      candidates[candidate_count++] = d;
      for (int h = 0; h < l.halves; ++h) {  // a pair: the forward's result first
        if (l.out_to[h] == d) {
          arrive(l.self[h], d);
          continue;
        }
        int node = clock.free_node;
        if (node >= 0) clock.free_node = nodes[node].next;
        else node = clock.fresh_node++;
        nodes[node] = {l.out[h], l.self[h], -1};
        LoweringPair& pr = pairs[ring.index(d, l.out_to[h])];
        if (pr.head < 0) {
          pr.head = node;
          l.pending |= static_cast<unsigned char>(1 << pr.from_slot);
          lane[l.out_to[h]].pending |= static_cast<unsigned char>(1 << pr.to_slot);
        } else {
          nodes[pr.tail].next = node;
        }
        pr.tail = node;
      }
    }
    // Deliveries: every message waiting on a pair whose two devices are both
    // between actions moves now, oldest first. A pair can only become ready when
    // one of its devices has just finished.
    for (int i = 0; i < finished_count; ++i) {
      const LoweringLane& l = lane[finished[i]];
      for (unsigned bits = l.pending; bits != 0; bits &= bits - 1) {
        LoweringPair& pr = pairs[l.around[std::countr_zero(bits)]];
        LoweringLane& from = lane[pr.from];
        LoweringLane& to = lane[pr.to];
        if (from.running || to.running) continue;
        for (int node = pr.head; node >= 0; node = nodes[node].next) arrive(nodes[node].index, pr.from);
        pr.delivered = pr.head;
        pr.delivered_tail = pr.tail;
        pr.unread = 2;
        pr.head = -1;
        from.pending &= static_cast<unsigned char>(~(1 << pr.from_slot));
        to.pending &= static_cast<unsigned char>(~(1 << pr.to_slot));
        if (from.delivered == 0) grouped[grouped_count++] = pr.from;
        if (to.delivered == 0) grouped[grouped_count++] = pr.to;
        from.delivered |= static_cast<unsigned char>(1 << pr.from_slot);
        to.delivered |= static_cast<unsigned char>(1 << pr.to_slot);
      }
    }
    finished_count = 0;
    // Each device that sent or received now gets one group, its pairs in index
    // order; a pair's nodes are free again once both of its devices have them.
    for (int i = 0; i < grouped_count; ++i) {
      const int d = grouped[i];
      LoweringLane& l = lane[d];
      l.step_at = now;
      l.group_begin = scratch_size;
      made[made_count++] = d;
      for (unsigned bits = l.delivered; bits != 0; bits &= bits - 1) {
        LoweringPair& pr = pairs[l.around[std::countr_zero(bits)]];
        for (int node = pr.delivered; node >= 0; node = nodes[node].next)
          scratch[scratch_size++] = pr.from == d ? P2POp{OpKind::kSend, pr.to, nodes[node].tensor}
                                                 : P2POp{OpKind::kRecv, pr.from, nodes[node].tensor};
        if (--pr.unread == 0) {
          nodes[pr.delivered_tail].next = clock.free_node;
          clock.free_node = pr.delivered;
        }
      }
      l.group_end = scratch_size;
      l.delivered = 0;
    }
    grouped_count = 0;
  }
}

/// The whole lowering in one call, its memory in Buffers. Returns false when it
/// stalls; `next[d]` then holds device d's first action that could not run.
template <class Sink>
constexpr bool lower_steps(const ActionTable& table, Sink& sink, Buffer<int>& next) {
  const int P = table.shape.devices;
  Buffer<LoweringLane> lanes(P);
  Buffer<LoweringPair> pairs(2 * P);
  Buffer<unsigned char> available(table.shape.action_count());
  Buffer<MessageNode> nodes(table.total + 1);
  Buffer<int> running(kRunQueues * P);
  const LoweringMemory mem{lanes.data(), pairs.data(), available.data(), nodes.data(), running.data()};
  LoweringClock clock{};
  lower_begin(table, mem, clock);
  const LoweringStatus status = lower_steps(table, sink, mem, clock, table.total);
  next = Buffer<int>(P);
  for (int d = 0; d < P; ++d) next[d] = lanes[d].pos;
  return status == LoweringStatus::kDone;
}

/// A sink of lower_steps() that stores the steps: the lowered program.
struct StoreSteps {
  LoweredProgram& lp;
  constexpr void step(int d, const P2POp* ops, int n, bool has_compute, const Action& a) {
    lp.devices[static_cast<std::size_t>(d)].append(ops, n, has_compute, a);
  }
};

/// Checks what lower() needs of a program (shape, ranges, each action once,
/// each pair a forward then a B or an I) and throws Error otherwise; verify()
/// reports the same problems in more words.
constexpr void check_lowerable(const ScheduleShape s, const ActionTable& t, std::size_t device_lists) {
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1 || device_lists != static_cast<std::size_t>(s.devices))
    throw lower_error("the program's shape does not match its device count");
  if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 26))
    throw lower_error("devices * chunks * micro-batches must be at most 2^26");
  Buffer<char> seen(s.action_count(), 0);
  for (int d = 0; d < s.devices; ++d) {
    for (int k = 0; k < t.counts[d]; ++k) {
      const Action& a = t.rows[d][k];
      if (a.chunk < 0 || a.chunk >= s.chunks || a.micro_batch < 0 || a.micro_batch >= s.micro_batches)
        throw lower_error("an action's chunk or micro-batch is out of range");
      if (a.overlaps_next && (a.phase != Phase::kForward || k + 1 == t.counts[d] ||
                              !makes_input_gradient(t.rows[d][k + 1].phase) || t.rows[d][k + 1].overlaps_next))
        throw lower_error("an overlapped pair must be a forward followed by a backward (B or I); verify() says where");
      if (is_copy(a.phase)) continue;  // a pair before the backward and one in the weight window: verify() counts
      char& x = seen[s.action_index(a.phase, s.stage_of(d, a.chunk), a.micro_batch)];
      if (x) throw lower_error("an action appears twice; verify() says where");
      x = 1;
    }
  }
}

}  // namespace detail

/// Room to reserve for the steps of a device with n actions: its actions and
/// about one step in eight with a group but no action (what the generated
/// schedules need; more only costs a reallocation).
constexpr int step_capacity(int actions) { return actions + actions / 8 + 4; }

/// Lowers a program to steps with P2P groups. The program must hold each action
/// at most once, with valid indices, and no dependency cycle (verify() checks
/// that first); otherwise throws Error.
///
/// The lowering runs the program on its reference clock (durations from
/// Program::lowering, or from each stage's Program::stage_lowering; free
/// communication) and writes down what happens:
/// - a device starts its next action as soon as it is free and the action's
///   inputs have arrived;
/// - a message is delivered at the first instant, from its production on, at
///   which neither its sender nor its receiver is in the middle of an action; all
///   messages waiting on a pair then move together, oldest first;
/// - a device's steps are, in clock order, its actions and one group per instant
///   at which it delivers or receives; an action that starts at such an instant
///   shares the step of its group. A group lists its pairs in the order of the
///   sending device, then towards the next device before the previous one.
///
/// A send and its receive thus share one instant, and every device runs its groups
/// in instant order, so the steps cannot deadlock under rendezvous semantics and
/// each directed pair stays in FIFO order (with P = 2 too, where both neighbours
/// are one device). Replaying the steps with the same costs gives back the same
/// clock, no stall added; for GPipe, 1F1B and interleaved 1F1B with the default
/// costs that clock meets the closed-form bubble. A tensor may arrive before the
/// action that needs it; the executor keeps it until then.
constexpr LoweredProgram lower(const Program& p) {
  const detail::ActionTable table = detail::action_table(p);
  detail::check_lowerable(p.shape, table, p.devices.size());
  if (Text e = detail::clock_error(table); !e.empty()) throw detail::lower_error(e.view());
  LoweredProgram lp{p.shape, std::vector<StepList>(p.devices.size())};
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int n = static_cast<int>(p.devices[d].size());
    lp.devices[d].reserve(step_capacity(n), 2 * n);  // at most one input and one output message per action
  }
  detail::StoreSteps sink{lp};
  detail::Buffer<int> next;
  if (!detail::lower_steps(table, sink, next))
    throw detail::lower_error("the program's dependencies form a cycle; verify() says where");
  return lp;
}

}  // namespace pipeweave
