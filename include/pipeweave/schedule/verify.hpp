#pragma once
/// \file
/// The verifier: proves a program (or a lowered program) correct, at compile time
/// or at run time, and names the first violation in words.
///
/// \code
/// static_assert(pipeweave::verify(pipeweave::Interleaved1F1B<4, 2, 8>{}));
/// \endcode
///
/// It checks, in this order:
/// 1. the shape: P, V, M at least 1 and one action list (or step list) per device;
/// 2. every (virtual stage, micro-batch) has exactly one forward and one
///    backward: a B, or an I and a W (a split backward); at most one
///    recomputation C, before that B or I (check 3 puts it after the F); or,
///    instead of a C, at most one offload O and its reload L, both before
///    that B or I (check 3 puts O after the F and L after the O), and, for a
///    split backward, at most one more pair after the I and before its W (the
///    stash and the output gradient W reads go away between them; a
///    recomputed one too); no B, I or W runs while its stash is away (after an
///    O, before its L);
///    gradient reductions R
///    are none at all, or exactly one per (device, chunk), at micro-batch 0,
///    after every backward and weight action of its chunk; every overlapped pair
///    is a forward and then a backward (B or I), in consecutive steps, that does
///    not need the forward's result, directly or through other stages;
/// 3. on each device, an action runs after the actions of that device it needs;
/// 4. across devices, every action's inputs can be produced before it runs (no
///    cycle of dependencies), those of both halves of a pair before the pair
///    starts;
/// 5. (lowered) every receive is for a tensor that this device consumes, from the
///    device that produces it; every send follows the compute that produces it;
///    every input is received before its action runs; the step of a pair's
///    backward has no group (the pair's receives come before it, its sends after);
/// 6. every send is matched, in FIFO order per directed pair, by a receive that
///    expects that very tensor (kind, virtual stage, micro-batch);
/// 7. the steps run to completion under rendezvous semantics (a send completes
///    when its receive is posted; a group when all of its operations match).
///
/// Cost: linear in the number of actions and operations, with flat tables indexed
/// by result of each (stage, micro-batch) and by ring pair; nothing is P x P, and no
/// message is built unless a check fails. Checks 3 and 4 are one run of the
/// program (run_dataflow(): a device blocked on a missing result waits for it);
/// for a program of actions that run is lower_steps()'s own clock, so verify()
/// lowers once, and hands each step as it is made to the run of checks 5-7
/// (StepRun: the steps under rendezvous semantics, each operation waiting in its
/// ring pair's FIFO). Stored steps (verify(lowered), verify(program, lowered))
/// need no second run: their rendezvous run also checks each action's inputs
/// from its own device, and so decides checks 3-7 at once. A failing run is
/// worded by a second pass (stalled(), report_steps()) that finds the first
/// violation in the order above. The run is the step engine of step_run.hpp, whose
/// runs the simulator's replays observe too. lower_checked() lowers once, stores
/// the steps and runs checks 5-7 on them as they are made: what a host runs. A compile-time schedule's
/// lowering and run are made in chunks, each a constant evaluation of its own
/// (schedules.hpp, verify_static()).

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/step_run.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave {

/// Outcome of verify(): converts to true when the program is correct; otherwise
/// `message` describes the first violation, at `device` and `step` (-1 when the
/// violation belongs to no single device or step).
struct VerifyResult {
  bool ok = true;
  int device = -1;
  int step = -1;
  Text message;

  constexpr explicit operator bool() const { return ok; }
  /// The message, or "ok".
  std::string what() const { return ok ? std::string("ok") : message.str(); }
};

namespace detail {

constexpr VerifyResult verify_fail(int device, int step, const Text& message) {
  return VerifyResult{false, device, step, message};
}

constexpr Text& append_action(Text& t, const ScheduleShape& s, int device, const Action& a) {
  append_token(t, a);
  t << " (stage " << s.stage_of(device, a.chunk) << ", micro-batch " << a.micro_batch << ")";
  return t;
}

constexpr Text& append_where(Text& t, int device, int step) {
  t << "device " << device;
  if (step >= 0) t << ", step " << step;
  return t << ": ";
}

constexpr Text shape_problem(const ScheduleShape& s, std::size_t device_lists, const char* what) {
  Text t;
  if (s.devices < 1 || s.chunks < 1 || s.micro_batches < 1) {
    t << "the shape needs devices, chunks and micro-batches of at least 1 (got " << s.devices << ", "
      << s.chunks << ", " << s.micro_batches << ")";
  } else if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 26)) {
    t << "devices * chunks * micro-batches must be at most 2^26";
  } else if (device_lists != static_cast<std::size_t>(s.devices)) {
    t << "the program has " << static_cast<long long>(device_lists) << " " << what << " lists for "
      << s.devices << " devices";
  }
  return t;
}

/// Observer of a run that wants nothing (verification alone).
struct NoObserver {
  template <class... Args>
  constexpr void operator()(const Args&...) const {}
  constexpr void posted(int, int) const {}
  constexpr void matched(int, int) const {}
  constexpr void completed(int, int, bool, const Action&, int) const {}
};

// --- Checks 2-4, over the compute actions -----------------------------------

/// The position in device d's row of the action whose result has index x; -1
/// if d does not have it. For messages only: a linear scan.
constexpr int find_action(const ActionTable& t, int d, int x) {
  const ScheduleShape& s = t.shape;
  for (int k = 0; k < t.counts[d]; ++k) {
    const Action& a = t.rows[d][k];
    if (s.action_index(a.phase, s.stage_of(d, a.chunk), a.micro_batch) == x) return k;
  }
  return -1;
}

/// The step on device d of the action with index x; -1 if d does not have it.
constexpr int find_step(const ActionTable& t, int d, int x) {
  const int k = find_action(t, d, x);
  return k < 0 ? -1 : t.step_of(d, k);
}

/// The action of device d whose result has index x, as the program has it (I
/// rather than B for a split backward); action_at() when d does not have it.
constexpr Action action_with(const ActionTable& t, int d, int x) {
  const int k = find_action(t, d, x);
  return k < 0 ? action_at(t.shape, x) : t.rows[d][k];
}

/// Check 2 of the overlapped pair that device d's k-th action starts: a
/// forward, then, in the next step, a backward (B or I) in range that does not
/// need it (independent_halves(): decided here, without a run).
constexpr VerifyResult pair_problem(const ActionTable& t, int d, int k) {
  const ScheduleShape& s = t.shape;
  const Action* row = t.rows[d];
  const Action& a = row[k];
  const bool last = k + 1 == t.counts[d];
  const Action& b = row[last ? k : k + 1];
  const int step = t.step_of(d, k);
  const bool in_range =
      !last && b.chunk >= 0 && b.chunk < s.chunks && b.micro_batch >= 0 && b.micro_batch < s.micro_batches;
  // Decided first; a message is built only for a pair that fails.
  if (a.phase == Phase::kForward && !last && makes_input_gradient(b.phase) && !b.overlaps_next &&
      t.step_of(d, k + 1) == step + 1 && (!in_range || independent_halves(s, d, a, b)))
    return {};
  Text m;
  append_where(m, d, step);
  if (a.phase != Phase::kForward || last) {
    append_token(m, a) << " starts an overlapped pair, "
                       << (a.phase != Phase::kForward ? "but it is not a forward"
                                                      : "but it is the device's last action")
                       << "; a pair is a forward and then a backward (B or I)";
    return verify_fail(d, step, m);
  }
  append_step_token(m, row, k, t.counts[d]);
  if (!makes_input_gradient(b.phase) || b.overlaps_next) {
    m << " pairs the forward with "
      << (b.overlaps_next                   ? "the start of another pair"
          : b.phase == Phase::kForward ? "another forward"
                                       : "a weight gradient (W)")
      << "; a pair is a forward and then a backward (B or I)";
    return verify_fail(d, step, m);
  }
  if (t.step_of(d, k + 1) != step + 1) {
    m << ": the backward of the pair is at step " << t.step_of(d, k + 1)
      << "; it must be the step right after the forward's, with no group";
    return verify_fail(d, step, m);
  }
  const int fs = s.stage_of(d, a.chunk), bs = s.stage_of(d, b.chunk);
  m << " pairs ";
  append_action(m, s, d, b) << " with ";
  append_action(m, s, d, a) << ", whose result it needs";
  if (bs == fs + 1) m << " through the forward of stage " << bs;
  if (bs > fs + 1) m << " through the forwards of stages " << fs + 1 << ".." << bs;
  m << "; the halves of a pair must be independent";
  return verify_fail(d, step, m);
}

/// What check 2 records of each (stage, micro-batch): a bit per phase seen.
constexpr unsigned char phase_bit(Phase phase) { return static_cast<unsigned char>(1u << static_cast<int>(phase)); }

/// The phases, as bits, whose rows make an input gradient (B, I) or a weight gradient (B, W).
constexpr unsigned char gradient_phase_bits(bool input) {
  unsigned char bits = 0;
  for (const PhaseRow& r : kPhaseRows)
    if (input ? r.input_gradient : r.weight_gradient) bits = static_cast<unsigned char>(bits | phase_bit(r.phase));
  return bits;
}

/// What an action of each phase conflicts with in one (stage, micro-batch):
/// itself, every phase that makes a gradient it makes (B: I and W; I and W: B),
/// and for C and L each other (a stash is restored once).
inline constexpr std::array<unsigned char, kPhases> kPhaseClash = [] {
  std::array<unsigned char, kPhases> out{};
  for (const PhaseRow& p : kPhaseRows)
    for (const PhaseRow& q : kPhaseRows)
      if (p.phase == q.phase || (p.input_gradient && q.input_gradient) || (p.weight_gradient && q.weight_gradient) ||
          (p.restores && q.restores))
        out[static_cast<std::size_t>(p.phase)] |= phase_bit(q.phase);
  return out;
}();

/// What an action of each phase adds to the verifier's tally: the activation
/// (result 0, F) 2^32, each gradient it makes 1 (B 2, I and W 1); R is counted apart.
inline constexpr std::array<long long, kPhases> kPhaseTally = [] {
  std::array<long long, kPhases> out{};
  for (const PhaseRow& r : kPhaseRows)
    out[static_cast<std::size_t>(r.phase)] =
        r.lane == ActionLane::kCollective ? 0 : r.result == 0 ? 1LL << 32 : (r.input_gradient ? 1 : 0) + (r.weight_gradient ? 1 : 0);
  return out;
}();

/// The compute phase that makes exactly the gradients asked for: B for both, I
/// for the input one, W for the weight one (what a (stage, micro-batch) misses).
constexpr Phase phase_making(bool input_gradient, bool weight_gradient) {
  for (const Phase p : compute_phases())
    if (phase_row(p).input_gradient == input_gradient && phase_row(p).weight_gradient == weight_gradient) return p;
  return Phase::kBackward;
}

/// A gradient reduction's rule broken at device d's k-th action `a`: its
/// micro-batch is not 0, or it comes before a weight gradient of its chunk
/// (`late`, the k-th action, is that weight gradient; `reduced` the step of R).
constexpr VerifyResult reduce_problem(const ActionTable& t, int d, int k, const Action& a, int reduced) {
  Text m;
  append_where(m, d, t.step_of(d, k));
  if (reduced < 0) {
    append_token(m, a) << " has micro-batch " << a.micro_batch
                       << "; a gradient reduction (R) is one per chunk, at micro-batch 0";
  } else {
    append_action(m, t.shape, d, a) << " comes after R" << a.chunk << " (step " << reduced
                                    << "); a chunk's gradient reduction follows its every backward and weight action";
  }
  return verify_fail(d, t.step_of(d, k), m);
}

/// The rule of an action on a stash broken at device d's k-th action `a` (a
/// C, an O or an L): the backward that reads the stash (a B or an I, seen in
/// `seen_here`; for an O or L, the W that ends an I's window) has already run
/// on the device.
constexpr VerifyResult stash_problem(const ActionTable& t, int d, int k, const Action& a, unsigned char seen_here) {
  const ScheduleShape& s = t.shape;
  Phase backward = Phase::kBackward;
  for (const Phase q : compute_phases())
    if ((makes_input_gradient(q) || (is_copy(a.phase) && phase_row(q).split)) && (seen_here & phase_bit(q)))
      backward = q;
  const Action b{backward, a.chunk, a.micro_batch};
  Text m;
  append_where(m, d, t.step_of(d, k));
  append_action(m, s, d, a) << " comes after ";
  append_token(m, b) << " (step " << find_step(t, d, s.action_index(backward, s.stage_of(d, a.chunk), a.micro_batch))
                     << "); " << phase_row(a.phase).stash_rule;
  return verify_fail(d, t.step_of(d, k), m);
}

/// Device d's k-th action `a`, a backward (B, I or W), runs while its stash is
/// away: its last O before it has no L after it.
constexpr VerifyResult away_problem(const ActionTable& t, int d, int k, const Action& a) {
  const Action o{Phase::kOffload, a.chunk, a.micro_batch};
  int j = k;
  while (j > 0 && !(t.rows[d][j] == o)) --j;
  Text m;
  append_where(m, d, t.step_of(d, k));
  append_action(m, t.shape, d, a) << " runs while its stash is away: ";
  append_token(m, o) << " (step " << t.step_of(d, j)
                     << ") has no reload (L) before it; a reload brings the stash back before the action that reads it";
  return verify_fail(d, t.step_of(d, k), m);
}

/// Check 2: ranges, duplicates and completeness, with one byte per (stage,
/// micro-batch) that holds a bit per phase seen. Complete: one F, and one B or
/// one I and one W; and no R, or one per (device, chunk). A C, where there is
/// one, comes before the B or I of its (stage, micro-batch); after its F is
/// check 3's business (C needs F, on its own device).
constexpr VerifyResult index_actions(const ActionTable& t) {
  const ScheduleShape s = t.shape;  // a copy: the byte stores below cannot alias it
  const int M = s.micro_batches;
  constexpr unsigned char kF = phase_bit(Phase::kForward), kR = phase_bit(Phase::kReduce);
  constexpr unsigned char kInputs = gradient_phase_bits(true), kWeights = gradient_phase_bits(false);
  constexpr unsigned char kO = phase_bit(Phase::kOffload), kL = phase_bit(Phase::kReload);
  constexpr unsigned char kSplitInput = phase_bit(Phase::kBackwardInput);
  const unsigned char* clash = kPhaseClash.data();
  const long long* tally_of = kPhaseTally.data();
  Buffer<unsigned char> seen(s.stages() * M, 0);
  unsigned char* at = seen.data();
  Buffer<int> first(s.chunks);    // [chunk]: device d's chunk's first entry in `seen`
  Buffer<int> reduced(s.chunks);  // [chunk]: the step of device d's R of it; -1 before it
  long long tally = 0, reductions = 0, copies = 0;
  Buffer<unsigned char> windowed;  // [(stage, micro-batch)]: it has an O in its weight window (made at the first copy)
  for (int d = 0; d < s.devices; ++d) {
    const Action* row = t.rows[d];
    const int n = t.counts[d];
    for (int c = 0; c < s.chunks; ++c) {
      first[c] = s.stage_of(d, c) * M;
      reduced[c] = -1;
    }
    for (int k = 0; k < n; ++k) {
      const Action& a = row[k];
      const int ph = static_cast<int>(a.phase);
      if (ph >= kPhases) {
        Text m;
        append_where(m, d, t.step_of(d, k)) << "an action has kind " << ph << "; kinds are";
        for (int q = 0; q < kPhases; ++q)
          m << (q == 0 ? " " : q + 1 < kPhases ? ", " : " and ") << std::string_view(&kPhaseRows[q].letter, 1);
        return verify_fail(d, t.step_of(d, k), m);
      }
      if (a.phase == Phase::kReduce && a.micro_batch != 0 && a.chunk >= 0 && a.chunk < s.chunks)
        return reduce_problem(t, d, k, a, -1);
      if (a.chunk < 0 || a.chunk >= s.chunks) {
        Text m;
        append_where(m, d, t.step_of(d, k));
        append_token(m, a) << " has chunk " << a.chunk << "; chunks are 0.." << s.chunks - 1;
        return verify_fail(d, t.step_of(d, k), m);
      }
      if (a.micro_batch < 0 || a.micro_batch >= s.micro_batches) {
        Text m;
        append_where(m, d, t.step_of(d, k));
        append_token(m, a) << " has micro-batch " << a.micro_batch << "; micro-batches are 0.."
                           << s.micro_batches - 1;
        return verify_fail(d, t.step_of(d, k), m);
      }
      if (a.overlaps_next)
        if (VerifyResult r = pair_problem(t, d, k); !r) return r;
      if (phase_row(a.phase).weight_gradient && reduced[a.chunk] >= 0) return reduce_problem(t, d, k, a, reduced[a.chunk]);
      if (a.phase == Phase::kReduce) {
        reduced[a.chunk] = t.step_of(d, k);
        ++reductions;
      }
      unsigned char& seen_here = at[first[a.chunk] + a.micro_batch];
      // C, O and L before the backward that reads the stash; O and L also after an I, before its W.
      const bool window_copy = is_copy(a.phase) && (seen_here & kSplitInput) && !(seen_here & kWeights);
      if (acts_on_stash(a.phase) && (seen_here & kInputs) && !(seen_here & phase_bit(a.phase)) && !window_copy)
        return stash_problem(t, d, k, a, seen_here);
      // The weight window's O, once: it may follow a pair before the backward (whose L it forgets: its own
      // L comes next).
      bool second_offload = false;
      if (window_copy && a.phase == Phase::kOffload) {
        if (windowed.size() == 0) windowed = Buffer<unsigned char>(s.stages() * M, 0);
        unsigned char& w = windowed[first[a.chunk] + a.micro_batch];
        if (!w) {
          w = 1;
          second_offload = (seen_here & kO) != 0;
          seen_here = static_cast<unsigned char>(seen_here & ~kL);
        }
      }
      if ((phase_row(a.phase).input_gradient || phase_row(a.phase).weight_gradient) && (seen_here & kO) &&
          !(seen_here & kL))
        return away_problem(t, d, k, a);
      copies += is_copy(a.phase) ? 1 : 0;
      // A reload in the weight window restores what a recomputation, before the I, did not keep.
      const unsigned char clashes =
          window_copy && a.phase == Phase::kReload ? clash[ph] & ~phase_bit(Phase::kRecompute) : clash[ph];
      if ((seen_here & clashes) && !second_offload) {
        const int stage = s.stage_of(d, a.chunk);
        const int x = s.action_index(a.phase, stage, a.micro_batch);
        Text m;
        append_where(m, d, t.step_of(d, k));
        append_action(m, s, d, a);
        if (seen_here & phase_bit(a.phase)) {
          m << " appears a second time (first at step " << find_step(t, d, x) << ")";
        } else if (phase_row(a.phase).restores) {  // C with L: the one that came first
          const Phase other = is_copy(a.phase) ? Phase::kRecompute : Phase::kReload;
          m << " and ";
          append_token(m, Action{other, a.chunk, a.micro_batch})
              << " (step " << find_step(t, d, s.action_index(other, stage, a.micro_batch))
              << ") both restore its stash; a stash is recomputed (C) or offloaded and reloaded (O, L), not both";
        } else {  // B with I or W: the first phase seen that makes a gradient it makes
          Phase other = a.phase;
          for (const Phase q : all_phases())
            if (q != a.phase && (seen_here & clash[ph] & phase_bit(q))) {
              other = q;
              break;
            }
          const int y = s.action_index(other, stage, a.micro_batch);
          const bool both_input = phase_row(a.phase).input_gradient && phase_row(other).input_gradient;
          m << " and ";
          append_token(m, Action{other, a.chunk, a.micro_batch})
              << " (step " << find_step(t, d, y) << ") both compute the " << (both_input ? "input" : "weight")
              << " gradient; a backward is one B, or one I and one W";
        }
        return verify_fail(d, t.step_of(d, k), m);
      }
      seen_here = static_cast<unsigned char>(seen_here | (1u << ph));
      tally += tally_of[ph];
    }
  }
  // Each offload with its reload and each reload with its offload.
  for (int d = 0; d < s.devices && copies > 0; ++d)
    for (int c = 0; c < s.chunks; ++c)
      for (int mb = 0; mb < M; ++mb) {
        const unsigned char got = at[s.stage_of(d, c) * M + mb];
        if (((got & kO) != 0) == ((got & kL) != 0)) continue;
        const bool reloaded = (got & kL) != 0;
        Text m;
        m << "device " << d << ": ";
        append_action(m, s, d, Action{reloaded ? Phase::kOffload : Phase::kReload, c, mb}) << " is missing; ";
        if (reloaded) append_token(m << "a reload (", Action{Phase::kReload, c, mb}) << ") brings back a stash its offload (O) moved off the device";
        else append_token(m << "an offloaded stash (", Action{Phase::kOffload, c, mb}) << ") is reloaded (L) before its backward";
        return verify_fail(d, -1, m);
      }
  // None twice and no B beside an I or a W: each (stage, micro-batch) has at most
  // one F and at most two backward halves, so a full tally means none is missing.
  const long long units = static_cast<long long>(s.stages()) * M;
  const bool reductions_complete = reductions == 0 || reductions == s.stages();
  if (tally == (units << 32) + 2 * units && reductions_complete) return {};
  for (int pass = 0; pass < 2; ++pass) {  // forwards first, then backwards
    for (int d = 0; d < s.devices; ++d) {
      for (int c = 0; c < s.chunks; ++c) {
        for (int mb = 0; mb < M; ++mb) {
          const unsigned char got = at[s.stage_of(d, c) * M + mb];
          Phase missing = Phase::kForward;
          if (pass == 0 && (got & kF)) continue;
          if (pass == 1) {
            const bool input = (got & kInputs) != 0, weight = (got & kWeights) != 0;
            if (input && weight) continue;
            missing = phase_making(!input, !weight);
          }
          Text m;
          m << "device " << d << ": ";
          append_action(m, s, d, Action{missing, c, mb}) << " is missing";
          return verify_fail(d, -1, m);
        }
      }
    }
  }
  for (int d = 0; d < s.devices; ++d) {  // some reductions, not all
    for (int c = 0; c < s.chunks; ++c) {
      if (at[s.stage_of(d, c) * M] & kR) continue;
      Text m;
      m << "device " << d << ": R" << c << " (stage " << s.stage_of(d, c) << ") is missing; a program with "
        << reductions << " gradient reductions has one per (device, chunk), " << s.stages() << " in all";
      return verify_fail(d, -1, m);
    }
  }
  return {};
}

/// Check 3, run only when check 4's run stalls: the first action, in device and
/// program order, that comes before an action of its own device it needs.
constexpr VerifyResult same_device_order(const ActionTable& t) {
  const ScheduleShape& s = t.shape;
  for (int d = 0; d < s.devices; ++d) {
    for (int k = 0; k < t.counts[d]; ++k) {
      const Action& a = t.rows[d][k];
      const Flow f = flow_of(s, d, a);
      for (int i = 0; i < f.needs; ++i) {
        if (s.device_of_stage(f.need_stage[i]) != d) continue;
        const int j = find_step(t, d, f.need[i]);
        if (j > t.step_of(d, k)) {
          const Action dep = action_with(t, d, f.need[i]);
          Text m;
          append_where(m, d, t.step_of(d, k));
          append_action(m, s, d, a) << " runs before ";
          append_token(m, dep) << " (step " << j << "), whose result it needs";
          return verify_fail(d, t.step_of(d, k), m);
        }
      }
    }
  }
  return {};
}

/// Check 4's message, from the state where no device can go on: `pos[d]` is
/// the first action of device d that could not run.
constexpr VerifyResult cycle_at(const ActionTable& t, const Buffer<int>& pos) {
  const ScheduleShape& s = t.shape;
  Buffer<unsigned char> done(s.action_count(), 0);
  for (int d = 0; d < s.devices; ++d)
    for (int k = 0; k < pos[d]; ++k) {
      const Action& a = t.rows[d][k];
      done[s.action_index(a.phase, s.stage_of(d, a.chunk), a.micro_batch)] = 1;
    }
  int first = 0;
  while (pos[first] == t.counts[first]) ++first;
  const Action* row = t.rows[first];
  const int k = pos[first];
  // The half of the step whose input is missing (a pair waits for both).
  int half = 0;
  Flow f = flow_of(s, first, row[k]);
  auto ready = [&](const Flow& g) {
    for (int i = 0; i < g.needs; ++i)
      if (!done[g.need[i]]) return false;
    return true;
  };
  if (row[k].overlaps_next && ready(f)) {
    half = 1;
    f = flow_of(s, first, row[k + 1]);
  }
  int missing = 0;
  while (missing + 1 < f.needs && done[f.need[missing]]) ++missing;
  const int other = s.device_of_stage(f.need_stage[missing]);
  const Action dep = action_with(t, other, f.need[missing]);
  Text m;
  append_where(m, first, t.step_of(first, k));
  append_action(m, s, first, row[k + half]);
  if (row[k].overlaps_next) {
    append_step_token(m << ", in the pair ", row, k, t.counts[first]);
    m << ",";
  }
  m << " waits for ";
  append_token(m, dep) << " on device " << other << " (its step " << find_step(t, other, f.need[missing])
                       << "), which waits behind ";
  append_step_token(m, t.rows[other], pos[other], t.counts[other]);
  m << " (step " << t.step_of(other, pos[other]) << "): the dependencies form a cycle (deadlock)";
  return verify_fail(first, t.step_of(first, k), m);
}

/// Checks 3 and 4 from a stalled run, in that order.
constexpr VerifyResult stalled(const ActionTable& t, const Buffer<int>& pos) {
  if (VerifyResult r = same_device_order(t); !r) return r;
  return cycle_at(t, pos);
}

/// Runs every device's actions in program order, each once the actions it needs
/// are done, and calls `observe(device, k, action, row)` for each in an order
/// that respects all dependencies (`row`: the action's FlowRow, its indices at
/// micro-batch 0). Returns false when some device cannot finish;
/// `pos[d]` is then device d's first action that could not run. Linear: a device
/// blocked on a missing result waits in the list of that result's device (at
/// most three devices wait on one), and is woken when the result is done.
template <class Observer>
constexpr bool run_dataflow(const ActionTable& t, Buffer<int>& pos, Observer&& observe) {
  const ScheduleShape s = t.shape;  // a copy: the byte stores below cannot alias it
  const int P = s.devices, V = s.chunks;
  const FlowTable flow_table(s);
  const FlowRow* rows = flow_table.data();
  pos = Buffer<int>(P, 0);
  Buffer<unsigned char> done_storage(s.action_count(), 0);
  unsigned char* done = done_storage.data();
  Buffer<int> lists(4 * P);
  int* awaited = lists.data();
  int* first_waiter = awaited + P;
  int* next_waiter = first_waiter + P;
  int* ready = next_waiter + P;
  for (int d = 0; d < P; ++d) {
    first_waiter[d] = -1;
    ready[d] = P - 1 - d;
  }
  int pending = P, finished = 0;
  while (pending > 0) {
    const int d = ready[--pending];
    const Action* row = t.rows[d];
    const int n = t.counts[d];
    int k = pos[d];
    while (k < n) {
      const Action& a = row[k];
      if (!std::is_constant_evaluated()) prefetch(row, k + 8, n);  // its actions a few visits ahead
      const FlowRow& f = rows[(static_cast<int>(a.phase) * V + a.chunk) * P + d];
      const bool pair = a.overlaps_next;  // a pair runs once the inputs of both halves are done
      const FlowRow* g = pair ? &rows[(static_cast<int>(row[k + 1].phase) * V + row[k + 1].chunk) * P + d] : &f;
      const int gm = pair ? row[k + 1].micro_batch : a.micro_batch;
      const FlowRow* blocked = &f;
      int m = a.micro_batch;
      int j = 0;
      while (j < f.needs && done[f.need[j] + m]) ++j;
      if (j == f.needs && pair) {
        blocked = g;
        m = gm;
        j = 0;
        while (j < g->needs && done[g->need[j] + m]) ++j;
      }
      if (j < blocked->needs) {
        const int producer = blocked->need_device[j];
        awaited[d] = blocked->need[j] + m;
        next_waiter[d] = first_waiter[producer];
        first_waiter[producer] = d;
        break;
      }
      const int self = f.self + a.micro_batch, other = g->self + gm;
      observe(d, k, a, f);
      done[self] = 1;
      if (pair) {
        observe(d, k + 1, row[k + 1], *g);
        done[other] = 1;
      }
      const int halves = pair ? 2 : 1;
      finished += halves;
      for (int* link = &first_waiter[d]; *link >= 0;) {
        const int w = *link;
        if (awaited[w] == self || (pair && awaited[w] == other)) {
          *link = next_waiter[w];
          ready[pending++] = w;
        } else {
          link = &next_waiter[w];
        }
      }
      k += halves;
    }
    pos[d] = k;
  }
  return finished == t.total;
}

/// Checks 2-4 over a table of actions, and observes the run of check 4.
template <class Observer>
constexpr VerifyResult check_actions(const ActionTable& t, Observer&& observe) {
  if (VerifyResult r = index_actions(t); !r) return r;
  Buffer<int> pos;
  if (run_dataflow(t, pos, observe)) return {};
  return stalled(t, pos);
}

// --- Checks 5-7, over lowered steps ------------------------------------------

/// The step of device d, from step t on, that computes tensor x; -1 if none.
constexpr int compute_step(const LoweredProgram& lp, int d, int t, int x) {
  const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
  const StepRecord* rec = steps.record_data();
  for (int u = t; u < static_cast<int>(steps.size()); ++u) {
    if (!rec[u].has_compute) continue;
    const Transfer out = output_of(lp.shape, d, rec[u].compute());
    if (out.exists && tensor_index(lp.shape, out.tensor) == x) return u;
  }
  return -1;
}

/// Words a failed check_op() of an operation at step t of device d: "device d,
/// step t: sends ...". `later` is the step that computes a tensor sent too
/// early (-1 for none).
constexpr VerifyResult op_problem(const ScheduleShape& s, int d, int t, const P2POp& op, const OpCheck& c,
                                  const ExactMarks& marks, int later) {
  const TensorId& x = op.tensor;
  const bool is_send = op.kind == OpKind::kSend;
  Text m;
  append_tensor(append_where(m, d, t) << (is_send ? "sends " : "receives "), x);
  switch (c.fault) {
    case OpFault::kNone:
      break;
    case OpFault::kNotAnotherDevice:
      m << (is_send ? " to" : " from") << " device " << op.peer << ", which is not another device (devices are 0.."
        << s.devices - 1 << ")";
      break;
    case OpFault::kNotConsumed:
      m << ", which no stage of this model consumes";
      break;
    case OpFault::kSendsForeign:
      m << ", but stage " << x.stage << " is on device " << c.producer_device;
      break;
    case OpFault::kSendsElsewhere:
      m << " to device " << op.peer << ", but its consumer, stage " << c.consumer_stage << ", is on device "
        << c.consumer_device;
      break;
    case OpFault::kSendsUncomputed:
      m << " before the step that computes it";
      if (later >= 0) m << " (step " << later << ")";
      break;
    case OpFault::kSendsTwice:
      m << " a second time (first at step " << marks.sent(c.tensor) << ")";
      break;
    case OpFault::kReceivesForeign:
      m << ", but its consumer, stage " << c.consumer_stage << ", is on device " << c.consumer_device;
      break;
    case OpFault::kReceivesElsewhere:
      m << " from device " << op.peer << ", but stage " << x.stage << " is on device " << c.producer_device;
      break;
    case OpFault::kReceivesTwice:
      m << " a second time (first at step " << marks.received(c.tensor) << ")";
      break;
  }
  return verify_fail(d, t, m);
}

/// Words a failed check_compute(): the action's input never arrived.
constexpr VerifyResult compute_problem(const ScheduleShape& s, const FlowRow* rows, int d, int t, const Action& a) {
  const FlowRow& r = rows[FlowTable::index(s, a.phase, a.chunk, d)];
  Text m;
  append_where(m, d, t);
  append_action(m, s, d, a) << " needs ";
  append_tensor(m, TensorId{r.in_kind, r.in_stage, a.micro_batch})
      << " from device " << r.in_device << ", but no step up to this one receives it";
  return verify_fail(d, t, m);
}

/// The operations of a lowered program per ring pair in posting order (sends
/// and receives apart): the k-th send of a pair meets its k-th receive (NCCL's
/// FIFO rule). For messages only.
class PairLists {
 public:
  struct Posted {
    int step;
    int op;
  };

  constexpr explicit PairLists(const LoweredProgram& lp) : ring_(lp.shape.devices) {
    const int P = lp.shape.devices;
    first_[0] = Buffer<int>(2 * P + 1, 0);
    first_[1] = Buffer<int>(2 * P + 1, 0);
    for (int pass = 0; pass < 2; ++pass) {
      Buffer<int> fill[2] = {first_[0], first_[1]};
      for (int d = 0; d < P; ++d) {
        const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
        const StepRecord* rec = steps.record_data();
        for (int t = 0, i = 0; t < static_cast<int>(steps.size()); ++t) {
          for (; i < rec[t].op_end; ++i) {
            const P2POp& op = steps.op_data()[i];
            const int kind = static_cast<int>(op.kind);
            const int pair = pair_of(d, op);
            if (pass == 0) ++first_[kind][pair + 1];
            else lists_[kind][fill[kind][pair]++] = {t, i};
          }
        }
      }
      if (pass == 0) {
        for (int k = 0; k < 2; ++k) {
          for (int p = 0; p < 2 * P; ++p) first_[k][p + 1] += first_[k][p];
          lists_[k] = Buffer<Posted>(first_[k][2 * P]);
        }
      }
    }
  }

  /// The pair an operation of device d travels on.
  constexpr int pair_of(int d, const P2POp& op) const {
    return op.kind == OpKind::kSend ? ring_.index(d, op.peer) : ring_.index(op.peer, d);
  }
  /// How many operations of a kind a pair has, and the k-th of them.
  constexpr int count(OpKind kind, int pair) const {
    const int k = static_cast<int>(kind);
    return first_[k][pair + 1] - first_[k][pair];
  }
  constexpr const Posted& at(OpKind kind, int pair, int k) const {
    return lists_[static_cast<int>(kind)][first_[static_cast<int>(kind)][pair] + k];
  }
  /// The step of the operation that matches the i-th operation of device d.
  constexpr int partner_step(int d, const StepList& steps, int i) const {
    const P2POp& op = steps.op_data()[i];
    const int pair = pair_of(d, op);
    const OpKind other = op.kind == OpKind::kSend ? OpKind::kRecv : OpKind::kSend;
    for (int k = 0; k < count(op.kind, pair); ++k)
      if (at(op.kind, pair, k).op == i) return k < count(other, pair) ? at(other, pair, k).step : -1;
    return -1;
  }

 private:
  RingPairs ring_;
  Buffer<int> first_[2];    // [kind]: per pair, where its operations start in lists_[kind]
  Buffer<Posted> lists_[2];
};

/// Words the first violation of checks 5-7 of a lowered program whose compute
/// actions passed 2-4, in the order the checks are listed: check 5 device by
/// device and step by step, a computed tensor never sent, check 6 pair by pair,
/// then check 7's deadlock. Only called when a StepRun failed.
constexpr VerifyResult report_steps(const LoweredProgram& lp) {
  const ScheduleShape& s = lp.shape;
  const int P = s.devices;
  ExactMarks marks(s.action_count());
  const FlowTable flows(s);
  const StageDevices devices(s);
  for (int d = 0; d < P; ++d) {
    const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
    const StepRecord* rec = steps.record_data();
    for (int t = 0, i = 0; t < static_cast<int>(steps.size()); ++t) {
      if (t > 0 && rec[t - 1].has_compute && rec[t - 1].overlaps_next && rec[t].op_end > i) {
        Text m;
        append_where(m, d, t) << "the backward of the overlapped pair started at step " << t - 1
                              << " has a group of its own; a pair's receives come before it and its sends after it";
        return verify_fail(d, t, m);
      }
      for (; i < rec[t].op_end; ++i) {
        const P2POp& op = steps.op_data()[i];
        const OpCheck c = check_op(s, devices.data(), d, op, marks);
        if (c.fault == OpFault::kSendsUncomputed) return op_problem(s, d, t, op, c, marks, compute_step(lp, d, t, c.tensor));
        if (c.fault != OpFault::kNone) return op_problem(s, d, t, op, c, marks, -1);
        if (op.kind == OpKind::kSend) marks.set_sent(c.tensor, t);
        else marks.set_received(c.tensor, t);
      }
      if (rec[t].has_compute && check_compute(s, flows.data(), d, t, rec[t].compute(), marks) == -1)
        return compute_problem(s, flows.data(), d, t, rec[t].compute());
    }
  }
  for (int xi = 0; xi < s.action_count(); ++xi) {
    if (marks.computed(xi) >= 0 && marks.sent(xi) < 0) {
      const TensorId x = tensor_at(s, xi);
      const int dev = s.device_of_stage(x.stage);
      Text m;
      append_where(m, dev, marks.computed(xi));
      append_tensor(m, x) << " is computed here but never sent to device " << s.device_of_stage(consumer_stage(x));
      return verify_fail(dev, marks.computed(xi), m);
    }
  }
  // Check 6, pair by pair in the order of the sending device, then the receiving one.
  const PairLists lists(lp);
  const RingPairs ring(P);
  auto op_of = [&](int d, const PairLists::Posted& p) -> const P2POp& {
    return lp.devices[static_cast<std::size_t>(d)].op_data()[p.op];
  };
  for (int a = 0; a < P; ++a) {
    const int up = ring.next(a), down = ring.prev(a);
    const int to[2] = {up < down ? up : down, up < down ? down : up};
    for (int j = 0; j < (up == down ? 1 : 2); ++j) {
      const int b = to[j], pair = ring.index(a, b);
      const int out = lists.count(OpKind::kSend, pair), in = lists.count(OpKind::kRecv, pair);
      const int n = out < in ? out : in;
      for (int k = 0; k < n; ++k) {
        const PairLists::Posted& so = lists.at(OpKind::kSend, pair, k);
        const PairLists::Posted& ri = lists.at(OpKind::kRecv, pair, k);
        const TensorId& sent = op_of(a, so).tensor;
        const TensorId& expected = op_of(b, ri).tensor;
        if (!(sent == expected)) {
          Text m;
          append_where(m, b, ri.step) << "receive number " << k + 1 << " from device " << a << " expects ";
          append_tensor(m, expected) << ", but the message it matches (device " << a << ", step " << so.step << ") is ";
          append_tensor(m, sent);
          return verify_fail(b, ri.step, m);
        }
      }
      if (out > n) {
        const PairLists::Posted& p = lists.at(OpKind::kSend, pair, n);
        Text m;
        append_where(m, a, p.step) << "sends ";
        append_tensor(m, op_of(a, p).tensor) << " to device " << b << ", which never receives it (" << out
                                             << " sends, " << in << " receives on that pair)";
        return verify_fail(a, p.step, m);
      }
      if (in > n) {
        const PairLists::Posted& p = lists.at(OpKind::kRecv, pair, n);
        Text m;
        append_where(m, b, p.step) << "receives ";
        append_tensor(m, op_of(b, p).tensor) << " from device " << a << ", which never sends it (" << out
                                             << " sends, " << in << " receives on that pair)";
        return verify_fail(b, p.step, m);
      }
    }
  }
  // Check 7: run the steps as far as they go; each stuck device waits at its
  // step's first operation whose partner step its peer has not reached.
  NoObserver none;
  const StepViews views(lp);
  RunStorage storage(s, views.ops);
  StepRun<NoObserver> run(s, none, storage.memory(), storage.clock, views.data());
  run.run(-1);
  int first = -1, listed = 0;
  Text m;
  for (int d = 0; d < P; ++d) {
    const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
    const int t = storage.lanes[d].at;
    if (t == static_cast<int>(steps.size())) continue;
    int blocked = steps.op_begin(t), want = -1;
    for (; blocked < steps.record_data()[t].op_end; ++blocked) {
      want = lists.partner_step(d, steps, blocked);
      if (storage.lanes[steps.op_data()[blocked].peer].at < want) break;
    }
    const P2POp& op = steps.op_data()[blocked];
    if (first < 0) {
      first = d;
      m << "deadlock: ";
    }
    if (listed == 3) {
      m << "; ...";
      break;
    }
    if (listed > 0) m << "; ";
    m << "device " << d << " at step " << t << " waits for device " << op.peer << " (at step " << storage.lanes[op.peer].at
      << ") to " << (op.kind == OpKind::kSend ? "receive " : "send ");
    append_tensor(m, op.tensor) << " at its step " << want;
    ++listed;
  }
  if (first >= 0) return verify_fail(first, storage.lanes[first].at, m);
  Text unexplained("the lowered steps fail a check that report_steps() cannot locate");
  return verify_fail(-1, -1, unexplained);
}

/// Verifies a program of actions in one lowering: check 2, then lower_steps()
/// (whose clock is check 4's run: when it stalls, checks 3 and 4 word why),
/// handing each step to a StepRun (checks 5-7) observed by `observe`, so that
/// the lowered program is never stored. If the run fails, the program is
/// lowered again, stored, to word the first violation.
template <class Observer>
constexpr VerifyResult verify_table(const ActionTable& t, Observer& observe) {
  if (Text e = clock_error(t); !e.empty()) return verify_fail(-1, -1, e);
  if (VerifyResult r = index_actions(t); !r) return r;
  Buffer<int> pos;
  RunStorage storage(t.shape, 2 * t.total);  // at most two operations per action
  StepRun<Observer> run(t.shape, observe, storage.memory(), storage.clock, nullptr);
  if (!lower_steps(t, run, pos)) return stalled(t, pos);
  if (run.complete()) return {};
  LoweredProgram lp{t.shape, std::vector<StepList>(static_cast<std::size_t>(t.shape.devices))};
  StoreSteps store{lp};
  lower_steps(t, store, pos);
  return report_steps(lp);
}

/// The state of the verifier's run over a compile-time schedule's stored
/// lowering after some chunks (see kChunkSteps).
template <class Schedule>
struct RunChunk {
  static constexpr int P = clamp_count(Schedule::devices);
  std::array<unsigned char, static_cast<std::size_t>(clamp_count(Schedule::shape.action_count()))> flags{};
  std::array<RunLane, static_cast<std::size_t>(P)> lanes{};
  std::array<PairFifo, static_cast<std::size_t>(2 * P)> fifos{};
  std::array<PostedOp, static_cast<std::size_t>(2 * P * Schedule::actions_per_device + 1)> nodes{};
  std::array<int, static_cast<std::size_t>(P)> ready{};
  RunClock clock{};

  constexpr RunMemory memory() { return {flags.data(), lanes.data(), fifos.data(), nodes.data(), ready.data()}; }
};

/// Views of a fixed lowering's steps, device by device.
template <class Fixed>
constexpr Buffer<StepsView> fixed_views(const Fixed& lowered, int devices) {
  Buffer<StepsView> views(devices);
  for (int d = 0; d < devices; ++d) views[d] = lowered.view(d);
  return views;
}

/// Chunk K of the run over the lowering made in chunks of `Chunk` actions:
/// chunk 0 sets up, each later one completes `Chunk` more steps.
template <class Schedule, int Chunk, int K>
inline constexpr auto run_chunk = [] {
  auto c = run_chunk<Schedule, Chunk, K - 1>;
  if (!c.clock.failed && c.clock.ready_count > 0) {
    const Buffer<StepsView> views = fixed_views(static_lowering<Schedule, Chunk>, RunChunk<Schedule>::P);
    NoObserver none;
    StepRun<NoObserver> run(Schedule::shape, none, c.memory(), c.clock, views.data());
    run.run(Chunk);
  }
  return c;
}();

template <class Schedule, int Chunk>
inline constexpr auto run_chunk<Schedule, Chunk, 0> = [] {
  RunChunk<Schedule> c{};
  if (shape_error(Schedule::shape).empty()) run_begin(Schedule::shape, c.memory(), c.clock);
  return c;
}();

/// The last chunk of the run: enough chunks for every step of the lowering.
template <class Schedule, int Chunk>
constexpr const auto& last_run_chunk() {
  constexpr int steps = [] {
    int n = 0;
    for (int d = 0; d < RunChunk<Schedule>::P; ++d) n += static_lowering<Schedule, Chunk>.steps[static_cast<std::size_t>(d)];
    return n;
  }();
  return run_chunk<Schedule, Chunk, (steps + Chunk - 1) / Chunk + 1>;
}

/// Verifies a compile-time schedule: its actions, then its stored lowering
/// (StaticSchedule::lowered(), made in chunks of `Chunk` actions) through the
/// run's last chunk (chunks of `Chunk` steps); each chunk is a constant
/// evaluation of its own. Words a failure like verify_fixed().
template <class Schedule, int Chunk = kChunkActions>
constexpr VerifyResult verify_static(const ActionTable& t) {
  if (Text e = clock_error(t); !e.empty()) return verify_fail(-1, -1, e);
  if (VerifyResult r = index_actions(t); !r) return r;
  const auto& lowered = static_lowering<Schedule, Chunk>;
  const int P = t.shape.devices;
  Buffer<int> pos(P);
  for (int d = 0; d < P; ++d) pos[d] = lowered.next[static_cast<std::size_t>(d)];
  if (!lowered.complete) return stalled(t, pos);
  auto last = last_run_chunk<Schedule, Chunk>();
  const Buffer<StepsView> views = fixed_views(lowered, P);
  NoObserver none;
  const StepRun<NoObserver> run(t.shape, none, last.memory(), last.clock, views.data());
  if (run.complete()) return {};
  return report_steps(lowered.program(t.shape));
}

/// Verifies a compile-time schedule's actions and its stored lowering
/// (StaticSchedule::lowered, made in a constant evaluation of its own), the
/// rendezvous run observed by `observe`.
template <class Fixed, class Observer>
constexpr VerifyResult verify_fixed(const ActionTable& t, const Fixed& lowered, Observer& observe) {
  if (VerifyResult r = index_actions(t); !r) return r;
  const int P = t.shape.devices;
  Buffer<int> pos(P);
  for (int d = 0; d < P; ++d) pos[d] = lowered.next[static_cast<std::size_t>(d)];
  if (!lowered.complete) return stalled(t, pos);
  Buffer<StepsView> views(P);
  int ops = 0;
  for (int d = 0; d < P; ++d) {
    views[d] = lowered.view(d);
    ops += lowered.op_count[static_cast<std::size_t>(d)];
  }
  RunStorage storage(t.shape, ops);
  StepRun<Observer> run(t.shape, observe, storage.memory(), storage.clock, views.data());
  if (run.run(-1) && run.complete()) return {};
  return report_steps(lowered.program(t.shape));
}

/// The compute actions of lowered steps as a table, with the step of each.
struct StepActions {
  Buffer<Action> actions;
  Buffer<int> steps;
  Buffer<int> first;  // [d]: device d's first action in `actions`
};

constexpr ActionTable action_table(const LoweredProgram& lp, StepActions& out) {
  const int P = static_cast<int>(lp.devices.size());
  int total = 0;
  for (const StepList& steps : lp.devices)
    for (int t = 0; t < static_cast<int>(steps.size()); ++t) total += steps.record_data()[t].has_compute;
  out.actions = Buffer<Action>(total);
  out.steps = Buffer<int>(total);
  out.first = Buffer<int>(P + 1);
  int k = 0;
  for (int d = 0; d < P; ++d) {
    out.first[d] = k;
    const StepList& steps = lp.devices[static_cast<std::size_t>(d)];
    for (int t = 0; t < static_cast<int>(steps.size()); ++t) {
      const StepRecord& r = steps.record_data()[t];
      if (!r.has_compute) continue;
      out.actions[k] = r.compute();
      out.steps[k++] = t;
    }
  }
  out.first[P] = k;
  ActionTable table{lp.shape, Buffer<const Action*>(P), Buffer<int>(P), Buffer<const int*>(P), total};
  for (int d = 0; d < P; ++d) {
    table.rows[d] = out.actions.data() + out.first[d];
    table.counts[d] = out.first[d + 1] - out.first[d];
    table.steps[d] = out.steps.data() + out.first[d];
  }
  return table;
}

/// Verifies a lowered program: check 2 over its compute actions, then one
/// rendezvous run of its steps, observed by `observe`, that decides checks 3-7
/// (StepRun with kLocalInputs). When the run fails, checks 3 and 4 (a run of
/// the actions) and then report_steps() word the first violation in the order
/// of the checks. `computes`, when given, is a table of lp's compute actions,
/// device by device in step order, without their steps (the program lp lowers):
/// check 2 decides on it in place, and the table of lp's own computes, with
/// their steps, is made only to word a failure.
template <class Observer>
constexpr VerifyResult verify_lowered(const LoweredProgram& lp, Observer& observe,
                                      const ActionTable* computes = nullptr) {
  if (Text e = shape_problem(lp.shape, lp.devices.size(), "step"); !e.empty()) return verify_fail(-1, -1, e);
  StepActions storage;
  ActionTable table{};
  const bool decided = computes != nullptr && index_actions(*computes);
  if (!decided) {
    table = action_table(lp, storage);
    if (VerifyResult r = index_actions(table); !r) return r;
  }
  {
    const StepViews views(lp);
    RunStorage run_storage(lp.shape, views.ops);
    StepRun<Observer, true> run(lp.shape, observe, run_storage.memory(), run_storage.clock, views.data());
    if (run.run(-1) && run.complete()) return {};
  }
  if (decided) table = action_table(lp, storage);
  if (VerifyResult r = check_actions(table, NoObserver{}); !r) return r;
  return report_steps(lp);
}

}  // namespace detail

namespace detail {

/// Checks 1-4 of a program of actions, without lowering it: what verify() says
/// of a program that fails one of them. One that passes them lowers to steps
/// that pass 5-7 (lower() places each send and its receive at one instant), so
/// for a program that others made, these checks decide verify() too.
constexpr VerifyResult verify_actions(const Program& p) {
  if (Text e = shape_problem(p.shape, p.devices.size(), "action"); !e.empty()) return verify_fail(-1, -1, e);
  return check_actions(action_table(p), NoObserver{});
}

/// Throws pipeweave::Error "<who>: the program is not correct: <what
/// verify_actions() says>" unless it passes: the entry check of the transforms
/// of programs (overlap(), with_grad_reduce()).
constexpr void require_correct(const Program& p, const char* who) {
  if (const VerifyResult r = verify_actions(p); !r) {
    Text t(who);
    t << ": the program is not correct: " << r.message;
    throw Error(t.str());
  }
}

}  // namespace detail

/// Verifies a program of compute actions, then its P2P lowering.
constexpr VerifyResult verify(const Program& p) {
  if (Text e = detail::shape_problem(p.shape, p.devices.size(), "action"); !e.empty())
    return detail::verify_fail(-1, -1, e);
  detail::NoObserver none;
  return detail::verify_table(detail::action_table(p), none);
}

/// Verifies a lowered program (for example one written by hand).
constexpr VerifyResult verify(const LoweredProgram& lp) {
  detail::NoObserver none;
  return detail::verify_lowered(lp, none);
}

/// Verifies a program and its lowering without lowering the program again:
/// `lp` (lower(p), or steps made otherwise) must have p's shape and, device by
/// device, p's actions as its compute actions, in p's order; then it is
/// verify(lp), whose messages name lp's steps. When both hold, p is correct too.
constexpr VerifyResult verify(const Program& p, const LoweredProgram& lp) {
  if (Text e = detail::shape_problem(p.shape, p.devices.size(), "action"); !e.empty())
    return detail::verify_fail(-1, -1, e);
  if (!(lp.shape == p.shape) || lp.devices.size() != p.devices.size()) {
    Text m("the lowered program's shape is not the program's");
    return detail::verify_fail(-1, -1, m);
  }
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const std::vector<Action>& row = p.devices[d];
    const StepList& steps = lp.devices[d];
    const detail::StepRecord* rec = steps.record_data();
    const int n = static_cast<int>(steps.size()), count = static_cast<int>(row.size());
    int k = 0, t = 0;
    for (; t < n; ++t) {
      if (!rec[t].has_compute) continue;
      if (k == count || !(rec[t].compute() == row[static_cast<std::size_t>(k)])) break;
      ++k;
    }
    if (t == n && k == count) continue;
    const int dev = static_cast<int>(d);
    Text m;
    detail::append_where(m, dev, t < n ? t : -1) << "the lowered program's ";
    if (t < n) append_token(m << "action ", rec[t].compute());
    if (t < n && k == count) m << " is one more than the program's " << count << " actions";
    else if (t < n) m << " is not the program's action " << k;
    else m << "steps end before the program's action " << k;
    if (k < count) append_token(m << " (", row[static_cast<std::size_t>(k)]) << ")";
    m << "; a lowering keeps each device's actions, in program order";
    return detail::verify_fail(dev, t < n ? t : -1, m);
  }
  detail::NoObserver none;
  const detail::ActionTable computes = detail::action_table(p);
  return detail::verify_lowered(lp, none, &computes);
}

namespace detail {

/// A sink of lower_steps() that hands each step to two sinks.
template <class A, class B>
struct BothSinks {
  A& a;
  B& b;
  constexpr void step(int d, const P2POp* ops, int n, bool has_compute, const Action& x) {
    a.step(d, ops, n, has_compute, x);
    b.step(d, ops, n, has_compute, x);
  }
};

}  // namespace detail

/// Lowers a program once and proves it: checks 1 and 2 on its actions, then one
/// lowering whose clock decides checks 3 and 4 and whose steps, as they are
/// stored, the rendezvous run of checks 5-7 takes (as verify(p) does, which
/// stores nothing). What a host runs: one lowering, verified. Throws
/// pipeweave::Error with verify()'s message for the first violation.
constexpr LoweredProgram lower_checked(const Program& p) {
  auto fail = [](const VerifyResult& r) { throw Error(r.message.str()); };
  if (Text e = detail::shape_problem(p.shape, p.devices.size(), "action"); !e.empty()) throw Error(e.str());
  const detail::ActionTable t = detail::action_table(p);
  if (Text e = detail::clock_error(t); !e.empty()) throw detail::lower_error(e.view());
  if (VerifyResult r = detail::index_actions(t); !r) fail(r);
  LoweredProgram lp{p.shape, std::vector<StepList>(p.devices.size())};
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int n = static_cast<int>(p.devices[d].size());
    lp.devices[d].reserve(step_capacity(n), 2 * n);
  }
  detail::StoreSteps store{lp};
  detail::NoObserver none;
  detail::RunStorage storage(t.shape, 2 * t.total);
  detail::StepRun<detail::NoObserver> run(t.shape, none, storage.memory(), storage.clock, nullptr);
  detail::BothSinks<detail::StoreSteps, detail::StepRun<detail::NoObserver>> both{store, run};
  detail::Buffer<int> pos;
  if (!detail::lower_steps(t, both, pos)) fail(detail::stalled(t, pos));
  if (!run.complete()) fail(detail::report_steps(lp));
  return lp;
}

/// Verifies a compile-time schedule: `static_assert(verify(Interleaved1F1B<4, 2, 8>{}))`.
/// It reads the schedule's arrays in place.
template <StaticScheduleType S>
constexpr VerifyResult verify(const S&) {
  if (Text e = detail::shape_problem(S::shape, S::actions.size(), "action"); !e.empty())
    return detail::verify_fail(-1, -1, e);
  detail::NoObserver none;
  if constexpr (requires { typename S::Base; S::lowered().complete; })
    return detail::verify_static<typename S::Base>(detail::static_table<S>());
  else
    return detail::verify_table(detail::static_table<S>(), none);
}

}  // namespace pipeweave
