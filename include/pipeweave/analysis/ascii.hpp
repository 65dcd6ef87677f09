#pragma once
/// \file
/// ASCII timeline of a trace: one row per device, time running left to right.
///
/// \code
/// std::cout << pipeweave::render_ascii(pipeweave::simulate(pipeweave::make_schedule(
///     "1f1b", 4, 1, 8)));
/// \endcode
///
/// Each action is a box that starts with its label, the token `F<chunk>.<micro-batch>`
/// (or `B...`, `I...`, `W...`), shortened to the micro-batch number where the box
/// is narrow, and is filled with `-` (forward), `=` (backward), `~` (I, the
/// input half of a split backward) or `+` (W, its weight half); `.` is idle
/// time. When a column spans more than one time unit, boxes show only their
/// kind's letter. A device with overlapped pairs has a second row, `device d'`,
/// with the backward half of each pair under its forward; one with actions
/// beside its compute has a row for each of those lanes (kSideLanes): `device
/// d R`, its gradient reductions, and `device d copy`, its offloads (`>`) and
/// reloads (`<`), each box from its copy's start to its end.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <string>

#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave {

/// The character that fills the box of an action of `phase` in render_ascii().
constexpr char ascii_fill(Phase phase) { return phase_row(phase).glyph; }

/// Layout of render_ascii().
struct AsciiOptions {
  int width = 160;              ///< most columns of a line, labels included (at least 40)
  double columns_per_unit = 0;  ///< columns per time unit; 0 picks the most (up to 4) that fit `width`
  bool header = true;           ///< a title line and a legend
};

namespace detail {

/// The legend of the side lanes drawn: "device d R: its gradient reductions ...; ".
inline std::string side_legend(const bool* drawn) {
  std::string out;
  for (std::size_t i = 0; i < std::size(kSideLanes); ++i)
    if (drawn[i]) out += "device d " + std::string(kSideLanes[i].tag) + ": " + std::string(kSideLanes[i].legend) + "; ";
  return out;
}

}  // namespace detail

/// Renders a trace as text; see the file comment for the notation.
inline std::string render_ascii(const Trace& t, const AsciiOptions& options = {}) {
  const std::size_t devices = t.compute.size();
  std::size_t tag = 0;  // the longest tag of a side lane the trace has events on
  for (const SideLane& lane : kSideLanes)
    if (has_side_events(t, lane)) tag = std::max(tag, lane.tag.size() + 1);
  const std::string label_pad = "device " + std::to_string(devices > 0 ? devices - 1 : 0) + std::string(tag + 2, ' ');
  const int label_width = static_cast<int>(label_pad.size());
  const int budget = std::max(options.width, 40) - label_width;
  const double span = makespan(t);
  double per_unit = options.columns_per_unit;
  if (!(per_unit > 0) || !std::isfinite(per_unit)) {
    per_unit = span > 0 ? std::min(4.0, std::floor(budget / span)) : 1.0;
    if (per_unit < 1) per_unit = span > 0 ? budget / span : 1.0;
  }
  const int columns = std::max(1, std::min(static_cast<int>(std::ceil(span * per_unit - 1e-9)), 1 << 16));
  auto column = [&](double time) {
    return std::clamp(static_cast<int>(std::lround(time * per_unit)), 0, columns);
  };
  auto pad = [](std::string s, std::size_t w) {
    if (s.size() < w) s.append(w - s.size(), ' ');
    return s;
  };
  std::string out;
  if (options.header) {
    out += describe_shape(t.shape) + "; " + (t.source == TraceSource::kSimulated ? "simulated" : "measured") +
           ", makespan " + format_decimal(span, 4) + " " + std::string(t.time_unit) + ", bubble ratio " +
           format_decimal(bubble_ratio(t), 4) + "\n";
  }
  // Time axis: a tick every `step` units, at least 10 columns apart.
  double step = 1;
  for (double scale = 1;; scale *= 10) {
    bool found = false;
    for (const double base : {1.0, 2.0, 5.0}) {
      if (base * scale * per_unit >= 10) {
        step = base * scale;
        found = true;
        break;
      }
    }
    if (found || scale > 1e12) break;
  }
  std::string numbers(static_cast<std::size_t>(columns) + 12, ' ');
  std::string ticks(static_cast<std::size_t>(columns) + 1, ' ');
  for (int k = 0; k * step <= span + 1e-9 && k < 100000; ++k) {
    const int c = column(k * step);
    ticks[static_cast<std::size_t>(c)] = '|';
    const std::string n = format_decimal(k * step, 3);
    numbers.replace(static_cast<std::size_t>(c), n.size(), n);
  }
  while (!numbers.empty() && numbers.back() == ' ') numbers.pop_back();
  out += pad(std::string(t.time_unit), static_cast<std::size_t>(label_width)) + numbers + "\n";
  out += std::string(static_cast<std::size_t>(label_width), ' ') + ticks + "\n";
  // Full tokens only when every box has room for its own (and a fill character after
  // it, so that the next label stands apart); otherwise micro-batch numbers throughout.
  bool full_labels = per_unit >= 1;
  for (std::size_t d = 0; d < devices && full_labels; ++d)
    for (const TraceEvent& e : t.compute[d])
      if (column(e.end) - column(e.start) <= static_cast<int>(to_string(e.action).size())) full_labels = false;
  bool pairs = false;
  bool sides[std::size(kSideLanes)] = {};  // the side lanes drawn
  for (std::size_t d = 0; d < devices; ++d) {
    const int compute_lanes = has_second_lane(t.compute[d]) ? 2 : 1;
    pairs |= compute_lanes == 2;
    // Its compute lanes, then each lane beside the compute it has events on.
    const int lanes = compute_lanes + static_cast<int>(std::size(kSideLanes));
    for (int lane = 0; lane < lanes; ++lane) {
      const SideLane* side = lane >= compute_lanes ? &kSideLanes[lane - compute_lanes] : nullptr;
      const std::vector<TraceEvent>* list = side ? side_events(t, *side, d) : &t.compute[d];
      if (side && (list == nullptr || list->empty())) continue;
      if (side) sides[lane - compute_lanes] = true;
      const auto& events = *list;
      std::string row(static_cast<std::size_t>(columns), lane == 0 ? '.' : ' ');
      for (std::size_t k = 0; k < events.size(); ++k) {
        const TraceEvent& e = events[k];
        if (!side && event_lane(events, k) != lane) continue;
        const int from = column(e.start);
        const int to = std::max(column(e.end), from + 1);
        const auto width = static_cast<std::size_t>(std::min(to, columns) - from);
        if (width == 0) continue;
        std::string box(width, ascii_fill(e.action.phase));
        const std::string number = side ? to_string(e.action) : std::to_string(e.action.micro_batch);  // a side lane: whole tokens
        const std::string label = full_labels                            ? to_string(e.action)
                                  : per_unit >= 1 && number.size() <= width ? number
                                                                            : std::string(1, phase_letter(e.action.phase));
        box.replace(0, std::min(label.size(), width), label.substr(0, width));
        row.replace(static_cast<std::size_t>(from), width, box);
      }
      while (!row.empty() && row.back() == ' ') row.pop_back();
      out += pad("device " + std::to_string(d) + (side ? " " + std::string(side->tag) : lane == 1 ? "'" : ""),
                 static_cast<std::size_t>(label_width)) +
             row + "\n";
    }
  }
  if (options.header) {
    bool split = false, recomputes = false;  // the legend names I, W and C only when the trace has them
    for (const auto& device : t.compute)
      for (const TraceEvent& e : device) {
        split |= phase_row(e.action.phase).split;
        recomputes |= is_recompute(e.action.phase);
      }
    out += std::string(full_labels ? (split ? "F<c>.<m> forward, B<c>.<m> backward, I<c>.<m> and W<c>.<m> its input and "
                                              "weight halves, of chunk c, micro-batch m"
                                            : "F<c>.<m> forward, B<c>.<m> backward of chunk c, micro-batch m")
                       : per_unit >= 1 ? "a box starts with its micro-batch"
                                       : (split ? "F forward, B backward, I and W its input and weight halves"
                                                : "F forward, B backward")) +
           "; '-' fills a forward, '=' a backward" + (split ? ", '~' an I, '+' a W" : "") +
           (recomputes ? ", '*' a recomputation C" : "") + "; '.' idle; " +
           (pairs ? "device d' holds the backward half of each of d's overlapped pairs; " : "") +
           detail::side_legend(sides) + format_decimal(1.0 / per_unit, 3) + " " + std::string(t.time_unit) + " per column\n";
  }
  return out;
}

}  // namespace pipeweave
