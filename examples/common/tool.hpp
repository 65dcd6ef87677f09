// What the command-line tools of examples/ and bench/ share: parsing with CLI11
// and the one-line usage error (exit status 2), comma-separated lists, the
// --layers-per-stage flag of the tools that split a model into stages, medians,
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
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::cerr << program << ": " << message << " (see --help)\n";
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

/// The names of the generated schedules, as schedule_name() writes them (for
/// CLI::IsMember); with `synthesized`, auto too (the tools that synthesize).
inline std::vector<std::string> schedule_names(bool synthesized = false) {
  std::vector<std::string> names;
  for (const KindRow& r : kKindRows)
    if (r.generated || (synthesized && r.synthesized)) names.emplace_back(r.name);
  return names;
}

/// The tools' default schedule's name.
inline std::string default_schedule() { return std::string(schedule_name(preferred_kind())); }

/// Every name of a table's rows.
template <class Rows, class Name>
std::vector<std::string> row_names(const Rows& rows, Name name) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.emplace_back(name(r));
  return out;
}

/// "a, b and c": `between` between two words, `last` between the last two.
inline std::string join_words(const std::vector<std::string>& words, std::string_view last = " and ",
                              std::string_view between = ", ") {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i)
    out += std::string(i == 0 ? std::string_view() : i + 1 == words.size() ? last : between) + words[i];
  return out;
}

/// The names of the generated kinds whose row passes `keep`.
template <class Keep>
std::vector<std::string> kind_names(Keep keep) {
  std::vector<std::string> names;
  for (const ScheduleKind k : generated_kinds())
    if (keep(kind_row(k))) names.emplace_back(schedule_name(k));
  return names;
}

/// The help of --schedule: every generated kind's name (and auto, with `synthesized`), and the default.
inline std::string schedule_help(bool synthesized = false) {
  return join_words(schedule_names(synthesized), " or ") + " (default " + default_schedule() + ")" +
         (synthesized ? "; auto: synthesized for the costs and --memory-limit (pipeweave::synthesize())" : "");
}

/// The defaults of --chunks: the kinds that default to 2, else 1, and the kinds that need 2.
inline std::string chunks_help() {
  std::string out = "default 2 for " + join_words(kind_names([](const KindRow& r) { return r.default_chunks == 2; })) +
                    ", else 1";
  const auto two = kind_names([](const KindRow& r) { return r.chunks == 2; });
  if (!two.empty()) out += "; " + join_words(two) + (two.size() == 1 ? " needs 2" : " need 2");
  return out;
}

/// The kinds' rules on M in words, each rule with the kinds it holds for:
/// "a multiple of P for <kind>, at least 2 * P for <kind>".
inline std::string micro_batches_help() {
  std::vector<std::string_view> rules;
  for (const ScheduleKind k : generated_kinds())
    if (const std::string_view rule = kind_row(k).micro_batches_rule;
        !rule.empty() && std::find(rules.begin(), rules.end(), rule) == rules.end())
      rules.push_back(rule);
  std::string out;
  for (const std::string_view rule : rules)
    out += (out.empty() ? "" : ", ") + std::string(rule) + " for " +
           join_words(kind_names([&](const KindRow& r) { return r.micro_batches_rule == rule; }));
  return out;
}

/// The kinds that take any number of chunks, and those that need 2, in words.
inline std::string any_chunks_kinds() { return join_words(kind_names([](const KindRow& r) { return r.chunks == 0; })); }
inline std::string two_chunks_kinds() { return join_words(kind_names([](const KindRow& r) { return r.chunks == 2; })); }

/// The kinds the benches run when none are asked for, in order.
inline std::vector<std::string> bench_default_schedules() {
  return kind_names([](const KindRow& r) { return r.bench_default; });
}

/// The parts of a comma-separated list.
inline std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

/// Comma-separated integers, each in [lo, hi]; throws CLI::ValidationError naming `option` otherwise.
inline std::vector<int> int_list(const std::string& text, const std::string& option, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& item : split(text)) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw CLI::ValidationError(option, "takes comma-separated integers, e.g. 2,4,8 (got '" + text + "')");
    if (v < lo || v > hi)
      throw CLI::ValidationError(option, "values must be " + std::to_string(lo) + ".." + std::to_string(hi));
    out.push_back(v);
  }
  if (out.empty()) throw CLI::ValidationError(option, "needs at least one value");
  return out;
}

/// The numbers of one entry "a:b:c" of a list; nothing when some part is not a
/// whole finite number or is below `least`.
inline std::optional<std::vector<double>> colon_numbers(const std::string& item, double least) {
  std::vector<double> v;
  std::stringstream ss(item);
  std::string part;
  while (std::getline(ss, part, ':')) {
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || !(x >= least) || !(x < 1e300)) return std::nullopt;
    v.push_back(x);
  }
  return v;
}

/// --stage-costs: "F:B:W,F:B:W,...", one triple per virtual stage: its forward,
/// its whole backward B, and W, the weight half of a split backward (I takes
/// the rest, B - W). Each a number > 0, W < B. Throws CLI::ValidationError
/// naming `option` and the entry otherwise.
inline std::vector<StageCost> stage_cost_list(const std::string& text, const std::string& option) {
  std::vector<StageCost> out;
  const std::vector<std::string> items = split(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<std::vector<double>> v = colon_numbers(items[i], 0);
    if (!v || v->size() != 3 || !std::all_of(v->begin(), v->end(), [](double x) { return x > 0; }) || !((*v)[2] < (*v)[1]))
      throw CLI::ValidationError(option, "entry " + std::to_string(i) + " ('" + items[i] +
                                             "') must be F:B:W, three numbers > 0: the forward, the whole backward B "
                                             "and its weight half W < B (I is B - W)");
    out.push_back(StageCost{(*v)[0], (*v)[1], (*v)[1] - (*v)[2], (*v)[2]});
  }
  if (out.empty()) throw CLI::ValidationError(option, "needs one F:B:W per virtual stage");
  return out;
}

/// --stash-sizes: "S:I:G" for every stage, or "S:I:G,S:I:G,..." one per
/// virtual stage, in a unit of one's choosing (bytes, MiB): the stash a
/// stage keeps of a micro-batch from its forward to its backward, its input
/// alone (what a recomputed micro-batch keeps until its C), and the output
/// gradient kept from an I to its W. Each a number >= 0, I <= S. Throws
/// CLI::ValidationError naming `option` and the entry otherwise.
inline MemoryModel stash_size_list(const std::string& text, const std::string& option) {
  MemoryModel out;
  const std::vector<std::string> items = split(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<std::vector<double>> v = colon_numbers(items[i], 0);
    if (!v || v->size() != 3 || (*v)[1] > (*v)[0])
      throw CLI::ValidationError(option, "entry " + std::to_string(i) + " ('" + items[i] +
                                             "') must be S:I:G, three numbers >= 0: the stash, its input I <= S (what a "
                                             "recomputed micro-batch keeps) and the gradient kept from an I to its W");
    out.stages.push_back({.stash = (*v)[0], .input = (*v)[1], .gradient = (*v)[2]});
  }
  if (out.stages.empty()) throw CLI::ValidationError(option, "needs S:I:G, or one S:I:G per virtual stage");
  if (out.stages.size() == 1) {
    out.all = out.stages.front();
    out.stages.clear();
  }
  return out;
}

/// The entries of --layers-per-stage's text "a,b,c": one whole number per entry
/// (whether they fit the schedule, layer_split_error() says). Throws
/// CLI::ValidationError naming the flag for an empty list, an empty entry and an
/// entry that is not a whole number.
inline std::vector<int> layers_per_stage_list(const std::string& text) {
  const std::string flag = "--layers-per-stage";
  const std::string rule = "give one whole number of layers per virtual stage, e.g. 1,3,3,1";
  if (text.empty()) throw CLI::ValidationError(flag, "is empty; " + rule);
  std::vector<int> out;
  std::size_t from = 0;
  for (int entry = 1;; ++entry) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string item = text.substr(from, comma - from);
    const std::string where = "entry " + std::to_string(entry) + " of '" + text + "'";
    if (item.empty()) throw CLI::ValidationError(flag, where + " is empty; " + rule);
    int v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec == std::errc::result_out_of_range)
      throw CLI::ValidationError(flag, where + " is " + item + ", too large; " + rule);
    if (ec != std::errc() || end != item.data() + item.size())
      throw CLI::ValidationError(flag, where + " is '" + item + "', not a whole number; " + rule);
    out.push_back(v);
    if (comma == text.size()) return out;
    from = comma + 1;
  }
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
            per_stage = layers_per_stage_list(text);
            if (layers_flag->count() > 0) return;
            long long sum = 0;
            for (int n : per_stage) sum += n;
            if (sum > max_layers)
              throw CLI::ValidationError("--layers-per-stage", "the entries sum to " + std::to_string(sum) +
                                                                   " layers, more than the limit of " +
                                                                   std::to_string(max_layers));
            layers = static_cast<int>(sum);
          },
          "Layers of each virtual stage, one entry per stage (P*V) in virtual-stage order (s = c*P + d), each at "
          "least 1, e.g. 1,3,3,1 for fewer layers in the first and the last stage; sets --layers to their sum, or "
          "must sum to it (default: the even split, --layers / (P*V) each)")
      ->type_name("A,B,...");
}

/// The layers of each virtual stage in words: "1,3,3,1 (--layers-per-stage)",
/// or "2 each (the even split)".
inline std::string per_stage_words(const ScheduleShape& s, const LayerAllocation& a) {
  if (a.even()) return std::to_string(stage_layers(s, a, 0).size()) + " each (the even split)";
  std::string out;
  for (int n : a.per_stage) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out + " (--layers-per-stage)";
}

/// A chunk's layers in words, numbered from 1: "layer 3" or "layers 2-4".
inline std::string layer_list(const LayerRange& r) {
  return r.size() == 1 ? "layer " + std::to_string(r.begin + 1)
                       : "layers " + std::to_string(r.begin + 1) + "-" + std::to_string(r.end);
}

/// 1234567 as "1,234,567".
inline std::string with_commas(long long v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
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
