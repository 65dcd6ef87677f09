// train_mlp: trains an MLP through a pipeline schedule, one thread per device, and
// checks the result against sequential training of the same model.
//
//   train_mlp                                   # the seed example: 16 layers, P=4, V=2, M=8
//   train_mlp --schedule NAME --devices 2 --micro-batches 4 --steps 50 --trace run.json
//   train_mlp --overlap                         # the seed's pairs: a forward and a backward at once
//   train_mlp --steps 100 --save ckpt --save-every 10   # checkpoints ckpt/step-00000010, ..., ckpt/latest
//   train_mlp --steps 200 --resume ckpt         # on from the latest checkpoint (any schedule, P or V)
//   train_mlp --layers-per-stage 1,2,2,2,2,2,2,1   # 14 layers, the first and the last stage one each
//   train_mlp --schedule auto --memory-limit 8  # measure, fit the costs, synthesize a schedule, train on with it
//
// The task is a synthetic regression: inputs uniform in [-1, 1), targets from a fixed
// random teacher network of the same shape, so the loss can approach zero. At the end
// the pipelined parameters are compared with those of sequential training (the whole
// model on one thread, the same micro-batches in order): exit status 1 when they
// differ by more than --tolerance (default 0: bit for bit), 2 for bad arguments.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/checkpoint/background.hpp"
#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/synthesize.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "train_mlp_gpu.hpp"

namespace {

using namespace pipeweave;

struct Config {
  std::string schedule = tool::default_schedule();
  bool overlapped = false;
  int devices = 4, chunks = 0, micro_batches = 8;
  int replicas = 1;  // --replicas: data-parallel replicas D of the pipeline
  int layers = 16, hidden = 512, batch = 256, steps = 60;
  std::vector<int> layers_per_stage;  // --layers-per-stage (empty: the even split)
  float lr = 0.003f, momentum = 0.9f;
  std::string optimizer = "adam";
  std::string backend = "auto";
  train_mlp_gpu::Settings gpu;  // --transport, --math (CUDA backend)
  std::string trace;
  std::uint64_t seed = 1;
  int timeout_ms = 30000;
  double tolerance = 0;
  int log_every = 0;
  tool::CheckpointFlags ckpt;  // --save, --save-every, --keep, --resume
  int memory_limit = 0;        // --memory-limit (auto): the cap on each device's peak memory
  int probe_steps = 3;         // --probe-steps (auto): steps of each built-in schedule measured first
  bool gpu_backend = false;    // the CUDA backend runs (a pair's halves on two streams)
};

// --schedule auto: the built-in schedule measured first, whose trace gives the
// costs: the zero-bubble kind of the shape (it times I and W apart), else the
// 1F1B kind; the first of them whose peak memory fits `limit` (0: none), else
// the one that keeps the least. Its name, or "" when none fits the shape.
std::string probe_schedule(int devices, int chunks, int micro_batches, int limit) {
  std::string least;
  int least_peak = 0;
  for (const char* name : {"interleaved-zb", "zb-h1", "interleaved", "1f1b"}) {
    const ScheduleKind k = *parse_schedule(name);
    if (!shape_error({k, devices, chunks, micro_batches, placement_of(k)}).empty()) continue;
    const std::vector<int> peaks = peak_memory(make_schedule(k, devices, chunks, micro_batches));
    const int peak = *std::max_element(peaks.begin(), peaks.end());
    if (limit == 0 || peak <= limit) return name;
    if (least.empty() || peak < least_peak) least = name, least_peak = peak;
  }
  return least;
}

// A built-in schedule by the name synthesize() gives it: "<kind>" or "<kind>+overlap".
Program builtin_program(const std::string& name, const ScheduleShape& s) {
  const std::size_t plus = name.find('+');
  const Program p = make_schedule(name.substr(0, plus), s.devices, s.chunks, s.micro_batches);
  return plus == std::string::npos ? p : overlap(p);
}

// What --schedule auto measured of one schedule: its simulated step under the
// fitted costs and its mean measured step.
struct Measured {
  std::string name;
  double simulated_ms = 0, measured_ms = 0;
  int steps = 0;
};

// A checkpoint of the run (see checkpoint/mlp.hpp), or nothing to resume from.
struct Resume {
  checkpoint::Loaded pipeline, reference;  // for the program's stages, and for the reference's one chunk
  bool any = false;
};

std::string with_commas(long long v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

// A rough upper bound of the bytes the pipelined run and the reference need.
double memory_estimate(const MlpSpec& spec, const Config& c) {
  double params = 0, widths = 0;
  for (int i = 0; i < spec.layers(); ++i) params += static_cast<double>(layer_parameters(spec, i));
  for (int w : spec.widths) widths += w;
  const double moments = c.optimizer == "adam" ? 2 : 1;
  // Parameters, gradients, optimizer state, twice (pipeline and reference); every
  // micro-batch's activations kept at once (GPipe's worst case) plus boundary buffers.
  return 4.0 * ((1 + c.replicas) * params * (2 + moments) + 3.0 * c.batch * widths * 2);
}

double machine_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
}

// Why a pipelined step on CPU threads cannot take less than some share of the
// sequential one: P device threads on C cores compute at most min(P, C) actions at once.
std::string step_bound(int devices, double bubble) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  char line[320];
  if (devices > cores)
    std::snprintf(line, sizeof line,
                  "%d device threads share %d cores: at most %d compute at once, so a pipelined step takes at least "
                  "1/%d of the sequential one, not 1/%d, and hand-overs between threads of one core cost a wake-up each",
                  devices, cores, cores, cores, devices);
  else
    std::snprintf(line, sizeof line,
                  "%d device threads on %d cores: a pipelined step takes at least (1 + bubble) / %d = %.2f of the "
                  "sequential one (the simulated bubble)",
                  devices, cores, devices, (1 + bubble) / devices);
  return line;
}

// How a pipeline sums its replicas' gradients, as its collective does.
std::string gradient_sums(const cpu::CpuMlpPipeline& pipe) {
  return dynamic_cast<const HostReplicaGroup<cpu::CpuBackend>*>(pipe.replica_collective(0)) != nullptr
             ? "in place in host memory, in replica order"
             : "through a host copy, in replica order";
}
std::string gradient_sums(const train_mlp_gpu::Pipeline& pipe) { return pipe.gradient_sums(); }

// Trains with the pipeline and the reference; returns the exit status. `bound`,
// when not empty, says how fast the pipelined step can be at best.
template <class MakePipeline, class MakeReference>
int train(const Config& c, const Program& program, const MlpSpec& spec, const RegressionTask& task,
          const checkpoint::MlpRun& run, const Resume& resume, const std::string& backend_line,
          const std::string& bound, MakePipeline&& make_pipeline, MakeReference&& make_reference) {
  const ScheduleShape s = program.shape;
  const HostModel init = init_mlp(spec);
  Program current = program;  // --schedule auto changes it as it goes
  auto pipe = make_pipeline(current, init);
  auto reference = make_reference(init);
  long long first_step = 0;
  if (resume.any) {
    pipe->set_state(resume.pipeline.state);
    reference->set_state(resume.reference.state);
    first_step = resume.pipeline.step;
  }
  // The reference adds each chunk's gradients in the schedule's order of micro-batches
  // (gradient_order()), so that the two agree bit for bit.
  GradientOrder order = gradient_order(program);
  reference->set_gradient_order(order);
  long long params = 0;
  for (int i = 0; i < spec.layers(); ++i) params += static_cast<long long>(layer_parameters(spec, i));

  const int pairs = pair_count(program);
  const std::string schedule_words =
      c.schedule == "auto" ? "auto (synthesized after " + std::to_string(c.probe_steps) + " measured steps of " +
                                 std::string(schedule_name(s.kind)) + ")"
                           : std::string(schedule_name(s.kind));
  std::printf("schedule: %s, %d devices x %d chunks = %d virtual stages, %d micro-batches of %d samples\n",
              schedule_words.c_str(), s.devices, s.chunks, s.stages(), s.micro_batches,
              c.batch / (s.micro_batches * c.replicas));
  if (pairs > 0)
    std::printf("overlapped pairs: %d, each a forward and a backward of one device at once (the backward on the "
                "device's second stream; on the CPU, its second thread)\n",
                pairs);
  std::printf("model: %d layers of %d features (ReLU between them), %s parameters, seed %llu\n", spec.layers(),
              c.hidden, with_commas(params).c_str(), static_cast<unsigned long long>(c.seed));
  std::printf("layers per virtual stage: %s\n", tool::per_stage_words(s, spec.allocation()).c_str());
  std::printf("task: %d samples, targets from a fixed random teacher network of the same shape\n", c.batch);
  if (c.replicas > 1)
    std::printf("data parallelism: %d replicas of the pipeline (%d x %d = %d device threads), replica r on samples "
                "[r*%d, (r+1)*%d); each chunk's gradients summed over the replicas at its R, %s\n",
                c.replicas, s.devices, c.replicas, s.devices * c.replicas, c.batch / c.replicas, c.batch / c.replicas,
                gradient_sums(*pipe).c_str());
  std::printf("optimizer: %s, learning rate %g%s\n", c.optimizer.c_str(), static_cast<double>(c.lr),
              c.optimizer == "sgd" ? (", momentum " + std::to_string(c.momentum).substr(0, 4)).c_str() : "");
  std::printf("backend: %s\n", backend_line.c_str());
  if (resume.any)
    std::printf("resumed: from %s at step %lld (%lld optimizer updates applied)\n", resume.pipeline.directory.c_str(),
                first_step, resume.pipeline.state.updates);
  if (!c.ckpt.save.empty())
    std::printf("checkpoints: into %s %s%s\n", c.ckpt.save.c_str(),
                c.ckpt.save_every > 0 ? ("every " + std::to_string(c.ckpt.save_every) + " steps and after the last").c_str()
                                 : "after the last step",
                c.ckpt.keep > 0 ? (", keeping the newest " + std::to_string(c.ckpt.keep)).c_str() : "");
  std::printf("\n");
  std::printf("layers per device (1-based; virtual stage s = c*P + d) and peak activations kept:\n");
  for (int d = 0; d < s.devices; ++d) {
    std::printf("  device %d:", d);
    for (int ch = 0; ch < s.chunks; ++ch)
      std::printf("%s chunk %d = %s (stage %d)", ch ? "," : "", ch,
                  tool::layer_list(chunk_layers(s, spec.allocation(), d, ch)).c_str(), s.stage_of(d, ch));
    std::printf("; keeps at most %d\n", pipe->plan(d).peak_kept);
  }
  std::printf("\n");

  const int log_every = c.log_every > 0 ? c.log_every : std::max(1, c.steps / 20);
  double pipe_seconds = 0, reference_seconds = 0, first_loss = 0, last_loss = 0;
  using Clock = std::chrono::steady_clock;
  const int trained = c.steps - static_cast<int>(first_step);
  // Checkpoints are written on a thread of their own; the pipeline waits while its state is copied.
  std::optional<checkpoint::BackgroundSaver> saver;
  if (!c.ckpt.save.empty()) saver.emplace(c.ckpt.save, run, s, c.ckpt.keep, "threads");
  auto report_save = [](const std::optional<checkpoint::SaveTimes>& t) {
    if (!t) return;
    std::printf("checkpoint: %s saved (%.1f MB, written in %.1f ms beside the training; the pipeline waited %.1f ms "
                "for the save before and %.1f ms to copy its state)\n",
                t->directory.c_str(), static_cast<double>(t->bytes) / 1e6, 1e3 * t->write_s, 1e3 * t->waited_s,
                1e3 * t->copy_s);
    std::fflush(stdout);
  };
  // --schedule auto: the probe's steps, then (when it is another) the best built-in's, each measured, then the
  // synthesized program to the end. Each switch carries the state over (Pipeline::state()), so the run stays
  // one training run, bit for bit.
  const bool synthesizing = c.schedule == "auto";
  std::vector<Measured> measured;
  std::vector<double> segment_ms;  // the current schedule's measured steps
  std::optional<Synthesis> found;
  CostModel fitted;
  if (synthesizing) measured.push_back({std::string(schedule_name(program.shape.kind)), 0, 0, 0});
  auto switch_to = [&](Program next, const std::string& name, double simulated_ms) {
    TrainingState state;
    pipe->copy_state(state);
    current = c.replicas > 1 ? with_grad_reduce(next) : std::move(next);
    pipe = make_pipeline(current, init);
    pipe->set_state(state);
    order = gradient_order(current);
    reference->set_gradient_order(order);
    measured.push_back({name, simulated_ms, 0, 0});
    segment_ms.clear();
  };
  auto end_segment = [&] {  // the median step: the first step of a schedule also makes its buffers
    measured.back().measured_ms = tool::median(segment_ms);
    measured.back().steps = static_cast<int>(segment_ms.size());
  };
  for (int step = static_cast<int>(first_step) + 1; step <= c.steps; ++step) {
    const auto t0 = Clock::now();
    const double loss = pipe->train_step(task.inputs, task.targets).loss;
    const auto t1 = Clock::now();
    const double ref_loss = reference->train_step(task.inputs, task.targets);
    const auto t2 = Clock::now();
    pipe_seconds += std::chrono::duration<double>(t1 - t0).count();
    reference_seconds += std::chrono::duration<double>(t2 - t1).count();
    if (step == first_step + 1) first_loss = loss;
    last_loss = loss;
    if (step == first_step + 1 || step == c.steps || step % log_every == 0)
      std::printf("step %5d  loss %.6f%s\n", step, loss, loss == ref_loss ? "" : "  (reference differs)");
    std::fflush(stdout);  // a step's line before its checkpoint is written
    if (saver && c.ckpt.saves_after(step, c.steps))
      report_save(saver->save(step, [&](TrainingState& state) { pipe->copy_state(state); }));
    if (!synthesizing) continue;
    segment_ms.push_back(1e3 * std::chrono::duration<double>(t1 - t0).count());
    if (static_cast<int>(segment_ms.size()) < c.probe_steps || step == c.steps || measured.back().name == "auto")
      continue;
    end_segment();
    if (!found) {  // the probe is measured: fit the costs of each stage, synthesize, verify
      fitted = fit_stage_costs(pipe->trace(), s.stages());
      measured[0].simulated_ms = makespan(simulate(current, fitted)) / 1e3;
      // Overlapped pairs only where a pair's halves can run at once: on a GPU's two streams, or with a core
      // for each of the 2P threads (on fewer, the halves share cores, which the fitted costs do not know).
      const bool pairs = c.gpu_backend || std::thread::hardware_concurrency() >= 2u * static_cast<unsigned>(s.devices);
      found = synthesize({ScheduleKind::kAuto, s.devices, s.chunks, s.micro_batches}, fitted,
                         {.memory = c.memory_limit, .pairs = pairs});
      if (const VerifyResult r = verify(found->program); !r) throw Error("auto: the synthesized program: " + r.what());
      std::printf("auto: costs fitted to step %d's trace, per virtual stage (F:I:W, ms):", step);
      for (int st = 0; st < s.stages(); ++st)
        std::printf(" %.3f:%.3f:%.3f", fitted.cost_of(Phase::kForward, st) / 1e3,
                    fitted.cost_of(Phase::kBackwardInput, st) / 1e3, fitted.cost_of(Phase::kBackwardWeight, st) / 1e3);
      std::printf("\nauto: synthesized %s (%d programs simulated), simulated step %.3f ms, lower bound %.3f ms; best "
                  "built-in within the limit: %s\n",
                  found->origin.c_str(), found->evaluated, found->makespan / 1e3, found->lower_bound / 1e3,
                  found->best_builtin.empty() ? "none" : found->best_builtin.c_str());
      if (!found->best_builtin.empty() && found->best_builtin != measured[0].name) {
        switch_to(builtin_program(found->best_builtin, s), found->best_builtin, found->best_builtin_makespan / 1e3);
        continue;
      }
    }
    switch_to(found->program, "auto", found->makespan / 1e3);
    std::printf("auto: training on with the synthesized program from step %d\n", step + 1);
  }
  if (synthesizing && !segment_ms.empty()) end_segment();
  if (saver) report_save(saver->wait());
  if (trained > 0) {
    const Trace& t = pipe->trace();
    std::printf("\nloss %.6f -> %.6f over %d steps\n", first_loss, last_loss, trained);
    std::printf("step time: pipelined %.2f ms, sequential %.2f ms (mean over %d steps): %.2f of the sequential step\n",
                1e3 * pipe_seconds / trained, 1e3 * reference_seconds / trained, trained,
                pipe_seconds / reference_seconds);
    if (!bound.empty()) std::printf("  %s\n", bound.c_str());
    std::printf("last step: makespan %.2f ms, bubble %.2f (measured: (makespan - busiest device's compute) / that "
                "compute; simulated with backward = 2 forward and free P2P: %.2f)\n",
                makespan(t) / 1e3, bubble_ratio(t), bubble_ratio(current));
    const std::vector<int> predicted = peak_activations(current);
    std::printf("peak activations kept, measured:");
    for (int d = 0; d < s.devices; ++d) std::printf(" %d", t.peak_activations[static_cast<std::size_t>(d)]);
    std::printf("; simulator:");
    for (int d = 0; d < s.devices; ++d) std::printf(" %d", predicted[static_cast<std::size_t>(d)]);
    std::printf("%s\n", t.peak_activations == predicted ? " (equal)" : " (DIFFERENT)");
    if (const std::vector<int> memory = peak_memory(current); memory != predicted) {
      std::printf("peak memory (stashes and the gradients kept from an I to its W), measured:");
      for (int d = 0; d < s.devices; ++d) std::printf(" %d", t.peak_memory[static_cast<std::size_t>(d)]);
      std::printf("; simulator:");
      for (int d = 0; d < s.devices; ++d) std::printf(" %d", memory[static_cast<std::size_t>(d)]);
      std::printf("%s\n", t.peak_memory == memory ? " (equal)" : " (DIFFERENT)");
    }
    if (c.replicas > 1) {
      const Trace simulated = simulate(current, fit_cost_model(t));
      std::printf("gradient reductions (replica 0's devices): %.3f ms in all, exposed after the last compute %.3f ms "
                  "(most of any device); simulated with the measured costs: exposed %.3f ms; beside compute: %.0f%% "
                  "measured, %.0f%% simulated\n",
                  [&] {
                    double total = 0;
                    for (int d = 0; d < s.devices; ++d) total += reduction_time(t, d);
                    return total / 1e3;
                  }(),
                  max_exposed_reduction(t) / 1e3, max_exposed_reduction(simulated) / 1e3,
                  100 * hidden_reduction_share(t), 100 * hidden_reduction_share(simulated));
    }
    if (!c.trace.empty()) {
      tool::write_trace(c.trace, t);
      std::printf("trace of the last step written to %s\n", c.trace.c_str());
    }
    if (synthesizing && found) {
      std::printf("auto: each schedule's step, simulated under the fitted costs and measured (the median of its "
                  "steps in this run):\n");
      for (const Measured& m : measured)
        std::printf("  %-22s simulated %8.3f ms, measured %8.3f ms over %d steps\n", m.name.c_str(), m.simulated_ms,
                    m.measured_ms, m.steps);
      const Measured& synth = measured.back();
      const auto best = std::find_if(measured.begin(), measured.end(),
                                     [&](const Measured& m) { return m.name == found->best_builtin; });
      if (synth.name == "auto" && best != measured.end() && best->measured_ms > 0)
        std::printf("auto: synthesized / best built-in (%s): simulated %.3f, measured %.3f\n", best->name.c_str(),
                    synth.simulated_ms / best->simulated_ms, synth.measured_ms / best->measured_ms);
    }
  }
  const HostModel got = download_weights(*pipe, spec), want = reference->weights();
  const double diff = max_abs_difference(got, want);
  const bool ok = diff <= c.tolerance;
  std::printf("\ncheck against sequential training (the whole model on one thread, the same %d micro-batches in "
              "%sorder, one update per step):\n",
              s.micro_batches * c.replicas, order == GradientOrder::kDecreasing ? "reverse " : "");
  std::printf("  max |pipelined - sequential| over %s parameters = %g%s (tolerance %g): %s\n",
              with_commas(params).c_str(), diff, got == want ? " (bit-for-bit equal)" : "", c.tolerance,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains an MLP through a pipeline schedule, one thread per device, on a synthetic regression task, "
               "and checks the parameters against sequential training of the same model."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  Config c;
  app.add_option("--schedule", c.schedule,
                 tool::schedule_help(true) + "; auto measures " + std::to_string(c.probe_steps) +
                     " steps of a built-in schedule (and of the best built-in under the fitted costs), then trains on "
                     "with the program synthesize() makes for the costs fitted to its trace")
      ->check(CLI::IsMember(tool::schedule_names(true)));
  app.add_option("--memory-limit", c.memory_limit,
                 "With --schedule auto: the most activations a device may keep at once (stashes plus gradients kept "
                 "from an I to its W); 0: no limit (default 0)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--probe-steps", c.probe_steps,
                 "With --schedule auto: the steps each measured built-in schedule runs before the switch (default 3)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--overlap", c.overlapped,
               "Fuse the program's steady phase into overlapped pairs (pipeweave::overlap()): a forward and an "
               "independent backward of one device run at once, on two threads (CUDA: two streams)");
  app.add_option("--replicas", c.replicas,
                 "Data-parallel replicas D of the pipeline, 1..256, each on its shard of the batch (P x D device "
                 "threads): each device reduces a chunk's gradients over the replicas after its last "
                 "backward (pipeweave::with_grad_reduce()) (default 1)")
      ->check(CLI::Range(1, 256));
  app.add_option("--devices", c.devices, "Pipeline devices P, one thread each, 1..256 (default 4)")
      ->check(CLI::Range(1, cpu::kMaxCpuDevices));
  app.add_option("--chunks", c.chunks,
                 "Chunks per device V, 1..4096 (" + tool::chunks_help() + ")")
      ->check(CLI::Range(1, 4096));
  app.add_option("--micro-batches", c.micro_batches,
                 "Micro-batches M, 1..65536; " + tool::micro_batches_help() + " (default 8)")
      ->check(CLI::Range(1, 65536));
  const CLI::Option* layers_flag =
      app.add_option("--layers", c.layers, "Layers L, a multiple of P*V, or the sum of --layers-per-stage (default 16)")
          ->check(CLI::Range(1, kMaxLayers));
  tool::add_layers_per_stage_flag(app, c.layers_per_stage, layers_flag, c.layers, kMaxLayers);
  app.add_option("--hidden", c.hidden, "Features of every layer (default 512)")->check(CLI::Range(1, kMaxWidth));
  app.add_option("--batch", c.batch, "Samples per step, a multiple of M (default 256)")->check(CLI::Range(1, kMaxRows));
  app.add_option("--steps", c.steps, "Training steps (default 60)")->check(CLI::Range(0, 10000000));
  app.add_option("--lr", c.lr, "Learning rate (default 0.003)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer, "sgd or adam (default adam)")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--momentum", c.momentum, "Momentum of sgd, in [0, 1) (default 0.9)")->check(CLI::Range(0.0, 0.999999));
  app.add_option("--backend", c.backend, "cpu, cuda or auto: CUDA where a GPU is present, else CPU (default auto)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--transport", c.gpu.transport,
                 "How the devices connect: rendezvous (CPU threads), nccl (one GPU per device), virtual (devices share "
                 "GPUs), or auto: the backend's choice (default)")
      ->check(CLI::IsMember({"auto", "rendezvous", "nccl", "virtual"}));
  app.add_option("--math", c.gpu.math, "CUDA backend: GEMM arithmetic fp32, tf32 or bf16 (default fp32)");
  app.add_option("--trace", c.trace,
                 "Write the last step's measured trace: FILE.svg, FILE.json (Chrome trace), FILE.txt (ASCII) or FILE.csv");
  app.add_option("--seed", c.seed, "Seed of the model, the teacher and the inputs (default 1)");
  app.add_option("--timeout-ms", c.timeout_ms, "Longest wait for a message before it is an error (default 30000)")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--tolerance", c.tolerance, "Largest accepted parameter difference to sequential training (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-every", c.log_every, "Print the loss every N steps (default: about 20 lines)")
      ->check(CLI::Range(1, 10000000));
  tool::add_checkpoint_flags(app, c.ckpt, "safetensors files and a manifest per step, written beside the training; "
                            "DIR/latest names the newest", "any schedule, P or V wrote it");
  if (const auto status = tool::parse(app, argc, argv, "train_mlp")) return *status;
  if (const std::string problem = c.ckpt.problem(); !problem.empty()) return tool::usage_error("train_mlp", problem);
  auto usage_error = [](const std::string& message) { return tool::usage_error("train_mlp", message); };
  if (!c.trace.empty() && !tool::trace_format_known(c.trace))
    return usage_error("--trace " + c.trace + ": the file must end in .svg, .json (Chrome trace), .txt (ASCII) or .csv");

  const bool synthesizing = c.schedule == "auto";
  if (!synthesizing && (app.count("--memory-limit") || app.count("--probe-steps")))
    return usage_error("--memory-limit and --probe-steps apply to --schedule auto");
  if (synthesizing && c.overlapped)
    return usage_error("--overlap: --schedule auto decides where pairs go itself");
  if (c.chunks == 0) c.chunks = default_chunks(*parse_schedule(c.schedule, true));
  std::string schedule = c.schedule;
  if (synthesizing) {
    schedule = probe_schedule(c.devices, c.chunks, c.micro_batches, c.memory_limit);
    if (schedule.empty())
      return usage_error("--schedule auto: no built-in schedule of " + std::to_string(c.devices) + " devices x " +
                         std::to_string(c.chunks) + " chunks runs " + std::to_string(c.micro_batches) +
                         " micro-batches to measure the costs with");
    if (const Text e = synthesis_error({ScheduleKind::kAuto, c.devices, c.chunks, c.micro_batches}, CostModel{},
                                       {.memory = c.memory_limit});
        !e.empty())
      return usage_error("--schedule auto: " + e.str());
    if (c.steps < 2 * c.probe_steps + 1)
      return usage_error("--schedule auto needs at least 2 * --probe-steps + 1 = " + std::to_string(2 * c.probe_steps + 1) +
                         " steps (the probe's, the best built-in's, then the synthesized program's; got --steps " +
                         std::to_string(c.steps) + ")");
  }
  const ScheduleKind kind = *parse_schedule(schedule);

  // The backend: the CUDA backend (train_mlp_gpu.cu) runs the same executor where
  // a GPU is present; auto takes it then, and the CPU backend otherwise.
  std::string backend_line;
  const bool gpu = c.backend == "cuda" || (c.backend == "auto" && train_mlp_gpu::gpus() > 0);
  c.gpu_backend = gpu;
  if (c.backend == "cuda" && train_mlp_gpu::gpus() == 0)
    return usage_error(train_mlp_gpu::built()
                           ? "--backend cuda: no CUDA backend can run here: no GPU is visible; use --backend cpu (or auto)"
                           : "--backend cuda: this build has no CUDA backend; use --backend cpu (or auto)");
  if (gpu) {
    if (const std::string problem = train_mlp_gpu::check(c.gpu, c.devices * c.replicas); !problem.empty()) return usage_error(problem);
  } else if (c.gpu.math != "fp32") {
    return usage_error("--math applies to the CUDA backend, which this run does not use");
  } else if (c.gpu.transport != "auto" && c.gpu.transport != "rendezvous") {
    return usage_error("--transport " + c.gpu.transport + ": the CPU backend's transport is rendezvous (or auto)");
  }
  if (!gpu)
    backend_line = std::string(cpu::CpuBackend{}.name()) + ", one thread per device, OpenBLAS pinned to 1 thread each" +
                   (c.backend == "auto" ? (train_mlp_gpu::built() ? " (auto: no GPU visible)"
                                                                  : " (auto: no CUDA backend in this build)")
                                        : "");

  Program program;
  MlpSpec spec;
  RegressionTask task;
  OptimizerConfig opt;
  try {
    program = make_schedule(kind, c.devices, c.chunks, c.micro_batches);
    spec = MlpSpec::uniform(c.layers, c.hidden, c.hidden, c.hidden, c.seed);
    spec.layers_per_stage = c.layers_per_stage;
    check_layer_split(program.shape, spec.allocation());
    if (c.overlapped) program = overlap(program);
    check_mlp_spec(spec);
    if (c.batch % (c.micro_batches * c.replicas) != 0)
      throw Error("the batch of " + std::to_string(c.batch) + " samples does not split into " +
                  (c.replicas > 1 ? std::to_string(c.replicas) + " replicas x " : std::string()) +
                  std::to_string(c.micro_batches) + " equal micro-batches");
    if (c.devices * c.replicas > 256)
      throw Error("--devices x --replicas is " + std::to_string(c.devices * c.replicas) +
                  " device threads; at most 256");
    opt = OptimizerConfig{c.optimizer == "adam" ? OptimizerKind::kAdam : OptimizerKind::kSgd, c.lr,
                          c.optimizer == "sgd" ? c.momentum : 0.0f};
    check_optimizer(opt);
    const double need = memory_estimate(spec, c), have = machine_memory();
    if (have > 0 && need > 0.8 * have) {
      char line[160];
      std::snprintf(line, sizeof line, "the run needs about %.1f GiB of memory; this machine has %.1f GiB", need / (1 << 30),
                    have / (1 << 30));
      throw Error(line);
    }
    task = make_regression_task(spec, c.batch, c.seed);
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  // Everything of a checkpoint is read and checked before any device is built.
  const checkpoint::MlpRun saved_run{spec, opt, c.batch, c.seed};
  Resume resume;
  if (!c.ckpt.resume.empty()) {
    try {
      resume.pipeline = checkpoint::load_mlp(c.ckpt.resume, saved_run, program.shape);
      resume.reference = checkpoint::load_mlp_whole(resume.pipeline.directory, saved_run);
      resume.any = true;
    } catch (const Error& e) {
      return usage_error("--resume: " + std::string(e.what()));
    }
    if (resume.pipeline.step > c.steps)
      return usage_error("--resume: the checkpoint is at step " + std::to_string(resume.pipeline.step) +
                         ", past --steps " + std::to_string(c.steps) + " (--steps counts from the start of the run)");
  }

  try {
    PipelineOptions run{c.batch, opt, std::chrono::milliseconds(c.timeout_ms)};
    run.replicas = c.replicas;
    // Data parallelism: every program the run trains reduces each chunk's gradients over the replicas.
    auto replicated = [&](const Program& p) { return c.replicas > 1 ? with_grad_reduce(p) : p; };
    if (gpu) {
      backend_line = train_mlp_gpu::describe(c.gpu, c.devices * c.replicas);
      return train(
          c, replicated(program), spec, task, saved_run, resume, backend_line, "",
          [&](const Program& p, const HostModel& init) {
            return train_mlp_gpu::make_pipeline(replicated(p), spec, init, run, c.gpu);
          },
          [&](const HostModel& init) {
            return train_mlp_gpu::make_reference(spec, init, c.batch, c.micro_batches, c.replicas, opt, c.gpu);
          });
    }
    const cpu::CpuOptions cpu_options{TransportKind::kRendezvous, 1};
    return train(
        c, replicated(program), spec, task, saved_run, resume, backend_line,
        step_bound(c.devices * c.replicas, bubble_ratio(program)),
        [&](const Program& p, const HostModel& init) {
          return make_mlp_pipeline(replicated(p), spec, init, run, cpu_options);
        },
        [&](const HostModel& init) {
          auto reference = std::make_unique<SequentialTrainer<cpu::CpuBackend>>(cpu::CpuBackend{}, spec, init, c.batch,
                                                                                c.micro_batches * c.replicas, opt);
          reference->set_replicas(c.replicas);  // each replica's gradient sum, then the replicas in order
          return reference;
        });
  } catch (const Error& e) {
    std::fflush(stdout);
    std::cerr << "train_mlp: " << e.what() << "\n";
    return 1;
  }
}
