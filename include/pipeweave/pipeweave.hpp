#pragma once
/// \file
/// pipeweave: pipeline-parallel schedules generated and proven at compile time.
/// This umbrella header holds everything that needs no CUDA: the schedules, the
/// trace, the runtime, the built-in model and the CPU backend (which need OpenBLAS: -lopenblas; with
/// -fno-math-errno its loops vectorize Adam's square root too). The CUDA backend
/// is opt-in through pipeweave/cuda.hpp, the multi-process host (MPI) through
/// pipeweave/mpi/pipeline.hpp.
///
/// \code
/// #include <pipeweave/pipeweave.hpp>
///
/// using Schedule = pipeweave::Interleaved1F1B</*Devices=*/4, /*Chunks=*/2, /*MicroBatches=*/8>;
/// static_assert(pipeweave::verify(Schedule{}));
/// static_assert(Schedule::actions[0][11] == pipeweave::bwd(1, 0));  // device 0's first backward
/// // Simulated figures at compile time: the program order's bound is the closed form (P-1)/(V*M).
/// static_assert(pipeweave::bubble_ratio(Schedule{}, pipeweave::CostModel{}.with_replay(
///                   pipeweave::ReplayMode::kDataflow)) == 3.0 / 16);
///
/// int main() {
///   // The same programs for parameters known at run time.
///   pipeweave::Program p = pipeweave::make_schedule("interleaved", 4, 2, 8);
///   if (!pipeweave::verify(p)) return 1;
///   const std::string svg = pipeweave::render_svg(pipeweave::simulate(p));  // also ascii, Chrome trace, CSV
///   if (svg.empty()) return 1;
///
///   // Train a 16-layer MLP through that schedule, one CPU thread per device.
///   const auto spec = pipeweave::MlpSpec::uniform(/*layers=*/16, /*inputs=*/8, /*hidden=*/16, /*outputs=*/4);
///   const auto task = pipeweave::make_regression_task(spec, /*rows=*/32, /*seed=*/1);
///   auto pipe = pipeweave::make_mlp_pipeline(p, spec, pipeweave::init_mlp(spec), {.rows = 32});
///   const double first = pipe->train_step(task.inputs, task.targets).loss;
///   const double second = pipe->train_step(task.inputs, task.targets).loss;
///   return second < first ? 0 : 1;
/// }
/// \endcode

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/cpu/transport.hpp"
#include "pipeweave/model/defaults.hpp"
#include "pipeweave/model/functors.hpp"
#include "pipeweave/model/layers.hpp"
#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/auto_schedule.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/copy_lane.hpp"
#include "pipeweave/runtime/device_threads.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/group.hpp"
#include "pipeweave/runtime/held_memory.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/overlap.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/runtime/recorder.hpp"
#include "pipeweave/runtime/reducer.hpp"
#include "pipeweave/runtime/run.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/runtime/side_thread.hpp"
#include "pipeweave/schedule.hpp"
