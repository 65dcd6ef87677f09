#pragma once
/// \file
/// pipeweave: pipeline-parallel schedules generated and proven at compile time.
/// This umbrella header holds everything that needs no CUDA; the CUDA backend is
/// opt-in through pipeweave/cuda.hpp.
///
/// \code
/// #include <pipeweave/pipeweave.hpp>
///
/// using Schedule = pipeweave::Interleaved1F1B</*Devices=*/4, /*Chunks=*/2, /*MicroBatches=*/8>;
/// static_assert(pipeweave::verify(Schedule{}));
/// static_assert(Schedule::actions[0][11] == pipeweave::bwd(1, 0));  // device 0's first backward
///
/// int main() {
///   // The same programs for parameters known at run time.
///   pipeweave::Program p = pipeweave::make_schedule(pipeweave::ScheduleKind::kInterleaved1F1B, 4, 2, 8);
///   return pipeweave::verify(p) ? 0 : 1;
/// }
/// \endcode

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"
#include "pipeweave/analysis/trace.hpp"
