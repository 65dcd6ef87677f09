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
// The backends are train_mlp_cpu.cpp and, where the build has CUDA, train_mlp_cuda.cu;
// --schedule auto is pipeweave::AutoSchedule (runtime/auto_schedule.hpp).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/training.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/checkpoint/background.hpp"
#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/cpu/pipeline.hpp"  // kMaxCpuDevices
#include "pipeweave/runtime/auto_schedule.hpp"
#include "train_mlp.hpp"

namespace {

using namespace pipeweave;

// A run: its flags, and what they make.
struct Run {
  tool::TrainingFlags f;
  int devices = 4;
  std::string trace;
  std::optional<AutoSchedule> tuner;  // --schedule auto
  Program program;                  // the first (with --schedule auto, the probe)
  MlpSpec spec;
  RegressionTask task;
  OptimizerConfig opt;
  checkpoint::MlpRun saved;
  std::optional<checkpoint::Loaded> resume, resume_reference;  // for the program's stages, and the reference's one chunk
  const train_mlp::Backend* backend = nullptr;
  std::string backend_line;
};

// "measured: 6 7; simulator: 6 7 (equal)" of the first `devices` devices.
template <class T>
void print_peaks(const char* what, const std::vector<T>& measured, const std::vector<T>& simulated, int devices,
                 const char* different = " (DIFFERENT)") {
  std::printf("%s, measured:", what);
  for (int d = 0; d < devices; ++d) std::printf(" %s", format_decimal(measured[static_cast<std::size_t>(d)], 3).c_str());
  std::printf("; simulator:");
  for (int d = 0; d < devices; ++d) std::printf(" %s", format_decimal(simulated[static_cast<std::size_t>(d)], 3).c_str());
  std::printf("%s\n", measured == simulated ? " (equal)" : different);
}

void print_header(const Run& r, const train_mlp::Pipeline& pipe, long long params) {
  const tool::TrainingFlags& f = r.f;
  const ScheduleShape& s = r.program.shape;
  const std::string kind(schedule_name(s.kind));
  const std::string words = r.tuner ? f.schedule + " (synthesized after " + std::to_string(f.autos.probe_steps) +
                                          " measured steps of " + kind + ")"
                                    : kind;
  std::printf("schedule: %s, %d devices x %d chunks = %d virtual stages, %d micro-batches of %d samples\n",
              words.c_str(), s.devices, s.chunks, s.stages(), s.micro_batches, f.batch / (s.micro_batches * f.replicas));
  if (const int pairs = pair_count(r.program); pairs > 0)
    std::printf("overlapped pairs: %d, each a forward and a backward of one device at once (the backward on the "
                "device's second stream; on the CPU, its second thread)\n",
                pairs);
  std::printf("model: %d layers of %d features (ReLU between them), %s parameters, seed %llu\n", r.spec.layers(),
              f.hidden, tool::with_commas(params).c_str(), static_cast<unsigned long long>(f.seed));
  std::printf("layers per virtual stage: %s\n", tool::per_stage_words(s, r.spec.allocation()).c_str());
  std::printf("%s\n", tool::activations_line(r.spec, f.batch / (s.micro_batches * f.replicas)).c_str());
  std::printf("task: %d samples, targets from a fixed random teacher network of the same shape\n", f.batch);
  if (f.replicas > 1)
    std::printf("data parallelism: %d replicas of the pipeline (%d x %d = %d device threads), replica r on samples "
                "[r*%d, (r+1)*%d); each chunk's gradients summed over the replicas at its R, %s\n",
                f.replicas, s.devices, f.replicas, s.devices * f.replicas, f.batch / f.replicas, f.batch / f.replicas,
                pipe.gradient_sums().c_str());
  std::printf("optimizer: %s, learning rate %g%s\n", f.optimizer.c_str(), static_cast<double>(f.lr),
              optimizer_row(r.opt.kind).momentum ? (", momentum " + std::to_string(f.momentum).substr(0, 4)).c_str() : "");
  std::printf("backend: %s\n", r.backend_line.c_str());
  if (r.resume)
    std::printf("resumed: from %s at step %lld (%lld optimizer updates applied)\n", r.resume->directory.c_str(),
                r.resume->step, r.resume->state.updates);
  if (!f.ckpt.save.empty())
    std::printf("checkpoints: into %s %s%s\n", f.ckpt.save.c_str(),
                f.ckpt.save_every > 0 ? ("every " + std::to_string(f.ckpt.save_every) + " steps and after the last").c_str()
                                      : "after the last step",
                f.ckpt.keep > 0 ? (", keeping the newest " + std::to_string(f.ckpt.keep)).c_str() : "");
  std::printf("\nlayers per device (1-based; virtual stage s = c*P + d) and peak activations kept:\n");
  for (int d = 0; d < s.devices; ++d) {
    std::printf("  device %d:", d);
    for (int ch = 0; ch < s.chunks; ++ch)
      std::printf("%s chunk %d = %s (stage %d)", ch ? "," : "", ch,
                  tool::layer_list(chunk_layers(s, r.spec.allocation(), d, ch)).c_str(), s.stage_of(d, ch));
    std::printf("; keeps at most %d\n", pipe.plan(d).peak_kept);
  }
  std::printf("\n");
}

// Trains with the pipeline and the reference; returns the exit status.
int train(Run& r) {
  const tool::TrainingFlags& f = r.f;
  const ScheduleShape s = r.program.shape;
  const HostModel init = init_mlp(r.spec);
  PipelineOptions options{f.batch, r.opt, std::chrono::milliseconds(f.timeout_ms)};
  options.replicas = f.replicas;
  auto make_pipeline = [&](const Program& p) { return r.backend->make_pipeline(p, r.spec, init, options, f); };
  auto pipe = make_pipeline(r.program);
  auto reference = r.backend->make_reference(r.spec, init, f.batch, f.micro_batches, f.replicas, r.opt, f);
  const long long first_step = r.resume ? r.resume->step : 0;
  if (r.resume) {
    pipe->set_state(r.resume->state);
    reference->set_state(r.resume_reference->state);
  }
  // The reference adds each chunk's gradients in the schedule's order of micro-batches (gradient_order()),
  // so that the two agree bit for bit.
  Program current = r.program;
  reference->set_gradient_order(gradient_order(current));
  long long params = 0;
  for (int i = 0; i < r.spec.layers(); ++i) params += static_cast<long long>(layer_parameters(r.spec, i));
  print_header(r, *pipe, params);

  double pipe_seconds = 0, reference_seconds = 0, first_loss = 0, last_loss = 0;
  using Clock = std::chrono::steady_clock;
  const int trained = f.steps - static_cast<int>(first_step);
  // Checkpoints are written on a thread of their own; the pipeline waits while its state is copied.
  std::optional<checkpoint::BackgroundSaver> saver;
  if (!f.ckpt.save.empty()) saver.emplace(f.ckpt.save, r.saved, s, f.ckpt.keep, "threads");
  auto report_save = [](const std::optional<checkpoint::SaveTimes>& t) {
    if (!t) return;
    std::printf("checkpoint: %s saved (%.1f MB, written in %.1f ms beside the training; the pipeline waited %.1f ms "
                "for the save before and %.1f ms to copy its state)\n",
                t->directory.c_str(), static_cast<double>(t->bytes) / 1e6, 1e3 * t->write_s, 1e3 * t->waited_s,
                1e3 * t->copy_s);
    std::fflush(stdout);
  };
  for (int step = static_cast<int>(first_step) + 1; step <= f.steps; ++step) {
    const auto t0 = Clock::now();
    const double loss = pipe->train_step(r.task.inputs, r.task.targets).loss;
    const auto t1 = Clock::now();
    const double ref_loss = reference->train_step(r.task.inputs, r.task.targets);
    const auto t2 = Clock::now();
    pipe_seconds += std::chrono::duration<double>(t1 - t0).count();
    reference_seconds += std::chrono::duration<double>(t2 - t1).count();
    if (step == first_step + 1) first_loss = loss;
    last_loss = loss;
    f.print_loss(step, first_step, loss, ref_loss);
    std::fflush(stdout);  // a step's line before its checkpoint is written
    if (saver && f.ckpt.saves_after(step, f.steps))
      report_save(saver->save(step, [&](TrainingState& state) { pipe->copy_state(state); }));
    if (!r.tuner) continue;
    // --schedule auto: each switch carries the state over, so the run stays one training run, bit for bit.
    const auto outcome = r.tuner->after_step(1e3 * std::chrono::duration<double>(t1 - t0).count(), pipe->trace(),
                                             f.steps - step);
    if (outcome.switched) {
      current = r.tuner->program();
      auto next = make_pipeline(current);
      switch_state(*pipe, *next);
      pipe = std::move(next);
      reference->set_gradient_order(gradient_order(current));
    }
    std::fputs(step_report(*r.tuner, outcome, step).c_str(), stdout);
  }
  if (r.tuner) r.tuner->finish();
  if (saver) report_save(saver->wait());
  if (trained > 0) {
    const Trace& t = pipe->trace();
    std::printf("\nloss %.6f -> %.6f over %d steps\n", first_loss, last_loss, trained);
    std::printf("step time: pipelined %.2f ms, sequential %.2f ms (mean over %d steps): %.2f of the sequential step\n",
                1e3 * pipe_seconds / trained, 1e3 * reference_seconds / trained, trained,
                pipe_seconds / reference_seconds);
    if (const std::string bound = r.backend->step_bound(s.devices * f.replicas, bubble_ratio(r.program));
        !bound.empty())
      std::printf("  %s\n", bound.c_str());
    std::printf("last step: makespan %.2f ms, bubble %.2f (measured: (makespan - busiest device's compute) / that "
                "compute; simulated with backward = 2 forward and free P2P: %.2f)\n",
                makespan(t) / 1e3, bubble_ratio(t), bubble_ratio(current));
    const std::vector<int> predicted = peak_activations(current);
    print_peaks("peak activations kept", t.peak_activations, predicted, s.devices);
    if (const std::vector<double> memory = peak_memory(current);
        memory != std::vector<double>(predicted.begin(), predicted.end()))
      print_peaks("peak memory (stashes and the gradients kept from an I to its W)", t.peak_memory, memory, s.devices);
    if (!t.peak_bytes.empty()) {  // measured from the devices' buffers; the MLP's memory model in bytes predicts them
      const int rows = f.batch / (s.micro_batches * f.replicas);
      const std::vector<double> bytes = peak_memory(current, mlp_memory_model(r.spec, current.shape, rows));
      const double most = *std::max_element(t.peak_bytes.begin(), t.peak_bytes.end());
      const int power = most >= 1 << 30 ? 3 : most >= 1 << 20 ? 2 : most >= 1 << 10 ? 1 : 0;
      auto in_unit = [&](std::vector<double> v) {
        for (double& x : v) x /= static_cast<double>(1LL << (10 * power));
        return v;
      };
      const std::string what = "peak memory held for kept micro-batches (stash slots and the tensors kept with "
                               "them), " + std::string(std::array{"B", "KiB", "MiB", "GiB"}[power]);
      print_peaks(what.c_str(), in_unit(t.peak_bytes), in_unit(bytes), s.devices,
                  mlp_memory_model_exact(current) ? " (DIFFERENT)"
                                                  : " (the model counts a stage's output, which the next stage on "
                                                    "its device reads, with the first stage alone: here that output "
                                                    "outlives it, or stays when it is offloaded)");
    }
    if (f.replicas > 1) {
      const Trace simulated = simulate(current, fit_cost_model(t));
      double total = 0;
      for (int d = 0; d < s.devices; ++d) total += reduction_time(t, d);
      std::printf("gradient reductions (replica 0's devices): %.3f ms in all, exposed after the last compute %.3f ms "
                  "(most of any device); simulated with the measured costs: exposed %.3f ms; beside compute: %.0f%% "
                  "measured, %.0f%% simulated\n",
                  total / 1e3, max_exposed_reduction(t) / 1e3, max_exposed_reduction(simulated) / 1e3,
                  100 * hidden_reduction_share(t), 100 * hidden_reduction_share(simulated));
    }
    if (!r.trace.empty()) {
      tool::write_trace(r.trace, t);
      std::printf("trace of the last step written to %s\n", r.trace.c_str());
    }
    if (r.tuner && r.tuner->synthesis()) std::fputs(segments_report(*r.tuner).c_str(), stdout);
  }
  const HostModel got = download_weights(*pipe, r.spec), want = reference->weights();
  const double diff = max_abs_difference(got, want);
  const bool ok = diff <= f.tolerance;
  std::printf("\ncheck against sequential training (the whole model on one thread, the same %d micro-batches in "
              "%sorder, one update per step):\n",
              s.micro_batches * f.replicas, gradient_order(current) == GradientOrder::kDecreasing ? "reverse " : "");
  std::printf("  max |pipelined - sequential| over %s parameters = %g%s (tolerance %g): %s\n",
              tool::with_commas(params).c_str(), diff, got == want ? " (bit-for-bit equal)" : "", f.tolerance,
              ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains an MLP through a pipeline schedule, one thread per device, on a synthetic regression task, "
               "and checks the parameters against sequential training of the same model."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  Run r;
  tool::TrainingFlags& f = r.f;
  tool::add_training_flags(app, f, {.synthesized = true, .transport = true, .max_replicas = cpu::kMaxCpuDevices,
                                    .save_help = "safetensors files and a manifest per step, written beside the "
                                                 "training; DIR/latest names the newest",
                                    .resume_help = "any schedule, P or V wrote it"});
  app.add_option("--devices", r.devices, "Pipeline devices P, one thread each, 1.." +
                                             std::to_string(cpu::kMaxCpuDevices) + " (default " +
                                             std::to_string(r.devices) + ")")
      ->check(CLI::Range(1, cpu::kMaxCpuDevices));
  app.add_option("--trace", r.trace,
                 "Write the last step's measured trace: FILE.svg, FILE.json (Chrome trace), FILE.txt (ASCII) or FILE.csv");
  if (const auto status = tool::parse(app, argc, argv, "train_mlp")) return *status;
  auto usage_error = [](const std::string& message) { return tool::usage_error("train_mlp", message); };

  // The backend: auto takes one with a device of its own where this build has it and sees one.
  const auto backend = tool::choose_backend<train_mlp::Backend>(f, app, true);
  if (!backend.error.empty()) return usage_error(backend.error);
  if (const std::string problem = backend.impl->check(f, r.devices * f.replicas); !problem.empty())
    return usage_error(problem);
  if (!r.trace.empty() && !tool::trace_format_known(r.trace))
    return usage_error("--trace " + r.trace + ": the file must end in .svg, .json (Chrome trace), .txt (ASCII) or .csv");
  r.backend = backend.impl;
  if (f.synthesizing()) {
    const ScheduleKind kind = *parse_schedule(f.schedule, true);
    const ScheduleShape shape{kind, r.devices, f.chunks > 0 ? f.chunks : default_chunks(kind), f.micro_batches};
    f.autos.pairs = r.backend->pairs_at_once(r.devices);
    f.autos.replicas = f.replicas;
    const tool::MemorySize limit = *tool::memory_size(f.memory_limit);  // training_flags_problem() read it
    f.autos.memory = limit.value;
    f.autos.recompute = f.recompute == tool::TrainingFlags::kAutoMemory;
    f.autos.offload = f.offload == tool::TrainingFlags::kAutoMemory;
    f.autos.copy_bandwidth = 1e3 * f.copy_bandwidth;  // GB/s: bytes per microsecond
    if (limit.bytes) {  // the built-in MLP's stash sizes in bytes, as the devices measure them
      try {
        f.autos.model = mlp_memory_model(tool::training_spec(f, shape), shape,
                                         f.batch / std::max(1, f.micro_batches * f.replicas));
      } catch (const Error& e) {
        return usage_error(e.what());
      }
    }
    if (const Text e = AutoSchedule::error(shape, f.autos); !e.empty())
      return usage_error("--schedule " + f.schedule + ": " + e.str());
    r.tuner.emplace(shape, f.autos);
    if (f.steps < r.tuner->least_steps())
      return usage_error("--schedule " + f.schedule + " needs at least 2 * --probe-steps + 1 = " +
                         std::to_string(r.tuner->least_steps()) + " steps (the probe's, the best built-in's, then the "
                         "synthesized program's; got --steps " + std::to_string(f.steps) + ")");
  }
  try {
    r.program = r.tuner ? r.tuner->program() : tool::training_program(f, r.devices);
    r.spec = tool::training_spec(f, r.program.shape);
    if (f.batch % (f.micro_batches * f.replicas) != 0)
      throw Error("the batch of " + std::to_string(f.batch) + " samples does not split into " +
                  (f.replicas > 1 ? std::to_string(f.replicas) + " replicas x " : std::string()) +
                  std::to_string(f.micro_batches) + " equal micro-batches");
    if (r.devices * f.replicas > cpu::kMaxCpuDevices)
      throw Error("--devices x --replicas is " + std::to_string(r.devices * f.replicas) + " device threads; at most " +
                  std::to_string(cpu::kMaxCpuDevices));
    r.opt = f.optimizer_config();
    tool::check_memory(r.spec, r.opt, f.replicas, f.batch);
    r.task = make_regression_task(r.spec, f.batch, f.seed);
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  // Everything of a checkpoint is read and checked before any device is built.
  r.saved = {r.spec, r.opt, f.batch, f.seed};
  if (!f.ckpt.resume.empty()) {
    try {
      r.resume = checkpoint::load_mlp(f.ckpt.resume, r.saved, r.program.shape);
      r.resume_reference = checkpoint::load_mlp_whole(r.resume->directory, r.saved);
    } catch (const Error& e) {
      return usage_error("--resume: " + std::string(e.what()));
    }
    if (const std::string problem = f.resume_problem(r.resume->step); !problem.empty()) return usage_error(problem);
  }
  try {
    r.backend_line = r.backend->describe(f, r.devices * f.replicas) + backend.why_auto;
    return train(r);
  } catch (const Error& e) {
    std::fflush(stdout);
    std::cerr << "train_mlp: " << e.what() << "\n";
    return 1;
  }
}
