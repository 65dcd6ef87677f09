// The command-line tools' words and argument texts, with no parser behind them:
// the help texts made from the kind table, comma-separated lists of integers,
// F:B:W stage costs, S:I:G stash sizes and layers per stage read from their text
// (a BadArgument naming the flag when the text is wrong), and the one-line usage
// error. tool.hpp adds CLI11 over it; print_schedule.hpp runs on it alone, so that
// the Python package's command line parses with argparse and runs the same code.
#pragma once

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/memory.hpp"

namespace pipeweave::tool {

/// A flag's text that is not what the flag takes: what() is "<flag>: <message>".
struct BadArgument : std::runtime_error {
  BadArgument(const std::string& flag, const std::string& message)
      : std::runtime_error(flag + ": " + message), flag(flag), message(message) {}
  std::string flag, message;
};

/// "<program>: <message> (see --help)", one line: the usage error of every tool
/// (exit status 2).
inline std::string usage_line(std::string_view program, std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  return std::string(program) + ": " + message + " (see --help)";
}

/// The whole number all of `text` spells (digits, a leading '-' allowed; no
/// sign '+', no space), or nothing. More digits than a long long holds give its
/// least or greatest value, so that a range check names the value too large.
inline std::optional<long long> whole_number(std::string_view text) {
  long long v = 0;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, v);
  if (text.empty() || end != last) return std::nullopt;
  if (ec == std::errc::result_out_of_range) return text.front() == '-' ? LLONG_MIN : LLONG_MAX;
  if (ec != std::errc()) return std::nullopt;
  return v;
}

/// The finite number all of `text` spells (as strtod reads it), or nothing:
/// not for an empty text, trailing characters, infinity, NaN or a value out of
/// double's range.
inline std::optional<double> finite_number(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// A memory size on the command line: a count in the memory model's unit ("8",
/// "2.5"), or bytes with a binary unit ("4096B", "64KiB", "1.5MiB", "2GiB").
struct MemorySize {
  double value = 0;    ///< in the unit, or in bytes
  bool bytes = false;  ///< it had a unit: bytes
};

/// The memory size all of `text` spells (at least 0), or nothing.
inline std::optional<MemorySize> memory_size(const std::string& text) {
  struct Unit {
    std::string_view suffix;
    double bytes;
  };
  static constexpr Unit kUnits[] = {{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}};
  for (const Unit& u : kUnits)
    if (text.size() > u.suffix.size() && text.ends_with(u.suffix)) {
      const std::optional<double> v = finite_number(text.substr(0, text.size() - u.suffix.size()));
      if (!v || *v < 0 || *v * u.bytes > 1e18) return std::nullopt;
      return MemorySize{*v * u.bytes, true};
    }
  const std::optional<double> v = finite_number(text);
  if (!v || *v < 0 || *v > 1e18) return std::nullopt;
  return MemorySize{*v, false};
}

/// The names of the generated schedules, as schedule_name() writes them (the choices
/// of --schedule); with `synthesized`, auto too (the tools that synthesize).
inline std::vector<std::string> schedule_names(bool synthesized = false) {
  std::vector<std::string> names;
  for (const KindRow& r : kKindRows)
    if (r.generated || (synthesized && r.synthesized)) names.emplace_back(r.name);
  return names;
}

/// The tools' default schedule's name.
inline std::string default_schedule() { return std::string(schedule_name(preferred_kind())); }

/// The names of a table's rows that `keep` takes, in the table's order.
template <class Rows, class Name, class Keep>
std::vector<std::string> row_names(const Rows& rows, Name name, Keep keep) {
  std::vector<std::string> out;
  for (const auto& r : rows)
    if (keep(r)) out.emplace_back(name(r));
  return out;
}

/// Every name of a table's rows.
template <class Rows, class Name>
std::vector<std::string> row_names(const Rows& rows, Name name) {
  return row_names(rows, name, [](const auto&) { return true; });
}

/// The dtypes' names in the dtype table's order: every one, or the floating-point ones.
inline std::vector<std::string> dtype_names(bool floating_only = false) {
  return row_names(kDTypeRows, [](const DTypeRow& r) { return r.name; },
                   [&](const DTypeRow& r) { return r.floating || !floating_only; });
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

/// Comma-separated integers, each in [lo, hi]; throws BadArgument naming `option` otherwise.
inline std::vector<int> int_list(const std::string& text, const std::string& option, int lo, int hi) {
  std::vector<int> out;
  for (const std::string& item : split(text)) {
    const std::optional<long long> v = whole_number(item);
    if (!v) throw BadArgument(option, "takes comma-separated integers, e.g. 2,4,8 (got '" + text + "')");
    if (*v < lo || *v > hi)
      throw BadArgument(option, "values must be " + std::to_string(lo) + ".." + std::to_string(hi));
    out.push_back(static_cast<int>(*v));
  }
  if (out.empty()) throw BadArgument(option, "needs at least one value");
  return out;
}

/// The numbers of one entry "a:b:c" of a list; nothing when some part is not a
/// whole finite number or is below `least`.
inline std::optional<std::vector<double>> colon_numbers(const std::string& item, double least) {
  std::vector<double> v;
  std::stringstream ss(item);
  std::string part;
  while (std::getline(ss, part, ':')) {
    const std::optional<double> x = finite_number(part);
    if (!x || !(*x >= least) || !(*x < 1e300)) return std::nullopt;
    v.push_back(*x);
  }
  return v;
}

/// --stage-costs: "F:B:W,F:B:W,...", one triple per virtual stage: its forward,
/// its whole backward B, and W, the weight half of a split backward (I takes
/// the rest, B - W). Each a number > 0, W < B. Throws BadArgument
/// naming `option` and the entry otherwise.
inline std::vector<StageCost> stage_cost_list(const std::string& text, const std::string& option) {
  std::vector<StageCost> out;
  const std::vector<std::string> items = split(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<std::vector<double>> v = colon_numbers(items[i], 0);
    if (!v || v->size() != 3 || !std::all_of(v->begin(), v->end(), [](double x) { return x > 0; }) || !((*v)[2] < (*v)[1]))
      throw BadArgument(option, "entry " + std::to_string(i) + " ('" + items[i] +
                                             "') must be F:B:W, three numbers > 0: the forward, the whole backward B "
                                             "and its weight half W < B (I is B - W)");
    out.push_back(StageCost{(*v)[0], (*v)[1], (*v)[1] - (*v)[2], (*v)[2]});
  }
  if (out.empty()) throw BadArgument(option, "needs one F:B:W per virtual stage");
  return out;
}

/// --stash-sizes: "S:I:G" for every stage, or "S:I:G,S:I:G,..." one per
/// virtual stage, in a unit of one's choosing (bytes, MiB): the stash a
/// stage keeps of a micro-batch from its forward to its backward, its input
/// alone (what a recomputed micro-batch keeps until its C), and the output
/// gradient kept from an I to its W. Each a number >= 0, I <= S. Throws
/// BadArgument naming `option` and the entry otherwise.
inline MemoryModel stash_size_list(const std::string& text, const std::string& option) {
  MemoryModel out;
  const std::vector<std::string> items = split(text);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::optional<std::vector<double>> v = colon_numbers(items[i], 0);
    if (!v || v->size() != 3 || (*v)[1] > (*v)[0])
      throw BadArgument(option, "entry " + std::to_string(i) + " ('" + items[i] +
                                             "') must be S:I:G, three numbers >= 0: the stash, its input I <= S (what a "
                                             "recomputed micro-batch keeps) and the gradient kept from an I to its W");
    out.stages.push_back({.stash = (*v)[0], .input = (*v)[1], .gradient = (*v)[2]});
  }
  if (out.stages.empty()) throw BadArgument(option, "needs S:I:G, or one S:I:G per virtual stage");
  if (out.stages.size() == 1) {
    out.all = out.stages.front();
    out.stages.clear();
  }
  return out;
}

/// The entries of --layers-per-stage's text "a,b,c": one whole number per entry
/// (whether they fit the schedule, layer_split_error() says). Throws
/// BadArgument naming the flag for an empty list, an empty entry and an
/// entry that is not a whole number.
inline std::vector<int> layers_per_stage_list(const std::string& text) {
  const std::string flag = "--layers-per-stage";
  const std::string rule = "give one whole number of layers per virtual stage, e.g. 1,3,3,1";
  if (text.empty()) throw BadArgument(flag, "is empty; " + rule);
  std::vector<int> out;
  std::size_t from = 0;
  for (int entry = 1;; ++entry) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string item = text.substr(from, comma - from);
    const std::string where = "entry " + std::to_string(entry) + " of '" + text + "'";
    if (item.empty()) throw BadArgument(flag, where + " is empty; " + rule);
    const std::optional<long long> v = whole_number(item);
    if (!v) throw BadArgument(flag, where + " is '" + item + "', not a whole number; " + rule);
    if (*v < INT_MIN || *v > INT_MAX) throw BadArgument(flag, where + " is " + item + ", too large; " + rule);
    out.push_back(static_cast<int>(*v));
    if (comma == text.size()) return out;
    from = comma + 1;
  }
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


/// The help of --layers-per-stage.
inline constexpr std::string_view kLayersPerStageHelp =
    "Layers of each virtual stage, one entry per stage (P*V) in virtual-stage order (s = c*P + d), each at least 1, "
    "e.g. 1,3,3,1 for fewer layers in the first and the last stage; sets --layers to their sum, or must sum to it "
    "(default: the even split, --layers / (P*V) each)";

/// --layers-per-stage's entries, and the model's layers when --layers was not
/// given (`layers_given` false): the entries' sum, at most `max_layers`. When it
/// was, the two must agree, which layer_split_error() checks with the rest.
inline std::vector<int> layers_per_stage(const std::string& text, bool layers_given, int& layers, int max_layers) {
  std::vector<int> per_stage = layers_per_stage_list(text);
  if (layers_given) return per_stage;
  long long sum = 0;
  for (int n : per_stage) sum += n;
  if (sum > max_layers)
    throw BadArgument("--layers-per-stage", "the entries sum to " + std::to_string(sum) +
                                                " layers, more than the limit of " + std::to_string(max_layers));
  layers = static_cast<int>(sum);
  return per_stage;
}

}  // namespace pipeweave::tool
