#pragma once
/// \file
/// Overlapped pairs made from a program: overlap(program) and, at compile time,
/// Overlapped<Schedule>.
///
/// \code
/// using Seed = pipeweave::Overlapped<pipeweave::Interleaved1F1B<4, 2, 8>>;
/// static_assert(Seed::actions[0][11] == pipeweave::fwd(0, 7).paired());  // (F0.7;B1.0): layers 1-2 with 9-10
/// static_assert(pipeweave::verify(Seed{}));
/// \endcode

#include <array>
#include <cstddef>
#include <utility>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

namespace detail {

/// Fuses, left to right, each backward (B or I) of device d with the forward
/// right after it into an overlapped pair, forward first, when the two are
/// independent (independent_halves()); actions already paired stay so.
/// `split[k]` is cleared. A backward pairs with the next forward, not the one
/// before it: that forward's input comes from the previous device, which (in
/// 1F1B-like orders) sends it before it needs this backward's gradient, while
/// the forward before it feeds the next device, which may need it before it
/// sends the gradient (on the last device of 1F1B, B(m) needs F(m) outright).
constexpr void fuse_adjacent(const ScheduleShape& s, int d, Action* row, int n) {
  for (int k = 0; k + 1 < n;) {
    Action& x = row[k];
    Action& y = row[k + 1];
    if (x.overlaps_next || y.overlaps_next) {
      k += x.overlaps_next ? 2 : 1;
      continue;
    }
    if (makes_input_gradient(x.phase) && y.phase == Phase::kForward && independent_halves(s, d, y, x)) {
      const Action backward = x;
      x = y.paired();
      y = backward;
      k += 2;
    } else {
      ++k;
    }
  }
}

/// Fuses every device's actions in place (rows[d][0, counts[d])) with
/// fuse_adjacent(), then runs the program (run_dataflow()); while it stalls,
/// splits back, in their first order, the pairs where it waits for the
/// forward's input with the backward's there (a wait the program did not have).
/// Each round splits a pair at least, so a program that ran before runs after.
/// No generated schedule needs a split (the tests check every kind over a grid
/// of shapes): for those the cost is one fusing pass and one run, linear in the
/// actions.
constexpr void overlap_rows(const ScheduleShape& s, Action* const* rows, const int* counts) {
  const int P = s.devices;
  ActionTable t{s, Buffer<const Action*>(P), Buffer<int>(P), Buffer<const int*>(P, nullptr), 0};
  for (int d = 0; d < P; ++d) {
    fuse_adjacent(s, d, rows[d], counts[d]);
    t.rows[d] = rows[d];
    t.total += t.counts[d] = counts[d];
  }
  Buffer<int> pos;
  while (!run_dataflow(t, pos, NoObserver{})) {
    Buffer<unsigned char> done(s.action_count(), 0);
    for (int d = 0; d < P; ++d)
      for (int k = 0; k < pos[d]; ++k) done[flow_of(s, d, rows[d][k]).self] = 1;
    auto ready = [&](int d, const Action& a) {
      const Flow f = flow_of(s, d, a);
      for (int i = 0; i < f.needs; ++i)
        if (!done[f.need[i]]) return false;
      return true;
    };
    bool split = false;
    for (int d = 0; d < P; ++d) {
      const int k = pos[d];
      if (k == counts[d] || !rows[d][k].overlaps_next || !ready(d, rows[d][k + 1]) || ready(d, rows[d][k])) continue;
      const Action forward = rows[d][k].single();
      rows[d][k] = rows[d][k + 1];
      rows[d][k + 1] = forward;
      split = true;
    }
    if (!split) throw Error("overlap: the program's dependencies form a cycle; verify() says where");
  }
}

}  // namespace detail

/// The program with each backward (B or I) and the independent forward right
/// after it on its device fused into an overlapped pair, forward first
/// (detail::overlap_rows()): the steady phase of 1F1B-like programs, each
/// backward with the next forward. A pair that would make the program wait
/// where it did not stays two actions. Pairs already in the program stay. The program must verify
/// (throws pipeweave::Error with verify()'s message otherwise; its actions are
/// checked, not its lowering: detail::verify_actions()); the result verifies too.
constexpr Program overlap(const Program& p) {
  detail::require_correct(p, "overlap");
  Program out = p;
  const int P = p.shape.devices;
  detail::Buffer<Action*> rows(P);
  detail::Buffer<int> counts(P);
  for (int d = 0; d < P; ++d) {
    rows[d] = out.devices[static_cast<std::size_t>(d)].data();
    counts[d] = static_cast<int>(out.devices[static_cast<std::size_t>(d)].size());
  }
  detail::overlap_rows(out.shape, rows.data(), counts.data());
  return out;
}

namespace detail {

/// The arrays of Overlapped<S>: S's actions, overlapped.
template <class S>
struct OverlappedBase : StaticScheduleFrom<OverlappedBase<S>, S> {
  static constexpr int actions_per_device = S::actions_per_device;
  static constexpr auto counts = S::counts;
  /// `actions[d][k]`: device d's k-th action, for k < counts[d]; a pair's forward is marked overlaps_next.
  static constexpr auto actions = [] {
    auto out = S::actions;
    if (shape_error(S::shape).empty()) {
      Buffer<Action*> rows(S::devices);
      for (int d = 0; d < S::devices; ++d) rows[d] = out[static_cast<std::size_t>(d)].data();
      overlap_rows(S::shape, rows.data(), counts.data());
    }
    return out;
  }();
};

/// Every pair of a compile-time schedule's arrays is a forward and then an
/// independent backward (B or I) of its device.
template <class S>
constexpr bool pairs_are_independent() {
  for (int d = 0; d < S::devices; ++d) {
    const auto& row = S::actions[static_cast<std::size_t>(d)];
    for (int k = 0; k < S::counts[static_cast<std::size_t>(d)]; ++k) {
      const Action& a = row[static_cast<std::size_t>(k)];
      if (!a.overlaps_next) continue;
      if (a.phase != Phase::kForward || k + 1 == S::counts[static_cast<std::size_t>(d)]) return false;
      const Action& b = row[static_cast<std::size_t>(k + 1)];
      if (!makes_input_gradient(b.phase) || b.overlaps_next || !independent_halves(S::shape, d, a, b)) return false;
    }
  }
  return true;
}

}  // namespace detail

/// A compile-time schedule with its steady phase in overlapped pairs:
/// overlap() of Schedule's program, as arrays. `Overlapped<Interleaved1F1B<4, 2,
/// 8>>` is the seed's schedule: device 0 runs the forward of layers 1-2 with the
/// backward of layers 9-10.
template <StaticScheduleType Schedule>
struct Overlapped : detail::OverlappedBase<Schedule> {
  static_assert(detail::pairs_are_independent<detail::OverlappedBase<Schedule>>(),
                "Overlapped: every pair must be a forward and then a backward (B or I) of its device that does not "
                "need the forward");
};

}  // namespace pipeweave
