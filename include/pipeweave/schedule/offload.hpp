#pragma once
/// \file
/// Activation offload placed in a program: with_offload(program, stages) and,
/// at compile time, WithOffload<Schedule, Stages...>; offload_to_fit(program,
/// model, cap), the offloads that bring a program within a memory cap.
///
/// A stage that offloads a micro-batch moves its stash to host memory over the
/// device's copy lane after its forward (O) and brings it back before its
/// backward (L); in between the device holds nothing of it. Where the backward
/// is split, a second pair may move the stash and the output gradient that the
/// W reads away from the I to the W: the weight window. The copy of an offload
/// starts when its forward (its I) ends; the device waits for it where the
/// program places O. The copy of a reload starts where the program places L;
/// the backward (the W) waits for it (simulate.hpp). The policy here offloads
/// every micro-batch of the chosen virtual stages, in each window long enough
/// to gain from it, each copy beside one action of the device:
/// - O right after the action that follows the forward, or the I (the copy
///   runs beside that action; after the whole pair where that action opens
///   one);
/// - L right before the action that precedes the backward (B or I; before the
///   whole pair where that action, or the backward, closes one), or the W;
/// - a window that would have no action between its O and its L (fewer than
///   three between its ends) keeps the micro-batch on the device.
/// Micro-batches the program recomputes (C) are offloaded in their weight
/// window only (the C restores the stash before the I). offload_to_fit()
/// places copies so too where that meets its cap, and otherwise tight: O right
/// after the forward (the I) and L right before the backward (the W); the
/// device then waits for the whole copy at the O, the reader for the whole
/// reload.
///
/// \code
/// using O = pipeweave::WithOffload<pipeweave::OneFOneB<4, 8>, 0>;
/// static_assert(pipeweave::verify(O{}));
/// static_assert(O::actions[0][2] == pipeweave::offload(0, 0));
/// \endcode

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// The offload of a (chunk, micro-batch)'s stash to host memory: O<chunk>.<micro-batch>.
constexpr Action offload(int chunk, int micro_batch) { return {Phase::kOffload, chunk, micro_batch}; }

/// The reload of a (chunk, micro-batch)'s stash from host memory: L<chunk>.<micro-batch>.
constexpr Action reload(int chunk, int micro_batch) { return {Phase::kReload, chunk, micro_batch}; }

/// True when an offload of virtual stage `stage`'s stash leaves its output on
/// the device: the next stage is on the same device and reads that output
/// there (its input; the runtime moves no tensor another stage holds,
/// runtime/plan.hpp). Such an offload frees less than a memory model counts,
/// so offload_to_fit() and synthesis choose none; with_offload() does what
/// it is told.
constexpr bool offload_keeps_output(const ScheduleShape& s, int stage) {
  return stage + 1 < s.stages() && s.device_of_stage(stage + 1) == s.device_of_stage(stage);
}

namespace detail {

/// Where the copies of one pair go around the actions of its device.
enum class CopyPlace : unsigned char {
  kNone,    ///< not offloaded
  kBeside,  ///< each copy beside one action (the file comment's rule)
  kTight,   ///< O right after the action that opens the window, L right before the one that reads: away the longest
};

/// Where each (chunk, micro-batch) of a device's actions without copies has
/// its forward, its backward (B or I) and its W: indices into the kept
/// actions, -1 where there is none; and whether the program recomputes it.
struct UnitMarks {
  Buffer<int> forward, input, weight;
  Buffer<bool> recomputed;

  constexpr UnitMarks(int units, const Action* in, const int* base, int kept, int micro_batches, int chunks)
      : forward(units, -1), input(units, -1), weight(units, -1), recomputed(units, false) {
    for (int k = 0; k < kept; ++k) {
      const Action& a = in[base[k]];
      if (a.chunk < 0 || a.chunk >= chunks || a.micro_batch < 0 || a.micro_batch >= micro_batches) continue;
      const int u = a.chunk * micro_batches + a.micro_batch;
      if (is_recompute(a.phase)) recomputed[u] = true;
      if (a.phase == Phase::kForward) forward[u] = k;
      if (makes_input_gradient(a.phase)) input[u] = k;
      if (a.phase == Phase::kBackwardWeight) weight[u] = k;
    }
  }
};

/// Writes device d's `n` actions `in` to `out` without their offloads and
/// reloads, with the pairs `place` asks for: `place[2 * unit]` for the pair
/// between the forward and the backward (B or I) of unit = chunk *
/// micro_batches + micro_batch, `place[2 * unit + 1]` for the pair in its
/// weight window (from its I to its W); kNone for none. Returns the count
/// written; `out` holds room for n + 4 * V * M actions. A window pair where the
/// backward is not split, the pair before the backward of a micro-batch the
/// program recomputes (its C restores the stash there), and a pair that would
/// have no action between its O and L are left out.
constexpr int place_copies(const CopyPlace* place, int chunks, int micro_batches, const Action* in, int n,
                           Action* out) {
  const int units = chunks * micro_batches;
  Buffer<int> scratch_storage(3 * n + 4 * units);
  int* scratch = scratch_storage.data();
  int* base = scratch;               // [k]: the index in `in` of the k-th action kept
  int* after = scratch + n;          // [k]: the first pair whose O comes after base action k; -1 none
  int* before = after + n;           // [k]: the first pair whose L comes before base action k; -1 none
  int* next_o = before + n;          // [pair]: the next pair whose O comes after the same action
  int* next_l = next_o + 2 * units;  // [pair]: the next pair whose L comes before the same action
  int kept = 0;
  for (int k = 0; k < n; ++k)
    if (!is_copy(in[k].phase)) base[kept++] = k;
  for (int k = 0; k < kept; ++k) after[k] = before[k] = -1;
  auto opens = [&](int k) { return k >= 0 && k + 1 < kept && in[base[k]].overlaps_next; };
  auto closes = [&](int k) { return k > 0 && in[base[k - 1]].overlaps_next; };
  const UnitMarks marks(units, in, base, kept, micro_batches, chunks);
  // Each pair at the action that reads what it brings back, last first, each to the front of its list: a list
  // ends in the order of those actions.
  for (int k = kept - 1; k >= 0; --k) {
    const Action& a = in[base[k]];
    if (a.chunk < 0 || a.chunk >= chunks || a.micro_batch < 0 || a.micro_batch >= micro_batches) continue;
    const int u = a.chunk * micro_batches + a.micro_batch;
    const bool window = a.phase == Phase::kBackwardWeight;
    const int pair = 2 * u + (window ? 1 : 0), from = window ? marks.input[u] : marks.forward[u];
    if (place[pair] == CopyPlace::kNone || (marks.recomputed[u] && !window) || from < 0 ||
        k != (window ? marks.weight[u] : marks.input[u]))
      continue;
    const bool beside = place[pair] == CopyPlace::kBeside;
    int o = from + (beside ? 1 : 0);  // O after this action, or after the pair it opens
    if (opens(o)) ++o;
    int l = closes(k) ? k - 1 : k;  // the reader's start
    if (beside) l = l - 1;          // L before this action, or before the pair it closes
    if (closes(l)) --l;
    if (l < o + 2 || o >= kept) continue;  // no action between O and L: it stays
    next_o[pair] = after[o];
    after[o] = pair;
    next_l[pair] = before[l];
    before[l] = pair;
  }
  int w = 0;
  for (int k = 0; k < kept; ++k) {
    for (int q = before[k]; q >= 0; q = next_l[q]) out[w++] = reload(q / 2 / micro_batches, q / 2 % micro_batches);
    out[w++] = in[base[k]];
    for (int q = after[k]; q >= 0; q = next_o[q]) out[w++] = offload(q / 2 / micro_batches, q / 2 % micro_batches);
  }
  return w;
}

/// place_copies() with both pairs of every (chunk, micro-batch) `chosen`
/// says offloaded, their copies beside actions.
constexpr int place_offloads(const bool* chosen, int chunks, int micro_batches, const Action* in, int n, Action* out) {
  Buffer<CopyPlace> place(2 * chunks * micro_batches, CopyPlace::kNone);
  for (int u = 0; u < chunks * micro_batches; ++u)
    if (chosen[u]) place[2 * u] = place[2 * u + 1] = CopyPlace::kBeside;
  return place_copies(place.data(), chunks, micro_batches, in, n, out);
}

}  // namespace detail

/// The program with every micro-batch of the virtual stages `stages`
/// offloaded (O after its forward, L before its backward, and, where the
/// backward is split, O after its I, L before its W, as the file comment
/// places them), but in windows too short to gain and before the backward of
/// those the program recomputes; offloads already in it are placed afresh (an
/// empty list removes them). The program must verify (throws pipeweave::Error
/// with verify()'s message otherwise), and so does the result. Throws for a
/// stage out of range.
constexpr Program with_offload(const Program& p, const std::vector<int>& stages) {
  return detail::with_stage_policy<4, detail::place_offloads>(p, stages, "with_offload");
}

/// How many stashes a program offloads, on all its devices: its O.
constexpr int offloads(const Program& p) { return count_actions(p, Phase::kOffload); }

namespace detail {

/// How many times `row` holds action `a`.
inline int count_actions_of(const std::vector<Action>& row, const Action& a) {
  return static_cast<int>(std::count(row.begin(), row.end(), a));
}

/// The position of the first action of `row` after position k (before it, for
/// `step` -1) that is not a copy (O, L): row.size() or -1 when there is none.
inline int next_non_copy(const std::vector<Action>& row, int k, int step = 1) {
  const int n = static_cast<int>(row.size());
  do k += step;
  while (k >= 0 && k < n && is_copy(row[static_cast<std::size_t>(k)].phase));
  return k;
}

/// offload_to_fit()'s walk: the program with the offloads it chooses, and
/// whether every device fits the cap with them (when one does not, it has
/// those that lowered it so far).
inline std::pair<Program, bool> offload_toward(const Program& p, const MemoryModel& model, double cap) {
  const ScheduleShape& s = p.shape;
  const int M = s.micro_batches, units = s.chunks * M;
  const double limit = cap + 1e-9 * (cap > 1 ? cap : 1);  // sums of sizes may round
  Program out = p;
  bool fits = true;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int device = static_cast<int>(d);
    const std::vector<Action>& in = p.devices[d];
    Buffer<CopyPlace> chosen(2 * units, CopyPlace::kNone);  // [2 * unit + in its weight window]
    Buffer<bool> recomputed(units, false), tried(2 * units, false);
    auto unit = [&](const Action& a) { return a.chunk * M + a.micro_batch; };
    // Offloads already there keep their copies where they are: in the weight window where the L comes after
    // the I; tight where the first action after the L is the one that reads the stash (the backward, or the
    // pair the backward closes; the W), beside an action otherwise.
    const int size = static_cast<int>(in.size());
    Buffer<int> read_at(units, -1), weight_at(units, -1);
    for (int k = 0; k < size; ++k) {
      const Action& a = in[static_cast<std::size_t>(k)];
      if (makes_input_gradient(a.phase)) read_at[unit(a)] = k;
      if (a.phase == Phase::kBackwardWeight) weight_at[unit(a)] = k;
      if (is_recompute(a.phase)) recomputed[unit(a)] = true;
    }
    for (int k = 0; k < size; ++k) {
      const Action& a = in[static_cast<std::size_t>(k)];
      if (a.phase != Phase::kReload) continue;
      const int j = next_non_copy(in, k), u = unit(a);
      const bool window = read_at[u] >= 0 && read_at[u] < k;
      const int reader = window ? weight_at[u] : read_at[u];
      const bool tight = j == reader ||
                         (j < size && in[static_cast<std::size_t>(j)].overlaps_next && next_non_copy(in, j) == reader);
      chosen[2 * u + (window ? 1 : 0)] = tight ? CopyPlace::kTight : CopyPlace::kBeside;
    }
    std::vector<Action> row = placed_row<4, place_copies>(s, in, chosen);
    for (;;) {
      const int n = static_cast<int>(row.size());
      // The first position past the cap, and where each (chunk, micro-batch) makes its stash, where its
      // backward (B or I) reads it, and where its W does.
      KeptCount kept;
      int over = -1;
      Buffer<int> made(units, -1), read(units, n), weight(units, n), away_from(2 * units, n), away_to(2 * units, n);
      for (int k = 0; k < n; ++k) {
        const Action& a = row[static_cast<std::size_t>(k)];
        const int u = unit(a);
        if (phase_row(a.phase).needs.keeps) made[u] = k;
        if (makes_input_gradient(a.phase)) read[u] = k;
        if (a.phase == Phase::kBackwardWeight) weight[u] = k;
        if (is_copy(a.phase)) (phase_row(a.phase).offloads ? away_from : away_to)[2 * u + (read[u] < k ? 1 : 0)] = k;
        if (over >= 0) continue;
        kept.after(a, model.of(s.stage_of(device, a.chunk)), !beside_compute(a.phase) && recomputed[u],
                   is_copy(a.phase) && read[u] < k);
        if (kept.memory > limit) over = k;
      }
      if (over < 0) break;
      // Whole at `over` and away there once offloaded, not yet tried: held between its forward and its
      // backward, or in its weight window (after its I, before its W); one whose copies go beside actions
      // and still put `over` between them (its O after the action after the one that opens the window, its L
      // before the action before the one that reads it) if there is one, else one with tight copies (a pair
      // placed beside actions that leave `over` out may become tight); of those, the one read last.
      int pick = -1, pick_end = -1;
      bool pick_beside = false;
      for (int q = 0; q < 2 * units; ++q) {
        const int u = q / 2;
        const bool window = q % 2 == 1;
        const int from = window ? read[u] : made[u], to = window ? weight[u] : read[u];
        const bool widens = chosen[q] == CopyPlace::kBeside && !(away_from[q] < over && over < away_to[q]);
        if ((chosen[q] != CopyPlace::kNone && !widens) || tried[q] || (recomputed[u] && !window) || made[u] < 0 ||
            from >= over || to <= over || to >= n || offload_keeps_output(s, s.stage_of(device, u / M)))
          continue;
        const bool beside = !widens && next_non_copy(row, from) < over && next_non_copy(row, to, -1) > over;
        if (pick < 0 || (beside && !pick_beside) || (beside == pick_beside && to > pick_end)) {
          pick = q;
          pick_end = to;
          pick_beside = beside;
        }
      }
      if (pick < 0) {
        fits = false;
        break;
      }
      // Beside where that straddles `over`, else (or where beside leaves no action between) tight.
      const CopyPlace was = chosen[pick];
      const int before = count_actions_of(row, offload(pick / 2 / M, pick / 2 % M)) - (was == CopyPlace::kNone ? 0 : 1);
      std::vector<Action> next;
      for (const CopyPlace place : {CopyPlace::kBeside, CopyPlace::kTight}) {
        if (place == CopyPlace::kBeside && !pick_beside) continue;
        chosen[pick] = place;
        next = placed_row<4, place_copies>(s, in, chosen);
        if (count_actions_of(next, offload(pick / 2 / M, pick / 2 % M)) > before) break;
        next.clear();
      }
      if (next.empty()) {
        chosen[pick] = was;  // the rule keeps it (no action between its O and L)
        tried[pick] = true;
        continue;
      }
      row = std::move(next);
    }
    out.devices[d] = std::move(row);
  }
  return {std::move(out), fits};
}

}  // namespace detail

/// The program with the offloads this rule chooses to bring each device's peak
/// memory (peak_memory() under `model`) within `cap`, or nothing when a device
/// cannot fit so. Device by device, while some point of its order passes the
/// cap, of the micro-batches held there (between their forward and backward,
/// or in their weight window) whose O and L would fall on either side of it,
/// the one whose window ends last is offloaded in that window, its O and L
/// placed as with_offload() places them where they leave the point between
/// them, else tight. Offloads already in the program stay;
/// recomputed micro-batches are offloaded in their weight window only. The order of the other actions
/// is kept, so the program stays correct (it must verify: throws
/// pipeweave::Error with verify()'s message otherwise). recompute_to_fit() on
/// its result where it does not fit combines the two (it leaves offloaded
/// micro-batches alone).
inline std::optional<Program> offload_to_fit(const Program& p, const MemoryModel& model, double cap) {
  detail::require_correct(p, "offload_to_fit");
  std::pair<Program, bool> walked = detail::offload_toward(p, model, cap);
  if (!walked.second) return std::nullopt;
  return std::move(walked.first);
}

namespace detail {

/// WithOffload's rule on its stages, with its message.
template <class S, int... Stages>
struct OffloadChecks {
  static_assert(sizeof...(Stages) > 0, "WithOffload: name at least one virtual stage to offload");
  static_assert(((Stages >= 0 && Stages < S::devices * S::chunks) && ...),
                "WithOffload: every stage must be a virtual stage of the schedule, 0 .. Devices * Chunks - 1");
};

}  // namespace detail

/// A compile-time schedule whose virtual stages `Stages...` offload every
/// micro-batch that gains from it: with_offload() of Schedule's program, as
/// arrays. `static_assert(verify(WithOffload<OneFOneB<4, 8>, 0, 1>{}))` proves it.
template <StaticScheduleType Schedule, int... Stages>
struct WithOffload : detail::OffloadChecks<Schedule, Stages...>,
                     detail::StagePolicyBase<Schedule, 4, detail::place_offloads, Stages...> {};

}  // namespace pipeweave
