#pragma once
/// \file
/// Compile-time schedules: Interleaved1F1B<P, V, M>, OneFOneB<P, M>, GPipe<P, M>.
/// Each holds every device's actions as constexpr std::arrays, evaluated from the
/// same ordering rules as make_schedule().
///
/// \code
/// using S = pipeweave::Interleaved1F1B<4, 2, 8>;
/// static_assert(S::actions[0][11] == pipeweave::bwd(1, 0));
/// \endcode

#include <array>
#include <concepts>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pipeweave {

namespace detail {

constexpr int clamp_count(int n) { return n < 0 ? 0 : n; }

/// Storage and accessors shared by the compile-time schedules. Sizes are clamped
/// so that a bad parameter reports only its static_assert, not follow-on errors.
template <ScheduleKind Kind, int Devices, int Chunks, int MicroBatches>
struct StaticSchedule {
  /// The schedule's parameters as a run-time value.
  static constexpr ScheduleShape shape{Kind, Devices, Chunks, MicroBatches};
  static constexpr int devices = Devices;              ///< P
  static constexpr int chunks = Chunks;                ///< V
  static constexpr int micro_batches = MicroBatches;   ///< M
  /// Compute actions per device, 2 * V * M.
  static constexpr int actions_per_device = clamp_count(2 * Chunks * MicroBatches);

  using DeviceActions = std::array<Action, static_cast<std::size_t>(actions_per_device)>;

  /// `actions[d][k]`: device d's k-th action.
  static constexpr std::array<DeviceActions, static_cast<std::size_t>(clamp_count(Devices))> actions = [] {
    std::array<DeviceActions, static_cast<std::size_t>(clamp_count(Devices))> out{};
    if (shape_error(shape).empty()) {
      for (int d = 0; d < Devices; ++d)
        for (int k = 0; k < actions_per_device; ++k)
          out[static_cast<std::size_t>(d)][static_cast<std::size_t>(k)] = schedule_action(shape, d, k);
    }
    return out;
  }();

  /// Number of warm-up forwards on device d.
  static constexpr int warmup(int device) { return warmup_forwards(shape, device); }

  /// The actions as a Program (vectors), usable in constant expressions as a transient.
  static constexpr Program program() {
    Program p{shape, {}};
    p.devices.resize(static_cast<std::size_t>(clamp_count(Devices)));
    for (std::size_t d = 0; d < p.devices.size(); ++d)
      p.devices[d].assign(actions[d].begin(), actions[d].end());
    return p;
  }
};

template <int Devices, int Chunks, int MicroBatches>
struct Interleaved1F1BChecks {
  static_assert(Devices >= 1, "Interleaved1F1B: Devices must be at least 1");
  static_assert(Chunks >= 1, "Interleaved1F1B: Chunks must be at least 1");
  static_assert(MicroBatches >= 1, "Interleaved1F1B: MicroBatches must be at least 1");
  static_assert(Devices < 1 || MicroBatches % Devices == 0,
                "Interleaved1F1B: MicroBatches must be a multiple of Devices");
};

template <int Devices, int MicroBatches>
struct OneFOneBChecks {
  static_assert(Devices >= 1, "OneFOneB: Devices must be at least 1");
  static_assert(MicroBatches >= 1, "OneFOneB: MicroBatches must be at least 1");
};

template <int Devices, int MicroBatches>
struct GPipeChecks {
  static_assert(Devices >= 1, "GPipe: Devices must be at least 1");
  static_assert(MicroBatches >= 1, "GPipe: MicroBatches must be at least 1");
};

}  // namespace detail

/// Interleaved 1F1B (Megatron-LM's virtual pipeline): P devices, V chunks per
/// device, M micro-batches; M must be a multiple of P.
template <int Devices, int Chunks, int MicroBatches>
struct Interleaved1F1B
    : detail::Interleaved1F1BChecks<Devices, Chunks, MicroBatches>,
      detail::StaticSchedule<ScheduleKind::kInterleaved1F1B, Devices, Chunks, MicroBatches> {};

/// Plain 1F1B (PipeDream-Flush): P devices, one chunk each, M micro-batches.
template <int Devices, int MicroBatches>
struct OneFOneB : detail::OneFOneBChecks<Devices, MicroBatches>,
                  detail::StaticSchedule<ScheduleKind::kOneFOneB, Devices, 1, MicroBatches> {};

/// GPipe: every forward, then every backward, micro-batches ascending.
template <int Devices, int MicroBatches>
struct GPipe : detail::GPipeChecks<Devices, MicroBatches>,
               detail::StaticSchedule<ScheduleKind::kGPipe, Devices, 1, MicroBatches> {};

/// True for the compile-time schedule types above.
template <class S>
concept StaticScheduleType = requires {
  { S::shape } -> std::convertible_to<ScheduleShape>;
  S::actions;
  { S::program() } -> std::same_as<Program>;
};

}  // namespace pipeweave
