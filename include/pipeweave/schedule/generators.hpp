#pragma once
/// \file
/// The ordering rules of GPipe, 1F1B and interleaved 1F1B, each written once as
/// a constexpr function over run-time integers. The compile-time schedules
/// (schedules.hpp) and make_schedule() both call these.

#include <algorithm>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Where an action falls in a device's program.
enum class Period : unsigned char { kWarmUp, kSteady, kCoolDown };

/// Describes what is wrong with a shape for its schedule kind; empty when valid.
constexpr Text shape_error(const ScheduleShape& s) {
  Text t;
  const std::string_view name = schedule_name(s.kind);
  if (s.devices < 1) {
    t << name << " schedule: devices must be at least 1 (got " << s.devices << ")";
  } else if (s.chunks < 1) {
    t << name << " schedule: chunks must be at least 1 (got " << s.chunks << ")";
  } else if (s.micro_batches < 1) {
    t << name << " schedule: micro-batches must be at least 1 (got " << s.micro_batches << ")";
  } else if ((s.kind == ScheduleKind::kGPipe || s.kind == ScheduleKind::kOneFOneB) && s.chunks != 1) {
    t << name << " schedule: chunks must be 1 (got " << s.chunks
      << "); use the interleaved schedule for several chunks per device";
  } else if (s.kind == ScheduleKind::kInterleaved1F1B && s.micro_batches % s.devices != 0) {
    t << "interleaved schedule: micro-batches (" << s.micro_batches
      << ") must be a multiple of devices (" << s.devices << ")";
  } else if (static_cast<long long>(s.devices) * s.chunks * s.micro_batches > (1LL << 26)) {
    t << name << " schedule: devices * chunks * micro-batches must be at most 2^26 (got "
      << static_cast<long long>(s.devices) * s.chunks * s.micro_batches << ")";
  }
  return t;
}

/// Number of warm-up forwards on device d (the forwards before the first backward).
/// - interleaved: min(2*(P-d-1) + (V-1)*P, V*M), Megatron-LM's rule;
/// - 1F1B: min(P-d-1, M);
/// - GPipe: M (every forward runs before any backward).
/// Note that interleaved with V = 1 keeps its own rule, 2*(P-d-1), which is not 1F1B's.
constexpr int warmup_forwards(const ScheduleShape& s, int device) {
  const int total = s.chunks * s.micro_batches;
  switch (s.kind) {
    case ScheduleKind::kInterleaved1F1B:
      return std::min(2 * (s.devices - device - 1) + (s.chunks - 1) * s.devices, total);
    case ScheduleKind::kOneFOneB:
      return std::min(s.devices - device - 1, total);
    case ScheduleKind::kGPipe:
    case ScheduleKind::kCustom:
      return total;
  }
  return total;
}

namespace detail {

/// The j-th forward (or backward) of a device as (chunk, micro-batch).
constexpr Action nth_of_phase(const ScheduleShape& s, Phase phase, int j) {
  if (s.kind != ScheduleKind::kInterleaved1F1B) return {phase, 0, j};
  const int group = s.devices * s.chunks;
  const int forward_chunk = (j % group) / s.devices;
  const int micro_batch = (j / group) * s.devices + j % s.devices;
  const int chunk = phase == Phase::kForward ? forward_chunk : s.chunks - 1 - forward_chunk;
  return {phase, chunk, micro_batch};
}

}  // namespace detail

/// Period (warm-up, steady 1F1B, cool-down) of device d's k-th action.
constexpr Period period_of(const ScheduleShape& s, int device, int k) {
  const int total = s.chunks * s.micro_batches;
  const int warmup = warmup_forwards(s, device);
  if (k < warmup) return Period::kWarmUp;
  if (k < 2 * total - warmup) return Period::kSteady;
  return Period::kCoolDown;
}

/// Device d's k-th action (0 <= k < 2*V*M): W warm-up forwards, then one forward
/// and one backward in turn, then the remaining backwards.
constexpr Action schedule_action(const ScheduleShape& s, int device, int k) {
  const int total = s.chunks * s.micro_batches;
  const int warmup = warmup_forwards(s, device);
  if (k < warmup) return detail::nth_of_phase(s, Phase::kForward, k);
  if (k < 2 * total - warmup) {
    const int j = k - warmup;
    return j % 2 == 0 ? detail::nth_of_phase(s, Phase::kForward, warmup + j / 2)
                      : detail::nth_of_phase(s, Phase::kBackward, j / 2);
  }
  return detail::nth_of_phase(s, Phase::kBackward, k - total);
}

/// Every device's program for a shape, evaluated at run time (or in a constant
/// expression, as a transient). Throws pipeweave::Error when the shape breaks
/// its schedule's rules.
constexpr Program make_program(const ScheduleShape& s) {
  if (s.kind == ScheduleKind::kCustom) throw Error("make_program: a custom schedule has no generator");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  Program p{s, {}};
  p.devices.resize(static_cast<std::size_t>(s.devices));
  for (int d = 0; d < s.devices; ++d) {
    auto& actions = p.devices[static_cast<std::size_t>(d)];
    actions.reserve(static_cast<std::size_t>(s.actions_per_device()));
    for (int k = 0; k < s.actions_per_device(); ++k) actions.push_back(schedule_action(s, d, k));
  }
  return p;
}

/// Run-time front end: the programs of `kind` for P devices, V chunks, M micro-batches.
/// Throws pipeweave::Error stating the rule when a parameter is out of range.
inline Program make_schedule(ScheduleKind kind, int devices, int chunks, int micro_batches) {
  return make_program(ScheduleShape{kind, devices, chunks, micro_batches});
}

}  // namespace pipeweave
