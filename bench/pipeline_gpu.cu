// pipeline_gpu: how close does a pipelined training step on GPUs come to the
// GPU's dense peak, and to cuBLAS alone on the same GEMMs?
//
//   pipeline_gpu [--schedules S,S,...] [--devices 4] [--chunks 2]
//                [--micro-batches 8] [--hidden 4096] [--layers 16] [--batch 4096]
//                [--dtypes fp32,tf32,bf16] [--activations fp32,bf16] [--transport auto] [--overlap] [--offload]
//                [--replicas 1]
//                [--warmup 2] [--iters 5]
//                [--peak-tflops X] [--trace-dir DIR] [--json] [--json-file PATH]
//
// For each configuration (schedule, P, V, M, hidden size, layers, dtype of the
// GEMMs, dtype of the activations) it trains
// the same MLP through the GPU pipeline and sequentially on one GPU (the same
// kernels back to back on one stream), alternating step by step.
//
// What is timed, and how:
// - step_ms (JSON step_ms) and seq_ms (sequential_ms): the median wall clock of
//   the host's train_step call, pipelined and sequential: the batch's copies,
//   every kernel and P2P transfer, the finiteness check and the optimizer's update
//   up to the host's last synchronize. The runtime takes the batch on the host
//   and copies it in every step, a micro-batch at a time on a copy stream ahead
//   of the forward that reads it (runtime/batch_feed.hpp); the bench page-locks
//   the inputs and targets (cudaHostRegister, PinnedHost), so the copies start
//   from them directly, at the link's speed, without a copy on the host.
// - dev_ms (device_ms): the step's span on the GPUs from the executor's
//   CUDA-event trace: from the start of its first compute event (the first
//   forward, which its stream runs after its micro-batch's copy) to the end of its
//   last compute or P2P event, over every device; each device's events count from
//   its stream's origin, enqueued by all devices together at the step's start.
//   It leaves out the zeroing of gradients, the first micro-batch's copy, the finiteness
//   check, the update and the host's dispatch: the schedule's kernels and
//   transfers with its bubbles. The median over the timed steps.
// - TFLOP/s (tflops) and TFLOP/s_d (tflops_dev): the GEMM work of a step
//   (forward, weight gradient and input gradient of every layer, except the first
//   layer's input gradient) over step_ms and over dev_ms; %peak and %peak_d
//   (peak_percent, peak_percent_dev): their percent of the dense peak of the GPUs
//   in use.
// - a "cublas" row per shape and dtype: the step's GEMMs alone with cuBLAS on one
//   stream of the first GPU (the same M, N, K and transposes as the layers'
//   GEMMs, on random bf16 or fp32 operands prepared in advance), timed by CUDA
//   events around the step's GEMMs: device time, so its step_ms, seq_ms and
//   dev_ms are that time and tflops = tflops_dev. The upper bound.
// Beside them: the bubble measured from the trace beside the ideal one (P-1)/(V*M)
// where the schedule has that closed form (and the simulator's replay of the
// lowered steps with B = 2F); the overhead of the step against the sum of its
// kernel times (the sequential run's step: pipelined time x GPUs / sequential
// time - 1); link (transport), the transport the pipeline uses (virtual or
// nccl); and #wrong, the parameters that differ from the sequential run
// afterwards by more than 1e-6. acts (activations) is the dtype of the activations
// between layers and handed between devices (MlpSpec::dtype; --activations), and
// handoff_KiB the size of one hand-over (the largest message of device 0).
//
// With --overlap every configuration also runs overlapped (overlap(): a forward
// and an independent backward of a device at once, the backward on the device's
// second stream), as the row <schedule>+overlap right after the plain one; its
// vs_plain column is the plain row's step time over its own. Small micro-batches,
// whose kernels do not fill the GPU, are where the second stream can help.
//
// With --offload every configuration also runs with every stage's stashes
// offloaded to host memory (with_offload() of every stage: an O and an L per
// micro-batch the program keeps long enough), as the row <schedule>+offload:
// the copies run on each device's copy stream, to and from page-locked host
// memory, beside its kernels (runtime/copy_lane.hpp); vs_plain is the plain
// row's step time over its own.
//
// With --replicas D every configuration runs D data-parallel replicas of the
// P-device pipeline (P x D device threads placed on the GPUs, with_grad_reduce():
// each device sums a chunk's gradients over the replicas after its last backward
// of it, on a stream of its own), against the sequential run that adds each
// replica's gradients and then the replicas in order. Its rows add the exposed
// reduction (how long the step outlasts the device's last compute, most of any
// device; exp_meas from the last timed step's trace, exp_sim the simulator's with
// that step's costs) and the share of the reductions' time beside compute
// (hid_meas, hid_sim); the medians over the timed steps.
//
// With several pipeline devices on one GPU (virtual devices), the devices share
// the GPU: the measured "bubble" then counts time a device's stream waits while
// the GPU runs the others, not idle hardware.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "operands.hpp"
#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/gemm.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/pipeline.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

namespace {

namespace pw = pipeweave;
namespace pc = pipeweave::cuda;
using Clock = std::chrono::steady_clock;

// Dense (no sparsity) peak TFLOP/s per dtype of a GPU, from the vendor's data sheets.
struct Peak {
  double fp32 = 0, tf32 = 0, bf16 = 0;
  double of(pc::MathMode m) const { return m == pc::MathMode::kFp32 ? fp32 : m == pc::MathMode::kTf32 ? tf32 : bf16; }
};

// The peak of a GPU by its name; zeros when unknown (then --peak-tflops gives it).
Peak peak_of(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") && (has("PCIe") || has("PCIE"))) return {51.2, 378.0, 756.0};
  if ((has("H100") || has("H200")) && !has("NVL")) return {66.9, 494.7, 989.4};  // SXM
  if (has("A100")) return {19.5, 156.0, 312.0};
  return {};
}

struct Row {
  std::string schedule, dtype, acts = "-", transport;
  int P = 1, V = 1, M = 1, D = 1, hidden = 0, layers = 0, rows = 0, gpus = 1;
  double step_ms = 0, seq_ms = 0, tflops = 0, peak_pct = -1, device_ms = -1, tflops_dev = -1, peak_pct_dev = -1,
         bubble_measured = -1, bubble_ideal = -1,
         bubble_sim = -1, overhead = -1, vs_plain = -1, exposed = -1, exposed_sim = -1, hidden_share = -1,
         hidden_share_sim = -1, handoff_kib = -1;
  long long wrong = 0;
  bool bitwise = true;
};

// A vector's storage page-locked for the guard's lifetime (cudaHostRegister,
// portable: pinned for every GPU's context), so that copies from it to a GPU are
// DMA transfers at the link's speed. The vector must not grow or die before the
// guard does.
class PinnedHost {
 public:
  explicit PinnedHost(std::vector<float>& v) : p_(v.data()) {
    PIPEWEAVE_CHECK_CUDA(cudaHostRegister(p_, v.size() * sizeof(float), cudaHostRegisterPortable));
  }
  ~PinnedHost() { (void)cudaHostUnregister(p_); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;

 private:
  float* p_;
};

// The span of a measured step on the GPUs in milliseconds: from the start of the
// first compute event (the first forward, which waits for its micro-batch's
// copy) to the end of the last compute or P2P event, over every device (the
// trace counts each device's times from its stream's origin at the step's
// start). 0 when the trace has no compute event.
double device_span_ms(const pw::Trace& t) {
  double first = -1;
  for (const auto& device : t.compute)
    for (const pw::TraceEvent& e : device) first = first < 0 ? e.start : std::min(first, e.start);
  return first < 0 ? 0.0 : (pw::makespan(t) - first) * 1e-3;
}

// GEMM floating-point operations of one training step of an MLP of `layers`
// square layers of `hidden` features on `rows` samples.
double step_flops(int layers, int hidden, int rows) {
  const double gemm = 2.0 * rows * static_cast<double>(hidden) * hidden;
  return gemm * (3.0 * layers - 1.0);
}

// The GEMMs of one step on cuBLAS alone (operands prepared in the GEMM's input
// type), per micro-batch and layer: forward, weight gradient, input gradient
// (none for the first layer). Returns the median milliseconds per step.
double cublas_step_ms(int gpu, pc::MathMode math, int layers, int hidden, int rows, int micro_batches, int reps) {
  const pc::DeviceGuard guard(gpu);
  pc::Stream stream;
  pc::CublasHandle handle(stream.get());
  pc::DeviceArray<unsigned char> workspace(32u << 20);
  PIPEWEAVE_CHECK_CUBLAS(cublasSetWorkspace(handle.get(), workspace.data(), workspace.size()));
  const int mb = rows / micro_batches;
  const std::size_t act = static_cast<std::size_t>(mb) * hidden, weight = static_cast<std::size_t>(hidden) * hidden;
  const bool bf16 = math == pc::MathMode::kBf16;
  const std::size_t elem = pw::bench::operand_bytes(math);
  pc::DeviceArray<unsigned char> x(act * elem), w(weight * elem), dy(act * elem), dx(act * 4), y(act * 4), dw(weight * 4);
  // Random operands (bench/operands.hpp), as in the pipelined run: not zeros.
  std::uint64_t seed = 29;
  for (pc::DeviceArray<unsigned char>* operand : {&x, &w, &dy}) {
    const std::vector<unsigned char> host = pw::bench::random_operand(operand->bytes() / elem, math, seed++);
    PIPEWEAVE_CHECK_CUDA(cudaMemcpy(operand->data(), host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  PIPEWEAVE_CHECK_CUDA(cudaMemsetAsync(dw.data(), 0, dw.bytes(), stream.get()));
  auto gemm = [&](bool ta, bool tb, int m, int n, int k, const void* a, int lda, const void* b, int ldb, float beta,
                  void* c, int ldc) {
    if (bf16)
      pc::gemm_bf16_fp32(handle.get(), ta, tb, m, n, k, 1.0f, static_cast<const __nv_bfloat16*>(a), lda,
                         static_cast<const __nv_bfloat16*>(b), ldb, beta, static_cast<float*>(c), ldc);
    else
      pc::gemm(handle.get(), math, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  };
  auto step = [&] {
    for (int m = 0; m < micro_batches; ++m)
      for (int l = 0; l < layers; ++l) {
        gemm(false, true, mb, hidden, hidden, x.data(), hidden, w.data(), hidden, 0.0f, y.data(), hidden);
        gemm(true, false, hidden, hidden, mb, dy.data(), hidden, x.data(), hidden, 1.0f, dw.data(), hidden);
        if (l > 0) gemm(false, false, mb, hidden, hidden, dy.data(), hidden, w.data(), hidden, 0.0f, dx.data(), hidden);
      }
  };
  step();  // warm-up (and cuBLAS's choice of kernels)
  pc::Event start(true), end(true);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    start.record(stream.get());
    step();
    end.record(stream.get());
    end.synchronize();
    ms.push_back(pc::Event::elapsed_ms(start, end));
  }
  return pw::tool::median(ms);
}

// The row's cells, in the order of the report's columns.
std::vector<pw::tool::Cell> cells(const Row& r) {
  auto optional = [](double v) { return v < 0 ? pw::tool::Cell{} : pw::tool::Cell{v}; };
  const bool baseline = r.schedule == "cublas";
  return {r.schedule, r.P, r.V, r.M, r.D, r.hidden, r.layers, r.rows, r.dtype, r.acts, optional(r.handoff_kib),
          r.transport, r.gpus, r.step_ms,
          r.seq_ms, r.tflops, optional(r.peak_pct), optional(r.device_ms), optional(r.tflops_dev),
          optional(r.peak_pct_dev), optional(r.bubble_measured), optional(r.bubble_ideal), optional(r.bubble_sim),
          optional(r.overhead), optional(r.vs_plain), optional(r.exposed), optional(r.exposed_sim),
          optional(r.hidden_share), optional(r.hidden_share_sim),
          baseline ? pw::tool::Cell{} : pw::tool::Cell{r.wrong},
          std::string(r.bitwise ? "true" : "false")};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step time, TFLOP/s and percent of peak of pipelined training on GPUs, with the measured and the ideal "
               "bubble, the overhead against the step's kernel time, a correctness column and a cuBLAS baseline."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::string schedules = pw::tool::join_words(pw::tool::bench_default_schedules(), ",", ","), micro_batches = "8",
              hiddens = "4096";
  const auto maths = pw::tool::row_names(pc::kMathModes, [](pc::MathMode m) { return pc::math_name(m); });
  std::string dtypes = pw::tool::join_words(maths, ",", ",");
  std::vector<std::string> activation_names{std::string(pw::dtype_name(pw::DType::kF32))};
  const auto floating = pw::tool::dtype_names(true);
  // The transports the CUDA backend's devices of one process take.
  std::vector<std::string> transports;
  for (const pw::TransportRow& r : pw::kTransportRows)
    if (r.gpu) transports.emplace_back(r.name);
  std::string transport(pw::transport_name(pw::TransportKind::kAuto)), trace_dir, json_file;
  int devices = 4, chunks = 2, layers = 16, batch = 4096, warmup = 2, iters = 5, timeout_ms = 60000, replicas = 1;
  double peak_override = 0;
  bool json = false, overlapped = false, offloaded = false;
  app.add_option("--schedules", schedules,
                 "Comma-separated: " + pw::tool::join_words(pw::tool::schedule_names(), ", ") + " (default " +
                     pw::tool::join_words(pw::tool::bench_default_schedules(), ", ") + ")");
  app.add_flag("--overlap", overlapped,
               "Also run every configuration overlapped (overlap(); rows <schedule>+overlap); vs_plain = the plain "
               "row's step time / the overlapped row's");
  app.add_flag("--offload", offloaded,
               "Also run every configuration with every stage offloaded (with_offload(); rows <schedule>+offload); "
               "vs_plain = the plain row's step time / the offloaded row's");
  app.add_option("--devices", devices, "Pipeline devices P (default 4)")->check(CLI::Range(1, pc::kMaxCudaDevices));
  app.add_option("--chunks", chunks,
                 "Chunks per device V of " + pw::tool::any_chunks_kinds() + " (default 2; " +
                     pw::tool::two_chunks_kinds() + " have 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--replicas", replicas,
                 "Data-parallel replicas D of the P-device pipeline (default 1): P x D device threads on the GPUs, "
                 "each replica on its shard of the batch; rows add the exposed reduction and its share beside compute")
      ->check(CLI::Range(1, pc::kMaxCudaDevices));
  app.add_option("--micro-batches", micro_batches, "Comma-separated M values (default 8)");
  app.add_option("--hidden", hiddens, "Comma-separated hidden sizes (default 4096)");
  app.add_option("--layers", layers, "Layers, a multiple of P*V (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--batch", batch, "Samples per step, a multiple of every D x M (default 4096)")->check(CLI::Range(1, 1 << 24));
  app.add_option("--dtypes", dtypes,
                 "Comma-separated GEMM arithmetic: " + pw::tool::join_words(maths, ", ") + " (default all of them)");
  app.add_option("--activations", activation_names,
                 "Comma-separated dtypes of the activations (between layers and handed between devices), " +
                     pw::tool::join_words(floating, ", ") + " (default fp32)")
      ->delimiter(',')
      ->check(CLI::IsMember(floating));
  app.add_option("--transport", transport, pw::tool::join_words(transports, " or ") + " (default " + transport + ")")
      ->check(CLI::IsMember(transports));
  app.add_option("--warmup", warmup, "Untimed steps first (default 2)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed steps (default 5)")->check(CLI::Range(1, 100000));
  app.add_option("--timeout-ms", timeout_ms, "Longest wait before it is an error (default 60000)")->check(CLI::Range(1, 3600000));
  app.add_option("--peak-tflops", peak_override, "Dense peak TFLOP/s of one GPU for the dtype(s) run; default: from "
                                                 "a table by GPU name (H100/H200 SXM, H100 PCIe, A100)")
      ->check(CLI::PositiveNumber);
  app.add_option("--trace-dir", trace_dir, "Write each configuration's measured trace (CSV, Chrome JSON, SVG) there");
  app.add_flag("--json", json, "Print the rows as JSON instead of the table");
  app.add_option("--json-file", json_file, "Also write the rows as JSON to this file");
  if (const auto status = pw::tool::parse(app, argc, argv, "pipeline_gpu")) return *status;
  std::vector<pw::ScheduleKind> kinds;
  std::vector<int> ms, hs;
  std::vector<pc::MathMode> modes;
  try {
    for (const std::string& s : pw::tool::split(schedules)) {
      const auto kind = pw::parse_schedule(s);
      if (!kind)
        throw pw::tool::BadArgument("--schedules", s + " is not a schedule: " +
                                                       pw::tool::join_words(pw::tool::schedule_names(), ", ", ", "));
      kinds.push_back(*kind);
    }
    for (const std::string& s : pw::tool::split(dtypes)) {
      const auto m = pc::parse_math(s);
      if (!m) throw pw::tool::BadArgument("--dtypes", s + " is not " + pw::tool::join_words(maths, " or "));
      modes.push_back(*m);
    }
    ms = pw::tool::int_list(micro_batches, "--micro-batches", 1, 1 << 24);
    hs = pw::tool::int_list(hiddens, "--hidden", 1, pw::kMaxWidth);
    if (kinds.empty() || modes.empty()) throw pw::tool::BadArgument("lists", "every list needs at least one value");
  } catch (const pw::tool::BadArgument& e) {
    return pw::tool::usage_error("pipeline_gpu", e.what());
  }
  if (pc::gpu_count() == 0) {
    std::cerr << "pipeline_gpu: no GPU is visible\n";
    return 77;
  }

  std::vector<Row> rows;
  std::string device_name;
  Peak peak;
  try {
    cudaDeviceProp prop{};
    PIPEWEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    device_name = prop.name;
    peak = peak_of(device_name);
    if (peak_override > 0) peak = {peak_override, peak_override, peak_override};
    const pw::OptimizerConfig opt{pw::OptimizerKind::kSgd, 1e-4f, 0.9f};
    std::set<std::tuple<int, int, int>> baselines_done;
    for (int hidden : hs)
      for (pc::MathMode math : modes)
      for (const std::string& acts : activation_names) {
        pw::MlpSpec spec = pw::MlpSpec::uniform(layers, hidden, hidden, hidden, 1);
        spec.dtype = *pw::parse_dtype(acts);
        // Random inputs and targets: the benchmark measures speed and agreement with
        // the sequential run, and a teacher network on the host would take long here.
        pw::RegressionTask task;
        task.rows = batch;
        task.inputs.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(hidden));
        task.targets.resize(task.inputs.size());
        pw::Rng rng(17);
        for (float& v : task.inputs) v = rng.uniform(-1.0f, 1.0f);
        for (float& v : task.targets) v = rng.uniform(-1.0f, 1.0f);
        // Page-locked (train_step uploads the whole batch from the host in every step),
        // so that the uploads run at the link's speed (pageable memory would be staged
        // through a bounce buffer); unpinned before `task` dies.
        const PinnedHost pin_inputs(task.inputs), pin_targets(task.targets);
        const pw::HostModel init = pw::init_mlp(spec);
        for (pw::ScheduleKind kind : kinds)
          for (int M : ms) {
            // The v placement has two chunks per device; the other kinds with chunks take --chunks.
            const int V = pw::placement_of(kind) == pw::Placement::kV ? 2 : pw::default_chunks(kind) > 1 ? chunks : 1;
            const std::string kind_name(pw::schedule_name(kind));
            pw::Program plain;
            try {
              if (batch % (replicas * M) != 0 || layers % (devices * V) != 0)
                throw pw::Error("the batch or the layers do not split evenly");
              plain = pw::make_schedule(kind, devices, V, M);
            } catch (const pw::Error& e) {  // a shape the schedule does not take
              std::fprintf(stderr, "pipeline_gpu: skipping %s P=%d V=%d M=%d: %s\n", kind_name.c_str(), devices, V, M,
                           e.what());
              continue;
            }
            double plain_ms = -1;
            enum class Variant { kPlain, kOverlap, kOffload };
            for (const Variant variant : {Variant::kPlain, Variant::kOverlap, Variant::kOffload}) {
              const bool pairs = variant == Variant::kOverlap;
              if ((pairs && !overlapped) || (variant == Variant::kOffload && !offloaded)) continue;
              pw::Program program = pairs                          ? pw::overlap(plain)
                                    : variant == Variant::kOffload ? pw::with_offload(plain, pw::all_stages(plain.shape))
                                                                   : plain;
              if (replicas > 1) program = pw::with_grad_reduce(program);  // after overlap(), as the runtime takes it
              if (pairs && !pw::has_pairs(program)) {
                std::fprintf(stderr, "pipeline_gpu: %s M=%d has no overlapped pairs\n", kind_name.c_str(), M);
                continue;
              }
              if (variant == Variant::kOffload && pw::offloads(program) == 0) {
                std::fprintf(stderr, "pipeline_gpu: %s M=%d keeps no stash long enough to offload\n",
                             kind_name.c_str(), M);
                continue;
              }
              const std::string sname =
                  kind_name + (pairs ? "+overlap" : variant == Variant::kOffload ? "+offload" : "");
              std::fprintf(stderr, "pipeline_gpu: %s P=%d V=%d M=%d D=%d hidden=%d layers=%d %s, %s activations\n",
                           sname.c_str(), devices, V, M, replicas, hidden, layers,
                           std::string(pc::math_name(math)).c_str(), acts.c_str());
              pc::CudaOptions options;
              options.transport = *pw::parse_transport(transport);
              options.math = math;
              options.gpus = pc::device_gpus(devices * replicas, options);
              const int gpus = static_cast<int>(std::set<int>(options.gpus.begin(), options.gpus.end()).size());
              pw::PipelineOptions run{batch, opt, std::chrono::milliseconds(timeout_ms)};
              run.replicas = replicas;
              auto pipe = pw::make_mlp_pipeline(program, spec, init, run, options);
              auto seq = pc::make_sequential(options.gpus.front(), math, spec, init, batch, M * replicas, opt);
              seq->set_gradient_order(pw::gradient_order(program));  // the program's order of micro-batches
              seq->set_replicas(replicas);  // each replica's sum, then the replicas in order
              for (int i = 0; i < warmup; ++i) {
                pipe->train_step(task.inputs, task.targets);
                seq->train_step(task.inputs, task.targets);
              }
              std::vector<double> pipe_ms, seq_ms, device_ms, bubble, exposed, exposed_sim, hidden_share, hidden_sim;
              for (int i = 0; i < iters; ++i) {
                const auto t0 = Clock::now();
                pipe->train_step(task.inputs, task.targets);
                const auto t1 = Clock::now();
                seq->train_step(task.inputs, task.targets);
                const auto t2 = Clock::now();
                pipe_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
                seq_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
                bubble.push_back(pw::bubble_ratio(pipe->trace()));
                device_ms.push_back(device_span_ms(pipe->trace()));
                if (replicas > 1) {  // the reductions, measured and as the simulator has them with this step's costs
                  const pw::Trace simulated = pw::simulate(program, pw::fit_cost_model(pipe->trace()));
                  exposed.push_back(pw::max_exposed_reduction(pipe->trace()) / 1e3);
                  exposed_sim.push_back(pw::max_exposed_reduction(simulated) / 1e3);
                  hidden_share.push_back(pw::hidden_reduction_share(pipe->trace()));
                  hidden_sim.push_back(pw::hidden_reduction_share(simulated));
                }
              }
              Row r;
              r.schedule = sname;
              r.dtype = std::string(pc::math_name(math));
              r.acts = acts;
              std::size_t handoff = 0;
              for (const pw::Message& m : pipe->messages(0)) handoff = std::max(handoff, m.bytes);
              if (handoff > 0) r.handoff_kib = static_cast<double>(handoff) / 1024.0;
              r.transport = std::string(pw::transport_name(pc::transport_of(*pipe)));  // the one it uses
              r.P = devices;
              r.V = V;
              r.M = M;
              r.D = replicas;
              r.hidden = hidden;
              r.layers = layers;
              r.rows = batch / (replicas * M);
              r.gpus = gpus;
              if (replicas > 1) {
                r.exposed = pw::tool::median(exposed);
                r.exposed_sim = pw::tool::median(exposed_sim);
                r.hidden_share = pw::tool::median(hidden_share);
                r.hidden_share_sim = pw::tool::median(hidden_sim);
              }
              r.step_ms = pw::tool::median(pipe_ms);
              r.seq_ms = pw::tool::median(seq_ms);
              r.tflops = step_flops(layers, hidden, batch) / (r.step_ms * 1e-3) / 1e12;
              if (peak.of(math) > 0) r.peak_pct = 100.0 * r.tflops / (peak.of(math) * gpus);
              r.device_ms = pw::tool::median(device_ms);
              if (r.device_ms > 0) {
                r.tflops_dev = step_flops(layers, hidden, batch) / (r.device_ms * 1e-3) / 1e12;
                if (peak.of(math) > 0) r.peak_pct_dev = 100.0 * r.tflops_dev / (peak.of(math) * gpus);
              }
              r.bubble_measured = pw::tool::median(bubble);
              if (!pairs && pw::closed_form_error(program.shape).empty())
                r.bubble_ideal = pw::closed_form_bubble_ratio(program.shape);
              r.bubble_sim = pw::bubble_ratio(pw::simulate(pw::lower(program), pw::CostModel{}));
              r.overhead = r.step_ms * gpus / r.seq_ms - 1.0;
              const pw::HostModel got = pw::download_weights(*pipe, spec), want = seq->weights();
              r.bitwise = got == want;
              r.wrong = pw::tool::count_different(got.layers, want.layers, 1e-6);
              if (!trace_dir.empty()) {
                char base[160];
                std::snprintf(base, sizeof base, "%s/trace_%s_P%d_V%d_M%d_h%d_%s_%s", trace_dir.c_str(),
                              sname.c_str(), devices, V, M, hidden, r.dtype.c_str(), acts.c_str());
                char title[240];
                std::snprintf(title, sizeof title,
                              "%s, P=%d V=%d M=%d, %d layers of %d, %s GEMMs, %s activations, %s on %s (measured)",
                              sname.c_str(), devices, V, M, layers, hidden, r.dtype.c_str(), acts.c_str(),
                              r.transport.c_str(), device_name.c_str());
                for (const char* ext : {".csv", ".json", ".svg"}) pw::tool::write_trace(base + std::string(ext), pipe->trace(), title);
              }
              if (variant == Variant::kPlain)
                plain_ms = r.step_ms;
              else
                r.vs_plain = plain_ms / r.step_ms;
              rows.push_back(r);
            }
          }
        // The cuBLAS baseline of the same shapes (one per M), on the first GPU.
        for (int M : ms) {
          if (batch % M != 0 || !baselines_done.insert({hidden, static_cast<int>(math), M}).second) continue;
          std::fprintf(stderr, "pipeline_gpu: cublas baseline M=%d hidden=%d %s\n", M, hidden,
                       std::string(pc::math_name(math)).c_str());
          Row b;
          b.schedule = "cublas";
          b.dtype = std::string(pc::math_name(math));
          b.transport = "-";
          b.M = M;
          b.hidden = hidden;
          b.layers = layers;
          b.rows = batch / M;
          // Device time (CUDA events around the GEMMs): every time column is that time.
          b.step_ms = cublas_step_ms(0, math, layers, hidden, batch, M, std::max(3, iters));
          b.seq_ms = b.device_ms = b.step_ms;
          b.tflops = b.tflops_dev = step_flops(layers, hidden, batch) / (b.step_ms * 1e-3) / 1e12;
          if (peak.of(math) > 0) b.peak_pct = b.peak_pct_dev = 100.0 * b.tflops / peak.of(math);
          rows.push_back(b);
        }
      }
  } catch (const std::exception& e) {
    std::cerr << "pipeline_gpu: " << e.what() << "\n";
    return 1;
  }

  long long wrong = 0;
  std::vector<pw::tool::Column> columns = pw::tool::schedule_columns(overlapped || offloaded ? 22 : 14);
  columns.insert(columns.end(),
                 {{"D", "", "replicas", 3}, {"hidden", "", "hidden", 6}, {"layers", "", "layers", 6},
                  {"mb_rows", "rows", "micro_batch_rows", 7, -1, false},
                  {"dtype", "", "dtype", 5}, {"acts", "", "activations", 5},
                  {"handoff_KiB", "KiB", "handoff_kib", 11, 1}, {"link", "", "transport", 8}, {"gpus", "", "gpus", 4},
                  {"step_ms", "ms", "step_ms", 10, 3}, {"seq_ms", "ms", "sequential_ms", 10, 3},
                  {"TFLOP/s", "", "tflops", 8, 1}, {"%peak", "%", "peak_percent", 6, 1},
                  {"dev_ms", "ms", "device_ms", 9, 3}, {"TFLOP/s_d", "", "tflops_dev", 9, 1},
                  {"%peak_d", "%", "peak_percent_dev", 7, 1},
                  {"bub_meas", "", "bubble_measured", 8, 3}, {"bub_ideal", "", "bubble_ideal", 9, 3},
                  {"bub_sim", "", "bubble_simulated", 8, 3}, {"overhead", "", "overhead", 8, 3},
                  {"vs_plain", "x", "vs_plain", 8, 2}, {"exp_meas", "ms", "exposed_reduction_ms", 8, 3},
                  {"exp_sim", "ms", "exposed_reduction_sim_ms", 8, 3}, {"hid_meas", "", "hidden_reduction_share", 8, 2},
                  {"hid_sim", "", "hidden_reduction_share_sim", 8, 2},
                  {"#wrong", "values", "wrong", 7}, {"bitwise", "", "bitwise", 7, -1, false}});
  pw::tool::Report report(std::move(columns));
  for (const Row& r : rows) {
    wrong += r.wrong;
    report.add(cells(r));
  }
  char peaks[160];
  std::snprintf(peaks, sizeof peaks, "{\"fp32\": %.1f, \"tf32\": %.1f, \"bf16\": %.1f}", peak.fp32, peak.tf32, peak.bf16);
  const std::string json_text = report.json("pipeline_gpu", {{"device", pw::tool::json_string(device_name)},
                                                             {"gpus_visible", std::to_string(pc::gpu_count())},
                                                             {"batch", std::to_string(batch)},
                                                             {"warmup", std::to_string(warmup)},
                                                             {"iters", std::to_string(iters)},
                                                             {"peak_tflops", peaks}});
  if (!json_file.empty()) {
    std::ofstream out(json_file);
    out << json_text;
    if (!out) {
      std::cerr << "pipeline_gpu: cannot write " << json_file << "\n";
      return 1;
    }
  }
  if (json) {
    std::fputs(json_text.c_str(), stdout);
  } else {
    auto num = [](double v) {
      char t[32] = "-";
      if (v > 0) std::snprintf(t, sizeof t, "%.1f", v);
      return std::string(t);
    };
    std::fputs(report
                   .text({"pipeline_gpu: pipelined training steps on " + device_name + " (" +
                              std::to_string(pc::gpu_count()) + " visible), batch " + std::to_string(batch) + ", " +
                              std::to_string(warmup) + " warm-up + " + std::to_string(iters) + " timed steps",
                          "dense peak TFLOP/s per GPU: fp32 " + num(peak.fp32) + ", tf32 " + num(peak.tf32) +
                              ", bf16 " + num(peak.bf16) + (peak.bf16 > 0 ? "" : " (unknown GPU: give --peak-tflops)"),
                          "step_ms, seq_ms: wall clock of train_step (batch uploaded from page-locked memory, kernels, "
                          "update); dev_ms: the step's span on the GPUs, first forward to last kernel or transfer "
                          "(CUDA events);",
                          "TFLOP/s, TFLOP/s_d: GEMM work of the step / median step_ms, dev_ms; %peak, %peak_d of the "
                          "GPUs in use; bubbles as (makespan - busiest device's compute) / that compute:",
                          "  meas from the CUDA-event trace, ideal the closed form (P-1)/(V*M) where one exists, sim "
                          "the simulator's replay of the lowered steps (B = 2F, a pair F + B); overhead = step x GPUs "
                          "/ sequential step - 1;",
                          "  dtype: the GEMMs' arithmetic; acts (--activations): the dtype of the activations between "
                          "layers and devices; handoff_KiB: one hand-over between devices;",
                          "  vs_plain (--overlap, --offload): the plain row's step time / the overlapped or offloaded "
                          "row's;",
                          "  D (--replicas): data-parallel replicas; exp_meas, exp_sim: the step's wait for the "
                          "reductions after a device's last compute (ms, most of any device), measured and simulated "
                          "with the step's costs; hid_meas, hid_sim: their share beside compute;",
                          "  #wrong: parameters off the sequential GPU run by more than 1e-6; cublas rows: the step's "
                          "GEMMs on cuBLAS alone (device time, CUDA events)",
                          ""},
                         pw::tool::wrong_footer("parameters off the sequential GPU run, all rows", wrong))
                   .c_str(),
               stdout);
  }
  return wrong == 0 ? 0 : 1;
}
