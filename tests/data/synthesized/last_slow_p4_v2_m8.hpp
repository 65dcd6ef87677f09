// Synthesized schedule: 4 devices x 2 chunks, 8 micro-batches, loop placement.
#pragma once

#include <array>

#include "pipeweave/schedule.hpp"

struct SynthesizedLastSlow {
  static constexpr pipeweave::ScheduleShape shape{*pipeweave::parse_schedule("auto", true), 4, 2, 8, pipeweave::Placement::kLoop};
  static constexpr int devices = 4, chunks = 2, micro_batches = 8, actions_per_device = 47;
  static constexpr std::array<int, 4> counts{43, 47, 47, 47};
  static constexpr std::array<std::array<pipeweave::Action, 47>, 4> actions{{
      {{pipeweave::fwd(0, 0), pipeweave::fwd(0, 1), pipeweave::fwd(0, 2), pipeweave::fwd(0, 3), pipeweave::fwd(1, 0),
        pipeweave::fwd(1, 1), pipeweave::fwd(1, 2), pipeweave::fwd(1, 3), pipeweave::bwd(1, 0),
        pipeweave::bwd_input(1, 1), pipeweave::bwd_weight(1, 1), pipeweave::fwd(0, 4), pipeweave::bwd(0, 0),
        pipeweave::bwd_input(0, 1), pipeweave::bwd_weight(0, 1), pipeweave::fwd(0, 5), pipeweave::bwd(1, 2),
        pipeweave::fwd(1, 4), pipeweave::bwd_input(1, 3), pipeweave::bwd_weight(1, 3), pipeweave::fwd(1, 5),
        pipeweave::fwd(0, 6), pipeweave::bwd(0, 2), pipeweave::bwd_input(0, 3), pipeweave::bwd_weight(0, 3),
        pipeweave::fwd(0, 7), pipeweave::bwd(1, 4), pipeweave::fwd(1, 6), pipeweave::fwd(1, 7),
        pipeweave::bwd_input(1, 5), pipeweave::bwd_weight(1, 5), pipeweave::bwd_input(0, 4),
        pipeweave::bwd_weight(0, 4), pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(0, 5),
        pipeweave::bwd_input(1, 6), pipeweave::bwd_weight(1, 6), pipeweave::bwd_input(1, 7),
        pipeweave::bwd_weight(1, 7), pipeweave::bwd_input(0, 6), pipeweave::bwd_weight(0, 6),
        pipeweave::bwd_input(0, 7), pipeweave::bwd_weight(0, 7)}},
      {{pipeweave::fwd(0, 0), pipeweave::fwd(0, 1), pipeweave::fwd(0, 2), pipeweave::fwd(0, 3), pipeweave::fwd(1, 0),
        pipeweave::fwd(1, 1), pipeweave::fwd(1, 2), pipeweave::fwd(1, 3), pipeweave::bwd(1, 0),
        pipeweave::bwd_input(1, 1), pipeweave::bwd_weight(1, 1), pipeweave::bwd_input(0, 0),
        pipeweave::bwd_weight(0, 0), pipeweave::fwd(0, 4), pipeweave::bwd_input(0, 1), pipeweave::bwd_weight(0, 1),
        pipeweave::bwd_input(1, 2), pipeweave::bwd_weight(1, 2), pipeweave::fwd(0, 5), pipeweave::bwd_input(1, 3),
        pipeweave::bwd_weight(1, 3), pipeweave::fwd(1, 4), pipeweave::bwd_input(0, 2), pipeweave::bwd_weight(0, 2),
        pipeweave::fwd(1, 5), pipeweave::fwd(0, 6), pipeweave::bwd_input(0, 3), pipeweave::bwd_weight(0, 3),
        pipeweave::bwd_input(1, 4), pipeweave::bwd_weight(1, 4), pipeweave::fwd(0, 7), pipeweave::fwd(1, 6),
        pipeweave::bwd_input(1, 5), pipeweave::bwd_weight(1, 5), pipeweave::fwd(1, 7), pipeweave::bwd_input(0, 4),
        pipeweave::bwd_weight(0, 4), pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(0, 5),
        pipeweave::bwd_input(1, 6), pipeweave::bwd_weight(1, 6), pipeweave::bwd_input(1, 7),
        pipeweave::bwd_weight(1, 7), pipeweave::bwd_input(0, 6), pipeweave::bwd_weight(0, 6),
        pipeweave::bwd_input(0, 7), pipeweave::bwd_weight(0, 7)}},
      {{pipeweave::fwd(0, 0), pipeweave::fwd(0, 1), pipeweave::fwd(0, 2), pipeweave::fwd(0, 3), pipeweave::fwd(1, 0),
        pipeweave::fwd(1, 1), pipeweave::fwd(1, 2), pipeweave::fwd(1, 3), pipeweave::bwd(1, 0),
        pipeweave::bwd_input(1, 1), pipeweave::bwd_weight(1, 1), pipeweave::bwd_input(0, 0),
        pipeweave::bwd_weight(0, 0), pipeweave::bwd_input(0, 1), pipeweave::bwd_weight(0, 1), pipeweave::fwd(0, 4),
        pipeweave::bwd_input(1, 2), pipeweave::bwd_weight(1, 2), pipeweave::bwd_input(1, 3),
        pipeweave::bwd_weight(1, 3), pipeweave::fwd(0, 5), pipeweave::bwd_input(0, 2), pipeweave::bwd_weight(0, 2),
        pipeweave::fwd(1, 4), pipeweave::bwd_input(0, 3), pipeweave::bwd_weight(0, 3), pipeweave::fwd(1, 5),
        pipeweave::fwd(0, 6), pipeweave::bwd_input(1, 4), pipeweave::bwd_weight(1, 4), pipeweave::fwd(0, 7),
        pipeweave::bwd_input(1, 5), pipeweave::bwd_weight(1, 5), pipeweave::fwd(1, 6), pipeweave::bwd_input(0, 4),
        pipeweave::bwd_weight(0, 4), pipeweave::fwd(1, 7), pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(0, 5),
        pipeweave::bwd_input(1, 6), pipeweave::bwd_weight(1, 6), pipeweave::bwd_input(1, 7),
        pipeweave::bwd_weight(1, 7), pipeweave::bwd_input(0, 6), pipeweave::bwd_weight(0, 6),
        pipeweave::bwd_input(0, 7), pipeweave::bwd_weight(0, 7)}},
      {{pipeweave::fwd(0, 0), pipeweave::fwd(0, 1), pipeweave::fwd(0, 2), pipeweave::fwd(0, 3), pipeweave::fwd(1, 0),
        pipeweave::bwd(1, 0), pipeweave::fwd(1, 1), pipeweave::fwd(1, 2), pipeweave::fwd(1, 3),
        pipeweave::bwd_input(1, 1), pipeweave::bwd_weight(1, 1), pipeweave::bwd_input(0, 0),
        pipeweave::bwd_weight(0, 0), pipeweave::bwd_input(0, 1), pipeweave::bwd_weight(0, 1),
        pipeweave::bwd_input(1, 2), pipeweave::bwd_input(1, 3), pipeweave::bwd_weight(1, 2),
        pipeweave::bwd_weight(1, 3), pipeweave::fwd(0, 4), pipeweave::bwd_input(0, 2), pipeweave::bwd_weight(0, 2),
        pipeweave::fwd(0, 5), pipeweave::bwd_input(0, 3), pipeweave::bwd_weight(0, 3), pipeweave::fwd(1, 4),
        pipeweave::bwd_input(1, 4), pipeweave::bwd_weight(1, 4), pipeweave::fwd(1, 5), pipeweave::fwd(0, 6),
        pipeweave::bwd_input(1, 5), pipeweave::bwd_weight(1, 5), pipeweave::fwd(0, 7), pipeweave::bwd_input(0, 4),
        pipeweave::bwd_weight(0, 4), pipeweave::fwd(1, 6), pipeweave::bwd_input(0, 5), pipeweave::bwd_weight(0, 5),
        pipeweave::fwd(1, 7), pipeweave::bwd_input(1, 6), pipeweave::bwd_weight(1, 6), pipeweave::bwd_input(1, 7),
        pipeweave::bwd_weight(1, 7), pipeweave::bwd_input(0, 6), pipeweave::bwd_weight(0, 6),
        pipeweave::bwd_input(0, 7), pipeweave::bwd_weight(0, 7)}},
  }};
  // Each virtual stage's reference clock (pipeweave::Program::stage_lowering): F, B, I, W.
  static constexpr std::array<pipeweave::LoweringCosts, 8> stage_lowering_costs{{
      {3, 6, 3, 3}, {3, 6, 3, 3}, {3, 6, 3, 3}, {3, 6, 3, 3}, {3, 6, 3, 3}, {3, 6, 3, 3}, {3, 6, 3, 3},
      {4, 8, 4, 4}}};
  using Base = SynthesizedLastSlow;
  static constexpr const auto& lowered() { return pipeweave::detail::static_lowering<SynthesizedLastSlow>; }
  static constexpr pipeweave::Program program() { return pipeweave::detail::static_program<SynthesizedLastSlow>(); }
};

static_assert(pipeweave::verify(SynthesizedLastSlow{}));
