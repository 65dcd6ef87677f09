#pragma once
/// \file
/// Programs and traces in the CSV format of PyTorch's pipelining schedules
/// (torch.distributed.pipelining, `_dump_csv` / `_load_csv`): one row per rank
/// (device), one field per action, in the order the device runs them. An action
/// is `<stage><kind><micro-batch>` with the global stage index first: `0F0` is
/// the forward of stage 0 on micro-batch 0, `5B3` the backward of stage 5 on
/// micro-batch 3, `5I3` and `5W3` its two halves when the backward is split;
/// an overlapped pair is one field, `(0F6;4B0)OVERLAP_F_B` (its forward first);
/// a chunk's gradient all-reduce (R) is `<stage>REDUCE_GRAD`, with no micro-batch.
/// An empty field is an idle slot.
///
/// \code
/// pipeweave::Program p = pipeweave::make_schedule("1f1b", 2, 1, 2);
/// std::string csv = pipeweave::to_pytorch_csv(p);   // "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
/// pipeweave::Program back = pipeweave::parse_pytorch_csv(csv);
/// \endcode
///
/// Import rules:
/// - compute actions are F, B, I and W, and overlapped pairs of a forward and a
///   B or an I, `(<forward>;<backward>)OVERLAP_F_B`; `<stage>REDUCE_GRAD` is
///   that stage's gradient reduction R (PyTorch's `_add_reduce_grad` places it);
/// - stage s is chunk s / P of its device, and the placement (ScheduleShape::
///   placement) is inferred from the rows: loop when every stage s sits in row
///   s % P (PyTorch's looped and interleaved schedules), else v when every
///   stage sits where the v placement puts it (ZB-V); a stage in a row that
///   neither allows is an error;
/// - the shape is inferred (P = rows, V = stages / P rounded up, M = largest
///   micro-batch + 1, kind kCustom, the inferred placement) or given, and then
///   checked;
/// - communication actions (kCommRows: `SEND_F`, `RECV_F`, `SEND_B`, `RECV_B`,
///   the waits for a send, `WAIT_SEND_F`, `WAIT_SEND_B`, and `UNSHARD`,
///   `RESHARD`, `WAIT_REDUCE_GRAD`) are checked for form and left out of the
///   program: pipeweave derives every send and receive from the compute order
///   (lower()); parse_pytorch_comms() (comms.hpp) keeps them, to prove them;
/// - every error is a pipeweave::Error naming the line and column (1-based) of
///   the field; input is capped (bytes, rows, field length, index values), so
///   any input ends in a program or an Error.
/// The program is not verified here; verify() it (simulate() does).

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave {

/// What a communication action of PyTorch's rows does.
enum class CommRole : unsigned char {
  kSend,      ///< posts a send of a tensor to the rank of the neighbouring stage
  kRecv,      ///< posts a receive of a tensor from the rank of the neighbouring stage
  kWaitSend,  ///< waits for an earlier send of the row to complete
  kLocal,     ///< waits for no other rank (FSDP's UNSHARD and RESHARD, WAIT_REDUCE_GRAD)
};

/// One communication action of PyTorch's compute_comms rows.
struct CommRow {
  std::string_view name;   ///< as written after the stage index: "SEND_F"
  CommRole role;
  TensorKind tensor;       ///< what a send, receive or wait moves
  int producer_offset;     ///< the stage that made that tensor, relative to the action's: 0, -1 (RECV_F), +1 (RECV_B)
  bool micro_batch;        ///< written with a micro-batch index
  std::string_view words;  ///< in messages
};

/// PyTorch's communication actions (torch.distributed.pipelining's
/// _ComputationType, but for REDUCE_GRAD, which is a phase: R). A send or wait
/// names its own stage; a receive names the stage that reads it.
inline constexpr CommRow kCommRows[] = {
    {"SEND_F", CommRole::kSend, TensorKind::kActivation, 0, true, "a send of an activation"},
    {"RECV_F", CommRole::kRecv, TensorKind::kActivation, -1, true, "a receive of an activation"},
    {"SEND_B", CommRole::kSend, TensorKind::kGradient, 0, true, "a send of a gradient"},
    {"RECV_B", CommRole::kRecv, TensorKind::kGradient, 1, true, "a receive of a gradient"},
    {"WAIT_SEND_F", CommRole::kWaitSend, TensorKind::kActivation, 0, true, "a wait for the send of an activation"},
    {"WAIT_SEND_B", CommRole::kWaitSend, TensorKind::kGradient, 0, true, "a wait for the send of a gradient"},
    {"WAIT_REDUCE_GRAD", CommRole::kLocal, TensorKind::kGradient, 0, false, "a wait for a gradient reduction"},
    {"UNSHARD", CommRole::kLocal, TensorKind::kActivation, 0, false, "an FSDP unshard"},
    {"RESHARD", CommRole::kLocal, TensorKind::kActivation, 0, false, "an FSDP reshard"},
};

namespace detail {

/// The row of kCommRows called `name`, or -1.
constexpr int comm_row_named(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kCommRows)); ++i)
    if (kCommRows[i].name == name) return i;
  return -1;
}

}  // namespace detail

/// Options of parse_pytorch_csv() and load_pytorch_csv().
struct CsvImportOptions {
  std::optional<ScheduleShape> shape;    ///< the shape the file must fit; none: inferred, kind kCustom
  std::size_t max_bytes = 16u << 20;     ///< longest input accepted
  int max_devices = 4096;                ///< most rows accepted
};

/// PyTorch's action string for device d's action: `<stage><kind><micro-batch>`,
/// kind F, B, I or W; `<stage>REDUCE_GRAD` for a gradient reduction. Throws
/// Error for an action PyTorch's schedules do not have (a recomputation C),
/// rather than write what PyTorch would read as something else or refuse.
inline std::string pytorch_action(const ScheduleShape& s, int device, const Action& a) {
  if (!phase_row(a.phase).in_pytorch)
    throw Error("csv: device " + std::to_string(device) + "'s " + to_string(a) + " is " +
                std::string(phase_row(a.phase).role) +
                ", which PyTorch's schedules and CSV do not have; export the program without it");
  const std::string stage = std::to_string(s.stage_of(device, a.chunk));
  if (is_collective(a.phase)) return stage + std::string(phase_row(a.phase).pytorch);
  return stage + phase_letter(a.phase) + std::to_string(a.micro_batch);
}

/// PyTorch's field for the compute step of device d that starts at its k-th of n
/// actions, `action(k)`: one action, or an overlapped pair `(0F6;4B0)OVERLAP_F_B`.
/// Adds to `k` the actions the step holds.
template <class ActionAt>
std::string pytorch_step(const ScheduleShape& s, int device, std::size_t& k, std::size_t n, ActionAt&& action) {
  const Action a = action(k++);
  if (!a.overlaps_next || k == n) return pytorch_action(s, device, a);
  return "(" + pytorch_action(s, device, a) + ";" + pytorch_action(s, device, action(k++)) + ")OVERLAP_F_B";
}

/// A program in PyTorch's CSV format: row d holds device d's actions.
inline std::string to_pytorch_csv(const Program& p) {
  std::string out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const auto& row = p.devices[d];
    for (std::size_t k = 0; k < row.size();) {
      out += k ? "," : "";
      out += pytorch_step(p.shape, static_cast<int>(d), k, row.size(), [&](std::size_t i) { return row[i]; });
    }
    out += "\n";
  }
  return out;
}

/// A trace in PyTorch's CSV format: row d holds device d's actions in the order they ran.
inline std::string render_pytorch_csv(const Trace& t) {
  std::string out;
  for (std::size_t d = 0; d < t.compute.size(); ++d) {
    const auto& events = t.compute[d];
    for (std::size_t k = 0; k < events.size();) {
      out += k ? "," : "";
      out += pytorch_step(t.shape, static_cast<int>(d), k, events.size(), [&](std::size_t i) { return events[i].action; });
    }
    out += "\n";
  }
  return out;
}

namespace detail {

/// One action read from a CSV, with where it was: a compute action (`comm`
/// -1) or a communication action (its row of kCommRows; `phase` unused).
struct CsvAction {
  Phase phase;
  int stage;
  int micro_batch;
  int line;
  int column;
  bool overlaps_next = false;  ///< the forward of an overlapped pair
  int comm = -1;
};

/// The start of an error message: "csv line 3, column 7 ('1X0'): ".
inline std::string csv_where(int line, int column, std::string_view field) {
  std::string shown;
  for (char c : field.substr(0, 24)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (field.size() > 24) shown += "...";
  std::string s = "csv line " + std::to_string(line) + ", column " + std::to_string(column);
  if (!field.empty()) s += " ('" + shown + "')";
  return s + ": ";
}

/// Reads up to 9 decimal digits at `pos`; -1 when there are none, -2 when there are more.
inline long long csv_number(std::string_view s, std::size_t& pos) {
  long long v = 0;
  std::size_t n = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    if (++n > 9) return -2;
    v = v * 10 + (s[pos] - '0');
    ++pos;
  }
  return n == 0 ? -1 : v;
}

/// Parses one trimmed, non-empty field and appends its action (an overlapped
/// pair: two); throws Error for anything else.
inline void csv_field(std::string_view f, int line, int column, std::vector<CsvAction>& out) {
  constexpr long long kMaxIndex = 1 << 20;
  auto fail = [&](const std::string& what) { throw Error(csv_where(line, column, f) + what); };
  auto allowed = [] {  // words only a failure
    std::string t = "an action is <stage><kind><micro-batch> with kind F, B, I or W (e.g. 0F0, 5B3, 5I3), or "
                    "<stage>REDUCE_GRAD, or a communication action:";
    for (const CommRow& row : kCommRows)
      t += std::string(&row == kCommRows ? " " : ", ") + "<stage>" + std::string(row.name) + (row.micro_batch ? "<micro-batch>" : "");
    return t;
  };
  const std::string_view pair_form =
      "an overlapped pair is (<forward>;<backward>)OVERLAP_F_B, a forward F and then a backward B or I of one device "
      "(e.g. (0F6;4B0)OVERLAP_F_B)";
  if (f.size() > 64) fail("a field longer than 64 characters; " + allowed());
  if (f.front() == '(') {
    const std::size_t semi = f.find(';'), close = f.find(')');
    if (semi == std::string_view::npos || close == std::string_view::npos || semi > close ||
        f.substr(close + 1) != "OVERLAP_F_B")
      fail(std::string(pair_form));
    const std::size_t first = out.size();
    for (const std::string_view half : {f.substr(1, semi - 1), f.substr(semi + 1, close - semi - 1)})
      if (!half.empty()) csv_field(half, line, column, out);
    if (out.size() != first + 2 || out[first].comm >= 0 || out[first + 1].comm >= 0 ||
        out[first].phase != Phase::kForward || !makes_input_gradient(out[first + 1].phase))
      fail(std::string(pair_form));
    out[first].overlaps_next = true;
    return;
  }
  std::size_t pos = 0;
  const long long stage = csv_number(f, pos);
  if (stage == -1) fail("expected a stage index first; " + allowed());
  if (stage == -2 || stage >= kMaxIndex) fail("stage index too large (at most " + std::to_string(kMaxIndex - 1) + ")");
  const std::size_t kind_begin = pos;
  while (pos < f.size() && ((f[pos] >= 'A' && f[pos] <= 'Z') || f[pos] == '_')) ++pos;
  const std::string_view kind = f.substr(kind_begin, pos - kind_begin);
  const long long micro_batch = csv_number(f, pos);
  if (micro_batch == -2 || micro_batch >= kMaxIndex)
    fail("micro-batch index too large (at most " + std::to_string(kMaxIndex - 1) + ")");
  if (pos != f.size()) fail("unexpected '" + std::string(1, f[pos] >= 0x20 && f[pos] < 0x7f ? f[pos] : '?') +
                            "' after the action; " + allowed());
  if (const auto phase = kind.size() == 1 ? phase_of_letter(kind[0]) : std::nullopt;
      phase && !is_collective(*phase) && phase_row(*phase).in_pytorch) {
    if (micro_batch < 0) fail("a compute action needs a micro-batch index; " + allowed());
    out.push_back({*phase, static_cast<int>(stage), static_cast<int>(micro_batch), line, column});
    return;
  }
  for (const PhaseRow& row : kPhaseRows) {
    if (row.lane != ActionLane::kCollective || kind != row.pytorch) continue;
    if (micro_batch >= 0) fail("a " + std::string(row.pytorch) + " has no micro-batch index (e.g. 3REDUCE_GRAD)");
    out.push_back({row.phase, static_cast<int>(stage), 0, line, column});
    return;
  }
  if (const int comm = comm_row_named(kind); comm >= 0) {
    const CommRow& row = kCommRows[comm];
    if (row.micro_batch && micro_batch < 0) fail("a communication action needs a micro-batch index");
    if (!row.micro_batch && micro_batch >= 0)
      fail("a " + std::string(row.name) + " has no micro-batch index (e.g. 3" + std::string(row.name) + ")");
    out.push_back({Phase::kForward, static_cast<int>(stage), row.micro_batch ? static_cast<int>(micro_batch) : 0, line,
                   column, false, comm});
    return;
  }
  if (kind == "OVERLAP_F_B") fail(std::string(pair_form));
  if (kind.empty()) fail("expected an action kind after the stage index; " + allowed());
  fail("unknown action kind '" + std::string(kind) + "'; " + allowed());
}

/// The placement of a file's rows (see the file comment): the given one, loop
/// when every stage sits in its loop row, else v when every stage sits in its v
/// row; throws Error at a stage that the placement cannot have there.
inline Placement csv_placement(const std::vector<std::vector<CsvAction>>& rows, ScheduleShape shape, bool given) {
  auto misplaced = [&](Placement placement) -> const CsvAction* {
    shape.placement = placement;
    for (std::size_t d = 0; d < rows.size(); ++d)
      for (const CsvAction& a : rows[d])
        if (shape.device_of_stage(a.stage) != static_cast<int>(d)) return &a;
    return nullptr;
  };
  const CsvAction* off_loop = given ? nullptr : misplaced(Placement::kLoop);
  if (!given && off_loop == nullptr) return Placement::kLoop;
  const Placement tried = given ? shape.placement : Placement::kV;
  const CsvAction* off = misplaced(tried);
  if (off == nullptr) return tried;
  const int row = off->line - 1;  // one row per line
  auto device_in = [&](Placement placement) {
    shape.placement = placement;
    return shape.device_of_stage(off->stage);
  };
  const int loop_device = device_in(Placement::kLoop), v_device = device_in(Placement::kV);
  const std::string loop_rule = " (stage = chunk * " + std::to_string(shape.devices) + " + device)";
  const std::string stage = "stage " + std::to_string(off->stage), in_row =
      "row " + std::to_string(row + 1) + ", device " + std::to_string(row);
  std::string what = csv_where(off->line, off->column, {});
  if (given) {
    what += stage + " belongs to device " + std::to_string(device_in(tried)) + " (" +
            std::string(placement_name(tried)) + " placement), but it is in " + in_row;
  } else if (loop_device == v_device) {
    what += stage + " belongs to device " + std::to_string(loop_device) + loop_rule + ", but it is in " + in_row;
  } else if (loop_device == row) {
    what += stage + " is in " + in_row + ", but the v placement, which stage " + std::to_string(off_loop->stage) +
            " at line " + std::to_string(off_loop->line) + ", column " + std::to_string(off_loop->column) +
            " needs, puts it on device " + std::to_string(v_device) + ": the rows mix the loop and v placements";
  } else {
    what += stage + " belongs to device " + std::to_string(loop_device) + " in the loop placement" + loop_rule +
            " and to device " + std::to_string(v_device) + " in the v placement, but it is in " + in_row;
  }
  throw Error(what);
}

}  // namespace detail

namespace detail {

/// The fields of a CSV as read, one row per device, and the shape they fit.
struct CsvTable {
  std::vector<std::vector<CsvAction>> rows;
  ScheduleShape shape;
};

/// Reads the rows of PyTorch-format CSV text, communication actions kept, and
/// their shape (from the compute actions); see the file comment for the rules.
inline CsvTable read_pytorch_csv(std::string_view text, const CsvImportOptions& options) {
  if (text.size() > options.max_bytes)
    throw Error("csv: the input has " + std::to_string(text.size()) + " bytes; at most " +
                std::to_string(options.max_bytes) + " are read");
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 byte order mark
  std::vector<std::vector<detail::CsvAction>> rows;
  std::size_t actions = 0;
  int line = 0;
  std::size_t last_nonblank = 0;  // rows up to here are kept; trailing blank lines are not rows
  while (!text.empty()) {
    ++line;
    const std::size_t eol = text.find('\n');
    std::string_view raw = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    if (static_cast<int>(rows.size()) >= options.max_devices) {
      if (raw.find_first_not_of(" \t") == std::string_view::npos) continue;
      throw Error(detail::csv_where(line, 1, {}) + "more than " + std::to_string(options.max_devices) +
                  " rows (devices)");
    }
    rows.emplace_back();
    // Fields: split on commas; a field may be quoted ("..." with "" for a quote).
    std::size_t pos = 0;
    for (bool more = true; more;) {
      const int column = static_cast<int>(pos) + 1;
      std::size_t start = pos;
      while (start < raw.size() && (raw[start] == ' ' || raw[start] == '\t')) ++start;
      std::string quoted;
      std::string_view value;
      std::size_t next = std::string_view::npos;
      if (start < raw.size() && raw[start] == '"') {
        std::size_t i = start + 1;
        for (;;) {
          if (i >= raw.size())
            throw Error(detail::csv_where(line, static_cast<int>(start) + 1, {}) +
                        "a quoted field does not end on its line");
          if (raw[i] == '"' && !(i + 1 < raw.size() && raw[i + 1] == '"')) break;
          quoted += raw[i];
          i += raw[i] == '"' ? 2 : 1;
          if (quoted.size() > 64)
            throw Error(detail::csv_where(line, column, quoted) + "a field longer than 64 characters");
        }
        ++i;  // the closing quote
        while (i < raw.size() && (raw[i] == ' ' || raw[i] == '\t')) ++i;
        if (i < raw.size() && raw[i] != ',')
          throw Error(detail::csv_where(line, static_cast<int>(i) + 1, {}) + "unexpected text after a quoted field");
        next = i < raw.size() ? i : std::string_view::npos;
        value = quoted;
      } else {
        next = raw.find(',', pos);
        value = raw.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos);
      }
      const std::size_t b = value.find_first_not_of(" \t");
      if (b != std::string_view::npos)
        detail::csv_field(value.substr(b, value.find_last_not_of(" \t") - b + 1), line, column, rows.back());
      more = next != std::string_view::npos;
      pos = more ? next + 1 : raw.size();
    }
    actions += static_cast<std::size_t>(
        std::count_if(rows.back().begin(), rows.back().end(), [](const detail::CsvAction& a) { return a.comm < 0; }));
    if (!rows.back().empty() || raw.find_first_not_of(" \t") != std::string_view::npos) last_nonblank = rows.size();
  }
  rows.resize(last_nonblank);
  if (rows.empty()) throw Error("csv: no rows; expected one row of actions per device");

  // The shape: given and checked, or inferred.
  const int devices = static_cast<int>(rows.size());
  int max_stage = -1, max_micro_batch = -1;
  const detail::CsvAction* widest = nullptr;
  for (const auto& row : rows) {
    for (const auto& a : row) {
      if (a.comm >= 0) continue;
      max_stage = std::max(max_stage, a.stage);
      if (a.micro_batch > max_micro_batch) {
        max_micro_batch = a.micro_batch;
        widest = &a;
      }
    }
  }
  if (max_stage < 0) throw Error("csv: no compute actions (F, B, I or W) in " + std::to_string(devices) + " rows");
  ScheduleShape shape{ScheduleKind::kCustom, devices, (max_stage + devices) / devices, max_micro_batch + 1};
  if (options.shape) {
    const ScheduleShape& want = *options.shape;
    if (want.devices != devices)
      throw Error("csv: " + std::to_string(devices) + " rows (devices), but the shape has " +
                  std::to_string(want.devices) + " devices");
    shape = want;
  }
  if (Text e = shape_error(shape); !e.empty()) throw Error("csv: " + e.str());
  for (std::size_t d = 0; d < rows.size(); ++d) {
    for (const auto& a : rows[d]) {
      auto where = [&] { return detail::csv_where(a.line, a.column, {}); };  // words only a failure
      if (a.stage >= shape.stages())
        throw Error(where() + "stage " + std::to_string(a.stage) + " is past the last stage of the shape (" +
                    std::to_string(shape.stages() - 1) + ")");
      if (a.micro_batch >= shape.micro_batches)
        throw Error(where() + "micro-batch " + std::to_string(a.micro_batch) + " is past the last of the shape (" +
                    std::to_string(shape.micro_batches - 1) + ")");
    }
  }
  shape.placement = detail::csv_placement(rows, shape, options.shape.has_value());
  // A complete program has 2 actions per (stage, micro-batch); refuse shapes far
  // larger than the file, which only a typo can make and which would cost memory.
  const long long needed = 2LL * shape.stages() * shape.micro_batches;
  if (needed > 2 * static_cast<long long>(actions) + 64) {
    throw Error((widest ? detail::csv_where(widest->line, widest->column, {}) : std::string("csv: ")) +
                "the file holds " + std::to_string(actions) + " compute actions, but its shape (" +
                std::to_string(shape.stages()) + " stages, " + std::to_string(shape.micro_batches) +
                " micro-batches) needs " + std::to_string(needed) + "; most would be missing");
  }
  return {std::move(rows), shape};
}

/// The program of a table's compute actions.
inline Program csv_program(const CsvTable& table) {
  Program p{table.shape, {}};
  p.devices.resize(table.rows.size());
  for (std::size_t d = 0; d < table.rows.size(); ++d) {
    p.devices[d].reserve(table.rows[d].size());
    for (const auto& a : table.rows[d])
      if (a.comm < 0) p.devices[d].push_back({a.phase, table.shape.chunk_of_stage(a.stage), a.micro_batch, a.overlaps_next});
  }
  return p;
}

/// The text of a CSV file, at most options.max_bytes of it; Error when it cannot be read.
inline std::string read_csv_file(const std::string& path, const CsvImportOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("csv: cannot open '" + path + "' for reading");
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > options.max_bytes)
      throw Error("csv: '" + path + "' is larger than " + std::to_string(options.max_bytes) + " bytes");
  }
  if (in.bad()) throw Error("csv: cannot read '" + path + "'");
  return text;
}

/// `parse` of a CSV file's text, its errors prefixed with the path.
template <class Parse>
auto parse_csv_file(const std::string& path, const CsvImportOptions& options, Parse&& parse) {
  const std::string text = read_csv_file(path, options);
  try {
    return parse(std::string_view(text), options);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace detail

/// Reads a program from PyTorch-format CSV text; see the file comment for the rules.
/// Throws pipeweave::Error naming the line and column of the first problem.
inline Program parse_pytorch_csv(std::string_view text, const CsvImportOptions& options = {}) {
  return detail::csv_program(detail::read_pytorch_csv(text, options));
}

/// Reads a program from a PyTorch-format CSV file. Throws pipeweave::Error when the
/// file cannot be read, is larger than options.max_bytes, or does not parse.
inline Program load_pytorch_csv(const std::string& path, const CsvImportOptions& options = {}) {
  return detail::parse_csv_file(path, options, parse_pytorch_csv);
}

}  // namespace pipeweave
