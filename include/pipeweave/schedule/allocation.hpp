#pragma once
/// \file
/// Layer allocation: L layers split evenly into P*V virtual stages; virtual stage
/// s = c*P + d lives on device d as its chunk c.
///
/// \code
/// constexpr pipeweave::ScheduleShape shape{.devices = 4, .chunks = 2, .micro_batches = 8};
/// static_assert(pipeweave::chunk_layers(shape, 16, 0, 1).begin == 8);  // layers 9, 10 (1-based)
/// \endcode

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

/// Describes why `layers` cannot be split over the shape's stages; empty when it can.
constexpr Text layer_split_error(const ScheduleShape& s, int layers) {
  Text t;
  if (layers < 1) {
    t << "layers must be at least 1 (got " << layers << ")";
  } else if (s.devices < 1 || s.chunks < 1) {
    t << "devices and chunks must be at least 1 (got " << s.devices << " and " << s.chunks << ")";
  } else if (layers % s.stages() != 0) {
    t << "layers (" << layers << ") must be a multiple of devices * chunks (" << s.devices << " * "
      << s.chunks << " = " << s.stages() << ")";
  }
  return t;
}

/// Layers of virtual stage s. Requires layer_split_error(s, layers) to be empty.
constexpr LayerRange stage_layers(const ScheduleShape& s, int layers, int stage) {
  const int per_stage = layers / s.stages();
  return {stage * per_stage, (stage + 1) * per_stage};
}

/// Layers held by device d as its chunk c (virtual stage c*P + d).
constexpr LayerRange chunk_layers(const ScheduleShape& s, int layers, int device, int chunk) {
  return stage_layers(s, layers, s.stage_of(device, chunk));
}

/// Throws pipeweave::Error when `layers` cannot be split over the shape's stages.
inline void check_layer_split(const ScheduleShape& s, int layers) {
  if (Text e = layer_split_error(s, layers); !e.empty()) throw Error(e.str());
}

}  // namespace pipeweave
