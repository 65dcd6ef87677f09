// step_cpu: how close does a sequential training step on the CPU backend come to
// the time of its GEMMs alone?
//
//   step_cpu [--layers 8] [--hidden 256] [--batch 512] [--micro-batches 1,2,4,8]
//            [--optimizer sgd|adam] [--warmup 3] [--iters 20] [--json]
//
// For each M it trains the MLP sequentially on one thread (the SequentialTrainer
// that every pipeline is checked against; OpenBLAS pinned to one thread), records
// the GEMM calls that one step makes, and then alternates timed steps with timed
// replays of exactly those calls (same shapes, operands and outputs), so that
// both see the same load. Columns: the median step and replay times, their
// ratio (1 would mean that everything besides the GEMMs is free), the GEMMs'
// rate, and #wrong: the parameters that differ, after the same steps, from
// training through the portable path of the Backend concept (every elementwise
// pass as for_each or sum of the per-element functors). 0 means that the CPU
// backend's own loops compute exactly what the shared functors define.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

// One cblas_sgemm call as the backend received it.
struct GemmCall {
  Transpose ta, tb;
  int m, n, k;
  float alpha;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float beta;
  float* c;
  int ldc;
};

// The CPU backend that writes down its GEMM calls while `recording` is set.
class RecordingBackend : public cpu::CpuBackend {
 public:
  bool recording = false;
  std::vector<GemmCall> calls;

  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    if (recording) calls.push_back({ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc});
    cpu::CpuBackend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // Runs the recorded calls again.
  void replay() {
    for (const GemmCall& g : calls)
      cpu::CpuBackend::gemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, g.a, g.lda, g.b, g.ldb, g.beta, g.c, g.ldc);
  }
  double flops() const {
    double f = 0;
    for (const GemmCall& g : calls) f += 2.0 * g.m * g.n * g.k;
    return f;
  }
};
static_assert(Backend<RecordingBackend>);

// The CPU backend seen through the Backend concept's required operations only:
// its own matrix passes are hidden, so that the layers fall back on for_each, and
// for_each is a plain loop of per-element calls.
class PortableBackend : public cpu::CpuBackend {
 public:
  template <class F>
  void for_each(std::size_t n, F f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }

 private:
  using cpu::CpuBackend::column_sums;
  using cpu::CpuBackend::for_each_element;
};
static_assert(Backend<PortableBackend>);
// Whether B has the CPU backend's own matrix passes, which the layers call when present.
template <class B>
constexpr bool kOwnMatrixPasses = requires(B& b, float* out) {
  b.for_each_element(1, 1, [](std::size_t, std::size_t) {});
  b.column_sums(1, 1, [](std::size_t, std::size_t) { return 0.0f; }, out);
};
static_assert(kOwnMatrixPasses<cpu::CpuBackend> && !kOwnMatrixPasses<PortableBackend>);

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sequential training step on the CPU backend against the time of its GEMMs alone, with a "
               "correctness column."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  int layers = 8, hidden = 256, batch = 512, warmup = 3, iters = 20;
  std::string micro_batches = "1,2,4,8", optimizer(optimizer_name(OptimizerKind::kSgd));
  bool json = false;
  app.add_option("--layers", layers, "Layers (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", hidden, "Features per layer (default 256)")->check(CLI::Range(1, 8192));
  app.add_option("--batch", batch, "Samples per step (default 512)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batches", micro_batches, "Comma-separated M values (default 1,2,4,8)");
  const auto optimizers = tool::row_names(kOptimizerRows, [](const OptimizerRow& r) { return r.name; });
  app.add_option("--optimizer", optimizer,
                 tool::join_words(optimizers, " or ") + " (momentum 0.9 where the rule takes one; default " +
                     optimizer + ")")
      ->check(CLI::IsMember(optimizers));
  app.add_option("--warmup", warmup, "Untimed steps first (default 3)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed steps (default 20)")->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "Print the rows as JSON instead of the table");
  if (const auto status = tool::parse(app, argc, argv, "step_cpu")) return *status;
  std::vector<int> ms;
  try {
    ms = tool::int_list(micro_batches, "--micro-batches", 1, 1 << 20);
  } catch (const tool::BadArgument& e) {
    return tool::usage_error("step_cpu", e.what());
  }

  cpu::set_blas_threads(1);
  const MlpSpec spec = MlpSpec::uniform(layers, hidden, hidden, hidden, 1);
  const OptimizerKind kind = *parse_optimizer(optimizer);
  const bool momentum = optimizer_row(kind).momentum;
  const OptimizerConfig opt{kind, 0.001f, momentum ? 0.9f : 0.0f};
  tool::Report report({{"M", "", "micro_batches", 4},
                       {"mb_rows", "rows", "micro_batch_rows", 8},
                       {"step_ms", "ms", "step_ms", 9, 3},
                       {"gemm_ms", "ms", "gemm_ms", 9, 3},
                       {"step/gemm", "x", "step_over_gemm", 10, 3},
                       {"gemm_rate", "GFLOP/s", "gemm_gflops", 10, 1},
                       {"gemms", "calls", "gemm_calls", 6},
                       {"#wrong", "values", "wrong", 7}});
  long long wrong = 0;
  try {
    const RegressionTask task = make_regression_task(spec, batch, 1);
    const HostModel init = init_mlp(spec);
    for (int M : ms) {
      if (batch % M != 0) {
        std::fprintf(stderr, "step_cpu: skipping M=%d: the batch does not split evenly\n", M);
        continue;
      }
      std::fprintf(stderr, "step_cpu: M=%d\n", M);
      SequentialTrainer<RecordingBackend> seq(RecordingBackend{}, spec, init, batch, M, opt);
      SequentialTrainer<PortableBackend> portable(PortableBackend{}, spec, init, batch, M, opt);
      RecordingBackend& b = seq.backend();
      for (int i = 0; i < warmup; ++i) seq.train_step(task.inputs, task.targets);
      b.recording = true;
      seq.train_step(task.inputs, task.targets);
      b.recording = false;
      // Steps and replays alternate, so that both see the same load on the machine.
      std::vector<double> step_s, gemm_s;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        seq.train_step(task.inputs, task.targets);
        const auto t1 = Clock::now();
        b.replay();
        const auto t2 = Clock::now();
        step_s.push_back(std::chrono::duration<double>(t1 - t0).count());
        gemm_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      }
      for (int i = 0; i < warmup + 1 + iters; ++i) portable.train_step(task.inputs, task.targets);
      const long long row_wrong = tool::count_different(seq.weights().layers, portable.weights().layers);
      wrong += row_wrong;
      const double step_ms = 1e3 * tool::median(step_s), gemm_ms = 1e3 * tool::median(gemm_s);
      report.add({static_cast<long long>(M), static_cast<long long>(batch / M), step_ms, gemm_ms, step_ms / gemm_ms,
                  b.flops() / (gemm_ms * 1e6), static_cast<long long>(b.calls.size()), row_wrong});
    }
  } catch (const Error& e) {
    std::cerr << "step_cpu: " << e.what() << "\n";
    return 2;
  }

  const std::string backend(cpu::CpuBackend{}.name());
  if (json) {
    std::fputs(report
                   .json("step_cpu", {{"layers", std::to_string(layers)},
                                      {"hidden", std::to_string(hidden)},
                                      {"batch", std::to_string(batch)},
                                      {"optimizer", tool::json_string(optimizer)},
                                      {"backend", tool::json_string(backend)},
                                      {"warmup", std::to_string(warmup)},
                                      {"iters", std::to_string(iters)}})
                   .c_str(),
               stdout);
  } else {
    std::fputs(
        report
            .text({"step_cpu: a sequential training step on one thread against its GEMMs alone",
                   "model: " + std::to_string(layers) + " layers x " + std::to_string(hidden) + " features, batch " +
                       std::to_string(batch) + ", " + optimizer + (momentum ? " with momentum 0.9" : "") + "; " +
                       std::to_string(warmup) + " warm-up + " + std::to_string(iters) +
                       " timed steps, each followed by a replay of the GEMM calls one step makes;",
                   "backend: " + backend + ", 1 BLAS thread; times are medians",
                   "#wrong: parameters differing from the same steps through the portable per-element path", ""},
                  tool::wrong_footer("parameters differing, all rows", wrong))
            .c_str(),
        stdout);
  }
  return wrong == 0 ? 0 : 1;
}
