#pragma once
/// \file
/// Chrome trace JSON (the Trace Event Format), which Perfetto (ui.perfetto.dev) and
/// chrome://tracing load: one process for the run, one track (thread) per device.
///
/// Each action is a complete event named like "F c1 m3" (category "forward",
/// "backward", "backward-input" or "backward-weight") whose args hold its
/// virtual stage, chunk, micro-batch and step; each
/// P2P group that took time is an event "p2p 1 send 1 recv" (category "p2p") on its
/// device's track. Times are written in microseconds: a measured trace's "us", "ms",
/// "ns" or "s" is converted; one unit of any other time unit (a cost model's
/// "units") is written as one microsecond.

#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>

#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/kinds.hpp"

namespace pipeweave {

/// Microseconds per unit of a trace's time unit (1 for anything unknown, "units" included).
constexpr double microseconds_per_unit(std::string_view unit) {
  if (unit == "ns") return 1e-3;
  if (unit == "ms") return 1e3;
  if (unit == "s") return 1e6;
  return 1.0;
}

/// The category of an action's event: "forward", "backward", "backward-input" (I)
/// or "backward-weight" (W).
constexpr std::string_view chrome_category(Phase phase) { return phase_row(phase).category; }

namespace detail {

/// A JSON string literal, quotes included.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace detail

/// Renders a trace as Chrome trace JSON; `name` labels the process (default: the shape).
inline std::string render_chrome_trace(const Trace& t, std::string_view name = {}) {
  const double scale = microseconds_per_unit(t.time_unit);
  const std::string source = t.source == TraceSource::kSimulated ? "simulated" : "measured";
  const std::string process = name.empty() ? describe_shape(t.shape) + " (" + source + ")" : std::string(name);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":" +
                    detail::json_string(schedule_name(t.shape.kind)) +
                    ",\"devices\":" + std::to_string(t.shape.devices) + ",\"chunks\":" + std::to_string(t.shape.chunks) +
                    ",\"micro_batches\":" + std::to_string(t.shape.micro_batches) +
                    ",\"source\":" + detail::json_string(source) + ",\"time_unit\":" + detail::json_string(t.time_unit) +
                    ",\"makespan\":" + format_number(makespan(t)) + ",\"bubble_ratio\":" + format_number(bubble_ratio(t)) +
                    "},\n\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":" +
         detail::json_string(process) + "}}";
  const std::size_t devices = t.compute.size();
  // Device d is track d; the backward halves of its overlapped pairs, track devices + d beside it; its
  // lanes beside the compute (kSideLanes), tracks (2 + i) * devices + d.
  constexpr int kLanes = 2 + static_cast<int>(std::size(kSideLanes));
  auto track = [&](std::size_t d, int lane) { return std::to_string(static_cast<std::size_t>(lane) * devices + d); };
  auto side = [&](std::size_t d, int lane) -> const std::vector<TraceEvent>* {
    const std::vector<TraceEvent>* events = side_events(t, kSideLanes[lane - 2], d);
    return events != nullptr && !events->empty() ? events : nullptr;
  };
  for (std::size_t d = 0; d < devices; ++d) {
    for (int lane = 0; lane < kLanes; ++lane) {
      if ((lane == 1 && !has_second_lane(t.compute[d])) || (lane >= 2 && side(d, lane) == nullptr)) continue;
      const std::string tid = track(d, lane);
      out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid + ",\"args\":{\"name\":\"device " +
             std::to_string(d) +
             (lane == 1   ? std::string(" (overlapped backward)")
              : lane >= 2 ? " (" + std::string(kSideLanes[lane - 2].words) + ")"
                          : std::string()) +
             "\"}}";
      out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid + ",\"args\":{\"sort_index\":" +
             std::to_string(static_cast<std::size_t>(kLanes) * d + static_cast<std::size_t>(lane)) + "}}";
    }
  }
  auto event = [&](const TraceEvent& e, const std::string& tid) {
    out += ",\n{\"name\":\"" + std::string(1, phase_letter(e.action.phase)) + " c" + std::to_string(e.action.chunk) +
           " m" + std::to_string(e.action.micro_batch) + "\",\"cat\":\"" + std::string(chrome_category(e.action.phase)) +
           "\",\"ph\":\"X\",\"pid\":0,\"tid\":" + tid + ",\"ts\":" + format_number(e.start * scale) +
           ",\"dur\":" + format_number((e.end - e.start) * scale) + ",\"args\":{\"stage\":" + std::to_string(e.stage) +
           ",\"chunk\":" + std::to_string(e.action.chunk) + ",\"micro_batch\":" +
           std::to_string(e.action.micro_batch) + ",\"step\":" + std::to_string(e.step) + "}}";
  };
  for (std::size_t d = 0; d < devices; ++d) {
    const std::string tid = std::to_string(d);
    for (std::size_t k = 0; k < t.compute[d].size(); ++k) event(t.compute[d][k], track(d, event_lane(t.compute[d], k)));
    for (int lane = 2; lane < kLanes; ++lane)
      if (const std::vector<TraceEvent>* events = side(d, lane))
        for (const TraceEvent& e : *events) event(e, track(d, lane));
    if (d >= t.comm.size()) continue;
    for (const CommEvent& e : t.comm[d]) {
      if (!(e.end > e.start)) continue;
      out += ",\n{\"name\":\"p2p " + std::to_string(e.sends) + " send " + std::to_string(e.recvs) +
             " recv\",\"cat\":\"p2p\",\"ph\":\"X\",\"pid\":0,\"tid\":" + tid + ",\"ts\":" +
             format_number(e.start * scale) + ",\"dur\":" + format_number((e.end - e.start) * scale) +
             ",\"args\":{\"step\":" + std::to_string(e.step) + ",\"sends\":" + std::to_string(e.sends) +
             ",\"recvs\":" + std::to_string(e.recvs) + "}}";
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace pipeweave
