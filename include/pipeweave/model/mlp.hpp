#pragma once
/// \file
/// The built-in model: a multi-layer perceptron of L Linear layers with a ReLU
/// after every layer but the last, its deterministic initialisation, a synthetic
/// regression task (targets from a fixed random teacher network), and MlpChunk,
/// the Chunk that runs a contiguous range of its layers on one device.
///
/// Initialisation depends only on the widths and the seed, never on P, V or M:
/// every schedule and the sequential reference train the same model.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "pipeweave/model/layers.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The shape of an MLP: `widths[0]` input features, layer i maps widths[i] to
/// widths[i+1]; L = widths.size() - 1 layers. `seed` fixes the initial weights.
/// `layers_per_stage` says how a pipeline splits the layers into its virtual
/// stages (LayerAllocation); the model and the sequential reference do not
/// depend on it, so a checkpoint written under one split loads under another.
struct MlpSpec {
  std::vector<int> widths;              ///< L + 1 feature counts: the input, then each layer's output
  std::uint64_t seed = 1;               ///< fixes the initial parameters (init_mlp)
  std::vector<int> layers_per_stage{};  ///< layers of each virtual stage, in stage order; empty: the even split
  DType dtype = DType::kF32;  ///< of the activations and their gradients (fp32 or bf16; MlpChunk)

  /// Number of layers L.
  int layers() const { return static_cast<int>(widths.size()) - 1; }
  /// How a pipeline splits the layers into its virtual stages.
  LayerAllocation allocation() const { return {layers(), layers_per_stage}; }
  /// Input features.
  int inputs() const { return widths.front(); }
  /// Output features.
  int outputs() const { return widths.back(); }
  /// L layers of `hidden` features from `inputs` inputs to `outputs` outputs.
  static MlpSpec uniform(int layers, int inputs, int hidden, int outputs, std::uint64_t seed = 1) {
    MlpSpec s;
    s.seed = seed;
    if (layers < 1) {
      s.widths = {inputs};
      return s;
    }
    s.widths.assign(static_cast<std::size_t>(layers) + 1, hidden);
    s.widths.front() = inputs;
    s.widths.back() = outputs;
    return s;
  }
};

/// The most features a layer may have.
inline constexpr int kMaxWidth = 1 << 16;
/// The most layers a model may have.
inline constexpr int kMaxLayers = 1 << 14;
/// The most parameters a model may have (4 GiB of fp32).
inline constexpr long long kMaxParameters = 1LL << 30;

/// Number of parameters (weights and biases) of layer i.
inline std::size_t layer_parameters(const MlpSpec& spec, int layer) {
  return Linear{spec.widths[static_cast<std::size_t>(layer)], spec.widths[static_cast<std::size_t>(layer) + 1]}
      .parameter_count();
}

/// Throws pipeweave::Error naming the first problem of a spec: fewer than one
/// layer, a width below 1, or sizes past kMaxWidth, kMaxLayers, kMaxParameters.
inline void check_mlp_spec(const MlpSpec& spec) {
  if (spec.widths.size() < 2)
    throw_error({}, "model: needs at least 1 layer (got ", spec.layers(), ")");
  if (spec.layers() > kMaxLayers)
    throw_error({}, "model: ", spec.layers(), " layers is more than the limit of ", kMaxLayers);
  long long total = 0;
  for (std::size_t i = 0; i < spec.widths.size(); ++i) {
    const int w = spec.widths[i];
    if (w < 1 || w > kMaxWidth)
      throw_error({}, "model: width ", i, " is ", w, "; widths must be 1..", kMaxWidth);
    if (i > 0) total += static_cast<long long>(spec.widths[i - 1]) * w + w;
  }
  if (total > kMaxParameters)
    throw_error({}, "model: ", total, " parameters is more than the limit of ", kMaxParameters);
  if (!dtype_row(spec.dtype).floating)
    throw_error({}, "model: activations of dtype ", spec.dtype, "; the built-in MLP's are fp32 or bf16");
}

/// An MLP's parameters on the host: `layers[i]` is layer i's W (out x in,
/// row-major) followed by its b (out), the layout Linear uses.
struct HostModel {
  std::vector<std::vector<float>> layers;  ///< [layer]: W then b
  friend bool operator==(const HostModel&, const HostModel&) = default;
};

/// A small deterministic generator (SplitMix64), the same on every platform.
class Rng {
 public:
  /// A generator seeded with `seed`.
  explicit constexpr Rng(std::uint64_t seed) : state_(seed) {}
  /// The next 64 random bits.
  constexpr std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi), from 24 random bits.
  constexpr float uniform(float lo, float hi) {
    const float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
  }

 private:
  std::uint64_t state_;
};

/// The initial parameters: layer i draws from its own generator, seeded by the
/// spec's seed and i, W uniform in +-sqrt(6 / in) (He) and b uniform in +-1/sqrt(in).
inline HostModel init_mlp(const MlpSpec& spec) {
  check_mlp_spec(spec);
  HostModel model;
  model.layers.resize(static_cast<std::size_t>(spec.layers()));
  for (int i = 0; i < spec.layers(); ++i) {
    const int in = spec.widths[static_cast<std::size_t>(i)], out = spec.widths[static_cast<std::size_t>(i) + 1];
    Rng rng(spec.seed * 0x100000001B3ULL + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ULL + 1);
    auto& p = model.layers[static_cast<std::size_t>(i)];
    p.resize(layer_parameters(spec, i));
    const float wb = std::sqrt(6.0f / static_cast<float>(in)), bb = 1.0f / std::sqrt(static_cast<float>(in));
    const std::size_t nw = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
    for (std::size_t k = 0; k < nw; ++k) p[k] = rng.uniform(-wb, wb);
    for (std::size_t k = nw; k < p.size(); ++k) p[k] = rng.uniform(-bb, bb);
  }
  return model;
}

/// The MLP's output for `rows` samples, on the host with plain loops (for making
/// targets; training runs on a backend).
inline std::vector<float> host_forward(const MlpSpec& spec, const HostModel& model, std::span<const float> x, int rows) {
  std::vector<float> in(x.begin(), x.end()), out;
  for (int i = 0; i < spec.layers(); ++i) {
    const int n_in = spec.widths[static_cast<std::size_t>(i)], n_out = spec.widths[static_cast<std::size_t>(i) + 1];
    const float* w = model.layers[static_cast<std::size_t>(i)].data();
    const float* b = w + static_cast<std::size_t>(n_in) * static_cast<std::size_t>(n_out);
    out.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(n_out), 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < n_out; ++o) {
        float acc = b[o];
        for (int k = 0; k < n_in; ++k)
          acc += in[static_cast<std::size_t>(r) * static_cast<std::size_t>(n_in) + static_cast<std::size_t>(k)] *
                 w[static_cast<std::size_t>(o) * static_cast<std::size_t>(n_in) + static_cast<std::size_t>(k)];
        if (i + 1 < spec.layers() && acc < 0.0f) acc = 0.0f;
        out[static_cast<std::size_t>(r) * static_cast<std::size_t>(n_out) + static_cast<std::size_t>(o)] = acc;
      }
    }
    in.swap(out);
  }
  return in;
}

/// A synthetic regression task: `rows` inputs uniform in [-1, 1) and the targets a
/// fixed random teacher (same widths, its own seed) gives for them. A student of
/// the same shape can fit it exactly, so its loss can approach zero.
struct RegressionTask {
  int rows = 0;
  std::vector<float> inputs;   ///< rows x widths.front()
  std::vector<float> targets;  ///< rows x widths.back()
};

/// The task for `spec`'s widths with `rows` samples; `seed` fixes teacher and inputs.
inline RegressionTask make_regression_task(const MlpSpec& spec, int rows, std::uint64_t seed) {
  check_mlp_spec(spec);
  if (rows < 1) throw_error({}, "task: rows must be at least 1 (got ", rows, ")");
  MlpSpec teacher = spec;
  teacher.seed = seed ^ 0x7EAC4E5ULL;
  const HostModel t = init_mlp(teacher);
  RegressionTask task;
  task.rows = rows;
  task.inputs.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(spec.inputs()));
  Rng rng(seed * 0x2545F4914F6CDD1DULL + 7);
  for (float& v : task.inputs) v = rng.uniform(-1.0f, 1.0f);
  task.targets = host_forward(spec, t, task.inputs, rows);
  return task;
}

/// Largest |a - b| over all parameters; infinity when the shapes differ.
inline double max_abs_difference(const HostModel& a, const HostModel& b) {
  if (a.layers.size() != b.layers.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    if (a.layers[i].size() != b.layers[i].size()) return INFINITY;
    for (std::size_t k = 0; k < a.layers[i].size(); ++k) {
      const double d = std::fabs(static_cast<double>(a.layers[i][k]) - static_cast<double>(b.layers[i][k]));
      if (!(d <= worst)) worst = d;  // also catches NaN
    }
  }
  return worst;
}

/// A contiguous range of an MLP's layers as a SplitChunk: Linear layers, each but
/// the model's last followed by a ReLU. Its parameters live in one device buffer
/// (W and b of each layer in turn), its gradients in another of the same layout;
/// it keeps, per stash slot, the activations between its layers, and for a split
/// backward each layer's dz from backward_input to backward_weight (the bias
/// gradient comes with dz, in the input half).
///
/// With the spec's dtype bf16, every layer rounds its output and its input
/// gradient to bf16 (Linear), and the chunk's ends are bf16 tensors (the first
/// stage's input stays the batch's fp32): a tensor handed between chunks takes
/// half the bytes. Inside, the chunk keeps fp32 words holding those bf16 values,
/// widened from its bf16 input and narrowed, exactly, into its bf16 output, so a
/// model split into any chunks computes what one chunk of all its layers does.
/// Parameters, gradients and the optimizer's state stay fp32.
template <Backend B>
class MlpChunk {
 public:
  /// Its forward keeps in the call's slot all its backward reads and changes
  /// nothing else: run again on the same input (a recomputation, C), it keeps the
  /// same (RecomputableChunk). What a slot keeps may go to host memory and back
  /// (OffloadableChunk: offload_size, offload, reload), and so may what it
  /// keeps from backward_input to backward_weight (WeightOffloadableChunk).
  static constexpr bool recomputable = true;

  /// Layers `range` of `spec`, with parameters copied from `init`.
  MlpChunk(B& backend, const MlpSpec& spec, LayerRange range, const HostModel& init)
      : range_(range), dtypes_{range.begin == 0 ? DType::kF32 : spec.dtype, spec.dtype} {
    check_mlp_spec(spec);
    if (range.begin < 0 || range.end > spec.layers() || range.size() < 1)
      throw_error({}, "MlpChunk: layers [", range.begin, ", ", range.end, ") are not a non-empty range of the model's ",
                  spec.layers());
    if (init.layers.size() != static_cast<std::size_t>(spec.layers()))
      throw_error({}, "MlpChunk: the initial parameters have ", init.layers.size(), " layers, the model ",
                  spec.layers());
    std::size_t total = 0;
    for (int g = range.begin; g < range.end; ++g) {
      const Linear lin{spec.widths[static_cast<std::size_t>(g)], spec.widths[static_cast<std::size_t>(g) + 1],
                       g + 1 < spec.layers(), spec.dtype};
      if (init.layers[static_cast<std::size_t>(g)].size() != lin.parameter_count())
        throw_error({}, "MlpChunk: layer ", g, " of the initial parameters has the wrong size");
      linears_.push_back(lin);
      offsets_.push_back(total);
      total += lin.parameter_count();
      max_width_ = std::max({max_width_, lin.in, lin.out});
    }
    params_ = backend.allocate(total);
    grads_ = backend.allocate(total);
    upload(backend, init);
    backend.synchronize();  // `init` may go away once the constructor returns
    view_ = ParameterView{params_.data(), grads_.data(), total};
  }

  /// Features entering the chunk.
  std::size_t input_size() const { return static_cast<std::size_t>(linears_.front().in); }
  /// Features leaving the chunk.
  std::size_t output_size() const { return static_cast<std::size_t>(linears_.back().out); }
  /// The model layers this chunk holds.
  LayerRange layers() const { return range_; }
  /// The dtypes of its ends: the spec's, but fp32 input for the model's first layer.
  BoundaryDTypes dtypes() const { return dtypes_; }

  /// Room for `slots` micro-batches of `rows` samples: the activations between
  /// layers, and two scratch buffers for backward.
  void reserve(B& backend, int slots, int rows) {
    if (slots == slots_ && rows == rows_) return;
    std::size_t per_row = 0;
    inner_offsets_.clear();
    for (std::size_t j = 0; j + 1 < linears_.size(); ++j) {
      inner_offsets_.push_back(per_row);
      per_row += static_cast<std::size_t>(linears_[j].out);
    }
    per_slot_ = per_row * static_cast<std::size_t>(rows);
    stash_ = backend.allocate(std::max<std::size_t>(1, per_slot_ * static_cast<std::size_t>(slots)));
    const std::size_t scratch = static_cast<std::size_t>(rows) * static_cast<std::size_t>(max_width_);
    scratch_[0] = backend.allocate(scratch);
    scratch_[1] = backend.allocate(scratch);
    // fp32 words for the ends that are not fp32: per slot x, y and dy (kept from a
    // split backward's input half to its weight half), and a scratch dx.
    const auto words = [&](DType d, int width, int count) {
      if (d == DType::kF32) return typename B::Buffer{};
      return backend.allocate(static_cast<std::size_t>(count) * static_cast<std::size_t>(rows) *
                              static_cast<std::size_t>(width));
    };
    const int in = linears_.front().in, out = linears_.back().out;
    wide_x_ = words(dtypes_.input, in, slots);
    wide_dx_ = words(dtypes_.input, in, 1);
    wide_y_ = words(dtypes_.output, out, slots);
    wide_dy_ = words(dtypes_.output, out, slots);
    kept_x_.assign(static_cast<std::size_t>(slots), nullptr);
    kept_y_.assign(static_cast<std::size_t>(slots), nullptr);
    slots_ = slots;
    rows_ = rows;
  }

  /// y = the chunk's layers applied to x; keeps x, y and the inner activations.
  void forward(B& backend, const ChunkCall& call, ConstTensorRef x, TensorRef y) {
    const std::size_t k = linears_.size();
    const int in_width = linears_.front().in;
    const float* wide_x = widen(backend, x, at_slot(wide_x_, call, in_width), call.rows, in_width);
    const float* in = wide_x;
    float* wide_y = y.dtype() == DType::kF32 ? y.as<float>() : at_slot(wide_y_, call, linears_.back().out);
    for (std::size_t j = 0; j < k; ++j) {
      float* out = j + 1 == k ? wide_y : inner(call.slot, j, call.rows);
      linears_[j].forward(backend, call.rows, in, params_.data() + offsets_[j], out);
      in = out;
    }
    narrow(backend, wide_y, y, call.rows, linears_.back().out);
    kept_x_[static_cast<std::size_t>(call.slot)] = wide_x;
    kept_y_[static_cast<std::size_t>(call.slot)] = wide_y;
  }

  /// Adds the parameter gradients for output gradient dy and writes dx unless null.
  /// Per layer, last first: dz and the bias gradient in one pass, then dW and dx.
  /// dz and dx live in the two scratch buffers, dz in place where the gradient it
  /// comes from is scratch already.
  void backward(B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    backward_layers(
        backend, call, dy, dx,
        [&](std::size_t, const float* grad) {  // where dz may go
          return grad == scratch_[1].data() ? scratch_[1].data() : scratch_[0].data();
        },
        [&](std::size_t j, const float* dz) {
          linears_[j].backward_weight(backend, call.rows, input_of(call, j), dz, grads_.data() + offsets_[j]);
        });
  }

  /// Room for what `slots` micro-batches keep between their backward_input and
  /// backward_weight: each layer's dz (the gradient of its GEMM's output).
  void reserve_split(B& backend, int slots, int rows) {
    if (slots == split_slots_ && rows == split_rows_) return;
    std::size_t per_row = 0;
    dz_offsets_.clear();
    for (const Linear& lin : linears_) {
      dz_offsets_.push_back(per_row);
      per_row += static_cast<std::size_t>(lin.out);
    }
    dz_per_slot_ = per_row * static_cast<std::size_t>(rows);
    dz_stash_ = backend.allocate(std::max<std::size_t>(1, dz_per_slot_ * static_cast<std::size_t>(slots)));
    kept_dz_.assign(static_cast<std::size_t>(slots) * linears_.size(), nullptr);
    split_slots_ = slots;
    split_rows_ = rows;
  }
  /// The input half of backward: per layer, last first, dz and the bias gradient
  /// in one pass (dz kept in the slot), then dx; dW is left to backward_weight.
  /// The same operations on the same values as backward(), so the gradients
  /// agree bit for bit.
  void backward_input(B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    const std::size_t k = linears_.size();
    backward_layers(
        backend, call, dy, dx,
        [&](std::size_t j, const float*) { return dz_of(call, j); },
        [&](std::size_t j, const float* dz) {
          kept_dz_[static_cast<std::size_t>(call.slot) * k + j] = dz;  // in the stash, or dy itself without a ReLU
        });
  }
  /// The weight half of backward: dW += dz^T x of every layer, from what
  /// backward_input kept in the slot; the slot is free afterwards.
  void backward_weight(B& backend, const ChunkCall& call) {
    const std::size_t k = linears_.size();
    for (std::size_t j = k; j-- > 0;)
      linears_[j].backward_weight(backend, call.rows, input_of(call, j),
                                  kept_dz_[static_cast<std::size_t>(call.slot) * k + j], grads_.data() + offsets_[j]);
  }
  /// Floats of host memory a slot's offload takes (OffloadableChunk): the
  /// activations between its layers, and the fp32 words of its ends that are
  /// not fp32.
  std::size_t offload_size(int rows) const { return kept_per_row(false) * static_cast<std::size_t>(rows); }
  /// Copies what the call's slot keeps to `host` (offload_size(rows) floats).
  void offload(B& backend, const ChunkCall& call, float* host) { move_kept(backend, call, false, host); }
  /// Copies it back from `host` into the call's slot, and keeps x and y (or
  /// their fp32 words, which came back with the rest) as the forward did.
  void reload(B& backend, const ChunkCall& call, ConstTensorRef x, ConstTensorRef y, const float* host) {
    move_kept(backend, call, false, host);
    const auto slot = static_cast<std::size_t>(call.slot);
    kept_x_[slot] = x.dtype() == DType::kF32 ? x.as<float>() : at_slot(wide_x_, call, linears_.front().in);
    kept_y_[slot] = y.dtype() == DType::kF32 ? y.as<float>() : at_slot(wide_y_, call, linears_.back().out);
  }

  /// Floats of host memory a slot's offload in a weight window takes
  /// (WeightOffloadableChunk): the activations between its layers, each
  /// layer's dz, and the fp32 words of x and dy where they are not fp32.
  std::size_t weight_offload_size(int rows) const { return kept_per_row(true) * static_cast<std::size_t>(rows); }
  /// Copies what the call's slot keeps for backward_weight to `host` (weight_offload_size(rows) floats).
  void offload_for_weight(B& backend, const ChunkCall& call, float* host) { move_kept(backend, call, true, host); }
  /// Copies it back from `host` into the call's slot, and keeps x and each
  /// layer's dz (dy itself, or its fp32 words, for a last layer without a
  /// ReLU) as backward_input did.
  void reload_for_weight(B& backend, const ChunkCall& call, ConstTensorRef x, ConstTensorRef dy, const float* host) {
    move_kept(backend, call, true, host);
    const auto slot = static_cast<std::size_t>(call.slot);
    const std::size_t k = linears_.size();
    kept_x_[slot] = x.dtype() == DType::kF32 ? x.as<float>() : at_slot(wide_x_, call, linears_.front().in);
    for (std::size_t j = 0; j < k; ++j)
      kept_dz_[slot * k + j] = linears_[j].relu ? dz_of(call, j)
                               : dy.dtype() == DType::kF32 ? dy.as<float>()
                                                           : at_slot(wide_dy_, call, linears_.back().out);
  }

  /// Bytes one slot keeps from a forward to its backward (SizedChunk): the
  /// activations between its layers, and the fp32 words of its ends that are
  /// not fp32.
  std::size_t slot_bytes(int rows) const { return offload_size(rows) * sizeof(float); }
  /// Bytes a slot keeps besides from backward_input to backward_weight: each
  /// layer's dz, and the fp32 words of dy where the output is not fp32.
  std::size_t split_slot_bytes(int rows) const {
    std::size_t per_row = dtypes_.output != DType::kF32 ? static_cast<std::size_t>(linears_.back().out) : 0;
    for (const Linear& lin : linears_) per_row += static_cast<std::size_t>(lin.out);
    return per_row * static_cast<std::size_t>(rows) * sizeof(float);
  }

  /// One view: all parameters of the chunk and their gradients.
  std::span<const ParameterView> parameters() const { return {&view_, 1}; }

  /// Copies the chunk's layers from `model` to the device (enqueued).
  void upload(B& backend, const HostModel& model) {
    for (std::size_t j = 0; j < linears_.size(); ++j) {
      const auto& p = model.layers.at(static_cast<std::size_t>(range_.begin) + j);
      backend.upload(p.data(), params_.data() + offsets_[j], p.size());
    }
  }
  /// Copies the chunk's layers into `model`, which must have the model's shape
  /// (enqueued: read `model` after the backend's synchronize()).
  void download(B& backend, HostModel& model) const {
    for (std::size_t j = 0; j < linears_.size(); ++j) {
      auto& p = model.layers.at(static_cast<std::size_t>(range_.begin) + j);
      p.resize(linears_[j].parameter_count());
      backend.download(params_.data() + offsets_[j], p.data(), p.size());
    }
  }

 private:
  // The backward pass over the layers, last first, shared by backward() and
  // backward_input(): per layer, dz and the bias gradient in one pass (dz written
  // to dz_at(j, grad), or dz = grad without a ReLU), then with_dz(j, dz), then the
  // gradient of the layer's input into a scratch buffer that is neither dz nor
  // grad (dx for the first layer, unless null).
  template <class DzAt, class WithDz>
  void backward_layers(B& backend, const ChunkCall& call, ConstTensorRef dy_end, TensorRef dx_end, DzAt&& dz_at,
                       WithDz&& with_dz) {
    const std::size_t k = linears_.size();
    const int in = linears_.front().in;
    const int out = linears_.back().out;
    const float* dy = widen(backend, dy_end, at_slot(wide_dy_, call, out), call.rows, out);
    float* dx = !dx_end ? nullptr : dx_end.dtype() == DType::kF32 ? dx_end.as<float>() : wide_dx_.data();
    const float* grad = dy;  // the gradient of layer j's output
    for (std::size_t j = k; j-- > 0;) {
      const Linear& lin = linears_[j];
      const float* out_act = j + 1 == k ? kept_y_[static_cast<std::size_t>(call.slot)] : inner(call.slot, j, call.rows);
      const float* dz =
          lin.backward_activation(backend, call.rows, out_act, grad, dz_at(j, grad), grads_.data() + offsets_[j]);
      with_dz(j, dz);
      float* next = j == 0 ? dx
                           : (dz == scratch_[0].data() || grad == scratch_[0].data() ? scratch_[1].data()
                                                                                      : scratch_[0].data());
      if (next != nullptr) lin.backward_input(backend, call.rows, params_.data() + offsets_[j], dz, next);
      grad = next;
    }
    if (dx != nullptr) narrow(backend, dx, dx_end, call.rows, in);
  }
  // f(memory, floats) for each part of what the call's slot keeps in the chunk's own memory, in the order of
  // the host slot: the inner activations and the fp32 words of x where the input is not fp32; then, for an
  // offload before the backward, the fp32 words of y, or, in a weight window (`for_weight`), each layer's dz
  // and the fp32 words of dy, where the output is not fp32.
  template <class F>
  void for_each_kept(const ChunkCall& call, bool for_weight, F&& f) {
    if (per_slot_ > 0) f(stash_.data() + static_cast<std::size_t>(call.slot) * per_slot_, per_slot_);
    const auto rows = static_cast<std::size_t>(call.rows);
    const int in = linears_.front().in, out = linears_.back().out;
    if (float* x = at_slot(wide_x_, call, in)) f(x, rows * static_cast<std::size_t>(in));
    if (for_weight) f(dz_of(call, 0), dz_per_slot_);
    if (float* end = at_slot(for_weight ? wide_dy_ : wide_y_, call, out)) f(end, rows * static_cast<std::size_t>(out));
  }
  // Floats per sample of what for_each_kept() walks.
  std::size_t kept_per_row(bool for_weight) const {
    std::size_t per_row = 0;
    for (std::size_t j = 0; j + 1 < linears_.size(); ++j) per_row += static_cast<std::size_t>(linears_[j].out);
    if (dtypes_.input != DType::kF32) per_row += static_cast<std::size_t>(linears_.front().in);
    if (for_weight)
      for (const Linear& lin : linears_) per_row += static_cast<std::size_t>(lin.out);
    if (dtypes_.output != DType::kF32) per_row += static_cast<std::size_t>(linears_.back().out);
    return per_row;
  }
  // Copies what for_each_kept() walks to `host` (a float*: an offload) or back from it (a const float*: a reload).
  template <class Host>
  void move_kept(B& backend, const ChunkCall& call, bool for_weight, Host* host) {
    for_each_kept(call, for_weight, [&](float* kept, std::size_t n) {
      if constexpr (std::is_const_v<Host>)
        backend.upload(host, kept, n);
      else
        backend.download(kept, host, n);
      host += n;
    });
  }
  // Where layer j's dz of the call's slot lives from backward_input to backward_weight.
  float* dz_of(const ChunkCall& call, std::size_t j) {
    return dz_stash_.data() + static_cast<std::size_t>(call.slot) * dz_per_slot_ +
           dz_offsets_[j] * static_cast<std::size_t>(call.rows);
  }
  // Slot `call.slot` of a per-slot buffer of rows x width fp32 words (nullptr when there is none).
  static float* at_slot(typename B::Buffer& buffer, const ChunkCall& call, int width) {
    if (buffer.size() == 0) return nullptr;
    return buffer.data() + static_cast<std::size_t>(call.slot) * static_cast<std::size_t>(call.rows) *
                               static_cast<std::size_t>(width);
  }
  // t (rows x width) as fp32: itself, or widened (exactly) into `words`.
  static const float* widen(B& backend, ConstTensorRef t, float* words, int rows, int width) {
    if (t.dtype() == DType::kF32) return t.as<float>();
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
    visit_dtype<FloatingStorageTypes>(t.dtype(), [&]<class T>(T) { backend.for_each(n, Convert<T, float>{t.as<T>(), words}); });
    return words;
  }
  // Copies fp32 `words` (rows x width) into `t` unless t is them (fp32), narrowed to t's dtype.
  static void narrow(B& backend, const float* words, TensorRef t, int rows, int width) {
    if (t.dtype() == DType::kF32) return;
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
    visit_dtype<FloatingStorageTypes>(t.dtype(), [&]<class T>(T) { backend.for_each(n, Convert<float, T>{words, t.as<T>()}); });
  }
  // The input of layer j of the slot's micro-batch: the chunk's x, or an inner activation.
  const float* input_of(const ChunkCall& call, std::size_t j) {
    return j == 0 ? kept_x_[static_cast<std::size_t>(call.slot)] : inner(call.slot, j - 1, call.rows);
  }
  float* inner(int slot, std::size_t j, int rows) {
    return stash_.data() + static_cast<std::size_t>(slot) * per_slot_ + inner_offsets_[j] * static_cast<std::size_t>(rows);
  }

  LayerRange range_;
  BoundaryDTypes dtypes_;
  std::vector<Linear> linears_;  // each but the model's last with its ReLU
  std::vector<std::size_t> offsets_;        // parameter offset of each layer
  std::vector<std::size_t> inner_offsets_;  // per-row offset of each inner activation in a slot
  int max_width_ = 1;
  typename B::Buffer params_, grads_, stash_, scratch_[2], dz_stash_;
  typename B::Buffer wide_x_, wide_y_, wide_dy_, wide_dx_;  // fp32 words of the ends that are not fp32
  std::vector<const float*> kept_x_, kept_y_, kept_dz_;  // kept_dz_: [slot * layers + layer]
  std::vector<std::size_t> dz_offsets_;                   // per-row offset of each layer's dz in a slot
  std::size_t per_slot_ = 0, dz_per_slot_ = 0;
  int slots_ = 0, rows_ = 0, split_slots_ = 0, split_rows_ = 0;
  ParameterView view_{};
};

}  // namespace pipeweave
