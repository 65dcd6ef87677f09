#pragma once
/// \file
/// The vocabulary of schedules and its two descriptor tables: one row per action
/// phase (kPhaseRows) and one per schedule kind (kKindRows). What a phase or a
/// kind is (its name, letter and glyph, its data flow and buffer needs, its
/// placement and shape rules, its generator, warm-up rule and closed forms) is
/// said in its row and nowhere else; every layer reads the rows.
///
/// A new schedule kind is an enumerator, one row here, its order in
/// generators.hpp and its compile-time type in schedules.hpp; a new phase is an
/// enumerator, one row here and the code that runs it (docs/extending.md).
///
/// \code
/// static_assert(pipeweave::kind_row(pipeweave::ScheduleKind::kZeroBubbleV).placement == pipeweave::Placement::kV);
/// static_assert(pipeweave::phase_row(pipeweave::Phase::kBackwardInput).letter == 'I');
/// \endcode

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The kind of an action: a forward, a full backward, or one of the two halves
/// of a split backward (the zero-bubble schedules): I, the gradient with
/// respect to the chunk's input (what the previous stage waits for), and W, the
/// gradient with respect to its parameters (what nobody waits for). A full
/// backward B is I then W in one action. The fifth, R, is no compute: the
/// all-reduce of one chunk's parameter gradients among the data-parallel
/// replicas that hold that chunk, once per (device, chunk) and step, after the
/// chunk's last backward on the device (with_grad_reduce()); it runs on the
/// device's collective lane beside the compute that follows. One row of
/// kPhaseRows each, in this order.
enum class Phase : unsigned char { kForward, kBackward, kBackwardInput, kBackwardWeight, kReduce };

/// Number of phases: tables indexed by (phase, stage) have kPhases * P * V rows.
inline constexpr int kPhases = 5;

/// Number of compute phases (F, B, I, W): the first rows of kPhaseRows; costs
/// tables have one member each.
inline constexpr int kComputePhases = 4;

/// Number of results of one (stage, micro-batch): its activation (made by F),
/// its input gradient (made by B or I), its weight gradient (made by B or W)
/// and, at micro-batch 0 only, its chunk's reduced gradient (made by R).
/// The flat tables of the verifier, the lowering and the simulator have one
/// entry per result: kResults * P * V * M (see ScheduleShape::action_index).
inline constexpr int kResults = 4;

/// Which generator made a program; kAuto for one synthesized for measured
/// costs (pipeweave::synthesize(), in the analysis layer), kCustom for
/// hand-written or imported ones.
/// One row of kKindRows each, in this order.
enum class ScheduleKind : unsigned char {
  kGPipe,
  kOneFOneB,
  kInterleaved1F1B,
  kLoopedBFS,
  kZeroBubbleH1,
  kInterleavedZeroBubble,
  kZeroBubbleV,
  kDualPipeV,
  kAuto,
  kCustom,
};

/// Number of schedule kinds, kCustom included.
inline constexpr int kScheduleKinds = static_cast<int>(ScheduleKind::kCustom) + 1;

/// Which device holds each virtual stage.
/// - kLoop: stage s on device s mod P, as its chunk s / P (GPipe, 1F1B, the
///   interleaved and looped schedules);
/// - kV: down the devices and back up: stages 0..P-1 on devices 0..P-1, stages
///   P..2P-1 on devices P-1..0, and so on (PyTorch's
///   `generate_stage_to_rank_mapping(style="v")`); stage s is still chunk s / P
///   of its device. Consecutive stages P-1 and P (and every turn) sit on one
///   device and hand over without a message.
enum class Placement : unsigned char { kLoop, kV };

/// "loop" or "v".
constexpr std::string_view placement_name(Placement placement) {
  return placement == Placement::kLoop ? "loop" : "v";
}

/// Where an action falls in a device's program: the warm-up forwards, the
/// steady period (each forward with a backward), and the cool-down.
enum class Period : unsigned char { kWarmUp, kSteady, kCoolDown };

/// One compute action on a device. `chunk` is local to the device (0..V-1);
/// the model-order position is the virtual stage ScheduleShape::stage_of(device,
/// chunk). A plain aggregate (so that tables of them cost nothing to allocate in
/// a constant expression): `Action{}` is F0.0.
///
/// An overlapped pair is two actions of one device that start together and
/// end when both have ended: a forward, marked `overlaps_next`, and the action
/// right after it in the device's program, a backward (B or I) independent of
/// it. A program stays one flat list of actions per device, its pairs marked in
/// place; a lowered program likewise has the pair's forward in one step (with
/// the pair's group) and its backward in the next step, which has no group.
struct Action {
  Phase phase;
  int chunk;
  int micro_batch;
  bool overlaps_next = false;  ///< a forward that runs at once with the next action of its device

  /// This action as the forward of an overlapped pair: `fwd(0, 6).paired()`, then the backward.
  constexpr Action paired() const { return {phase, chunk, micro_batch, true}; }
  /// This action alone (the flag cleared).
  constexpr Action single() const { return {phase, chunk, micro_batch, false}; }

  friend constexpr bool operator==(const Action&, const Action&) = default;
};

/// Shorthand constructors, handy in hand-written programs and tests.
constexpr Action fwd(int chunk, int micro_batch) { return {Phase::kForward, chunk, micro_batch}; }
constexpr Action bwd(int chunk, int micro_batch) { return {Phase::kBackward, chunk, micro_batch}; }
constexpr Action bwd_input(int chunk, int micro_batch) { return {Phase::kBackwardInput, chunk, micro_batch}; }
constexpr Action bwd_weight(int chunk, int micro_batch) { return {Phase::kBackwardWeight, chunk, micro_batch}; }
/// The gradient all-reduce of a chunk (R); its micro-batch is 0 (`reduce_grad(c, 0)` is the same).
constexpr Action reduce_grad(int chunk, int micro_batch = 0) { return {Phase::kReduce, chunk, micro_batch}; }

/// The parameters of a schedule: devices P, chunks per device V, micro-batches
/// M, and where the stages sit.
struct ScheduleShape {
  ScheduleKind kind = ScheduleKind::kCustom;
  int devices = 1;
  int chunks = 1;
  int micro_batches = 1;
  Placement placement = Placement::kLoop;

  /// Number of virtual stages, P * V.
  constexpr int stages() const { return devices * chunks; }
  /// Number of compute actions on each device of a generated schedule: 3 * V * M
  /// when its backwards are split (F, I, W), else 2 * V * M. For DualPipeV,
  /// whose backwards are some B and some I and W, the most a device can have.
  constexpr int actions_per_device() const;
  /// Virtual stage of a device's chunk: c * P + d (loop), or c * P + P-1-d for
  /// an odd chunk of the v placement.
  constexpr int stage_of(int device, int chunk) const {
    return chunk * devices + (placement == Placement::kV && chunk % 2 == 1 ? devices - 1 - device : device);
  }
  /// Device that holds virtual stage s.
  constexpr int device_of_stage(int stage) const {
    const int d = stage % devices;
    return placement == Placement::kV && (stage / devices) % 2 == 1 ? devices - 1 - d : d;
  }
  /// Local chunk index of virtual stage s on its device.
  constexpr int chunk_of_stage(int stage) const { return stage / devices; }
  /// Number of results of all (stage, micro-batch) pairs, kResults * P * V * M.
  constexpr int action_count() const { return kResults * stages() * micro_batches; }
  /// Dense index of the result of an action of `phase` at (virtual stage,
  /// micro-batch), in 0 .. action_count() - 1 (see result_of(): B and I share
  /// one): the key of every flat per-action table (verifier, lowering, simulator).
  constexpr int action_index(Phase phase, int stage, int micro_batch) const;

  friend constexpr bool operator==(const ScheduleShape&, const ScheduleShape&) = default;
};

/// Reference costs the lowering plans a program's steps with (lowering.hpp):
/// integer durations of a forward, a backward and the two halves of a split
/// backward (I and W) of one chunk. The defaults, backward = 2 x forward = I +
/// W, are the usual ratios for a layer (a backward computes the input gradient
/// and the weight gradient, each about as costly as the forward).
struct LoweringCosts {
  long long forward = 1;
  long long backward = 2;
  long long input = 1;   ///< I, the input-gradient half of a split backward
  long long weight = 1;  ///< W, the weight-gradient half
  /// The duration of an action of `phase` on the device's compute clock (0
  /// for R, which runs on the collective lane).
  constexpr long long of(Phase phase) const;
  friend constexpr bool operator==(const LoweringCosts&, const LoweringCosts&) = default;
};

/// Every device's ordered compute actions: `devices[d][k]` is device d's k-th
/// action; and the reference clock its steps are planned on. The sends and
/// receives are placed where that clock's run of the program needs them; under
/// rendezvous a send waits for its receiver, so a clock whose ratios are the
/// real ones' keeps the steps from waiting (a synthesized program plans on its
/// costs; every generated one on the defaults).
struct Program {
  ScheduleShape shape;
  std::vector<std::vector<Action>> devices;
  LoweringCosts lowering{};  ///< the reference clock of every stage...
  /// ...unless this holds one per virtual stage (ScheduleShape::stages()), for
  /// stages whose costs differ (a slower last stage); empty: `lowering` for all.
  std::vector<LoweringCosts> stage_lowering{};

  friend constexpr bool operator==(const Program&, const Program&) = default;
};

// ----------------------------------------------------------------------------
// Phases

/// How an action uses one tensor of its (chunk, micro-batch) in the run-time plan.
enum class Use : unsigned char {
  kNone,   ///< not at all
  kRead,   ///< reads it; it must exist
  kWrite,  ///< writes it, into a fresh buffer
};

/// What one phase's action needs of the buffers of its (chunk, micro-batch).
struct KindNeeds {
  Use x = Use::kNone;     ///< input activation (at stage 0: the batch)
  Use y = Use::kNone;     ///< output activation; at the last stage, writing y also writes dy (the loss gradient)
  Use dy = Use::kNone;    ///< output gradient
  Use dx = Use::kNone;    ///< input gradient (never at stage 0: nothing consumes it)
  bool keeps = false;     ///< starts keeping the micro-batch: takes a stash slot; x and y stay until it ends
  bool releases = false;  ///< ends it: returns the slot and every buffer kept for it
};

/// The data flow of a phase: the results of the same micro-batch its action
/// waits for, and which way its message goes.
struct PhaseFlow {
  int needs = 0;                 ///< how many results it may need (0, 1 or 2)
  int need_result[2] = {0, 0};   ///< their results (see result_of(): 0 activation, 1 input gradient)
  int need_offset[2] = {0, 0};   ///< their stages, relative to the action's; one outside the model is no need
  int direction = 0;             ///< +1: activations down the stages; -1: gradients up; 0: no message
};

/// Everything a phase is, in one row.
struct PhaseRow {
  Phase phase;
  char letter;                ///< F, B, I or W: tokens and PyTorch's CSV
  std::string_view category;  ///< its events' category in Chrome's trace format
  std::string_view words;     ///< the legend of the pictures
  std::string_view role;      ///< the action in error messages
  char glyph;                 ///< the fill of its boxes in text timelines
  int shade;                  ///< its chunk's color in pictures: 0 light, 1 dark, 2 between
  int result;                 ///< the result it is known by (see result_of())
  bool input_gradient;        ///< makes an input gradient (what the previous stage waits for)
  bool weight_gradient;       ///< adds its chunk's parameter gradients
  bool split;                 ///< a half of a split backward
  int stash_delta;            ///< forward stashes it keeps (+) or frees (-)
  int gradient_delta;         ///< output gradients it keeps from an I to its W (+) or frees (-)
  PhaseFlow flow;             ///< what it waits for and sends
  KindNeeds needs;            ///< the buffers it uses
  std::string_view maker;     ///< the shorthand that makes its action in C++ (fwd, bwd, bwd_input, bwd_weight)
  std::string_view pytorch;   ///< its name in PyTorch's CSV after the stage ("" for the one letter)
  bool collective = false;    ///< runs on the device's collective lane, one per (device, chunk), not per micro-batch
};

/// One row per phase, in the order of Phase. A split backward's input half (I)
/// is a backward that keeps its micro-batch; its weight half (W) reads nothing
/// the plan places (the chunk kept what it needs in the slot) and ends the
/// micro-batch, so x, y and dy stay from F through I to W. A B or an I needs its
/// own stage's activation and the next stage's gradient; a W needs its own I.
inline constexpr PhaseRow kPhaseRows[] = {
    {Phase::kForward, 'F', "forward", "forward", "a forward", '-', 0, 0, false, false, false, +1, 0,
     {1, {0, 0}, {-1, 0}, +1}, {.x = Use::kRead, .y = Use::kWrite, .keeps = true}, "fwd", "", false},
    {Phase::kBackward, 'B', "backward", "backward", "a backward", '=', 1, 1, true, true, false, -1, 0,
     {2, {0, 1}, {0, +1}, -1}, {.dy = Use::kRead, .dx = Use::kWrite, .releases = true}, "bwd", "", false},
    {Phase::kBackwardInput, 'I', "backward-input", "input gradient (I)", "the input half of a split backward (I)", '~',
     1, 1, true, false, true, 0, +1, {2, {0, 1}, {0, +1}, -1}, {.dy = Use::kRead, .dx = Use::kWrite}, "bwd_input", "", false},
    {Phase::kBackwardWeight, 'W', "backward-weight", "weight gradient (W)", "the weight half of a split backward (W)",
     '+', 2, 2, false, true, true, -1, -1, {1, {1, 0}, {0, 0}, 0}, {.releases = true}, "bwd_weight", "", false},
    {Phase::kReduce, 'R', "reduce-grad", "gradient all-reduce (R)", "a gradient reduction (R)", '#', 2, 3, false,
     false, false, 0, 0, {}, {}, "reduce_grad", "REDUCE_GRAD", true},
};
static_assert(std::size(kPhaseRows) == kPhases, "kPhaseRows: one row per Phase");

/// The row of a phase.
constexpr const PhaseRow& phase_row(Phase phase) { return kPhaseRows[static_cast<int>(phase)]; }

/// Every phase, in order (`for (Phase p : all_phases())`).
constexpr std::array<Phase, kPhases> all_phases() {
  std::array<Phase, kPhases> out{};
  for (int i = 0; i < kPhases; ++i) out[static_cast<std::size_t>(i)] = kPhaseRows[i].phase;
  return out;
}

/// The compute phases F, B, I and W, in order (`for (Phase p : compute_phases())`):
/// the phases that a table of costs has a member for.
constexpr std::array<Phase, kComputePhases> compute_phases() {
  std::array<Phase, kComputePhases> out{};
  for (int i = 0; i < kComputePhases; ++i) out[static_cast<std::size_t>(i)] = kPhaseRows[i].phase;
  return out;
}

/// True for R, the phases that run on a device's collective lane.
constexpr bool is_collective(Phase phase) { return phase_row(phase).collective; }

/// The member of a table of costs (any type with `forward`, `backward`,
/// `input` and `weight`) that holds the cost of compute phase `phase`
/// (compute_phases(); a collective's cost is no member of these tables).
template <class Costs>
constexpr auto& phase_cost(Costs& costs, Phase phase) {
  switch (phase) {
    case Phase::kForward: return costs.forward;
    case Phase::kBackward: return costs.backward;
    case Phase::kBackwardInput: return costs.input;
    case Phase::kBackwardWeight: return costs.weight;
    case Phase::kReduce: break;
  }
  throw Error("phase_cost: a gradient reduction (R) has no member in a table of compute costs");
}

constexpr long long LoweringCosts::of(Phase phase) const { return is_collective(phase) ? 0 : phase_cost(*this, phase); }

/// The letter of a phase in tokens and in PyTorch's notation: F, B, I or W.
constexpr char phase_letter(Phase phase) { return phase_row(phase).letter; }

/// The phase of a letter (F, B, I, W or R); nothing for any other.
constexpr std::optional<Phase> phase_of_letter(char letter) {
  for (const PhaseRow& r : kPhaseRows)
    if (r.letter == letter) return r.phase;
  return std::nullopt;
}

/// True for the phases that compute an input gradient (B and I).
constexpr bool makes_input_gradient(Phase phase) { return phase_row(phase).input_gradient; }

/// The result an action of `phase` is known by: 0 activation (F), 1 input
/// gradient (B, I), 2 weight gradient (W). B makes the weight gradient too, but
/// what other actions wait for is its input gradient.
constexpr int result_of(Phase phase) { return phase_row(phase).result; }

constexpr int ScheduleShape::action_index(Phase phase, int stage, int micro_batch) const {
  return (result_of(phase) * stages() + stage) * micro_batches + micro_batch;
}

// ----------------------------------------------------------------------------
// Schedule kinds

/// Where a generator hands its actions, in order: `sink(action, period)`.
/// generate_device() adapts any callable to it.
struct ActionSink {
  virtual constexpr void operator()(const Action& a, Period period) = 0;

 protected:
  constexpr ~ActionSink() = default;
};

/// Action costs in effect for the closed forms (CostModel's, defaults resolved).
struct UnitCosts {
  double forward = 1;
  double backward = 2;
  double input = 1;
  double weight = 1;
};

namespace detail {

/// The rounds of PyTorch's zero-bubble schedules, max(1, M / P): each chunk's
/// micro-batches run in blocks of M / rounds.
constexpr int zero_bubble_rounds(const ScheduleShape& s) { return std::max(1, s.micro_batches / s.devices); }

// The orders, each written once in generators.hpp.
constexpr void generate_one_f_one_b(const ScheduleShape& s, int device, ActionSink& emit);
constexpr void generate_looped_bfs(const ScheduleShape& s, int device, ActionSink& emit);
constexpr void generate_interleaved_zero_bubble(const ScheduleShape& s, int device, ActionSink& emit);
constexpr void generate_zero_bubble_v(const ScheduleShape& s, int device, ActionSink& emit);
constexpr void generate_dualpipe_v(const ScheduleShape& s, int device, ActionSink& emit);

/// PyTorch's rounds rule of the zero-bubble schedules: M a multiple of max(1, M / P).
constexpr void whole_rounds_rule(Text& t, const ScheduleShape& s, std::string_view name) {
  if (s.micro_batches % zero_bubble_rounds(s) != 0)
    t << name << " schedule: micro-batches (" << s.micro_batches
      << ") must be a multiple of the rounds, max(1, micro-batches / devices) = " << zero_bubble_rounds(s)
      << ", as PyTorch's ScheduleInterleavedZeroBubble requires";
}

/// The warm-up of the zero-bubble kinds: min((V-1)*R + P-d-1, V*M), R = M / max(1, M / P).
constexpr int zero_bubble_warmup(const ScheduleShape& s, int d) {
  return std::min((s.chunks - 1) * (s.micro_batches / zero_bubble_rounds(s)) + s.devices - d - 1,
                  s.chunks * s.micro_batches);
}

/// The makespan of the 1F1B family (any F and B): (V*M + P - 1)(F + B).
constexpr double one_f_one_b_makespan(const ScheduleShape& s, const UnitCosts& c) {
  return (static_cast<double>(s.chunks) * s.micro_batches + s.devices - 1) * (c.forward + c.backward);
}

/// The zero-bubble kinds' makespan when W <= F and W <= I: V*M(F + I + W) + (P - 1)(F + I - W)
/// for M >= P; (M + P - 1)(F + I) + W for M < P (ZB-H1 only).
constexpr double zero_bubble_makespan(const ScheduleShape& s, const UnitCosts& c) {
  const double P = s.devices, V = s.chunks, M = s.micro_batches, F = c.forward, I = c.input, W = c.weight;
  return M >= P ? V * M * (F + I + W) + (P - 1) * (F + I - W) : (M + P - 1) * (F + I) + W;
}

constexpr void zero_bubble_limits(Text& t, const ScheduleShape&, const UnitCosts& c, std::string_view name) {
  if (!(c.weight <= c.forward && c.weight <= c.input)) t << name << " has a closed form for W <= F and W <= I only";
}

/// The peak activations of the 1F1B family: min(W_d + 1, V*M).
constexpr int one_f_one_b_peak(const ScheduleShape& s, int, int warmup) {
  return std::min(warmup + 1, s.chunks * s.micro_batches);
}

/// The zero-bubble kinds: a W runs d micro-batches behind its I.
constexpr int zero_bubble_peak(const ScheduleShape& s, int d, int warmup) {
  return std::min(warmup + d + 1, s.chunks * s.micro_batches);
}
constexpr int zero_bubble_memory(const ScheduleShape& s, int d, int peak) {
  return peak + std::min(d, s.chunks * s.micro_batches - 1) + 1;
}

// The defaults of a row's functions: nothing of its own.
constexpr void no_rules(Text&, const ScheduleShape&, std::string_view) {}
constexpr int every_forward(const ScheduleShape& s, int) { return s.chunks * s.micro_batches; }
constexpr void no_order(const ScheduleShape&, int, ActionSink&) {}
constexpr double no_makespan(const ScheduleShape&, const UnitCosts&) { return 0; }
constexpr void no_limits(Text&, const ScheduleShape&, const UnitCosts&, std::string_view) {}
constexpr int no_peak(const ScheduleShape&, int, int) { return 0; }
constexpr int same_peak(const ScheduleShape&, int, int peak) { return peak; }
constexpr void no_memory_limits(Text&, const ScheduleShape&, std::string_view) {}

}  // namespace detail

/// Everything a schedule kind is, in one row. A kind without a generator
/// (custom), rules of its own or a closed form keeps the defaults, which do
/// nothing, and the flags say what it has (no function pointer is compared with
/// null: a constant evaluation under -fsanitize=undefined cannot).
struct KindRow {
  ScheduleKind kind;
  std::string_view name;         ///< on the command line and in output: "dualpipe-v"
  std::string_view title;        ///< for display: "DualPipeV"
  Placement placement;           ///< where its stages sit
  int chunks;                    ///< the chunks per device it needs; 0: any
  std::string_view chunks_hint;  ///< what the message about a wrong chunk count adds
  int default_chunks;            ///< the chunks it runs with when none are asked for
  bool split_backward;           ///< its backwards are split into I and W (all or some)
  bool pairs;                    ///< its own order has overlapped pairs
  bool uneven;                   ///< its devices have different numbers of actions
  bool bench_default;            ///< the benches run it when no schedule is asked for
  bool preferred;                ///< the tools' default schedule
  std::string_view micro_batches_rule = {};  ///< its rule on M in words ("a multiple of P"), for help texts
  /// Its own shape rules past the common ones: appends what is wrong.
  void (*rules)(Text&, const ScheduleShape&, std::string_view name) = detail::no_rules;
  /// Number of warm-up forwards on device d; null: every forward (V*M).
  int (*warmup)(const ScheduleShape&, int device) = detail::every_forward;
  /// Hands device d's actions, in order, to the sink.
  bool generated = true;  ///< it has an order of its own (every kind but auto and custom)
  bool synthesized = false;  ///< its order is searched for costs and a memory limit (auto: synthesize())
  void (*generate)(const ScheduleShape&, int device, ActionSink&) = detail::no_order;
  /// Closed-form makespan for free communication and speed 1 (see metrics.hpp).
  bool has_makespan = false;  ///< it has a closed-form makespan
  double (*makespan)(const ScheduleShape&, const UnitCosts&) = detail::no_makespan;
  /// Where that closed form holds: appends why not.
  void (*makespan_limits)(Text&, const ScheduleShape&, const UnitCosts&, std::string_view name) = detail::no_limits;
  /// The bubble ratio is (P - 1) / (V*M) whatever the costs.
  bool bubble_of_shape = false;
  /// The lowered steps' replay meets the closed-form makespan under the lowering's
  /// own costs (else it only never beats it: interleaved 1F1B).
  bool steps_reach_closed_form = true;
  /// Closed-form peak activations of device d, given its warm-up forwards.
  bool has_peaks = false;  ///< it has closed-form peak activations and memory
  int (*peak_activations)(const ScheduleShape&, int device, int warmup) = detail::no_peak;
  /// Closed-form peak memory of device d from its peak activations; null: the same.
  int (*peak_memory)(const ScheduleShape&, int device, int peak_activations) = detail::same_peak;
  /// Where that peak memory holds: appends why not.
  void (*memory_limits)(Text&, const ScheduleShape&, std::string_view name) = detail::no_memory_limits;
};

/// One row per schedule kind, in the order of ScheduleKind.
inline constexpr KindRow kKindRows[] = {
    {.kind = ScheduleKind::kGPipe, .name = "gpipe", .title = "GPipe", .placement = Placement::kLoop, .chunks = 1,
     .chunks_hint = "; use the interleaved schedule for several chunks per device", .default_chunks = 1,
     .split_backward = false, .pairs = false, .uneven = false, .bench_default = true, .preferred = false,
     .generate = detail::generate_one_f_one_b, .has_makespan = true, .makespan = detail::one_f_one_b_makespan, .bubble_of_shape = true,
     .has_peaks = true, .peak_activations = detail::one_f_one_b_peak},
    {.kind = ScheduleKind::kOneFOneB, .name = "1f1b", .title = "1F1B", .placement = Placement::kLoop, .chunks = 1,
     .chunks_hint = "; use the interleaved schedule for several chunks per device", .default_chunks = 1,
     .split_backward = false, .pairs = false, .uneven = false, .bench_default = true, .preferred = false,
     .warmup = [](const ScheduleShape& s, int d) { return std::min(s.devices - d - 1, s.chunks * s.micro_batches); },
     .generate = detail::generate_one_f_one_b, .has_makespan = true, .makespan = detail::one_f_one_b_makespan, .bubble_of_shape = true,
     .has_peaks = true, .peak_activations = detail::one_f_one_b_peak},
    {.kind = ScheduleKind::kInterleaved1F1B, .name = "interleaved", .title = "Interleaved 1F1B",
     .placement = Placement::kLoop, .chunks = 0, .chunks_hint = "", .default_chunks = 2, .split_backward = false,
     .pairs = false, .uneven = false, .bench_default = true, .preferred = true, .micro_batches_rule = "a multiple of P",
     .rules =
         [](Text& t, const ScheduleShape& s, std::string_view name) {
           if (s.micro_batches % s.devices != 0)
             t << name << " schedule: micro-batches (" << s.micro_batches << ") must be a multiple of devices ("
               << s.devices << ")";
         },
     .warmup =
         [](const ScheduleShape& s, int d) {
           return std::min(2 * (s.devices - d - 1) + (s.chunks - 1) * s.devices, s.chunks * s.micro_batches);
         },
     .generate = detail::generate_one_f_one_b, .has_makespan = true, .makespan = detail::one_f_one_b_makespan, .bubble_of_shape = true,
     .steps_reach_closed_form = false, .has_peaks = true, .peak_activations = detail::one_f_one_b_peak},
    {.kind = ScheduleKind::kLoopedBFS, .name = "looped-bfs", .title = "Looped BFS", .placement = Placement::kLoop,
     .chunks = 0, .chunks_hint = "", .default_chunks = 2, .split_backward = false, .pairs = false, .uneven = false,
     .bench_default = false, .preferred = false, .generate = detail::generate_looped_bfs,
     .has_makespan = true, .makespan =
         [](const ScheduleShape& s, const UnitCosts& c) {
           const double P = s.devices, V = s.chunks, M = s.micro_batches;
           return (V * std::max(M, P) + std::min(M, P) - 1) * (c.forward + c.backward);
         },
     .has_peaks = true, .peak_activations = [](const ScheduleShape& s, int, int) { return s.chunks * s.micro_batches; }},
    {.kind = ScheduleKind::kZeroBubbleH1, .name = "zb-h1", .title = "ZB-H1", .placement = Placement::kLoop,
     .chunks = 1, .chunks_hint = "; use interleaved-zb for several chunks per device", .default_chunks = 1,
     .split_backward = true, .pairs = false, .uneven = false, .bench_default = false, .preferred = false, .micro_batches_rule = "a multiple of max(1, M / P)",
     .rules = detail::whole_rounds_rule, .warmup = detail::zero_bubble_warmup,
     .generate = detail::generate_interleaved_zero_bubble, .has_makespan = true, .makespan = detail::zero_bubble_makespan,
     .makespan_limits = detail::zero_bubble_limits, .has_peaks = true, .peak_activations = detail::zero_bubble_peak,
     .peak_memory = detail::zero_bubble_memory},
    {.kind = ScheduleKind::kInterleavedZeroBubble, .name = "interleaved-zb", .title = "Interleaved ZB",
     .placement = Placement::kLoop, .chunks = 0, .chunks_hint = "", .default_chunks = 2, .split_backward = true,
     .pairs = false, .uneven = false, .bench_default = false, .preferred = false, .micro_batches_rule = "a multiple of max(1, M / P)", .rules = detail::whole_rounds_rule,
     .warmup = detail::zero_bubble_warmup, .generate = detail::generate_interleaved_zero_bubble,
     .has_makespan = true, .makespan = detail::zero_bubble_makespan,
     .makespan_limits =
         [](Text& t, const ScheduleShape& s, const UnitCosts& c, std::string_view name) {
           detail::zero_bubble_limits(t, s, c, name);
           if (t.empty() && s.micro_batches < s.devices)
             t << name << " has a closed form for micro-batches >= devices only";
         },
     .has_peaks = true, .peak_activations = detail::zero_bubble_peak, .peak_memory = detail::zero_bubble_memory},
    {.kind = ScheduleKind::kZeroBubbleV, .name = "zb-v", .title = "ZB-V", .placement = Placement::kV, .chunks = 2,
     .chunks_hint = ": ZB-V places two chunks per device in a V", .default_chunks = 2, .split_backward = true,
     .pairs = false, .uneven = false, .bench_default = false, .preferred = false,
     .warmup =
         [](const ScheduleShape& s, int d) {
           return std::min(2 * s.devices - d - 1, s.micro_batches) + std::min(d, s.micro_batches);
         },
     .generate = detail::generate_zero_bubble_v,
     .has_makespan = true, .makespan =
         [](const ScheduleShape& s, const UnitCosts& c) {
           return 2.0 * s.micro_batches * (c.forward + c.input + c.weight) + (s.devices - 1) * c.forward;
         },
     .makespan_limits =
         [](Text& t, const ScheduleShape& s, const UnitCosts& c, std::string_view name) {
           if (!(s.micro_batches >= 2 * s.devices - 1 && c.input == c.forward && 2 * c.weight >= c.forward &&
                 c.weight <= c.forward))
             t << name << " has a closed form for micro-batches >= 2 * devices - 1, I = F and F/2 <= W <= F only";
         },
     .has_peaks = true, .peak_activations =
         [](const ScheduleShape& s, int d, int) {
           return std::min({s.micro_batches + d + 1, 2 * s.devices, 2 * s.micro_batches});
         },
     .peak_memory = [](const ScheduleShape& s, int d, int) { return std::max(2 * s.devices + 1, s.devices + 3 * d + 1); },
     .memory_limits =
         [](Text& t, const ScheduleShape& s, std::string_view name) {
           if (s.micro_batches < 2 * s.devices - 1)
             t << name << " has a closed-form peak memory for micro-batches >= 2 * devices - 1 only";
         }},
    {.kind = ScheduleKind::kDualPipeV, .name = "dualpipe-v", .title = "DualPipeV", .placement = Placement::kV,
     .chunks = 2, .chunks_hint = ": DualPipeV places two chunks per device in a V", .default_chunks = 2,
     .split_backward = true, .pairs = true, .uneven = true, .bench_default = false, .preferred = false, .micro_batches_rule = "at least 2 * P",
     .rules =
         [](Text& t, const ScheduleShape& s, std::string_view name) {
           if (s.micro_batches < 2 * s.devices)
             t << name << " schedule: micro-batches (" << s.micro_batches
               << ") must be at least the number of stages, 2 * devices = " << 2 * s.devices
               << ", as PyTorch's ScheduleDualPipeV requires";
         },
     .warmup = [](const ScheduleShape& s, int) { return std::min(2 * s.devices, s.chunks * s.micro_batches); },
     .generate = detail::generate_dualpipe_v},
    {.kind = ScheduleKind::kAuto, .name = "auto", .title = "Synthesized", .placement = Placement::kLoop, .chunks = 0,
     .chunks_hint = "", .default_chunks = 2, .split_backward = true, .pairs = false, .uneven = true,
     .bench_default = false, .preferred = false, .generated = false, .synthesized = true},
    {.kind = ScheduleKind::kCustom, .name = "custom", .title = "custom", .placement = Placement::kLoop, .chunks = 0,
     .chunks_hint = "", .default_chunks = 1, .split_backward = false, .pairs = false, .uneven = true,
     .bench_default = false, .preferred = false, .generated = false},
};
static_assert(std::size(kKindRows) == kScheduleKinds, "kKindRows: one row per ScheduleKind");
static_assert([] {
  for (int k = 0; k < kScheduleKinds; ++k)
    if (static_cast<int>(kKindRows[k].kind) != k) return false;
  for (int p = 0; p < kPhases; ++p)
    if (static_cast<int>(kPhaseRows[p].phase) != p) return false;
  return true;
}(), "kKindRows and kPhaseRows: rows in the order of their enumerators");

/// The row of a schedule kind.
constexpr const KindRow& kind_row(ScheduleKind kind) { return kKindRows[static_cast<int>(kind)]; }

/// Number of generated kinds (rows with an order of their own).
inline constexpr int kGeneratedKinds = [] {
  int n = 0;
  for (const KindRow& r : kKindRows) n += r.generated ? 1 : 0;
  return n;
}();

/// The generated kinds (every row with a generator), in order.
constexpr std::array<ScheduleKind, kGeneratedKinds> generated_kinds() {
  std::array<ScheduleKind, kGeneratedKinds> out{};
  std::size_t n = 0;
  for (const KindRow& r : kKindRows)
    if (r.generated) out[n++] = r.kind;
  return out;
}

/// The tools' default schedule (interleaved 1F1B).
constexpr ScheduleKind preferred_kind() {
  for (const KindRow& r : kKindRows)
    if (r.preferred) return r.kind;
  return ScheduleKind::kCustom;
}

/// Name used on the command line and in output: "gpipe", "1f1b", "interleaved",
/// "looped-bfs", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "auto", "custom".
constexpr std::string_view schedule_name(ScheduleKind kind) {
  return static_cast<int>(kind) < kScheduleKinds ? kind_row(kind).name : std::string_view("unknown");
}

/// The generated kind that schedule_name() calls `name`, or with `synthesized`
/// also auto; nothing for any other name.
constexpr std::optional<ScheduleKind> parse_schedule(std::string_view name, bool synthesized = false) {
  for (const KindRow& r : kKindRows)
    if ((r.generated || (synthesized && r.synthesized)) && r.name == name) return r.kind;
  return std::nullopt;
}

/// True for the kinds whose backwards are split into I and W (the zero-bubble
/// family; DualPipeV splits those of its tail).
constexpr bool splits_backward(ScheduleKind kind) { return kind_row(kind).split_backward; }

/// The placement a generated kind uses: kV for ZB-V and DualPipeV, kLoop for every other.
constexpr Placement placement_of(ScheduleKind kind) { return kind_row(kind).placement; }

/// The chunks a kind runs with when none are asked for: 2 for the interleaved,
/// looped and V-shaped kinds, 1 for the others.
constexpr int default_chunks(ScheduleKind kind) { return kind_row(kind).default_chunks; }

constexpr int ScheduleShape::actions_per_device() const {
  return (splits_backward(kind) ? 3 : 2) * chunks * micro_batches;
}

/// Describes what is wrong with a shape for its schedule kind; empty when valid.
/// The rules common to every kind, then the row's: its chunks, its own rules,
/// its placement.
constexpr Text shape_error(const ScheduleShape& s) {
  Text t;
  const KindRow& row = kind_row(s.kind);
  const std::string_view name = row.name;
  if (s.devices < 1) {
    t << name << " schedule: devices must be at least 1 (got " << s.devices << ")";
  } else if (s.chunks < 1) {
    t << name << " schedule: chunks must be at least 1 (got " << s.chunks << ")";
  } else if (s.micro_batches < 1) {
    t << name << " schedule: micro-batches must be at least 1 (got " << s.micro_batches << ")";
  } else if (row.chunks != 0 && s.chunks != row.chunks) {
    t << name << " schedule: chunks must be " << row.chunks << " (got " << s.chunks << ")" << row.chunks_hint;
  } else {
    row.rules(t, s, name);
  }
  if (!t.empty()) return t;
  if (row.generated && s.placement != row.placement) {
    t << name << " schedule: the placement must be " << placement_name(row.placement) << " (got "
      << placement_name(s.placement) << ")";
  } else if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 26)) {
    t << name << " schedule: devices * chunks * micro-batches must be at most 2^26 (got "
      << static_cast<long long>(s.devices) * s.chunks * s.micro_batches << ")";
  }
  return t;
}

/// Number of warm-up forwards on device d (the forwards before the steady period).
/// - interleaved: min(2*(P-d-1) + (V-1)*P, V*M), Megatron-LM's rule;
/// - 1F1B: min(P-d-1, M);
/// - GPipe, looped BFS: V*M (every forward runs before any backward);
/// - ZB-H1, interleaved ZB: min((V-1)*R + P-d-1, V*M), R = M / max(1, M / P)
///   micro-batches per round (PyTorch's rule);
/// - ZB-V: min(2P-d-1, M) + min(d, M);
/// - DualPipeV: 2P (M >= 2P).
/// Note that interleaved with V = 1 keeps its own rule, 2*(P-d-1), which is not 1F1B's.
constexpr int warmup_forwards(const ScheduleShape& s, int device) {
  const KindRow& row = kind_row(s.kind);
  return row.warmup(s, device);
}

}  // namespace pipeweave

// The orders the rows point to.
#include "pipeweave/schedule/generators.hpp"
