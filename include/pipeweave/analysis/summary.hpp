#pragma once
/// \file
/// Words and numbers for traces: number formatting shared by the renderers, a
/// one-line description of a schedule, and a plain-text summary of a trace
/// (makespan, bubble ratio, per-device busy time, idle time and peak activations).

#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/kinds.hpp"

namespace pipeweave {

/// Shortest text that reads back as the same double ("57", "0.1875", "1e-07");
/// "0" for NaN and infinities, which no trace should hold.
inline std::string format_number(double v) {
  if (!std::isfinite(v)) return "0";
  if (v == 0) return "0";  // also turns -0 into 0
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("0");
}

/// A double with at most `digits` decimals, trailing zeros dropped ("0.375", "66").
inline std::string format_decimal(double v, int digits) {
  if (!std::isfinite(v)) return "0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, digits);
  if (r.ec != std::errc()) return format_number(v);
  std::string s(buf, r.ptr);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

/// Display name of a schedule kind (its row's title): "GPipe", "1F1B",
/// "Interleaved 1F1B", "Looped BFS", "ZB-H1", "Interleaved ZB", "ZB-V", "DualPipeV", "custom".
constexpr std::string_view display_name(ScheduleKind kind) { return kind_row(kind).title; }

/// "Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches"; a v
/// placement is named after the chunks ("V=2 chunks in a v").
inline std::string describe_shape(const ScheduleShape& s) {
  return std::string(display_name(s.kind)) + ": P=" + std::to_string(s.devices) +
         (s.devices == 1 ? " device, V=" : " devices, V=") + std::to_string(s.chunks) +
         (s.chunks == 1 ? " chunk" : " chunks") + (s.placement == Placement::kV ? " in a v" : "") + ", M=" +
         std::to_string(s.micro_batches) + (s.micro_batches == 1 ? " micro-batch" : " micro-batches");
}

/// Time a device spent in P2P groups (waiting for its peers or transferring).
constexpr double comm_time(const Trace& t, int device) {
  double total = 0;
  for (const CommEvent& e : t.comm.at(static_cast<std::size_t>(device))) total += e.end - e.start;
  return total;
}

/// A plain-text summary: the shape, makespan and bubble ratio, then one line per
/// device with its compute time, idle time (the rest of the makespan), the part
/// of it spent in P2P groups, its peak activations and, when the trace has it,
/// its peak memory (see Trace); and, where it has gradient reductions, their time
/// per device and how much of it is exposed (exposed_reduction()).
inline std::string render_summary(const Trace& t) {
  const double span = makespan(t);
  const std::string unit(t.time_unit);
  std::string out = describe_shape(t.shape) + "\n";
  out += std::string("source: ") + (t.source == TraceSource::kSimulated ? "simulated" : "measured") + "\n";
  out += "makespan: " + format_decimal(span, 6) + " " + unit + "\n";
  out += "bubble ratio: " + format_decimal(bubble_ratio(t), 6) +
         " ((makespan - busiest device's compute) / that compute)\n";
  const bool memory = t.peak_memory.size() == t.compute.size() && memory_differs(t);
  out += std::string("device  compute      idle         in p2p groups  utilization  peak activations") +
         (memory ? "  peak memory" : "") + "\n";
  for (std::size_t d = 0; d < t.compute.size(); ++d) {
    const int dev = static_cast<int>(d);
    const double busy = busy_time(t, dev);
    const double comm = d < t.comm.size() ? comm_time(t, dev) : 0.0;
    auto cell = [](std::string s, std::size_t w) {
      if (s.size() < w) s.append(w - s.size(), ' ');
      return s;
    };
    out += cell(std::to_string(d), 8) + cell(format_decimal(busy, 4), 13) + cell(format_decimal(span - busy, 4), 13) +
           cell(format_decimal(comm, 4), 15) +
           cell(format_decimal(span > 0 ? 100.0 * busy / span : 0.0, 1) + "%", 13) +
           (memory ? cell(std::to_string(t.peak_activations[d]), 18) + format_decimal(t.peak_memory[d], 3)
                   : d < t.peak_activations.size() ? std::to_string(t.peak_activations[d])
                                                   : std::string("-")) +
           "\n";
  }
  bool reductions = false;
  for (const auto& events : t.collective) reductions |= !events.empty();
  if (reductions) {
    out += "gradient reductions (collective lane): time";
    for (std::size_t d = 0; d < t.collective.size(); ++d)
      out += (d ? ", " : " ") + format_decimal(reduction_time(t, static_cast<int>(d)), 4);
    out += "; exposed after the device's last compute";
    for (std::size_t d = 0; d < t.collective.size(); ++d)
      out += (d ? ", " : " ") + format_decimal(exposed_reduction(t, static_cast<int>(d)), 4);
    out += " " + unit + " (at most " + format_decimal(max_exposed_reduction(t), 6) + ")\n";
  }
  if (has_side_events(t, side_lane(ActionLane::kCopy))) {
    out += "offloads and reloads (copy lane): time";
    for (std::size_t d = 0; d < t.copies.size(); ++d) {
      double busy = 0;
      for (const TraceEvent& e : t.copies[d]) busy += e.end - e.start;
      out += (d ? ", " : " ") + format_decimal(busy, 4);
    }
    out += " " + unit + "\n";
  }
  return out;
}

}  // namespace pipeweave
