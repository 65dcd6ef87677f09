// pipeline_cpu: how much faster is a training step through the pipeline than the
// same step run sequentially, on CPU threads, and how large is its bubble?
//
//   pipeline_cpu [--devices 2] [--layers 8] [--hidden 256] [--batch 512]
//                [--micro-batches 2,4,8,16] [--chunks 2] [--warmup 2] [--iters 10] [--json]
//
// For each schedule (GPipe, 1F1B, interleaved with V chunks) and each M it trains
// the same MLP through the pipeline (one thread per device, OpenBLAS pinned to one
// thread each) and sequentially (one thread): warm-up steps first, then timed steps,
// the two runs alternating step by step so that both see the same load. Columns:
// the median step times and their ratio; the bubble measured from the executor's
// trace (median) beside the simulated one (the analysis layer's replay of the
// lowered steps with backward = 2 forward and free P2P) and the formula (P-1)/(V*M),
// all as (makespan - busiest device's compute) / that compute; and #wrong, the
// parameters that differ from sequential training afterwards (0: bit for bit).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/sequential.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string schedule;
  int P, V, M, rows;
  double sequential_ms, pipelined_ms, bubble_measured, bubble_simulated, bubble_formula;
  long long wrong;
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

long long count_wrong(const HostModel& a, const HostModel& b) {
  long long wrong = 0;
  for (std::size_t i = 0; i < a.layers.size(); ++i)
    for (std::size_t k = 0; k < a.layers[i].size(); ++k) wrong += !(a.layers[i][k] == b.layers[i][k]);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step time of pipelined against sequential training on CPU threads, with the measured and the ideal "
               "bubble and a correctness column."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  int devices = 2, chunks = 2, layers = 8, hidden = 256, batch = 512, warmup = 2, iters = 10;
  std::string micro_batches = "2,4,8,16";
  bool json = false;
  app.add_option("--devices", devices, "Devices P, one thread each (default 2)")->check(CLI::Range(1, 64));
  app.add_option("--chunks", chunks, "Chunks per device V of the interleaved schedule (default 2)")->check(CLI::Range(1, 64));
  app.add_option("--layers", layers, "Layers, a multiple of P*V (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", hidden, "Features per layer (default 256)")->check(CLI::Range(1, 8192));
  app.add_option("--batch", batch, "Samples per step (default 512)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batches", micro_batches, "Comma-separated M values (default 2,4,8,16)");
  app.add_option("--warmup", warmup, "Untimed steps first (default 2)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed steps (default 10)")->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "Print the rows as JSON instead of the table");
  std::vector<int> ms;
  try {
    app.parse(argc, argv);
    ms = parse_list(micro_batches);
    if (ms.empty()) throw CLI::ValidationError("--micro-batches", "needs at least one value");
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "pipeline_cpu: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const std::exception&) {
    std::cerr << "pipeline_cpu: --micro-batches takes comma-separated integers, e.g. 2,4,8 (see --help)\n";
    return 2;
  }

  cpu::set_blas_threads(1);  // one BLAS thread per device thread, and for the sequential run
  const MlpSpec spec = MlpSpec::uniform(layers, hidden, hidden, hidden, 1);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.001f, 0.9f};
  std::vector<Row> rows;
  try {
    const RegressionTask task = make_regression_task(spec, batch, 1);
    const HostModel init = init_mlp(spec);
    struct Config {
      ScheduleKind kind;
      int V;
    };
    for (const Config cfg : {Config{ScheduleKind::kGPipe, 1}, Config{ScheduleKind::kOneFOneB, 1},
                             Config{ScheduleKind::kInterleaved1F1B, chunks}}) {
      for (int M : ms) {
        if (cfg.kind == ScheduleKind::kInterleaved1F1B && M % devices != 0) continue;
        if (batch % M != 0 || layers % (devices * cfg.V) != 0) {
          std::fprintf(stderr, "pipeline_cpu: skipping %s M=%d: the batch or the layers do not split evenly\n",
                       std::string(schedule_name(cfg.kind)).c_str(), M);
          continue;
        }
        const Program program = make_schedule(cfg.kind, devices, cfg.V, M);
        std::fprintf(stderr, "pipeline_cpu: %s P=%d V=%d M=%d\n", std::string(schedule_name(cfg.kind)).c_str(),
                     devices, cfg.V, M);
        auto pipe = cpu::make_mlp_pipeline(program, spec, init, {batch, opt}, {{}, 1});
        SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, spec, init, batch, M, opt);
        for (int i = 0; i < warmup; ++i) {
          pipe->train_step(task.inputs, task.targets);
          seq.train_step(task.inputs, task.targets);
        }
        // The two runs alternate step by step, so that both see the same load on the machine.
        std::vector<double> pipe_s, seq_s, bubble;
        for (int i = 0; i < iters; ++i) {
          const auto t0 = Clock::now();
          pipe->train_step(task.inputs, task.targets);
          const auto t1 = Clock::now();
          seq.train_step(task.inputs, task.targets);
          const auto t2 = Clock::now();
          pipe_s.push_back(std::chrono::duration<double>(t1 - t0).count());
          seq_s.push_back(std::chrono::duration<double>(t2 - t1).count());
          bubble.push_back(bubble_ratio(pipe->trace()));
        }
        const double simulated = bubble_ratio(program);  // the simulator: backward = 2 forward, free P2P
        const double formula = closed_form_bubble_ratio(program.shape);
        rows.push_back({std::string(schedule_name(cfg.kind)), devices, cfg.V, M, batch / M, 1e3 * median(seq_s),
                        1e3 * median(pipe_s), median(bubble), simulated, formula,
                        count_wrong(download_weights(*pipe, spec), seq.weights())});
      }
    }
  } catch (const Error& e) {
    std::cerr << "pipeline_cpu: " << e.what() << "\n";
    return 2;
  }

  long long wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (json) {
    std::printf("{\"bench\": \"pipeline_cpu\", \"layers\": %d, \"hidden\": %d, \"batch\": %d, \"warmup\": %d, "
                "\"iters\": %d, \"blas_threads_per_device\": 1, \"rows\": [\n",
                layers, hidden, batch, warmup, iters);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"schedule\": \"%s\", \"devices\": %d, \"chunks\": %d, \"micro_batches\": %d, "
                  "\"micro_batch_rows\": %d, \"sequential_ms\": %.4f, \"pipelined_ms\": %.4f, \"speedup\": %.4f, "
                  "\"bubble_measured\": %.4f, \"bubble_simulated\": %.4f, \"bubble_formula\": %.4f, \"wrong\": %lld}%s\n",
                  r.schedule.c_str(), r.P, r.V, r.M, r.rows, r.sequential_ms, r.pipelined_ms,
                  r.sequential_ms / r.pipelined_ms, r.bubble_measured, r.bubble_simulated, r.bubble_formula, r.wrong,
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf("]}\n");
  } else {
    std::printf("# pipeline_cpu: pipelined vs sequential training step on CPU threads, OpenBLAS 1 thread per device\n");
    std::printf("# model: %d layers x %d features, batch %d, sgd with momentum; %d warm-up + %d timed steps, the two "
                "runs alternating;\n# times and bubbles are medians over the timed steps\n",
                layers, hidden, batch, warmup, iters);
    std::printf("# bubble = (makespan - busiest device's compute) / that compute. meas: from the executor's "
                "trace;\n#   sim: the simulator's replay of the lowered steps (backward = 2 forward, "
                "free P2P); formula: (P-1)/(V*M)\n");
    std::printf("#\n# %-11s %3s %3s %4s %8s %10s %10s %8s %9s %9s %9s %7s\n", "schedule", "P", "V", "M", "mb_rows",
                "seq_ms", "pipe_ms", "speedup", "bub_meas", "bub_sim", "bub_formula", "#wrong");
    for (const Row& r : rows)
      std::printf("  %-11s %3d %3d %4d %8d %10.3f %10.3f %8.2f %9.3f %9.3f %9.3f %7lld\n", r.schedule.c_str(), r.P,
                  r.V, r.M, r.rows, r.sequential_ms, r.pipelined_ms, r.sequential_ms / r.pipelined_ms,
                  r.bubble_measured, r.bubble_simulated, r.bubble_formula, r.wrong);
    std::printf("# parameters differing from sequential training, all rows: %lld %s\n", wrong, wrong == 0 ? "OK" : "WRONG");
  }
  return wrong == 0 ? 0 : 1;
}
