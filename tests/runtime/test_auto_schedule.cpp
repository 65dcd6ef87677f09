// AutoSchedule (runtime/auto_schedule.hpp): the probe it picks for a shape and
// a cap, what it refuses, and a run on the CPU backend through the whole
// sequence (probe, fit, the best built-in, the synthesized program), its state
// carried at each switch, bit for bit like sequential training; with replicas,
// every program it hands out has one reduction per (device, chunk).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../common/programs.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/auto_schedule.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;
using test::most;

namespace {

ScheduleShape shape(int P, int V, int M) { return {ScheduleKind::kAuto, P, V, M}; }


// The reductions of each (device, chunk) in a program.
int reductions(const Program& p, int device, int chunk) {
  const auto& row = p.devices[static_cast<std::size_t>(device)];
  return static_cast<int>(
      std::count_if(row.begin(), row.end(), [&](const Action& a) { return is_collective(a.phase) && a.chunk == chunk; }));
}

}  // namespace

TEST_CASE("probe_program: the first ranked kind that takes the shape and fits the cap, else the least", "[runtime]") {
  // No cap: interleaved ZB (it times I and W apart), at any V.
  CHECK(probe_program(shape(2, 2, 4), 0)->shape.kind == ScheduleKind::kInterleavedZeroBubble);
  CHECK(probe_program(shape(2, 1, 4), 0)->shape.kind == ScheduleKind::kInterleavedZeroBubble);
  CHECK(*probe_program(shape(2, 2, 4), 0) == make_schedule(ScheduleKind::kInterleavedZeroBubble, 2, 2, 4));
  // A cap the zero-bubble kinds pass: the whole-backward kinds, 1F1B where interleaved keeps too many.
  CHECK(probe_program(shape(2, 1, 4), 2)->shape.kind == ScheduleKind::kOneFOneB);
  // Below every kind's peak: the one that keeps the least.
  const Program least = *probe_program(shape(4, 1, 8), 1);
  CHECK(least.shape.kind == ScheduleKind::kOneFOneB);
  for (const ScheduleKind k : {ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kInterleaved1F1B})
    CHECK(most(peak_memory(least)) <= most(peak_memory(make_schedule(k, 4, 1, 8))));
  // Interleaved needs M a multiple of P and interleaved ZB whole rounds: with V = 2, P = 2, M = 5 neither runs.
  CHECK_FALSE(probe_program(shape(2, 2, 5), 0));
}

TEST_CASE("AutoSchedule refuses what it cannot do, by name", "[runtime]") {
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 4), {.probe_steps = 0}).str(), Contains("probe steps must be at least 1"));
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 5), {}).str(),
             Contains("no built-in schedule of 2 devices x 2 chunks runs 5 micro-batches"));
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 8), {.memory = 1}).str(), Contains("the smallest feasible limit is 2"));
  CHECK_THROWS_WITH(AutoSchedule(shape(2, 2, 8), {.memory = 1}), Contains("the smallest feasible limit is 2"));
  CHECK(AutoSchedule::error(shape(2, 2, 8), {.memory = 2}).empty());
  CHECK(AutoSchedule(shape(2, 2, 4), {.probe_steps = 4}).least_steps() == 9);
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 8), {.offload = true}).str(),
             Contains("offloading needs the copy lane's bandwidth"));
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 8), {.model = {.stages = {StashSize{}}}}).str(),
             Contains("1 stash sizes for 4 virtual stages"));
  // Allowed to recompute, it meets a cap below what any program without recomputation keeps (2), down to
  // the inputs of one micro-batch per chunk with one stash restored.
  CHECK(AutoSchedule::error(shape(2, 2, 8), {.memory = 1.125, .recompute = true}).empty());
  CHECK_THAT(AutoSchedule::error(shape(2, 2, 8), {.memory = 1, .recompute = true}).str(),
             Contains("the smallest feasible limit is 1.125"));
}

TEST_CASE("AutoSchedule under a cap in bytes recomputes and offloads; the devices measure the cap kept", "[runtime]") {
  // Three quarters of 1F1B's peak under the MLP's memory model in bytes (four layers a stage): no built-in fits,
  // so the probe is the one that keeps the least; the synthesized program recomputes or offloads to keep the
  // cap, and trains bit for bit.
  const int P = 2, M = 4, rows = 2 * M;
  const MlpSpec spec = MlpSpec::uniform(4 * P, 5, 6, 3, 17);
  const MemoryModel bytes = mlp_memory_model(spec, shape(P, 1, M), rows / M);
  const double cap = 0.75 * most(peak_memory(make_schedule(ScheduleKind::kOneFOneB, P, 1, M), bytes));
  CHECK(cap == 288);  // device 0: two stashes of 192 bytes (3 x 6 activations of 2 rows, fp32, and y)
  AutoSchedule tuner(shape(P, 1, M), {.memory = cap, .model = bytes, .recompute = true, .offload = true,
                                      .copy_bandwidth = 1e3, .probe_steps = 1, .pairs = false});
  const RegressionTask task = make_regression_task(spec, rows, 5);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
  auto make = [&](const Program& p) { return make_mlp_pipeline(p, spec, init, {rows, opt}); };
  auto pipe = make(tuner.program());
  SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, spec, init, rows, M, opt);
  const int steps = tuner.least_steps() + 1;
  for (int step = 1; step <= steps; ++step) {
    REQUIRE(verify(tuner.program()));
    seq.set_gradient_order(gradient_order(tuner.program()));
    CHECK(pipe->train_step(task.inputs, task.targets).loss == seq.train_step(task.inputs, task.targets));
    if (!tuner.after_step(1.0, pipe->trace(), steps - step).switched) continue;
    auto next = make(tuner.program());
    switch_state(*pipe, *next);
    pipe = std::move(next);
  }
  CHECK(download_weights(*pipe, spec) == seq.weights());
  REQUIRE(tuner.synthesized());
  const Program& program = tuner.program();
  CHECK((has_recompute(program) || offloads(program) > 0));
  CHECK(tuner.costs().memory == bytes);
  const std::vector<double>& held = pipe->trace().peak_bytes;
  CHECK(held == peak_memory(program, bytes));
  CHECK(most(held) <= cap);
}

TEST_CASE("AutoSchedule: probe, fit, switch, synthesize; the run stays bit for bit", "[runtime]") {
  for (const int D : {1, 2}) {
    INFO("replicas " << D);
    const int P = 2, V = 2, M = 4, probe_steps = 2, steps = 7;
    AutoSchedule tuner(shape(P, V, M), {.probe_steps = probe_steps, .pairs = false, .replicas = D});
    CHECK(tuner.least_steps() == 5);
    const MlpSpec spec = MlpSpec::uniform(2 * P * V, 5, 6, 3, 17);
    const int rows = 2 * M * D;
    const RegressionTask task = make_regression_task(spec, rows, 5);
    const HostModel init = init_mlp(spec);
    const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
    PipelineOptions options{rows, opt};
    options.replicas = D;
    auto make = [&](const Program& p) { return make_mlp_pipeline(p, spec, init, options); };
    auto pipe = make(tuner.program());
    SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, spec, init, rows, M * D, opt);
    seq.set_replicas(D);
    std::vector<std::string> switches;
    for (int step = 1; step <= steps; ++step) {
      // Every program handed out verifies and, with replicas, reduces each chunk once on each device.
      REQUIRE(verify(tuner.program()));
      for (int d = 0; d < P; ++d)
        for (int c = 0; c < V; ++c) CHECK(reductions(tuner.program(), d, c) == (D > 1 ? 1 : 0));
      seq.set_gradient_order(gradient_order(tuner.program()));
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = pipe->train_step(task.inputs, task.targets).loss;
      const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
      CHECK(loss == seq.train_step(task.inputs, task.targets));
      const AutoSchedule::StepOutcome r = tuner.after_step(ms.count(), pipe->trace(), steps - step);
      CHECK(r.fitted == (step == probe_steps));
      if (!r.switched) continue;
      switches.push_back(std::to_string(step) + ":" + tuner.segments().back().name);
      auto next = make(tuner.program());
      switch_state(*pipe, *next);
      pipe = std::move(next);
    }
    tuner.finish();
    CHECK(download_weights(*pipe, spec) == seq.weights());
    // The probe was interleaved ZB; the best built-in under the fitted costs ran probe_steps steps when it is
    // another, then the synthesized program to the end.
    REQUIRE(tuner.synthesis());
    REQUIRE(tuner.synthesized());
    const std::vector<AutoSchedule::Segment>& seg = tuner.segments();
    CHECK(seg.front().name == "interleaved-zb");
    CHECK(seg.back().name == "auto");
    const bool other = tuner.synthesis()->best_builtin.name != seg.front().name;
    REQUIRE(seg.size() == (other ? 3u : 2u));
    CHECK(switches.back() == std::to_string(other ? 2 * probe_steps : probe_steps) + ":auto");
    int measured = 0;
    for (const AutoSchedule::Segment& s : seg) {
      CHECK(s.simulated_ms > 0);
      CHECK(s.measured_ms > 0);
      measured += s.steps;
    }
    CHECK(measured == steps);
    CHECK(seg.back().steps == steps - (other ? 2 : 1) * probe_steps);
    CHECK(tuner.costs().stage_costs.size() == static_cast<std::size_t>(P * V));
    const AutoSchedule::Segment* best = tuner.best_builtin_segment();
    REQUIRE(best != nullptr);
    CHECK(best->name == tuner.synthesis()->best_builtin.name);
  }
}

TEST_CASE("AutoSchedule switches nothing when no step is left", "[runtime]") {
  AutoSchedule tuner(shape(2, 1, 4), {.probe_steps = 1});
  const Program probe = tuner.program();
  const Trace t = simulate(probe);
  CHECK_FALSE(tuner.after_step(1.0, t, 0).switched);
  CHECK(tuner.program() == probe);
  CHECK_FALSE(tuner.synthesis());
  tuner.finish();
  CHECK(tuner.segments().size() == 1);
  CHECK(tuner.segments().front().steps == 1);
  CHECK(tuner.segments().front().measured_ms == 1.0);
  // With a step left the simulated trace is fitted like a measured one.
  AutoSchedule again(shape(2, 1, 4), {.probe_steps = 1});
  const AutoSchedule::StepOutcome r = again.after_step(1.0, t, 1);
  CHECK(r.fitted);
  CHECK(r.switched);
  CHECK(again.segments().size() >= 2);
}
