// The CPU backend across processes (the program starts `mpirun -n 4` on itself):
// MPI point-to-point (mpi/transport.hpp) matches per directed pair in FIFO order
// and checks every message; mismatches, timeouts, aborts and silent ranks are
// errors that name what they are about, and reset() drains what a failed group
// left in flight. The multi-process host trains every schedule, and a chunk and
// a loss of one's own, bit for bit like sequential training. Faults: a rank that
// throws inside a chunk at step k stops every rank and none applies step k (the
// run then goes on); a rank that is merely slow fails nothing; ranks started with
// different settings refuse together, naming the first that differs. Data
// parallelism (2 devices x 2 replicas, 1 x 4): bit for bit like sequential
// training over the global batch in either rank layout, every replica holding
// the same parameters; a fault in one replica stops every rank; ranks started
// with other replicas or another layout refuse.
#include "pipeweave/cpu/mpi.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/mpi_launch.hpp"
#include "fault_pipeline.hpp"
#include "../runtime/custom_model.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/overlap.hpp"

using namespace std::chrono_literals;
namespace pw = pipeweave;
namespace pm = pipeweave::mpi;
using pw::cpu::CpuBackend;
using pipeweave::test::error_of;
using pipeweave::test::world_rank;
using pipeweave::test::world_size;
using pipeweave::test::FaultPipeline;
using pipeweave::test::local_weights;
using pipeweave::test::make_fault_pipeline;
using Model = pipeweave::test::FaultModel;

namespace {

pw::Message activation(int stage, int micro_batch, std::size_t floats) {
  return {{pw::TensorKind::kActivation, stage, micro_batch}, floats * sizeof(float)};
}
pw::Message gradient(int stage, int micro_batch, std::size_t floats) {
  return {{pw::TensorKind::kGradient, stage, micro_batch}, floats * sizeof(float)};
}

// A connected endpoint of this rank whose waits end after `timeout`.
pm::HostEndpoint connected(std::chrono::milliseconds timeout) {
  pm::HostEndpoint end(std::make_shared<pm::Control>(MPI_COMM_WORLD, timeout));
  end.connect();
  return end;
}

// One group of this rank: `sends` and `recvs` as (peer, message, data).
using Ops = std::vector<std::tuple<int, pw::Message, float*>>;
void group(pm::HostEndpoint& end, int step, const Ops& sends, const Ops& recvs) {
  end.group_begin(step);
  for (const auto& [peer, m, data] : recvs) end.recv(peer, m, data);
  for (const auto& [peer, m, data] : sends) end.send(peer, m, data);
  end.group_end();
}

// The lowest and highest of `v` over all ranks.
std::pair<double, double> range_over_ranks(double v) {
  double lo = v, hi = v;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return {lo, hi};
}

// True when every rank that holds the same pipeline device (of `grid`) holds the
// same parameters (`mine`, this rank's; compared by a 64-bit FNV-1a of their bytes).
bool replicas_hold_the_same(const pw::RankGrid& grid, const std::vector<std::vector<float>>& mine) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& v : mine)
    for (const float f : v) {
      unsigned char bytes[sizeof f];
      std::memcpy(bytes, &f, sizeof f);
      for (const unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
    }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 0; r < world_size(); ++r)
    if (all[static_cast<std::size_t>(r)] != all[static_cast<std::size_t>(grid.rank(0, grid.device(r)))]) return false;
  return true;
}

}  // namespace

TEST_CASE("mpi transport: messages match per directed pair in FIFO order and arrive whole", "[mpi]") {
  pm::HostEndpoint end = connected(20s);
  const int P = end.devices(), r = end.device(), next = (r + 1) % P, prev = (r + P - 1) % P;
  for (int step = 0; step < 3; ++step) {
    // Two activations of different sizes to the next rank, a gradient (and an empty one) to the previous.
    std::vector<float> a0(5, 100.0f * r + step), a1(3, 100.0f * r + step + 0.5f), g(2, -1.0f * r - step);
    std::vector<float> in0(5, 0.0f), in1(3, 0.0f), back(2, 0.0f);
    group(end, step,
          {{next, activation(r, step, 5), a0.data()}, {next, activation(r, step + 1, 3), a1.data()},
           {prev, gradient(r, step, 2), g.data()}, {prev, gradient(r, 9, 0), nullptr}},
          {{prev, activation(prev, step, 5), in0.data()}, {prev, activation(prev, step + 1, 3), in1.data()},
           {next, gradient(next, step, 2), back.data()}, {next, gradient(next, 9, 0), nullptr}});
    CHECK(in0 == std::vector<float>(5, 100.0f * prev + step));
    CHECK(in1 == std::vector<float>(3, 100.0f * prev + step + 0.5f));
    CHECK(back == std::vector<float>(2, -1.0f * next - step));
  }
  CHECK(end.agree(true));
  CHECK_FALSE(end.agree(r != 2));
  CHECK_THROWS_WITH([&] {
    end.group_begin(4);
    end.send(r, activation(0, 0, 1), nullptr);
  }(), Catch::Contains("peer " + std::to_string(r) + " is not another rank (ranks are 0..3)"));
  end.group_end();
}

TEST_CASE("mpi transport: a receive that meets another message names both sides; reset drains the rest", "[mpi]") {
  pm::HostEndpoint end = connected(20s);
  const int r = end.device();
  std::vector<float> sent(4, 7.0f), got(4, 0.0f);
  std::string what;
  if (r == 0) what = error_of([&] { group(end, 4, {{1, activation(0, 1, 4), sent.data()}}, {}); });
  if (r == 1) {
    what = error_of([&] { group(end, 4, {}, {{0, activation(0, 0, 4), got.data()}}); });
    CHECK(what == "device 1, step 4 expects from device 0 activation(stage 0, micro-batch 0), 16 bytes of fp32, but the "
                  "message it matches, sent by device 0 at its step 4, is activation(stage 0, micro-batch 1), 16 bytes of fp32");
    CHECK(got == std::vector<float>(4, 0.0f));  // no byte of it landed
    end.abort(what);
  }
  if (r != 1) {
    // The sender's group may complete before the notice arrives; every rank stops
    // at its next wait at the latest.
    if (what.empty()) what = error_of([&] { end.agree(true); });
    CHECK_THAT(what, Catch::Contains("rank 1 failed: device 1, step 4 expects"));
  }
  end.reset();
  // The drained payload is gone: the next message from rank 0 is the new one.
  sent.assign(4, 8.0f);
  if (r == 0) group(end, 5, {{1, activation(0, 0, 4), sent.data()}}, {});
  if (r == 1) group(end, 5, {}, {{0, activation(0, 0, 4), got.data()}});
  if (r == 1) CHECK(got == std::vector<float>(4, 8.0f));
  CHECK(end.agree(true));
}

TEST_CASE("mpi transport: a wait past the timeout names the rank and the message", "[mpi]") {
  // Rank 0 waits 300 ms; the others wait longer, answering its roll call meanwhile.
  const int r = world_rank();
  pm::HostEndpoint end = connected(r == 0 ? 300ms : 10s);
  std::vector<float> never(2, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  if (r == 0) {
    const std::string what = error_of([&] { group(end, 7, {}, {{1, activation(1, 2, 2), never.data()}}); });
    CHECK(what == "device 0, step 7: timed out after 300 ms waiting for device 1 to send activation(stage 1, "
                  "micro-batch 2), 8 bytes of fp32");
    end.abort(what);
  } else {
    CHECK_THAT(error_of([&] { end.agree(true); }),
               Catch::Contains("because another rank failed: rank 0 failed: device 0, step 7: timed out after 300 ms"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  end.reset();
  CHECK(end.agree(true));
}

TEST_CASE("mpi transport: a rank that does not answer the roll call is named as lost", "[mpi]") {
  // Rank 3 stops polling (as a killed or hung process would) while rank 0 waits for it.
  const int r = world_rank();
  pm::HostEndpoint end = connected(r == 0 ? 300ms : 10s);
  std::vector<float> never(2, 0.0f);
  if (r == 0) {
    const std::string what = error_of([&] { group(end, 2, {}, {{3, gradient(3, 0, 2), never.data()}}); });
    CHECK(what == "device 0, step 2: timed out after 300 ms waiting for device 3 to send gradient(stage 3, "
                  "micro-batch 0), 8 bytes of fp32; rank 3 does not answer (roll call, 500 ms): it is lost (the process "
                  "ended, or hangs outside the library's waits)");
    end.abort(what);
  } else {
    if (r == 3) std::this_thread::sleep_for(1500ms);
    CHECK_THAT(error_of([&] { end.agree(true); }), Catch::Contains("rank 0 failed: ") &&
                                                       Catch::Contains("rank 3 does not answer (roll call, 500 ms)"));
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 3 is back before rank 0's short reset wait starts
  end.reset();
  CHECK(end.agree(true));
}

TEST_CASE("mpi transport: an abort on one rank stops the waits of all", "[mpi]") {
  const int r = world_rank();
  pm::HostEndpoint end = connected(20s);
  std::vector<float> never(1, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  if (r == 2) {
    std::this_thread::sleep_for(100ms);
    end.abort("rank 2 gave up");
  } else {
    // Every other rank waits for rank 2, which never sends.
    CHECK(error_of([&] { group(end, 3, {}, {{2, activation(2, 0, 1), never.data()}}); }) ==
          "rank " + std::to_string(r) + ", step 3: stopped because another rank failed: rank 2 failed: rank 2 gave up");
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // the notice, not the 20 s timeout
  end.reset();
  CHECK(end.agree(true));
}

TEST_CASE("mpi: every schedule across processes trains bit for bit like sequential training", "[mpi]") {
  const int P = world_size(), rank = world_rank();
  const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.003f};
  using Case = std::tuple<pw::ScheduleKind, int, int, bool>;  // kind, V, M, every stage offloaded (with_offload())
  const std::vector<Case> generated = {{pw::ScheduleKind::kGPipe, 1, 4, false}, {pw::ScheduleKind::kOneFOneB, 1, 6, false},
                                       {pw::ScheduleKind::kInterleaved1F1B, 2, 2 * P, false},
                                       {pw::ScheduleKind::kOneFOneB, 1, 2 * P, true}};
  // With bf16 activations, every other kind too: split backwards, reverse order, overlapped pairs.
  const std::vector<Case> more = {{pw::ScheduleKind::kLoopedBFS, 2, P, false},
                                  {pw::ScheduleKind::kZeroBubbleH1, 1, 2 * P, false},
                                  {pw::ScheduleKind::kInterleavedZeroBubble, 2, 2 * P, false},
                                  {pw::ScheduleKind::kZeroBubbleV, 2, 2 * P, false},
                                  {pw::ScheduleKind::kDualPipeV, 2, 2 * P, false},
                                  {pw::ScheduleKind::kZeroBubbleH1, 1, 2 * P, true}};
  for (const pw::DType dtype : {pw::DType::kF32, pw::DType::kBF16}) {
    pw::MlpSpec spec = pw::MlpSpec::uniform(2 * P, 12, 16, 10, 3);
    spec.dtype = dtype;
    std::vector<Case> cases = generated;
    if (dtype == pw::DType::kBF16) cases.insert(cases.end(), more.begin(), more.end());
    for (const auto& [kind, V, M, offloaded] : cases) {
      INFO(pw::schedule_name(kind) << (offloaded ? " offloaded" : "") << ", " << pw::dtype_name(dtype) << " activations");
      const pw::Program plain = pw::make_schedule(kind, P, V, M);
      const pw::Program program = offloaded ? pw::with_offload(plain, pw::all_stages(plain.shape)) : plain;
      const int rows = 4 * M;
      const pw::RegressionTask task = pw::make_regression_task(spec, rows, 9);
      const pw::HostModel init = pw::init_mlp(spec);
      auto pipe = pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, init, {rows, opt, 20s});
      CHECK(pipe->rank() == rank);
      std::unique_ptr<pw::SequentialTrainer<CpuBackend>> reference;
      if (rank == 0) {
        reference = std::make_unique<pw::SequentialTrainer<CpuBackend>>(CpuBackend{}, spec, init, rows, M, opt);
        reference->set_gradient_order(pw::gradient_order(program));
      }
      for (int step = 0; step < 3; ++step) {
        const double loss = pipe->train_step(task.inputs, task.targets).loss;
        const auto [lowest, highest] = range_over_ranks(loss);
        CHECK(lowest == highest);  // every rank reports the same loss
        if (rank == 0) CHECK(loss == reference->train_step(task.inputs, task.targets));
      }
      const pw::HostModel got = pw::download_weights(*pipe, spec);
      const pw::Trace trace = pipe->gather_trace();
      if (rank == 0) {
        CHECK(got == reference->weights());
        if (kind == pw::ScheduleKind::kGPipe || kind == pw::ScheduleKind::kOneFOneB ||
            kind == pw::ScheduleKind::kInterleaved1F1B)  // one F and one B per (stage, micro-batch)
          for (int d = 0; d < P; ++d)
            CHECK(static_cast<int>(trace.compute[static_cast<std::size_t>(d)].size()) == 2 * V * M);
        // Every rank's peaks and copies reach the root: memory in activations and, measured from the buffers,
        // in bytes (the MLP's memory model: no stage's next stage is on its rank here).
        CHECK(trace.peak_activations == pw::peak_activations(program));
        CHECK(trace.peak_memory == pw::peak_memory(program));
        CHECK(trace.peak_bytes == pw::peak_memory(program, pw::mlp_memory_model(spec, program.shape, rows / M)));
        for (int d = 0; d < P; ++d) {
          const auto& actions = program.devices[static_cast<std::size_t>(d)];
          CHECK(static_cast<long>(trace.copies[static_cast<std::size_t>(d)].size()) ==
                std::count_if(actions.begin(), actions.end(), [](const pw::Action& a) { return pw::is_copy(a.phase); }));
        }
      }
    }
  }
}

TEST_CASE("mpi: a chunk and a loss of one's own train across processes like sequential training", "[mpi]") {
  using Chunk = pw::test::TanhChunk<CpuBackend>;
  using Loss = pw::test::HuberLoss<CpuBackend>;
  const int P = world_size(), rank = world_rank();
  constexpr std::size_t features = 6;
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, P, 2, P);
  const int rows = 2 * P;
  auto make_device = [&](const std::shared_ptr<pm::Control>& control) {
    return pw::cpu::make_mpi_device<Chunk>(control, [&](CpuBackend& b) {
      std::vector<Chunk> chunks;
      for (int c = 0; c < 2; ++c) chunks.emplace_back(b, features, program.shape.stage_of(control->rank(), c), 3);
      return chunks;
    });
  };
  pm::MpiPipeline<CpuBackend, pm::HostEndpoint, Chunk, Loss, pw::Sgd> pipe(
      MPI_COMM_WORLD, program, make_device, {rows, pw::Sgd{0.05f, 0.9f}, 20s},
      pw::RunConfig{}.add("model", "tanh, 6 features, seed 3"));
  pw::Rng rng(4);
  std::vector<float> inputs(static_cast<std::size_t>(rows) * features), targets(inputs.size());
  for (float& v : inputs) v = rng.uniform(-1.0f, 1.0f);
  for (float& v : targets) v = rng.uniform(-2.0f, 2.0f);
  auto stages = [&](CpuBackend& b) {
    std::vector<Chunk> chunks;
    for (int s = 0; s < program.shape.stages(); ++s) chunks.emplace_back(b, features, s, 3);
    return chunks;
  };
  std::unique_ptr<pw::SequentialTrainer<CpuBackend, Chunk, Loss, pw::Sgd>> reference;
  if (rank == 0)
    reference = std::make_unique<pw::SequentialTrainer<CpuBackend, Chunk, Loss, pw::Sgd>>(
        CpuBackend{}, stages, rows, program.shape.micro_batches, pw::Sgd{0.05f, 0.9f});
  for (int step = 0; step < 3; ++step) {
    const double loss = pipe.train_step(inputs, targets).loss;
    if (rank == 0) CHECK(loss == reference->train_step(inputs, targets));
  }
  const std::vector<std::vector<float>> got = pipe.stage_parameters();
  if (rank == 0) CHECK(got == reference->stage_parameters());
}

TEST_CASE("mpi: neighbouring chunks of two ranks whose dtypes differ refuse on every rank before any step", "[mpi]") {
  using Chunk = pw::test::TanhChunk<CpuBackend>;
  using Loss = pw::test::HuberLoss<CpuBackend>;
  const int P = world_size();
  if (P < 2) return;
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, P, 2, P);
  // Every rank's chunks hand bf16 between them, but the last rank's take fp32.
  auto make_device = [&](const std::shared_ptr<pm::Control>& control) {
    return pw::cpu::make_mpi_device<Chunk>(control, [&](CpuBackend& b) {
      const pw::DType dtype = control->rank() == P - 1 ? pw::DType::kF32 : pw::DType::kBF16;
      std::vector<Chunk> chunks;
      for (int c = 0; c < 2; ++c) chunks.emplace_back(b, 6, program.shape.stage_of(control->rank(), c), 3, dtype);
      return chunks;
    });
  };
  using Pipe = pm::MpiPipeline<CpuBackend, pm::HostEndpoint, Chunk, Loss, pw::Sgd>;
  CHECK_THROWS_WITH(Pipe(MPI_COMM_WORLD, program, make_device, {2 * P, pw::Sgd{0.05f}, 20s}),
                    "mpi pipeline: virtual stage " + std::to_string(P - 2) +
                        " gives bf16 activations (and takes bf16 gradients), but stage " + std::to_string(P - 1) +
                        " takes fp32; neighbouring chunks must agree");
}

TEST_CASE("mpi faults: a rank that throws inside a chunk at step k stops every rank; none applies step k", "[mpi]") {
  const int P = world_size(), rank = world_rank();
  const Model m{pw::MlpSpec::uniform(P, 5, 7, 3, 11), {pw::OptimizerKind::kSgd, 0.05f, 0.9f}, 16};
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kOneFOneB, P, 1, 4);
  const pw::RegressionTask task = pw::make_regression_task(m.spec, m.rows, 5);
  auto fault = std::make_shared<pw::test::Fault>();
  fault->device = 2;
  fault->action = pw::fwd(0, 1);
  auto pipe = make_fault_pipeline(program, m, fault, 20s);
  pipe->train_step(task.inputs, task.targets);  // step 1
  const pw::HostModel before = local_weights(*pipe, m.spec);
  fault->armed = true;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = error_of([&] { pipe->train_step(task.inputs, task.targets); });  // step 2
  fault->armed = false;
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // the notice, not the 20 s timeout
  // Every rank reports the failure of rank 2, and keeps its parameters.
  CHECK_THAT(what, Catch::Contains("F0.1 (stage 2, micro-batch 1): injected fault") &&
                       Catch::EndsWith("(the step was not applied: every rank kept its parameters)"));
  if (rank == 2)
    CHECK_THAT(what, Catch::StartsWith("device 2, step "));
  else
    CHECK_THAT(what, Catch::Contains("because another rank failed: rank 2 failed: device 2, step "));
  CHECK(local_weights(*pipe, m.spec) == before);
  // The run goes on: the next steps train as if step 2 had not happened.
  for (int step = 3; step <= 4; ++step) pipe->train_step(task.inputs, task.targets);
  const pw::HostModel got = pw::weights_from_stages(m.spec, pipe->stage_parameters());
  if (rank == 0) {
    pw::SequentialTrainer<CpuBackend> reference(CpuBackend{}, m.spec, pw::init_mlp(m.spec), m.rows, 4, m.optimizer);
    for (int step = 0; step < 3; ++step) reference.train_step(task.inputs, task.targets);
    CHECK(got == reference.weights());
  }
}

TEST_CASE("mpi faults: a rank that is merely slow fails nothing", "[mpi]") {
  const int P = world_size(), rank = world_rank();
  const Model m{pw::MlpSpec::uniform(2 * P, 5, 7, 3, 12), {pw::OptimizerKind::kAdam, 0.01f}, 8};
  const pw::Program program = pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, P, 2, P);
  const pw::RegressionTask task = pw::make_regression_task(m.spec, m.rows, 6);
  auto fault = std::make_shared<pw::test::Fault>();
  fault->device = 1;
  fault->action = pw::bwd(1, 0);
  fault->act = [] { std::this_thread::sleep_for(600ms); };  // well under the 3 s timeout
  fault->armed = true;
  auto pipe = make_fault_pipeline(program, m, fault, 3s);
  for (int step = 0; step < 2; ++step) CHECK_NOTHROW(pipe->train_step(task.inputs, task.targets));
  const pw::HostModel got = pw::weights_from_stages(m.spec, pipe->stage_parameters());
  if (rank == 0) {
    pw::SequentialTrainer<CpuBackend> reference(CpuBackend{}, m.spec, pw::init_mlp(m.spec), m.rows, P, m.optimizer);
    for (int step = 0; step < 2; ++step) reference.train_step(task.inputs, task.targets);
    CHECK(got == reference.weights());
  }
}

TEST_CASE("mpi faults: ranks started with different settings refuse together, naming the first that differs", "[mpi]") {
  const int P = world_size(), rank = world_rank();
  const auto base_spec = pw::MlpSpec::uniform(P, 5, 7, 3, 1);
  const pw::OptimizerConfig base_opt{pw::OptimizerKind::kAdam, 0.003f};
  // (which rank differs, the message's end); one run per setting.
  struct Case {
    const char* setting;
    pw::ScheduleKind kind = pw::ScheduleKind::kOneFOneB;
    int micro_batches = 4;
    std::uint64_t seed = 1;
    float lr = 0.003f;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"schedule", rank == 3 ? pw::ScheduleKind::kGPipe : pw::ScheduleKind::kOneFOneB, 4, 1, 0.003f,
       "the schedule: rank 0 has 1f1b, rank 3 has gpipe"},
      {"micro-batches", pw::ScheduleKind::kOneFOneB, rank == 1 ? 8 : 4, 1, 0.003f,
       "the micro-batches: rank 0 has 4, rank 1 has 8"},
      {"seed", pw::ScheduleKind::kOneFOneB, 4, rank >= 2 ? 2u : 1u, 0.003f, "the seed: rank 0 has 1, rank 2 has 2, rank 3 has 2"},
      {"learning rate", pw::ScheduleKind::kOneFOneB, 4, 1, rank == 2 ? 0.01f : 0.003f,
       "the learning rate: rank 0 has 0.003, rank 2 has 0.01"},
  };
  for (const Case& c : cases) {
    INFO(c.setting);
    pw::MlpSpec spec = base_spec;
    spec.seed = c.seed;
    pw::OptimizerConfig opt = base_opt;
    opt.learning_rate = c.lr;
    const pw::Program program = pw::make_schedule(c.kind, P, 1, c.micro_batches);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string what = error_of([&] {
      pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, pw::init_mlp(spec), {16, opt, 20s});
    });
    CHECK(what == "start-up: the ranks were started with different settings; the first that differs is " + c.expected +
                      "; start every rank with the same arguments");
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
}

TEST_CASE("mpi data parallelism: P x D ranks train bit for bit like sequential training, in either rank layout", "[mpi]") {
  const int ranks = world_size(), rank = world_rank();
  const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.003f};
  struct Case {
    pw::ScheduleKind kind;
    int D, V, M;
    bool pairs;
  };
  for (const pw::RankLayout layout : {pw::RankLayout::kDpAdjacent, pw::RankLayout::kPpAdjacent})
    for (const Case& c : {Case{pw::ScheduleKind::kOneFOneB, 2, 1, 4, false}, Case{pw::ScheduleKind::kInterleaved1F1B, 2, 2, 4, true},
                          Case{pw::ScheduleKind::kZeroBubbleV, 2, 2, 4, false}, Case{pw::ScheduleKind::kGPipe, 4, 1, 2, false}}) {
      const int P = ranks / c.D;
      INFO(pw::rank_layout_name(layout) << " " << pw::schedule_name(c.kind) << (c.pairs ? "+overlap" : "") << " " << P
                                        << "x" << c.D);
      pw::Program program = pw::make_schedule(c.kind, P, c.V, c.M);
      if (c.pairs) program = pw::overlap(program);
      program = pw::with_grad_reduce(program);
      const pw::MlpSpec spec = pw::MlpSpec::uniform(2 * P * c.V, 12, 16, 10, 3);
      const int rows = 2 * c.D * c.M;
      const pw::RegressionTask task = pw::make_regression_task(spec, rows, 9);
      const pw::HostModel init = pw::init_mlp(spec);
      pw::PipelineOptions options{rows, opt, 20s};
      options.replicas = c.D;
      options.layout = layout;
      auto pipe = pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, init, options);
      const pw::RankGrid grid{P, c.D, layout};
      CHECK(pipe->device() == grid.device(rank));
      CHECK(pipe->replica() == grid.replica(rank));
      std::unique_ptr<pw::SequentialTrainer<CpuBackend>> reference;
      if (rank == 0) {
        reference = std::make_unique<pw::SequentialTrainer<CpuBackend>>(CpuBackend{}, spec, init, rows, c.M * c.D, opt);
        reference->set_gradient_order(pw::gradient_order(program));
        reference->set_replicas(c.D);
      }
      for (int step = 0; step < 3; ++step) {
        const double loss = pipe->train_step(task.inputs, task.targets).loss;
        const auto [lowest, highest] = range_over_ranks(loss);
        CHECK(lowest == highest);  // every rank of every replica reports the same loss
        if (rank == 0) CHECK(loss == reference->train_step(task.inputs, task.targets));
      }
      std::vector<std::vector<float>> mine;
      for (const pw::StageState& st : pipe->state().stages) mine.push_back(st.parameters);
      CHECK(replicas_hold_the_same(grid, mine));
      const pw::HostModel got = pw::download_weights(*pipe, spec);
      const pw::Trace trace = pipe->gather_trace();
      if (rank == 0) {
        CHECK(got == reference->weights());
        for (int d = 0; d < P; ++d) CHECK(static_cast<int>(trace.collective[static_cast<std::size_t>(d)].size()) == c.V);
      }
    }
}

TEST_CASE("mpi data parallelism: a fault in one replica stops every rank of every replica; none applies the step", "[mpi]") {
  const int D = 2, P = world_size() / D, rank = world_rank();
  const Model m{pw::MlpSpec::uniform(2 * P, 5, 7, 3, 11), {pw::OptimizerKind::kAdam, 0.01f}, 8 * D};
  const pw::Program program = pw::with_grad_reduce(pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, P, 2, 4));
  const pw::RegressionTask task = pw::make_regression_task(m.spec, m.rows, 5);
  const pw::RankGrid grid{P, D, pw::RankLayout::kDpAdjacent};
  auto fault = std::make_shared<pw::test::Fault>();
  fault->device = 1;
  fault->replica = 1;
  fault->action = pw::bwd(0, 2);
  auto pipe = make_fault_pipeline(program, m, fault, 20s, D);
  pw::SequentialTrainer<CpuBackend> reference(CpuBackend{}, m.spec, pw::init_mlp(m.spec), m.rows, 4 * D, m.optimizer);
  reference.set_gradient_order(pw::gradient_order(program));
  reference.set_replicas(D);
  pipe->train_step(task.inputs, task.targets);  // step 1
  reference.train_step(task.inputs, task.targets);
  const pw::HostModel before = local_weights(*pipe, m.spec);
  fault->armed = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::string what = error_of([&] { pipe->train_step(task.inputs, task.targets); });  // step 2
  fault->armed = false;
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // the notice, not the 20 s timeout
  const int failed = grid.rank(1, 1);
  CHECK_THAT(what, Catch::Contains("replica 1: device 1, step ") && Catch::Contains("B0.2 (stage 1, micro-batch 2): injected fault") &&
                       Catch::EndsWith("(the step was not applied: every rank kept its parameters)"));
  if (rank != failed) CHECK_THAT(what, Catch::Contains("rank " + std::to_string(failed) + " failed: replica 1: device 1"));
  CHECK(local_weights(*pipe, m.spec) == before);
  // A non-finite loss in replica 1 only (its micro-batch 2): no rank applies the step.
  std::vector<float> poisoned = task.inputs;
  const std::size_t shard = static_cast<std::size_t>(m.rows / D), micro = shard / 4;
  poisoned[(shard + 2 * micro) * 5 + 1] = std::numeric_limits<float>::quiet_NaN();
  what = error_of([&] { pipe->train_step(poisoned, task.targets); });  // step 3
  CHECK_THAT(what, Catch::StartsWith("training step 3: ") &&
                       Catch::EndsWith("the step was not applied: every rank kept its parameters"));
  if (rank == grid.rank(1, P - 1)) CHECK_THAT(what, Catch::Contains("replica 1: device " + std::to_string(P - 1) +
                                                                    ": the loss of micro-batch 2 is nan"));
  CHECK(local_weights(*pipe, m.spec) == before);
  // The run goes on as if steps 2 and 3 had not happened.
  pipe->train_step(task.inputs, task.targets);
  reference.train_step(task.inputs, task.targets);
  const pw::HostModel got = pw::weights_from_stages(m.spec, pipe->stage_parameters());
  if (rank == 0) CHECK(got == reference.weights());
}

TEST_CASE("mpi data parallelism: ranks started with other replicas or another layout refuse, by name", "[mpi]") {
  const int ranks = world_size(), rank = world_rank();
  const auto spec = pw::MlpSpec::uniform(4, 5, 7, 3, 1);
  const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.003f};
  auto start = [&](int D, pw::RankLayout layout) {
    pw::Program program = pw::make_schedule(pw::ScheduleKind::kOneFOneB, ranks / D, 1, 4);
    if (D > 1) program = pw::with_grad_reduce(program);
    pw::PipelineOptions options{48, opt, 20s};
    options.replicas = D;
    options.layout = layout;
    return error_of([&] { pw::make_mlp_pipeline(MPI_COMM_WORLD, program, spec, pw::init_mlp(spec), options); });
  };
  const std::string end = "; start every rank with the same arguments";
  CHECK(start(rank == 3 ? 1 : 2, pw::RankLayout::kDpAdjacent) ==
        "start-up: the ranks were started with different settings; the first that differs is the replicas: rank 0 "
        "has 2, rank 3 has 1" + end);
  CHECK(start(2, rank == 1 ? pw::RankLayout::kPpAdjacent : pw::RankLayout::kDpAdjacent) ==
        "start-up: the ranks were started with different settings; the first that differs is the rank layout: rank 0 "
        "has dp-adjacent, rank 1 has pp-adjacent" + end);
  // 4 ranks do not make 3 replicas of a pipeline: every rank refuses, with the count to start.
  CHECK(start(3, pw::RankLayout::kDpAdjacent) ==
        "start-up: every rank cannot start: the program has 1 devices and 3 replicas, but 4 ranks were started (one "
        "rank per device of each replica: mpirun -n 3)");
}

int main(int argc, char** argv) {
  if (const int status = pipeweave::test::relaunch_under_mpirun(argc, argv, 4, std::chrono::seconds(200)); status >= 0)
    return status;
  pm::MpiSession mpi(argc, argv);
  return pipeweave::test::run_on_every_rank(argc, argv);
}
