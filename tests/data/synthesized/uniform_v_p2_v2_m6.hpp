// Synthesized schedule: 2 devices x 2 chunks, 6 micro-batches, v placement.
#pragma once

#include <array>

#include "pipeweave/schedule.hpp"

struct SynthesizedV {
  static constexpr pipeweave::ScheduleShape shape{*pipeweave::parse_schedule("auto", true), 2, 2, 6, pipeweave::Placement::kV};
  static constexpr int devices = 2, chunks = 2, micro_batches = 6, actions_per_device = 31;
  static constexpr std::array<int, 2> counts{31, 31};
  static constexpr std::array<std::array<pipeweave::Action, 31>, 2> actions{{
      {{pipeweave::fwd(0, 0), pipeweave::fwd(0, 1), pipeweave::fwd(1, 0), pipeweave::bwd(1, 0), pipeweave::fwd(1, 1),
        pipeweave::bwd_input(1, 1), pipeweave::bwd_weight(1, 1), pipeweave::fwd(0, 2), pipeweave::bwd(0, 0),
        pipeweave::fwd(1, 2), pipeweave::bwd_input(1, 2), pipeweave::bwd_weight(1, 2), pipeweave::fwd(0, 3),
        pipeweave::bwd(0, 1), pipeweave::fwd(1, 3), pipeweave::bwd_input(1, 3), pipeweave::bwd_weight(1, 3),
        pipeweave::fwd(0, 4), pipeweave::bwd(0, 2), pipeweave::fwd(1, 4), pipeweave::bwd_input(1, 4),
        pipeweave::bwd_weight(1, 4), pipeweave::fwd(0, 5), pipeweave::bwd(0, 3), pipeweave::fwd(1, 5),
        pipeweave::bwd_input(1, 5), pipeweave::bwd_weight(1, 5), pipeweave::bwd_input(0, 4),
        pipeweave::bwd_weight(0, 4), pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(0, 5)}},
      {{pipeweave::fwd(0, 0), pipeweave::fwd(1, 0), pipeweave::fwd(0, 1), pipeweave::fwd(1, 1), pipeweave::bwd(1, 0),
        pipeweave::bwd_input(0, 0), pipeweave::bwd_weight(0, 0), pipeweave::fwd(0, 2), pipeweave::fwd(1, 2),
        pipeweave::bwd(1, 1), pipeweave::bwd_input(0, 1), pipeweave::bwd_weight(0, 1), pipeweave::fwd(0, 3),
        pipeweave::fwd(1, 3), pipeweave::bwd(1, 2), pipeweave::bwd_input(0, 2), pipeweave::bwd_weight(0, 2),
        pipeweave::fwd(0, 4), pipeweave::fwd(1, 4), pipeweave::bwd(1, 3), pipeweave::bwd_input(0, 3),
        pipeweave::bwd_weight(0, 3), pipeweave::fwd(0, 5), pipeweave::fwd(1, 5), pipeweave::bwd(1, 4),
        pipeweave::bwd_input(0, 4), pipeweave::bwd_weight(0, 4), pipeweave::bwd_input(1, 5),
        pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(1, 5), pipeweave::bwd_weight(0, 5)}},
  }};
  using Base = SynthesizedV;
  static constexpr const auto& lowered() { return pipeweave::detail::static_lowering<SynthesizedV>; }
  static constexpr pipeweave::Program program() { return pipeweave::detail::static_program<SynthesizedV>(); }
};

static_assert(pipeweave::verify(SynthesizedV{}));
