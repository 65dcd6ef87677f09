#pragma once
// The operands of pipeline_gpu's cuBLAS baseline, made on the host: values uniform
// in [-1, 1), stored as the GEMM reads them (fp32, or bf16 rounded to nearest
// even). Random, not zeros: a tensor core multiplies zeros measurably faster than
// random data, which would make the baseline an upper bound the pipeline could
// never meet. No CUDA header: a CPU test checks them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/model/mlp.hpp"

namespace pipeweave::bench {

/// Bytes per operand value of a mode: 2 for bf16, 4 otherwise.
constexpr std::size_t operand_bytes(cuda::MathMode mode) { return mode == cuda::MathMode::kBf16 ? 2 : 4; }

/// `count` random operand values for a GEMM in `mode`, as raw bytes (bf16 values
/// are the upper half of the fp32 value rounded to bf16), from generator `seed`.
inline std::vector<unsigned char> random_operand(std::size_t count, cuda::MathMode mode, std::uint64_t seed) {
  const std::size_t width = operand_bytes(mode);
  std::vector<unsigned char> out(count * width);
  Rng rng(seed);
  for (std::size_t i = 0; i < count; ++i) {
    const float x = cuda::round_operand(rng.uniform(-1.0f, 1.0f), mode);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    if (width == 2) {
      const auto high = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(out.data() + i * 2, &high, 2);
    } else {
      std::memcpy(out.data() + i * 4, &bits, 4);
    }
  }
  return out;
}

}  // namespace pipeweave::bench
