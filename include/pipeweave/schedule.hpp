#pragma once
/// \file
/// The schedule and analysis layers alone: schedules, their lowering and verifier,
/// the simulator, metrics and renderers. Standard library only — no CUDA, Thrust
/// or BLAS header — so any C++20 compiler builds it with nothing but `-I include`.
///
/// \code
/// #include <pipeweave/schedule.hpp>
///
/// using S = pipeweave::Interleaved1F1B<4, 2, 8>;
/// static_assert(pipeweave::verify(S{}));
/// static_assert(pipeweave::bubble_ratio(S{}) == 3.0 / 16);  // lowered steps, forward 1, backward 2
///
/// int main() { return pipeweave::render_ascii(pipeweave::simulate(S{})).empty() ? 1 : 0; }
/// \endcode

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/orders.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/phases.hpp"
#include "pipeweave/schedule/offload.hpp"
#include "pipeweave/schedule/recompute.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/tokens.hpp"
#include "pipeweave/schedule/verify.hpp"
#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/chrome_trace.hpp"
#include "pipeweave/analysis/comms.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/svg.hpp"
#include "pipeweave/analysis/synthesize.hpp"
#include "pipeweave/analysis/trace.hpp"
