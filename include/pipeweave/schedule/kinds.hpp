#pragma once
/// \file
/// The table of schedule kinds: one row per kind (kKindRows). What a kind is
/// (its name and title, its placement and shape rules, its order, warm-up rule
/// and closed forms) is said in its row and nowhere else; every layer reads the
/// rows. A new schedule kind is an enumerator (action.hpp), its order
/// (orders.hpp), one row here and its compile-time type in schedules.hpp
/// (docs/extending.md).
///
/// \code
/// static_assert(pipeweave::kind_row(pipeweave::ScheduleKind::kZeroBubbleV).placement == pipeweave::Placement::kV);
/// \endcode

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/costs.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/orders.hpp"

namespace pipeweave {

/// Action costs in effect for the closed forms (CostModel's, every fallback
/// resolved: no entry is negative).
using UnitCosts = PhaseCosts<double>;

namespace detail {

// The shape rules, each written once as a predicate over the counts: a row's
// rules (and shape_error()) word what breaks one for make_schedule(), and the
// compile-time types' static_asserts (schedules.hpp) check the same predicate.

/// The rule common to every kind: devices, chunks and micro-batches at least 1.
constexpr bool at_least_one(int count) { return count >= 1; }

/// Interleaved 1F1B's rule (Megatron-LM's): M a multiple of P.
constexpr bool micro_batches_multiple_of_devices(int devices, int micro_batches) {
  return devices < 1 || micro_batches % devices == 0;
}

/// PyTorch's rounds rule of the zero-bubble schedules: M a multiple of max(1, M / P).
constexpr bool whole_rounds(int devices, int micro_batches) {
  return devices < 1 || micro_batches < 1 ||
         micro_batches % (micro_batches / devices > 1 ? micro_batches / devices : 1) == 0;
}

/// DualPipeV's rule (PyTorch's): M at least the number of stages, 2P.
constexpr bool micro_batches_cover_stages(int devices, int micro_batches) { return micro_batches >= 2 * devices; }

/// PyTorch's rounds rule of the zero-bubble schedules, in words (whole_rounds()).
constexpr void whole_rounds_rule(Text& t, const ScheduleShape& s, std::string_view name) {
  if (!whole_rounds(s.devices, s.micro_batches))
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
  return (static_cast<double>(s.chunks) * s.micro_batches + s.devices - 1) *
         (c[Phase::kForward] + c[Phase::kBackward]);
}

/// The zero-bubble kinds' makespan when W <= F and W <= I: V*M(F + I + W) + (P - 1)(F + I - W)
/// for M >= P; (M + P - 1)(F + I) + W for M < P (ZB-H1 only).
constexpr double zero_bubble_makespan(const ScheduleShape& s, const UnitCosts& c) {
  const double P = s.devices, V = s.chunks, M = s.micro_batches;
  const double F = c[Phase::kForward], I = c[Phase::kBackwardInput], W = c[Phase::kBackwardWeight];
  return M >= P ? V * M * (F + I + W) + (P - 1) * (F + I - W) : (M + P - 1) * (F + I) + W;
}

constexpr void zero_bubble_limits(Text& t, const ScheduleShape&, const UnitCosts& c, std::string_view name) {
  const double F = c[Phase::kForward], I = c[Phase::kBackwardInput], W = c[Phase::kBackwardWeight];
  if (!(W <= F && W <= I)) t << name << " has a closed form for W <= F and W <= I only";
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
constexpr void no_order(const ScheduleShape&, int, int, ActionSink&) {}
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
  /// Its rank among the kinds AutoSchedule may measure the costs with (runtime/auto_schedule.hpp), 1 first:
  /// those that keep few activations, the ones that time I and W apart first; 0: never.
  int probe = 0;
  /// Its own shape rules past the common ones: appends what is wrong.
  void (*rules)(Text&, const ScheduleShape&, std::string_view name) = detail::no_rules;
  /// Number of warm-up forwards on device d; null: every forward (V*M).
  int (*warmup)(const ScheduleShape&, int device) = detail::every_forward;
  bool generated = true;  ///< it has an order of its own (every kind but auto and custom)
  bool synthesized = false;  ///< its order is searched for costs and a memory limit (auto: synthesize())
  /// Hands device d's actions, in order, to the sink, given its warm-up forwards
  /// (`warmup` above); an order of orders.hpp.
  void (*generate)(const ScheduleShape&, int device, int warmup, ActionSink&) = detail::no_order;
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
     .split_backward = false, .pairs = false, .uneven = false, .bench_default = true, .preferred = false, .probe = 4,
     .warmup = [](const ScheduleShape& s, int d) { return std::min(s.devices - d - 1, s.chunks * s.micro_batches); },
     .generate = detail::generate_one_f_one_b, .has_makespan = true, .makespan = detail::one_f_one_b_makespan, .bubble_of_shape = true,
     .has_peaks = true, .peak_activations = detail::one_f_one_b_peak},
    {.kind = ScheduleKind::kInterleaved1F1B, .name = "interleaved", .title = "Interleaved 1F1B",
     .placement = Placement::kLoop, .chunks = 0, .chunks_hint = "", .default_chunks = 2, .split_backward = false,
     .pairs = false, .uneven = false, .bench_default = true, .preferred = true, .micro_batches_rule = "a multiple of P", .probe = 3,
     .rules =
         [](Text& t, const ScheduleShape& s, std::string_view name) {
           if (!detail::micro_batches_multiple_of_devices(s.devices, s.micro_batches))
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
           return (V * std::max(M, P) + std::min(M, P) - 1) * (c[Phase::kForward] + c[Phase::kBackward]);
         },
     .has_peaks = true, .peak_activations = [](const ScheduleShape& s, int, int) { return s.chunks * s.micro_batches; }},
    {.kind = ScheduleKind::kZeroBubbleH1, .name = "zb-h1", .title = "ZB-H1", .placement = Placement::kLoop,
     .chunks = 1, .chunks_hint = "; use interleaved-zb for several chunks per device", .default_chunks = 1,
     .split_backward = true, .pairs = false, .uneven = false, .bench_default = false, .preferred = false, .micro_batches_rule = "a multiple of max(1, M / P)",
     .probe = 2, .rules = detail::whole_rounds_rule, .warmup = detail::zero_bubble_warmup,
     .generate = detail::generate_interleaved_zero_bubble, .has_makespan = true, .makespan = detail::zero_bubble_makespan,
     .makespan_limits = detail::zero_bubble_limits, .has_peaks = true, .peak_activations = detail::zero_bubble_peak,
     .peak_memory = detail::zero_bubble_memory},
    {.kind = ScheduleKind::kInterleavedZeroBubble, .name = "interleaved-zb", .title = "Interleaved ZB",
     .placement = Placement::kLoop, .chunks = 0, .chunks_hint = "", .default_chunks = 2, .split_backward = true,
     .pairs = false, .uneven = false, .bench_default = false, .preferred = false, .micro_batches_rule = "a multiple of max(1, M / P)", .probe = 1,
     .rules = detail::whole_rounds_rule, .warmup = detail::zero_bubble_warmup,
     .generate = detail::generate_interleaved_zero_bubble,
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
           const double F = c[Phase::kForward], I = c[Phase::kBackwardInput], W = c[Phase::kBackwardWeight];
           return 2.0 * s.micro_batches * (F + I + W) + (s.devices - 1) * F;
         },
     .makespan_limits =
         [](Text& t, const ScheduleShape& s, const UnitCosts& c, std::string_view name) {
           const double F = c[Phase::kForward], I = c[Phase::kBackwardInput], W = c[Phase::kBackwardWeight];
           if (!(s.micro_batches >= 2 * s.devices - 1 && I == F && 2 * W >= F && W <= F))
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
           if (!detail::micro_batches_cover_stages(s.devices, s.micro_batches))
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
  return true;
}(), "kKindRows: rows in the order of ScheduleKind");

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
  return actions_per_micro_batch(splits_backward(kind)) * chunks * micro_batches;
}

/// Describes what is wrong with a shape for its schedule kind; empty when valid.
/// The rules common to every kind, then the row's: its chunks, its own rules,
/// its placement.
constexpr Text shape_error(const ScheduleShape& s) {
  Text t;
  const KindRow& row = kind_row(s.kind);
  const std::string_view name = row.name;
  if (!detail::at_least_one(s.devices)) {
    t << name << " schedule: devices must be at least 1 (got " << s.devices << ")";
  } else if (!detail::at_least_one(s.chunks)) {
    t << name << " schedule: chunks must be at least 1 (got " << s.chunks << ")";
  } else if (!detail::at_least_one(s.micro_batches)) {
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
