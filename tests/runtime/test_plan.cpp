// The device plan: buffers for every tensor, stash slots, and the peak number of
// kept activations against the closed forms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>
#include <string>

#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

using namespace pipeweave;

namespace {

// The closed forms of the most forwards a device keeps before their backwards.
int closed_form_peak(const ScheduleShape& s, int d) {
  const int P = s.devices, V = s.chunks, M = s.micro_batches;
  switch (s.kind) {
    case ScheduleKind::kInterleaved1F1B: return std::min(std::min(2 * (P - d - 1) + (V - 1) * P, V * M) + 1, V * M);
    case ScheduleKind::kOneFOneB: return std::min(P - d, M);
    default: return M;
  }
}

}  // namespace

TEST_CASE("the kept activations peak at the closed forms", "[runtime]") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B}) {
    for (int P : {1, 2, 3, 4, 5}) {
      for (int V : {1, 2, 3}) {
        if (kind != ScheduleKind::kInterleaved1F1B && V != 1) continue;
        for (int M : {1, 2, 3, 4, 8, 10}) {
          if (kind == ScheduleKind::kInterleaved1F1B && M % P != 0) continue;
          const Program p = make_schedule(kind, P, V, M);
          const LoweredProgram lp = lower(p);
          for (int d = 0; d < P; ++d) {
            INFO(schedule_name(kind) << " P=" << P << " V=" << V << " M=" << M << " device " << d);
            CHECK(peak_activations(p)[static_cast<std::size_t>(d)] == closed_form_peak(p.shape, d));
            CHECK(closed_form_peak_activations(p.shape, d) == closed_form_peak(p.shape, d));
            const DevicePlan plan = plan_device(lp, d);
            CHECK(plan.peak_kept == closed_form_peak(p.shape, d));
            // Stash slots per chunk never exceed the micro-batches, and add up to at least the peak.
            int slots = 0;
            for (int c = 0; c < V; ++c) {
              CHECK(plan.slots[static_cast<std::size_t>(c)] <= M);
              slots += plan.slots[static_cast<std::size_t>(c)];
            }
            CHECK(slots >= plan.peak_kept);
          }
        }
      }
    }
  }
}

TEST_CASE("every step's buffers are planned and pools stay small", "[runtime]") {
  const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  const LoweredProgram lp = lower(p);
  for (int d = 0; d < 4; ++d) {
    const DevicePlan plan = plan_device(lp, d);
    CHECK(plan.first_stage == (d == 0));
    CHECK(plan.last_stage == (d == 3));
    REQUIRE(plan.steps.size() == lp.devices[static_cast<std::size_t>(d)].size());
    for (const PlannedOp& op : plan.ops) CHECK(op.buffer >= 0);
    for (const PlannedStep& st : plan.steps) {
      if (!st.has_compute) continue;
      const PlannedCompute& c = st.compute;
      if (c.action.phase == Phase::kForward) {
        CHECK((c.x >= 0 || (c.stage == 0 && c.x == kBatchInput)));
        CHECK(c.y >= 0);
        CHECK((c.stage == 7) == (c.dy >= 0));
      } else {
        CHECK(c.dy >= 0);
        CHECK((c.stage == 0) == (c.dx == kNoBuffer));
      }
    }
    // Far fewer buffers than tensors: each buffer is reused once its tensor is done.
    CHECK(plan.buffers.size() < 4u * 2 * 8);
  }
}

TEST_CASE("with one device the stages pass tensors locally, without messages", "[runtime]") {
  const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, 1, 3, 2);
  const DevicePlan plan = plan_device(lower(p), 0);
  CHECK(plan.ops.empty());
  CHECK(plan.first_stage);
  CHECK(plan.last_stage);
  // F of chunk 1 reads what F of chunk 0 wrote.
  int y0 = -1;
  for (const PlannedStep& st : plan.steps) {
    const PlannedCompute& c = st.compute;
    if (c.action == fwd(0, 0)) y0 = c.y;
    if (c.action == fwd(1, 0)) CHECK(c.x == y0);
  }
}

TEST_CASE("a program that does not hold together is refused", "[runtime]") {
  LoweredProgram lp = lower(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2));
  // Drop device 1's first receive: its first forward has no input.
  std::vector<StepSpec> steps = lp.devices[1].specs();
  for (StepSpec& st : steps) {
    if (!st.ops.empty()) {
      st.ops.clear();
      break;
    }
  }
  lp.devices[1] = StepList(steps);
  CHECK_THROWS_WITH(plan_device(lp, 1), Catch::Contains("device 1, step") && Catch::Contains("before receiving its input"));
  CHECK_THROWS_WITH(plan_device(lp, 2), Catch::Contains("device 2 is not in the program"));
}

TEST_CASE("an offloaded micro-batch holds no stash slot from its O to its L, but a host slot", "[runtime]") {
  // GPipe on one device, M 4, stage 0 offloaded: F0 F1 O0 F2 O1 L0 F3 O2 L1 B0 O3 L2 B1 L3 B2 B3.
  const Program plain = make_schedule(ScheduleKind::kGPipe, 1, 1, 4);
  const Program p = with_offload(plain, {0});
  REQUIRE(verify(p));
  REQUIRE(offloads(p) == 4);
  const DevicePlan plan = plan_device(lower(p), 0), before = plan_device(lower(plain), 0);
  CHECK(plan.offloads);
  CHECK_FALSE(before.offloads);
  CHECK(before.slots == std::vector<int>{4});
  CHECK(plan.slots == std::vector<int>{3});  // three stashes on the device at once, at most (after F3, L1)
  // A host slot is taken when the O's copy is issued, as its forward ends, and returned at the L: F0, F1 and F2
  // issue theirs before L0 returns the first.
  CHECK(plan.host_slots == std::vector<int>{3});
  CHECK(plan.copies == 8);
  CHECK(plan.peak_kept == 3);
  CHECK(before.host_slots == std::vector<int>{0});
  int reloads = 0;
  for (std::size_t t = 0; t < plan.steps.size(); ++t) {
    const PlannedCompute& l = plan.steps[t].compute;
    if (!plan.steps[t].has_compute || l.action.phase != Phase::kReload) continue;
    ++reloads;
    const auto find = [&](const Action& a) {
      return std::find_if(plan.steps.begin(), plan.steps.end(),
                          [&](const PlannedStep& st) { return st.has_compute && st.compute.action == a; });
    };
    const auto f = find(fwd(0, l.action.micro_batch));
    const auto o = find(offload(0, l.action.micro_batch));
    const auto b = find(bwd(0, l.action.micro_batch));
    REQUIRE((f != plan.steps.end() && o != plan.steps.end() && b != plan.steps.end()));
    CHECK(o->compute.slot == f->compute.slot);  // the O moves the forward's slot out
    CHECK(o->compute.host == l.host);            // to the host slot the L reads back
    CHECK(l.host >= 0);
    CHECK(b->compute.slot == l.slot);            // the backward reads the slot the L filled
    // The copies: the forward issues its O's, the device waits for it at the O, the backward for the L's.
    CHECK(f->compute.issues == static_cast<int>(o - plan.steps.begin()));
    CHECK((o->compute.copy >= 0 && o->waits_copy == o->compute.copy));
    CHECK((l.copy > o->compute.copy && b->waits_copy == l.copy));
    CHECK(l.issues == -1);
    // The batch's x stays; y (the last stage's, which no send reads) and the loss gradient its forward wrote go
    // with the stash and come back into buffers of their roles, which the backward reads.
    CHECK((l.x == kBatchInput && !o->compute.moves_x && !l.moves_x));
    CHECK((o->compute.y == f->compute.y && o->compute.moves_y && l.moves_y));
    CHECK((o->compute.dy == f->compute.dy && o->compute.moves_dy && l.moves_dy));
    CHECK(plan.buffers[static_cast<std::size_t>(l.y)].role == BufferRole::kOutput);
    CHECK(plan.buffers[static_cast<std::size_t>(l.dy)].role == BufferRole::kOutputGrad);
    CHECK((b->compute.y == l.y && b->compute.dy == l.dy));
  }
  CHECK(reloads == 4);
  // y's buffers: as many as micro-batches on the device at once (three), not one per micro-batch kept.
  const auto outputs = [](const DevicePlan& d) {
    return std::count_if(d.buffers.begin(), d.buffers.end(), [](const PlannedBuffer& b) { return b.role == BufferRole::kOutput; });
  };
  CHECK(outputs(before) == 4);
  CHECK(outputs(plan) == 3);
}

TEST_CASE("an offload moves x and y where nothing else needs their buffers until the reload", "[runtime]") {
  // Interleaved 1F1B, P 2, V 2, M 4, every stage offloaded: each device receives the x of both its stages and
  // sends the y of all but the last stage.
  const Program p = with_offload(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), all_stages({ScheduleKind::kInterleaved1F1B, 2, 2, 4}));
  REQUIRE(verify(p));
  const LoweredProgram lp = lower(p);
  int moved_x = 0, moved_y = 0, kept_y = 0;
  for (int d = 0; d < 2; ++d) {
    const DevicePlan plan = plan_device(lp, d);
    for (std::size_t t = 0; t < plan.steps.size(); ++t) {
      const PlannedStep& st = plan.steps[t];
      if (!st.has_compute || st.compute.action.phase != Phase::kOffload) continue;
      const PlannedCompute& o = st.compute;
      // x moves unless it is the batch's; y unless a send of it comes after the O.
      CHECK(o.moves_x == (o.stage > 0));
      bool sent_later = false;
      for (std::size_t u = t + 1; u < plan.steps.size(); ++u)
        for (int k = 0; k < plan.steps[u].op_count; ++k) {
          const PlannedOp& op = plan.ops[static_cast<std::size_t>(plan.steps[u].first_op + k)];
          sent_later = sent_later || (op.kind == OpKind::kSend && op.tensor.kind == TensorKind::kActivation &&
                                      op.tensor.stage == o.stage && op.tensor.micro_batch == o.action.micro_batch);
        }
      CHECK(o.moves_y == !sent_later);
      moved_x += o.moves_x ? 1 : 0;
      moved_y += o.moves_y ? 1 : 0;
      kept_y += o.moves_y ? 0 : 1;
      // Its L moves back what it moved, into buffers that its backward reads.
      const auto l = std::find_if(plan.steps.begin(), plan.steps.end(), [&](const PlannedStep& s) {
        return s.has_compute && s.compute.action == reload(o.action.chunk, o.action.micro_batch);
      });
      REQUIRE(l != plan.steps.end());
      CHECK((l->compute.moves_x == o.moves_x && l->compute.moves_y == o.moves_y));
      const auto b = std::find_if(l, plan.steps.end(), [&](const PlannedStep& s) {
        return s.has_compute && s.compute.action.chunk == o.action.chunk &&
               s.compute.action.micro_batch == o.action.micro_batch && makes_input_gradient(s.compute.action.phase);
      });
      REQUIRE(b != plan.steps.end());
      CHECK((b->compute.x == l->compute.x && b->compute.y == l->compute.y));
    }
  }
  CHECK(moved_x > 0);
  CHECK(moved_y > 0);
}

TEST_CASE("an offload in a weight window frees the slot from the I to the W and moves x, y and dy", "[runtime]") {
  // ZB-H1, P 2, M 4, every stage offloaded: the last stage's I follows its F at once, so it offloads between
  // its I and its W; x (not the batch's), y (sent long before) and dy go with the stash, and come back into
  // buffers of their roles, which the L hands the W.
  const Program p = with_offload(make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 4), {0, 1});
  REQUIRE(verify(p));
  const LoweredProgram lp = lower(p);
  int windows = 0;
  for (int d = 0; d < 2; ++d) {
    const DevicePlan plan = plan_device(lp, d);
    bool input_seen[4] = {};
    for (const PlannedStep& st : plan.steps) {
      if (!st.has_compute) continue;
      const PlannedCompute& pc = st.compute;
      const int m = pc.action.micro_batch;
      if (pc.action.phase == Phase::kBackwardInput) input_seen[m] = true;
      if (!is_copy(pc.action.phase)) continue;
      CHECK(pc.weight_window == input_seen[m]);
      if (!pc.weight_window) continue;
      CHECK(plan.weight_windows);
      CHECK((pc.moves_x == (pc.stage > 0) && pc.moves_y && pc.moves_dy));
      if (pc.action.phase != Phase::kReload) continue;
      ++windows;
      // The W reads the slot the L took, and the x and dy it handed back.
      const auto w = std::find_if(plan.steps.begin(), plan.steps.end(), [&](const PlannedStep& s) {
        return s.has_compute && s.compute.action == bwd_weight(0, m);
      });
      REQUIRE(w != plan.steps.end());
      CHECK(w->compute.slot == pc.slot);
      CHECK(w->compute.x == pc.x);
      if (pc.stage == 0) CHECK(pc.x == kBatchInput);
      REQUIRE(pc.dy != kNoBuffer);
      CHECK(plan.buffers[static_cast<std::size_t>(pc.dy)].role == BufferRole::kOutputGrad);
      if (pc.stage > 0) CHECK(plan.buffers[static_cast<std::size_t>(pc.x)].role == BufferRole::kInput);
    }
  }
  CHECK(windows > 0);
}

TEST_CASE("overlapped pairs plan as their two steps, and a pair that is not one is refused", "[runtime]") {
  const LoweredProgram lp = lower(overlap(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4)));
  for (int d = 0; d < 2; ++d) {
    const DevicePlan plan = plan_device(lp, d);
    CHECK(plan.pairs);
    // The halves of a pair share no buffer that either writes.
    for (std::size_t t = 0; t + 1 < plan.steps.size(); ++t) {
      const PlannedCompute& f = plan.steps[t].compute;
      if (!plan.steps[t].has_compute || !f.action.overlaps_next) continue;
      const PlannedCompute& b = plan.steps[t + 1].compute;
      CHECK(plan.steps[t + 1].op_count == 0);
      for (int written : {f.y, f.dy})
        for (int used : {b.x, b.y, b.dy, b.dx}) CHECK((written == kNoBuffer || written != used));
      for (int used : {f.x, f.y, f.dy}) CHECK((b.dx == kNoBuffer || b.dx != used));
    }
  }
  CHECK_FALSE(plan_device(lower(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4)), 0).pairs);
  CHECK(plan_device(lower(make_schedule(ScheduleKind::kDualPipeV, 2, 2, 4)), 0).pairs);
  // A forward that claims to start a pair with a step that has a group of its own.
  LoweredProgram bad = lp;
  std::vector<StepSpec> steps = bad.devices[1].specs();
  bool moved = false;
  for (std::size_t t = 0; t + 1 < steps.size() && !moved; ++t) {
    if (steps[t].has_compute && steps[t].compute.overlaps_next && !steps[t].ops.empty()) {
      steps[t + 1].ops = std::move(steps[t].ops);
      steps[t].ops.clear();
      moved = true;
    }
  }
  REQUIRE(moved);
  bad.devices[1] = StepList(steps);
  CHECK_THROWS_WITH(plan_device(bad, 1), Catch::Contains("device 1, step") &&
                                             Catch::Contains("starts an overlapped pair, but the pair is not a forward "
                                                             "followed by a step with a backward (B or I) and no "
                                                             "operations of its own"));
}

TEST_CASE("split backwards and the v placement plan, and keep what the simulator counts", "[runtime]") {
  struct Case {
    ScheduleKind kind;
    int P, V, M;
  };
  for (const Case& c : {Case{ScheduleKind::kZeroBubbleH1, 2, 1, 4}, Case{ScheduleKind::kZeroBubbleH1, 4, 1, 8},
                        Case{ScheduleKind::kInterleavedZeroBubble, 2, 2, 4}, Case{ScheduleKind::kZeroBubbleV, 2, 2, 4},
                        Case{ScheduleKind::kZeroBubbleV, 4, 2, 8}, Case{ScheduleKind::kLoopedBFS, 2, 2, 3}}) {
    const Program p = make_schedule(c.kind, c.P, c.V, c.M);
    const LoweredProgram lp = lower(p);
    for (int d = 0; d < c.P; ++d) {
      INFO(schedule_name(c.kind) << " P=" << c.P << " V=" << c.V << " M=" << c.M << " device " << d);
      const DevicePlan plan = plan_device(lp, d);
      CHECK(plan.split == (c.kind != ScheduleKind::kLoopedBFS));
      // A stash lives from F to its B or W, as the simulator counts it.
      CHECK(plan.peak_kept == peak_activations(p)[static_cast<std::size_t>(d)]);
      for (const PlannedStep& st : plan.steps) {
        if (!st.has_compute) continue;
        const PlannedCompute& pc = st.compute;
        switch (pc.action.phase) {
          case Phase::kBackwardInput:
            CHECK(pc.dy >= 0);
            CHECK((pc.stage == 0) == (pc.dx == kNoBuffer));
            break;
          case Phase::kBackwardWeight:  // reads nothing the plan places; ends the micro-batch
            CHECK(pc.dx == kNoBuffer);
            break;
          default:
            break;
        }
      }
    }
  }
}

TEST_CASE("in the v placement the turn of the V hands over on its device, without a message", "[runtime]") {
  const int P = 3, M = 4;
  const Program p = make_schedule(ScheduleKind::kZeroBubbleV, P, 2, M);
  const LoweredProgram lp = lower(p);
  // Stages P-1 and P both live on device P-1: the forward of stage P reads what
  // stage P-1 wrote, and the I of stage P-1 reads what the I of stage P wrote.
  const DevicePlan plan = plan_device(lp, P - 1);
  for (const PlannedOp& op : plan.ops) CHECK_FALSE((op.tensor.stage == P - 1 && op.tensor.kind == TensorKind::kActivation));
  for (const PlannedOp& op : plan.ops) CHECK_FALSE((op.tensor.stage == P && op.tensor.kind == TensorKind::kGradient));
  for (int m = 0; m < M; ++m) {
    int y = kNoBuffer, x = kNoBuffer, dx = kNoBuffer, dy = kNoBuffer;
    for (const PlannedStep& st : plan.steps) {
      const PlannedCompute& c = st.compute;
      if (!st.has_compute || c.action.micro_batch != m) continue;
      if (c.action.phase == Phase::kForward && c.stage == P - 1) y = c.y;
      if (c.action.phase == Phase::kForward && c.stage == P) x = c.x;
      if (c.action.phase == Phase::kBackwardInput && c.stage == P) dx = c.dx;
      if (c.action.phase == Phase::kBackwardInput && c.stage == P - 1) dy = c.dy;
    }
    INFO("micro-batch " << m);
    CHECK(y >= 0);
    CHECK(x == y);
    CHECK(dx >= 0);
    CHECK(dy == dx);
  }
}

TEST_CASE("a recomputed micro-batch holds a stash slot from its C to its backward only", "[runtime]") {
  const Program plain = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4);
  const LoweredProgram lp = lower(with_recompute(plain, {0}));
  const DevicePlan p0 = plan_device(lp, 0), p1 = plan_device(lp, 1), before = plan_device(lower(plain), 0);
  CHECK(p0.recomputes);
  CHECK_FALSE(p1.recomputes);  // stage 1 recomputes nothing
  CHECK(before.slots == std::vector<int>{2});
  CHECK(p0.slots == std::vector<int>{1});  // one whole stash at a time: each C's, until its backward
  CHECK(p0.peak_kept == before.peak_kept);  // the micro-batches kept: two inputs, or one input and one stash
  // Each C reads the input its forward read and writes the output it wrote, in the slot of the backward after it.
  for (std::size_t t = 0; t < p0.steps.size(); ++t) {
    const PlannedCompute& c = p0.steps[t].compute;
    if (!p0.steps[t].has_compute || c.action.phase != Phase::kRecompute) continue;
    CHECK(c.recomputed);
    const auto f = std::find_if(p0.steps.begin(), p0.steps.end(), [&](const PlannedStep& st) {
      return st.has_compute && st.compute.action == fwd(c.action.chunk, c.action.micro_batch);
    });
    REQUIRE(f != p0.steps.end());
    CHECK(f->compute.recomputed);
    CHECK((c.x == f->compute.x && c.y == f->compute.y));
    REQUIRE(t + 1 < p0.steps.size());
    CHECK(p0.steps[t + 1].compute.action == bwd(c.action.chunk, c.action.micro_batch));
    CHECK(p0.steps[t + 1].compute.slot == c.slot);
  }
}

TEST_CASE("each offload's copy is issued by the action that completes its stash, and waited for where it must be",
          "[runtime]") {
  // The copy lane's order, as the simulator times it: an O's copy is issued when the F (before the backward) or
  // the I (in a weight window) of its micro-batch ends, the device waits for it at the O; an L's copy is waited
  // for by the next action of its micro-batch. A host slot is never taken twice at once.
  for (const auto& [kind, P, V, M, recompute] :
       {std::tuple{ScheduleKind::kOneFOneB, 3, 1, 6, false}, std::tuple{ScheduleKind::kInterleaved1F1B, 2, 2, 4, false},
        std::tuple{ScheduleKind::kZeroBubbleH1, 2, 1, 4, true}, std::tuple{ScheduleKind::kInterleavedZeroBubble, 2, 2, 4, false},
        std::tuple{ScheduleKind::kZeroBubbleV, 2, 2, 4, false}, std::tuple{ScheduleKind::kDualPipeV, 2, 2, 4, false}}) {
    Program p = make_schedule(kind, P, V, M);
    if (recompute) p = with_recompute(p, all_stages(p.shape));
    p = with_offload(p, all_stages(p.shape));
    INFO(schedule_name(kind) << (recompute ? "+recompute" : "") << " P=" << P << " V=" << V << " M=" << M);
    REQUIRE(verify(p));
    const LoweredProgram lp = lower(p);
    int windows = 0;
    for (int d = 0; d < P; ++d) {
      const DevicePlan plan = plan_device(lp, d);
      std::vector<int> issued_by(plan.steps.size(), -1);
      for (std::size_t t = 0; t < plan.steps.size(); ++t) {
        const PlannedCompute& c = plan.steps[t].compute;
        if (!plan.steps[t].has_compute || c.issues < 0) continue;
        REQUIRE(c.issues > static_cast<int>(t));
        CHECK(issued_by[static_cast<std::size_t>(c.issues)] == -1);
        issued_by[static_cast<std::size_t>(c.issues)] = static_cast<int>(t);
        const PlannedCompute& o = plan.steps[static_cast<std::size_t>(c.issues)].compute;
        CHECK(o.action.phase == Phase::kOffload);
        CHECK((o.action.chunk == c.action.chunk && o.action.micro_batch == c.action.micro_batch));
        CHECK(c.action.phase == (o.weight_window ? Phase::kBackwardInput : Phase::kForward));
        windows += o.weight_window ? 1 : 0;
      }
      std::set<std::pair<int, int>> busy;  // (chunk, host slot) from the issue of an O's copy to its L
      int copies = 0;
      for (std::size_t t = 0; t < plan.steps.size(); ++t) {
        const PlannedStep& st = plan.steps[t];
        const PlannedCompute& c = st.compute;
        if (st.has_compute && c.issues >= 0) {
          const PlannedCompute& o = plan.steps[static_cast<std::size_t>(c.issues)].compute;
          CHECK(busy.insert({o.action.chunk, o.host}).second);
        }
        if (st.has_compute && c.action.phase == Phase::kReload) CHECK(busy.erase({c.action.chunk, c.host}) == 1);
        if (!st.has_compute || !is_copy(c.action.phase)) continue;
        CHECK(c.copy == copies++);
        if (c.action.phase == Phase::kOffload) {
          CHECK(issued_by[t] >= 0);
          CHECK(st.waits_copy == c.copy);
        } else {  // the next action of its micro-batch waits for it
          const auto next = std::find_if(plan.steps.begin() + static_cast<std::ptrdiff_t>(t) + 1, plan.steps.end(),
                                         [&](const PlannedStep& s) {
                                           return s.has_compute && !is_collective(s.compute.action.phase) &&
                                                  s.compute.action.chunk == c.action.chunk &&
                                                  s.compute.action.micro_batch == c.action.micro_batch;
                                         });
          REQUIRE(next != plan.steps.end());
          const auto at = static_cast<std::size_t>(next - plan.steps.begin());
          const int waits = std::max(next->waits_copy, at > 0 && plan.steps[at - 1].compute.action.overlaps_next
                                                           ? plan.steps[at - 1].waits_copy : -1);
          CHECK(waits == c.copy);
        }
      }
      CHECK(copies == plan.copies);
    }
    if (kind == ScheduleKind::kZeroBubbleH1) CHECK(windows > 0);
  }
}
