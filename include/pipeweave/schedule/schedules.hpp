#pragma once
/// \file
/// Compile-time schedules: Interleaved1F1B<P, V, M>, OneFOneB<P, M>, GPipe<P, M>,
/// LoopedBFS<P, V, M>, ZeroBubbleH1<P, M>, InterleavedZeroBubble<P, V, M>,
/// ZeroBubbleV<P, M> and DualPipeV<P, M>. Each holds every device's actions as constexpr
/// std::arrays, evaluated from the same ordering rules as make_schedule()
/// (generate_device()), and their lowering (lower()'s steps), evaluated by the
/// same lowering code.
///
/// Each of the two is a constant evaluation of its own, and verify() and
/// simulate() of the type a third: a compiler bounds each evaluation (GCC's
/// -fconstexpr-ops-limit, Clang's -fconstexpr-steps), so keeping the lowering
/// apart lets a static_assert prove schedules about twice as large.
///
/// \code
/// using S = pipeweave::Interleaved1F1B<4, 2, 8>;
/// static_assert(S::actions[0][11] == pipeweave::bwd(1, 0));
/// \endcode

#include <array>
#include <concepts>
#include <cstddef>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

namespace detail {

constexpr int clamp_count(int n) { return n < 0 ? 0 : n; }

/// A lowered program in arrays of sizes fixed at compile time, filled by
/// lower_steps() (it is its sink): device d's steps are the first steps[d] of
/// its region of StepsPerDevice records, their operations in its region of
/// OpsPerDevice. A device of A actions has at most 2A operations (one message
/// in and one out per action) and 3A steps (its actions and a group for each
/// operation at most).
template <int Devices, int StepsPerDevice, int OpsPerDevice>
struct FixedLowering {
  std::array<int, static_cast<std::size_t>(Devices)> steps{};
  std::array<int, static_cast<std::size_t>(Devices)> op_count{};
  std::array<StepRecord, static_cast<std::size_t>(Devices) * StepsPerDevice> records{};
  std::array<P2POp, static_cast<std::size_t>(Devices) * OpsPerDevice> ops{};
  bool complete = false;                                   ///< every action ran
  std::array<int, static_cast<std::size_t>(Devices)> next{};  ///< otherwise: each device's first action that could not run

  constexpr void step(int d, const P2POp* o, int n, bool has_compute, const Action& a) {
    P2POp* out = ops.data() + d * OpsPerDevice + op_count[static_cast<std::size_t>(d)];
    for (int i = 0; i < n; ++i) out[i] = o[i];
    const int end = op_count[static_cast<std::size_t>(d)] += n;
    records.data()[d * StepsPerDevice + steps[static_cast<std::size_t>(d)]++] = step_record(end, has_compute, a);
  }
  constexpr StepsView view(int d) const {
    return {records.data() + d * StepsPerDevice, steps[static_cast<std::size_t>(d)], ops.data() + d * OpsPerDevice};
  }
  /// The steps as a LoweredProgram (for messages about them).
  constexpr LoweredProgram program(const ScheduleShape& s) const {
    LoweredProgram lp{s, std::vector<StepList>(static_cast<std::size_t>(Devices))};
    for (int d = 0; d < Devices; ++d) {
      const StepsView v = view(d);
      for (int t = 0, begin = 0; t < v.steps; begin = v.records[t++].op_end)
        lp.devices[static_cast<std::size_t>(d)].append(v.ops + begin, v.records[t].op_end - begin, v.records[t].has_compute,
                                                       v.records[t].compute());
    }
    return lp;
  }
};

/// A compile-time schedule's actions as a Program.
template <class S>
constexpr Program static_program() {
  Program p{S::shape, {}};
  if constexpr (requires { S::lowering_costs; }) p.lowering = S::lowering_costs;
  if constexpr (requires { S::stage_lowering_costs; })
    p.stage_lowering.assign(S::stage_lowering_costs.begin(), S::stage_lowering_costs.end());
  p.devices.resize(S::actions.size());
  for (std::size_t d = 0; d < p.devices.size(); ++d)
    p.devices[d].assign(S::actions[d].begin(), S::actions[d].begin() + S::counts[d]);
  return p;
}

/// The ActionTable of a compile-time schedule's arrays (their first counts[d]
/// actions, where the type has counts).
template <class S>
constexpr ActionTable static_table() {
  ActionTable t = action_table(S::shape, S::actions);
  if constexpr (requires { S::lowering_costs; }) t.costs = S::lowering_costs;
  if constexpr (requires { S::stage_lowering_costs; }) set_clock(t, t.costs, S::stage_lowering_costs);
  if constexpr (requires { S::counts; }) {
    t.total = 0;
    for (int d = 0; d < t.counts.size(); ++d) t.total += t.counts[d] = S::counts[static_cast<std::size_t>(d)];
  }
  return t;
}

/// Storage and accessors shared by the compile-time schedules. Sizes are clamped
/// so that a bad parameter reports only its static_assert, not follow-on errors.
template <ScheduleKind Kind, int Devices, int Chunks, int MicroBatches>
struct StaticSchedule {
  /// The schedule's parameters as a run-time value, in the kind's placement.
  static constexpr ScheduleShape shape{Kind, Devices, Chunks, MicroBatches, placement_of(Kind)};
  static constexpr int devices = Devices;              ///< P
  static constexpr int chunks = Chunks;                ///< V
  static constexpr int micro_batches = MicroBatches;   ///< M
  /// Compute actions per device: 3 * V * M when the backwards are split, else 2 *
  /// V * M; for DualPipeV (some B, some I and W) the most a device can have.
  static constexpr int actions_per_device = clamp_count(shape.actions_per_device());

  using DeviceActions = std::array<Action, static_cast<std::size_t>(actions_per_device)>;

  /// `actions[d][k]`: device d's k-th action, for k < counts[d].
  static constexpr std::array<DeviceActions, static_cast<std::size_t>(clamp_count(Devices))> actions = [] {
    std::array<DeviceActions, static_cast<std::size_t>(clamp_count(Devices))> out{};
    if (shape_error(shape).empty()) {
      for (int d = 0; d < Devices; ++d) {
        Action* row = out[static_cast<std::size_t>(d)].data();
        generate_device(shape, d, [&](const Action& a, Period) { *row++ = a; });
      }
    }
    return out;
  }();

  /// `counts[d]`: how many actions device d has (actions_per_device, but for an uneven kind: DualPipeV).
  static constexpr std::array<int, static_cast<std::size_t>(clamp_count(Devices))> counts = [] {
    std::array<int, static_cast<std::size_t>(clamp_count(Devices))> out{};
    for (int d = 0; d < Devices; ++d)
      out[static_cast<std::size_t>(d)] = !kind_row(Kind).uneven || !shape_error(shape).empty()
                                             ? actions_per_device
                                             : [&] {
                                                 int n = 0;
                                                 generate_device(shape, d, [&](const Action&, Period) { ++n; });
                                                 return n;
                                               }();
    return out;
  }();

  /// This base: the one key of the type's compile-time lowering and verification
  /// (each is made once, whichever schedule type derives from it).
  using Base = StaticSchedule;

  /// The lowering of `actions` (what lower(program()) returns), in arrays; made
  /// when first asked for (verify() and simulate() of the type ask).
  static constexpr const auto& lowered();

  /// Number of warm-up forwards on device d.
  static constexpr int warmup(int device) { return warmup_forwards(shape, device); }

  /// The actions as a Program (vectors), usable in constant expressions as a transient.
  static constexpr Program program() { return static_program<StaticSchedule>(); }
};


/// How many actions one compile-time chunk of the lowering handles, and how many
/// steps one chunk of the verifier's run: each chunk is a constant evaluation
/// of its own, and each compiler bounds an evaluation its own way. Measured per
/// action of the lowering (schedule_bench and the docs say how): about 190
/// Clang steps of its 2^20, about 2,500 GCC operations of its 2^25; the run
/// costs less. A chunk of 3,072 actions uses about 55% of Clang's bound, one of
/// 8,192 about 60% of GCC's (fewer, larger chunks: GCC copies a chunk's state
/// at a cost in memory).
#if defined(__clang__)
inline constexpr int kChunkActions = 3072;
#else
inline constexpr int kChunkActions = 8192;
#endif
inline constexpr int kChunkSteps = kChunkActions;

/// The state of a compile-time schedule's lowering after some chunks: the steps
/// so far, and what lower_steps() keeps between instants.
template <class Schedule>
struct LoweringChunk {
  static constexpr int P = clamp_count(Schedule::devices);
  static constexpr int A = Schedule::actions_per_device;
  FixedLowering<P, 3 * A, 2 * A> out{};
  std::array<LoweringLane, static_cast<std::size_t>(P)> lanes{};
  std::array<LoweringPair, static_cast<std::size_t>(2 * P)> pairs{};
  std::array<unsigned char, static_cast<std::size_t>(clamp_count(Schedule::shape.action_count()))> available{};
  std::array<MessageNode, static_cast<std::size_t>(P * A + 1)> nodes{};
  std::array<int, static_cast<std::size_t>(kRunQueues * P)> running{};
  LoweringClock clock{};
  LoweringStatus status = LoweringStatus::kStalled;

  constexpr LoweringMemory memory() { return {lanes.data(), pairs.data(), available.data(), nodes.data(), running.data()}; }
};

/// Chunk K of the lowering, of `Chunk` actions each: chunk 0 sets up (and fills
/// the step arrays in order, which GCC then writes in place), each later one
/// lowers `Chunk` more actions.
template <class Schedule, int Chunk, int K>
inline constexpr auto lowering_chunk = [] {
  auto c = lowering_chunk<Schedule, Chunk, K - 1>;
  if (c.status == LoweringStatus::kPaused)
    c.status = lower_steps(static_table<Schedule>(), c.out, c.memory(), c.clock, Chunk);
  return c;
}();

template <class Schedule, int Chunk>
inline constexpr auto lowering_chunk<Schedule, Chunk, 0> = [] {
  LoweringChunk<Schedule> c{};
  for (auto& r : c.out.records) r = step_record(0, false, Action{});
  for (auto& o : c.out.ops) o = P2POp{};
  if (shape_error(Schedule::shape).empty()) {
    lower_begin(static_table<Schedule>(), c.memory(), c.clock);
    c.status = LoweringStatus::kPaused;
  }
  return c;
}();

/// The lowering of a compile-time schedule's actions, made when first asked for,
/// in chunks of `Chunk` actions.
template <class Schedule, int Chunk = kChunkActions>
inline constexpr auto static_lowering = [] {
  constexpr int chunks = (Schedule::devices * Schedule::actions_per_device + Chunk - 1) / Chunk;
  const auto& last = lowering_chunk<Schedule, Chunk, chunks < 1 ? 1 : chunks>;
  auto out = last.out;
  out.complete = last.status == LoweringStatus::kDone;
  for (int d = 0; d < LoweringChunk<Schedule>::P; ++d) out.next[static_cast<std::size_t>(d)] = last.lanes[static_cast<std::size_t>(d)].pos;
  return out;
}();

template <ScheduleKind Kind, int Devices, int Chunks, int MicroBatches>
constexpr const auto& StaticSchedule<Kind, Devices, Chunks, MicroBatches>::lowered() {
  return static_lowering<StaticSchedule>;
}

/// What a compile-time schedule made from another one, S, takes from it (its
/// shape and warm-up) and how it makes the rest from its own arrays (their
/// lowering and Program): the common part of WithGradReduce<S> and
/// Overlapped<S>. `Self` derives from it and holds `actions_per_device`,
/// `actions` and `counts`; it is the key of its lowering (`Base`).
template <class Self, class S>
struct StaticScheduleFrom {
  static constexpr ScheduleShape shape = S::shape;
  static constexpr int devices = S::devices;
  static constexpr int chunks = S::chunks;
  static constexpr int micro_batches = S::micro_batches;
  using Base = Self;
  static constexpr const auto& lowered() { return static_lowering<Self>; }
  static constexpr int warmup(int device) { return S::warmup(device); }
  static constexpr Program program() { return static_program<Self>(); }
};

// The compile-time types' shape rules: the predicates of the rows' rules
// (kinds.hpp), each with a message that names the type and the rule.

template <int Devices, int Chunks, int MicroBatches>
struct Interleaved1F1BChecks {
  static_assert(at_least_one(Devices), "Interleaved1F1B: Devices must be at least 1");
  static_assert(at_least_one(Chunks), "Interleaved1F1B: Chunks must be at least 1");
  static_assert(at_least_one(MicroBatches), "Interleaved1F1B: MicroBatches must be at least 1");
  static_assert(micro_batches_multiple_of_devices(Devices, MicroBatches),
                "Interleaved1F1B: MicroBatches must be a multiple of Devices");
};

template <int Devices, int MicroBatches>
struct OneFOneBChecks {
  static_assert(at_least_one(Devices), "OneFOneB: Devices must be at least 1");
  static_assert(at_least_one(MicroBatches), "OneFOneB: MicroBatches must be at least 1");
};

template <int Devices, int MicroBatches>
struct GPipeChecks {
  static_assert(at_least_one(Devices), "GPipe: Devices must be at least 1");
  static_assert(at_least_one(MicroBatches), "GPipe: MicroBatches must be at least 1");
};

template <int Devices, int Chunks, int MicroBatches>
struct LoopedBFSChecks {
  static_assert(at_least_one(Devices), "LoopedBFS: Devices must be at least 1");
  static_assert(at_least_one(Chunks), "LoopedBFS: Chunks must be at least 1");
  static_assert(at_least_one(MicroBatches), "LoopedBFS: MicroBatches must be at least 1");
};

template <int Devices, int MicroBatches>
struct ZeroBubbleH1Checks {
  static_assert(at_least_one(Devices), "ZeroBubbleH1: Devices must be at least 1");
  static_assert(at_least_one(MicroBatches), "ZeroBubbleH1: MicroBatches must be at least 1");
  static_assert(whole_rounds(Devices, MicroBatches),
                "ZeroBubbleH1: MicroBatches must be a multiple of max(1, MicroBatches / Devices) (PyTorch's rounds)");
};

template <int Devices, int Chunks, int MicroBatches>
struct InterleavedZeroBubbleChecks {
  static_assert(at_least_one(Devices), "InterleavedZeroBubble: Devices must be at least 1");
  static_assert(at_least_one(Chunks), "InterleavedZeroBubble: Chunks must be at least 1");
  static_assert(at_least_one(MicroBatches), "InterleavedZeroBubble: MicroBatches must be at least 1");
  static_assert(whole_rounds(Devices, MicroBatches),
                "InterleavedZeroBubble: MicroBatches must be a multiple of max(1, MicroBatches / Devices) (PyTorch's "
                "rounds)");
};

template <int Devices, int MicroBatches>
struct DualPipeVChecks {
  static_assert(at_least_one(Devices), "DualPipeV: Devices must be at least 1");
  static_assert(micro_batches_cover_stages(Devices, MicroBatches),
                "DualPipeV: MicroBatches must be at least the number of stages, 2 * Devices (PyTorch's rule)");
};

template <int Devices, int MicroBatches>
struct ZeroBubbleVChecks {
  static_assert(at_least_one(Devices), "ZeroBubbleV: Devices must be at least 1");
  static_assert(at_least_one(MicroBatches), "ZeroBubbleV: MicroBatches must be at least 1");
};

}  // namespace detail

/// Interleaved 1F1B (Megatron-LM's virtual pipeline): P devices, V chunks per
/// device, M micro-batches; M must be a multiple of P.
template <int Devices, int Chunks, int MicroBatches>
struct Interleaved1F1B
    : detail::Interleaved1F1BChecks<Devices, Chunks, MicroBatches>,
      detail::StaticSchedule<ScheduleKind::kInterleaved1F1B, Devices, Chunks, MicroBatches> {};

/// Plain 1F1B (PipeDream-Flush): P devices, one chunk each, M micro-batches.
template <int Devices, int MicroBatches>
struct OneFOneB : detail::OneFOneBChecks<Devices, MicroBatches>,
                  detail::StaticSchedule<ScheduleKind::kOneFOneB, Devices, 1, MicroBatches> {};

/// GPipe: every forward, then every backward, micro-batches ascending.
template <int Devices, int MicroBatches>
struct GPipe : detail::GPipeChecks<Devices, MicroBatches>,
               detail::StaticSchedule<ScheduleKind::kGPipe, Devices, 1, MicroBatches> {};

/// Looped BFS (PyTorch's ScheduleLoopedBFS): every forward, chunk by chunk, then
/// every backward, the last chunk first, micro-batches descending.
template <int Devices, int Chunks, int MicroBatches>
struct LoopedBFS : detail::LoopedBFSChecks<Devices, Chunks, MicroBatches>,
                   detail::StaticSchedule<ScheduleKind::kLoopedBFS, Devices, Chunks, MicroBatches> {};

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"), as PyTorch's
/// ScheduleInterleavedZeroBubble orders it with one chunk per device: backwards
/// split into I and W, each W delayed to fill the bubble; the memory of 1F1B.
/// M must be a multiple of max(1, M / P).
template <int Devices, int MicroBatches>
struct ZeroBubbleH1 : detail::ZeroBubbleH1Checks<Devices, MicroBatches>,
                      detail::StaticSchedule<ScheduleKind::kZeroBubbleH1, Devices, 1, MicroBatches> {};

/// Interleaved zero bubble (PyTorch's ScheduleInterleavedZeroBubble): V chunks
/// per device in the loop placement, backwards split into I and W. M must be a
/// multiple of max(1, M / P).
template <int Devices, int Chunks, int MicroBatches>
struct InterleavedZeroBubble
    : detail::InterleavedZeroBubbleChecks<Devices, Chunks, MicroBatches>,
      detail::StaticSchedule<ScheduleKind::kInterleavedZeroBubble, Devices, Chunks, MicroBatches> {};

/// ZB-V (PyTorch's ScheduleZBVZeroBubble): two chunks per device in the v
/// placement, backwards split into I and W.
template <int Devices, int MicroBatches>
struct ZeroBubbleV : detail::ZeroBubbleVChecks<Devices, MicroBatches>,
                     detail::StaticSchedule<ScheduleKind::kZeroBubbleV, Devices, 2, MicroBatches> {};

/// DualPipeV (PyTorch's ScheduleDualPipeV, after DeepSeek's DualPipe): two
/// chunks per device in the v placement, the steady phase in overlapped pairs
/// of a forward of one chunk and a backward of the other, the tail's backwards
/// split into I and W. M must be at least 2P.
template <int Devices, int MicroBatches>
struct DualPipeV : detail::DualPipeVChecks<Devices, MicroBatches>,
                   detail::StaticSchedule<ScheduleKind::kDualPipeV, Devices, 2, MicroBatches> {};

/// True for the compile-time schedule types above.
template <class S>
concept StaticScheduleType = requires {
  { S::shape } -> std::convertible_to<ScheduleShape>;
  S::actions;
  { S::program() } -> std::same_as<Program>;
};

}  // namespace pipeweave
