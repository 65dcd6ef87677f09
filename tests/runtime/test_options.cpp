// The options every backend shares (runtime/options.hpp): transport names and the
// CPU's choice, device placement on GPUs and the GPU's choice, the GPU of a rank;
// and the fingerprint that the ranks of a multi-process run compare.
#include <catch2/catch.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/overlap.hpp"

using namespace pipeweave;

TEST_CASE("transports have names for the command line, and the CPU backend takes rendezvous", "[runtime]") {
  for (TransportKind k : {TransportKind::kAuto, TransportKind::kRendezvous, TransportKind::kNccl, TransportKind::kVirtual})
    CHECK(parse_transport(transport_name(k)) == k);
  CHECK_FALSE(parse_transport("mpi").has_value());
  CHECK(resolve_cpu_transport(TransportKind::kAuto) == TransportKind::kRendezvous);
  CHECK(resolve_cpu_transport(TransportKind::kRendezvous) == TransportKind::kRendezvous);
  CHECK_THROWS_WITH(resolve_cpu_transport(TransportKind::kNccl),
                    "cpu pipeline: transport nccl is not one of the CPU backend's (rendezvous, or auto)");
}

TEST_CASE("devices are placed on GPUs in blocks, and auto picks NCCL only for one GPU each", "[runtime]") {
  CHECK(place_devices(4, 8) == std::vector<int>{0, 1, 2, 3});
  CHECK(place_devices(4, 1) == std::vector<int>{0, 0, 0, 0});
  CHECK(place_devices(4, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(place_devices(8, 3) == std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2});
  CHECK_THROWS_WITH(place_devices(2, 0), Catch::Contains("at least one device and one GPU"));
  CHECK(resolve_gpu_transport(TransportKind::kAuto, {0, 1, 2, 3}) == TransportKind::kNccl);
  CHECK(resolve_gpu_transport(TransportKind::kAuto, {0, 0}) == TransportKind::kVirtual);
  CHECK(resolve_gpu_transport(TransportKind::kAuto, {0}) == TransportKind::kVirtual);
  CHECK(resolve_gpu_transport(TransportKind::kVirtual, {0, 1}) == TransportKind::kVirtual);
  CHECK_THROWS_WITH(resolve_gpu_transport(TransportKind::kNccl, {0, 1, 1}),
                    Catch::Contains("devices 1 and 2 are both on GPU 1; NCCL cannot put two ranks on one GPU"));
  CHECK_THROWS_WITH(resolve_gpu_transport(TransportKind::kRendezvous, {0, 1}), Catch::Contains("CPU backend's"));
  // The pair the refusals name (here and at start-up, mpi::agree_to_start): the first two equal values that count.
  CHECK(first_equal_pair(std::vector<int>{3, 1, 2, 1, 3}, [](int) { return true; }) == std::pair{0, 4});
  CHECK(first_equal_pair(std::vector<std::string>{"", "gpu-a", "", "gpu-a"},
                         [](const std::string& name) { return !name.empty(); }) == std::pair{1, 3});
  CHECK(first_equal_pair(std::vector<std::string>{"", "gpu-a", ""}, [](const std::string& name) {
          return !name.empty();
        }) == std::pair{-1, -1});
}

TEST_CASE("the run fingerprint changes with anything the ranks must agree on", "[runtime]") {
  const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  const MlpSpec spec = MlpSpec::uniform(16, 64, 64, 64, 1);
  const OptimizerConfig adam{OptimizerKind::kAdam, 0.003f};
  auto hash = [](const Program& p, const MlpSpec& m, int rows, const OptimizerConfig& o, std::string_view arithmetic) {
    return run_config(p, rows).add(mlp_config(m, o, "cpu", arithmetic)).hash();
  };
  const std::uint64_t base = hash(program, spec, 256, adam, "fp32");
  CHECK(base == hash(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8), MlpSpec::uniform(16, 64, 64, 64, 1), 256,
                     adam, "fp32"));
  std::set<std::uint64_t> seen{base};
  Program swapped = program;
  std::swap(swapped.devices[1][10], swapped.devices[1][11]);
  seen.insert(hash(swapped, spec, 256, adam, "fp32"));
  seen.insert(hash(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8), spec, 256, adam, "fp32"));
  seen.insert(hash(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 16), spec, 256, adam, "fp32"));
  seen.insert(hash(program, MlpSpec::uniform(16, 64, 128, 64, 1), 256, adam, "fp32"));
  seen.insert(hash(program, MlpSpec::uniform(16, 64, 64, 64, 2), 256, adam, "fp32"));
  seen.insert(hash(program, spec, 512, adam, "fp32"));
  seen.insert(hash(program, spec, 256, {OptimizerKind::kAdam, 0.004f}, "fp32"));
  seen.insert(hash(program, spec, 256, {OptimizerKind::kSgd, 0.003f}, "fp32"));
  seen.insert(hash(program, spec, 256, adam, "tf32"));
  seen.insert(hash(program, spec, 256, adam, "bf16"));
  seen.insert(hash(overlap(program), spec, 256, adam, "fp32"));  // the same actions, run as overlapped pairs
  MlpSpec uneven = spec;
  uneven.layers_per_stage = {1, 2, 2, 2, 2, 2, 2, 3};
  seen.insert(hash(program, uneven, 256, adam, "fp32"));
  uneven.layers_per_stage = {2, 2, 2, 2, 2, 2, 2, 2};  // the even split, written out: the ranks must still agree
  seen.insert(hash(program, uneven, 256, adam, "fp32"));
  // The steps each rank lowers: the placement and the reference clock, of all stages or of one.
  Program custom = program;
  custom.shape.kind = ScheduleKind::kCustom;
  seen.insert(hash(custom, spec, 256, adam, "fp32"));
  Program v = custom;
  v.shape.placement = Placement::kV;
  seen.insert(hash(v, spec, 256, adam, "fp32"));
  Program clock = program;
  clock.lowering = {2, 3, 2, 1};
  seen.insert(hash(clock, spec, 256, adam, "fp32"));
  clock = program;
  clock.stage_lowering.assign(8, LoweringCosts{});
  seen.insert(hash(clock, spec, 256, adam, "fp32"));
  clock.stage_lowering.back()[Phase::kForward] = 2;
  seen.insert(hash(clock, spec, 256, adam, "fp32"));
  CHECK(seen.size() == 19);
  // A fixed encoding: the same value on every machine (FNV-1a of the empty input, and of "a").
  CHECK(ConfigHash{}.value() == 0xcbf29ce484222325ULL);
  CHECK(ConfigHash{}.add_byte('a').value() == 0xaf63dc4c8601ec8cULL);
  CHECK(hash_text(0x0123456789abcdefULL) == "0x0123456789abcdef");
}

TEST_CASE("the run's settings are named, written as a user writes them, and travel intact", "[runtime]") {
  const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  const RunConfig c = run_config(program, 64).add(
      mlp_config(MlpSpec::uniform(4, 3, 5, 2, 7), {OptimizerKind::kAdam, 0.003f}, "cpu", "fp32"));
  std::vector<std::string> names, values;
  for (const RunConfig::Field& f : c.fields()) {
    names.push_back(f.name);
    values.push_back(f.value);
  }
  CHECK(names == std::vector<std::string>{"schedule", "devices", "chunks per device", "micro-batches", "program",
                                          "batch", "layers", "layers per stage", "widths", "seed", "activations",
                                          "optimizer", "learning rate", "beta1", "beta2", "epsilon", "backend",
                                          "arithmetic"});
  CHECK(values[0] == "interleaved");
  CHECK(values[3] == "4");
  CHECK(values[7] == "even");
  CHECK(values[8] == "3 5 5 5 2");
  CHECK(values[10] == "fp32");
  CHECK(values[12] == "0.003");  // the fewest digits that read back as the same float
  CHECK(values[15] == "1e-08");
  CHECK(RunConfig::decode(c.encode()).fields() == c.fields());
  CHECK(RunConfig::decode(c.encode()).hash() == c.hash());
  CHECK(RunConfig{}.add("a", "b").hash() != RunConfig{}.add("ab", "").hash());
  // SGD's settings name the momentum instead of Adam's.
  const RunConfig sgd = mlp_config(MlpSpec::uniform(2, 2, 2, 2), {OptimizerKind::kSgd, 0.5f, 0.9f}, "cpu", "fp32");
  CHECK(sgd.fields()[7].name == "momentum");
  CHECK(sgd.fields()[7].value == "0.9");
  // An uneven split, as the layers per stage of each virtual stage.
  MlpSpec uneven = MlpSpec::uniform(6, 2, 2, 2);
  uneven.layers_per_stage = {1, 2, 2, 1};
  CHECK(mlp_config(uneven, {}, "cpu", "fp32").fields()[1].value == "1 2 2 1");
}

TEST_CASE("a rank takes the GPU of its index on its machine, the one its launcher gives it, or the one asked for",
          "[runtime]") {
  // Every rank sees the machine's GPUs: its index on the machine.
  CHECK(rank_gpu(-1, 5, 1, 2) == 1);
  CHECK(rank_gpu(0, 5, 1, 2) == 0);
  // Each rank sees its own GPU (CUDA_VISIBLE_DEVICES per rank, as --gpus-per-task=1 gives): GPU 0 of what it sees,
  // whatever its index; with two of its own, one of those two.
  for (const int local : {0, 1, 7}) CHECK(rank_gpu(-1, local, local, 1) == 0);
  CHECK(rank_gpu(-1, 7, 7, 2) == 1);
  // More ranks than GPUs lands two ranks on one GPU, which the start-up agreement refuses by the GPUs' UUIDs
  // (test_mpi_host); a rank that sees none, or not the GPU it asks for, is refused here.
  CHECK(rank_gpu(-1, 2, 2, 2) == 0);
  CHECK_THROWS_WITH(rank_gpu(-1, 3, 3, 0),
                    "rank 3 sees no GPU (on its machine, or in CUDA_VISIBLE_DEVICES); each rank needs one");
  CHECK_THROWS_WITH(rank_gpu(2, 5, 1, 2), "rank 5 asks for GPU 2, but sees 2 (GPUs 0 to 1)");
}
