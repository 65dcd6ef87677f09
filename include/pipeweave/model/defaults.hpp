#pragma once
/// \file
/// The built-in loss and update rule as the engine's defaults. The engine
/// (runtime/) takes the loss L and the rule O as template arguments and knows no
/// model; this header redeclares its templates with MseLoss and OptimizerConfig
/// as the defaults of those arguments (C++ merges the default template arguments
/// of every declaration), so that with it `Pipeline<B, T, C>` trains with mean
/// squared error and a rule chosen at run time, and `PipelineOptions` holds an
/// OptimizerConfig. The CPU and GPU pipelines include it.
///
/// \code
/// // pipeweave::PipelineOptions options{.rows = 64, .optimizer = {pipeweave::OptimizerKind::kAdam, 1e-3f}};
/// // pipeweave::Pipeline<B, T, C> pipe(program, make_device, options);
/// \endcode

#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/runtime/session.hpp"

namespace pipeweave {

/// The settings of a run, by default with a built-in update rule.
template <class O = OptimizerConfig>
struct BasicPipelineOptions;

/// The settings with a built-in update rule.
using PipelineOptions = BasicPipelineOptions<>;

/// The pipeline of one process, by default with the built-in loss and rules.
template <Backend B, Transport T, class C, class L = MseLoss, class O = OptimizerConfig>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class Pipeline;

}  // namespace pipeweave
