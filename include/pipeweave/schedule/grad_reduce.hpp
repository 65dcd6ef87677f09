#pragma once
/// \file
/// Gradient reductions placed in a program, for data parallelism around the
/// pipeline: with_grad_reduce(program) and, at compile time,
/// WithGradReduce<Schedule>.
///
/// With D replicas of a P-device pipeline, device d of every replica holds the
/// same chunks; each chunk's parameter gradients are summed over those D devices
/// before the optimizer steps. A chunk's sum can start once the device's last
/// action that adds to them is done (its last B, or its last W where the
/// backward is split), and runs on the device's collective lane beside the
/// actions that follow: the cool-down hides it. R<c> marks that point in the
/// device's program, as PyTorch's `_add_reduce_grad` places `REDUCE_GRAD`.
///
/// \code
/// using DP = pipeweave::WithGradReduce<pipeweave::Interleaved1F1B<4, 2, 8>>;
/// static_assert(DP::actions[0][DP::counts[0] - 1] == pipeweave::reduce_grad(0));
/// static_assert(pipeweave::verify(DP{}));
/// \endcode

#include <array>
#include <cstddef>
#include <utility>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

namespace detail {

/// Writes device d's `n` actions `in` to `out` without their reductions, with
/// R<c> right after the last action that adds to chunk c's parameter gradients
/// (a B or a W; after the pair it closes, which it then does); returns the count
/// written (the compute actions + V). `out` holds room for n + V actions.
constexpr int place_reductions(int chunks, const Action* in, int n, Action* out) {
  Buffer<int> last(chunks, -1);  // [chunk]: position in `in` of its last weight-gradient action
  for (int k = 0; k < n; ++k)
    if (phase_row(in[k].phase).weight_gradient && in[k].chunk >= 0 && in[k].chunk < chunks) last[in[k].chunk] = k;
  int w = 0;
  for (int c = 0; c < chunks; ++c)
    if (last[c] < 0) out[w++] = reduce_grad(c);  // a chunk with no backward here: nothing to wait for
  for (int k = 0; k < n; ++k) {
    if (is_collective(in[k].phase)) continue;
    out[w++] = in[k];
    for (int c = 0; c < chunks; ++c)
      if (last[c] == k) out[w++] = reduce_grad(c);
  }
  return w;
}

}  // namespace detail

/// The program with one gradient reduction per (device, chunk), R<c> right after
/// the device's last B or W of chunk c (detail::place_reductions()); reductions
/// already in it are placed afresh. The program must verify (throws
/// pipeweave::Error with verify()'s message otherwise: its actions are checked,
/// detail::verify_actions()); the result verifies too.
constexpr Program with_grad_reduce(const Program& p) {
  detail::require_correct(p, "with_grad_reduce");
  Program out = p;
  const int V = p.shape.chunks;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const auto& in = p.devices[d];
    auto& row = out.devices[d];
    row.assign(in.size() + static_cast<std::size_t>(V), Action{});
    row.resize(static_cast<std::size_t>(
        detail::place_reductions(V, in.data(), static_cast<int>(in.size()), row.data())));
  }
  return out;
}

/// True when some device's program has a gradient reduction.
constexpr bool has_grad_reduce(const Program& p) {
  for (const auto& row : p.devices)
    for (const Action& a : row)
      if (is_collective(a.phase)) return true;
  return false;
}

namespace detail {

/// The arrays of WithGradReduce<S>: S's actions with their reductions.
template <class S>
struct GradReduceBase : StaticScheduleFrom<GradReduceBase<S>, S> {
  static constexpr int actions_per_device = S::actions_per_device + S::chunks;
  /// `actions[d][k]`: device d's k-th action, for k < counts[d].
  static constexpr auto placed = [] {
    std::array<std::array<Action, static_cast<std::size_t>(clamp_count(actions_per_device))>,
               static_cast<std::size_t>(clamp_count(S::devices))>
        out{};
    std::array<int, static_cast<std::size_t>(clamp_count(S::devices))> n{};
    if (shape_error(S::shape).empty())
      for (int d = 0; d < S::devices; ++d)
        n[static_cast<std::size_t>(d)] = place_reductions(S::chunks, S::actions[static_cast<std::size_t>(d)].data(),
                                                          S::counts[static_cast<std::size_t>(d)],
                                                          out[static_cast<std::size_t>(d)].data());
    return std::pair{out, n};
  }();
  static constexpr auto actions = placed.first;
  static constexpr auto counts = placed.second;
};

}  // namespace detail

/// A compile-time schedule with a gradient reduction per (device, chunk):
/// with_grad_reduce() of Schedule's program, as arrays.
/// `static_assert(verify(WithGradReduce<Interleaved1F1B<4, 2, 8>>{}))` proves the
/// data-parallel interleaved schedule.
template <StaticScheduleType Schedule>
struct WithGradReduce : detail::GradReduceBase<Schedule> {};

}  // namespace pipeweave
