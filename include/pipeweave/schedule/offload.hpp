#pragma once
/// \file
/// Activation offload placed in a program: with_offload(program, stages) and,
/// at compile time, WithOffload<Schedule, Stages...>.
///
/// A stage that offloads a micro-batch moves its stash to host memory over the
/// device's copy lane after its forward (O) and brings it back before its
/// backward (L); in between the device holds nothing of it. The copy of an
/// offload starts when its forward ends; the device waits for it where the
/// program places O. The copy of a reload starts where the program places L;
/// the backward waits for it (simulate.hpp). The policy here offloads every
/// micro-batch of the chosen virtual stages whose stash lives long enough to
/// gain from it, each copy beside one action of the device:
/// - O right after the action that follows the forward (the copy runs beside
///   that action; after the whole pair where that action opens one);
/// - L right before the action that precedes the backward (B or I; before the
///   whole pair where that action, or the backward, closes one);
/// - a micro-batch that would have no action between its O and its L (fewer
///   than three between its forward and its backward) stays on the device.
/// Micro-batches the program recomputes (C) are not offloaded.
///
/// \code
/// using O = pipeweave::WithOffload<pipeweave::OneFOneB<4, 8>, 0>;
/// static_assert(pipeweave::verify(O{}));
/// static_assert(O::actions[0][2] == pipeweave::offload(0, 0));
/// \endcode

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// The offload of a (chunk, micro-batch)'s stash to host memory: O<chunk>.<micro-batch>.
constexpr Action offload(int chunk, int micro_batch) { return {Phase::kOffload, chunk, micro_batch}; }

/// The reload of a (chunk, micro-batch)'s stash from host memory: L<chunk>.<micro-batch>.
constexpr Action reload(int chunk, int micro_batch) { return {Phase::kReload, chunk, micro_batch}; }

namespace detail {

/// Writes device d's `n` actions `in` to `out` without their offloads and
/// reloads, with an O and an L for each (chunk, micro-batch) whose
/// `chosen[chunk * micro_batches + micro_batch]` is set, placed as the file
/// comment says; returns the count written. `out` holds room for n + 2 * V * M
/// actions.
constexpr int place_offloads(const bool* chosen, int chunks, int micro_batches, const Action* in, int n, Action* out) {
  const int units = chunks * micro_batches;
  Buffer<int> scratch_storage(3 * (n + units));
  int* scratch = scratch_storage.data();
  int* base = scratch;              // [k]: the index in `in` of the k-th action kept
  int* after = scratch + n;         // [k]: the first unit whose O comes after base action k; -1 none
  int* before = after + n;          // [k]: the first unit whose L comes before base action k; -1 none
  int* next_o = before + n;         // [unit]: the next unit whose O comes after the same action
  int* next_l = next_o + units;     // [unit]: the next unit whose L comes before the same action
  int* forward = next_l + units;    // [unit]: the base index of its forward; -1 none
  int kept = 0;
  for (int k = 0; k < n; ++k)
    if (!is_copy(in[k].phase)) base[kept++] = k;
  for (int k = 0; k < kept; ++k) after[k] = before[k] = -1;
  auto unit_of = [&](const Action& a) {
    return a.chunk >= 0 && a.chunk < chunks && a.micro_batch >= 0 && a.micro_batch < micro_batches
               ? a.chunk * micro_batches + a.micro_batch
               : -1;
  };
  auto opens = [&](int k) { return k >= 0 && k + 1 < kept && in[base[k]].overlaps_next; };
  auto closes = [&](int k) { return k > 0 && in[base[k - 1]].overlaps_next; };
  Buffer<bool> recomputed(units, false);
  for (int u = 0; u < units; ++u) forward[u] = -1;
  for (int k = 0; k < kept; ++k) {
    const Action& a = in[base[k]];
    const int u = unit_of(a);
    if (u < 0) continue;
    if (is_recompute(a.phase)) recomputed[u] = true;
    if (a.phase == Phase::kForward) forward[u] = k;
  }
  // Backwards, each to the front of its list: a list ends in the order of the backwards.
  for (int k = kept - 1; k >= 0; --k) {
    const Action& a = in[base[k]];
    const int u = unit_of(a);
    if (u < 0 || !chosen[u] || recomputed[u] || !makes_input_gradient(a.phase) || forward[u] < 0) continue;
    int o = forward[u] + 1;  // O after this action, or after the pair it opens
    if (opens(o)) ++o;
    int l = closes(k) ? k - 1 : k;  // the backward's start
    l = l - 1;                      // L before this action, or before the pair it closes
    if (closes(l)) --l;
    if (l < o + 2 || o >= kept) continue;  // no action between O and L: it stays
    next_o[u] = after[o];
    after[o] = u;
    next_l[u] = before[l];
    before[l] = u;
  }
  int w = 0;
  for (int k = 0; k < kept; ++k) {
    for (int u = before[k]; u >= 0; u = next_l[u]) out[w++] = reload(u / micro_batches, u % micro_batches);
    out[w++] = in[base[k]];
    for (int u = after[k]; u >= 0; u = next_o[u]) out[w++] = offload(u / micro_batches, u % micro_batches);
  }
  return w;
}

}  // namespace detail

/// The program with every micro-batch of the virtual stages `stages`
/// offloaded (O after its forward, L before its backward, as the file comment
/// places them), but those whose stash lives too short a time to gain and
/// those the program recomputes; offloads already in it are placed afresh (an
/// empty list removes them). The program must verify (throws pipeweave::Error
/// with verify()'s message otherwise), and so does the result. Throws for a
/// stage out of range.
constexpr Program with_offload(const Program& p, const std::vector<int>& stages) {
  return detail::with_stage_policy<2, detail::place_offloads>(p, stages, "with_offload");
}

/// How many stashes a program offloads, on all its devices: its O.
constexpr int offloads(const Program& p) { return count_actions(p, Phase::kOffload); }

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
                     detail::StagePolicyBase<Schedule, 2, detail::place_offloads, Stages...> {};

}  // namespace pipeweave
