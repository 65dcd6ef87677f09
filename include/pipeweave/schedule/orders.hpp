#pragma once
/// \file
/// The ordering rules of the schedules, each written once as a constexpr
/// function over run-time integers: GPipe, 1F1B and interleaved 1F1B
/// (Megatron-LM's orders), and the orders of PyTorch 2.15's
/// ScheduleLoopedBFS, ScheduleInterleavedZeroBubble (ZB-H1 with one chunk per
/// device), ScheduleZBVZeroBubble and ScheduleDualPipeV. Each takes the shape,
/// the device and its number of warm-up forwards (its kind's rule,
/// warmup_forwards()) and hands the device's actions, in order, to an
/// ActionSink. The rows of the kind table (kinds.hpp) point to them; the
/// compile-time schedules (schedules.hpp) and make_schedule() (generators.hpp)
/// both call them through generate_device().

#include <algorithm>
#include <initializer_list>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"

namespace pipeweave {

/// Where a generator hands its actions, in order: `sink(action, period)`.
/// generate_device() adapts any callable to it.
struct ActionSink {
  virtual constexpr void operator()(const Action& a, Period period) = 0;

 protected:
  constexpr ~ActionSink() = default;
};

namespace detail {

/// The rounds of PyTorch's zero-bubble schedules, max(1, M / P): each chunk's
/// micro-batches run in blocks of M / rounds.
constexpr int zero_bubble_rounds(const ScheduleShape& s) { return std::max(1, s.micro_batches / s.devices); }

/// Megatron-LM's j-th forward (or backward) of a device as (chunk, micro-batch);
/// with one chunk (GPipe, 1F1B), micro-batch j.
constexpr Action nth_of_phase(const ScheduleShape& s, Phase phase, int j) {
  const int group = s.devices * s.chunks;
  const int forward_chunk = (j % group) / s.devices;
  const int micro_batch = (j / group) * s.devices + j % s.devices;
  const int chunk = phase == Phase::kForward ? forward_chunk : s.chunks - 1 - forward_chunk;
  return {phase, chunk, micro_batch};
}

/// GPipe, 1F1B and interleaved 1F1B: W warm-up forwards (warmup_forwards()),
/// then one forward and one backward in turn, then the remaining backwards.
constexpr void generate_one_f_one_b(const ScheduleShape& s, int, int warmup, ActionSink& emit) {
  const int total = s.chunks * s.micro_batches;
  for (int k = 0; k < 2 * total; ++k) {
    if (k < warmup) {
      emit(nth_of_phase(s, Phase::kForward, k), Period::kWarmUp);
    } else if (k < 2 * total - warmup) {
      const int j = k - warmup;
      emit(j % 2 == 0 ? nth_of_phase(s, Phase::kForward, warmup + j / 2) : nth_of_phase(s, Phase::kBackward, j / 2),
           Period::kSteady);
    } else {
      emit(nth_of_phase(s, Phase::kBackward, k - total), Period::kCoolDown);
    }
  }
}

/// Looped BFS (PyTorch's ScheduleLoopedBFS): every micro-batch of chunk 0
/// forward, then of chunk 1, ...; then the backwards, the last chunk first and
/// each chunk's micro-batches in reverse.
constexpr void generate_looped_bfs(const ScheduleShape& s, int, int, ActionSink& emit) {
  const int V = s.chunks, M = s.micro_batches;
  for (int c = 0; c < V; ++c)
    for (int m = 0; m < M; ++m) emit(fwd(c, m), Period::kWarmUp);
  for (int c = V - 1; c >= 0; --c)
    for (int m = M - 1; m >= 0; --m) emit(bwd(c, m), Period::kCoolDown);
}

/// Interleaved zero bubble (PyTorch's ScheduleInterleavedZeroBubble; ZB-H1 when
/// V = 1). Chunks take turns in blocks of R = M / max(1, M / P) micro-batches:
/// the k-th forward of a device is of chunk (k / R) mod V, the k-th I of chunk
/// V-1 - (k / R) mod V, each of micro-batch (k / (R*V)) * R + k mod R. Device d
/// runs W = min((V-1)*R + P-d-1, V*M) warm-up forwards; then for each k-th I in
/// turn: the next forward (while any is left), the k-th I, and the W of the
/// (k-d)-th I once k >= d (W runs d micro-batches behind its I); then the W
/// left.
constexpr void generate_interleaved_zero_bubble(const ScheduleShape& s, int device, int warmup, ActionSink& emit) {
  const int V = s.chunks, total = V * s.micro_batches;
  const int per_round = s.micro_batches / zero_bubble_rounds(s);
  auto nth = [&](Phase phase, int k) {
    const int turn = (k / per_round) % V;
    return Action{phase, phase == Phase::kForward ? turn : V - 1 - turn, (k / (per_round * V)) * per_round + k % per_round};
  };
  for (int k = 0; k < warmup; ++k) emit(nth(Phase::kForward, k), Period::kWarmUp);
  for (int k = 0; k < total; ++k) {
    const bool forward = warmup + k < total;
    const Period period = forward ? Period::kSteady : Period::kCoolDown;
    if (forward) emit(nth(Phase::kForward, warmup + k), period);
    emit(nth(Phase::kBackwardInput, k), period);
    if (k >= device) emit(nth(Phase::kBackwardWeight, k - device), period);
  }
  for (int k = std::max(total - device, 0); k < total; ++k) emit(nth(Phase::kBackwardWeight, k), Period::kCoolDown);
}

/// ZB-V (PyTorch's ScheduleZBVZeroBubble): two chunks per device in the v
/// placement, chunk 0 on the way down, chunk 1 on the way up. With N = max(2P-1,
/// M), device d runs 2(P-d)-1 forwards of chunk 0, then d times a forward of
/// chunk 1 and one of chunk 0; then P-d times F, I, W of chunk 1; then, while
/// chunk 1 has forwards left to catch up or chunk 0 has micro-batches left, a
/// forward of chunk 0 (if any is left), I and W of chunk 0, and F, I, W of
/// chunk 1; then d times I of chunk 0 and I of chunk 1, P-d times I and W of
/// chunk 0, and the W left of chunk 1, then of chunk 0. Each chunk counts its
/// F, I and W in micro-batch order; actions of micro-batches past M - 1 (when
/// M < 2P-1) are left out.
constexpr void generate_zero_bubble_v(const ScheduleShape& s, int device, int, ActionSink& emit) {
  const int P = s.devices, M = s.micro_batches, N = std::max(2 * P - 1, M);
  int next[2][3] = {};  // [chunk][F, I, W]: the next micro-batch of each
  Period period = Period::kWarmUp;
  auto slot = [](Phase phase) { return phase == Phase::kForward ? 0 : phase == Phase::kBackwardInput ? 1 : 2; };
  auto run = [&](Phase phase, int chunk) {
    const int m = next[chunk][slot(phase)]++;
    if (m < M) emit(Action{phase, chunk, m}, period);
  };
  // `count` rounds of the actions `round` lists, each (phase, chunk). A counter
  // at M or past it emits nothing more, so once all of a round's are, the rounds
  // left only advance them: done at once, the program of a device costs O(M),
  // not O(P), when M < 2P - 1.
  struct Run {
    Phase phase;
    int chunk;
  };
  auto rounds = [&](int count, std::initializer_list<Run> round) {
    int i = 0;
    for (; i < count; ++i) {
      bool live = false;
      for (const Run& r : round) live = live || next[r.chunk][slot(r.phase)] < M;
      if (!live) break;
      for (const Run& r : round) run(r.phase, r.chunk);
    }
    for (const Run& r : round) next[r.chunk][slot(r.phase)] += count - i;
  };
  auto spent = [&] {  // every counter at M or past it: nothing is left to emit
    for (const auto& chunk : next)
      for (int c : chunk)
        if (c < M) return false;
    return true;
  };
  constexpr Phase F = Phase::kForward, I = Phase::kBackwardInput, W = Phase::kBackwardWeight;
  rounds(2 * (P - device) - 1, {{F, 0}});
  rounds(device, {{F, 1}, {F, 0}});
  period = Period::kSteady;
  rounds(P - device, {{F, 1}, {I, 1}, {W, 1}});
  while ((next[1][0] < next[0][0] || next[0][0] < N) && !spent()) {
    if (next[0][0] < N) run(F, 0);
    run(I, 0);
    run(W, 0);
    run(F, 1);
    run(I, 1);
    run(W, 1);
  }
  period = Period::kCoolDown;
  rounds(device, {{I, 0}, {I, 1}});
  rounds(P - device, {{I, 0}, {W, 0}});
  while (next[1][2] < next[1][1] && next[1][2] < M) run(W, 1);
  while (next[0][2] < next[0][1] && next[0][2] < M) run(W, 0);
}

/// DualPipeV (PyTorch's ScheduleDualPipeV, after DeepSeek's DualPipe): two
/// chunks per device in the v placement; its steady phase is overlapped pairs.
/// Each chunk counts its forwards and its backwards (B or I, one count) in
/// micro-batch order; every I queues its W, which runs when the order says
/// "a W" (if one is queued). Device d runs:
/// 1. 2(P-d-1) forwards of chunk 0;
/// 2. d+1 times a forward of chunk 0 and one of chunk 1 (2P warm-up forwards);
/// 3. P-d-1 times: I of chunk 1, a W, a forward of chunk 1;
/// 4. M-2P+d+1 times: the pair (F of chunk 0; B of chunk 1), except that the
///    last device runs its first one as F then B, not overlapped; then the
///    pair (F of chunk 1; B of chunk 0);
/// 5. P-d-1 times: B of chunk 1, then the pair (F of chunk 1; B of chunk 0);
/// 6. d+1 times a backward of chunk 1 and one of chunk 0, B until the
///    middle, I from there (I already for chunk 1 of the middle round on an
///    odd device, only from chunk 0 of it on an even one);
/// 7. P-d-1 times: a W, an I of chunk 0;
/// 8. d+1 times a W.
constexpr void generate_dualpipe_v(const ScheduleShape& s, int device, int, ActionSink& emit) {
  const int P = s.devices, M = s.micro_batches, d = device;
  int next_forward[2] = {0, 0}, next_backward[2] = {0, 0};
  Buffer<int> weights(2 * M);  // the Ws queued by Is, as chunk * M + micro-batch
  int weight_head = 0, weight_tail = 0;
  Period period = Period::kWarmUp;
  auto forward = [&](int chunk) { emit(fwd(chunk, next_forward[chunk]++), period); };
  auto backward = [&](Phase phase, int chunk) {
    const int m = next_backward[chunk]++;
    if (phase == Phase::kBackwardInput) weights[weight_tail++] = chunk * M + m;
    emit(Action{phase, chunk, m}, period);
  };
  auto pair = [&](int forward_chunk) {
    emit(fwd(forward_chunk, next_forward[forward_chunk]++).paired(), period);
    backward(Phase::kBackward, 1 - forward_chunk);
  };
  auto weight = [&] {
    if (weight_head == weight_tail) return;
    const int x = weights[weight_head++];
    emit(bwd_weight(x / M, x % M), period);
  };
  for (int i = 0; i < 2 * (P - d - 1); ++i) forward(0);
  for (int i = 0; i <= d; ++i) {
    forward(0);
    forward(1);
  }
  period = Period::kSteady;
  for (int i = 0; i < P - d - 1; ++i) {
    backward(Phase::kBackwardInput, 1);
    weight();
    forward(1);
  }
  for (int i = 0; i < M - 2 * P + d + 1; ++i) {
    if (i == 0 && d == P - 1) {
      forward(0);
      backward(Phase::kBackward, 1);
    } else {
      pair(0);
    }
    pair(1);
  }
  for (int i = 0; i < P - d - 1; ++i) {
    backward(Phase::kBackward, 1);
    pair(1);
  }
  period = Period::kCoolDown;
  bool split = false;
  for (int i = 0; i <= d; ++i) {
    if (i == (d + 1) / 2 && d % 2 == 1) split = true;
    backward(split ? Phase::kBackwardInput : Phase::kBackward, 1);
    if (i == (d + 1) / 2 && d % 2 == 0) split = true;
    backward(split ? Phase::kBackwardInput : Phase::kBackward, 0);
  }
  for (int i = 0; i < P - d - 1; ++i) {
    weight();
    backward(split ? Phase::kBackwardInput : Phase::kBackward, 0);
  }
  for (int i = 0; i <= d; ++i) weight();
}

}  // namespace detail

}  // namespace pipeweave
