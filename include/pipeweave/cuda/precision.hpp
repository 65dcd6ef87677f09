#pragma once
/// \file
/// The arithmetic of the CUDA backend's GEMMs (fp32, TF32, bf16 with fp32
/// accumulation), the rounding each one applies to its operands, emulated on the
/// host, and the tolerances a run in each mode is held to against an fp32 run.
/// This header includes no CUDA header: the host-side tests and the command-line
/// tools use it too.
///
/// Tolerances: how far a few SGD steps of the built-in MLP on the GPU may end from
/// the same steps in fp32 on the CPU (the relative difference of each step's loss,
/// and the largest absolute difference of a parameter at the end):
///
/// | mode | operand unit roundoff | loss (relative) | parameters (absolute) |
/// | --- | --- | --- | --- |
/// | fp32 | 2^-24: only the order of the sums differs | 1e-5 | 1e-5 |
/// | tf32 | 2^-11 (10 explicit mantissa bits); 2^-10 truncated | 2e-2 | 1e-3 |
/// | bf16 | 2^-8 (7 explicit mantissa bits) | 3e-2 | 5e-3 |
///
/// The CPU emulation of the rounding (round_operand; tests/cuda/test_tolerance.cpp)
/// gives, on the test cases (8 layers of 64 and of 256 features, 3-5 steps), at
/// most 3e-4 and 6e-5 for TF32 rounded to nearest, 6.4e-3 and 1.8e-4 for TF32
/// truncated (the tensor cores may drop the low 13 bits of an fp32 operand instead
/// of rounding it; the error then has one sign and adds up over the layers), 3e-3
/// and 4e-4 for bf16, and 1e-7 for an fp32 sum in another order. Each bound is set
/// from the worse rounding a mode may see, with a margin of at least three (about
/// ten for bf16 and fp32) for the GPU's summation order. An fp32 run that used TF32
/// by mistake would exceed the fp32 bound on the loss.

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pipeweave::cuda {

/// Arithmetic of a GEMM.
enum class MathMode : unsigned char {
  kFp32,  ///< fp32 inputs, fp32 arithmetic
  kTf32,  ///< fp32 inputs rounded to TF32 on tensor cores, fp32 accumulation
  kBf16,  ///< inputs rounded to bf16, fp32 accumulation (and, in the backend, fp32 output)
};

/// Every mode, in the order of MathMode (kFp32, the default, first).
inline constexpr MathMode kMathModes[] = {MathMode::kFp32, MathMode::kTf32, MathMode::kBf16};

/// "fp32", "tf32" or "bf16".
constexpr std::string_view math_name(MathMode m) {
  return m == MathMode::kFp32 ? "fp32" : m == MathMode::kTf32 ? "tf32" : "bf16";
}

/// The mode named "fp32", "tf32" or "bf16"; nothing for any other name.
constexpr std::optional<MathMode> parse_math(std::string_view name) {
  for (const MathMode m : kMathModes)
    if (math_name(m) == name) return m;
  return std::nullopt;
}

/// How far a run in one mode may be from the same run in fp32 on the CPU.
struct Tolerance {
  double loss_relative = 0;     ///< |loss - reference| / |reference|
  double parameter_absolute = 0;  ///< largest |w - reference w|
};

/// The documented tolerance of a mode (see the table of this file).
constexpr Tolerance tolerance(MathMode m) {
  switch (m) {
    case MathMode::kFp32: return {1e-5, 1e-5};
    case MathMode::kTf32: return {2e-2, 1e-3};
    case MathMode::kBf16: return {3e-2, 5e-3};
  }
  return {};
}

/// Explicit mantissa bits an operand keeps in a mode: 23, 10 or 7.
constexpr int mantissa_bits(MathMode m) { return m == MathMode::kFp32 ? 23 : m == MathMode::kTf32 ? 10 : 7; }

/// How an fp32 operand loses its low mantissa bits.
enum class Rounding : unsigned char {
  kNearestEven,  ///< to nearest, ties to even (cuBLAS's bf16 conversion; TF32 when converted first)
  kTruncate,     ///< the low bits dropped, towards zero (TF32 tensor cores fed raw fp32 bits may do this)
};

/// The roundings the GPU may apply to a mode's operands: bf16 operands are
/// converted by the backend (to nearest even); TF32's are rounded by cuBLAS and
/// the tensor cores, which may also truncate.
constexpr bool may_round(MathMode m, Rounding r) { return r == Rounding::kNearestEven || m == MathMode::kTf32; }

/// An fp32 value rounded to the operand precision of a mode (to nearest even by
/// default); the host's model of what the tensor cores see. NaN and infinities
/// pass unchanged.
constexpr float round_operand(float x, MathMode m, Rounding r = Rounding::kNearestEven) {
  const int drop = 23 - mantissa_bits(m);
  if (drop == 0) return x;
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // NaN or infinity
  const std::uint32_t low = (1u << drop) - 1;
  if (r == Rounding::kTruncate) return std::bit_cast<float>(bits & ~low);
  const std::uint32_t half = 1u << (drop - 1);
  const std::uint32_t lsb = (bits >> drop) & 1u;
  const std::uint32_t rounded = (bits + half - 1 + lsb) & ~low;
  return std::bit_cast<float>(rounded);
}

}  // namespace pipeweave::cuda
