#pragma once
/// \file
/// The built-in MLP on a pipeline: each device gets its V chunks by the interleaved
/// allocation (virtual stage s = c*P + d holds layers [s*L/(P*V), (s+1)*L/(P*V))),
/// all initialised from the same host parameters; and the parameters can be
/// gathered back into one host model.

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/executor.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// A pipeline whose chunks are the built-in MLP's layers.
template <Backend B, Transport T>
using MlpPipeline = Pipeline<B, T, MlpChunk<B>>;

/// Builds the pipeline that trains `spec` (starting from `init`) with `program`:
/// device d gets the backend make_backend(d), endpoint d of `endpoints`, and the
/// chunks of its virtual stages. Throws pipeweave::Error when the layers do not
/// split evenly into P*V stages, when a size is out of range, or when the program,
/// the endpoints and the model do not match.
template <Backend B, Transport T, class MakeBackend>
std::unique_ptr<MlpPipeline<B, T>> make_mlp_pipeline(const Program& program, const MlpSpec& spec, const HostModel& init,
                                                     std::vector<T> endpoints, MakeBackend&& make_backend,
                                                     const PipelineOptions& options) {
  check_mlp_spec(spec);
  const ScheduleShape& s = program.shape;
  check_layer_split(s, spec.layers());
  if (endpoints.size() != static_cast<std::size_t>(s.devices))
    throw Error("pipeline: " + std::to_string(endpoints.size()) + " transport endpoints for " +
                std::to_string(s.devices) + " devices");
  const long long rows_per_mb = s.micro_batches > 0 ? options.rows / s.micro_batches : 0;
  for (int w : spec.widths)
    if (rows_per_mb * w > (1LL << 31) - 1)
      throw Error("pipeline: a micro-batch of " + std::to_string(rows_per_mb) + " samples of width " +
                  std::to_string(w) + " is too large");
  auto make_device = [&](int d) {
    DeviceParts<B, T, MlpChunk<B>> parts{make_backend(d), std::move(endpoints[static_cast<std::size_t>(d)]), {}};
    for (int c = 0; c < s.chunks; ++c)
      parts.chunks.emplace_back(parts.backend, spec, chunk_layers(s, spec.layers(), d, c), init);
    return parts;
  };
  return std::make_unique<MlpPipeline<B, T>>(program, make_device, options);
}

/// The pipeline's parameters gathered into one host model of `spec`'s shape.
template <Backend B, Transport T>
HostModel download_weights(MlpPipeline<B, T>& pipeline, const MlpSpec& spec) {
  HostModel model;
  model.layers.resize(static_cast<std::size_t>(spec.layers()));
  pipeline.for_each_device([&](int, DeviceParts<B, T, MlpChunk<B>>& parts) {
    for (const MlpChunk<B>& chunk : parts.chunks) chunk.download(parts.backend, model);
    parts.backend.synchronize();
  });
  return model;
}

}  // namespace pipeweave
