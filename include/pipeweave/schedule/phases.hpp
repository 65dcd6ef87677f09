#pragma once
/// \file
/// The phases of actions (F, B, I, W, C, R, O and L) and their table: one row per phase
/// (kPhaseRows). What a phase is (its letter and glyph, its words, the result
/// it makes, its data flow and buffer needs) is said in its row and nowhere
/// else; every layer reads the rows. A new phase is an enumerator, one row here
/// and the code that runs it (docs/extending.md).
///
/// \code
/// static_assert(pipeweave::phase_row(pipeweave::Phase::kBackwardInput).letter == 'I');
/// \endcode

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The kind of an action: a forward, a full backward, or one of the two halves
/// of a split backward (the zero-bubble schedules): I, the gradient with
/// respect to the chunk's input (what the previous stage waits for), and W, the
/// gradient with respect to its parameters (what nobody waits for). A full
/// backward B is I then W in one action. C recomputes a forward: where a stage
/// keeps only the input of a micro-batch after its forward (to save memory), C
/// runs that forward again before the micro-batch's backward, restoring what
/// the backward reads. The last, R, is no compute: the
/// all-reduce of one chunk's parameter gradients among the data-parallel
/// replicas that hold that chunk, once per (device, chunk) and step, after the
/// chunk's last backward on the device (with_grad_reduce()); it runs on the
/// device's collective lane beside the compute that follows. O and L move a
/// stash over the device's copy lane: O, the offload, takes it off the device
/// to host memory (its copy starts when its forward ends; the device waits for
/// it where the program places O, and holds the stash no longer), and L, the
/// reload, brings it back (its copy starts where the program places L; the
/// backward that reads it waits for it). One row of kPhaseRows each, in this
/// order.
enum class Phase : unsigned char {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kRecompute,
  kReduce,
  kOffload,
  kReload
};

/// Number of phases: tables indexed by (phase, stage) have kPhases * P * V rows.
inline constexpr int kPhases = 8;

/// Number of compute phases with a cost of their own (F, B, I, W): the first
/// rows of kPhaseRows; a table of costs (PhaseCosts, costs.hpp) has one entry
/// each. C, which follows them, computes too, and costs what its fallback
/// (F) costs: a recomputation runs the same forward again.
inline constexpr int kComputePhases = 4;

/// Number of results of one (stage, micro-batch): its activation (made by F),
/// its input gradient (made by B or I), its weight gradient (made by B or W),
/// at micro-batch 0 only, its chunk's reduced gradient (made by R), its
/// restored stash (made by C, where the program recomputes it, or by L, where
/// it offloads it: one or the other) and its offloaded stash (made by O).
/// The flat tables of the verifier, the lowering and the simulator have one
/// entry per result: kResults * P * V * M (see ScheduleShape::action_index).
inline constexpr int kResults = 6;

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

/// Where a phase's actions run on their device: its compute stream, its
/// collective lane (R, beside the compute) or its copy lane (O and L, between
/// the device and host memory, beside the compute).
enum class ActionLane : unsigned char { kCompute, kCollective, kCopy };

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
  bool restores = false;      ///< brings back a stash for its backward: C from the input kept, L from host memory; optional:
                              ///< a C or an L before its B or I, and an L before its W after one in its weight window
  bool offloads = false;      ///< moves a stash off the device (O): optional, after its F, before its B or I, and (or)
                              ///< after its I, before its W (the stash and the output gradient W reads); reloaded (L)
  std::string_view stash_rule = {};  ///< for C, O and L: the rule that puts it before the backward, in error messages
  int stash_delta;            ///< forward stashes it keeps (+) or frees (-)
  int gradient_delta;         ///< output gradients it keeps from an I to its W (+) or frees (-)
  PhaseFlow flow;             ///< what it waits for and sends
  KindNeeds needs;            ///< the buffers it uses
  std::string_view maker;     ///< the shorthand that makes its action in C++ (fwd, bwd, bwd_input, bwd_weight)
  std::string_view pytorch;   ///< its name in PyTorch's CSV after the stage ("" for the one letter)
  bool in_pytorch = true;     ///< PyTorch's schedules have it (C: none, its CSV cannot say "recompute")
  ActionLane lane = ActionLane::kCompute;  ///< where it runs: its device's compute, its collective lane (R: one per (device,
                               ///< chunk), not per micro-batch) or its copy lane (O, L)
  std::string_view cost = {};  ///< its cost's name in messages ("input" for I); none for R, which has no compute cost
  int reference_cost = 0;      ///< its cost on the reference clock (PhaseCosts' default): B = 2 x F = I + W
  int fallbacks = 0;           ///< how many phases a negative cost of it follows (PhaseCosts::cost_of()); 0: none
  Phase fallback[2] = {};      ///< those phases: its cost in effect is the sum of theirs (B: I + W; I and W: F); a
                               ///< phase past the costed ones (C) always costs theirs
};

/// One row per phase, in the order of Phase. A split backward's input half (I)
/// is a backward that keeps its micro-batch; its weight half (W) reads nothing
/// the plan places (the chunk kept what it needs in the slot) and ends the
/// micro-batch, so x, y and dy stay from F through I to W. A B or an I needs its
/// own stage's activation and the next stage's gradient; a W needs its own I; a
/// C and O need their own F, L its own O (and each comes before the B or I that
/// reads the stash, or an O and its L between an I and its W: an order of its
/// device the verifier checks).
inline constexpr PhaseRow kPhaseRows[] = {
    {.phase = Phase::kForward, .letter = 'F', .category = "forward", .words = "forward", .role = "a forward",
     .glyph = '-', .shade = 0, .result = 0, .input_gradient = false, .weight_gradient = false, .split = false,
     .stash_delta = +1, .gradient_delta = 0,
     .flow = {.needs = 1, .need_result = {0, 0}, .need_offset = {-1, 0}, .direction = +1},
     .needs = {.x = Use::kRead, .y = Use::kWrite, .keeps = true}, .maker = "fwd", .pytorch = "",
     .cost = "forward", .reference_cost = 1},
    {.phase = Phase::kBackward, .letter = 'B', .category = "backward", .words = "backward", .role = "a backward",
     .glyph = '=', .shade = 1, .result = 1, .input_gradient = true, .weight_gradient = true, .split = false,
     .stash_delta = -1, .gradient_delta = 0,
     .flow = {.needs = 2, .need_result = {0, 1}, .need_offset = {0, +1}, .direction = -1},
     .needs = {.dy = Use::kRead, .dx = Use::kWrite, .releases = true}, .maker = "bwd", .pytorch = "",
     .cost = "backward", .reference_cost = 2, .fallbacks = 2,
     .fallback = {Phase::kBackwardInput, Phase::kBackwardWeight}},
    {.phase = Phase::kBackwardInput, .letter = 'I', .category = "backward-input", .words = "input gradient (I)",
     .role = "the input half of a split backward (I)", .glyph = '~', .shade = 1, .result = 1, .input_gradient = true,
     .weight_gradient = false, .split = true, .stash_delta = 0, .gradient_delta = +1,
     .flow = {.needs = 2, .need_result = {0, 1}, .need_offset = {0, +1}, .direction = -1},
     .needs = {.dy = Use::kRead, .dx = Use::kWrite}, .maker = "bwd_input", .pytorch = "", .cost = "input",
     .reference_cost = 1, .fallbacks = 1, .fallback = {Phase::kForward}},
    {.phase = Phase::kBackwardWeight, .letter = 'W', .category = "backward-weight", .words = "weight gradient (W)",
     .role = "the weight half of a split backward (W)", .glyph = '+', .shade = 2, .result = 2, .input_gradient = false,
     .weight_gradient = true, .split = true, .stash_delta = -1, .gradient_delta = -1,
     .flow = {.needs = 1, .need_result = {1, 0}, .need_offset = {0, 0}, .direction = 0},
     .needs = {.releases = true}, .maker = "bwd_weight", .pytorch = "", .cost = "weight", .reference_cost = 1,
     .fallbacks = 1, .fallback = {Phase::kForward}},
    {.phase = Phase::kRecompute, .letter = 'C', .category = "recompute", .words = "recomputed forward (C)",
     .role = "a recomputed forward (C)", .glyph = '*', .shade = 0, .result = 4, .input_gradient = false,
     .weight_gradient = false, .split = false, .restores = true,
     .stash_rule = "a recomputation restores its stash before the backward (B or I) that reads it", .stash_delta = 0,
     .gradient_delta = 0, .flow = {.needs = 1, .need_result = {0, 0}, .need_offset = {0, 0}, .direction = 0},
     .needs = {.x = Use::kRead}, .maker = "recompute", .pytorch = "", .in_pytorch = false, .fallbacks = 1,
     .fallback = {Phase::kForward}},
    {.phase = Phase::kReduce, .letter = 'R', .category = "reduce-grad", .words = "gradient all-reduce (R)",
     .role = "a gradient reduction (R)", .glyph = '#', .shade = 2, .result = 3, .input_gradient = false,
     .weight_gradient = false, .split = false, .stash_delta = 0, .gradient_delta = 0, .flow = {}, .needs = {},
     .maker = "reduce_grad", .pytorch = "REDUCE_GRAD", .lane = ActionLane::kCollective},
    {.phase = Phase::kOffload, .letter = 'O', .category = "offload", .words = "offload to host (O)",
     .role = "an offload (O)", .glyph = '>', .shade = 2, .result = 5, .input_gradient = false, .weight_gradient = false,
     .split = false, .offloads = true,
     .stash_rule = "an offload moves its stash off the device before the backward (B or I) that reads it, or "
                   "between an I and its W",
     .stash_delta = -1, .gradient_delta = 0,
     .flow = {.needs = 1, .need_result = {0, 0}, .need_offset = {0, 0}, .direction = 0}, .needs = {},
     .maker = "offload", .pytorch = "", .in_pytorch = false, .lane = ActionLane::kCopy},
    {.phase = Phase::kReload, .letter = 'L', .category = "reload", .words = "reload from host (L)",
     .role = "a reload (L)", .glyph = '<', .shade = 2, .result = 4, .input_gradient = false, .weight_gradient = false,
     .split = false, .restores = true,
     .stash_rule = "a reload brings its stash back before the backward (B or I) that reads it, or between an I and "
                   "its W",
     .stash_delta = +1,
     .gradient_delta = 0, .flow = {.needs = 1, .need_result = {5, 0}, .need_offset = {0, 0}, .direction = 0},
     .needs = {}, .maker = "reload", .pytorch = "", .in_pytorch = false, .lane = ActionLane::kCopy},
};
static_assert(std::size(kPhaseRows) == kPhases, "kPhaseRows: one row per Phase");
static_assert([] {
  for (int p = 0; p < kPhases; ++p)
    if (static_cast<int>(kPhaseRows[p].phase) != p) return false;
  return true;
}(), "kPhaseRows: rows in the order of Phase");
static_assert([] {
  for (int p = 0; p < kPhases; ++p) {
    const PhaseRow& r = kPhaseRows[p];
    if (p < kComputePhases ? r.lane != ActionLane::kCompute || r.reference_cost < 1
                           : r.reference_cost != 0 || (r.lane != ActionLane::kCompute ? r.fallbacks != 0 : r.fallbacks == 0))
      return false;
    if ((r.restores || r.offloads) != !r.stash_rule.empty())
      return false;
    for (int k = 0; k < r.fallbacks; ++k)
      if (static_cast<int>(r.fallback[k]) >= kComputePhases || r.fallback[k] == r.phase) return false;
  }
  return true;
}(), "kPhaseRows: the costed phases first, then those that cost their fallbacks', then those of the other lanes");

/// The row of a phase.
constexpr const PhaseRow& phase_row(Phase phase) { return kPhaseRows[static_cast<int>(phase)]; }

/// Every phase, in order (`for (Phase p : all_phases())`).
constexpr std::array<Phase, kPhases> all_phases() {
  std::array<Phase, kPhases> out{};
  for (int i = 0; i < kPhases; ++i) out[static_cast<std::size_t>(i)] = kPhaseRows[i].phase;
  return out;
}

/// The compute phases F, B, I and W, in order (`for (Phase p : compute_phases())`):
/// the phases that a table of costs (PhaseCosts) has an entry for.
constexpr std::array<Phase, kComputePhases> compute_phases() {
  std::array<Phase, kComputePhases> out{};
  for (int i = 0; i < kComputePhases; ++i) out[static_cast<std::size_t>(i)] = kPhaseRows[i].phase;
  return out;
}

/// True for R, the phases that run on a device's collective lane.
constexpr bool is_collective(Phase phase) { return phase_row(phase).lane == ActionLane::kCollective; }

/// True for R, O and L, the phases that run beside the compute, on a lane of
/// their own: they take no time on the compute clock.
constexpr bool beside_compute(Phase phase) { return phase_row(phase).lane != ActionLane::kCompute; }

/// True for O and L, the phases that run on a device's copy lane.
constexpr bool is_copy(Phase phase) { return phase_row(phase).lane == ActionLane::kCopy; }

/// True for C, the recomputation: it restores a stash by computing it again.
constexpr bool is_recompute(Phase phase) { return phase_row(phase).restores && phase_row(phase).lane == ActionLane::kCompute; }

/// True for the phases a program may add to a (stage, micro-batch) or leave
/// out, which act on its stash before its backward (C, O, L).
constexpr bool acts_on_stash(Phase phase) { return !phase_row(phase).stash_rule.empty(); }

/// The letter of a phase in tokens and in PyTorch's notation: F, B, I or W.
constexpr char phase_letter(Phase phase) { return phase_row(phase).letter; }

/// The phase of a letter (F, B, I, W, C, R, O or L); nothing for any other.
constexpr std::optional<Phase> phase_of_letter(char letter) {
  for (const PhaseRow& r : kPhaseRows)
    if (r.letter == letter) return r.phase;
  return std::nullopt;
}

/// True for the phases that compute an input gradient (B and I).
constexpr bool makes_input_gradient(Phase phase) { return phase_row(phase).input_gradient; }

/// True for a whole backward (B): it makes both gradients, which the halves of
/// a split backward (I and W, the phases its cost follows) make apart.
constexpr bool is_whole_backward(Phase phase) {
  const PhaseRow& r = phase_row(phase);
  return r.input_gradient && r.weight_gradient;
}

/// True for the phases that one (chunk, micro-batch) runs an action of in a
/// schedule whose backwards are split into I and W (`split`) or not: F either
/// way, B unsplit, I and W split; never R (one per chunk) nor C, O and L
/// (where the program chooses to recompute or offload).
constexpr bool runs_per_micro_batch(Phase phase, bool split) {
  const PhaseRow& r = phase_row(phase);
  return r.lane != ActionLane::kCollective && !acts_on_stash(phase) && (split ? !is_whole_backward(phase) : !r.split);
}

/// The actions of one (chunk, micro-batch): 3 (F, I, W) where the backwards are
/// split, else 2 (F, B); a recomputation (C) adds one, an offload two (O, L).
constexpr int actions_per_micro_batch(bool split) {
  int n = 0;
  for (const PhaseRow& r : kPhaseRows) n += runs_per_micro_batch(r.phase, split) ? 1 : 0;
  return n;
}

/// The result an action of `phase` is known by: 0 activation (F), 1 input
/// gradient (B, I), 2 weight gradient (W). B makes the weight gradient too, but
/// what other actions wait for is its input gradient.
constexpr int result_of(Phase phase) { return phase_row(phase).result; }

}  // namespace pipeweave
