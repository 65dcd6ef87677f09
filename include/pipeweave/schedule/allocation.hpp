#pragma once
/// \file
/// Layer allocation: which of a model's L layers each virtual stage holds, and so
/// each device's chunks (virtual stage s = c*P + d lives on device d as its chunk
/// c; see ScheduleShape::stage_of for the v placement). A LayerAllocation is the
/// even split of L over the P*V stages, or a list of layers per virtual stage in
/// virtual-stage order, as Megatron-LM's num_layers_in_first_pipeline_stage and
/// num_layers_in_last_pipeline_stage give the first stage (the embedding) and the
/// last (the loss) fewer layers. Either way stage s holds the layers after those
/// of stages 0..s-1, in model order.
///
/// \code
/// constexpr pipeweave::ScheduleShape shape{.devices = 4, .chunks = 2, .micro_batches = 8};
/// static_assert(pipeweave::chunk_layers(shape, 16, 0, 1).begin == 8);  // layers 9, 10 (1-based)
/// // 14 layers, the first and the last stage one each: device 3's chunk 1 is layer 14 alone.
/// static_assert(pipeweave::chunk_layers(shape, {14, {1, 2, 2, 2, 2, 2, 2, 1}}, 3, 1).begin == 13);
/// \endcode

#include <cstddef>
#include <utility>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// A half-open range of 0-based layer indices [begin, end).
struct LayerRange {
  int begin = 0;
  int end = 0;
  constexpr int size() const { return end - begin; }
  friend constexpr bool operator==(const LayerRange&, const LayerRange&) = default;
};

/// How a model's layers split into the virtual stages of a pipeline: `layers` in
/// all, and `per_stage[s]` of them in virtual stage s, one entry per stage (P*V),
/// in virtual-stage order; an empty `per_stage` is the even split, layers / (P*V)
/// each. layer_split_error() says whether it fits a shape.
struct LayerAllocation {
  int layers = 0;              ///< the model's layers L
  std::vector<int> per_stage;  ///< layers of each virtual stage; empty: the even split

  /// The even split of `layers` (an int converts: chunk_layers(shape, 16, d, c)).
  constexpr LayerAllocation(int layers = 0) : layers(layers) {}
  /// `per_stage[s]` layers in virtual stage s, `layers` in all.
  constexpr LayerAllocation(int layers, std::vector<int> per_stage) : layers(layers), per_stage(std::move(per_stage)) {}

  /// Whether this is the even split.
  constexpr bool even() const { return per_stage.empty(); }
  /// The layers of virtual stage `stage` of `stages` (P*V): after those of the
  /// stages before it. Requires layer_split_error() to be empty for a shape of
  /// `stages` stages.
  constexpr LayerRange range(int stages, int stage) const {
    if (even()) {
      const int each = layers / stages;
      return {stage * each, (stage + 1) * each};
    }
    int begin = 0;
    for (int s = 0; s < stage; ++s) begin += per_stage[static_cast<std::size_t>(s)];
    return {begin, begin + per_stage[static_cast<std::size_t>(stage)]};
  }
  friend constexpr bool operator==(const LayerAllocation&, const LayerAllocation&) = default;
};

/// Describes why `a` cannot split a model over the shape's stages; empty when it
/// can. The even split: at least 1 layer, a multiple of P*V. A list: one entry per
/// virtual stage, each at least 1, summing to the model's layers.
constexpr Text layer_split_error(const ScheduleShape& s, const LayerAllocation& a) {
  Text t;
  if (a.even()) {
    if (a.layers < 1) {
      t << "layers must be at least 1 (got " << a.layers << ")";
    } else if (s.devices < 1 || s.chunks < 1) {
      t << "devices and chunks must be at least 1 (got " << s.devices << " and " << s.chunks << ")";
    } else if (a.layers % s.stages() != 0) {
      t << "layers (" << a.layers << ") must be a multiple of devices * chunks (" << s.devices << " * " << s.chunks
        << " = " << s.stages() << ")";
    }
    return t;
  }
  if (s.devices < 1 || s.chunks < 1) {
    t << "devices and chunks must be at least 1 (got " << s.devices << " and " << s.chunks << ")";
    return t;
  }
  const long long entries = static_cast<long long>(a.per_stage.size());
  if (entries != s.stages()) {
    t << "layers per stage has " << entries << (entries == 1 ? " entry" : " entries")
      << "; it must have one per virtual stage, devices * chunks (" << s.devices << " * " << s.chunks << " = "
      << s.stages() << ")";
    return t;
  }
  long long sum = 0;
  for (std::size_t i = 0; i < a.per_stage.size(); ++i) {
    if (a.per_stage[i] < 1) {
      t << "layers per stage: virtual stage " << static_cast<long long>(i) << " has " << a.per_stage[i]
        << " layers; each virtual stage must have at least 1";
      return t;
    }
    sum += a.per_stage[i];
  }
  if (sum != a.layers)
    t << "layers per stage sum to " << sum << "; they must sum to the model's layers (" << a.layers << ")";
  return t;
}

/// Layers of virtual stage `stage`. Requires layer_split_error(s, a) to be empty.
constexpr LayerRange stage_layers(const ScheduleShape& s, const LayerAllocation& a, int stage) {
  return a.range(s.stages(), stage);
}

/// Layers held by device d as its chunk c (virtual stage s.stage_of(d, c)).
constexpr LayerRange chunk_layers(const ScheduleShape& s, const LayerAllocation& a, int device, int chunk) {
  return stage_layers(s, a, s.stage_of(device, chunk));
}

/// Throws pipeweave::Error when `a` cannot split a model over the shape's stages
/// (layer_split_error).
inline void check_layer_split(const ScheduleShape& s, const LayerAllocation& a) {
  if (Text e = layer_split_error(s, a); !e.empty()) throw Error(e.str());
}

}  // namespace pipeweave
