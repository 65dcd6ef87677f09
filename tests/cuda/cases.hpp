// The training runs on which the CUDA tests compare a GPU with the CPU, shared by
// the GPU tests and the CPU test that checks the documented tolerances by
// emulating the operand rounding of TF32 and bf16 on the CPU.
#pragma once

#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"

namespace pipeweave::test {

/// One comparison run: an MLP of `layers` layers of `width` features, `rows`
/// samples in `micro_batches` micro-batches, `steps` SGD steps.
struct ToleranceCase {
  const char* name;
  int layers, width, rows, micro_batches, steps;
  MlpSpec spec() const { return MlpSpec::uniform(layers, width, width, width, 3); }
};

inline constexpr ToleranceCase kToleranceCases[] = {
    {"8 layers of 64", 8, 64, 128, 4, 5},
    {"8 layers of 256", 8, 256, 256, 8, 3},
};

/// SGD with momentum: an update proportional to the gradient, so a rounding error
/// of the gradient stays an error of the same size in the parameters (Adam's
/// normalised update would amplify the noise of gradients that are nearly zero).
inline OptimizerConfig tolerance_optimizer() { return {OptimizerKind::kSgd, 0.01f, 0.9f}; }

}  // namespace pipeweave::test
