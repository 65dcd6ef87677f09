#pragma once
/// \file
/// SVG timeline of a trace, a picture for people: one row per device (labelled
/// with its peak activations, and its peak memory where a W keeps more), a box per
/// action colored by chunk (forward light, backward and its input half I dark,
/// its weight half W in between) with its micro-batch number, idle time
/// hatched, a time axis, a legend, and a title that states the configuration
/// and the bubble ratio. An overlapped pair takes the two halves of its device's
/// row, its forward above its backward. Hovering a box in a browser shows its
/// action, virtual stage and times.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

#include "pipeweave/analysis/summary.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave {

/// Layout and words of render_svg().
struct SvgOptions {
  int width = 1200;        ///< picture width in pixels (at least 400)
  int row_height = 34;     ///< height of a device's row in pixels (at least 16)
  std::string title;       ///< first line; empty: the schedule's shape
  std::string subtitle;    ///< second line; empty: source, makespan, bubble ratio, peak activations and memory
  double time_span = 0;    ///< time the rows' width stands for, at least the makespan (0: the makespan);
                           ///< pictures drawn with one span share a time scale
};

/// Fill colors of a chunk's forward (light), backward and I (dark) and W (in
/// between) boxes; chunks past the eighth reuse the palette.
struct ChunkColors {
  std::string_view forward;
  std::string_view backward;
  std::string_view weight;
  /// The fill of a shade (a phase row's `shade`): 0 light, 1 dark, 2 between.
  constexpr std::string_view of_shade(int shade) const {
    return shade == 0 ? forward : shade == 1 ? backward : weight;
  }
  /// The fill of an action of `phase`.
  constexpr std::string_view of(Phase phase) const { return of_shade(phase_row(phase).shade); }
};

/// The colors of chunk c.
constexpr ChunkColors chunk_colors(int chunk) {
  constexpr ChunkColors palette[] = {
      {"#a6cee3", "#1f5f99", "#6296be"}, {"#fdbf6f", "#c55a00", "#e18c38"}, {"#b2df8a", "#2f7d32", "#70ae5e"},
      {"#cab2d6", "#6a3d9a", "#9a78b8"}, {"#fb9a99", "#b81d24", "#d95b5e"}, {"#99d8c9", "#1b7065", "#5aa497"},
      {"#e0c9a6", "#7f5a2c", "#b09169"}, {"#f7b6d2", "#a8326e", "#d074a0"},
  };
  return palette[(chunk < 0 ? 0 : chunk) % 8];
}

/// What an action of `phase` is, in words: "forward", "backward", "input
/// gradient (I)", "weight gradient (W)".
constexpr std::string_view phase_words(Phase phase) { return phase_row(phase).words; }

namespace detail {

/// Text with XML's special characters escaped.
inline std::string xml_text(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A distance between axis ticks, 1, 2 or 5 times a power of ten, at least `least`.
inline double nice_step(double least) {
  if (!(least > 0) || !std::isfinite(least)) return 1;
  double scale = std::pow(10.0, std::floor(std::log10(least)));
  for (;;) {
    for (const double base : {1.0, 2.0, 5.0})
      if (base * scale >= least) return base * scale;
    scale *= 10;
  }
}

inline std::string px(double v) { return format_decimal(v, 2); }

}  // namespace detail

/// Renders a trace as a standalone SVG document.
inline std::string render_svg(const Trace& t, const SvgOptions& options = {}) {
  using detail::px;
  const std::size_t devices = t.compute.size();
  const double width = std::max(options.width, 400);
  const double row_h = std::max(options.row_height, 16);
  int sides = 0;  // a lane under each device row for each side lane the trace has events on
  for (const SideLane& lane : kSideLanes) sides += has_side_events(t, lane) ? 1 : 0;
  const double lane_h = 10, gap = 8 + lane_h * sides, pad = 20, label_w = 100;
  const double left = pad + label_w, right = width - pad;
  const double finish = makespan(t);
  const double span = std::max(finish, options.time_span > 0 && std::isfinite(options.time_span) ? options.time_span : 0.0);
  const double scale = span > 0 ? (right - left) / span : 1.0;
  const double top = 78;
  const double rows_bottom = top + static_cast<double>(devices) * (row_h + gap) - gap;
  const std::string unit(t.time_unit);
  const std::string font = "font-family=\"Helvetica, Arial, sans-serif\"";

  std::string title = options.title.empty() ? describe_shape(t.shape) : options.title;
  std::string subtitle = options.subtitle;
  if (subtitle.empty()) {
    subtitle = std::string(t.source == TraceSource::kSimulated ? "simulated" : "measured") + " · makespan " +
               format_decimal(finish, 3) + " " + unit + " · bubble ratio " + format_decimal(bubble_ratio(t), 4);
    if (!t.peak_activations.empty()) {
      subtitle += " · peak activations";
      for (std::size_t d = 0; d < t.peak_activations.size(); ++d)
        subtitle += (d ? ", " : " ") + std::to_string(t.peak_activations[d]);
    }
    if (memory_differs(t)) {
      subtitle += " · peak memory";
      for (std::size_t d = 0; d < t.peak_memory.size(); ++d)
        subtitle += (d ? ", " : " ") + format_decimal(t.peak_memory[d], 3);
    }
  }

  // Legend: a swatch per shade for each chunk, light and dark (and the shade
  // between, W's, when the trace has split backwards), named by the phases of
  // each shade ("forward, backward or I, W": a half of a split backward by its
  // letter); then idle; wrapped to the width.
  bool split = false;
  for (const auto& device : t.compute)
    for (const TraceEvent& e : device) split |= phase_row(e.action.phase).shade == 2;
  const int shades = split ? 3 : 2;
  std::string shade_words;
  for (int shade = 0; shade < shades; ++shade) {
    std::string words;
    for (const Phase p : compute_phases()) {
      const PhaseRow& r = phase_row(p);
      if (r.shade != shade || (r.split && !split)) continue;
      words += (words.empty() ? "" : " or ") + (r.split ? std::string(1, r.letter) : std::string(r.words));
    }
    shade_words += (shade > 0 ? ", " : "") + words;
  }
  bool recomputes = false;
  for (const auto& device : t.compute)
    for (const TraceEvent& e : device) recomputes |= is_recompute(e.action.phase);
  if (recomputes) shade_words += "; dashed: recomputed (C)";
  std::string side_words;  // the lanes under each device row, top down
  for (const SideLane& lane : kSideLanes)
    if (has_side_events(t, lane))
      for (const PhaseRow& r : kPhaseRows)
        if (r.lane == lane.lane) side_words += (side_words.empty() ? "" : ", ") + std::string(1, r.letter);
  if (!side_words.empty()) shade_words += "; under a device: " + side_words;
  const int chunks = std::max(t.shape.chunks, 1);
  const double item_w = split ? 290 : 232, legend_top = rows_bottom + 58;
  const int per_line = std::max(1, static_cast<int>((right - left + label_w) / item_w));
  const int items = std::min(chunks, 64) + 2;
  const int legend_lines = (items + per_line - 1) / per_line;
  const double height = legend_top + legend_lines * 24 + pad - 6;

  std::string out;
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) + "\" " + font + ">\n";
  out += "<defs><pattern id=\"idle\" width=\"7\" height=\"7\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"7\" height=\"7\" fill=\"#f3f3f3\"/>"
         "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"7\" stroke=\"#d2d2d2\" stroke-width=\"2.5\"/></pattern></defs>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + px(pad) + "\" y=\"32\" font-size=\"20\" font-weight=\"600\" fill=\"#1a1a1a\">" +
         detail::xml_text(title) + "</text>\n";
  out += "<text x=\"" + px(pad) + "\" y=\"56\" font-size=\"13\" fill=\"#555555\">" + detail::xml_text(subtitle) +
         "</text>\n";

  // Rows: idle background, grid, boxes.
  const double step = detail::nice_step(60 / scale);
  for (std::size_t d = 0; d < devices; ++d) {
    const double y = top + static_cast<double>(d) * (row_h + gap);
    out += "<text x=\"" + px(pad) + "\" y=\"" + px(y + row_h / 2 - (row_h >= 30 ? 2 : -4)) +
           "\" font-size=\"13\" fill=\"#1a1a1a\">device " + std::to_string(d) + "</text>\n";
    if (row_h >= 30 && d < t.peak_activations.size()) {
      const bool memory = d < t.peak_memory.size() && t.peak_memory[d] != t.peak_activations[d];
      out += "<text x=\"" + px(pad) + "\" y=\"" + px(y + row_h / 2 + 12) + "\" font-size=\"10\" fill=\"#777777\">" +
             (memory ? "act. " + std::to_string(t.peak_activations[d]) + " · mem. " + format_decimal(t.peak_memory[d], 3)
                     : "peak act. " + std::to_string(t.peak_activations[d])) +
             "</text>\n";
    }
    out += "<rect x=\"" + px(left) + "\" y=\"" + px(y) + "\" width=\"" + px(right - left) + "\" height=\"" + px(row_h) +
           "\" fill=\"url(#idle)\"/>\n";
  }
  for (int k = 0; k * step <= span + 1e-9 && k < 1000; ++k) {
    const double x = left + k * step * scale;
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(top - 4) + "\" x2=\"" + px(x) + "\" y2=\"" + px(rows_bottom + 4) +
           "\" stroke=\"#e2e2e2\" stroke-width=\"1\"/>\n";
  }
  for (std::size_t d = 0; d < devices; ++d) {
    const double row_y = top + static_cast<double>(d) * (row_h + gap);
    const auto& events = t.compute[d];
    for (std::size_t k = 0; k < events.size(); ++k) {
      const TraceEvent& e = events[k];
      // An overlapped pair: its forward in the row's upper lane, its backward in the lower.
      const int lane = event_lane(events, k);
      const bool paired = lane == 1 || e.action.overlaps_next;
      const double y = row_y + (lane == 1 ? row_h / 2 : 0), box_h = paired ? row_h / 2 : row_h;
      const bool light = phase_row(e.action.phase).shade == 0;  // a light box takes dark numbers
      const ChunkColors colors = chunk_colors(e.action.chunk);
      const double x = left + e.start * scale, w = std::max((e.end - e.start) * scale, 0.5);
      const std::string number = std::to_string(e.action.micro_batch);
      out += "<g><title>device " + std::to_string(d) + ": " + std::string(phase_words(e.action.phase)) + " of chunk " +
             std::to_string(e.action.chunk) + " (stage " + std::to_string(e.stage) + "), micro-batch " + number +
             (paired ? ", overlapped" : "") + ", " + format_decimal(e.start, 4) + "–" + format_decimal(e.end, 4) + " " + detail::xml_text(unit) +
             "</title>";
      // A recomputation (C) is its forward's box, outlined in dashes of the chunk's dark shade.
      const std::string stroke = is_recompute(e.action.phase)
                                     ? "\" stroke=\"" + std::string(colors.of_shade(1)) + "\" stroke-width=\"1.5\" stroke-dasharray=\"3 2\"/>"
                                     : "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
      out += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" + px(box_h) +
             "\" rx=\"" + (w >= 6 ? "2" : "0") + "\" fill=\"" + std::string(colors.of(e.action.phase)) +
             (w >= 6 ? stroke : "\"/>");
      const double font_size = std::min(12.0, box_h * 0.42);
      if (w >= font_size * 0.62 * static_cast<double>(number.size()) + 3) {
        out += "<text x=\"" + px(x + w / 2) + "\" y=\"" + px(y + box_h / 2 + font_size * 0.36) +
               "\" font-size=\"" + px(font_size) + "\" text-anchor=\"middle\" fill=\"" +
               (light ? "#1a1a1a" : "#ffffff") + "\">" + number + "</text>";
      }
      out += "</g>\n";
    }
  }

  int side = 0;  // R, then O and L, each lane under its device's row
  for (const SideLane& lane : kSideLanes) {
    if (!has_side_events(t, lane)) continue;
    for (std::size_t d = 0; d < devices; ++d) {
      const std::vector<TraceEvent>* events = side_events(t, lane, d);
      const double y = top + static_cast<double>(d) * (row_h + gap) + row_h + 1 + side * lane_h;
      for (std::size_t k = 0; events != nullptr && k < events->size(); ++k) {
        const TraceEvent& e = (*events)[k];
        const double x = left + e.start * scale, w = std::max((e.end - e.start) * scale, 0.5);
        const bool per_micro_batch = !is_collective(e.action.phase);
        out += "<g><title>device " + std::to_string(d) + ": " + std::string(phase_words(e.action.phase)) + " of chunk " +
               std::to_string(e.action.chunk) + " (stage " + std::to_string(e.stage) + ")" +
               (per_micro_batch ? ", micro-batch " + std::to_string(e.action.micro_batch) : std::string()) + ", " +
               format_decimal(e.start, 4) + "–" + format_decimal(e.end, 4) + " " + detail::xml_text(unit) +
               "</title><rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" +
               px(lane_h - 2) + "\" fill=\"" + std::string(chunk_colors(e.action.chunk).of(e.action.phase)) + "\"/></g>\n";
      }
    }
    ++side;
  }

  // Time axis.
  const double axis_y = rows_bottom + 10;
  out += "<line x1=\"" + px(left) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(right) + "\" y2=\"" + px(axis_y) +
         "\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  for (int k = 0; k * step <= span + 1e-9 && k < 1000; ++k) {
    const double x = left + k * step * scale;
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x) + "\" y2=\"" + px(axis_y + 5) +
           "\" stroke=\"#444444\" stroke-width=\"1\"/><text x=\"" + px(x) + "\" y=\"" + px(axis_y + 18) +
           "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#444444\">" + format_decimal(k * step, 3) + "</text>\n";
  }
  out += "<text x=\"" + px((left + right) / 2) + "\" y=\"" + px(axis_y + 36) +
         "\" font-size=\"12\" text-anchor=\"middle\" fill=\"#444444\">time (" + detail::xml_text(unit) + ")</text>\n";

  // Legend.
  for (int i = 0; i < items; ++i) {
    const double x = pad + (i % per_line) * item_w, y = legend_top + (i / per_line) * 24;
    if (i + 2 < items) {
      const ChunkColors colors = chunk_colors(i);
      for (int shade = 0; shade < shades; ++shade)
        out += "<rect x=\"" + px(x + 18 * shade) + "\" y=\"" + px(y) +
               "\" width=\"16\" height=\"14\" rx=\"2\" fill=\"" + std::string(colors.of_shade(shade)) + "\"/>";
      out += "<text x=\"" + px(x + (18 * shades + 4)) + "\" y=\"" + px(y + 11) +
             "\" font-size=\"12\" fill=\"#333333\">chunk " + std::to_string(i) + " " + shade_words + "</text>\n";
    } else if (i + 1 == items) {
      out += "<text x=\"" + px(x) + "\" y=\"" + px(y + 11) +
             "\" font-size=\"12\" fill=\"#333333\">numbers in boxes: micro-batch</text>\n";
    } else {
      out += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"34\" height=\"14\" fill=\"url(#idle)\" "
             "stroke=\"#d2d2d2\"/><text x=\"" + px(x + 40) + "\" y=\"" + px(y + 11) +
             "\" font-size=\"12\" fill=\"#333333\">idle</text>\n";
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace pipeweave
