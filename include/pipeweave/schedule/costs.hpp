#pragma once
/// \file
/// PhaseCosts<T>: one number per compute phase (F, B, I and W), indexed by the
/// phase: the one table of costs of every layer. The lowering's reference
/// clock is a PhaseCosts<long long> (LoweringCosts: Program::lowering and
/// Program::stage_lowering), the closed forms take a PhaseCosts<double>
/// (UnitCosts, kinds.hpp), and so do the cost model and each of its stages
/// (CostModel::compute and StageCost, analysis/simulate.hpp). What a phase's
/// cost is by default and what a negative one follows is said in its row
/// (kPhaseRows: `reference_cost`, `fallback`), so a new compute phase is a row
/// there, not a member here.
///
/// \code
/// static_assert(pipeweave::LoweringCosts{}[pipeweave::Phase::kBackward] == 2);
/// static_assert(pipeweave::PhaseCosts<double>{2, -1, 3, -1}.cost_of(pipeweave::Phase::kBackward) == 5);
/// \endcode

#include <array>
#include <cstddef>

#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/phases.hpp"

namespace pipeweave {

namespace detail {

/// Each compute phase's reference cost (its row's), as a T.
template <class T>
constexpr std::array<T, kComputePhases> reference_costs() {
  std::array<T, kComputePhases> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(kPhaseRows[i].reference_cost);
  return out;
}

/// The entry of compute phase `phase` in a table of costs; throws Error for
/// the phases past the costed ones, which have no entry: C (a recomputed
/// forward costs its forward) and the collective R (it runs on the collective lane).
constexpr std::size_t cost_index(Phase phase) {
  if (static_cast<int>(phase) >= kComputePhases) {
    Text t("PhaseCosts: ");
    t << phase_row(phase).role << " has no entry in a table of compute costs";
    throw Error(t.str());
  }
  return static_cast<std::size_t>(phase);
}

}  // namespace detail

/// The cost of each compute phase, `costs[Phase::kForward]`, in the order of
/// Phase: `LoweringCosts{1, 2, 1, 1}` is F 1, B 2, I 1, W 1. A plain aggregate;
/// by default each phase's reference cost (its row's: F 1, B 2, I 1, W 1, the
/// usual ratios for a layer: a backward computes the input gradient and the
/// weight gradient, each about as costly as the forward). A negative cost
/// (CostModel's) follows others: cost_of() takes the sum of its row's
/// fallbacks' (I and W: F; B: I + W).
template <class T>
struct PhaseCosts {
  /// [phase]: the cost of each compute phase.
  std::array<T, kComputePhases> cost = detail::reference_costs<T>();

  /// The entry of compute phase `phase` (Error for R).
  constexpr T& operator[](Phase phase) { return cost[detail::cost_index(phase)]; }
  /// The entry of compute phase `phase` (Error for R).
  constexpr const T& operator[](Phase phase) const { return cost[detail::cost_index(phase)]; }

  /// The cost in effect of an action of `phase`: its entry, or where that is
  /// negative the sum of its row's fallbacks in effect; for C (no entry) its
  /// fallback's, the forward's; 0 for R, O and L, which take no compute time
  /// (they run on the collective and copy lanes).
  constexpr T cost_of(Phase phase) const {
    if (beside_compute(phase)) return 0;
    const PhaseRow& row = phase_row(phase);
    const bool entry = static_cast<int>(phase) < kComputePhases;
    const T own = entry ? cost[static_cast<std::size_t>(phase)] : T(-1);
    if (!(own < 0) || row.fallbacks == 0) return own;
    T sum = 0;
    for (int k = 0; k < row.fallbacks; ++k) sum += cost_of(row.fallback[k]);
    return sum;
  }

  /// The costs where every phase that can follow others does (negative), the
  /// others at their reference: {1, -1, -1, -1}, so that setting the forward
  /// alone sets them all.
  static constexpr PhaseCosts following() {
    PhaseCosts c;
    for (std::size_t i = 0; i < c.cost.size(); ++i)
      if (kPhaseRows[i].fallbacks > 0) c.cost[i] = -1;
    return c;
  }

  friend constexpr bool operator==(const PhaseCosts&, const PhaseCosts&) = default;
};

/// The reference clock the lowering plans a program's steps with
/// (Program::lowering, lowering.hpp): integer durations of each compute phase
/// of one chunk, every one at least 1.
using LoweringCosts = PhaseCosts<long long>;

}  // namespace pipeweave
