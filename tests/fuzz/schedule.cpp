// Fuzz target: make_schedule + lower + simulate on arbitrary shapes and cost
// models. A shape or a cost model out of range is refused with a
// pipeweave::Error (so is one whose times overflow or lose the actions'
// durations); otherwise the program and
// its lowered steps verify, the simulation's every time is finite and in order,
// and:
// - where a closed form exists (a generated schedule, every device of speed 1,
//   some compute, and the costs its form needs), the bubble is not below it;
// - the dataflow replay is never slower than the lowered steps (it is their bound);
// - with the costs lower() plans with (backward = 2 forward, free communication)
//   the steps meet the closed-form makespan exactly.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pf = pipeweave::fuzz;
using namespace pipeweave;

namespace {

// Costs the fuzzer picks from: ordinary ones, zero, extremes and invalid ones.
constexpr double kCosts[] = {1.0, 2.0, 0.5, 3.0, 0.0, 1e-3, 7.25, 1e6, 1e300, -1.0,
                             std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
constexpr int kLastCost = static_cast<int>(sizeof kCosts / sizeof kCosts[0]) - 1;
// Device speeds: ordinary, extreme and invalid.
constexpr double kSpeeds[] = {1.0, 2.0, 0.5, 1e-300, 1e300, 0.0, -1.0};
constexpr int kLastSpeed = static_cast<int>(sizeof kSpeeds / sizeof kSpeeds[0]) - 1;

double cost(pf::Input& in) {
  // Mostly a small multiple of 1/4, sometimes one of the table's.
  return in.flag() ? kCosts[in.integer(0, kLastCost)] : in.integer(0, 40) / 4.0;
}

CostModel any_cost_model(pf::Input& in, int devices) {
  CostModel c;
  c.compute[Phase::kForward] = cost(in);
  c.compute[Phase::kBackward] = in.flag() ? -1.0 : cost(in);
  if (in.flag()) {
    c.p2p_latency = cost(in);
    c.p2p_bandwidth = cost(in);
    c.activation_bytes = cost(in);
  }
  if (in.flag()) {
    const int n = in.flag() ? devices : in.integer(0, devices + 1);
    for (int d = 0; d < n; ++d) c.device_speed.push_back(kSpeeds[in.integer(0, kLastSpeed)]);
  }
  c.replay = in.flag() ? ReplayMode::kDataflow : ReplayMode::kSteps;
  return c;
}

bool uniform_speed(const CostModel& c) {
  for (double s : c.device_speed)
    if (s != 1.0) return false;
  return true;
}

// Every time of the trace finite, and every event ending no earlier than it starts.
void check_times(const Trace& t) {
  for (const auto& device : t.compute)
    for (const TraceEvent& e : device)
      if (!pf::finite(e.start) || !pf::finite(e.end) || e.end < e.start)
        pf::finding("a compute event at " + std::to_string(e.start) + ".." + std::to_string(e.end));
  for (const auto& device : t.comm)
    for (const CommEvent& e : device)
      if (!pf::finite(e.start) || !pf::finite(e.end) || e.end < e.start)
        pf::finding("a P2P event at " + std::to_string(e.start) + ".." + std::to_string(e.end));
}

bool close(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)}); }

void check(pf::Input& in) {
  const auto kind = static_cast<ScheduleKind>(in.integer(0, pf::kKinds));  // auto included: refused
  const int P = in.integer(0, 16), V = in.integer(0, 8), M = in.integer(0, 64);
  const CostModel cost = any_cost_model(in, P);
  const Program p = make_schedule(kind, P, V, M);  // refuses bad shapes
  if (const VerifyResult r = verify(p); !r) pf::finding("a generated schedule does not verify: " + r.what());
  const LoweredProgram lp = lower(p);
  if (const VerifyResult r = verify(lp); !r) pf::finding("a generated schedule's steps do not verify: " + r.what());
  const bool usable = cost_model_error(cost, P).empty();
  Trace t;
  try {
    t = simulate(p, cost);
  } catch (const Error& e) {
    // A usable cost model may still overflow, or mix magnitudes a double cannot
    // hold together; the simulator must say so, not return wrong times.
    const std::string_view what = e.what();
    if (usable && !what.starts_with("simulate: the cost model's times overflow") &&
        !what.starts_with("simulate: the cost model's times span more than a double resolves"))
      pf::finding(std::string("simulate() refused a usable cost model: ") + e.what());
    throw;
  }
  if (!usable) pf::finding("simulate() took a cost model that cost_model_error() refuses");
  check_times(t);
  const ScheduleShape& s = p.shape;
  const double compute = cost.compute[Phase::kForward] + cost.backward_cost();
  const bool closed_form = closed_form_error(s, cost).empty();
  if (uniform_speed(cost) && compute > 0 && closed_form) {
    // The simulator keeps each action's duration to 0.1%, so the bubble to about twice that.
    const double bubble = bubble_ratio(t), closed = closed_form_bubble_ratio(s, cost);
    if (closed - bubble > 2e-3 * (1 + closed))
      pf::finding("bubble " + std::to_string(bubble) + " below the closed form " + std::to_string(closed));
  }
  if (cost.replay == ReplayMode::kSteps) {
    const double steps = makespan(t), dataflow = makespan(simulate(p, cost.with_replay(ReplayMode::kDataflow)));
    if (dataflow > steps && !close(dataflow, steps))
      pf::finding("the dataflow bound " + std::to_string(dataflow) + " exceeds the steps replay " + std::to_string(steps));
    const bool planned_costs =
        cost.backward_cost() == 2 * cost.compute[Phase::kForward] && cost.transfer_time() == 0;
    if (planned_costs && uniform_speed(cost) && closed_form && !close(steps, closed_form_makespan(s, cost)))
      pf::finding("with backward = 2 forward and free P2P the steps take " + std::to_string(steps) +
                  ", not the closed form " + std::to_string(closed_form_makespan(s, cost)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return pf::test_one(data, size, check);
}

// Every kind at a few valid shapes, with the default costs and with a latency.
pf::Seeds fuzz_seeds() {
  pf::Seeds seeds;
  for (int kind = 0; kind < pf::kKinds; ++kind)
    for (int P : {1, 2, 4})
      for (bool latency : {false, true}) {
        pf::Output out;
        out.integer(kind, 0, pf::kKinds);
        out.integer(P, 0, 16);
        out.integer(default_chunks(static_cast<ScheduleKind>(kind)), 0, 8);
        out.integer(2 * P, 0, 64);
        out.flag(false);
        out.integer(4, 0, 40);  // forward 1
        out.flag(true);         // backward 2 forward
        out.flag(latency);
        if (latency) {
          for (int k = 0; k < 3; ++k) {
            out.flag(false);
            out.integer(2, 0, 40);  // latency, bandwidth, bytes: 0.5 each
          }
        }
        out.flag(false);  // speeds all 1
        out.flag(false);  // steps replay
        seeds.push_back(out.bytes());
      }
  return seeds;
}
