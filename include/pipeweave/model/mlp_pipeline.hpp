#pragma once
/// \file
/// The built-in MLP on any host: the checks a run of it needs, each device's V
/// chunks by the spec's layer allocation (MlpSpec::allocation(): the even split,
/// virtual stage s holding layers [s*L/(P*V), (s+1)*L/(P*V)), or the layers per
/// stage it lists), all initialised from the same host parameters, its
/// parameters gathered back into one host model, and the settings that the ranks
/// of a multi-process run compare.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/model/defaults.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/offload.hpp"

namespace pipeweave {

/// A pipeline of one process whose chunks are the built-in MLP's layers.
template <Backend B, Transport T>
using MlpPipeline = Pipeline<B, T, MlpChunk<B>>;

/// Throws pipeweave::Error, starting with `who`, when `spec` and a batch of `rows`
/// samples do not fit the shape: the spec's layer allocation must split its
/// layers into the P*V stages (layer_split_error) and every size must be in range.
inline void check_mlp_run(const ScheduleShape& s, const MlpSpec& spec, int rows, std::string_view who) {
  check_mlp_spec(spec);
  check_layer_split(s, spec.allocation());
  const long long rows_per_mb = s.micro_batches > 0 ? rows / s.micro_batches : 0;
  for (int w : spec.widths)
    if (rows_per_mb * w > (1LL << 31) - 1)
      throw_error({}, who, ": a micro-batch of ", rows_per_mb, " samples of width ", w, " is too large");
}

/// The memory model of the built-in MLP in bytes, for micro-batches of `rows`
/// samples on the stages of `shape` (the spec's layer allocation): what a
/// device running it holds, as the session measures it (Trace::peak_bytes,
/// runtime/held_memory.hpp), from the widths and dtypes alone. Per stage:
/// - stash: the activations between its layers (fp32), the fp32 words of its
///   ends that are not fp32, its x (received; not the batch's, nor a local
///   previous stage's y, which that stage counts), its y, and at the last stage
///   the loss gradient its forward writes;
/// - input (what a recomputed micro-batch keeps): x, y and that loss gradient;
/// - gradient (kept from an I to its W): each layer's dz (fp32), the fp32 words
///   of dy where the output is not fp32, and dy itself but at the last stage.
/// Tensors between chunks count in whole fp32 words, as they are allocated.
/// peak_memory(program, mlp_memory_model(...)) is the measured peak bytes
/// wherever mlp_memory_model_exact(program) holds.
inline MemoryModel mlp_memory_model(const MlpSpec& spec, const ScheduleShape& shape, int rows) {
  check_mlp_spec(spec);
  const LayerAllocation allocation = spec.allocation();
  check_layer_split(shape, allocation);
  const auto n = static_cast<double>(rows);
  const double word = sizeof(float);
  MemoryModel model;
  for (int st = 0; st < shape.stages(); ++st) {
    const LayerRange r = stage_layers(shape, allocation, st);
    const auto width = [&](int g) { return static_cast<double>(spec.widths[static_cast<std::size_t>(g)]); };
    const DType in_type = r.begin == 0 ? DType::kF32 : spec.dtype, out_type = spec.dtype;
    const double in = width(r.begin), out = width(r.end);
    const double wide_in = in_type == DType::kF32 ? 0 : in, wide_out = out_type == DType::kF32 ? 0 : out;
    double inner = 0, all = 0;
    for (int g = r.begin; g < r.end; ++g) {
      all += width(g + 1);
      if (g + 1 < r.end) inner += width(g + 1);
    }
    const auto tensor = [&](double features, DType t) {  // in its whole fp32 words, as allocated
      return word * static_cast<double>(tensor_words(static_cast<std::size_t>(n * features), t));
    };
    const bool own_x = st > 0 && shape.device_of_stage(st - 1) != shape.device_of_stage(st);
    const double x = own_x ? tensor(in, in_type) : 0;
    const double y = tensor(out, out_type);
    const bool last = st == shape.stages() - 1;
    const double kept = x + y + (last ? y : 0);
    model.stages.push_back({.stash = n * word * (inner + wide_in + wide_out) + kept,
                            .input = kept,
                            .gradient = n * word * (all + wide_out) + (last ? 0 : y)});
  }
  return model;
}

/// True when peak_memory(program, mlp_memory_model(...)) is the peak the
/// devices measure. Where a stage's next stage is on the same device, its y is
/// the next stage's x, one buffer, which the model counts in the first stage's
/// stash alone: exact while that stage keeps it longest. So: for every
/// micro-batch, the next stage ends it (its B, or W) before this stage does,
/// and this stage does not offload it (an offload leaves y on the device while
/// the next stage holds it, runtime/plan.hpp).
inline bool mlp_memory_model_exact(const Program& program) {
  const ScheduleShape& s = program.shape;
  const int V = s.chunks, M = s.micro_batches;
  for (std::size_t d = 0; d < program.devices.size(); ++d) {
    const int device = static_cast<int>(d);
    std::vector<int> ended(static_cast<std::size_t>(V * M), -1);  // [chunk * M + m]: where its B or W stands
    std::vector<char> offloaded(ended.size(), 0);
    const std::vector<Action>& actions = program.devices[d];
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const Action& a = actions[k];
      if (a.chunk < 0 || a.chunk >= V || a.micro_batch < 0 || a.micro_batch >= M) continue;
      const auto at = static_cast<std::size_t>(a.chunk * M + a.micro_batch);
      if (phase_row(a.phase).needs.releases) ended[at] = static_cast<int>(k);
      if (phase_row(a.phase).offloads) offloaded[at] = 1;
    }
    for (int c = 0; c < V; ++c) {
      const int stage = s.stage_of(device, c);
      if (!offload_keeps_output(s, stage)) continue;
      const int next = s.chunk_of_stage(stage + 1);
      for (int m = 0; m < M; ++m) {
        const auto mine = static_cast<std::size_t>(c * M + m), theirs = static_cast<std::size_t>(next * M + m);
        if (offloaded[mine] || ended[theirs] > ended[mine]) return false;
      }
    }
  }
  return true;
}

/// The V chunks of device d for `spec`, initialised from `init`, each with the
/// layers the spec's allocation gives its virtual stage. C is MlpChunk<B> or a
/// wrapper constructible from (MlpChunk<B>, local chunk index).
template <class C, Backend B>
std::vector<C> make_mlp_chunks(B& backend, const ScheduleShape& s, const MlpSpec& spec, const HostModel& init,
                               int device) {
  const LayerAllocation allocation = spec.allocation();
  std::vector<C> chunks;
  chunks.reserve(static_cast<std::size_t>(s.chunks));
  for (int c = 0; c < s.chunks; ++c) {
    MlpChunk<B> chunk(backend, spec, chunk_layers(s, allocation, device, c), init);
    if constexpr (std::same_as<C, MlpChunk<B>>)
      chunks.push_back(std::move(chunk));
    else
      chunks.emplace_back(std::move(chunk), c);
  }
  return chunks;
}

/// Builds the pipeline of one process that trains `spec` (starting from `init`)
/// with `program`: device d gets the backend make_backend(d), endpoint d of
/// `endpoints`, and the chunks of its virtual stages. Throws pipeweave::Error
/// when the spec's allocation does not split the layers into the P*V stages,
/// when a size is out of range, or when the program, the endpoints and the model
/// do not match.
template <Backend B, Transport T, class MakeBackend>
std::unique_ptr<MlpPipeline<B, T>> make_mlp_pipeline(const Program& program, const MlpSpec& spec, const HostModel& init,
                                                     std::vector<T> endpoints, MakeBackend&& make_backend,
                                                     const PipelineOptions& options) {
  std::vector<std::vector<T>> one;
  one.push_back(std::move(endpoints));
  return make_mlp_pipeline<B, T>(program, spec, init, std::move(one), make_backend, options);
}

/// The same with D = options.replicas data-parallel replicas: `endpoints[r]`
/// are replica r's P endpoints (a transport of its own), every replica starts
/// from `init`, and each device's replicas share the collective `make_replicas`
/// makes (none: the host-staged ReplicaGroup; runtime/replicas.hpp).
template <Backend B, Transport T, class MakeBackend>
std::unique_ptr<MlpPipeline<B, T>> make_mlp_pipeline(const Program& program, const MlpSpec& spec, const HostModel& init,
                                                     std::vector<std::vector<T>> endpoints, MakeBackend&& make_backend,
                                                     const PipelineOptions& options,
                                                     const MakeReplicaCollective& make_replicas = {}) {
  const ScheduleShape& s = program.shape;
  check_mlp_run(s, spec, options.rows / std::max(1, options.replicas), "pipeline");
  if (endpoints.size() != static_cast<std::size_t>(std::max(1, options.replicas)))
    throw_error({}, "pipeline: transport endpoints for ", endpoints.size(), " replicas; the run has ", options.replicas);
  for (const auto& replica : endpoints)
    if (replica.size() != static_cast<std::size_t>(s.devices))
      throw_error({}, "pipeline: ", replica.size(), " transport endpoints for ", s.devices, " devices");
  auto make_device = [&](int d, int r) {
    DeviceParts<B, T, MlpChunk<B>> parts{make_backend(d),
                                         std::move(endpoints[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)]), {}};
    parts.chunks = make_mlp_chunks<MlpChunk<B>>(parts.backend, s, spec, init, d);
    return parts;
  };
  return std::make_unique<MlpPipeline<B, T>>(program, make_device, options,
                                             typename MlpPipeline<B, T>::LossFunction{}, make_replicas);
}

/// A host model of `spec`'s shape from the parameters of its stages ([stage] =
/// the floats of the stage's layers, W then b of each in turn, as MlpChunk keeps
/// them); the stages split the layers by the spec's allocation. A stage left
/// empty (another rank's, in a multi-process run) leaves its layers empty.
inline HostModel weights_from_stages(const MlpSpec& spec, const std::vector<std::vector<float>>& stages) {
  HostModel model;
  model.layers.resize(static_cast<std::size_t>(spec.layers()));
  const LayerAllocation allocation = spec.allocation();
  const int count = static_cast<int>(stages.size());
  if (!allocation.even() && allocation.per_stage.size() != stages.size())
    throw_error({}, "weights_from_stages: ", count, " stages; the model's layers per stage has ",
                allocation.per_stage.size(), " entries");
  for (int s = 0; s < count; ++s) {
    const std::vector<float>& stage = stages[static_cast<std::size_t>(s)];
    if (stage.empty()) continue;
    std::size_t at = 0;
    const LayerRange range = allocation.range(count, s);
    for (int layer = range.begin; layer < range.end; ++layer) {
      const std::size_t n = layer_parameters(spec, layer);
      if (at + n > stage.size()) throw_error({}, "weights_from_stages: stage ", s, " is too short for its layers");
      model.layers[static_cast<std::size_t>(layer)].assign(stage.begin() + static_cast<std::ptrdiff_t>(at),
                                                          stage.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
    }
  }
  return model;
}

/// The parameters of a pipeline (any host with stage_parameters()) of the
/// built-in MLP, gathered into one host model of `spec`'s shape.
template <class Host>
HostModel download_weights(Host& pipeline, const MlpSpec& spec) {
  return weights_from_stages(spec, pipeline.stage_parameters());
}

/// The settings of a run of the built-in MLP that the ranks of a multi-process
/// run must share beyond the program and the batch: the model (layers, their
/// split into stages, widths, seed, the dtype of its activations), the optimizer
/// and its hyper-parameters, the backend and `arithmetic` (e.g. "fp32").
inline RunConfig mlp_config(const MlpSpec& spec, const OptimizerConfig& o, std::string_view backend,
                            std::string_view arithmetic) {
  auto words = [](const std::vector<int>& v) {
    std::string out;
    for (int x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
    return out;
  };
  const std::string widths = words(spec.widths);
  const std::string per_stage = spec.layers_per_stage.empty() ? "even" : words(spec.layers_per_stage);
  RunConfig c;
  c.add("layers", spec.layers()).add("layers per stage", std::string_view(per_stage));
  c.add("widths", std::string_view(widths)).add("seed", static_cast<std::uint64_t>(spec.seed));
  c.add("activations", dtype_name(spec.dtype));
  c.add("optimizer", optimizer_name(o.kind)).add("learning rate", o.learning_rate);
  if (o.kind == OptimizerKind::kSgd)
    c.add("momentum", o.momentum);
  else
    c.add("beta1", o.beta1).add("beta2", o.beta2).add("epsilon", o.epsilon);
  return c.add("backend", backend).add("arithmetic", arithmetic);
}

}  // namespace pipeweave
