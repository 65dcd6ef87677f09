#pragma once
/// \file
/// pipeweave on NVIDIA GPUs (opt-in; compile with nvcc, link cuBLAS and NCCL):
/// the CUDA backend (cuBLAS GEMMs, Thrust and CUB on the device's stream, CUDA
/// events for the trace), the transports of one process (NCCL between GPUs, or
/// virtual devices sharing a GPU), NVTX ranges, and the built-in MLP on a GPU
/// pipeline run by the same device session as the CPU backend. The transport of
/// the multi-process host (one process per GPU under mpirun) needs MPI and is
/// included on its own: pipeweave/cuda/mpi.hpp. (The CPU backend, pipeweave/cpu/, is not included:
/// it needs OpenBLAS and Thrust's host system.)
///
/// \code
/// #include <pipeweave/cuda.hpp>
///
/// int main() {
///   if (pipeweave::cuda::gpu_count() == 0) return 0;  // nothing to run on
///   const auto spec = pipeweave::MlpSpec::uniform(/*layers=*/8, /*inputs=*/64, /*hidden=*/64, /*outputs=*/64);
///   const auto task = pipeweave::make_regression_task(spec, /*rows=*/256, /*seed=*/7);
///   const auto program = pipeweave::make_schedule("interleaved", 2, 2, 4);
///   // Two pipeline devices: NCCL between two GPUs, or two virtual devices on one GPU.
///   auto pipe = pipeweave::make_mlp_pipeline(program, spec, pipeweave::init_mlp(spec), {.rows = 256},
///                                          pipeweave::cuda::CudaOptions{});
///   const double first = pipe->train_step(task.inputs, task.targets).loss;
///   double last = first;
///   for (int step = 0; step < 20; ++step) last = pipe->train_step(task.inputs, task.targets).loss;
///   return last < first ? 0 : 1;
/// }
/// \endcode

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/model/defaults.hpp"
#include "pipeweave/model/functors.hpp"
#include "pipeweave/model/layers.hpp"
#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/finite.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/pipeline.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/runtime/side_thread.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

#include "pipeweave/cuda/backend.hpp"
#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/gemm.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/nccl.hpp"
#include "pipeweave/cuda/nvtx.hpp"
#include "pipeweave/cuda/pipeline.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/cuda/transport.hpp"
