#pragma once
/// \file
/// Activation recomputation placed in a program: with_recompute(program,
/// stages) and, at compile time, WithRecompute<Schedule, Stages...>.
///
/// A stage that recomputes a micro-batch keeps only that micro-batch's input
/// from its forward to its recomputation C, which runs the forward again and
/// restores the whole stash for the backward (Megatron-LM's full
/// recomputation, PyTorch's activation checkpointing of a whole stage). The
/// policy here recomputes every micro-batch of the chosen virtual stages, each
/// right before the backward (B or I) that reads it: the memory comes back as
/// late as it can, at the price of one more forward per micro-batch.
///
/// \code
/// using R = pipeweave::WithRecompute<pipeweave::Interleaved1F1B<4, 2, 8>, 0, 1, 2, 3>;
/// static_assert(pipeweave::verify(R{}));
/// static_assert(R::actions[0][R::counts[0] - 2] == pipeweave::recompute(0, 7));
/// \endcode

#include <array>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// The recomputation of a (chunk, micro-batch): C<chunk>.<micro-batch>.
constexpr Action recompute(int chunk, int micro_batch) { return {Phase::kRecompute, chunk, micro_batch}; }

namespace detail {

/// Writes device d's `n` actions `in` to `out` without their recomputations,
/// with a C right before each backward (B or I) of a (chunk, micro-batch) whose
/// `chosen[chunk * micro_batches + micro_batch]` is set, or before the
/// overlapped pair that backward closes; returns the count written. `out`
/// holds room for n + V * M actions.
constexpr int place_recomputations(const bool* chosen, int chunks, int micro_batches, const Action* in, int n,
                                   Action* out) {
  int w = 0;
  for (int k = 0; k < n; ++k) {
    const Action& a = in[k];
    if (is_recompute(a.phase)) continue;
    // The backward this action starts, when it starts one: itself, or the second half of the pair it opens.
    const Action* b = a.overlaps_next && k + 1 < n ? &in[k + 1] : &a;
    const bool closes_pair = k > 0 && in[k - 1].overlaps_next;
    if (!closes_pair && makes_input_gradient(b->phase) && b->chunk >= 0 && b->chunk < chunks && b->micro_batch >= 0 &&
        b->micro_batch < micro_batches && chosen[b->chunk * micro_batches + b->micro_batch])
      out[w++] = recompute(b->chunk, b->micro_batch);
    out[w++] = a;
  }
  return w;
}

/// A device's row `in` with the actions a stage policy's `Place` puts for
/// each (chunk, micro-batch) `chosen` says, at most `PerUnit` each
/// (place_recomputations(), place_offloads()), as a new row.
template <int PerUnit, auto Place, class Choice>
constexpr std::vector<Action> placed_row(const ScheduleShape& s, const std::vector<Action>& in, const Buffer<Choice>& chosen) {
  std::vector<Action> out(in.size() + PerUnit * static_cast<std::size_t>(s.chunks) * static_cast<std::size_t>(s.micro_batches));
  out.resize(static_cast<std::size_t>(
      Place(chosen.data(), s.chunks, s.micro_batches, in.data(), static_cast<int>(in.size()), out.data())));
  return out;
}

/// Device d's actions `in` with a C before the backward of each (chunk,
/// micro-batch) `chosen` says (place_recomputations()), as a new row.
constexpr std::vector<Action> with_recomputations(const ScheduleShape& s, const std::vector<Action>& in,
                                                  const Buffer<bool>& chosen) {
  return placed_row<1, place_recomputations>(s, in, chosen);
}

/// [chunk * M + micro-batch]: true for each micro-batch of a chunk of device
/// d whose virtual stage is one of `stages` (in range: require_stages()).
constexpr Buffer<bool> chosen_on_device(const ScheduleShape& s, int device, const int* stages, std::size_t count) {
  const int M = s.micro_batches;
  Buffer<bool> chosen(s.chunks * M, false);
  for (std::size_t i = 0; i < count; ++i)
    if (s.device_of_stage(stages[i]) == device)
      for (int m = 0; m < M; ++m) chosen[s.chunk_of_stage(stages[i]) * M + m] = true;
  return chosen;
}

/// Throws Error unless every stage of `stages` is a virtual stage of `s`.
constexpr void require_stages(const ScheduleShape& s, const int* stages, std::size_t count, const char* who) {
  for (std::size_t i = 0; i < count; ++i)
    if (stages[i] < 0 || stages[i] >= s.stages()) {
      Text t(who);
      t << ": stage " << stages[i] << " is not a virtual stage of " << s.devices << " devices x " << s.chunks
        << " chunks (stages are 0.." << s.stages() - 1 << ")";
      throw Error(t.str());
    }
}

/// A stage policy on a program: its actions placed afresh by `Place` for
/// every micro-batch of the virtual stages `stages` (with_recompute(),
/// with_offload()); `who` names the policy in errors.
template <int PerUnit, auto Place>
constexpr Program with_stage_policy(const Program& p, const std::vector<int>& stages, const char* who) {
  require_correct(p, who);
  require_stages(p.shape, stages.data(), stages.size(), who);
  Program out = p;
  for (std::size_t d = 0; d < p.devices.size(); ++d)
    out.devices[d] = placed_row<PerUnit, Place>(
        p.shape, p.devices[d], chosen_on_device(p.shape, static_cast<int>(d), stages.data(), stages.size()));
  return out;
}

/// The arrays of a compile-time stage policy on S (WithRecompute,
/// WithOffload): S's actions with those `Place` puts for every micro-batch of
/// `Stages...`, at most `PerUnit` per (chunk, micro-batch).
template <class S, int PerUnit, auto Place, int... Stages>
struct StagePolicyBase : StaticScheduleFrom<StagePolicyBase<S, PerUnit, Place, Stages...>, S> {
  static constexpr int actions_per_device = S::actions_per_device + PerUnit * S::chunks * S::micro_batches;
  /// `actions[d][k]`: device d's k-th action, for k < counts[d].
  static constexpr auto placed = [] {
    std::array<std::array<Action, static_cast<std::size_t>(clamp_count(actions_per_device))>,
               static_cast<std::size_t>(clamp_count(S::devices))>
        out{};
    std::array<int, static_cast<std::size_t>(clamp_count(S::devices))> n{};
    constexpr std::array<int, sizeof...(Stages)> stages{Stages...};
    constexpr bool in_range = ((Stages >= 0 && Stages < S::devices * S::chunks) && ...);  // else the checks say so
    if (shape_error(S::shape).empty() && in_range)
      for (int d = 0; d < S::devices; ++d) {
        const auto i = static_cast<std::size_t>(d);
        n[i] = Place(chosen_on_device(S::shape, d, stages.data(), stages.size()).data(), S::chunks, S::micro_batches,
                     S::actions[i].data(), S::counts[i], out[i].data());
      }
    return std::pair{out, n};
  }();
  static constexpr auto actions = placed.first;
  static constexpr auto counts = placed.second;
};

}  // namespace detail

/// The program with every micro-batch of the virtual stages `stages`
/// recomputed, C right before its backward (detail::place_recomputations());
/// recomputations already in it are placed afresh (an empty list removes them).
/// The program must verify (throws pipeweave::Error with verify()'s message
/// otherwise), and so does the result. Throws for a stage out of range.
constexpr Program with_recompute(const Program& p, const std::vector<int>& stages) {
  return detail::with_stage_policy<1, detail::place_recomputations>(p, stages, "with_recompute");
}

/// Every virtual stage of a shape, 0 .. P * V - 1: `with_recompute(p, all_stages(p.shape))`
/// recomputes every micro-batch everywhere.
constexpr std::vector<int> all_stages(const ScheduleShape& s) {
  std::vector<int> out;
  for (int st = 0; st < s.stages(); ++st) out.push_back(st);
  return out;
}

/// How many micro-batches a program recomputes, on all its devices: its C.
constexpr int recomputations(const Program& p) { return count_actions(p, Phase::kRecompute); }

/// True when some device's program recomputes a micro-batch.
constexpr bool has_recompute(const Program& p) { return recomputations(p) > 0; }

/// The program with the fewest recomputations this rule finds that bring each
/// device's peak memory (peak_memory() under `model`) within `cap`, or nothing
/// when a device cannot fit even so. Device by device, while some point of its
/// order passes the cap, the micro-batch held there whose backward comes last
/// (it holds its stash the longest) is recomputed, its C right before that
/// backward; recomputations already in the program stay, and so do its
/// offloads (a micro-batch offloaded before its backward is never recomputed;
/// one offloaded in its weight window may be). The order of the
/// other actions is kept, so the program stays correct (it must verify:
/// throws pipeweave::Error with verify()'s message otherwise).
inline std::optional<Program> recompute_to_fit(const Program& p, const MemoryModel& model, double cap) {
  detail::require_correct(p, "recompute_to_fit");
  const ScheduleShape& s = p.shape;
  const int V = s.chunks, M = s.micro_batches;
  const double limit = cap + 1e-9 * (cap > 1 ? cap : 1);  // sums of sizes may round
  Program out = p;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int device = static_cast<int>(d);
    std::vector<Action> base;  // the device's actions without their recomputations
    // offloaded: before its backward (a pair in its weight window leaves it free to recompute).
    detail::Buffer<bool> chosen(V * M, false), offloaded(V * M, false), backward_seen(V * M, false);
    for (const Action& a : p.devices[d]) {
      const int i = a.chunk * M + a.micro_batch;
      if (is_recompute(a.phase)) chosen[i] = true;
      else base.push_back(a);
      if (phase_row(a.phase).offloads && !backward_seen[i]) offloaded[i] = true;
      backward_seen[i] = backward_seen[i] || makes_input_gradient(a.phase);
    }
    for (;;) {
      const std::vector<Action> row = detail::with_recomputations(s, base, chosen);
      const int n = static_cast<int>(row.size());
      // The first position past the cap, and where each (chunk, micro-batch) makes its stash and where its
      // backward (B or I) reads it.
      KeptCount kept;
      int over = -1;
      detail::Buffer<int> made(V * M, -1), read(V * M, n);
      for (int k = 0; k < n; ++k) {
        const Action& a = row[static_cast<std::size_t>(k)];
        const int i = a.chunk * M + a.micro_batch;
        if (phase_row(a.phase).needs.keeps) made[i] = k;
        if (makes_input_gradient(a.phase)) read[i] = k;
        if (over >= 0) continue;
        kept.after(a, model.of(s.stage_of(device, a.chunk)), !beside_compute(a.phase) && chosen[i],
                   is_copy(a.phase) && read[i] < k);  // a copy after its I: in its weight window
        if (kept.memory > limit) over = k;
      }
      if (over < 0) break;
      int pick = -1;  // whole at `over` (made by then, read after it), not yet recomputed, read last
      for (int i = 0; i < V * M; ++i)
        if (!chosen[i] && !offloaded[i] && made[i] >= 0 && made[i] <= over && read[i] > over && (pick < 0 || read[i] > read[pick]))
          pick = i;
      if (pick < 0) return std::nullopt;
      chosen[pick] = true;
    }
    out.devices[d] = detail::with_recomputations(s, base, chosen);
  }
  return out;
}

namespace detail {

/// WithRecompute's rule on its stages, with its message.
template <class S, int... Stages>
struct RecomputeChecks {
  static_assert(sizeof...(Stages) > 0, "WithRecompute: name at least one virtual stage to recompute");
  static_assert(((Stages >= 0 && Stages < S::devices * S::chunks) && ...),
                "WithRecompute: every stage must be a virtual stage of the schedule, 0 .. Devices * Chunks - 1");
};

}  // namespace detail

/// A compile-time schedule whose virtual stages `Stages...` recompute every
/// micro-batch: with_recompute() of Schedule's program, as arrays.
/// `static_assert(verify(WithRecompute<OneFOneB<4, 8>, 0, 1>{}))` proves it.
template <StaticScheduleType Schedule, int... Stages>
struct WithRecompute : detail::RecomputeChecks<Schedule, Stages...>,
                       detail::StagePolicyBase<Schedule, 1, detail::place_recomputations, Stages...> {};

}  // namespace pipeweave
