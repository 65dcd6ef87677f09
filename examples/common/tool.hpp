// What the command-line tools of examples/ and bench/ share: parsing with CLI11
// over args.hpp's words and argument texts, the one-line usage error (exit status
// 2) on stderr, the --layers-per-stage flag of the tools that split a model into
// stages, medians,
// the measured trace written by its file name, and the report of a benchmark in
// the style of nccl-tests: '#' lines for the configuration, a header row and a
// units row, the rows, and a footer that counts the wrong results ("... 0 OK"),
// or the same rows as JSON.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "args.hpp"
#include "pipeweave/analysis/ascii.hpp"
#include "pipeweave/analysis/chrome_trace.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/analysis/svg.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/memory.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave::tool {

/// Prints "<program>: <message> (see --help)" as one line on stderr and returns
/// 2, the exit status of bad arguments.
inline int usage_error(std::string_view program, std::string message) {
  std::cerr << usage_line(program, std::move(message)) << "\n";
  return 2;
}

/// Parses the command line. Nothing when the program goes on; 0 after --help
/// (printed), 2 after a bad argument (usage_error). With `speak` false nothing is
/// printed (the other ranks of a multi-process run).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, std::string_view program, bool speak = true) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (speak) std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    if (!speak) return 2;
    return usage_error(program, e.what());
  }
  return std::nullopt;
}

/// Adds --layers-per-stage A,B,...: the layers of each virtual stage in
/// virtual-stage order (LayerAllocation::per_stage), into `per_stage`. When
/// `layers_flag` (the tool's --layers, whose value is `layers`) is not given,
/// `layers` becomes the entries' sum, at most `max_layers`; when it is, the two
/// must agree, which layer_split_error() checks with the rest.
inline CLI::Option* add_layers_per_stage_flag(CLI::App& app, std::vector<int>& per_stage, const CLI::Option* layers_flag,
                                              int& layers, int max_layers) {
  return app
      .add_option_function<std::string>(
          "--layers-per-stage",
          [&per_stage, layers_flag, &layers, max_layers](const std::string& text) {
            try {
              per_stage = layers_per_stage(text, layers_flag->count() > 0, layers, max_layers);
            } catch (const BadArgument& e) {
              throw CLI::ValidationError(e.flag, e.message);
            }
          },
          std::string(kLayersPerStageHelp))
      ->type_name("A,B,...");
}
/// The median (analysis/metrics.hpp); 0 for no values.
using ::pipeweave::median;

/// The value at fraction p (0..1) of the sorted values, the nearest rank; 0 for no values.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

/// How many values differ by more than `tolerance` between two parameter sets of
/// the same shape ([stage or layer][value]); a shape mismatch counts every value.
inline long long count_different(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                                 double tolerance = 0) {
  long long wrong = 0;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::size_t na = i < a.size() ? a[i].size() : 0, nb = i < b.size() ? b[i].size() : 0;
    if (na != nb) {
      wrong += static_cast<long long>(std::max(na, nb));
      continue;
    }
    for (std::size_t k = 0; k < na; ++k)
      wrong += !(std::abs(static_cast<double>(a[i][k]) - static_cast<double>(b[i][k])) <= tolerance);
  }
  return wrong;
}

/// True when `path` names a trace format: .svg, .json (Chrome trace), .txt (ASCII timeline) or .csv.
inline bool trace_format_known(const std::string& path) {
  for (const char* ext : {".svg", ".json", ".txt", ".csv"}) {
    const std::string e(ext);
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

/// The trace's events as CSV: one line per compute action, per gradient
/// reduction (kind "collective"), per offload or reload (kind "copy") and
/// per P2P group.
inline std::string trace_csv(const Trace& trace) {
  std::string out = "device,step,kind,action,stage,micro_batch,sends,recvs,start_us,end_us\n";
  char line[256];
  for (std::size_t d = 0; d < trace.compute.size(); ++d) {
    auto actions = [&](const std::vector<TraceEvent>& events, const char* kind) {
      for (const TraceEvent& e : events) {
        std::snprintf(line, sizeof line, "%zu,%d,%s,%s,%d,%d,,,%.3f,%.3f\n", d, e.step, kind, to_string(e.action).c_str(),
                      e.stage, e.action.micro_batch, e.start, e.end);
        out += line;
      }
    };
    actions(trace.compute[d], "compute");
    for (const SideLane& lane : kSideLanes)
      if (const std::vector<TraceEvent>* events = side_events(trace, lane, d)) actions(*events, std::string(lane.name).c_str());
    for (const CommEvent& e : trace.comm[d]) {
      std::snprintf(line, sizeof line, "%zu,%d,p2p,,,,%d,%d,%.3f,%.3f\n", d, e.step, e.sends, e.recvs, e.start, e.end);
      out += line;
    }
  }
  return out;
}

/// Writes `trace` to `path`, drawn by the analysis layer's renderers as the file's
/// ending says (trace_format_known); `title` heads the SVG and the Chrome trace.
/// Throws pipeweave::Error when the file cannot be written.
inline void write_trace(const std::string& path, const Trace& trace, const std::string& title = {}) {
  auto ends = [&](const char* e) { return path.size() > std::string_view(e).size() && path.ends_with(e); };
  std::string text;
  if (ends(".svg")) {
    SvgOptions o;
    o.title = title;
    text = render_svg(trace, o);
  } else if (ends(".json")) {
    text = render_chrome_trace(trace, title);
  } else if (ends(".txt")) {
    text = render_ascii(trace);
  } else {
    text = trace_csv(trace);
  }
  std::ofstream out(path);
  out << text;
  if (!out) throw Error("cannot write the trace to " + path);
}

/// A JSON string literal of `s`.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// The checkpoint flags of the training tools (checkpoint/mlp.hpp).
struct CheckpointFlags {
  std::string save;    ///< --save DIR: where checkpoints go (empty: none)
  std::string resume;  ///< --resume DIR: the checkpoint to start from (empty: none)
  int save_every = 0;  ///< --save-every N: also every N steps (0: after the last only)
  int keep = 0;        ///< --keep K: the newest K kept (0: all)
  /// Whether a checkpoint follows `step` of a run of `last` steps.
  bool saves_after(int step, int last) const {
    return !save.empty() && (step == last || (save_every > 0 && step % save_every == 0));
  }
  /// What is wrong with the flags together (empty: nothing).
  std::string problem() const {
    return (save_every > 0 || keep > 0) && save.empty() ? "--save-every and --keep need --save" : "";
  }
};

/// Adds --save (`save_help` says who writes what), --save-every, --keep and
/// --resume (`resume_help` says who may have written it).
inline void add_checkpoint_flags(CLI::App& app, CheckpointFlags& f, const std::string& save_help,
                                 const std::string& resume_help) {
  app.add_option("--save", f.save, "Save checkpoints into DIR: " + save_help);
  app.add_option("--save-every", f.save_every, "With --save: a checkpoint every N steps too (default: after the last only)")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--keep", f.keep, "With --save: keep the newest N checkpoints (default: all)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--resume", f.resume,
                 "Resume from the checkpoint DIR names (a step directory, or a --save directory's latest; " +
                     resume_help + "); --steps counts from the start of the run, so the same command line continues "
                                   "where it stopped");
}

/// One column of a report.
struct Column {
  std::string name;    ///< header, e.g. "pipe_ms"
  std::string unit;    ///< the units row, e.g. "ms" (empty: none)
  std::string key;     ///< its JSON key
  int width = 8;       ///< characters in the table
  int precision = -1;  ///< digits after the point for a number; -1: an integer or a text
  bool in_table = true;  ///< false: in the JSON rows only
};

/// A value of a report: nothing ("-" in the table, null in JSON), an integer, a number, or a text.
using Cell = std::variant<std::monostate, long long, double, std::string>;

/// The rows of a benchmark, printed as a table or as JSON.
class Report {
 public:
  /// A report with these columns; the first is left-aligned (the row's name).
  explicit Report(std::vector<Column> columns) : columns_(std::move(columns)) {}

  /// Adds a row, one cell per column.
  void add(std::vector<Cell> row) { rows_.push_back(std::move(row)); }
  /// Number of rows.
  std::size_t size() const { return rows_.size(); }

  /// The table: each line of `comments` after "# ", the header and units rows, the
  /// rows, and `footer` (see wrong_footer).
  std::string text(const std::vector<std::string>& comments, const std::string& footer) const {
    std::string out;
    for (const std::string& c : comments) out += c.empty() ? "#\n" : "# " + c + "\n";
    std::string header = "#", units = "#";
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      if (!columns_[i].in_table) continue;
      header += " " + pad(columns_[i].name, i);
      units += " " + pad(columns_[i].unit.empty() ? std::string() : "(" + columns_[i].unit + ")", i);
    }
    out += header + "\n" + units + "\n";
    for (const auto& row : rows_) {
      std::string line = " ";
      for (std::size_t i = 0; i < columns_.size(); ++i)
        if (columns_[i].in_table) line += " " + pad(cell_text(row[i], columns_[i].precision), i);
      out += line + "\n";
    }
    return out + footer + "\n";
  }

  /// {"bench": name, the `fields` (key and JSON value), "rows": [...]}.
  std::string json(std::string_view bench, const std::vector<std::pair<std::string, std::string>>& fields) const {
    std::string out = "{\"bench\": " + json_string(bench);
    for (const auto& [key, value] : fields) out += ", " + json_string(key) + ": " + value;
    out += ", \"rows\": [\n";
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      out += "  {";
      for (std::size_t i = 0; i < columns_.size(); ++i) {
        out += (i ? ", " : "") + json_string(columns_[i].key) + ": ";
        const Cell& c = rows_[r][i];
        if (std::holds_alternative<std::string>(c))
          out += json_string(std::get<std::string>(c));
        else if (std::holds_alternative<std::monostate>(c))
          out += "null";
        else
          out += cell_text(c, columns_[i].precision < 0 ? -1 : std::max(columns_[i].precision, 4));
      }
      out += r + 1 < rows_.size() ? "},\n" : "}\n";
    }
    return out + "]}\n";
  }

 private:
  static std::string cell_text(const Cell& c, int precision) {
    if (std::holds_alternative<std::monostate>(c)) return "-";
    if (const auto* s = std::get_if<std::string>(&c)) return *s;
    if (const auto* i = std::get_if<long long>(&c)) return std::to_string(*i);
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", precision < 0 ? 0 : precision, std::get<double>(c));
    return text;
  }
  std::string pad(const std::string& s, std::size_t column) const {
    const auto width = static_cast<std::size_t>(columns_[column].width);
    if (s.size() >= width) return s;
    const std::string fill(width - s.size(), ' ');
    return column == 0 ? s + fill : fill + s;
  }

  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

/// The columns of a report on schedule shapes: `first` (the row's name), then P, V
/// and M (`width` characters each, M one more), then `more`.
inline std::vector<Column> shape_columns(Column first, int width, const std::vector<Column>& more = {}) {
  std::vector<Column> columns{std::move(first), {"P", "", "devices", width}, {"V", "", "chunks", width},
                              {"M", "", "micro_batches", width + 1}};
  columns.insert(columns.end(), more.begin(), more.end());
  return columns;
}

/// The first columns of a benchmark of schedules: schedule (`width` characters:
/// 22 fits the longest name with "+overlap"), P, V and M.
inline std::vector<Column> schedule_columns(int width = 14) {
  return shape_columns({"schedule", "", "schedule", width}, 3);
}

/// The footer of a report: "# <what>: N OK", or "... N WRONG" when N > 0.
inline std::string wrong_footer(std::string_view what, long long wrong) {
  return "# " + std::string(what) + ": " + std::to_string(wrong) + (wrong == 0 ? " OK" : " WRONG");
}

}  // namespace pipeweave::tool
