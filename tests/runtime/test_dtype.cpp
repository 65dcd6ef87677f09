// Dtypes at chunk boundaries: the table, bf16's rounding (against an independent
// model of it), typed views, and the refusals of chunks, losses and messages whose
// dtypes do not fit, each before any step runs.

#include <catch2/catch.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/schedule/generators.hpp"

using namespace pipeweave;

namespace {

std::uint16_t bits(float x) { return to_bf16(x).bits; }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// A chunk of fp32 pointers that declares other dtypes: refused, since its calls cannot take them.
struct PointerChunk {
  MlpChunk<cpu::CpuBackend> inner;
  BoundaryDTypes declared;
  std::size_t input_size() const { return inner.input_size(); }
  std::size_t output_size() const { return inner.output_size(); }
  BoundaryDTypes dtypes() const { return declared; }
  void reserve(cpu::CpuBackend& b, int slots, int rows) { inner.reserve(b, slots, rows); }
  void forward(cpu::CpuBackend& b, const ChunkCall& call, const float* x, float* y) { inner.forward(b, call, x, y); }
  void backward(cpu::CpuBackend& b, const ChunkCall& call, const float* dy, float* dx) {
    inner.backward(b, call, dy, dx);
  }
  std::span<const ParameterView> parameters() const { return inner.parameters(); }
};
static_assert(Chunk<PointerChunk, cpu::CpuBackend> && !TensorChunk<PointerChunk, cpu::CpuBackend>);
static_assert(TensorChunk<MlpChunk<cpu::CpuBackend>, cpu::CpuBackend>);

// A loss of fp32 pointers: refused where the last stage gives bf16.
struct PointerMse {
  std::size_t target_size(std::size_t features) const { return features; }
  void reserve(cpu::CpuBackend&, int, std::size_t) {}
  void forward_backward(cpu::CpuBackend& b, const LossCall& call, const float* y, const float* t, float* dy, float* loss) {
    MseLoss{}.forward_backward(b, call, ConstTensorRef(y), t, TensorRef(dy), loss);
  }
};
static_assert(Loss<PointerMse, cpu::CpuBackend> && !TensorLoss<PointerMse, cpu::CpuBackend>);

// Builds a 2-device 1F1B pipeline of the MLP whose stage s has the activations `stage_dtypes[s]`.
void build(const std::vector<DType>& stage_dtypes) {
  MlpSpec spec = MlpSpec::uniform(4, 5, 6, 3, 17);
  const HostModel init = init_mlp(spec);
  const Program program = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  std::vector<cpu::RendezvousEndpoint> net = cpu::make_rendezvous(2, {std::chrono::seconds(5)});
  auto make_device = [&](int d) {
    MlpSpec mine = spec;
    mine.dtype = stage_dtypes[static_cast<std::size_t>(d)];
    DeviceParts<cpu::CpuBackend, cpu::RendezvousEndpoint, MlpChunk<cpu::CpuBackend>> parts{
        cpu::CpuBackend{}, std::move(net[static_cast<std::size_t>(d)]), {}};
    parts.chunks = make_mlp_chunks<MlpChunk<cpu::CpuBackend>>(parts.backend, program.shape, mine, init, d);
    return parts;
  };
  cpu::CpuMlpPipeline pipe(program, make_device, PipelineOptions{4, {}});
}

}  // namespace

TEST_CASE("the dtype table names each dtype once, with its bytes and safetensors name", "[runtime]") {
  for (const DTypeRow& r : kDTypeRows) {
    CHECK(dtype_row(r.dtype).name == r.name);
    CHECK(parse_dtype(r.name) == r.dtype);
    CHECK(parse_safetensors_dtype(r.safetensors) == r.dtype);
  }
  CHECK(dtype_bytes(DType::kF32) == 4);
  CHECK(dtype_bytes(DType::kBF16) == 2);
  CHECK(dtype_name(DType::kI32) == "int32");
  CHECK_FALSE(parse_dtype("fp16"));
  CHECK_FALSE(dtype_row(DType::kI32).floating);
  CHECK(error_text({}, DType::kBF16) == "bf16");
}

TEST_CASE("bf16 rounds to nearest, ties to even, as the GPU converts", "[runtime]") {
  CHECK(bits(1.0f) == 0x3F80);
  CHECK(bits(from_bits(0x3F808000)) == 0x3F80);  // halfway, even below: down
  CHECK(bits(from_bits(0x3F818000)) == 0x3F82);  // halfway, odd below: up
  CHECK(bits(from_bits(0x3F808001)) == 0x3F81);  // past halfway: up
  CHECK(bits(from_bits(0x3F807FFF)) == 0x3F80);  // short of halfway: down
  CHECK(bits(-2.5f) == 0xC020);
  CHECK(bits(0.0f) == 0x0000);
  CHECK(bits(-0.0f) == 0x8000);
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(bits(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7F80);  // past bf16's largest finite
  CHECK(bits(std::numeric_limits<float>::quiet_NaN()) == 0x7FFF);
  CHECK(bits(from_bits(0xFF800001)) == 0x7FFF);                  // a signalling NaN too
  CHECK(bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(to_float(bf16{0x4049}) == 3.140625f);
  // Against the operand rounding the GPU tolerances are modelled with (an
  // independent formula), over a spread of finite values of every exponent.
  std::uint32_t x = 12345;
  for (int i = 0; i < 200000; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = from_bits(x);
    if (!std::isfinite(v)) continue;
    const float want = cuda::round_operand(v, cuda::MathMode::kBf16);
    INFO(std::hex << x);
    REQUIRE(std::bit_cast<std::uint32_t>(round_bf16(v)) == std::bit_cast<std::uint32_t>(want));
    REQUIRE(round_bf16(round_bf16(v)) == round_bf16(v));  // a bf16 value is kept exactly
  }
}

TEST_CASE("a tensor view gives its memory in its dtype and refuses another by name", "[runtime]") {
  std::vector<bf16> h(4);
  const TensorRef t(h.data());
  CHECK(t.dtype() == DType::kBF16);
  CHECK(t.as<bf16>() == h.data());
  const ConstTensorRef c = t;
  CHECK(c.as<bf16>() == h.data());
  CHECK_THROWS_WITH(c.as<float>(), Catch::Contains("a bf16 tensor was read as fp32"));
  const TensorRef empty = nullptr;
  CHECK_FALSE(empty);
  CHECK(empty.as<bf16>() == nullptr);
  float f = 0;
  CHECK(TensorRef(&f).dtype() == DType::kF32);
}

TEST_CASE("the MSE loss reads a bf16 output and writes a bf16 gradient", "[runtime]") {
  cpu::CpuBackend b;
  const std::vector<float> yf = {0.5f, -1.25f, 2.0f, 0.125f}, t = {0.0f, -1.0f, 1.0f, 0.5f};
  std::vector<bf16> y, dy(4);
  for (float v : yf) y.push_back(to_bf16(v));  // all exact in bf16
  std::vector<float> dyf(4);
  float loss_bf16 = 0, loss_fp32 = 0;
  MseLoss{}.forward_backward(b, LossCall{0, 2, 2}, ConstTensorRef(y.data()), t.data(), TensorRef(dy.data()), &loss_bf16);
  MseLoss{}.forward_backward(b, LossCall{0, 2, 2}, ConstTensorRef(yf.data()), t.data(), TensorRef(dyf.data()), &loss_fp32);
  CHECK(loss_bf16 == loss_fp32);
  for (std::size_t i = 0; i < 4; ++i) CHECK(to_float(dy[i]) == round_bf16(dyf[i]));
  std::vector<std::int32_t> ids(4);
  CHECK_THROWS_WITH(MseLoss{}.forward_backward(b, LossCall{0, 2, 2}, ConstTensorRef(ids.data()), t.data(),
                                               TensorRef(ids.data()), &loss_bf16),
                    Catch::Contains("a int32 tensor where a floating dtype (fp32 or bf16) is needed"));
}

TEST_CASE("neighbouring chunks whose dtypes differ do not build, and the error names both", "[runtime]") {
  build({DType::kBF16, DType::kBF16});  // agree
  CHECK_THROWS_WITH(build({DType::kF32, DType::kBF16}),
                    Catch::Contains("virtual stage 0 gives fp32 activations (and takes fp32 gradients), but stage 1 "
                                      "takes bf16; neighbouring chunks must agree"));
  CHECK_THROWS_WITH(build({DType::kBF16, DType::kF32}),
                    Catch::Contains("virtual stage 0 gives bf16 activations (and takes bf16 gradients), but stage 1 "
                                      "takes fp32"));
}

TEST_CASE("chunks whose dtypes cannot run at their stage are refused before any step", "[runtime]") {
  cpu::CpuBackend b;
  MlpSpec spec = MlpSpec::uniform(2, 5, 6, 3, 17);
  const HostModel init = init_mlp(spec);
  auto make = [&](BoundaryDTypes declared) {
    return [&, declared](cpu::CpuBackend& backend) {
      std::vector<PointerChunk> one;
      one.push_back({MlpChunk<cpu::CpuBackend>(backend, spec, {0, 2}, init), declared});
      return one;
    };
  };
  using Seq = SequentialTrainer<cpu::CpuBackend, PointerChunk>;
  const OptimizerConfig opt{};
  CHECK_NOTHROW(Seq(cpu::CpuBackend{}, make({}), 4, 2, opt));
  CHECK_THROWS_WITH(Seq(cpu::CpuBackend{}, make({DType::kF32, DType::kBF16}), 4, 2, opt),
                    Catch::Contains("sequential: the chunk of virtual stage 0 declares fp32 input and bf16 output, "
                                      "but its calls take fp32 pointers"));
  // Views of every dtype: the batch is fp32, the loss reads a floating dtype.
  auto make_mlp = [&](DType input, DType output) {
    return [&, input, output](cpu::CpuBackend& backend) {
      std::vector<MlpChunk<cpu::CpuBackend>> one;
      MlpSpec s = spec;
      s.dtype = output;
      one.emplace_back(backend, s, LayerRange{input == DType::kF32 ? 0 : 1, 2}, init);
      return one;
    };
  };
  using MlpSeq = SequentialTrainer<cpu::CpuBackend>;
  CHECK_THROWS_WITH(MlpSeq(cpu::CpuBackend{}, make_mlp(DType::kBF16, DType::kBF16), 4, 2, opt),
                    Catch::Contains("sequential: virtual stage 0 takes bf16 input, but the batch's inputs are fp32"));
  using PointerLossSeq = SequentialTrainer<cpu::CpuBackend, MlpChunk<cpu::CpuBackend>, PointerMse>;
  CHECK_NOTHROW(PointerLossSeq(cpu::CpuBackend{}, make_mlp(DType::kF32, DType::kF32), 4, 2, opt));
  CHECK_THROWS_WITH(PointerLossSeq(cpu::CpuBackend{}, make_mlp(DType::kF32, DType::kBF16), 4, 2, opt),
                    Catch::Contains("sequential: virtual stage 0 gives bf16 output, but the loss takes fp32 pointers"));
  MlpSpec ints = spec;
  ints.dtype = DType::kI32;
  CHECK_THROWS_WITH(check_mlp_spec(ints), Catch::Contains("activations of dtype int32; the built-in MLP's are fp32 or bf16"));
}

namespace {

// MlpChunk that records the `step` of every call it gets.
struct StepChunk {
  MlpChunk<cpu::CpuBackend> inner;
  std::shared_ptr<std::mutex> lock;
  std::shared_ptr<std::set<long long>> seen;
  std::size_t input_size() const { return inner.input_size(); }
  std::size_t output_size() const { return inner.output_size(); }
  void reserve(cpu::CpuBackend& b, int slots, int rows) { inner.reserve(b, slots, rows); }
  void forward(cpu::CpuBackend& b, const ChunkCall& call, ConstTensorRef x, TensorRef y) {
    note(call);
    inner.forward(b, call, x, y);
  }
  void backward(cpu::CpuBackend& b, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    note(call);
    inner.backward(b, call, dy, dx);
  }
  std::span<const ParameterView> parameters() const { return inner.parameters(); }
  void note(const ChunkCall& call) {
    const std::lock_guard<std::mutex> hold(*lock);
    seen->insert(call.step);
  }
};

}  // namespace

TEST_CASE("a chunk call carries the updates applied before its step, and a resumed run goes on counting",
          "[runtime]") {
  const MlpSpec spec = MlpSpec::uniform(4, 5, 6, 3, 17);
  const HostModel init = init_mlp(spec);
  const RegressionTask task = make_regression_task(spec, 4, 5);
  const Program program = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  auto lock = std::make_shared<std::mutex>();
  auto seen = std::make_shared<std::set<long long>>();
  std::vector<cpu::RendezvousEndpoint> net = cpu::make_rendezvous(2, {std::chrono::seconds(5)});
  auto make_device = [&](int d) {
    DeviceParts<cpu::CpuBackend, cpu::RendezvousEndpoint, StepChunk> parts{
        cpu::CpuBackend{}, std::move(net[static_cast<std::size_t>(d)]), {}};
    for (MlpChunk<cpu::CpuBackend>& c : make_mlp_chunks<MlpChunk<cpu::CpuBackend>>(parts.backend, program.shape, spec, init, d))
      parts.chunks.push_back({std::move(c), lock, seen});
    return parts;
  };
  Pipeline<cpu::CpuBackend, cpu::RendezvousEndpoint, StepChunk> pipe(program, make_device, PipelineOptions{4, {}});
  pipe.train_step(task.inputs, task.targets);
  pipe.train_step(task.inputs, task.targets);
  CHECK(*seen == std::set<long long>{0, 1});
  TrainingState state = pipe.state();
  state.updates = 7;  // as a run resumed after 7 updates
  pipe.set_state(state);
  seen->clear();
  pipe.train_step(task.inputs, task.targets);
  CHECK(*seen == std::set<long long>{7});
}
