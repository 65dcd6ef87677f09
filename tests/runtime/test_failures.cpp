// Bad input and failures: a clear pipeweave::Error, no hang, and no half-updated
// weights (a step either completes or leaves the model and the optimizer as they were).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../common/fault_chunk.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/side_thread.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"

using namespace pipeweave;
using namespace std::chrono_literals;
using cpu::CpuBackend;
using cpu::RendezvousEndpoint;

namespace {

using test::Fault;
using TestChunk = test::FaultChunk;

using TestPipeline = Pipeline<CpuBackend, RendezvousEndpoint, TestChunk>;

struct Setup {
  MlpSpec spec;
  RegressionTask task;
  HostModel init;
  int rows;
};

Setup setup(int layers, int micro_batches) {
  const MlpSpec spec = MlpSpec::uniform(layers, 4, 6, 3, 9);
  const int rows = 2 * micro_batches;
  return {spec, make_regression_task(spec, rows, 2), init_mlp(spec), rows};
}

std::unique_ptr<TestPipeline> make_test_pipeline(const Program& program, const Setup& s, std::shared_ptr<Fault> fault,
                                                 const OptimizerConfig& opt, std::chrono::milliseconds timeout) {
  auto ends = cpu::make_rendezvous(program.shape.devices, {timeout});
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, TestChunk> parts{CpuBackend{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    for (int c = 0; c < program.shape.chunks; ++c)
      parts.chunks.emplace_back(
          MlpChunk<CpuBackend>(parts.backend, s.spec, chunk_layers(program.shape, s.spec.allocation(), d, c), s.init), d, c,
          fault);
    return parts;
  };
  return std::make_unique<TestPipeline>(program, make_device, PipelineOptions{s.rows, opt});
}

// The same with D replicas: a transport of its own for each, replica r's chunks told their replica;
// the sums by the collective make_replicas makes (none: ReplicaGroup, through a host copy).
std::unique_ptr<TestPipeline> make_replicated_pipeline(const Program& program, const Setup& s, int replicas,
                                                       std::shared_ptr<Fault> fault, const OptimizerConfig& opt,
                                                       std::chrono::milliseconds timeout,
                                                       const MakeReplicaCollective& make_replicas = {}) {
  std::vector<std::vector<RendezvousEndpoint>> ends;
  for (int r = 0; r < replicas; ++r) ends.push_back(cpu::make_rendezvous(program.shape.devices, {timeout}));
  auto make_device = [&](int d, int r) {
    DeviceParts<CpuBackend, RendezvousEndpoint, TestChunk> parts{
        CpuBackend{}, std::move(ends[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)]), {}};
    for (int c = 0; c < program.shape.chunks; ++c)
      parts.chunks.emplace_back(
          MlpChunk<CpuBackend>(parts.backend, s.spec, chunk_layers(program.shape, s.spec.allocation(), d, c), s.init), d, c,
          fault, r);
    return parts;
  };
  PipelineOptions options{s.rows * replicas, opt, timeout};
  options.replicas = replicas;
  return std::make_unique<TestPipeline>(program, make_device, options, TestPipeline::LossFunction{}, make_replicas);
}

// Sequential training of the replicated run (each replica's sum, then the replicas in order).
SequentialTrainer<CpuBackend> replicated_reference(const Program& p, const Setup& s, int replicas,
                                                   const OptimizerConfig& opt) {
  SequentialTrainer<CpuBackend> seq(CpuBackend{}, s.spec, s.init, replicas * s.rows,
                                    replicas * p.shape.micro_batches, opt);
  seq.set_replicas(replicas);
  seq.set_gradient_order(gradient_order(p));
  return seq;
}

HostModel weights_of(TestPipeline& pipe, const MlpSpec& spec) {
  HostModel m;
  m.layers.resize(static_cast<std::size_t>(spec.layers()));
  pipe.for_each_device([&](int, auto& parts) {
    for (const TestChunk& c : parts.chunks) c.inner().download(parts.backend, m);
  });
  return m;
}

}  // namespace

TEST_CASE("sizes that do not fit are clear errors", "[runtime]") {
  const Setup s = setup(8, 4);
  const Program interleaved = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  SECTION("layers not divisible by P*V") {
    const MlpSpec spec = MlpSpec::uniform(6, 4, 6, 3);
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, spec, init_mlp(spec), {s.rows}),
                      "layers (6) must be a multiple of devices * chunks (2 * 2 = 4)");
  }
  SECTION("zero or negative sizes") {
    CHECK_THROWS_WITH(make_schedule(ScheduleKind::kOneFOneB, 0, 1, 4), Catch::Contains("devices must be at least 1"));
    CHECK_THROWS_WITH(make_schedule(ScheduleKind::kOneFOneB, 2, 1, -1),
                      Catch::Contains("micro-batches must be at least 1"));
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, s.spec, s.init, {0}),
                      "pipeline: the batch of 0 samples does not split into 4 equal micro-batches of at least 1 sample");
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, s.spec, s.init, {6}),
                      Catch::Contains("batch of 6 samples does not split into 4"));
    const MlpSpec negative = MlpSpec::uniform(8, 4, -3, 3);
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, negative, s.init, {s.rows}),
                      "model: width 1 is -3; widths must be 1..65536");
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, s.spec, s.init, {s.rows, {OptimizerKind::kSgd, 0.0f}}),
                      Catch::Contains("learning rate must be positive"));
  }
  SECTION("absurd sizes") {
    const MlpSpec wide = MlpSpec::uniform(8, 4, 1 << 20, 3);
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, wide, s.init, {s.rows}),
                      Catch::Contains("widths must be 1..65536"));
    const MlpSpec big = MlpSpec::uniform(8, 4, 60000, 3);
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, big, s.init, {s.rows}),
                      Catch::Contains("parameters is more than the limit"));
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, s.spec, s.init, {1 << 30}),
                      "pipeline: a batch of 1073741824 samples is more than the limit of 16777216");
    const MlpSpec wide_io = MlpSpec::uniform(8, 65536, 6, 3);
    CHECK_THROWS_WITH(make_mlp_pipeline(interleaved, wide_io, init_mlp(wide_io), {1 << 24}),
                      "pipeline: a micro-batch of 4194304 samples of width 65536 is too large");
    const MlpSpec many = MlpSpec::uniform(4096, 2, 2, 2);
    CHECK_THROWS_WITH(make_mlp_pipeline(make_schedule(ScheduleKind::kGPipe, 4096, 1, 1), many, init_mlp(many), {1}),
                      Catch::Contains("cpu pipeline: devices must be 1..256"));
  }
}

TEST_CASE("a program that does not match the model or is not valid is refused", "[runtime]") {
  const Setup s = setup(8, 2);
  SECTION("an invalid program") {
    Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
    p.shape.kind = ScheduleKind::kCustom;
    p.devices[1].pop_back();  // a backward goes missing
    CHECK_THROWS_WITH(make_mlp_pipeline(p, s.spec, s.init, {s.rows}),
                      Catch::StartsWith("pipeline: the program is not valid: device 1: B0.1") &&
                          Catch::Contains("is missing"));
  }
  SECTION("a different number of chunks per device") {
    const Program p = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
    auto ends = cpu::make_rendezvous(2);
    auto make_device = [&](int d) {
      DeviceParts<CpuBackend, RendezvousEndpoint, MlpChunk<CpuBackend>> parts{CpuBackend{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
      parts.chunks.emplace_back(parts.backend, s.spec, LayerRange{4 * d, 4 * d + 4}, s.init);  // 1 chunk, not 2
      return parts;
    };
    CHECK_THROWS_WITH((cpu::CpuMlpPipeline(p, make_device, {s.rows})),
                      "pipeline: device 0 has 1 chunks, but the program has 2 per device");
  }
  SECTION("a chunk that cannot move what it keeps for its W, under offloads in weight windows") {
    // MlpChunk without offload_for_weight: still an OffloadableChunk and a SplitChunk.
    struct NoWeightOffload : MlpChunk<CpuBackend> {
      using MlpChunk::MlpChunk;
      void offload_for_weight() = delete;
    };
    static_assert(OffloadableChunk<NoWeightOffload, CpuBackend> && !WeightOffloadableChunk<NoWeightOffload, CpuBackend>);
    const Program p = with_offload(make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 4), {0, 1});
    const StashFates fates(p);
    bool windows = false;
    for (int m = 0; m < 4; ++m) windows = windows || fates.weight_window(1, 0, m);
    REQUIRE(windows);
    auto ends = cpu::make_rendezvous(2);
    auto make_device = [&](int d) {
      DeviceParts<CpuBackend, RendezvousEndpoint, NoWeightOffload> parts{CpuBackend{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
      parts.chunks.emplace_back(parts.backend, s.spec, LayerRange{4 * d, 4 * d + 4}, s.init);
      return parts;
    };
    CHECK_THROWS_WITH((Pipeline<CpuBackend, RendezvousEndpoint, NoWeightOffload>(p, make_device, {s.rows})),
                      Catch::Contains("the program offloads stashes between an I and its W (O after the I, "
                                      "L before the W), but the chunk does not say how to move what it keeps for its "
                                      "weight gradient"));
  }
  SECTION("stages whose sizes do not chain") {
    const Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
    const MlpSpec other = MlpSpec::uniform(8, 4, 7, 3);
    const HostModel other_init = init_mlp(other);
    auto ends = cpu::make_rendezvous(2);
    auto make_device = [&](int d) {
      DeviceParts<CpuBackend, RendezvousEndpoint, MlpChunk<CpuBackend>> parts{CpuBackend{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
      if (d == 0)
        parts.chunks.emplace_back(parts.backend, s.spec, LayerRange{0, 4}, s.init);
      else
        parts.chunks.emplace_back(parts.backend, other, LayerRange{4, 8}, other_init);
      return parts;
    };
    CHECK_THROWS_WITH((cpu::CpuMlpPipeline(p, make_device, {s.rows})),
                      "pipeline: the model does not match the program: virtual stage 0 gives 6 features per sample, "
                      "but stage 1 takes 7");
  }
  SECTION("transport endpoints for another number of devices") {
    const Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
    CHECK_THROWS_WITH((make_mlp_pipeline<CpuBackend, RendezvousEndpoint>(
                          p, s.spec, s.init, cpu::make_rendezvous(3), [](int) { return CpuBackend{}; }, {s.rows})),
                      "pipeline: 3 transport endpoints for 2 devices");
  }
  SECTION("a batch of the wrong size") {
    auto pipe = make_mlp_pipeline(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), s.spec, s.init, {s.rows});
    const std::vector<float> short_inputs(3);
    CHECK_THROWS_WITH(pipe->train_step(short_inputs, s.task.targets),
                      "train_step: expected 16 input and 12 target values (4 samples), got 3 and 12");
  }
}

TEST_CASE("a non-finite loss stops the step on every device and changes no weight", "[runtime]") {
  const Setup s = setup(8, 4);
  for (const OptimizerConfig& opt :
       {OptimizerConfig{OptimizerKind::kSgd, 0.01f, 0.9f}, OptimizerConfig{OptimizerKind::kAdam, 0.01f}}) {
    INFO(optimizer_name(opt.kind));
    auto pipe =
        make_mlp_pipeline(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), s.spec, s.init, {s.rows, opt});
    SequentialTrainer<CpuBackend> seq(CpuBackend{}, s.spec, s.init, s.rows, 4, opt);
    pipe->train_step(s.task.inputs, s.task.targets);
    seq.train_step(s.task.inputs, s.task.targets);
    const HostModel before = download_weights(*pipe, s.spec);
    std::vector<float> poisoned = s.task.inputs;
    poisoned[2 * 4 * 2 + 1] = std::numeric_limits<float>::quiet_NaN();  // a value of micro-batch 2
    CHECK_THROWS_WITH(pipe->train_step(poisoned, s.task.targets),
                      "training step 2: device 1: the loss of micro-batch 2 is nan; the step was not applied: every "
                      "device kept its parameters");
    CHECK(download_weights(*pipe, s.spec) == before);
    CHECK_THROWS_WITH(seq.train_step(poisoned, s.task.targets), Catch::Contains("the step was not applied"));
    // The optimizer state was left alone too: the next steps still equal the reference's.
    pipe->train_step(s.task.inputs, s.task.targets);
    seq.train_step(s.task.inputs, s.task.targets);
    CHECK(download_weights(*pipe, s.spec) == seq.weights());
  }
}

TEST_CASE("gradients that overflow are caught before any update", "[runtime]") {
  const Setup s = setup(8, 2);
  auto pipe = make_mlp_pipeline(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), s.spec, s.init, {s.rows});
  std::vector<float> huge = s.task.targets;
  for (float& t : huge) t = 3e38f;
  CHECK_THROWS_WITH(pipe->train_step(s.task.inputs, huge),
                    Catch::Contains("is infinite; the step was not applied"));
  CHECK(download_weights(*pipe, s.spec) == s.init);
}

namespace {

// The CPU rendezvous with a reset that fails while `fail` is set (a stand-in for a device that cannot be used again,
// e.g. after a CUDA error of that kind); counts the resets.
class ResetFaultEndpoint {
 public:
  ResetFaultEndpoint(RendezvousEndpoint inner, std::shared_ptr<std::atomic<bool>> fail, std::shared_ptr<std::atomic<int>> resets)
      : inner_(std::move(inner)), fail_(std::move(fail)), resets_(std::move(resets)) {}
  int device() const { return inner_.device(); }
  int devices() const { return inner_.devices(); }
  void group_begin(int step) { inner_.group_begin(step); }
  void send(int peer, const Message& m, const void* src) { inner_.send(peer, m, src); }
  void recv(int peer, const Message& m, void* dst) { inner_.recv(peer, m, dst); }
  void group_end() { inner_.group_end(); }
  bool agree(bool ok) { return inner_.agree(ok); }
  void abort(std::string_view reason) noexcept { inner_.abort(reason); }
  void reset() {
    ++*resets_;
    if (*fail_ && device() == 1) inner_.reset_failed("device 1 cannot be used again");  // throws, on every device
    inner_.reset();
  }

 private:
  RendezvousEndpoint inner_;
  std::shared_ptr<std::atomic<bool>> fail_;
  std::shared_ptr<std::atomic<int>> resets_;
};

}  // namespace

TEST_CASE("a reset that fails after a failed step ends the run: every later step says why, none tries again",
          "[runtime]") {
  const Setup s = setup(8, 4);
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4);
  auto fault = std::make_shared<Fault>();
  fault->device = 1;
  fault->action = bwd(0, 2);
  auto fail = std::make_shared<std::atomic<bool>>(false);
  auto resets = std::make_shared<std::atomic<int>>(0);
  // A minute's timeout: device 0 does not wait for device 1 in the reset, which meets it with its failure.
  auto ends = cpu::make_rendezvous(2, {60s});
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, ResetFaultEndpoint, TestChunk> parts{
        CpuBackend{}, ResetFaultEndpoint(std::move(ends[static_cast<std::size_t>(d)]), fail, resets), {}};
    parts.chunks.emplace_back(MlpChunk<CpuBackend>(parts.backend, s.spec, chunk_layers(p.shape, s.spec.allocation(), d, 0),
                                                   s.init),
                              d, 0, fault);
    return parts;
  };
  Pipeline<CpuBackend, ResetFaultEndpoint, TestChunk> pipe(p, make_device, PipelineOptions{s.rows, {}});
  fault->armed = true;
  CHECK_THROWS_WITH(pipe.train_step(s.task.inputs, s.task.targets), Catch::Contains("injected fault"));
  fault->armed = false;
  *fail = true;
  const std::string why = "the run cannot go on: making the run usable again after the failed step: ";
  CHECK_THROWS_WITH(pipe.train_step(s.task.inputs, s.task.targets),
                    Catch::StartsWith("training step 2: " + why) && Catch::Contains("device 1 cannot be used again"));
  const int tried = resets->load();
  CHECK(tried >= 1);
  // Even once the cause is gone, no later step resets or runs: each says why with the first failure.
  *fail = false;
  CHECK_THROWS_WITH(pipe.train_step(s.task.inputs, s.task.targets),
                    Catch::StartsWith("training step 3: " + why) && Catch::Contains("device 1 cannot be used again"));
  CHECK(resets->load() == tried);
}

TEST_CASE("an error on one device stops every device and reaches the caller", "[runtime]") {
  const Setup s = setup(8, 4);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.01f, 0.9f};
  // Device 1 of overlap(interleaved 1F1B, P = 2, V = 2, M = 4) runs (F0.2;B1.1): either
  // half fails, the forward on the device's thread or the backward on its second one.
  // With offloads, a copy fails on the device's copy lane: an O's, issued where its forward ends, or an L's.
  const Program pairs = overlap(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4));
  const Program offloaded = with_offload(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), {0, 1, 2, 3});
  for (const auto& [p, a] : {std::pair{make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4), bwd(0, 2)},
                             std::pair{make_schedule(ScheduleKind::kOneFOneB, 4, 1, 4), bwd(0, 2)},
                             std::pair{pairs, fwd(0, 2)}, std::pair{pairs, bwd(1, 1)},
                             std::pair{offloaded, offload(0, 1)}, std::pair{offloaded, reload(0, 2)},
                             std::pair{offloaded, bwd(0, 2)}}) {
    INFO(schedule_name(p.shape.kind) << (has_pairs(p) ? "+overlap" : "") << " P=" << p.shape.devices << " "
                                     << to_string(a));
    auto fault = std::make_shared<Fault>();
    fault->device = 1;
    fault->action = a;
    // A hang would end in a timeout error instead of the injected one.
    auto pipe = make_test_pipeline(p, s, fault, opt, 5s);
    SequentialTrainer<CpuBackend> seq(CpuBackend{}, s.spec, s.init, s.rows, 4, opt);
    pipe->train_step(s.task.inputs, s.task.targets);
    seq.train_step(s.task.inputs, s.task.targets);
    const HostModel before = weights_of(*pipe, s.spec);
    fault->armed = true;
    CHECK_THROWS_WITH(pipe->train_step(s.task.inputs, s.task.targets),
                      Catch::StartsWith("device 1, step ") && Catch::Contains(", " + to_string(a) + " (stage ") &&
                          Catch::EndsWith("injected fault (the step was not applied: every device kept its parameters)"));
    CHECK(weights_of(*pipe, s.spec) == before);
    // The pipeline recovers: the next step runs and still equals the reference.
    fault->armed = false;
    pipe->train_step(s.task.inputs, s.task.targets);
    seq.train_step(s.task.inputs, s.task.targets);
    CHECK(weights_of(*pipe, s.spec) == seq.weights());
  }
}

TEST_CASE("data parallelism: a failure on one device of one replica stops all P x D devices", "[runtime]") {
  // A throwing chunk (the forward of a pair or a plain backward) and a non-finite
  // loss in one replica only: every device of every replica stops, the error names
  // the device and the replica, no parameter changes, and the next step trains on.
  const Setup s = setup(8, 4);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
  const int D = 2;
  const Program pairs = with_grad_reduce(overlap(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4)));
  const Program plain = with_grad_reduce(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4));
  std::vector<float> inputs = s.task.inputs, targets = s.task.targets;  // the batch twice: a shard per replica
  inputs.insert(inputs.end(), s.task.inputs.begin(), s.task.inputs.end());
  targets.insert(targets.end(), s.task.targets.begin(), s.task.targets.end());
  for (const auto& [p, a, in_place] :
       {std::tuple{pairs, fwd(0, 2), false}, std::tuple{plain, bwd(0, 2), false}, std::tuple{pairs, fwd(0, 2), true},
        std::tuple{plain, bwd(0, 2), true}}) {
    INFO(schedule_name(p.shape.kind) << (has_pairs(p) ? "+overlap" : "") << " " << to_string(a)
                                     << (in_place ? " in place" : " host copy"));
    auto fault = std::make_shared<Fault>();
    fault->device = 1;
    fault->replica = 1;
    fault->action = a;
    auto pipe = make_replicated_pipeline(p, s, D, fault, opt, 5s,  // a hang would end in a timeout instead
                                         in_place ? HostReplicaGroup<CpuBackend>::factory() : MakeReplicaCollective{});
    SequentialTrainer<CpuBackend> seq = replicated_reference(p, s, D, opt);
    pipe->train_step(inputs, targets);
    seq.train_step(inputs, targets);
    const HostModel before = weights_of(*pipe, s.spec);
    fault->armed = true;
    CHECK_THROWS_WITH(pipe->train_step(inputs, targets),
                      Catch::StartsWith("replica 1: device 1, step ") && Catch::Contains(", " + to_string(a) + " (stage ") &&
                          Catch::EndsWith("injected fault (the step was not applied: every device kept its parameters)"));
    CHECK(weights_of(*pipe, s.spec) == before);
    fault->armed = false;
    std::vector<float> poisoned = inputs;
    poisoned[(s.rows + 2 * 2) * 4 + 1] = std::numeric_limits<float>::quiet_NaN();  // replica 1, its micro-batch 2
    CHECK_THROWS_WITH(pipe->train_step(poisoned, targets),
                      Catch::StartsWith("training step 3: replica 1: device 1: the loss of micro-batch 2 is nan") &&
                          Catch::EndsWith("the step was not applied: every device kept its parameters"));
    CHECK(weights_of(*pipe, s.spec) == before);
    pipe->train_step(inputs, targets);
    seq.train_step(inputs, targets);
    CHECK(weights_of(*pipe, s.spec) == seq.weights());
  }
}

namespace {

// What FaultyGroup injects, shared by the groups of every device.
struct Injection {
  std::atomic<bool> armed{false};
  std::atomic<int> started{0}, finished{0};  // replica 0's sums past the meeting, and those written
};

// HostReplicaGroup's sum in place, except while armed at chunk `chunk`: once both replicas have posted
// their gradients, replica 1 throws, and replica 0 sums into both replicas' gradients 300 ms later,
// after replica 1's failure has stopped the run. (A device whose replica 0 had not met replica 1
// when the first failure stopped the run stops in the meeting instead.)
class FaultyGroup final : public InPlaceReplicaGroup<CpuBackend> {
 public:
  FaultyGroup(int device, int replicas, std::chrono::milliseconds timeout, int chunk,
              std::shared_ptr<Injection> injection)
      : InPlaceReplicaGroup(device, replicas, timeout), device_(device), chunk_(chunk),
        injection_(std::move(injection)), posted_(static_cast<std::size_t>(replicas)) {}
  void all_reduce_on(CpuBackend& b, int replica, int chunk, std::span<const std::span<float>> tensors) override {
    b.synchronize();
    if (!injection_->armed.load() || chunk != chunk_) return host().all_reduce(replica, chunk, tensors);
    posted_[static_cast<std::size_t>(replica)] = tensors;
    host().match(replica, chunk, tensors);  // both posted (and published to each other)
    if (replica == 1) throw_error({.device = device_}, "injected reduction fault");
    injection_->started.fetch_add(1);
    std::this_thread::sleep_for(300ms);
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (std::size_t i = 0; i < tensors[t].size(); ++i) {
        const float sum = posted_[0][t][i] + posted_[1][t][i];
        posted_[0][t][i] = sum;
        posted_[1][t][i] = sum;
      }
    injection_->finished.fetch_add(1);
  }

 private:
  int device_;
  int chunk_;
  std::shared_ptr<Injection> injection_;
  std::vector<std::span<const std::span<float>>> posted_;  // [replica]: its gradients of the chunk
};

}  // namespace

TEST_CASE("data parallelism: a reduction that fails in one replica stops every device, in place", "[runtime]") {
  // Replica 1's reduction throws while replica 0's still writes into both replicas' gradients: every
  // device stops with that error, no parameter changes, the step waits for every reducer before it
  // throws (so the pipeline may be destroyed right after one such step), and the next step trains on,
  // bit for bit. The faulty reduction is each device's first (of chunk V - 1): with V = 2 the device
  // goes on to chunk 0's backwards and their transfers while its reducer waits, and replica 0's device
  // 1 sleeps 100 ms in its last backward, so replica 0's device 0 waits for its gradient there: the
  // failure stops both devices' threads long before their reducers end.
  const Setup s = setup(8, 4);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
  const int D = 2;
  std::vector<float> inputs = s.task.inputs, targets = s.task.targets;
  inputs.insert(inputs.end(), s.task.inputs.begin(), s.task.inputs.end());
  targets.insert(targets.end(), s.task.targets.begin(), s.task.targets.end());
  for (const Program& p : {with_grad_reduce(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 4)),
                           with_grad_reduce(overlap(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4)))}) {
    INFO(schedule_name(p.shape.kind) << (has_pairs(p) ? "+overlap" : ""));
    auto injection = std::make_shared<Injection>();
    auto slow = std::make_shared<Fault>();
    slow->device = 1;
    slow->replica = 0;
    slow->action = bwd(0, p.shape.micro_batches - 1);
    slow->act = [] { std::this_thread::sleep_for(100ms); };
    auto pipe = make_replicated_pipeline(
        p, s, D, slow, opt, 5s,
        [injection, chunk = p.shape.chunks - 1](int d, int replicas, std::chrono::milliseconds timeout)
            -> std::unique_ptr<ReplicaCollective> {
          return std::make_unique<FaultyGroup>(d, replicas, timeout, chunk, injection);
        });
    SequentialTrainer<CpuBackend> seq = replicated_reference(p, s, D, opt);
    pipe->train_step(inputs, targets);
    seq.train_step(inputs, targets);
    const HostModel before = weights_of(*pipe, s.spec);
    injection->armed.store(true);
    slow->armed = true;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(pipe->train_step(inputs, targets),
                      Catch::StartsWith("replica 1: device ") && Catch::Contains("injected reduction fault") &&
                          Catch::EndsWith("(the step was not applied: every device kept its parameters)"));
    CHECK(std::chrono::steady_clock::now() - start < 4s);  // not the 5 s timeout
    CHECK(injection->started.load() >= 1);  // at least the device that failed first met its replica 0
    CHECK(injection->finished.load() == injection->started.load());  // every reducer ended before the step threw
    CHECK(weights_of(*pipe, s.spec) == before);
    injection->armed.store(false);
    slow->armed = false;
    pipe->train_step(inputs, targets);
    seq.train_step(inputs, targets);
    CHECK(weights_of(*pipe, s.spec) == seq.weights());
    injection->armed.store(true);
    CHECK_THROWS(pipe->train_step(inputs, targets));
    pipe.reset();  // right after a failed step: no reducer may still write into a freed device's memory
  }
}

TEST_CASE("data parallelism: a reduction waits for a late replica beside the device's later actions", "[runtime]") {
  // P = 1, V = 2: R1 follows chunk 1's last backward, and chunk 0's backwards come
  // after it. Replica 1 is 100 ms late to R1 (it sleeps in its last backward of
  // chunk 1), so replica 0's R1 ends 100 ms on; replica 0's device meanwhile runs
  // chunk 0's backwards, which end well before: its reduction ran beside them, not
  // in their way. The step still trains bit for bit.
  const Setup s = setup(4, 2);
  const OptimizerConfig opt{OptimizerKind::kSgd, 0.05f};
  const int D = 2;
  const Program p = with_grad_reduce(make_schedule(ScheduleKind::kInterleaved1F1B, 1, 2, 2));
  std::vector<float> inputs = s.task.inputs, targets = s.task.targets;
  inputs.insert(inputs.end(), s.task.inputs.begin(), s.task.inputs.end());
  targets.insert(targets.end(), s.task.targets.begin(), s.task.targets.end());
  auto fault = std::make_shared<Fault>();
  fault->device = 0;
  fault->replica = 1;
  fault->action = bwd(1, 1);
  fault->act = [] { std::this_thread::sleep_for(100ms); };
  fault->armed = true;
  auto pipe = make_replicated_pipeline(p, s, D, fault, opt, 5s);
  SequentialTrainer<CpuBackend> seq = replicated_reference(p, s, D, opt);
  pipe->train_step(inputs, targets);
  seq.train_step(inputs, targets);
  CHECK(weights_of(*pipe, s.spec) == seq.weights());
  const Trace& t = pipe->trace();  // replica 0's devices
  REQUIRE(t.collective[0].size() == 2);
  const TraceEvent& r1 = t.collective[0][0];
  CHECK(r1.action == reduce_grad(1));
  double last_compute_end = 0, chunk0_backward_start = 1e300;
  for (const TraceEvent& e : t.compute[0]) {
    last_compute_end = std::max(last_compute_end, e.end);
    if (e.action.phase == Phase::kBackward && e.action.chunk == 0) chunk0_backward_start = std::min(chunk0_backward_start, e.start);
  }
  CHECK(r1.end - r1.start >= 90e3);                  // it waited for replica 1
  CHECK(last_compute_end < r1.end - 50e3);           // the device's later actions did not
  CHECK(chunk0_backward_start < r1.end);             // they ran while R1 waited
  CHECK(t.collective[0][1].action == reduce_grad(0));
  CHECK(exposed_reduction(t, 0) > 0);
}

TEST_CASE("a device's side thread runs each job on a thread of its own and hands back its error", "[runtime]") {
  for (const auto spin : {0us, 2000us}) {  // asleep between jobs, and polling
    SideThread side(spin);
    std::thread::id ran_on;
    int runs = 0;
    auto job = [&] {
      ran_on = std::this_thread::get_id();
      ++runs;
    };
    for (int k = 0; k < 3; ++k) {
      side.start(job);
      CHECK(side.finish() == nullptr);
    }
    CHECK(runs == 3);
    CHECK(ran_on != std::this_thread::get_id());
    auto failing = [] { throw std::runtime_error("side fault"); };
    side.start(failing);
    const std::exception_ptr e = side.finish();
    REQUIRE(e != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(e), "side fault");
    side.start(job);  // usable again after a failed job
    CHECK(side.finish() == nullptr);
    CHECK(runs == 4);
    CHECK(side.finish() == nullptr);  // nothing running: returns at once
  }
}

TEST_CASE("a device's queue thread runs posted items in order, beside the poster, and hands back the first error",
          "[runtime]") {
  for (const auto spin : {0us, 2000us}) {  // asleep between items, and polling
    std::vector<int> seen;
    std::thread::id ran_on;
    std::atomic<bool> release{false};
    QueueThread queue(
        [&](int item) {
          while (item == 1 && !release.load()) std::this_thread::yield();  // item 1 waits for the poster
          if (item == 7) throw std::runtime_error("queue fault " + std::to_string(item));
          ran_on = std::this_thread::get_id();
          seen.push_back(item);
        },
        4, spin);
    queue.post(1);
    queue.post(2);  // queued behind 1, which runs on until released: post() returns at once
    queue.post(3);
    release = true;
    CHECK(queue.drain() == nullptr);
    CHECK(seen == std::vector<int>{1, 2, 3});
    CHECK(ran_on != std::this_thread::get_id());
    queue.post(7);  // throws: the items after it are skipped, drain() gives its error
    queue.post(4);
    const std::exception_ptr e = queue.drain();
    REQUIRE(e != nullptr);
    CHECK_THROWS_WITH(std::rethrow_exception(e), "queue fault 7");
    CHECK(seen == std::vector<int>{1, 2, 3});
    queue.post(5);  // usable again after a drain
    CHECK(queue.drain() == nullptr);
    CHECK(seen == std::vector<int>{1, 2, 3, 5});
    CHECK(queue.drain() == nullptr);  // nothing posted: returns at once
  }
}

TEST_CASE("a device that stalls makes its peer time out, naming device, step and message", "[runtime]") {
  const Setup s = setup(4, 2);
  auto fault = std::make_shared<Fault>();
  fault->device = 1;
  fault->action = fwd(0, 0);
  fault->act = [] { std::this_thread::sleep_for(1s); };  // far past the 50 ms timeout
  fault->armed = true;
  auto pipe = make_test_pipeline(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), s, fault, {}, 50ms);
  CHECK_THROWS_WITH(pipe->train_step(s.task.inputs, s.task.targets),
                    Catch::StartsWith("device 0, step ") &&
                        Catch::Contains(": timed out after 50 ms waiting for device 1 to receive activation(stage 0, "
                                        "micro-batch 1), 48 bytes of fp32"));
  CHECK(weights_of(*pipe, s.spec) == s.init);
}
