// Training through the pipeline equals sequential training, bit for bit, for
// GPipe, 1F1B, interleaved 1F1B, the zero-bubble schedules, DualPipeV and
// overlapped programs (a forward and a backward at once) over a grid of
// (P, V, M), with even and uneven layer allocations, looped BFS against a
// reference in reverse micro-batch order; the trace records
// every action; the kept activations peak where the program says; a step after
// the first allocates nothing; the host reads device memory only after waiting
// for the device through synchronize().
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <numeric>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/synthesize.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"

// Counts the host allocations of this test program while `counting` is set.
namespace {
std::atomic<bool> counting{false};
std::atomic<long long> allocations{0};
}  // namespace

// The replacements pair malloc with free; GCC cannot see that they match.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (Catch2 uses them), so that every block these deletes free
// came from malloc: with only the plain form replaced, AddressSanitizer's own
// nothrow new met this free.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

using namespace pipeweave;

namespace {

struct Case {
  ScheduleKind kind;
  int P, V, M;
  bool overlapped = false;               // overlap() of the kind's program
  std::vector<int> layers_per_stage{};  // the model's layers of each virtual stage (empty: 2 each)
  bool reduced = false;                  // with_grad_reduce() of it (after overlap())
  int replicas = 1;                      // data-parallel replicas D (with_grad_reduce() where D > 1)
  DType dtype = DType::kF32;             // of the activations and their gradients (MlpSpec::dtype)
  // Recomputation (after overlap()): 0 none; 1 every micro-batch of every stage (with_recompute()); 2 what
  // half (or 3/4, or 9/10) of the program's largest peak needs (recompute_to_fit()).
  int recompute = 0;
  bool offloaded = false;  // with_offload() of every stage (after overlap())
  // > 0: instead of the kind's program, synthesize()'s within this cap, offload allowed, the last stage 1.3 times
  // slower and copies as long as a forward.
  double synthesized_cap = 0;
  // With synthesized_cap: the cap is this share of 1F1B's peak under the MLP's memory model in bytes
  // (mlp_memory_model(), micro-batches of 2 samples), which synthesis counts in; copies of stage 0's stash take as
  // long as a forward.
  bool cap_in_bytes = false;

  // The model train_both() trains.
  MlpSpec spec() const {
    int layers = layers_per_stage.empty() ? 2 * P * V : 0;
    for (int n : layers_per_stage) layers += n;
    MlpSpec s = MlpSpec::uniform(layers, 5, 6, 3, 17);
    s.layers_per_stage = layers_per_stage;
    s.dtype = dtype;
    return s;
  }
  // The memory model of spec() in bytes, for micro-batches of 2 samples.
  MemoryModel bytes() const { return mlp_memory_model(spec(), {ScheduleKind::kAuto, P, V, M}, 2); }
  // The cap synthesized() keeps, in the unit of its memory model.
  double cap() const {
    if (!cap_in_bytes) return synthesized_cap;
    const std::vector<double> peaks = peak_memory(make_schedule(ScheduleKind::kOneFOneB, P, 1, M), bytes());
    return synthesized_cap * *std::max_element(peaks.begin(), peaks.end());
  }

  Synthesis synthesized() const {
    CostModel cost;
    cost.stage_costs.assign(static_cast<std::size_t>(P * V), StageCost{1, 2, 1, 1});
    cost.stage_costs.back() = {1.3, 2.6, 1.3, 1.3};
    cost.copy_bandwidth = 1;
    if (cap_in_bytes) {
      cost.memory = bytes();
      cost.copy_bandwidth = cost.memory.of(0).stash;
    }
    return synthesize({ScheduleKind::kAuto, P, V, M}, cost, {.memory = cap(), .offload = true});
  }

  Program program() const {
    if (synthesized_cap > 0) return synthesized().program;
    const Program p = make_schedule(kind, P, V, M);
    Program q = overlapped ? overlap(p) : p;
    if (recompute == 1) q = with_recompute(q, all_stages(q.shape));
    if (offloaded) q = with_offload(q, all_stages(q.shape));
    if (recompute == 2) {  // the lowest of these caps the order meets (a kept gradient is never recomputed)
      const std::vector<double> peaks = peak_memory(q);
      const double peak = *std::max_element(peaks.begin(), peaks.end());
      for (const double share : {0.5, 0.75, 0.9})
        if (const std::optional<Program> fitted = recompute_to_fit(q, {}, share * peak); fitted) {
          q = *fitted;
          break;
        }
    }
    return reduced || replicas > 1 ? with_grad_reduce(q) : q;
  }
};

std::string describe(const Case& c) {
  std::string out = std::string(schedule_name(c.kind)) + (c.overlapped ? "+overlap" : "") +
                    (c.recompute == 1 ? "+recompute all" : c.recompute == 2 ? "+recompute to fit" : "") +
                    (c.offloaded ? "+offload all" : "") +
                    (c.synthesized_cap > 0 ? " synthesized within " + std::to_string(c.synthesized_cap) +
                                                      (c.cap_in_bytes ? " of 1F1B's peak bytes" : "")
                                                : "") +
                    " P=" + std::to_string(c.P) +
                    " V=" + std::to_string(c.V) + " M=" + std::to_string(c.M) + " D=" + std::to_string(c.replicas) +
                    " " + std::string(dtype_name(c.dtype));
  for (std::size_t s = 0; s < c.layers_per_stage.size(); ++s)
    out += (s == 0 ? " layers per stage " : ",") + std::to_string(c.layers_per_stage[s]);
  return out;
}

// Trains `steps` steps both ways; returns the pipeline for further checks. Checks too the bytes each device held
// for what it kept, measured from its buffers: the peak of the MLP's memory model in bytes.
std::unique_ptr<cpu::CpuMlpPipeline> train_both(const Case& c, const OptimizerConfig& opt, int steps,
                                                 int hidden = 6, int rows_per_mb = 2) {
  MlpSpec spec = c.spec();
  for (std::size_t i = 1; i + 1 < spec.widths.size(); ++i) spec.widths[i] = hidden;
  const int rows = rows_per_mb * c.M * c.replicas;
  const RegressionTask task = make_regression_task(spec, rows, 5);
  const HostModel init = init_mlp(spec);
  const Program program = c.program();
  PipelineOptions options{rows, opt};
  options.replicas = c.replicas;
  auto pipe = make_mlp_pipeline(program, spec, init, options);
  SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, spec, init, rows, c.M * c.replicas, opt);
  seq.set_replicas(c.replicas);                     // each replica's sum, then the replicas in order
  seq.set_gradient_order(gradient_order(program));  // reverse for looped BFS
  for (int s = 0; s < steps; ++s) {
    const double a = pipe->train_step(task.inputs, task.targets).loss;
    const double b = seq.train_step(task.inputs, task.targets);
    CHECK(a == b);
  }
  const HostModel got = download_weights(*pipe, spec), want = seq.weights();
  CHECK(max_abs_difference(got, want) == 0.0);
  CHECK(got == want);
  CHECK_FALSE(got == init);  // training changed something
  const std::vector<double> bytes = peak_memory(program, mlp_memory_model(spec, program.shape, rows_per_mb));
  const std::vector<double>& held = pipe->trace().peak_bytes;
  if (mlp_memory_model_exact(program)) {
    CHECK(held == bytes);
  } else {  // more, by the y left on the device
    REQUIRE(held.size() == bytes.size());
    for (std::size_t d = 0; d < held.size(); ++d) CHECK(held[d] >= bytes[d]);
  }
  return pipe;
}

}  // namespace

TEST_CASE("pipelined training equals sequential training bit for bit", "[runtime]") {
  const std::vector<Case> grid = {
      {ScheduleKind::kGPipe, 1, 1, 1},           {ScheduleKind::kGPipe, 2, 1, 1},
      {ScheduleKind::kGPipe, 2, 1, 4},           {ScheduleKind::kGPipe, 3, 1, 5},
      {ScheduleKind::kOneFOneB, 2, 1, 2},        {ScheduleKind::kOneFOneB, 2, 1, 5},
      {ScheduleKind::kOneFOneB, 4, 1, 8},        {ScheduleKind::kOneFOneB, 4, 1, 2},
      {ScheduleKind::kInterleaved1F1B, 2, 2, 2}, {ScheduleKind::kInterleaved1F1B, 2, 2, 4},
      {ScheduleKind::kInterleaved1F1B, 2, 3, 6}, {ScheduleKind::kInterleaved1F1B, 3, 2, 3},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8},  // the seed example
      {ScheduleKind::kInterleaved1F1B, 1, 3, 2}, {ScheduleKind::kInterleaved1F1B, 2, 1, 4},
  };
  const std::vector<OptimizerConfig> optimizers = {{OptimizerKind::kSgd, 0.01f, 0.0f},
                                                   {OptimizerKind::kSgd, 0.01f, 0.9f},
                                                   {OptimizerKind::kAdam, 0.01f}};
  for (const Case& c : grid) {
    for (const OptimizerConfig& opt : optimizers) {
      INFO(schedule_name(c.kind) << " P=" << c.P << " V=" << c.V << " M=" << c.M << " "
                                 << optimizer_name(opt.kind) << " momentum " << opt.momentum);
      train_both(c, opt, 2);
    }
  }
}

TEST_CASE("the zero-bubble schedules and looped BFS train like sequential training bit for bit", "[runtime]") {
  // Split backwards (I, W) and the v placement; looped BFS adds each chunk's
  // gradients in reverse micro-batch order, and the reference follows it.
  const std::vector<Case> grid = {
      {ScheduleKind::kZeroBubbleH1, 2, 1, 2},          {ScheduleKind::kZeroBubbleH1, 2, 1, 4},
      {ScheduleKind::kZeroBubbleH1, 3, 1, 6},          {ScheduleKind::kZeroBubbleH1, 4, 1, 8},
      {ScheduleKind::kInterleavedZeroBubble, 2, 2, 4}, {ScheduleKind::kInterleavedZeroBubble, 3, 2, 6},
      {ScheduleKind::kInterleavedZeroBubble, 4, 2, 8},  // the seed shape
      {ScheduleKind::kZeroBubbleV, 2, 2, 2},           {ScheduleKind::kZeroBubbleV, 2, 2, 4},
      {ScheduleKind::kZeroBubbleV, 3, 2, 5},           {ScheduleKind::kZeroBubbleV, 4, 2, 8},
      {ScheduleKind::kLoopedBFS, 2, 2, 3},             {ScheduleKind::kLoopedBFS, 4, 2, 8},
  };
  const std::vector<OptimizerConfig> optimizers = {{OptimizerKind::kSgd, 0.01f, 0.9f}, {OptimizerKind::kAdam, 0.01f}};
  for (const Case& c : grid) {
    CHECK(gradient_order(make_schedule(c.kind, c.P, c.V, c.M)) ==
          (c.kind == ScheduleKind::kLoopedBFS ? GradientOrder::kDecreasing : GradientOrder::kIncreasing));
    for (const OptimizerConfig& opt : optimizers) {
      INFO(schedule_name(c.kind) << " P=" << c.P << " V=" << c.V << " M=" << c.M << " "
                                 << optimizer_name(opt.kind));
      train_both(c, opt, 2);
    }
  }
}

TEST_CASE("overlapped pairs and DualPipeV train like sequential training bit for bit", "[runtime]") {
  // A pair's forward and backward run at once on two threads of the device.
  const std::vector<Case> grid = {
      {ScheduleKind::kOneFOneB, 2, 1, 4, true},          {ScheduleKind::kOneFOneB, 4, 1, 8, true},
      {ScheduleKind::kInterleaved1F1B, 1, 2, 4, true},   {ScheduleKind::kInterleaved1F1B, 2, 2, 4, true},
      {ScheduleKind::kInterleaved1F1B, 2, 3, 6, true},   {ScheduleKind::kInterleaved1F1B, 4, 2, 8, true},  // the seed's
      {ScheduleKind::kZeroBubbleH1, 2, 1, 4, true},      {ScheduleKind::kZeroBubbleH1, 4, 1, 8, true},
      {ScheduleKind::kInterleavedZeroBubble, 2, 2, 4, true}, {ScheduleKind::kDualPipeV, 1, 2, 2},
      {ScheduleKind::kDualPipeV, 2, 2, 4},               {ScheduleKind::kDualPipeV, 2, 2, 7},
      {ScheduleKind::kDualPipeV, 3, 2, 6},               {ScheduleKind::kDualPipeV, 4, 2, 8},
  };
  const std::vector<OptimizerConfig> optimizers = {{OptimizerKind::kSgd, 0.01f, 0.9f}, {OptimizerKind::kAdam, 0.01f}};
  for (const Case& c : grid) {
    INFO(describe(c));
    CHECK(has_pairs(c.program()));
    for (const OptimizerConfig& opt : optimizers) {
      INFO(optimizer_name(opt.kind));
      train_both(c, opt, 2);
    }
  }
}

TEST_CASE("bf16 activations: every schedule kind trains like bf16 sequential training bit for bit", "[runtime]") {
  // The tensors between layers are rounded to bf16 and handed between chunks as
  // bf16; the reference, one chunk of every layer, rounds them at the same layers.
  const std::vector<Case> grid = {
      {ScheduleKind::kGPipe, 2, 1, 4},
      {ScheduleKind::kOneFOneB, 4, 1, 8},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8},  // the seed shape
      {ScheduleKind::kLoopedBFS, 2, 2, 3},
      {ScheduleKind::kZeroBubbleH1, 3, 1, 6},
      {ScheduleKind::kInterleavedZeroBubble, 2, 2, 4},
      {ScheduleKind::kZeroBubbleV, 2, 2, 4},
      {ScheduleKind::kDualPipeV, 2, 2, 4},
      {ScheduleKind::kInterleaved1F1B, 2, 2, 4, true},                // overlapped pairs
      {ScheduleKind::kZeroBubbleH1, 2, 1, 4, true},                   // overlapped (F;I) pairs
      {ScheduleKind::kOneFOneB, 2, 1, 4, false, {3, 1}},              // uneven layers
      {ScheduleKind::kInterleaved1F1B, 2, 2, 4, false, {}, false, 2},  // two replicas
      {ScheduleKind::kZeroBubbleV, 2, 2, 2, false, {}, false, 3},      // three replicas, split backwards
  };
  for (Case c : grid) {
    c.dtype = DType::kBF16;
    INFO(describe(c));
    for (const OptimizerConfig& opt : {OptimizerConfig{OptimizerKind::kSgd, 0.01f, 0.9f}, OptimizerConfig{OptimizerKind::kAdam, 0.01f}}) {
      INFO(optimizer_name(opt.kind));
      const auto pipe = train_both(c, opt, 2);
      // Every hand-over is bf16: half the bytes of the same run in fp32.
      for (int d = 0; d < c.P; ++d)
        for (const Message& m : pipe->messages(d)) {
          CHECK(m.dtype == DType::kBF16);
          CHECK(m.bytes == 2 * 6 * static_cast<std::size_t>(2));  // 2 samples of 6 features, 2 bytes each
        }
    }
  }
}

TEST_CASE("bf16 activations round: the run differs from fp32 by bf16's precision, not more", "[runtime]") {
  const Case c{ScheduleKind::kInterleaved1F1B, 2, 2, 4};
  Case b = c;
  b.dtype = DType::kBF16;
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.01f, 0.9f};
  MlpSpec spec = MlpSpec::uniform(8, 5, 6, 3, 17);
  const auto fp32 = train_both(c, opt, 3), bf16 = train_both(b, opt, 3);
  const HostModel a = download_weights(*fp32, spec);
  const double difference = max_abs_difference(a, download_weights(*bf16, spec));
  const double moved = max_abs_difference(a, init_mlp(spec));  // how far fp32 training moved the parameters
  INFO("difference " << difference << ", moved " << moved);
  CHECK(difference > 0.0);            // the rounding happened
  CHECK(difference < 0.05 * moved);  // and is a rounding of 8 significant bits, not a wrong tensor
  for (const Message& m : fp32->messages(0)) CHECK(m.dtype == DType::kF32);
}

TEST_CASE("a program with gradient reductions trains like sequential training with one replica", "[runtime]") {
  // One replica: each R sums a chunk's gradients over itself; the measured trace
  // holds them on the devices' collective lanes, one per chunk.
  const std::vector<Case> grid = {
      {ScheduleKind::kOneFOneB, 2, 1, 4, false, {}, true},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8, true, {}, true},
      {ScheduleKind::kZeroBubbleV, 2, 2, 4, false, {}, true},
      {ScheduleKind::kDualPipeV, 2, 2, 4, false, {}, true},
  };
  for (const Case& c : grid) {
    INFO(describe(c));
    REQUIRE(has_grad_reduce(c.program()));
    const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
    const Trace& t = pipe->trace();
    for (int d = 0; d < c.P; ++d) {
      const auto& lane = t.collective[static_cast<std::size_t>(d)];
      REQUIRE(lane.size() == static_cast<std::size_t>(c.V));
      for (const TraceEvent& e : lane) CHECK(e.action.phase == Phase::kReduce);
      for (const TraceEvent& e : t.compute[static_cast<std::size_t>(d)]) CHECK(e.action.phase != Phase::kReduce);
    }
  }
}

TEST_CASE("data parallelism: P x D devices train like sequential training over the global batch", "[runtime]") {
  // Replica r trains on shard r of the batch; each chunk's R sums its gradients
  // over the replicas in replica order, and the reference adds them so.
  const std::vector<Case> grid = {
      {ScheduleKind::kOneFOneB, 1, 1, 2, false, {}, false, 2},
      {ScheduleKind::kGPipe, 2, 1, 4, false, {}, false, 2},
      {ScheduleKind::kOneFOneB, 4, 1, 4, false, {}, false, 2},
      {ScheduleKind::kInterleaved1F1B, 2, 2, 4, false, {}, false, 3},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8, true, {}, false, 2},  // the seed's, overlapped
      {ScheduleKind::kZeroBubbleH1, 2, 1, 4, false, {}, false, 2},
      {ScheduleKind::kInterleavedZeroBubble, 2, 2, 4, false, {}, false, 3},
      {ScheduleKind::kZeroBubbleV, 2, 2, 4, false, {}, false, 2},
      {ScheduleKind::kDualPipeV, 2, 2, 4, false, {}, false, 2},
      {ScheduleKind::kLoopedBFS, 2, 2, 3, false, {}, false, 2},
  };
  for (const Case& c : grid) {
    INFO(describe(c));
    for (const OptimizerConfig& opt : {OptimizerConfig{OptimizerKind::kSgd, 0.01f, 0.9f}, OptimizerConfig{OptimizerKind::kAdam, 0.01f}}) {
      INFO(optimizer_name(opt.kind));
      const auto pipe = train_both(c, opt, 2);
      CHECK(pipe->replicas() == c.replicas);
      CHECK(pipe->micro_batch_losses().size() == static_cast<std::size_t>(c.M * c.replicas));
    }
  }
}

TEST_CASE("data parallelism refuses what cannot run, by name", "[runtime]") {
  const MlpSpec spec = MlpSpec::uniform(4, 5, 6, 3, 17);
  const HostModel init = init_mlp(spec);
  PipelineOptions options{8, {OptimizerKind::kSgd, 0.01f}};
  options.replicas = 2;
  const Program plain = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  CHECK_THROWS_WITH(make_mlp_pipeline(plain, spec, init, options),
                    Catch::Matchers::Contains("2 replicas, but the program has no gradient reduction R"));
  options.rows = 6;  // 3 samples a replica do not split into 2 micro-batches
  CHECK_THROWS_WITH(make_mlp_pipeline(with_grad_reduce(plain), spec, init, options),
                    Catch::Matchers::Contains("the batch of 3 samples does not split into 2 equal micro-batches"));
  options.rows = 7;
  CHECK_THROWS_WITH(make_mlp_pipeline(with_grad_reduce(plain), spec, init, options),
                    Catch::Matchers::Contains("the batch of 7 samples does not split into 2 equal shards"));
  options.rows = 8;
  options.replicas = 0;
  CHECK_THROWS_WITH(make_mlp_pipeline(with_grad_reduce(plain), spec, init, options),
                    Catch::Matchers::Contains("replicas must be 1..4096, got 0"));
}

namespace {

// A collective of the CPU's kind that counts how the sessions call it: through
// all_reduce_on (in place) or all_reduce (a host copy); the sums are
// ReplicaGroup's either way.
class CountingGroup final : public InPlaceReplicaGroup<cpu::CpuBackend> {
 public:
  CountingGroup(int device, int replicas, std::chrono::milliseconds timeout, std::atomic<int>& on,
                std::atomic<int>& staged)
      : InPlaceReplicaGroup(device, replicas, timeout), on_(on), staged_(staged) {}
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    staged_.fetch_add(1);
    host().all_reduce(replica, chunk, tensors);
  }
  void all_reduce_on(cpu::CpuBackend&, int replica, int chunk, std::span<const std::span<float>> tensors) override {
    on_.fetch_add(1);
    host().all_reduce(replica, chunk, tensors);
  }

 private:
  std::atomic<int>& on_;
  std::atomic<int>& staged_;
};

// The same collective hidden behind the plain interface: the sessions must stage it.
class StagedGroup final : public ReplicaCollective {
 public:
  explicit StagedGroup(std::unique_ptr<CountingGroup> inner) : inner_(std::move(inner)) {}
  int replicas() const override { return inner_->replicas(); }
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    inner_->all_reduce(replica, chunk, tensors);
  }
  bool agree(int replica, bool ok) override { return inner_->agree(replica, ok); }
  void abort(std::string_view reason) noexcept override { inner_->abort(reason); }
  void reset() override { inner_->reset(); }

 private:
  std::unique_ptr<CountingGroup> inner_;
};

}  // namespace

TEST_CASE("in-place and host-staged replica sums train alike bit for bit", "[runtime]") {
  // The CPU pipeline sums each chunk's gradients where they lie; a collective
  // without all_reduce_on gets a host copy. Both give the same parameters and
  // losses, and each R reaches the collective the way its kind says.
  for (const Case& c : {Case{ScheduleKind::kOneFOneB, 2, 1, 4, false, {}, false, 2},
                        Case{ScheduleKind::kInterleaved1F1B, 2, 2, 4, true, {}, false, 3}}) {
    INFO(describe(c));
    const MlpSpec spec = MlpSpec::uniform(2 * c.P * c.V, 5, 6, 3, 17);
    const int rows = 2 * c.M * c.replicas;
    const RegressionTask task = make_regression_task(spec, rows, 5);
    const HostModel init = init_mlp(spec);
    PipelineOptions options{rows, {OptimizerKind::kAdam, 0.01f}};
    options.replicas = c.replicas;
    std::vector<HostModel> weights;
    std::vector<std::vector<float>> losses;
    for (const bool in_place : {true, false}) {
      std::atomic<int> on{0}, staged{0};
      const MakeReplicaCollective make = [&](int d, int D, std::chrono::milliseconds timeout)
          -> std::unique_ptr<ReplicaCollective> {
        auto g = std::make_unique<CountingGroup>(d, D, timeout, on, staged);
        if (in_place) return g;
        return std::make_unique<StagedGroup>(std::move(g));
      };
      std::vector<std::vector<cpu::RendezvousEndpoint>> ends;
      for (int r = 0; r < c.replicas; ++r) ends.push_back(cpu::make_rendezvous(c.P, options.timeout));
      auto pipe = make_mlp_pipeline<cpu::CpuBackend, cpu::RendezvousEndpoint>(
          c.program(), spec, init, std::move(ends), [](int) { return cpu::CpuBackend{}; }, options, make);
      const int steps = 3;
      std::vector<float> l;
      for (int s = 0; s < steps; ++s) {
        l.push_back(static_cast<float>(pipe->train_step(task.inputs, task.targets).loss));
        for (const float x : pipe->micro_batch_losses()) l.push_back(x);
      }
      const int reductions = steps * c.P * c.V * c.replicas;  // one R per device and chunk, on every replica
      CHECK(on.load() == (in_place ? reductions : 0));
      CHECK(staged.load() == (in_place ? 0 : reductions));
      weights.push_back(download_weights(*pipe, spec));
      losses.push_back(std::move(l));
    }
    CHECK(weights[0] == weights[1]);
    CHECK(losses[0] == losses[1]);
    CHECK_FALSE(weights[0] == init);
  }
}

TEST_CASE("uneven layer allocations train like sequential training bit for bit", "[runtime]") {
  // Each virtual stage holds the layers its entry gives it, in model order (the v
  // placement's stages up the devices and back down), under every kind of program.
  const std::vector<Case> grid = {
      {ScheduleKind::kGPipe, 2, 1, 2, false, {5, 1}},
      {ScheduleKind::kOneFOneB, 3, 1, 6, false, {1, 4, 2}},
      {ScheduleKind::kInterleaved1F1B, 2, 2, 4, false, {1, 3, 3, 1}},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8, false, {1, 2, 2, 2, 2, 2, 2, 1}},  // Megatron's first and last
      {ScheduleKind::kInterleaved1F1B, 2, 2, 4, true, {3, 1, 1, 2}},
      {ScheduleKind::kLoopedBFS, 2, 2, 4, false, {2, 1, 2, 1}},
      {ScheduleKind::kZeroBubbleH1, 2, 1, 4, false, {1, 3}},
      {ScheduleKind::kZeroBubbleV, 2, 2, 4, false, {2, 1, 1, 3}},
      {ScheduleKind::kDualPipeV, 2, 2, 4, false, {1, 2, 3, 1}},
  };
  const std::vector<OptimizerConfig> optimizers = {{OptimizerKind::kSgd, 0.01f, 0.9f}, {OptimizerKind::kAdam, 0.01f}};
  for (const Case& c : grid) {
    INFO(describe(c));
    for (const OptimizerConfig& opt : optimizers) {
      INFO(optimizer_name(opt.kind));
      auto pipe = train_both(c, opt, 2);
      // Stage s holds the parameters of the layers after those of the stages before it.
      int layers = 0;
      for (int n : c.layers_per_stage) layers += n;
      const MlpSpec spec = MlpSpec::uniform(layers, 5, 6, 3, 17);
      const std::vector<std::vector<float>> stages = pipe->stage_parameters();
      REQUIRE(stages.size() == c.layers_per_stage.size());
      int first = 0;
      for (std::size_t s = 0; s < stages.size(); ++s) {
        std::size_t want = 0;
        for (int layer = first; layer < first + c.layers_per_stage[s]; ++layer) want += layer_parameters(spec, layer);
        CHECK(stages[s].size() == want);
        first += c.layers_per_stage[s];
      }
    }
  }
  // A list that does not fit the program is refused before any device is built.
  MlpSpec spec = MlpSpec::uniform(6, 5, 6, 3, 17);
  spec.layers_per_stage = {1, 2, 3};
  CHECK_THROWS_WITH(make_mlp_pipeline(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), spec, init_mlp(spec),
                                      {8, OptimizerConfig{}}),
                    "layers per stage has 3 entries; it must have one per virtual stage, devices * chunks (2 * 2 = 4)");
  spec.layers_per_stage = {1, 2, 2, 2};
  CHECK_THROWS_WITH(make_mlp_pipeline(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), spec, init_mlp(spec),
                                      {8, OptimizerConfig{}}),
                    "layers per stage sum to 7; they must sum to the model's layers (6)");
}

TEST_CASE("the reference follows one order of micro-batches, and says when none fits", "[runtime]") {
  // Looped BFS against a reference in increasing order: the sums round differently.
  const Case c{ScheduleKind::kLoopedBFS, 2, 2, 4};
  const MlpSpec spec = MlpSpec::uniform(8, 5, 6, 3, 17);
  const RegressionTask task = make_regression_task(spec, 8, 5);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.01f, 0.0f};
  auto pipe = make_mlp_pipeline(make_schedule(c.kind, c.P, c.V, c.M), spec, init, {8, opt});
  SequentialTrainer<cpu::CpuBackend> forward_order(cpu::CpuBackend{}, spec, init, 8, c.M, opt);
  pipe->train_step(task.inputs, task.targets);
  forward_order.train_step(task.inputs, task.targets);
  const double diff = max_abs_difference(download_weights(*pipe, spec), forward_order.weights());
  CHECK(diff > 0);
  CHECK(diff < 1e-5);
  // A custom order that is neither increasing nor decreasing.
  Program mixed = make_schedule(ScheduleKind::kGPipe, 1, 1, 3);
  auto& d0 = mixed.devices[0];
  std::swap(d0[3], d0[4]);  // B0.0 B0.1 B0.2 -> B0.1 B0.0 B0.2 (GPipe on one device: F F F B B B)
  CHECK(gradient_order(mixed) == GradientOrder::kMixed);
  CHECK_THROWS_WITH(forward_order.set_gradient_order(GradientOrder::kMixed),
                    Catch::Contains("no order of micro-batches adds the gradients as this schedule does"));
}

TEST_CASE("recomputed micro-batches train like sequential training bit for bit, in fewer stash slots", "[runtime]") {
  // A recomputed micro-batch's forward runs in a slot freed at once; its C runs the forward again into a
  // slot held until its backward ends: the same arithmetic on the same input, so the same gradients.
  std::vector<Case> grid;
  for (const int recompute : {1, 2})
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 4, .V = 1, .M = 8, .dtype = dtype, .recompute = recompute});
      grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .dtype = dtype, .recompute = recompute});
      // ZB-V's peak is its stashes between an I and its W, which no C (before the I) lowers: all recomputed.
      grid.push_back({.kind = ScheduleKind::kZeroBubbleV, .P = 2, .V = 2, .M = 4, .dtype = dtype, .recompute = 1});
    }
  grid.push_back({.kind = ScheduleKind::kGPipe, .P = 2, .V = 1, .M = 4, .recompute = 1});
  grid.push_back({.kind = ScheduleKind::kZeroBubbleH1, .P = 3, .V = 1, .M = 6, .recompute = 1});
  grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .overlapped = true, .recompute = 1});
  grid.push_back({.kind = ScheduleKind::kDualPipeV, .P = 2, .V = 2, .M = 4, .recompute = 2});
  grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 2, .V = 1, .M = 4, .replicas = 2, .recompute = 1});
  for (const Case& c : grid) {
    INFO(describe(c));
    const Program program = c.program();
    REQUIRE(has_recompute(program));
    const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
    // What the device keeps, measured as the simulator counts it; and the slots its chunks reserve.
    const Trace& t = pipe->trace();
    CHECK(t.peak_memory == peak_memory(program));
    Case plain = c;
    plain.recompute = 0;
    const LoweredProgram without = lower(plain.program()), with = lower(program);
    int fewer = 0;
    for (int d = 0; d < c.P; ++d) {
      const DevicePlan a = plan_device(with, d), b = plan_device(without, d);
      for (std::size_t k = 0; k < a.slots.size(); ++k) {
        CHECK(a.slots[k] <= b.slots[k]);
        fewer += a.slots[k] < b.slots[k] ? 1 : 0;
      }
    }
    CHECK(fewer > 0);
  }
  // A chunk that does not say it may be recomputed is refused before any step.
  static_assert(RecomputableChunk<MlpChunk<cpu::CpuBackend>>);
}

TEST_CASE("offloaded stashes train like sequential training bit for bit, in fewer stash slots", "[runtime]") {
  // An offload copies what the slot keeps to host memory and frees the slot; the reload copies it back,
  // into a slot again, before the backward: the same values, so the same gradients.
  std::vector<Case> grid;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    grid.push_back({.kind = ScheduleKind::kGPipe, .P = 2, .V = 1, .M = 4, .dtype = dtype, .offloaded = true});
    grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 4, .V = 1, .M = 8, .dtype = dtype, .offloaded = true});
    grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .dtype = dtype, .offloaded = true});
  }
  grid.push_back({.kind = ScheduleKind::kZeroBubbleH1, .P = 3, .V = 1, .M = 6, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kZeroBubbleV, .P = 2, .V = 2, .M = 4, .offloaded = true});
  // Offloads in weight windows (from an I to its W) with bf16 ends: the chunk's fp32 words of x and dy go too.
  grid.push_back({.kind = ScheduleKind::kZeroBubbleH1, .P = 2, .V = 1, .M = 4, .dtype = DType::kBF16, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kInterleavedZeroBubble, .P = 2, .V = 2, .M = 4, .dtype = DType::kBF16,
                  .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kDualPipeV, .P = 2, .V = 2, .M = 4, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .overlapped = true, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kGPipe, .P = 2, .V = 1, .M = 4, .replicas = 2, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 4, .V = 1, .M = 8, .layers_per_stage = {3, 1, 2, 1},
                  .offloaded = true});
  std::vector<ScheduleKind> lowered;  // the kinds of the cases whose peaks offload lowers
  for (const Case& c : grid) {
    INFO(describe(c));
    const Program program = c.program();
    REQUIRE(offloads(program) > 0);
    const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
    // What the device keeps, measured as the simulator counts it; each O and L on the copy lane.
    const Trace& t = pipe->trace();
    CHECK(t.peak_memory == peak_memory(program));
    for (int d = 0; d < c.P; ++d) {
      const auto& copies = t.copies[static_cast<std::size_t>(d)];
      const auto in_program = std::count_if(program.devices[static_cast<std::size_t>(d)].begin(),
                                            program.devices[static_cast<std::size_t>(d)].end(),
                                            [](const Action& a) { return is_copy(a.phase); });
      CHECK(static_cast<long>(copies.size()) == in_program);
      for (const TraceEvent& e : copies) CHECK(is_copy(e.action.phase));
    }
    // The slots the chunks reserve: never more than without offload, fewer somewhere where the
    // program's peak is lower.
    Case plain = c;
    plain.offloaded = false;
    const LoweredProgram without = lower(plain.program()), with = lower(program);
    const std::vector<int> peaks = peak_activations(program), plain_peaks = peak_activations(plain.program());
    int fewer = 0;
    for (int d = 0; d < c.P; ++d) {
      const DevicePlan a = plan_device(with, d), b = plan_device(without, d);
      for (std::size_t k = 0; k < a.slots.size(); ++k) {
        CHECK(a.slots[k] <= b.slots[k]);
        fewer += a.slots[k] < b.slots[k] ? 1 : 0;
      }
      if (peaks[static_cast<std::size_t>(d)] < plain_peaks[static_cast<std::size_t>(d)]) CHECK(fewer > 0);
    }
    if (peaks != plain_peaks) lowered.push_back(c.kind);
  }
  // Every case keeps fewer stashes at its peak but ZB-H1's two: its stashes are away only where fewer are kept
  // anyway (its peak memory, stashes and gradients, is lower at P 3 on device 0: 4 -> 3).
  CHECK(lowered.size() == grid.size() - 2);
  CHECK(std::find(lowered.begin(), lowered.end(), ScheduleKind::kZeroBubbleH1) == lowered.end());
  static_assert(OffloadableChunk<MlpChunk<cpu::CpuBackend>, cpu::CpuBackend>);
}

TEST_CASE("programs synthesized to offload on the list scheduler's clock train bit for bit", "[runtime]") {
  // Their copies sit where the list scheduler's clock had room for them (an O long after its forward, a reload
  // once the gradient is on its way), not where with_offload() places them.
  for (const DType dtype : {DType::kF32, DType::kBF16})
    for (const Case& c : {Case{.kind = ScheduleKind::kAuto, .P = 4, .V = 1, .M = 8, .dtype = dtype, .synthesized_cap = 2},
                          Case{.kind = ScheduleKind::kAuto, .P = 3, .V = 1, .M = 6, .dtype = dtype,
                               .synthesized_cap = 2.25}}) {
      INFO(describe(c));
      const Synthesis r = c.synthesized();
      const Program& program = r.program;
      REQUIRE(offloads(program) > 0);
      CHECK(r.origin.find(", room made by offload") != std::string::npos);  // an offloading policy's program
      const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
      CHECK(pipe->trace().peak_memory == peak_memory(program));
      CHECK(*std::max_element(pipe->trace().peak_memory.begin(), pipe->trace().peak_memory.end()) <= c.synthesized_cap);
    }
}

TEST_CASE("the MLP's memory model in bytes: what each stage's micro-batch holds, from the widths", "[runtime]") {
  // Eight layers 5 -> 6 x 7 -> 3 on two stages, micro-batches of 2 rows. Stage 0 stashes its three inner
  // activations (fp32) and y; stage 1 its inner activations, x, y and the loss gradient.
  MlpSpec spec = MlpSpec::uniform(8, 5, 6, 3, 17);
  const ScheduleShape shape{ScheduleKind::kOneFOneB, 2, 1, 4};
  const MemoryModel f32 = mlp_memory_model(spec, shape, 2);
  REQUIRE(f32.stages.size() == 2);
  CHECK(f32.stages[0] == StashSize{.stash = 3 * 48 + 48, .input = 48, .gradient = 4 * 48 + 48});
  CHECK(f32.stages[1] == StashSize{.stash = 3 * 48 + 48 + 24 + 24, .input = 48 + 24 + 24, .gradient = 3 * 48 + 24});
  // bf16 ends: the tensors between chunks take half the bytes, and the chunk keeps fp32 words of them too.
  spec.dtype = DType::kBF16;
  const MemoryModel bf16 = mlp_memory_model(spec, shape, 2);
  CHECK(bf16.stages[0] == StashSize{.stash = 3 * 48 + 48 + 24, .input = 24, .gradient = 4 * 48 + 48 + 24});
  CHECK(bf16.stages[1] ==
        StashSize{.stash = 3 * 48 + 48 + 24 + 24 + 12 + 12, .input = 24 + 12 + 12, .gradient = 3 * 48 + 24 + 24});
  // On one device the second stage's x is the first one's y, counted once, in the first stage's stash.
  CHECK(mlp_memory_model(spec, {ScheduleKind::kLoopedBFS, 1, 2, 4}, 2).stages[1].input == 12 + 12);
  // Exact unless a stage whose next stage is on its device offloads, or ends a micro-batch before that one.
  CHECK(mlp_memory_model_exact(with_offload(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4), {0, 1})));
  CHECK(mlp_memory_model_exact(make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4)));
  CHECK_FALSE(mlp_memory_model_exact(with_offload(make_schedule(ScheduleKind::kLoopedBFS, 1, 2, 3), {0})));
  Program late = make_schedule(ScheduleKind::kLoopedBFS, 1, 2, 1);  // F0.0 F1.0 B1.0 B0.0: stage 1 ends first
  REQUIRE(format_actions(late) == "device 0: F0.0 F1.0 B1.0 B0.0\n");
  CHECK(mlp_memory_model_exact(late));
  std::swap(late.devices[0][2], late.devices[0][3]);  // not a valid order, but the rule reads only the order
  CHECK_FALSE(mlp_memory_model_exact(late));
}

TEST_CASE("programs synthesized under a cap in bytes keep it, measured from the devices' buffers", "[runtime]") {
  // The cap is three quarters of 1F1B's peak under the MLP's memory model in bytes (four layers a stage, so that
  // a micro-batch's input is a small part of its stash); synthesis counts in it, the devices measure what their
  // buffers hold for the micro-batches they keep (train_both() checks that it is the model's).
  for (const DType dtype : {DType::kF32, DType::kBF16})
    for (const Case& c : {Case{.kind = ScheduleKind::kAuto, .P = 2, .V = 1, .M = 6, .layers_per_stage = {4, 4},
                               .dtype = dtype, .synthesized_cap = 0.75, .cap_in_bytes = true},
                          Case{.kind = ScheduleKind::kAuto, .P = 4, .V = 1, .M = 8, .layers_per_stage = {4, 4, 4, 4},
                               .dtype = dtype, .synthesized_cap = 0.75, .cap_in_bytes = true}}) {
      INFO(describe(c));
      const Synthesis r = c.synthesized();
      const Program& program = r.program;
      REQUIRE(offloads(program) > 0);
      const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
      const std::vector<double>& held = pipe->trace().peak_bytes;
      CHECK(held == peak_memory(program, c.bytes()));
      CHECK(*std::max_element(held.begin(), held.end()) <= c.cap());
      // 1F1B of the same model keeps more than the cap, measured the same way.
      const Case plain{.kind = ScheduleKind::kOneFOneB, .P = c.P, .V = 1, .M = c.M,
                       .layers_per_stage = c.layers_per_stage, .dtype = dtype};
      const auto one_f_one_b = train_both(plain, {OptimizerKind::kAdam, 0.01f}, 1);
      const std::vector<double>& more = one_f_one_b->trace().peak_bytes;
      CHECK(*std::max_element(more.begin(), more.end()) > c.cap());
    }
}

TEST_CASE("a recomputed micro-batch offloaded in its weight window trains bit for bit", "[runtime]") {
  // Every stage recomputed, then offloaded: the C restores each stash before its I, the window's L before its W.
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const Case c{.kind = ScheduleKind::kZeroBubbleH1, .P = 3, .V = 1, .M = 6, .dtype = dtype, .recompute = 1,
                 .offloaded = true};
    INFO(describe(c));
    const Program program = c.program();
    const StashFates fates(program);
    int both = 0;
    for (int d = 0; d < c.P; ++d)
      for (int m = 0; m < c.M; ++m) both += fates.recomputed(d, 0, m) && fates.weight_window(d, 0, m) ? 1 : 0;
    REQUIRE(both > 0);
    const auto pipe = train_both(c, {OptimizerKind::kAdam, 0.01f}, 2);
    CHECK(pipe->trace().peak_memory == peak_memory(program));
  }
}

TEST_CASE("a schedule that splits backwards needs a chunk with both halves", "[runtime]") {
  // The built-in MlpChunk has them; a chunk with only a full backward is refused
  // before any step (test_custom.cpp's chunk shows that side).
  static_assert(SplitChunk<MlpChunk<cpu::CpuBackend>, cpu::CpuBackend>);
  const MlpSpec spec = MlpSpec::uniform(4, 3, 4, 2, 1);
  const HostModel init = init_mlp(spec);
  CHECK_NOTHROW(make_mlp_pipeline(make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 2), spec, init,
                                  {4, OptimizerConfig{}}));
}

TEST_CASE("the seed example keeps training equal over several steps", "[runtime]") {
  train_both({ScheduleKind::kInterleaved1F1B, 4, 2, 8}, {OptimizerKind::kAdam, 0.003f}, 5, 16, 4);
}

TEST_CASE("the measured trace holds every action once and the peaks of the closed forms", "[runtime]") {
  for (const Case& c : std::vector<Case>{{ScheduleKind::kInterleaved1F1B, 4, 2, 8},
                                         {ScheduleKind::kInterleaved1F1B, 2, 3, 4},
                                         {ScheduleKind::kOneFOneB, 3, 1, 6},
                                         {ScheduleKind::kGPipe, 2, 1, 3},
                                         {ScheduleKind::kInterleaved1F1B, 4, 2, 8, true},
                                         {ScheduleKind::kDualPipeV, 2, 2, 4}}) {
    INFO(describe(c));
    auto pipe = train_both(c, {}, 1);
    const Trace& t = pipe->trace();
    const Program p = c.program();
    const bool pairs = has_pairs(p);
    const LoweredProgram lp = lower(p);
    const Trace simulated = simulate(p);
    CHECK(t.source == TraceSource::kMeasured);
    CHECK(t.time_unit == "us");
    CHECK(t.shape == p.shape);
    REQUIRE(t.compute.size() == static_cast<std::size_t>(c.P));
    for (int d = 0; d < c.P; ++d) {
      const auto& events = t.compute[static_cast<std::size_t>(d)];
      REQUIRE(events.size() == p.devices[static_cast<std::size_t>(d)].size());
      // The same events as the simulator's, step for step: only the times differ.
      const auto& predicted = simulated.compute[static_cast<std::size_t>(d)];
      REQUIRE(predicted.size() == events.size());
      for (std::size_t k = 0; k < events.size(); ++k) {
        CHECK(events[k].step == predicted[k].step);
        CHECK(events[k].action == predicted[k].action);
      }
      CHECK(t.comm[static_cast<std::size_t>(d)].size() == simulated.comm[static_cast<std::size_t>(d)].size());
      // Each event starts after the step before it has ended; both halves of a
      // pair start after what precedes the pair, and what follows waits for both.
      double previous_end = 0, pair_start_floor = 0;
      for (std::size_t k = 0; k < events.size(); ++k) {
        const TraceEvent& e = events[k];
        CHECK(e.device == d);
        CHECK(e.action == p.devices[static_cast<std::size_t>(d)][k]);
        CHECK(e.stage == p.shape.stage_of(d, e.action.chunk));
        const bool second_half = event_lane(events, k) == 1;
        CHECK(e.start >= (second_half ? pair_start_floor : previous_end));
        CHECK(e.end >= e.start);
        if (!second_half) pair_start_floor = previous_end;
        previous_end = second_half ? std::max(previous_end, e.end) : e.end;
      }
      int sends = 0, recvs = 0;
      for (const CommEvent& e : t.comm[static_cast<std::size_t>(d)]) {
        CHECK(e.end >= e.start);
        sends += e.sends;
        recvs += e.recvs;
      }
      int want_sends = 0, want_recvs = 0;
      for (const Step& st : lp.devices[static_cast<std::size_t>(d)])
        for (const P2POp& op : st.ops) (op.kind == OpKind::kSend ? want_sends : want_recvs)++;
      CHECK(sends == want_sends);
      CHECK(recvs == want_recvs);
      // The closed form (checked against its formula in test_plan.cpp), of the orders without pairs.
      if (!pairs && p.shape.kind != ScheduleKind::kDualPipeV)
        CHECK(t.peak_activations[static_cast<std::size_t>(d)] == closed_form_peak_activations(p.shape, d));
      // The simulator's prediction, from the program and from its simulated trace.
      CHECK(t.peak_activations[static_cast<std::size_t>(d)] == peak_activations(p)[static_cast<std::size_t>(d)]);
      CHECK(t.peak_activations[static_cast<std::size_t>(d)] == simulated.peak_activations[static_cast<std::size_t>(d)]);
    }
    CHECK(makespan(t) > 0);
    CHECK(bubble_ratio(t) >= 0);
  }
}

TEST_CASE("after the first step, a step allocates nothing", "[runtime]") {
  for (const Case& c : std::vector<Case>{{ScheduleKind::kInterleaved1F1B, 2, 2, 4},
                                         {ScheduleKind::kInterleaved1F1B, 2, 2, 8},
                                         {ScheduleKind::kOneFOneB, 3, 1, 6},
                                         {ScheduleKind::kInterleaved1F1B, 2, 2, 8, true}}) {
    INFO(describe(c));
    const MlpSpec spec = MlpSpec::uniform(2 * c.P * c.V, 4, 8, 2);
    const RegressionTask task = make_regression_task(spec, 2 * c.M, 1);
    auto pipe = make_mlp_pipeline(c.program(), spec, init_mlp(spec), {2 * c.M, {OptimizerKind::kAdam, 0.01f}});
    auto device_allocations = [&] {
      std::vector<std::size_t> n(static_cast<std::size_t>(c.P));  // the devices run concurrently
      pipe->for_each_device([&](int d, auto& parts) { n[static_cast<std::size_t>(d)] = parts.backend.allocations(); });
      return n;
    };
    pipe->train_step(task.inputs, task.targets);
    const std::vector<std::size_t> before = device_allocations();
    allocations = 0;
    counting = true;
    pipe->train_step(task.inputs, task.targets);
    pipe->train_step(task.inputs, task.targets);
    counting = false;
    CHECK(allocations.load() == 0);
    CHECK(device_allocations() == before);
  }
}

TEST_CASE("against full-batch training (M = 1), micro-batching differs only by fp32 rounding", "[runtime]") {
  const MlpSpec spec = MlpSpec::uniform(8, 5, 16, 3, 4);
  const int rows = 32;
  const RegressionTask task = make_regression_task(spec, rows, 6);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.01f, 0.9f};
  auto pipe = make_mlp_pipeline(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 8), spec, init, {rows, opt});
  SequentialTrainer<cpu::CpuBackend> full_batch(cpu::CpuBackend{}, spec, init, rows, 1, opt);
  for (int s = 0; s < 3; ++s) {
    const double a = pipe->train_step(task.inputs, task.targets).loss;
    const double b = full_batch.train_step(task.inputs, task.targets);
    CHECK(a == Approx(b).epsilon(1e-5));
  }
  const HostModel got = download_weights(*pipe, spec);
  const double diff = max_abs_difference(got, full_batch.weights());
  CHECK(diff < 1e-5);
  CHECK(max_abs_difference(got, init) > 1e-3);  // far larger than the rounding
}

namespace {

// The CPU backend, counting copies to the host that would wait inside a GPU
// runtime behind unfinished work (a download enqueued after work that no
// synchronize() has waited for): on a GPU such a copy blocks behind an NCCL
// receive of a failed peer, out of reach of the transport's polled wait.
class WaitCheckingBackend : public cpu::CpuBackend {
 public:
  void upload(const float* h, float* d, std::size_t n) {
    enqueue();
    CpuBackend::upload(h, d, n);
  }
  void download(const float* d, float* h, std::size_t n) {
    if (pending_) ++unsafe_downloads_;
    CpuBackend::download(d, h, n);
  }
  void copy(const float* s, float* d, std::size_t n) {
    enqueue();
    CpuBackend::copy(s, d, n);
  }
  void fill(float* d, std::size_t n, float v) {
    enqueue();
    CpuBackend::fill(d, n, v);
  }
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    enqueue();
    CpuBackend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  template <class F>
  void for_each(std::size_t n, F f) {
    enqueue();
    CpuBackend::for_each(n, f);
  }
  template <class F>
  void sum(std::size_t n, F f, float* out) {
    enqueue();
    CpuBackend::sum(n, f, out);
  }
  void synchronize() { pending_ = false; }
  long long unsafe_downloads() const { return unsafe_downloads_; }

 private:
  void enqueue() { pending_ = true; }
  bool pending_ = false;
  long long unsafe_downloads_ = 0;
};
static_assert(Backend<WaitCheckingBackend>);

}  // namespace

TEST_CASE("every read of device memory on the host follows a synchronize()", "[runtime]") {
  using B = WaitCheckingBackend;
  const Case c{ScheduleKind::kInterleaved1F1B, 2, 2, 4};
  const MlpSpec spec = MlpSpec::uniform(8, 4, 6, 3, 2);
  const RegressionTask task = make_regression_task(spec, 8, 1);
  const HostModel init = init_mlp(spec);
  auto pipe = make_mlp_pipeline<B, cpu::RendezvousEndpoint>(make_schedule(c.kind, c.P, c.V, c.M), spec, init,
                                                             cpu::make_rendezvous(c.P), [](int) { return B{}; },
                                                             {8, {OptimizerKind::kAdam, 0.01f}});
  SequentialTrainer<B> seq(B{}, spec, init, 8, c.M, {OptimizerKind::kAdam, 0.01f});
  for (int step = 0; step < 2; ++step) {
    pipe->train_step(task.inputs, task.targets);
    seq.train_step(task.inputs, task.targets);
  }
  CHECK(download_weights(*pipe, spec) == seq.weights());
  std::vector<long long> unsafe(static_cast<std::size_t>(c.P));  // the devices run concurrently
  pipe->for_each_device([&](int d, auto& parts) { unsafe[static_cast<std::size_t>(d)] = parts.backend.unsafe_downloads(); });
  CHECK(unsafe == std::vector<long long>(static_cast<std::size_t>(c.P), 0));
  CHECK(seq.backend().unsafe_downloads() == 0);
}

namespace {

// The CPU backend, recording the threads bound to it (ThreadBoundBackend) and any
// GEMM that runs on a thread not bound first; side() shares the record.
class ThreadBindingBackend : public cpu::CpuBackend {
 public:
  struct Record {
    std::mutex mutex;
    std::multiset<std::thread::id> bound;  // one entry per bind_thread() call
    int unbound_gemms = 0;
  };
  explicit ThreadBindingBackend(std::shared_ptr<Record> record) : record_(std::move(record)) {}
  void bind_thread() const {
    const std::lock_guard lock(record_->mutex);
    record_->bound.insert(std::this_thread::get_id());
  }
  ThreadBindingBackend side() const {
    ThreadBindingBackend s(record_);
    static_cast<cpu::CpuBackend&>(s) = CpuBackend::side();  // the side's clock is this backend's (OverlapBackend)
    return s;
  }
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    {
      const std::lock_guard lock(record_->mutex);
      record_->unbound_gemms += record_->bound.count(std::this_thread::get_id()) == 0;
    }
    CpuBackend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

 private:
  std::shared_ptr<Record> record_;
};
static_assert(OverlapBackend<ThreadBindingBackend> && ThreadBoundBackend<ThreadBindingBackend>);
static_assert(!ThreadBoundBackend<cpu::CpuBackend>);

}  // namespace

TEST_CASE("every thread the runtime starts for a device binds it once before running an action", "[runtime]") {
  using B = ThreadBindingBackend;
  auto record = std::make_shared<B::Record>();
  const Case c{ScheduleKind::kInterleaved1F1B, 2, 2, 4};
  const Program program = overlap(make_schedule(c.kind, c.P, c.V, c.M));
  REQUIRE(pair_count(program) > 0);  // side threads run the pairs' backwards
  const MlpSpec spec = MlpSpec::uniform(8, 4, 6, 3, 2);
  const RegressionTask task = make_regression_task(spec, 8, 1);
  const HostModel init = init_mlp(spec);
  auto pipe = make_mlp_pipeline<B, cpu::RendezvousEndpoint>(program, spec, init, cpu::make_rendezvous(c.P),
                                                             [&](int) { return B(record); },
                                                             {8, {OptimizerKind::kAdam, 0.01f}});
  for (int step = 0; step < 2; ++step) pipe->train_step(task.inputs, task.targets);
  const std::set<std::thread::id> threads(record->bound.begin(), record->bound.end());
  CHECK(threads.size() == static_cast<std::size_t>(2 * c.P));  // P device threads and P side threads
  CHECK(record->bound.size() == threads.size());               // each bound once
  CHECK(record->unbound_gemms == 0);
}

namespace {

// The CPU backend with copy lanes whose copies run as late as a GPU's copy
// stream may run them: a side()'s upload() and download() wait in its queue until
// the device waits for them (wait_for a mark after them, or for the side) or the
// side synchronizes. A device that reads what a reload has not written yet, or
// overwrites what an offload has not read yet, trains differently from
// sequential training. It also records the device's GEMM outputs, and counts
// the copies that touch one written after their side last waited for the device
// (wait_for): a copy that would run, on a GPU, before the compute it follows.
class LateCopyBackend : public cpu::CpuBackend {
 public:
  struct Queue {
    std::vector<std::function<void()>> copies;
    std::size_t done = 0;
  };
  struct Write {  // a GEMM's output, the device's epoch-th
    const float *begin, *end;
    long long epoch;
  };
  struct Shared {  // a device's: its sides' queues, its GEMMs' outputs
    std::mutex mutex;
    std::vector<std::shared_ptr<Queue>> queues;
    long long gemms_before_copies = 0;  // GEMMs that ran while a copy enqueued before them waited
    std::vector<Write> writes;
    long long epoch = 0;     // GEMMs so far
    long long unfenced = 0;  // copies that touch a GEMM's output written after their side last waited for the device
    bool page_locked = false;  // page_locked() says so of any host memory
  };
  struct Mark {
    std::shared_ptr<Queue> queue;
    std::size_t end = 0;
  };

  explicit LateCopyBackend(std::shared_ptr<Shared> shared = std::make_shared<Shared>()) : shared_(std::move(shared)) {}
  LateCopyBackend side() const {
    LateCopyBackend s(shared_);
    static_cast<cpu::CpuBackend&>(s) = CpuBackend::side();  // the side's clock is this backend's
    s.queue_ = std::make_shared<Queue>();
    const std::lock_guard lock(shared_->mutex);
    shared_->queues.push_back(s.queue_);
    return s;
  }
  LateCopyBackend copy_side() const { return side(); }
  // Whether the caller's batch is copied from directly, or through the feed's own memory (runtime/batch_feed.hpp).
  bool page_locked(const float* /*p*/, std::size_t /*n*/) const { return shared_->page_locked; }
  void upload(const float* h, float* d, std::size_t n) { later(h, d, n); }
  void download(const float* d, float* h, std::size_t n) { later(d, h, n); }
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    {
      const std::lock_guard lock(shared_->mutex);
      for (const auto& q : shared_->queues)
        if (q->done < q->copies.size()) {
          ++shared_->gemms_before_copies;
          break;
        }
      shared_->writes.push_back({c, c + static_cast<std::size_t>(m - 1) * static_cast<std::size_t>(ldc) + n,
                                 ++shared_->epoch});
    }
    CpuBackend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void mark(Mark& m) const {
    const std::lock_guard lock(shared_->mutex);
    m = {queue_, queue_ ? queue_->copies.size() : 0};
  }
  void wait_for(const Mark& m) { run_to(m.queue.get(), m.end); }
  void wait_for(const LateCopyBackend& other) {
    if (!other.queue_) {  // the device (or a compute side): this side's later work follows all it did
      const std::lock_guard lock(shared_->mutex);
      fence_ = shared_->epoch;
    }
    run_to(other.queue_.get(), ~std::size_t{0});
  }
  void synchronize() { run_to(queue_.get(), ~std::size_t{0}); }
  long long gemms_before_copies() const { return shared_->gemms_before_copies; }
  long long unfenced_copies() const { return shared_->unfenced; }

 private:
  void later(const float* src, float* dst, std::size_t n) {
    if (!queue_) {  // the device's own: at once
      CpuBackend::copy(src, dst, n);
      return;
    }
    const std::lock_guard lock(shared_->mutex);
    for (const Write& w : shared_->writes)
      if (w.epoch > fence_ && ((src < w.end && w.begin < src + n) || (dst < w.end && w.begin < dst + n))) {
        ++shared_->unfenced;
        break;
      }
    queue_->copies.push_back([=] { std::memmove(dst, src, n * sizeof(float)); });
  }
  void run_to(Queue* q, std::size_t end) {
    if (q == nullptr) return;
    const std::lock_guard lock(shared_->mutex);
    while (q->done < std::min(end, q->copies.size())) q->copies[q->done++]();
  }
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Queue> queue_;  // a side's copies, not run yet from done on
  long long fence_ = 0;           // a side's: the GEMMs of the device its later work follows
};
static_assert(CopyLaneBackend<LateCopyBackend>);
static_assert(CopyLaneBackend<cpu::CpuBackend>);

}  // namespace

TEST_CASE("copies beside the compute (offloads, reloads, the batch) are waited for wherever they must be",
          "[runtime]") {
  // The copy lanes' copies run as late as a GPU's copy stream may (LateCopyBackend): the device waits for an
  // offload's copy at its O, for a reload's before its micro-batch's next action, for a micro-batch's inputs and
  // targets before its forward. Had it waited too little, the run would differ from sequential training.
  using B = LateCopyBackend;
  std::vector<Case> grid = {{ScheduleKind::kOneFOneB, 2, 1, 4}, {ScheduleKind::kInterleaved1F1B, 2, 2, 4},
                            {ScheduleKind::kGPipe, 1, 1, 3}, {ScheduleKind::kZeroBubbleV, 2, 2, 4},
                            {.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .overlapped = true}};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 4, .V = 1, .M = 8, .dtype = dtype, .offloaded = true});
    grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .dtype = dtype, .offloaded = true});
    grid.push_back({.kind = ScheduleKind::kInterleavedZeroBubble, .P = 2, .V = 2, .M = 4, .dtype = dtype,
                    .offloaded = true});  // weight windows
    grid.push_back({.kind = ScheduleKind::kAuto, .P = 4, .V = 1, .M = 8, .dtype = dtype, .synthesized_cap = 2});
  }
  grid.push_back({.kind = ScheduleKind::kZeroBubbleV, .P = 2, .V = 2, .M = 4, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kDualPipeV, .P = 2, .V = 2, .M = 4, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kInterleaved1F1B, .P = 2, .V = 2, .M = 4, .overlapped = true, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kZeroBubbleH1, .P = 3, .V = 1, .M = 6, .recompute = 1, .offloaded = true});
  grid.push_back({.kind = ScheduleKind::kOneFOneB, .P = 4, .V = 1, .M = 8, .layers_per_stage = {3, 1, 2, 1},
                  .offloaded = true});
  for (std::size_t k = 0; k < grid.size(); ++k) {
    const Case& c = grid[k];
    const bool page_locked = k % 2 == 1;  // the batch copied from the caller's memory, or through the feed's
    INFO(describe(c) << (page_locked ? ", the batch page-locked" : ""));
    const Program program = c.program();
    REQUIRE((offloads(program) > 0) == (c.offloaded || c.synthesized_cap > 0));
    const MlpSpec spec = c.spec();
    const int rows = 2 * c.M;
    const RegressionTask task = make_regression_task(spec, rows, 5);
    const HostModel init = init_mlp(spec);
    const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
    auto pipe = make_mlp_pipeline<B, cpu::RendezvousEndpoint>(program, spec, init, cpu::make_rendezvous(c.P),
                                                               [&](int) {
                                                                 auto shared = std::make_shared<B::Shared>();
                                                                 shared->page_locked = page_locked;
                                                                 return B(shared);
                                                               },
                                                               {rows, opt});
    SequentialTrainer<cpu::CpuBackend> seq(cpu::CpuBackend{}, spec, init, rows, c.M, opt);
    seq.set_gradient_order(gradient_order(program));
    for (int step = 0; step < 2; ++step) CHECK(pipe->train_step(task.inputs, task.targets).loss == seq.train_step(task.inputs, task.targets));
    CHECK(download_weights(*pipe, spec) == seq.weights());
    // The copies ran late indeed: GEMMs ran while copies enqueued before them had not.
    // No copy went before the compute it follows (an offload before the forward that wrote its stash, a reload
    // into a slot before what used it last).
    std::vector<long long> late(static_cast<std::size_t>(c.P)), unfenced(late.size());  // the devices run concurrently
    pipe->for_each_device([&](int d, auto& parts) {
      late[static_cast<std::size_t>(d)] = parts.backend.gemms_before_copies();
      unfenced[static_cast<std::size_t>(d)] = parts.backend.unfenced_copies();
    });
    CHECK(std::accumulate(late.begin(), late.end(), 0LL) > 0);
    CHECK(unfenced == std::vector<long long>(late.size(), 0));
    // Each copy on the copy lane, as the program has it.
    for (int d = 0; d < c.P; ++d)
      CHECK(static_cast<long>(pipe->trace().copies[static_cast<std::size_t>(d)].size()) ==
            std::count_if(program.devices[static_cast<std::size_t>(d)].begin(),
                          program.devices[static_cast<std::size_t>(d)].end(),
                          [](const Action& a) { return is_copy(a.phase); }));
  }
}
