// pipeline_cpu: how much faster is a training step through the pipeline than the
// same step run sequentially, on CPU threads, and how large is its bubble?
//
//   pipeline_cpu [--devices 2] [--layers 8] [--hidden 256] [--batch 512]
//                [--schedules S,S,...] [--micro-batches 2,4,8,16] [--chunks 2]
//                [--overlap] [--recompute] [--offload] [--replicas 1,2] [--activations fp32,bf16] [--spin-us 2000] [--warmup 2] [--iters 10]
//                [--rounds 1] [--json]
//   pipeline_cpu --devices 1 --overlap   # overlapped pairs on 2 cores
//   pipeline_cpu --devices 2 --replicas 1,2   # P = 2 against P = 1 with D = 2 data-parallel replicas
//
// For each schedule (the kinds marked bench_default in kinds.hpp by default, any
// other on request) and each M it
// trains the same MLP through the pipeline (one thread per device, OpenBLAS pinned
// to one thread each) and sequentially (one thread): warm-up steps first, then timed
// steps, the two runs alternating step by step so that both see the same load.
// With --rounds R every row runs --iters timed steps in each of R rounds over all
// rows, so that a stretch of load on a shared machine does not fall on one row.
// Columns: the median step times and their ratio (speedup), the speedup's share of
// the ideal P / (1 + simulated bubble) (of_ideal), and its share of the speedup
// the simulator gives the program with the costs the step really had (of_fitted:
// fit_cost_model() of each step's trace, so that stages of unequal cost and a
// backward that is not twice the forward are the schedule's, not the runtime's,
// and what is left is the hand-overs and the step's start and end); the spread of the
// pipelined step times (90th over 10th percentile: a row that met load on a shared
// machine shows it there, as a pipelined step on every core suffers more from
// another tenant than the sequential one on a single core); the bubble measured from the
// executor's trace (median) beside the simulated one (the analysis layer's replay of
// the lowered steps with F = 1, B = 2, I = W = 1 and free P2P) and the closed form
// where one exists, all as (makespan - busiest device's compute) / that compute; and
// #wrong, the parameters that differ from sequential training afterwards (0: bit for
// bit; for looped BFS the reference runs its micro-batches in reverse, as the
// schedule adds their gradients).
//
// With --overlap each schedule's program is also run overlapped (overlap(): a
// forward and an independent backward of a device at once, the backward on the
// device's second thread), in the same alternation, as the row <name>+overlap;
// its vs_plain column is the plain pipelined step time over the overlapped one.
// Its simulated bubble counts a pair as F + B (overlap efficiency 0), so of_ideal
// above 1 is what running the halves at once gains. A P = 1, V = 2 pipeline shows
// it on a 2-core machine: one device thread and its second thread.
//
// With --recompute and --offload each schedule's program also runs with every
// micro-batch of every stage recomputed (with_recompute(): a C, the forward
// again, before each backward) or offloaded (with_offload(): each stash copied
// to host memory after its forward and back before its backward), as the rows
// <name>+recompute and <name>+offload. Their vs_plain is measured as above, and
// sim_vs_plain is what the simulator predicts for it: the plain program's
// makespan over the variant's, both under the stage costs fitted to the same
// step of the plain run (fit_stage_costs(): a C costs its stage's forward, a copy
// nothing). peak_meas and peak_sim, on every row, are the most a device keeps
// (stashes, a recomputed micro-batch's input at 1/8 of one, and the gradients
// kept from an I to its W): counted by the runtime as it ran, and peak_memory()
// of the program.
//
// With --replicas each row also has a D: P = --devices / D pipeline devices times D
// data-parallel replicas (with_grad_reduce(), each replica on its shard of the same
// batch), so that rows of one --devices use the same threads; exp_meas is the
// measured exposed reduction (how long a device's reductions outlast its last
// compute, the most of replica 0's devices, median over steps), exp_sim the
// simulator's with the step's fitted costs (each R beside the compute that follows);
// hid_meas and hid_sim the share of the reductions' time that ran beside compute.
//
// With --activations each row runs the model with activations of each dtype
// (MlpSpec::dtype, column acts; its sequential reference too), and handoff_KiB is the
// size of one activation handed between devices (the largest message of device 0).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

// The most any device keeps (0 for none).
double most(const std::vector<double>& per_device) {
  return per_device.empty() ? 0.0 : *std::max_element(per_device.begin(), per_device.end());
}

// What a row may also run beside a schedule's plain program (rows
// <name>+<variant>), each asked for by the switch --<variant>.
struct Variant {
  const char* name;
  const char* help;
  Program (*apply)(const Program&);
  bool (*applies)(const Program&);  // false: nothing changed (no row)
  bool predicted;                   // sim_vs_plain: the simulator's ratio under the plain step's fitted costs
};

const Variant kVariants[] = {
    {"overlap",
     "Also run each schedule overlapped (overlap(); rows <name>+overlap): a forward and an independent backward of a "
     "device at once, the backward on the device's second thread",
     [](const Program& p) { return overlap(p); }, has_pairs, false},
    {"recompute",
     "Also run each schedule with every micro-batch of every stage recomputed (with_recompute(); rows "
     "<name>+recompute): the stage keeps its input and runs the forward again before the backward",
     [](const Program& p) { return with_recompute(p, all_stages(p.shape)); }, has_recompute, true},
    {"offload",
     "Also run each schedule with every stash offloaded (with_offload(); rows <name>+offload): to host memory after "
     "its forward, back before its backward",
     [](const Program& p) { return with_offload(p, all_stages(p.shape)); },
     [](const Program& p) { return offloads(p) > 0; }, true},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step time of pipelined against sequential training on CPU threads, with the measured and the ideal "
               "bubble and a correctness column."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  int devices = 2, chunks = 2, layers = 8, hidden = 256, batch = 512, warmup = 2, iters = 10, rounds = 1,
      spin_us = static_cast<int>(kDefaultSpin.count());
  std::string micro_batches = "2,4,8,16", replica_list = "1";
  std::vector<std::string> schedules = tool::bench_default_schedules();
  std::vector<std::string> activation_names{std::string(dtype_name(DType::kF32))};
  const auto floating = tool::dtype_names(true);
  bool json = false;
  std::vector<const Variant*> variants;  // in the table's order
  app.add_option("--devices", devices, "Devices P, one thread each (default 2)")->check(CLI::Range(1, 64));
  app.add_option("--chunks", chunks,
                 "Chunks per device V of " + tool::any_chunks_kinds() + " (default 2; " + tool::two_chunks_kinds() +
                     " have 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--layers", layers, "Layers, a multiple of P*V (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", hidden, "Features per layer (default 256)")->check(CLI::Range(1, 8192));
  app.add_option("--batch", batch, "Samples per step (default 512)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--schedules", schedules,
                 "Comma-separated: " + tool::join_words(tool::schedule_names(), ", ") + " (default " +
                     tool::join_words(schedules, ", ") + ")")
      ->delimiter(',')
      ->check(CLI::IsMember(tool::schedule_names()));
  app.add_option("--micro-batches", micro_batches, "Comma-separated M values (default 2,4,8,16)");
  app.add_option("--replicas", replica_list,
                 "Comma-separated data-parallel replicas D (default 1): each row runs P = --devices / D pipeline "
                 "devices x D replicas, the same device threads, on the same batch (D must divide --devices); "
                 "exp_meas and exp_sim give its exposed reduction");
  app.add_option("--activations", activation_names,
                 "Comma-separated dtypes of the activations (between layers and handed between devices), " +
                     tool::join_words(floating, ", ") + " (default fp32)")
      ->delimiter(',')
      ->check(CLI::IsMember(floating));
  std::vector<bool> asked(std::size(kVariants), false);
  std::size_t longest = 0;
  for (std::size_t i = 0; i < std::size(kVariants); ++i) {
    const Variant& v = kVariants[i];
    app.add_flag_callback("--" + std::string(v.name), [&asked, i] { asked[i] = true; },
                          std::string(v.help) + ", in the same alternation; vs_plain = plain pipelined step time / this one");
  }
  app.add_option("--spin-us", spin_us,
                 "How long a waiting device thread spins before it parks, in microseconds; 0 parks at once (default " +
                     std::to_string(kDefaultSpin.count()) + ")")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--warmup", warmup, "Untimed steps first (default 2)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed steps per round (default 10)")->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds,
                 "Rounds over all rows, each running --iters timed steps of every row in turn, so that a stretch of load "
                 "on a shared machine falls on all rows alike (default 1)")
      ->check(CLI::Range(1, 10000));
  app.add_flag("--json", json, "Print the rows as JSON instead of the table");
  if (const auto status = tool::parse(app, argc, argv, "pipeline_cpu")) return *status;
  for (std::size_t i = 0; i < std::size(kVariants); ++i)
    if (asked[i]) {
      variants.push_back(&kVariants[i]);
      longest = std::max(longest, std::char_traits<char>::length(kVariants[i].name) + 1);
    }
  std::vector<int> ms, ds;
  try {
    ms = tool::int_list(micro_batches, "--micro-batches", 1, 1 << 20);
    ds = tool::int_list(replica_list, "--replicas", 1, 64);
  } catch (const tool::BadArgument& e) {
    return tool::usage_error("pipeline_cpu", e.what());
  }
  for (const int D : ds)
    if (devices % D != 0)
      return tool::usage_error("pipeline_cpu", "--replicas " + std::to_string(D) + " does not divide --devices " +
                                                   std::to_string(devices) + " (each row runs --devices / D x D threads)");

  cpu::set_blas_threads(1);  // one BLAS thread per device thread, and for the sequential run
  const MlpSpec base = MlpSpec::uniform(layers, hidden, hidden, hidden, 1);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.001f, 0.9f};
  std::vector<tool::Column> columns = tool::schedule_columns(14 + static_cast<int>(longest));
  columns.insert(columns.end(), {{"D", "", "replicas", 3}, {"mb_rows", "rows", "micro_batch_rows", 8},
                                 {"acts", "", "activations", 5}, {"handoff_KiB", "KiB", "handoff_kib", 12, 1},
                                 {"seq_ms", "ms", "sequential_ms", 10, 3},
                                 {"pipe_ms", "ms", "pipelined_ms", 10, 3}, {"speedup", "x", "speedup", 8, 2},
                                 {"of_ideal", "", "of_ideal", 9, 2}, {"of_fitted", "", "of_fitted", 10, 2},
                                 {"spread", "x", "pipelined_p90_over_p10", 7, 2},
                                 {"bub_meas", "", "bubble_measured", 9, 3}, {"bub_sim", "", "bubble_simulated", 9, 3},
                                 {"bub_formula", "", "bubble_formula", 11, 3}, {"vs_plain", "x", "vs_plain", 9, 2},
                                 {"sim_vs_plain", "x", "vs_plain_simulated", 13, 2},
                                 {"peak_meas", "", "peak_memory_measured", 10, 3},
                                 {"peak_sim", "", "peak_memory_simulated", 9, 3},
                                 {"KiB_meas", "KiB", "peak_kib_measured", 9, 1},
                                 {"KiB_sim", "KiB", "peak_kib_simulated", 8, 1},
                                 {"exp_meas", "ms", "exposed_reduction_measured", 9, 3},
                                 {"exp_sim", "ms", "exposed_reduction_simulated", 8, 3},
                                 {"hid_meas", "", "hidden_reduction_measured", 9, 2},
                                 {"hid_sim", "", "hidden_reduction_simulated", 8, 2},
                                 {"#wrong", "values", "wrong", 7}});
  tool::Report report(std::move(columns));
  long long wrong = 0;
  long long peak_wrong = 0;  // steps whose measured peak is not peak_memory() of the program
  int predicted_rows = 0, predicted_within = 0;  // variant rows with sim_vs_plain, and those whose vs_plain is within 10% of it
  try {
    const RegressionTask task = make_regression_task(base, batch, 1);
    const HostModel init = init_mlp(base);
    struct Config {
      ScheduleKind kind;
      int V;
    };
    // The runs of a row: sequential, the pipeline, and the variants asked for,
    // alternating step by step so that all see the same load.
    struct Run {
      Program program{};
      const Variant* variant = nullptr;  // none: the plain program
      double peak_sim = 0;               // peak_memory() of the program, the most of any device
      double bytes_sim = 0;              // the same under the MLP's memory model in bytes
      bool bytes_exact = true;           // and the devices measure that (mlp_memory_model_exact())
      std::unique_ptr<cpu::CpuMlpPipeline> pipe{};
      std::vector<double> seconds{}, bubble{}, fitted{}, exposed{}, exposed_sim{}, hidden{}, hidden_sim{}, predicted{}, peak{}, bytes{};
    };
    struct Row {
      ScheduleKind kind;
      int replicas;
      MlpSpec spec;  // with the row's dtype
      std::vector<Run> runs;  // the plain program's first: its shape is the row's
      std::unique_ptr<SequentialTrainer<cpu::CpuBackend>> seq;   // the timed sequential run (and, D = 1, the reference)
      std::unique_ptr<SequentialTrainer<cpu::CpuBackend>> sums;  // D > 1: the reference, adding as the replicas do
      std::vector<double> seq_s;
    };
    std::vector<Row> rows;
    const cpu::CpuOptions cpu_options;
    for (const std::string& name : schedules) {
      const ScheduleKind kind = *parse_schedule(name);
      // The v placement has two chunks per device; the other kinds with chunks take --chunks.
      const Config cfg{kind, placement_of(kind) == Placement::kV ? 2 : default_chunks(kind) > 1 ? chunks : 1};
      for (const std::string& dtype : activation_names)
      for (const int D : ds) {
        const int P = devices / D;
        MlpSpec spec = base;
        spec.dtype = *parse_dtype(dtype);
        for (int M : ms) {
          if (batch % (D * M) != 0 || layers % (P * cfg.V) != 0) {
            std::fprintf(stderr, "pipeline_cpu: skipping %s P=%d D=%d M=%d: the batch or the layers do not split "
                         "evenly\n", std::string(schedule_name(cfg.kind)).c_str(), P, D, M);
            continue;
          }
          Program program;
          try {
            program = make_schedule(cfg.kind, P, cfg.V, M);
          } catch (const Error& e) {  // a shape the schedule does not take (its row's rules on M)
            std::fprintf(stderr, "pipeline_cpu: skipping %s P=%d M=%d: %s\n", std::string(schedule_name(cfg.kind)).c_str(),
                         P, M, e.what());
            continue;
          }
          Row row{cfg.kind, D, spec, {}, nullptr, nullptr, {}};
          // With replicas, every program reduces each chunk's gradients over them (after overlap()).
          auto replicated = [&](const Program& q) { return D > 1 ? with_grad_reduce(q) : q; };
          auto add_run = [&](const Program& q, const Variant* v) {
            Program run = replicated(q);
            const double peak = most(peak_memory(run));
            const double bytes = most(peak_memory(run, mlp_memory_model(spec, run.shape, batch / (D * M))));
            const bool exact = mlp_memory_model_exact(run);
            row.runs.push_back(
                {.program = std::move(run), .variant = v, .peak_sim = peak, .bytes_sim = bytes, .bytes_exact = exact});
          };
          add_run(program, nullptr);
          for (const Variant* v : variants) {
            Program o = v->apply(program);
            if (v->applies(o))
              add_run(o, v);
            else
              std::fprintf(stderr, "pipeline_cpu: %s M=%d: %s changes nothing\n",
                           std::string(schedule_name(cfg.kind)).c_str(), M, v->name);
          }
          PipelineOptions options{batch, opt, kDefaultTimeout, std::chrono::microseconds(spin_us)};
          options.replicas = D;
          for (Run& r : row.runs) r.pipe = make_mlp_pipeline(r.program, row.spec, init, options, cpu_options);
          row.seq =
              std::make_unique<SequentialTrainer<cpu::CpuBackend>>(cpu::CpuBackend{}, row.spec, init, batch, M * D, opt);
          row.seq->set_gradient_order(gradient_order(program));  // the program's order of micro-batches
          if (D > 1) {  // plain sequential training is what the step is timed against; this one checks the sums
            row.sums =
                std::make_unique<SequentialTrainer<cpu::CpuBackend>>(cpu::CpuBackend{}, row.spec, init, batch, M * D, opt);
            row.sums->set_replicas(D);  // each replica's sum, then the replicas in order
            row.sums->set_gradient_order(gradient_order(program));
          }
          rows.push_back(std::move(row));
        }
      }
    }
    // Round by round, every row in turn: a stretch of load on the shared machine
    // falls on all rows alike instead of on the one that ran then.
    for (int round = 0; round < rounds; ++round) {
      for (Row& row : rows) {
        const ScheduleShape& shape = row.runs.front().program.shape;
        std::fprintf(stderr, "pipeline_cpu: round %d of %d: %s P=%d V=%d M=%d D=%d %s\n", round + 1, rounds,
                     std::string(schedule_name(row.kind)).c_str(), shape.devices, shape.chunks, shape.micro_batches,
                     row.replicas, std::string(dtype_name(row.spec.dtype)).c_str());
        if (round == 0) {
          for (int i = 0; i < warmup; ++i) {
            for (Run& r : row.runs) r.pipe->train_step(task.inputs, task.targets);
            row.seq->train_step(task.inputs, task.targets);
            if (row.sums) row.sums->train_step(task.inputs, task.targets);
          }
        }
        for (int i = 0; i < iters; ++i) {
          for (Run& r : row.runs) {
            const auto t0 = Clock::now();
            r.pipe->train_step(task.inputs, task.targets);
            r.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            r.bubble.push_back(bubble_ratio(r.pipe->trace()));
            r.peak.push_back(most(r.pipe->trace().peak_memory));
            r.bytes.push_back(most(r.pipe->trace().peak_bytes));
            peak_wrong += std::abs(r.peak.back() - r.peak_sim) > 1e-9 ? 1 : 0;
            peak_wrong += r.bytes_exact && r.bytes.back() != r.bytes_sim ? 1 : 0;
            // What the program allows with this step's own costs (pairs: see fit_cost_model()).
            if (&r == &row.runs.front()) {
              const Trace simulated = simulate(r.program, fit_cost_model(r.pipe->trace()));
              r.fitted.push_back(row.replicas * parallel_speedup(simulated));
              r.exposed.push_back(max_exposed_reduction(r.pipe->trace()) / 1e3);
              r.exposed_sim.push_back(max_exposed_reduction(simulated) / 1e3);
              r.hidden.push_back(hidden_reduction_share(r.pipe->trace()));
              r.hidden_sim.push_back(hidden_reduction_share(simulated));
            }
          }
          // A variant's ratio to the plain program as the simulator predicts it from this step's plain run.
          const Run& plain = row.runs.front();
          const CostModel costs = fit_stage_costs(plain.pipe->trace(), plain.program.shape.stages());
          const double plain_span = makespan(plain.program, costs);
          for (Run& r : row.runs)
            if (r.variant != nullptr && r.variant->predicted)
              r.predicted.push_back(plain_span / makespan(r.program, costs));
          const auto t0 = Clock::now();
          row.seq->train_step(task.inputs, task.targets);
          row.seq_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          if (row.sums) row.sums->train_step(task.inputs, task.targets);
        }
      }
    }
    for (const Row& row : rows) {
      const ScheduleShape& shape = row.runs.front().program.shape;
      const double seq_ms = 1e3 * tool::median(row.seq_s), plain_ms = 1e3 * tool::median(row.runs.front().seconds);
      for (const Run& r : row.runs) {
        const bool variant_row = r.variant != nullptr;  // a variant's row: the columns of the plain program's step stay empty
        const auto& reference = row.sums ? row.sums : row.seq;
        const long long row_wrong =
            tool::count_different(download_weights(*r.pipe, row.spec).layers, reference->weights().layers);
        std::size_t handoff = 0;
        for (const Message& m : r.pipe->messages(0)) handoff = std::max(handoff, m.bytes);
        wrong += row_wrong;
        const double pipe_ms = 1e3 * tool::median(r.seconds), speedup = seq_ms / pipe_ms;
        if (!r.predicted.empty()) {
          ++predicted_rows;
          predicted_within += std::abs(plain_ms / pipe_ms / tool::median(r.predicted) - 1) <= 0.1 ? 1 : 0;
        }
        const double simulated = bubble_ratio(r.program);  // the simulator: backward = 2 forward, free P2P, e = 0
        const bool reduces = row.replicas > 1 && !variant_row;
        report.add({std::string(schedule_name(row.kind)) + (variant_row ? "+" + std::string(r.variant->name) : ""),
                    shape.devices, shape.chunks,
                    shape.micro_batches, row.replicas, batch / (row.replicas * shape.micro_batches),
                    std::string(dtype_name(row.spec.dtype)),
                    handoff > 0 ? tool::Cell(static_cast<double>(handoff) / 1024.0) : tool::Cell(), seq_ms, pipe_ms,
                    speedup, speedup / (devices / (1 + simulated)),
                    variant_row ? tool::Cell() : tool::Cell(speedup / tool::median(r.fitted)),
                    tool::percentile(r.seconds, 0.9) / tool::percentile(r.seconds, 0.1),
                    tool::median(r.bubble), simulated,
                    !variant_row && closed_form_error(shape).empty() ? tool::Cell(closed_form_bubble_ratio(shape))
                        : tool::Cell(),
                    variant_row ? tool::Cell(plain_ms / pipe_ms) : tool::Cell(),
                    r.predicted.empty() ? tool::Cell() : tool::Cell(tool::median(r.predicted)),
                    tool::median(r.peak), r.peak_sim, tool::median(r.bytes) / 1024, r.bytes_sim / 1024,
                    reduces ? tool::Cell(tool::median(r.exposed)) : tool::Cell(),
                    reduces ? tool::Cell(tool::median(r.exposed_sim)) : tool::Cell(),
                    reduces ? tool::Cell(tool::median(r.hidden)) : tool::Cell(),
                    reduces ? tool::Cell(tool::median(r.hidden_sim)) : tool::Cell(), row_wrong});
      }
    }
  } catch (const Error& e) {
    std::cerr << "pipeline_cpu: " << e.what() << "\n";
    return 2;
  }

  if (json) {
    std::fputs(report
                   .json("pipeline_cpu", {{"layers", std::to_string(layers)},
                                          {"hidden", std::to_string(hidden)},
                                          {"batch", std::to_string(batch)},
                                          {"warmup", std::to_string(warmup)},
                                          {"iters", std::to_string(iters)},
                                          {"rounds", std::to_string(rounds)},
                                          {"spin_us", std::to_string(spin_us)},
                                          {"blas_threads_per_device", "1"},
                                          {"steps_with_wrong_peak", std::to_string(peak_wrong)},
                                          {"rows_with_sim_vs_plain", std::to_string(predicted_rows)},
                                          {"rows_within_10pct_of_sim_vs_plain", std::to_string(predicted_within)}})
                   .c_str(),
               stdout);
  } else {
    std::fputs(
        report
            .text({"pipeline_cpu: pipelined vs sequential training step on CPU threads, OpenBLAS 1 thread per device, "
                   "a waiting thread spinning up to " + std::to_string(spin_us) + " us",
                   "model: " + std::to_string(layers) + " layers x " + std::to_string(hidden) + " features, batch " +
                       std::to_string(batch) + ", sgd with momentum; " + std::to_string(warmup) + " warm-up + " +
                       std::to_string(rounds) + " x " + std::to_string(iters) +
                       " timed steps, the runs alternating, the rows in turn each round;",
                   "times and bubbles are medians over the timed steps; of_ideal = speedup / (P / (1 + bub_sim))",
                   "of_fitted = speedup / the speedup the simulator gives the program with the costs fitted to each step's",
                   "  trace (fit_cost_model(): mean time per phase, a speed per device, free P2P): what the runtime loses",
                   "spread = 90th / 10th percentile of the pipelined step times: the nearer 1, the steadier the row ran",
                   "bubble = (makespan - busiest device's compute) / that compute. meas: from the executor's trace;",
                   "  sim: the simulator's replay of the lowered steps (F = 1, B = 2, I = W = 1, free P2P); formula: "
                   "the closed form ((P-1)/(V*M) for " +
                       tool::join_words(tool::kind_names([](const KindRow& r) { return r.bubble_of_shape; }), ", ") +
                       "; - where none)",
                   "vs_plain (+overlap, +recompute, +offload rows): the plain pipelined step time / the row's; "
                   "sim_vs_plain: the simulator's",
                   "  ratio with the stage costs fitted to each step of the plain run (a C costs the forward, a "
                   "copy nothing)",
                   "  rows with sim_vs_plain: " + std::to_string(predicted_rows) + "; of them vs_plain within 10% "
                   "of it: " + std::to_string(predicted_within),
                   "peak_meas, peak_sim: the most a device keeps in activations (a recomputed input 1/8), counted "
                   "as it ran and peak_memory()",
                   "KiB_meas, KiB_sim: the most a device holds for its kept micro-batches, measured from its buffers, "
                   "and peak_memory() under mlp_memory_model()",
                   "D (--replicas): data-parallel replicas, P x D device threads on the batch; exp_meas: the measured "
                   "exposed reduction (ms after",
                   "  a device's last compute, the most of replica 0's devices); exp_sim: the simulator's, with the "
                   "costs fitted to the step (R on the collective lane)",
                   "hid_meas, hid_sim: the share of the reductions' time that ran beside compute (1 - exposed / "
                   "reduction time, over replica 0's devices)",
                   "acts (--activations): the dtype of the activations (the reference's too); handoff_KiB: one "
                   "activation handed between devices",
                   "#wrong: parameters differing from sequential training (its micro-batches in the program's order)",
                   ""},
                  tool::wrong_footer("parameters differing from sequential training, all rows", wrong) + "\n" +
                      tool::wrong_footer("steps whose measured peak (activations, or bytes where mlp_memory_model_exact()) "
                                         "differs from the program's peak_memory()", peak_wrong))
            .c_str(),
        stdout);
  }
  return wrong == 0 && peak_wrong == 0 ? 0 : 1;
}
