#pragma once
/// \file
/// Programs of the generated schedule kinds: generate_device() runs a kind's
/// order (its row's generator, orders.hpp) for one device, make_program() and
/// make_schedule() for every device, at run time or in a constant expression;
/// period_counts() says where each device's warm-up, steady period and
/// cool-down fall. The compile-time schedules (schedules.hpp) and
/// make_schedule() both call generate_device().

#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/orders.hpp"

namespace pipeweave {

namespace detail {

/// A callable as an ActionSink.
template <class Emit>
struct SinkOf final : ActionSink {
  Emit& emit;
  constexpr explicit SinkOf(Emit& e) : emit(e) {}
  constexpr void operator()(const Action& a, Period period) override { emit(a, period); }
};

}  // namespace detail

/// Hands device d's actions, in order, to `emit(action, period)`: the order of
/// the shape's kind (its row's generator); nothing for a custom shape. The
/// shape must pass shape_error().
template <class Emit>
constexpr void generate_device(const ScheduleShape& s, int device, Emit&& emit) {
  detail::SinkOf<std::remove_reference_t<Emit>> sink(emit);
  const KindRow& row = kind_row(s.kind);
  row.generate(s, device, row.warmup(s, device), sink);
}

/// How many actions of device d fall in each period, in program order (the
/// periods are contiguous): counts[Period].
struct PeriodCounts {
  int counts[3] = {0, 0, 0};
  constexpr int operator[](Period p) const { return counts[static_cast<int>(p)]; }
};

/// The periods of device d's program. Costs one run of its generator.
constexpr PeriodCounts period_counts(const ScheduleShape& s, int device) {
  PeriodCounts c;
  generate_device(s, device, [&](const Action&, Period p) { ++c.counts[static_cast<int>(p)]; });
  return c;
}

/// Period (warm-up, steady, cool-down) of device d's k-th action. Costs one run
/// of its generator: for a whole program, use period_counts().
constexpr Period period_of(const ScheduleShape& s, int device, int k) {
  const PeriodCounts c = period_counts(s, device);
  if (k < c[Period::kWarmUp]) return Period::kWarmUp;
  if (k < c[Period::kWarmUp] + c[Period::kSteady]) return Period::kSteady;
  return Period::kCoolDown;
}

/// Every device's program for a shape, evaluated at run time (or in a constant
/// expression, as a transient). Throws pipeweave::Error when the shape breaks
/// its schedule's rules.
constexpr Program make_program(const ScheduleShape& s) {
  if (kind_row(s.kind).synthesized)
    throw Error("make_program: an auto schedule is searched for costs and a memory limit: use synthesize()");
  if (!kind_row(s.kind).generated) throw Error("make_program: a custom schedule has no generator");
  if (Text e = shape_error(s); !e.empty()) throw Error(e.str());
  Program p{s, {}};
  p.devices.resize(static_cast<std::size_t>(s.devices));
  for (int d = 0; d < s.devices; ++d) {
    auto& actions = p.devices[static_cast<std::size_t>(d)];
    actions.reserve(static_cast<std::size_t>(s.actions_per_device()));
    generate_device(s, d, [&](const Action& a, Period) { actions.push_back(a); });
  }
  return p;
}

/// Run-time front end: the programs of `kind` for P devices, V chunks, M
/// micro-batches, in the kind's placement (placement_of()). Throws
/// pipeweave::Error stating the rule when a parameter is out of range.
inline Program make_schedule(ScheduleKind kind, int devices, int chunks, int micro_batches) {
  return make_program(ScheduleShape{kind, devices, chunks, micro_batches, placement_of(kind)});
}

/// The generated kind schedule_name() calls `name` ("1f1b", "interleaved", ...).
/// Throws pipeweave::Error naming the schedules there are for any other name.
inline ScheduleKind schedule_kind(std::string_view name) {
  const std::optional<ScheduleKind> kind = parse_schedule(name);
  if (!kind) {
    Text t("make_schedule: no schedule is called '");
    t << name << "'; the schedules are";
    for (const ScheduleKind k : generated_kinds()) t << " " << schedule_name(k);
    throw Error(t.str());
  }
  return *kind;
}

/// The same by the kind's name, as schedule_name() writes it (schedule_kind()).
inline Program make_schedule(std::string_view name, int devices, int chunks, int micro_batches) {
  return make_schedule(schedule_kind(name), devices, chunks, micro_batches);
}

}  // namespace pipeweave
