// Host-side pieces of the CUDA backend, on the CPU: operand rounding of the math
// modes, their names on the command line, how NCCL teardown reads
// ncclCommFinalize, NVTX labels, the operands of the GPU benchmark's cuBLAS
// baseline. (Device placement, the choice of transport and the run fingerprint:
// tests/runtime/test_options.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "../../bench/operands.hpp"

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/model/mlp.hpp"

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

TEST_CASE("math modes have names for the command line", "[cuda]") {
  for (MathMode m : {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16}) CHECK(parse_math(math_name(m)) == m);
  CHECK_FALSE(parse_math("fp16").has_value());
  CHECK(tolerance(MathMode::kFp32).loss_relative < tolerance(MathMode::kTf32).loss_relative);
  CHECK(tolerance(MathMode::kTf32).parameter_absolute < tolerance(MathMode::kBf16).parameter_absolute);
}

TEST_CASE("NCCL teardown takes ncclInProgress from ncclCommFinalize as a flush under way", "[cuda]") {
  // A non-blocking communicator answers ncclCommFinalize with ncclInProgress; only
  // an error makes close_all() abort it.
  CHECK(NcclComm::finalize_started(ncclSuccess));
  CHECK(NcclComm::finalize_started(ncclInProgress));
  CHECK_FALSE(NcclComm::finalize_started(ncclInvalidArgument));
  CHECK_FALSE(NcclComm::finalize_started(ncclUnhandledCudaError));
}

TEST_CASE("the CUDA errors after which no CUDA work of the process can succeed are told apart", "[cuda]") {
  using pipeweave::cuda::detail::lasting_cuda_error;
  for (const cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert,
                              cudaErrorMisalignedAddress, cudaErrorIllegalInstruction, cudaErrorLaunchTimeout})
    CHECK(lasting_cuda_error(e));
  for (const cudaError_t e : {cudaSuccess, cudaErrorNotReady, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
                              cudaErrorNoDevice, cudaErrorPeerAccessAlreadyEnabled})
    CHECK_FALSE(lasting_cuda_error(e));
}

TEST_CASE("a GPU's UUID is written as nvidia-smi writes it", "[cuda]") {
  const char bytes[16] = {'\x8f', '\x3e', '\x2a', '\x1c', 0, 1, 2, 3, '\x45', '\x67', '\x89', '\xab', '\xcd', '\xef', 0x10, 0x7f};
  CHECK(pipeweave::cuda::uuid_text(bytes) == "GPU-8f3e2a1c-0001-0203-4567-89abcdef107f");
}

TEST_CASE("NVTX ranges are labelled with the action", "[cuda]") {
  char label[32];
  action_label(label, Phase::kForward, 1, 3);
  CHECK(std::string(label) == "F c1 m3");
  action_label(label, Phase::kBackward, 0, 12);
  CHECK(std::string(label) == "B c0 m12");
  action_label(label, Phase::kBackwardInput, 1, 2);
  CHECK(std::string(label) == "I c1 m2");
  action_label(label, Phase::kBackwardWeight, 1, 2);
  CHECK(std::string(label) == "W c1 m2");
}

namespace {
using pipeweave::cpu::CpuBackend;
// A chunk with a full backward only: MlpChunk's Chunk members and nothing more.
struct FullBackwardOnly {
  pipeweave::MlpChunk<CpuBackend> inner;
  std::size_t input_size() const { return inner.input_size(); }
  std::size_t output_size() const { return inner.output_size(); }
  void reserve(CpuBackend& b, int slots, int rows) { inner.reserve(b, slots, rows); }
  void forward(CpuBackend& b, const pipeweave::ChunkCall& c, const float* x, float* y) { inner.forward(b, c, x, y); }
  void backward(CpuBackend& b, const pipeweave::ChunkCall& c, const float* dy, float* dx) { inner.backward(b, c, dy, dx); }
  decltype(auto) parameters() const { return inner.parameters(); }
};
}  // namespace

// Every chunk wrapper the library ships keeps each concept of the chunk it wraps.
static_assert(pipeweave::SplitChunk<pipeweave::MlpChunk<CpuBackend>, CpuBackend>);
static_assert(pipeweave::SplitChunk<pipeweave::cuda::NvtxChunk<pipeweave::MlpChunk<CpuBackend>>, CpuBackend>,
              "NvtxChunk of a split chunk splits its backward too");
static_assert(pipeweave::Chunk<FullBackwardOnly, CpuBackend> && !pipeweave::SplitChunk<FullBackwardOnly, CpuBackend>);
static_assert(pipeweave::Chunk<pipeweave::cuda::NvtxChunk<FullBackwardOnly>, CpuBackend>);
static_assert(!pipeweave::SplitChunk<pipeweave::cuda::NvtxChunk<FullBackwardOnly>, CpuBackend>,
              "NvtxChunk of a chunk without a split backward does not claim one");
static_assert(pipeweave::OffloadableChunk<pipeweave::cuda::NvtxChunk<pipeweave::MlpChunk<CpuBackend>>, CpuBackend>,
              "NvtxChunk of a chunk that moves its stash to host memory moves it too");
static_assert(!pipeweave::OffloadableChunk<pipeweave::cuda::NvtxChunk<FullBackwardOnly>, CpuBackend>,
              "NvtxChunk of a chunk that cannot move its stash does not claim to");
