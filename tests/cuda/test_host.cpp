// Host-side pieces of the CUDA backend, on the CPU: operand rounding of the math
// modes, names on the command line, device placement and the choice of transport,
// how NCCL teardown reads ncclCommFinalize,
// the configuration fingerprint of multi-process runs, NVTX labels, the operands of
// the GPU benchmark's cuBLAS baseline.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "../../bench/operands.hpp"

#include "pipeweave/cuda/config_hash.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/placement.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/schedule/generators.hpp"

using namespace pipeweave;
using namespace pipeweave::cuda;

TEST_CASE("operands are rounded to nearest even at the mode's mantissa width", "[cuda]") {
  CHECK(round_operand(1.0f, MathMode::kBf16) == 1.0f);
  CHECK(round_operand(0.1f, MathMode::kFp32) == 0.1f);
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the even one, 1.
  CHECK(round_operand(1.0f + std::ldexp(1.0f, -8), MathMode::kBf16) == 1.0f);
  CHECK(round_operand(1.0f + 3 * std::ldexp(1.0f, -8), MathMode::kBf16) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_operand(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), MathMode::kBf16) == 1.0f + std::ldexp(1.0f, -7));
  // TF32 keeps 10.
  CHECK(round_operand(1.0f + std::ldexp(1.0f, -11), MathMode::kTf32) == 1.0f);
  CHECK(round_operand(1.0f + std::ldexp(1.0f, -10), MathMode::kTf32) == 1.0f + std::ldexp(1.0f, -10));
  CHECK(round_operand(-3.14159265f, MathMode::kBf16) == -3.140625f);
  CHECK(std::isnan(round_operand(std::numeric_limits<float>::quiet_NaN(), MathMode::kBf16)));
  CHECK(round_operand(std::numeric_limits<float>::infinity(), MathMode::kTf32) == std::numeric_limits<float>::infinity());
  // Truncation drops the low bits towards zero: never up, at most one unit of the last kept place.
  CHECK(round_operand(1.0f + 3 * std::ldexp(1.0f, -8), MathMode::kBf16, Rounding::kTruncate) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(round_operand(1.0f + std::ldexp(1.0f, -10) - std::ldexp(1.0f, -23), MathMode::kTf32, Rounding::kTruncate) == 1.0f);
  CHECK(round_operand(-1.0f - std::ldexp(1.0f, -10) + std::ldexp(1.0f, -23), MathMode::kTf32, Rounding::kTruncate) == -1.0f);
  CHECK(round_operand(0.1f, MathMode::kFp32, Rounding::kTruncate) == 0.1f);
  CHECK(std::isnan(round_operand(std::numeric_limits<float>::quiet_NaN(), MathMode::kTf32, Rounding::kTruncate)));
  CHECK(may_round(MathMode::kTf32, Rounding::kTruncate));
  CHECK_FALSE(may_round(MathMode::kBf16, Rounding::kTruncate));  // the backend converts bf16 itself, to nearest
  // The relative error is at most half a unit in the last kept place.
  for (float x : {0.3f, 1.7f, -123.456f, 6.02e-5f, 9.99e9f}) {
    CHECK(std::fabs(round_operand(x, MathMode::kTf32) - x) <= std::fabs(x) * std::ldexp(1.0, -11));
    CHECK(std::fabs(round_operand(x, MathMode::kBf16) - x) <= std::fabs(x) * std::ldexp(1.0, -8));
    const float t = round_operand(x, MathMode::kTf32, Rounding::kTruncate);
    CHECK(std::fabs(t) <= std::fabs(x));
    CHECK(std::fabs(t - x) < std::fabs(x) * std::ldexp(1.0, -10));
  }
}

TEST_CASE("the GPU benchmark's cuBLAS baseline multiplies random operands, not zeros", "[cuda]") {
  const std::size_t n = 4096;
  for (MathMode m : {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16}) {
    const std::vector<unsigned char> bytes = pipeweave::bench::random_operand(n, m, 7);
    REQUIRE(bytes.size() == n * pipeweave::bench::operand_bytes(m));
    std::set<float> distinct;
    double sum = 0, sum_abs = 0;
    int zeros = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t bits = 0;
      if (m == MathMode::kBf16) {
        std::uint16_t high = 0;
        std::memcpy(&high, bytes.data() + 2 * i, 2);
        bits = std::uint32_t{high} << 16;
      } else {
        std::memcpy(&bits, bytes.data() + 4 * i, 4);
      }
      float x = 0;
      std::memcpy(&x, &bits, 4);
      INFO(math_name(m) << " value " << i << " = " << x);
      REQUIRE(x >= -1.0f);
      REQUIRE(x <= 1.0f);
      CHECK(round_operand(x, m) == x);  // exactly representable in the operand type
      zeros += x == 0.0f;
      distinct.insert(x);
      sum += x;
      sum_abs += std::fabs(x);
    }
    INFO(math_name(m));
    CHECK(zeros <= 2);
    CHECK(distinct.size() > n / (m == MathMode::kBf16 ? 16 : 2));  // bf16 has 254 values per binade
    CHECK(std::fabs(sum / n) < 0.05);                                // centred on 0
    CHECK(std::fabs(sum_abs / n - 0.5) < 0.05);                      // |x| has mean 1/2 for uniform [-1, 1)
  }
  // Another seed gives other values.
  CHECK(pipeweave::bench::random_operand(64, MathMode::kFp32, 1) != pipeweave::bench::random_operand(64, MathMode::kFp32, 2));
}

TEST_CASE("math modes and transports have names for the command line", "[cuda]") {
  for (MathMode m : {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16}) CHECK(parse_math(math_name(m)) == m);
  CHECK_FALSE(parse_math("fp16").has_value());
  for (TransportKind k : {TransportKind::kAuto, TransportKind::kNccl, TransportKind::kVirtual})
    CHECK(parse_transport(transport_name(k)) == k);
  CHECK_FALSE(parse_transport("mpi").has_value());
  CHECK(tolerance(MathMode::kFp32).loss_relative < tolerance(MathMode::kTf32).loss_relative);
  CHECK(tolerance(MathMode::kTf32).parameter_absolute < tolerance(MathMode::kBf16).parameter_absolute);
}

TEST_CASE("devices are placed on GPUs in blocks, and auto picks NCCL only for one GPU each", "[cuda]") {
  CHECK(place_devices(4, 8) == std::vector<int>{0, 1, 2, 3});
  CHECK(place_devices(4, 1) == std::vector<int>{0, 0, 0, 0});
  CHECK(place_devices(4, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(place_devices(8, 3) == std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2});
  CHECK_THROWS_WITH(place_devices(2, 0), Catch::Contains("at least one device and one GPU"));
  CHECK(resolve_transport(TransportKind::kAuto, {0, 1, 2, 3}) == TransportKind::kNccl);
  CHECK(resolve_transport(TransportKind::kAuto, {0, 0}) == TransportKind::kVirtual);
  CHECK(resolve_transport(TransportKind::kAuto, {0}) == TransportKind::kVirtual);
  CHECK(resolve_transport(TransportKind::kVirtual, {0, 1}) == TransportKind::kVirtual);
  CHECK_THROWS_WITH(resolve_transport(TransportKind::kNccl, {0, 1, 1}),
                    Catch::Contains("devices 1 and 2 are both on GPU 1; NCCL cannot put two ranks on one GPU"));
}

TEST_CASE("the run fingerprint changes with anything the ranks must agree on", "[cuda]") {
  const Program program = make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  const MlpSpec spec = MlpSpec::uniform(16, 64, 64, 64, 1);
  const PipelineOptions options{256, {OptimizerKind::kAdam, 0.003f}};
  const std::uint64_t base = run_hash(program, spec, options, MathMode::kFp32);
  CHECK(base == run_hash(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8), MlpSpec::uniform(16, 64, 64, 64, 1),
                         options, MathMode::kFp32));
  std::set<std::uint64_t> seen{base};
  Program swapped = program;
  std::swap(swapped.devices[1][10], swapped.devices[1][11]);
  seen.insert(run_hash(swapped, spec, options, MathMode::kFp32));
  seen.insert(run_hash(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 8), spec, options, MathMode::kFp32));
  seen.insert(run_hash(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 16), spec, options, MathMode::kFp32));
  seen.insert(run_hash(program, MlpSpec::uniform(16, 64, 128, 64, 1), options, MathMode::kFp32));
  seen.insert(run_hash(program, MlpSpec::uniform(16, 64, 64, 64, 2), options, MathMode::kFp32));
  seen.insert(run_hash(program, spec, {512, options.optimizer}, MathMode::kFp32));
  seen.insert(run_hash(program, spec, {256, {OptimizerKind::kAdam, 0.004f}}, MathMode::kFp32));
  seen.insert(run_hash(program, spec, {256, {OptimizerKind::kSgd, 0.003f}}, MathMode::kFp32));
  seen.insert(run_hash(program, spec, options, MathMode::kTf32));
  seen.insert(run_hash(program, spec, options, MathMode::kBf16));
  CHECK(seen.size() == 11);
  // A fixed encoding: the same value on every machine (FNV-1a of the empty input, and of "a").
  CHECK(ConfigHash{}.value() == 0xcbf29ce484222325ULL);
  CHECK(ConfigHash{}.add_byte('a').value() == 0xaf63dc4c8601ec8cULL);
  CHECK(hash_text(0x0123456789abcdefULL) == "0x0123456789abcdef");
}

TEST_CASE("NCCL teardown takes ncclInProgress from ncclCommFinalize as a flush under way", "[cuda]") {
  // A non-blocking communicator answers ncclCommFinalize with ncclInProgress; only
  // an error makes close_all() abort it.
  CHECK(NcclComm::finalize_started(ncclSuccess));
  CHECK(NcclComm::finalize_started(ncclInProgress));
  CHECK_FALSE(NcclComm::finalize_started(ncclInvalidArgument));
  CHECK_FALSE(NcclComm::finalize_started(ncclUnhandledCudaError));
}

TEST_CASE("NVTX ranges are labelled with the action", "[cuda]") {
  char label[32];
  action_label(label, Phase::kForward, 1, 3);
  CHECK(std::string(label) == "F c1 m3");
  action_label(label, Phase::kBackward, 0, 12);
  CHECK(std::string(label) == "B c0 m12");
}
