#pragma once
/// \file
/// A training run as every host sees it (runtime/pipeline.hpp, one process;
/// mpi/pipeline.hpp, one per device): what a device owns (DeviceParts), the
/// run's settings (BasicPipelineOptions) and a step's outcome (StepResult), and
/// the checks of the program, the settings, the batch and the parts that a host
/// makes before any device is built, with the words of a failed step.
///
/// \code
/// // a host, before it builds its devices:
/// // const pipeweave::LoweredProgram lowered = pipeweave::check_run(program, options, "pipeline");
/// // then, for each device's parts:
/// // pipeweave::check_parts(parts, program.shape, device, "pipeline");
/// \endcode

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/optimizer_state.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What one device owns: its backend, its transport endpoint and its V chunks;
/// chunks[c] is virtual stage shape.stage_of(d, c).
template <Backend B, Transport T, class C>
  requires Chunk<C, B>
struct DeviceParts {
  B backend;              ///< the device's memory and compute
  T transport;            ///< its end of the P2P fabric
  std::vector<C> chunks;  ///< [c]: the device's local chunk c
};

/// The most samples a batch may have.
inline constexpr int kMaxRows = 1 << 24;

/// Settings of a training run, the same on every host and backend: the batch,
/// the update rule `O` (a model of the Optimizer concept) and how long waits may
/// take. What only one backend has is in its own options, passed beside these
/// (cpu::CpuOptions, cuda::CudaOptions). The built-in rules are the default
/// (model/defaults.hpp: PipelineOptions = BasicPipelineOptions<OptimizerConfig>).
template <class O>
struct BasicPipelineOptions {
  int rows = 0;   ///< samples per batch; a multiple of D x M (each replica's shard splits into M micro-batches)
  O optimizer{};  ///< the update applied after every step
  std::chrono::milliseconds timeout = kDefaultTimeout;  ///< the longest any wait may take (a match, a transfer, an agreement)
  std::chrono::microseconds spin = kDefaultSpin;  ///< how long a device thread waiting for another of its process spins before it parks
  int replicas = 1;  ///< data-parallel replicas D of the pipeline, each on its shard of the batch (runtime/pipeline.hpp)
  RankLayout layout = RankLayout::kDpAdjacent;  ///< the multi-process host with replicas: which rank holds which (replica, device)
};
/// The outcome of one training step.
struct StepResult {
  double loss = 0;  ///< mean of the micro-batch losses
};

/// Throws pipeweave::Error, starting with `who`, unless a batch of `rows` samples
/// splits into `micro_batches` equal micro-batches within kMaxRows.
inline void check_batch_rows(int rows, int micro_batches, std::string_view who) {
  if (rows > kMaxRows) throw_error({}, who, ": a batch of ", rows, " samples is more than the limit of ", kMaxRows);
  if (rows < 1 || micro_batches < 1 || rows % micro_batches != 0)
    throw_error({}, who, ": the batch of ", rows, " samples does not split into ", micro_batches,
                " equal micro-batches of at least 1 sample");
}

/// The checks of a run before any device is built, the same on every host:
/// the program verifies, the update rule's hyper-parameters are in range, and
/// the batch splits into the micro-batches. Returns the program's lowering, the
/// one the run uses (lower_checked(): one lowering, verified). Throws
/// pipeweave::Error starting with `who`.
template <class O>
LoweredProgram check_run(const Program& program, const BasicPipelineOptions<O>& options, std::string_view who) {
  LoweredProgram lowered;
  try {
    lowered = lower_checked(program);
  } catch (const Error& e) {
    throw_error({}, who, ": the program is not valid: ", e.what());
  }
  check_optimizer(options.optimizer);
  if (options.replicas < 1 || options.replicas > 4096)
    throw_error({}, who, ": replicas must be 1..4096, got ", options.replicas);
  if (options.replicas > 1 && options.rows % options.replicas != 0)
    throw_error({}, who, ": the batch of ", options.rows, " samples does not split into ", options.replicas,
                " equal shards, one per replica");
  if (options.replicas > 1 && !has_grad_reduce(program))
    throw_error({}, who, ": ", options.replicas, " replicas, but the program has no gradient reduction R: use "
                "with_grad_reduce(program)");
  check_batch_rows(options.rows / options.replicas, program.shape.micro_batches, who);
  return lowered;
}

/// Throws pipeweave::Error unless a batch of `rows` samples has rows x
/// input_size inputs and rows x target_size targets (a size of 0 is not checked:
/// a device that does not read them).
inline void check_batch(std::span<const float> inputs, std::span<const float> targets, int rows, std::size_t input_size,
                        std::size_t target_size) {
  const auto n = static_cast<std::size_t>(rows);
  if ((input_size > 0 && inputs.size() != n * input_size) || (target_size > 0 && targets.size() != n * target_size))
    throw_error({}, "train_step: expected ", n * input_size, " input and ", n * target_size, " target values (", rows,
                " samples), got ", inputs.size(), " and ", targets.size());
}

/// Throws pipeweave::Error, starting with `who`, unless device d's parts fit the
/// shape: V chunks, the endpoint of device d of P, and chunks whose dtypes can
/// run at their stages (check_chunk_dtypes).
template <Backend B, Transport T, class C>
void check_parts(const DeviceParts<B, T, C>& parts, const ScheduleShape& s, int device, std::string_view who) {
  const int chunks = static_cast<int>(parts.chunks.size());
  if (chunks != s.chunks)
    throw_error({}, who, ": device ", device, " has ", chunks, " chunks, but the program has ", s.chunks,
                " per device");
  if (parts.transport.device() != device || parts.transport.devices() != s.devices)
    throw_error({}, who, ": the transport of device ", device, " is device ", parts.transport.device(), " of ",
                parts.transport.devices(), "; the program has ", s.devices, " devices");
  for (int c = 0; c < chunks; ++c)
    check_chunk_dtypes<B>(parts.chunks[static_cast<std::size_t>(c)], s.stage_of(device, c), s.stages(), who);
}

/// A measured trace of `shape` with no event yet (times in microseconds).
inline Trace measured_trace(const ScheduleShape& shape) { return empty_trace(shape, TraceSource::kMeasured, "us"); }

/// The end of the error of a step that was not applied: "the step was not
/// applied: every device kept its parameters" (`units`: "device" or "rank").
inline std::string not_applied(std::string_view units) {
  return error_text({}, "the step was not applied: every ", units, " kept its parameters");
}

}  // namespace pipeweave
