#pragma once
/// \file
/// Checkpoints of the built-in MLP: the run's state (runtime/state.hpp) under
/// global names that do not depend on the schedule, so that any schedule, P or V,
/// any layer allocation (MlpSpec::layers_per_stage), on any host, resumes from
/// any checkpoint (resharding on load).
///
/// - `layers.<i>.weight` (out x in) and `layers.<i>.bias` (out), i the model's
///   0-based layer: the files `model-<d>-of-<P>.safetensors`, one per device (or
///   rank) d of the run that wrote them, holding its chunks' layers. Together they
///   are the state dict of a PyTorch stack of Linear layers named `layers`.
/// - The update rule's state by the parameter it belongs to, with PyTorch's
///   names: `layers.<i>.weight.exp_avg` and `.exp_avg_sq` (Adam's moments),
///   `.momentum_buffer` (SGD's): the files `optimizer-<d>-of-<P>.safetensors`.
/// - The manifest (checkpoint/store.hpp) adds the model (widths, seed, the dtype of its activations), the
///   optimizer (rule, hyper-parameters, updates applied), the data (samples per
///   batch, seed; the step is the number of batches consumed) and who wrote it
///   (the schedule, its shape and its layers per stage, for the record only).
///
/// A resumed run must have the checkpoint's model, optimizer and data, or the
/// load is refused, naming what differs; so is every damaged, truncated or
/// incomplete file, before any parameter changes.
///
/// \code
/// // const pipeweave::checkpoint::MlpRun run{spec, optimizer, /*rows=*/256, /*data_seed=*/1};
/// // pipeweave::checkpoint::save_mlp("ckpt", run, program.shape, pipe->state(), step, /*keep=*/0, "threads");
/// // const auto loaded = pipeweave::checkpoint::load_mlp("ckpt", run, other_program.shape);
/// // other_pipe->set_state(loaded.state);  // loaded.step batches consumed
/// // reference.set_state(pipeweave::checkpoint::load_mlp_whole("ckpt", run).state);  // one stage of every layer
/// \endcode

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pipeweave/checkpoint/safetensors.hpp"
#include "pipeweave/checkpoint/store.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/kinds.hpp"

namespace pipeweave::checkpoint {

/// What a run of the built-in MLP must share with the checkpoint it resumes from.
struct MlpRun {
  MlpSpec spec;                 ///< the model
  OptimizerConfig optimizer;    ///< the update rule and its hyper-parameters
  int rows = 0;                 ///< samples per batch
  std::uint64_t data_seed = 0;  ///< seed of the data
};

/// The names of the rule's state buffers, PyTorch's: Adam's "exp_avg" and
/// "exp_avg_sq", SGD's "momentum_buffer" (none for plain SGD).
inline std::vector<std::string> state_names(const OptimizerConfig& o) {
  if (o.kind == OptimizerKind::kAdam) return {"exp_avg", "exp_avg_sq"};
  return o.momentum > 0.0f ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
}

/// "layers.<i>.weight".
inline std::string weight_name(int layer) { return "layers." + std::to_string(layer) + ".weight"; }
/// "layers.<i>.bias".
inline std::string bias_name(int layer) { return "layers." + std::to_string(layer) + ".bias"; }

/// One named tensor of a layer: where it lies in its stage's vectors.
struct LayerTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0, count = 0;
};

/// The weight and bias of each layer of `range`, in the order a stage keeps
/// them (W then b of each layer in turn).
inline std::vector<LayerTensor> layer_tensors(const MlpSpec& spec, LayerRange range) {
  std::vector<LayerTensor> out;
  std::size_t at = 0;
  for (int i = range.begin; i < range.end; ++i) {
    const std::int64_t in = spec.widths[static_cast<std::size_t>(i)], o = spec.widths[static_cast<std::size_t>(i) + 1];
    out.push_back({weight_name(i), {o, in}, at, static_cast<std::size_t>(o * in)});
    at += static_cast<std::size_t>(o * in);
    out.push_back({bias_name(i), {o}, at, static_cast<std::size_t>(o)});
    at += static_cast<std::size_t>(o);
  }
  return out;
}

/// "model-<d>-of-<P>.safetensors" or "optimizer-...".
inline std::string shard_file(std::string_view kind, int index, int count) {
  return std::string(kind) + "-" + std::to_string(index) + "-of-" + std::to_string(count) + ".safetensors";
}

/// Writes shard `index` of `count`: the parameters and the rule's state of
/// `stages` of `shape` (held in `state`) into `dir`, two files, each fsynced.
inline std::vector<FileRecord> write_mlp_shard(const std::filesystem::path& dir, const MlpRun& run,
                                               const ScheduleShape& shape, const TrainingState& state,
                                               std::span<const int> stages, int index, int count) {
  const std::vector<std::string> names = state_names(run.optimizer);
  std::vector<TensorOut> params, moments;
  for (int s : stages) {
    const StageState& st = state.stages.at(static_cast<std::size_t>(s));
    const std::vector<LayerTensor> tensors = layer_tensors(run.spec, stage_layers(shape, run.spec.allocation(), s));
    const std::size_t total = tensors.empty() ? 0 : tensors.back().offset + tensors.back().count;
    if (st.parameters.size() != total || st.optimizer.size() != names.size())
      throw_error({}, "checkpoint: stage ", s, " holds ", st.parameters.size(), " parameters and ",
                  st.optimizer.size(), " state buffers; its layers have ", total, " and the rule keeps ", names.size());
    for (const LayerTensor& t : tensors) {
      params.push_back({t.name, t.shape, std::span<const float>(st.parameters).subspan(t.offset, t.count)});
      for (std::size_t k = 0; k < names.size(); ++k)
        moments.push_back({t.name + "." + names[k], t.shape,
                           std::span<const float>(st.optimizer[k]).subspan(t.offset, t.count)});
    }
  }
  std::vector<FileRecord> out;
  out.push_back(write_safetensors(dir / shard_file("model", index, count), params, {{"format", "pt"}}));
  out.push_back(write_safetensors(dir / shard_file("optimizer", index, count), moments, {{"format", "pt"}}));
  return out;
}

/// A float as a JSON number of its shortest decimal form ("0.003", not the
/// double nearest to 0.003f), which reads back as the same float.
inline nlohmann::ordered_json float_json(float v) {
  char text[32];
  const auto r = std::to_chars(text, text + sizeof text, v);
  return nlohmann::ordered_json::parse(std::string_view(text, static_cast<std::size_t>(r.ptr - text)));
}

/// The manifest's sections of `run` and of the writer (`host`: "threads" or
/// "mpi"; the shape it ran), to which PendingCheckpoint::commit adds the rest.
inline nlohmann::ordered_json mlp_manifest(const MlpRun& run, long long updates, const ScheduleShape& shape,
                                           std::string_view host) {
  const OptimizerConfig& o = run.optimizer;
  nlohmann::ordered_json opt = {{"rule", optimizer_name(o.kind)}, {"learning_rate", float_json(o.learning_rate)}};
  if (o.kind == OptimizerKind::kSgd) {
    opt["momentum"] = float_json(o.momentum);
  } else {
    opt["beta1"] = float_json(o.beta1);
    opt["beta2"] = float_json(o.beta2);
    opt["epsilon"] = float_json(o.epsilon);
  }
  opt["updates"] = updates;
  nlohmann::ordered_json per_stage = nlohmann::ordered_json::array();  // [] for the even split
  for (int n : run.spec.layers_per_stage) per_stage.push_back(n);
  return {{"model",
           {{"kind", "mlp"},
            {"widths", run.spec.widths},
            {"seed", run.spec.seed},
            {"activations", dtype_name(run.spec.dtype)}}},
          {"optimizer", opt},
          {"data", {{"rows", run.rows}, {"seed", run.data_seed}}},
          {"written_by",
           {{"schedule", schedule_name(shape.kind)},
            {"devices", shape.devices},
            {"chunks", shape.chunks},
            {"micro_batches", shape.micro_batches},
            {"layers_per_stage", per_stage},
            {"host", host}}}};
}

/// Saves a run of one process: `state` holds every stage of `shape`; device d's
/// stages go to shard d of P, the P shards written at once. Returns the
/// checkpoint's directory. On an error nothing is committed and the previous
/// checkpoint stays the latest.
inline std::filesystem::path save_mlp(const std::filesystem::path& root, const MlpRun& run, const ScheduleShape& shape,
                                      const TrainingState& state, long long step, int keep, std::string_view host) {
  if (state.stages.size() != static_cast<std::size_t>(shape.stages()))
    throw_error({}, "checkpoint: the state has ", state.stages.size(), " stages; the shape ", shape.stages());
  PendingCheckpoint pending = PendingCheckpoint::begin(root, step);
  const int P = shape.devices;
  std::vector<std::vector<FileRecord>> records(static_cast<std::size_t>(P));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(P));
  {
    std::vector<std::jthread> writers;
    for (int d = 0; d < P; ++d)
      writers.emplace_back([&, d] {
        try {
          std::vector<int> stages;
          for (int c = 0; c < shape.chunks; ++c) stages.push_back(shape.stage_of(d, c));
          records[static_cast<std::size_t>(d)] = write_mlp_shard(pending.directory(), run, shape, state, stages, d, P);
        } catch (...) {
          errors[static_cast<std::size_t>(d)] = std::current_exception();
        }
      });
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<FileRecord> all;
  for (auto& r : records) all.insert(all.end(), r.begin(), r.end());
  return pending.commit(mlp_manifest(run, state.updates, shape, host), all, keep);
}

/// Throws pipeweave::Error, naming the checkpoint and what differs, unless its
/// manifest records `run`'s model, optimizer and data (the layer allocation may
/// differ: tensors are stored per layer).
inline void check_mlp_manifest(const Opened& c, const MlpRun& run) {
  const std::string where = "checkpoint " + c.directory.string() + ": ";
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int w : v) s += (s.empty() ? "" : " ") + std::to_string(w);
    return s;
  };
  try {
    const auto& m = c.manifest.at("model");
    if (m.at("kind").get<std::string>() != "mlp")
      throw_error({}, where, "holds a model of kind ", m.at("kind").get<std::string>(), ", not the built-in mlp");
    const auto widths = m.at("widths").get<std::vector<int>>();
    if (widths != run.spec.widths)
      throw_error({}, where, "holds a model of widths ", list(widths), " (", widths.size() - 1,
                  " layers); this run's has widths ", list(run.spec.widths), " (", run.spec.layers(), " layers)");
    // Written before the manifest named the activations' dtype: fp32.
    const std::string activations = m.contains("activations") ? m.at("activations").get<std::string>() : "fp32";
    if (activations != dtype_name(run.spec.dtype))
      throw_error({}, where, "holds a model trained with ", activations, " activations; this run's are ",
                  run.spec.dtype, ": a run resumes with the activations it was trained with");
    const auto& o = c.manifest.at("optimizer");
    const nlohmann::ordered_json want = mlp_manifest(run, 0, {}, "")["optimizer"];
    for (auto it = want.begin(); it != want.end(); ++it) {
      if (it.key() == "updates") continue;
      const bool same = o.contains(it.key()) && (it.value().is_string() ? o.at(it.key()) == it.value().get<std::string>()
                                                                       : o.at(it.key()).get<float>() == it.value().get<float>());
      if (!same)
        throw_error({}, where, "was written with optimizer ", o.dump(), "; this run's ", it.key(), " is ",
                    it.value().dump(), ": resume with the checkpoint's optimizer settings");
    }
    const auto& d = c.manifest.at("data");
    if (d.at("rows").get<int>() != run.rows || d.at("seed").get<std::uint64_t>() != run.data_seed)
      throw_error({}, where, "was written by a run of ", d.at("rows").get<int>(), " samples per batch with data seed ",
                  d.at("seed").get<std::uint64_t>(), "; this run has ", run.rows, " and ", run.data_seed);
  } catch (const nlohmann::json::exception& e) {
    throw_error({}, where, "the manifest lacks a field of the mlp or has one of the wrong type (", e.what(), ")");
  }
}

/// A checkpoint's state for a run, and the step it was saved at.
struct Loaded {
  TrainingState state;          ///< the stages asked for, filled; the others empty
  long long step = 0;           ///< batches consumed
  std::filesystem::path directory;  ///< the checkpoint read
};

/// Loads the checkpoint `path` names (a checkpoint directory, or a root with
/// `latest`) for a run of `run` with the stages of `shape`, split by the run's
/// allocation (run.spec.allocation(), whatever split wrote it): only `stages`
/// (all when empty) are read, each file checked against the manifest first.
/// Throws pipeweave::Error naming the file, the tensor and the rule.
inline Loaded load_mlp(const std::filesystem::path& path, const MlpRun& run, const ScheduleShape& shape,
                       std::span<const int> stages = {}) {
  const Opened c = open_checkpoint(path);
  check_mlp_manifest(c, run);
  Loaded out;
  out.directory = c.directory;
  out.step = c.step;
  out.state.updates = c.manifest.at("optimizer").at("updates").get<long long>();
  check_layer_split(shape, run.spec.allocation());
  std::vector<int> wanted(stages.begin(), stages.end());
  if (wanted.empty())
    for (int s = 0; s < shape.stages(); ++s) wanted.push_back(s);
  const std::vector<std::string> names = state_names(run.optimizer);
  std::map<std::string, SafetensorsFile> files;  // read once each
  auto tensor = [&](const std::string& name, const std::vector<std::int64_t>& shape_of) {
    const auto it = c.tensor_file.find(name);
    if (it == c.tensor_file.end())
      throw_error({}, "checkpoint ", c.directory.string(), ": tensor ", name, " is missing (no file holds it)");
    auto f = files.find(it->second);
    if (f == files.end()) f = files.emplace(it->second, read_checked(c, it->second)).first;
    return f->second.read(name, shape_of);
  };
  out.state.stages.resize(static_cast<std::size_t>(shape.stages()));
  for (int s : wanted) {
    StageState& st = out.state.stages.at(static_cast<std::size_t>(s));
    const std::vector<LayerTensor> tensors = layer_tensors(run.spec, stage_layers(shape, run.spec.allocation(), s));
    const std::size_t total = tensors.empty() ? 0 : tensors.back().offset + tensors.back().count;
    st.parameters.resize(total);
    st.optimizer.assign(names.size(), std::vector<float>(total));
    for (const LayerTensor& t : tensors) {
      const std::vector<float> v = tensor(t.name, t.shape);
      std::copy(v.begin(), v.end(), st.parameters.begin() + static_cast<std::ptrdiff_t>(t.offset));
      for (std::size_t k = 0; k < names.size(); ++k) {
        const std::vector<float> m = tensor(t.name + "." + names[k], t.shape);
        std::copy(m.begin(), m.end(), st.optimizer[k].begin() + static_cast<std::ptrdiff_t>(t.offset));
      }
    }
  }
  return out;
}

/// Loads the checkpoint `path` names for the sequential reference of `run`
/// (SequentialTrainer: one stage that holds every layer), whatever the run's
/// pipeline allocation: load_mlp() with one device, one chunk and the even split.
inline Loaded load_mlp_whole(const std::filesystem::path& path, const MlpRun& run) {
  MlpRun whole = run;
  whole.spec.layers_per_stage.clear();
  return load_mlp(path, whole, {.kind = ScheduleKind::kCustom, .devices = 1, .chunks = 1, .micro_batches = 1});
}

}  // namespace pipeweave::checkpoint
