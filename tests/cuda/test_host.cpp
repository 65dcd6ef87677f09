// Host-side pieces of the CUDA backend, on the CPU: operand rounding of the math
// modes, their names on the command line, NVTX labels. (Device placement, the
// choice of transport and the run fingerprint: tests/runtime/test_options.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/precision.hpp"

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
  // The relative error is at most half a unit in the last kept place.
  for (float x : {0.3f, 1.7f, -123.456f, 6.02e-5f, 9.99e9f}) {
    CHECK(std::fabs(round_operand(x, MathMode::kTf32) - x) <= std::fabs(x) * std::ldexp(1.0, -11));
    CHECK(std::fabs(round_operand(x, MathMode::kBf16) - x) <= std::fabs(x) * std::ldexp(1.0, -8));
  }
}

TEST_CASE("math modes have names for the command line", "[cuda]") {
  for (MathMode m : {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16}) CHECK(parse_math(math_name(m)) == m);
  CHECK_FALSE(parse_math("fp16").has_value());
  CHECK(tolerance(MathMode::kFp32).loss_relative < tolerance(MathMode::kTf32).loss_relative);
  CHECK(tolerance(MathMode::kTf32).parameter_absolute < tolerance(MathMode::kBf16).parameter_absolute);
}

TEST_CASE("NVTX ranges are labelled with the action", "[cuda]") {
  char label[32];
  action_label(label, Phase::kForward, 1, 3);
  CHECK(std::string(label) == "F c1 m3");
  action_label(label, Phase::kBackward, 0, 12);
  CHECK(std::string(label) == "B c0 m12");
}
