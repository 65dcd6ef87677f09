// A chunk, a loss and an update rule of one's own (custom_model.hpp: tanh stages,
// the Huber loss; the Sgd and Adam rules used directly rather than through
// OptimizerConfig) train through every schedule on the CPU pipeline, bit for bit
// like sequential training of the same stages; the executor knows nothing of them.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "custom_model.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"

using namespace pipeweave;
using cpu::CpuBackend;
using cpu::RendezvousEndpoint;
using Stage = test::TanhChunk<CpuBackend>;
using Huber = test::HuberLoss<CpuBackend>;

static_assert(Chunk<Stage, CpuBackend>);
static_assert(Loss<Huber, CpuBackend>);

namespace {

constexpr std::size_t kFeatures = 5;
constexpr std::uint64_t kSeed = 3;

struct Batch {
  std::vector<float> inputs, targets;
};

Batch make_batch(int rows) {
  Rng rng(11);
  Batch b;
  b.inputs.resize(static_cast<std::size_t>(rows) * kFeatures);
  b.targets.resize(b.inputs.size());
  for (float& v : b.inputs) v = rng.uniform(-1.0f, 1.0f);
  for (float& v : b.targets) v = rng.uniform(-2.0f, 2.0f);  // far enough for both pieces of the Huber loss
  return b;
}

// The same stage, without the promise that its forward may run twice alike (RecomputableChunk), nor
// the means to move what it keeps to host memory (OffloadableChunk: its offload hidden).
struct Once : Stage {
  using Stage::Stage;
  static constexpr bool recomputable = false;
  void offload() = delete;
};

template <class O>
void train_both(const Program& program, const O& rule, int steps, DType dtype = DType::kF32,
                DType weights = DType::kF32) {
  const ScheduleShape& s = program.shape;
  const int rows = 2 * s.micro_batches;
  const Batch batch = make_batch(rows);
  auto ends = cpu::make_rendezvous(s.devices);
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, Stage> parts{{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    for (int c = 0; c < s.chunks; ++c)
      parts.chunks.emplace_back(parts.backend, kFeatures, s.stage_of(d, c), kSeed, dtype, weights);
    return parts;
  };
  Pipeline<CpuBackend, RendezvousEndpoint, Stage, Huber, O> pipe(program, make_device, {rows, rule});
  auto stages = [&](CpuBackend& b) {
    std::vector<Stage> chunks;
    for (int stage = 0; stage < s.stages(); ++stage) chunks.emplace_back(b, kFeatures, stage, kSeed, dtype, weights);
    return chunks;
  };
  SequentialTrainer<CpuBackend, Stage, Huber, O> seq(CpuBackend{}, stages, rows, s.micro_batches, rule);
  const std::vector<std::vector<float>> init = seq.stage_parameters();
  for (int step = 0; step < steps; ++step) {
    const double a = pipe.train_step(batch.inputs, batch.targets).loss;
    const double b = seq.train_step(batch.inputs, batch.targets);
    CHECK(a == b);
    CHECK(a > 0);
  }
  const std::vector<std::vector<float>> got = pipe.stage_parameters(), want = seq.stage_parameters();
  CHECK(got == want);
  CHECK_FALSE(got == init);  // training changed something
  REQUIRE(got.size() == static_cast<std::size_t>(s.stages()));
  for (const auto& stage : got) CHECK(stage.size() == 2 * kFeatures);
  for (int d = 0; d < s.devices; ++d)
    for (const Message& m : pipe.messages(d)) CHECK(m.dtype == dtype);
  // The engine's copies of the parameters are those of the last update, rounded; and those of a
  // state set since.
  // (Each device's thread counts into its own entry; the checks run here, Catch2's assertions not
  // being thread-safe.)
  auto copies_follow = [&] {
    std::vector<std::size_t> copies(static_cast<std::size_t>(s.devices)), off(copies.size());
    pipe.for_each_device([&](int d, auto& parts) {
      for (const Stage& chunk : parts.chunks) {
        if (!chunk.parameter_copy()) continue;
        ++copies[static_cast<std::size_t>(d)];
        const ParameterView& p = chunk.parameters()[0];
        const bf16* copy = chunk.parameter_copy().as<bf16>();
        for (std::size_t i = 0; i < p.count; ++i) off[static_cast<std::size_t>(d)] += copy[i].bits != to_bf16(p.value[i]).bits;
      }
    });
    for (std::size_t d = 0; d < copies.size(); ++d) {
      CHECK(copies[d] == (weights != DType::kF32 ? static_cast<std::size_t>(s.chunks) : 0));
      CHECK(off[d] == 0);
    }
  };
  copies_follow();
  TrainingState halved = pipe.state();
  for (StageState& stage : halved.stages)
    for (float& v : stage.parameters) v *= 0.5f;
  pipe.set_state(halved);
  copies_follow();
}

}  // namespace

TEST_CASE("a chunk and a loss of one's own train through every schedule bit for bit like sequential training",
          "[runtime]") {
  struct Case {
    ScheduleKind kind;
    int P, V, M;
  };
  const std::vector<Case> grid = {
      {ScheduleKind::kGPipe, 1, 1, 1},           {ScheduleKind::kGPipe, 2, 1, 3},
      {ScheduleKind::kGPipe, 3, 1, 4},           {ScheduleKind::kOneFOneB, 2, 1, 4},
      {ScheduleKind::kOneFOneB, 4, 1, 3},        {ScheduleKind::kInterleaved1F1B, 2, 2, 4},
      {ScheduleKind::kInterleaved1F1B, 3, 2, 3}, {ScheduleKind::kInterleaved1F1B, 1, 3, 2},
      {ScheduleKind::kInterleaved1F1B, 4, 2, 8},  // the seed shape
  };
  for (const Case& c : grid) {
    INFO(schedule_name(c.kind) << " P=" << c.P << " V=" << c.V << " M=" << c.M);
    const Program program = make_schedule(c.kind, c.P, c.V, c.M);
    SECTION(std::string(schedule_name(c.kind)) + " " + std::to_string(c.P) + "/" + std::to_string(c.V) + "/" +
            std::to_string(c.M)) {
      train_both(program, Sgd{0.05f, 0.9f}, 3);
      train_both(program, Adam{0.01f}, 3);
      train_both(program, Adam{0.01f}, 3, DType::kBF16);  // bf16 between the stages
      train_both(program, Adam{0.01f}, 3, DType::kBF16, DType::kBF16);  // and bf16 copies of the weights
      // Every micro-batch recomputed: the chunk's forward runs again before each backward.
      train_both(with_recompute(program, all_stages(program.shape)), Adam{0.01f}, 3, DType::kBF16, DType::kBF16);
      // Every stage offloaded where a micro-batch lives long enough: each reload hands x and y back.
      train_both(with_offload(program, all_stages(program.shape)), Adam{0.01f}, 3, DType::kBF16);
    }
  }
}

TEST_CASE("the batch's targets take the loss's shape", "[runtime]") {
  const Program program = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  auto ends = cpu::make_rendezvous(2);
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, Stage> parts{{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    parts.chunks.emplace_back(parts.backend, kFeatures, d, kSeed);
    return parts;
  };
  Pipeline<CpuBackend, RendezvousEndpoint, Stage, Huber, Sgd> pipe(program, make_device, {4, Sgd{0.1f}});
  const Batch batch = make_batch(4);
  const std::vector<float> short_targets(batch.targets.begin(), batch.targets.end() - 1);
  CHECK_THROWS_WITH(pipe.train_step(batch.inputs, short_targets),
                    "train_step: expected 20 input and 20 target values (4 samples), got 20 and 19");
  CHECK(pipe.train_step(batch.inputs, batch.targets).loss > 0);
}

TEST_CASE("a chunk that does not say it may be recomputed is refused by a program that recomputes", "[runtime]") {
  static_assert(RecomputableChunk<Stage> && !RecomputableChunk<Once>);
  const Program program = with_recompute(make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2), {1});
  auto ends = cpu::make_rendezvous(2);
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, Once> parts{{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    parts.chunks.emplace_back(parts.backend, kFeatures, d, kSeed);
    return parts;
  };
  using Pipe = Pipeline<CpuBackend, RendezvousEndpoint, Once, Huber, Sgd>;
  CHECK_THROWS_WITH(Pipe(program, make_device, {4, Sgd{0.1f}}),
                    Catch::Contains("device 1: the program recomputes micro-batches (C), but the chunk does not say "
                                    "that its forward may run twice alike"));
}

TEST_CASE("a chunk that cannot move what it keeps is refused by a program that offloads", "[runtime]") {
  static_assert(OffloadableChunk<Stage, CpuBackend> && !OffloadableChunk<Once, CpuBackend>);
  const Program program = with_offload(make_schedule(ScheduleKind::kGPipe, 2, 1, 4), {0});
  REQUIRE(offloads(program) > 0);
  auto ends = cpu::make_rendezvous(2);
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, Once> parts{{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    parts.chunks.emplace_back(parts.backend, kFeatures, d, kSeed);
    return parts;
  };
  using Pipe = Pipeline<CpuBackend, RendezvousEndpoint, Once, Huber, Sgd>;
  CHECK_THROWS_WITH(Pipe(program, make_device, {4, Sgd{0.1f}}),
                    Catch::Contains("device 0: the program offloads stashes to host memory (O, L), but the chunk does "
                                    "not say how to move what it keeps"));
}

TEST_CASE("a chunk with only a full backward is refused by a schedule that splits backwards", "[runtime]") {
  static_assert(!SplitChunk<Stage, CpuBackend>);
  const Program program = make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 2);
  auto ends = cpu::make_rendezvous(2);
  auto make_device = [&](int d) {
    DeviceParts<CpuBackend, RendezvousEndpoint, Stage> parts{{}, std::move(ends[static_cast<std::size_t>(d)]), {}};
    parts.chunks.emplace_back(parts.backend, kFeatures, d, kSeed);
    return parts;
  };
  using Pipe = Pipeline<CpuBackend, RendezvousEndpoint, Stage, Huber, Sgd>;
  CHECK_THROWS_WITH(Pipe(program, make_device, {4, Sgd{0.1f}}),
                    Catch::Contains("the schedule splits backwards into I and W, but the chunk offers only a full "
                                    "backward"));
}
