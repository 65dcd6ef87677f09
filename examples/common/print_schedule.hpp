// print_schedule's whole tool, with no parser behind it: its flags (name, help,
// whether it takes a value) as one table, and run(), which takes the flags given
// as texts and prints, lowers, verifies and simulates a schedule, or one read
// from a PyTorch-format CSV file. examples/print_schedule.cpp parses argv with
// CLI11 over the table; the Python package's command line (pipeweave-schedule,
// python -m pipeweave) parses with argparse over the same table and calls the
// same run(), so the two take the same flags, print the same output and refuse
// the same input with the same words.
//
// Exit statuses: 0; 1 when the program fails verification or the output file
// cannot be written; 2 for bad arguments, with one line on `err` saying what is
// wrong and what is allowed. With --output, the file is written whole or not at
// all (a temporary file, then rename).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

// The schedule and analysis layers, and the dtype table (standard library only): this tool needs
// neither the runtime's engine nor its dependencies.
#include "args.hpp"
#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/schedule.hpp"

namespace pipeweave::tool::print_schedule {

namespace detail {

// What one period of a device holds: "10 forwards", "6 forward/backward pairs",
// "10 backwards" (the words of the forward/backward schedules), or "4 F, 4 I, 3 W";
// then its gradient reductions, ", 2 gradient reductions".
inline std::string period_words(const int (&count)[kPhases], Period period) {
  const int f = count[0], b = count[1], r = count[static_cast<int>(Phase::kReduce)];
  const int c = count[static_cast<int>(Phase::kRecompute)];
  const std::string reductions = (c > 0 ? ", " + std::to_string(c) + " recomputations" : std::string()) +
                                 (r > 0 ? ", " + std::to_string(r) + " gradient reductions" : "");
  if (count[2] == 0 && count[3] == 0) {
    if (period == Period::kWarmUp && b == 0) return std::to_string(f) + " forwards" + reductions;
    if (period == Period::kSteady && f == b) return std::to_string(f) + " forward/backward pairs" + reductions;
    if (period == Period::kCoolDown && f == 0) return std::to_string(b) + " backwards" + reductions;
  }
  std::string out;
  for (const Phase ph : compute_phases())
    if (count[static_cast<int>(ph)] > 0)
      out += (out.empty() ? "" : ", ") + std::to_string(count[static_cast<int>(ph)]) + " " + phase_letter(ph);
  return out.empty() ? (r + c > 0 ? reductions.substr(2) : "no actions") : out + reductions;
}

// Shape, layer allocation, the three periods of each device, and the verdict.
inline void print_overview(std::ostream& out, const Program& p, const LayerAllocation& allocation) {
  const ScheduleShape& s = p.shape;
  out << "schedule: " << schedule_name(s.kind) << ", " << s.devices << " devices x " << s.chunks
            << " chunks = " << s.stages() << " virtual stages, " << s.micro_batches << " micro-batches, "
            << allocation.layers << " layers"
            << (allocation.even() ? "" : ", per virtual stage " + per_stage_words(s, allocation)) << "\n\n";
  out << "layers per device (1-based; virtual stage s = "
      << (s.placement == Placement::kV ? "c*P + d for an even chunk c, c*P + P-1-d for an odd one: the v placement"
                                       : "c*P + d")
      << "):\n";
  for (int d = 0; d < s.devices; ++d) {
    out << "  device " << d << ":";
    for (int c = 0; c < s.chunks; ++c) {
      out << (c ? "," : "") << " chunk " << c << " = " << layer_list(chunk_layers(s, allocation, d, c))
          << " (stage " << s.stage_of(d, c) << ")";
    }
    out << "\n";
  }
  const bool custom = !kind_row(s.kind).generated;
  const bool pairs = has_pairs(p);
  out << "\nprograms (warm-up | steady " << (splits_backward(s.kind) ? "F, I, W" : "1F1B") << " | cool-down"
      << (pairs ? "; (F;B) an overlapped pair: a forward and a backward run at once" : "") << "):\n";
  std::vector<std::array<int[kPhases], 3>> counts(static_cast<std::size_t>(s.devices));
  for (int d = 0; d < s.devices; ++d) {
    out << "  device " << d << ":";
    const PeriodCounts periods = custom ? PeriodCounts{} : period_counts(s, d);
    const auto& actions = p.devices[static_cast<std::size_t>(d)];
    Period last = Period::kWarmUp;
    int generated = 0;  // the generator's actions before the k-th: a C or an R, placed later, is not one
    for (std::size_t k = 0; k < actions.size();) {
      const int warm = periods[Period::kWarmUp], steady = periods[Period::kSteady];
      const Period now = generated < warm                ? Period::kWarmUp
                         : generated < warm + steady ? Period::kSteady
                                                     : Period::kCoolDown;
      if (now != last && !custom) out << " |";
      last = now;
      Text token;
      const int n = append_step_token(token, actions.data(), static_cast<int>(k), static_cast<int>(actions.size()));
      for (int i = 0; i < n; ++i) {
        const Phase ph = actions[k + i].phase;
        ++counts[static_cast<std::size_t>(d)][static_cast<std::size_t>(now)][static_cast<int>(ph)];
        generated += is_collective(ph) || acts_on_stash(ph) ? 0 : 1;
      }
      out << " " << token.view();
      k += static_cast<std::size_t>(n);
    }
    out << "\n";
  }
  out << "\nphases:\n";
  if (custom) out << "  (a custom program: no warm-up rule)\n";
  for (int d = 0; d < s.devices && !custom; ++d) {
    const auto& c = counts[static_cast<std::size_t>(d)];
    out << "  device " << d << ": warm-up " << period_words(c[0], Period::kWarmUp) << ", steady "
        << period_words(c[1], Period::kSteady) << ", cool-down " << period_words(c[2], Period::kCoolDown);
    if (pairs) out << "; " << pair_count(p.devices[static_cast<std::size_t>(d)]) << " overlapped pairs";
    out << "\n";
  }
  const LoweredProgram lp = lower(p);
  int sends = 0, steps = 0;
  for (const auto& device : lp.devices) {
    steps += static_cast<int>(device.size());
    for (const Step& st : device)
      for (const P2POp& op : st.ops) sends += op.kind == OpKind::kSend;
  }
  const VerifyResult r = verify(p, lp);  // the program and the lowering just made
  out << "\nverification: " << (r ? "ok" : "FAILED: " + r.what()) << "\n";
  if (r) {
    out << "  every (virtual stage, micro-batch) has one forward and one backward"
        << (splits_backward(s.kind) ? " (an I and a W)" : "") << ";\n"
        << "  every action runs after the actions it needs"
        << (pairs ? "; the halves of each overlapped pair are independent, and the inputs of both are there when it "
                    "starts"
                  : "")
        << ";\n"
        << "  " << sends << " sends in " << steps << " steps, each matched in FIFO order by the receive that expects it;\n"
        << "  the steps run to completion under rendezvous semantics: no deadlock.\n";
  }
}

// Writes `text` to `path` whole or not at all: a temporary file next to it, then
// rename. Returns an empty string, or what went wrong.
inline std::string write_atomically(const std::string& path, const std::string& text, bool& bad_path) {
  std::string tmp = path + ".tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) {
    bad_path = true;
    return "cannot create a file next to '" + path + "': " + std::strerror(errno);
  }
  const mode_t mask = umask(0);
  umask(mask);
  fchmod(fd, 0666 & ~mask);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      unlink(tmp.c_str());
      return "cannot write '" + path + "': " + why;
    }
    done += static_cast<std::size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    return "cannot write '" + path + "': " + why;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    bad_path = true;
    return "cannot write '" + path + "': " + why;
  }
  return {};
}

// "forward 1, backward 2, p2p latency 0", with "(I 1 + W 1)" after the backward where it is split, and
// the overlap efficiency where the program has pairs, the reduction's time where it has reductions, the copy
// bandwidth where it offloads; with costs per stage, "stage costs F:B:W 1:2:1, ...".
inline std::string cost_line(const CostModel& c, bool split, bool pairs, bool reduces, bool copies) {
  std::string costs;
  if (c.stage_costs.empty()) {
    costs = "forward " + format_decimal(c.cost_of(Phase::kForward), 6) + ", backward " +
            format_decimal(c.backward_cost(), 6) +
            (split ? " (I " + format_decimal(c.input_cost(), 6) + " + W " + format_decimal(c.weight_cost(), 6) + ")" : "");
  } else {
    costs = "stage costs F:B:W";
    for (std::size_t st = 0; st < c.stage_costs.size(); ++st) {
      const StageCost& sc = c.stage_costs[st];
      costs += (st ? ", " : " ") + format_decimal(sc.cost_of(Phase::kForward), 6) + ":" +
               format_decimal(sc.cost_of(Phase::kBackward), 6) +
               ":" + format_decimal(sc.cost_of(Phase::kBackwardWeight), 6);
    }
  }
  return costs + ", p2p latency " + format_decimal(c.p2p_latency, 6) +
         (pairs ? ", overlap efficiency " + format_decimal(c.overlap_efficiency, 6) : "") +
         (reduces ? ", gradient reduction " + format_decimal(c.reduce, 6) : "") +
         (copies ? ", copy bandwidth " + (c.copy_bandwidth > 0 ? format_decimal(c.copy_bandwidth, 6) : std::string("unlimited"))
                 : "");
}

// True when the program splits a backward into I and W.
inline bool has_split(const Program& p) {
  for (const auto& device : p.devices)
    for (const Action& a : device)
      if (a.phase == Phase::kBackwardInput || a.phase == Phase::kBackwardWeight) return true;
  return false;
}

inline std::string replay_words(ReplayMode mode) {
  return mode == ReplayMode::kSteps ? "lowered steps under rendezvous" : "dataflow (program order, no lowering)";
}

// Why the program has no closed forms: a custom one, DualPipeV, overlapped
// pairs, recomputations or offloads (the closed forms are of the generated order); empty
// when it has them.
inline std::string no_closed_form(const Program& p, const CostModel& cost) {
  if (!kind_row(p.shape.kind).generated) return "a custom program";
  if (has_pairs(p) && !kind_row(p.shape.kind).pairs)
    return "the closed forms are of the order without overlapped pairs";
  if (has_recompute(p)) return "the closed forms are of the order without recomputation";
  if (offloads(p) > 0) return "the closed forms are of the order without offloads";
  return closed_form_error(p.shape, cost).str();
}

// "1.5 MiB": bytes in the largest binary unit that leaves at least 1 (at most 2 decimals).
inline std::string byte_words(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return format_decimal(bytes, 2) + " " + units[u];
}

// What one kept activation holds: `elements` elements of `dtype` (0 elements: not given).
struct TensorSize {
  long long elements = 0;
  DType dtype = DType::kF32;
  double bytes() const { return static_cast<double>(elements) * static_cast<double>(dtype_bytes(dtype)); }
};

// The trace's peaks in bytes, one kept activation (or gradient kept from an I to its W) being `size`.
inline void print_peak_bytes(std::ostream& out, const Trace& t, const TensorSize& size) {
  auto list = [&](const auto& peaks) {
    std::string s;
    for (std::size_t d = 0; d < peaks.size(); ++d) s += (d ? ", " : "") + byte_words(peaks[d] * size.bytes());
    return s;
  };
  out << "in bytes (a kept tensor: " << with_commas(size.elements) << " elements of " << dtype_name(size.dtype)
      << ", " << byte_words(size.bytes()) << "): peak activations " << list(t.peak_activations);
  if (memory_differs(t)) out << "; peak memory " << list(t.peak_memory);
  out << "\n";
}

// Summary: the trace's own summary (and its peaks in bytes where a tensor's size is given), then the cost
// model, the search (auto), the closed form and the dataflow bound.
inline void print_summary(std::ostream& out, const Program& p, const Trace& t, const CostModel& cost, const Synthesis* found,
                   double memory_limit, const TensorSize& size) {
  out << render_summary(t);
  if (size.elements > 0) print_peak_bytes(out, t, size);
  out << "cost model: " << cost_line(cost, has_split(p), has_pairs(p), has_grad_reduce(p), offloads(p) > 0) << "; replay: " << replay_words(cost.replay) << "\n";
  if (found != nullptr) {
    const double span = found->makespan;
    out << "synthesis: makespan " << format_decimal(span, 6) << ", lower bound " << format_decimal(found->lower_bound, 6)
        << " (makespan / bound " << format_decimal(span / found->lower_bound, 4) << "); peak memory "
        << format_decimal(found->peak_memory, 6) << " (limit "
        << (memory_limit > 0 ? format_decimal(memory_limit, 6) : std::string("none"))
        << "); " << found->evaluated << " programs simulated; from " << found->origin << "\n";
    out << "best built-in within the limit: "
        << (found->best_builtin.name.empty()
                ? std::string("none fits")
                : found->best_builtin.name + ", makespan " + format_decimal(found->best_builtin.makespan, 6) +
                      " (synthesized / built-in " + format_decimal(span / found->best_builtin.makespan, 4) + ")")
        << "\n";
  }
  const bool generated = kind_row(p.shape.kind).generated;
  if (generated && (has_pairs(p) || kind_row(p.shape.kind).pairs || has_recompute(p) || offloads(p) > 0)) {
    out << "closed form (free communication): none (" << no_closed_form(p, cost) << ")\n";
  } else if (generated) {
    out << "closed form (free communication): ";
    if (const Text e = closed_form_error(p.shape, cost); e.empty())
      out << "bubble ratio " << format_decimal(closed_form_bubble_ratio(p.shape, cost), 6) << ", makespan "
          << format_decimal(closed_form_makespan(p.shape, cost), 6);
    else
      out << "none for the makespan (" << e.view() << ")";
    out << ", peak activations";
    for (int d = 0; d < p.shape.devices; ++d) out << (d ? ", " : " ") << closed_form_peak_activations(p.shape, d);
    if (splits_backward(p.shape.kind) && closed_form_memory_error(p.shape).empty() && cost.memory == MemoryModel{}) {
      out << ", peak memory";
      for (int d = 0; d < p.shape.devices; ++d) out << (d ? ", " : " ") << closed_form_peak_memory(p.shape, d);
    }
    out << "\n";
  }
  if (cost.replay == ReplayMode::kSteps) {
    const Trace bound = simulate(p, cost.with_replay(ReplayMode::kDataflow));
    out << "dataflow bound (program order, no lowering): bubble ratio " << format_decimal(bubble_ratio(bound), 6)
        << ", makespan " << format_decimal(makespan(bound), 6) << "\n";
  }
}

}  // namespace detail

/// The tool's name in its messages and its one-paragraph description (--help).
inline constexpr std::string_view kName = "print_schedule";
inline constexpr std::string_view kDescription =
    "Prints a pipeline-parallel schedule: its actions, its lowered steps with sends and receives, an overview with "
    "the layer allocation and the verification result, or a simulated run as a timeline (ascii, chrome, svg), in "
    "PyTorch's CSV format, or as a summary.";

/// One flag: its name (--name), what its value looks like in --help (P, FILE,
/// F:B:W,...), its help, and whether it takes a value (else a switch).
struct Flag {
  std::string name;
  std::string metavar;
  std::string help;
  bool value = true;
};

/// The flags given, each with its text ("" for a switch).
using Given = std::map<std::string, std::string, std::less<>>;

/// The formats of --format, in --help order.
inline const std::vector<std::string>& formats() {
  static const std::vector<std::string> names{"actions", "steps", "overview", "ascii", "chrome",
                                              "svg",     "csv",   "summary",  "cpp"};
  return names;
}

/// Every flag, in --help order.
inline const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = [] {
    const std::vector<std::string> dtypes = dtype_names();
    return std::vector<Flag>{
        {"--schedule", "NAME", schedule_help(true)},
        {"--devices", "P", "Pipeline devices P, 1..4096 (default 4)"},
        {"--chunks", "V", "Model chunks per device V, 1..4096 (" + chunks_help() + ")"},
        {"--micro-batches", "M", "Micro-batches M, 1..65536; " + micro_batches_help() + " (default 8)"},
        {"--format", "FORMAT",
         "actions: one line per device; steps: the lowered program with sends and receives; overview: layer "
         "allocation, phases and verification; ascii, chrome (Chrome trace JSON for Perfetto), svg: the simulated "
         "timeline; csv: PyTorch's pipelining CSV; summary: simulated makespan, bubble ratio and peak activations; "
         "cpp: a C++ header whose struct (--cpp-name) static_assert(pipeweave::verify(...)) proves (default "
         "actions)"},
        {"--cpp-name", "NAME", "For --format cpp: the struct's name, a C++ identifier (default Schedule)"},
        {"--placement", "loop|v",
         "For --schedule auto: where the stages sit, loop (stage s on device s mod P) or v (down the devices and back "
         "up) (default loop)"},
        {"--stage-costs", "F:B:W,...",
         "Costs per virtual stage, F:B:W,F:B:W,... one triple per stage (P*V of them): the forward, the whole backward "
         "B and its weight half W < B (I is B - W); in place of --forward-cost, --backward-cost and --w-cost, for "
         "every schedule"},
        {"--memory-limit", "LIMIT",
         "For --schedule auto: the most a device may keep at once, counted as the summary's peak memory (stashes plus "
         "gradients kept from an I to its W), in activations or in the unit of --stash-sizes; 0: no limit (default "
         "0)"},
        {"--activation-elements", "N",
         "For --format summary: the elements of one kept activation (a micro-batch's rows x features), so that the "
         "peaks are also given in bytes of --dtype (default 0: in activations only)"},
        {"--dtype", "DTYPE", "With --activation-elements: the dtype of a kept activation, " + join_words(dtypes, ", ") +
                        " (default fp32)"},
        {"--layers", "N",
         "Model layers for --format overview, a multiple of P*V, or the sum of --layers-per-stage (default 2*P*V)"},
        {"--layers-per-stage", "A,B,...", std::string(kLayersPerStageHelp)},
        {"--input", "FILE",
         "Read the program from a CSV file in PyTorch's pipelining format instead of generating it; --devices, "
         "--chunks and --micro-batches, when given, must match it"},
        {"--forward-cost", "T", "Simulated time of one chunk's forward, > 0 (default 1)"},
        {"--backward-cost", "T",
         "Simulated time of one chunk's whole backward, > 0 (default 2 * forward); a split backward's I and W "
         "together take as long"},
        {"--p2p-latency", "T", "Simulated time of each send/receive transfer, >= 0 (default 0)"},
        {"--reduce-cost", "T",
         "Simulated time of one chunk's gradient all-reduce, >= 0 (default: the ring model of --reduce-ring, or one "
         "forward)"},
        {"--time-span", "T",
         "For --format svg: the time the timeline's width stands for, at least the makespan (default the makespan); "
         "pictures drawn with one span share a time scale"},
        {"--w-cost", "T",
         "Simulated time of W, the weight half of a split backward, > 0 and less than the backward cost (default "
         "half of it); I takes the rest"},
        {"--replay", "steps|dataflow",
         "steps: the lowered program under rendezvous, as the executors run it; dataflow: each action as soon as its "
         "inputs are there, the bound of the program order (default steps)"},
        {"--overlap", "",
         "Fuse the program's steady phase into overlapped pairs, a forward and an independent backward run at once "
         "(pipeweave::overlap())",
         false},
        {"--overlap-efficiency", "E",
         "How much of an overlapped pair's shorter half is hidden, 0..1: a pair lasts max(F, B) + (1 - e) * min(F, "
         "B) (default 0)"},
        {"--replicas", "D",
         "Data-parallel replicas D of the pipeline, 1..4096: with D > 1 each device gets a gradient reduction R<c> "
         "per chunk after the chunk's last backward (pipeweave::with_grad_reduce()), simulated on its collective "
         "lane beside the compute (default 1)"},
        {"--reduce-ring", "L:B:W",
         "LATENCY:BYTES:BANDWIDTH, a ring all-reduce of a chunk's gradient bytes among the D replicas: latency + "
         "2(D-1)/D x bytes / bandwidth (bandwidth 0: unlimited)"},
        {"--recompute", "STAGES",
         "Virtual stages that recompute every micro-batch, comma-separated, or all: each keeps only its input from "
         "its forward to a recomputation C of it right before its backward (pipeweave::with_recompute()); or, with "
         "--schedule auto, auto: synthesis recomputes the micro-batches that --memory-limit needs"},
        {"--offload", "STAGES",
         "Virtual stages that offload every micro-batch, comma-separated, or all: an offload O moves its stash to "
         "host memory over the device's copy lane after its forward, a reload L brings it back before its backward, "
         "each copy beside one action of the device (pipeweave::with_offload()); a micro-batch with fewer than three "
         "actions between its forward and its backward, or that --recompute recomputes, stays; or, with --schedule "
         "auto, auto: synthesis offloads the stashes that --memory-limit needs, timed at --copy-bandwidth (with "
         "--recompute auto too, it takes the fastest of offloading, recomputing, or both)"},
        {"--copy-bandwidth", "BW",
         "The copy lane's bandwidth between a device and host memory, in stash units (--stash-sizes) per time unit: "
         "a copy lasts the stash over it (default 0: unlimited, copies take no time)"},
        {"--stash-sizes", "S:I:G,...",
         "S:I:G for every stage, or one S:I:G per virtual stage, in a unit of your choosing: the stash a stage keeps "
         "of a micro-batch, its input alone (kept where it recomputes) and the gradient kept from an I to its W; the "
         "summary's peak memory counts in it (default 1:0.125:1, one activation)"},
        {"--output", "FILE", "Write to this file (whole or not at all) instead of standard output"},
        {"--demo", "", "The seed example: 16 layers, 4 devices, 2 chunks, 8 micro-batches, as an overview", false},
    };
  }();
  return table;
}

namespace detail {

/// The flags' texts read as what each flag takes; a BadArgument naming the flag otherwise.
struct Reader {
  const Given& given;

  bool has(std::string_view name) const { return given.find(name) != given.end(); }
  std::string text(std::string_view name, std::string fallback = {}) const {
    const auto it = given.find(name);
    return it == given.end() ? fallback : it->second;
  }
  /// A whole number in [lo, hi].
  long long whole(std::string_view name, long long fallback, long long lo, long long hi) const {
    if (!has(name)) return fallback;
    const std::string t = text(name);
    const std::optional<long long> v = whole_number(t);
    if (!v || *v < lo || *v > hi)
      throw BadArgument(std::string(name), "must be a whole number in " + std::to_string(lo) + ".." +
                                               std::to_string(hi) + " (got '" + t + "')");
    return *v;
  }
  /// A finite number; `rule` says which ("> 0", "in 0..1"), `ok` checks it.
  template <class Ok>
  double number(std::string_view name, double fallback, std::string_view rule, Ok ok) const {
    if (!has(name)) return fallback;
    const std::string t = text(name);
    const std::optional<double> v = finite_number(t);
    if (!v || !ok(*v))
      throw BadArgument(std::string(name), "must be a number " + std::string(rule) + " (got '" + t + "')");
    return *v;
  }
  /// One of `choices`.
  std::string choice(std::string_view name, std::string fallback, const std::vector<std::string>& choices) const {
    if (!has(name)) return fallback;
    const std::string t = text(name);
    if (std::find(choices.begin(), choices.end(), t) == choices.end())
      throw BadArgument(std::string(name), "must be one of " + join_words(choices, ", ", ", ") + " (got '" + t + "')");
    return t;
  }
};

/// run() once the flags are read: prints to `out` or to --output; a
/// BadArgument or a pipeweave::Error for bad input.
inline int run_checked(const Reader& in, std::string_view program, std::ostream& out_stream, std::ostream& err) {
  auto usage = [&](const std::string& message) {
    err << usage_line(program, message) << "\n";
    return 2;
  };
  std::vector<std::string> placements;
  for (const Placement p : {Placement::kLoop, Placement::kV}) placements.emplace_back(placement_name(p));

  std::string schedule = in.choice("--schedule", default_schedule(), schedule_names(true));
  std::string format = in.choice("--format", "actions", formats());
  const std::string input = in.text("--input"), output = in.text("--output");
  const std::string replay = in.choice("--replay", "steps", {"steps", "dataflow"});
  const std::string placement = in.choice("--placement", std::string(placement_name(Placement::kLoop)), placements);
  const std::string stage_costs = in.text("--stage-costs"), cpp_name = in.text("--cpp-name", "Schedule");
  int devices = static_cast<int>(in.whole("--devices", 4, 1, 4096));
  int chunks = static_cast<int>(in.whole("--chunks", 0, 1, 4096));
  int micro_batches = static_cast<int>(in.whole("--micro-batches", 8, 1, 65536));
  int layers = static_cast<int>(in.whole("--layers", 0, 1, 1 << 20));
  const double memory_limit = in.number("--memory-limit", 0, "in 0..1e18", [](double x) { return x >= 0 && x <= 1e18; });
  const long long activation_elements = in.whole("--activation-elements", 0, 0, 1LL << 40);
  const std::string dtype = in.choice("--dtype", std::string(dtype_name(DType::kF32)), dtype_names());
  std::vector<int> layers_per_stage;
  if (in.has("--layers-per-stage"))
    layers_per_stage = tool::layers_per_stage(in.text("--layers-per-stage"), in.has("--layers"), layers, 1 << 20);
  if (!input.empty() && in.has("--schedule")) return usage("--input excludes --schedule: the program is the file's");
  // The simulated times: each a finite number, > 0, or >= 0 where its flag allows 0.
  auto positive = [](double x) { return x > 0; };
  auto non_negative = [](double x) { return x >= 0; };
  const double forward_cost = in.number("--forward-cost", 1, "> 0", positive);
  const double whole_backward = in.number("--backward-cost", 2 * forward_cost, "> 0", positive);
  const double p2p_latency = in.number("--p2p-latency", 0, ">= 0", non_negative);
  const double reduce_cost = in.number("--reduce-cost", -1, ">= 0", non_negative);
  const double time_span = in.number("--time-span", 0, ">= 0", non_negative);
  const double w_cost = in.number("--w-cost", whole_backward / 2,
                                  "> 0 and less than the backward cost, " + format_decimal(whole_backward, 6),
                                  [&](double x) { return x > 0 && x < whole_backward; });
  const double overlap_efficiency = in.number("--overlap-efficiency", 0, "in 0..1",
                                              [](double x) { return x >= 0 && x <= 1; });
  const int replicas = static_cast<int>(in.whole("--replicas", 1, 1, 4096));
  const std::string reduce_ring = in.text("--reduce-ring"), recompute = in.text("--recompute"),
                    offload_stages = in.text("--offload"), stash_sizes = in.text("--stash-sizes");
  const double copy_bandwidth = in.number("--copy-bandwidth", 0, ">= 0", non_negative);
  const bool demo = in.has("--demo"), overlapped = in.has("--overlap");

  if (!stash_sizes.empty() && activation_elements > 0)
    return usage("--stash-sizes gives every stash's size and --activation-elements one activation's: give one");
  if (in.has("--reduce-cost") && !reduce_ring.empty())
    return usage("--reduce-cost and --reduce-ring both set the reduction's time: give one");
  double ring[3] = {0, 0, 0};  // latency, bytes, bandwidth
  if (!reduce_ring.empty()) {
    std::istringstream ring_in(reduce_ring);
    char colon[2] = {0, 0};
    if (!(ring_in >> ring[0] >> colon[0] >> ring[1] >> colon[1] >> ring[2]) || colon[0] != ':' || colon[1] != ':' ||
        !ring_in.eof() ||
        !std::all_of(std::begin(ring), std::end(ring), [](double x) { return std::isfinite(x) && x >= 0; }))
      return usage("--reduce-ring must be LATENCY:BYTES:BANDWIDTH, three numbers >= 0 (got '" + reduce_ring + "')");
  }
  if (demo) {
    if (!input.empty()) return usage("--demo and --input exclude each other");
    schedule = default_schedule();
    format = "overview";
    devices = 4;
    chunks = 2;
    micro_batches = 8;
    layers = 16;
    layers_per_stage.clear();
  }
  if (!stage_costs.empty() && (in.has("--forward-cost") || in.has("--backward-cost") || in.has("--w-cost")))
    return usage("--stage-costs sets every stage's costs: leave out --forward-cost, --backward-cost and --w-cost");
  const std::optional<ScheduleKind> named = parse_schedule(schedule, true);
  const bool synthesized = named && kind_row(*named).synthesized;
  if (!synthesized && in.has("--memory-limit"))
    return usage("--memory-limit is the limit --schedule auto synthesizes under; " + schedule +
                 " has its own order (its peak memory is in --format summary)");
  if (!synthesized && recompute == "auto")
    return usage("--recompute auto lets --schedule auto choose what to recompute; give stages (or all) for " + schedule);
  if (!synthesized && offload_stages == "auto")
    return usage("--offload auto lets --schedule auto choose what to offload; give stages (or all) for " + schedule);
  if (!synthesized && in.has("--placement"))
    return usage("--placement is for --schedule auto; " + schedule + " uses its own placement");
  if (format == "cpp" &&
      (cpp_name.empty() || std::isdigit(static_cast<unsigned char>(cpp_name[0])) ||
       !std::all_of(cpp_name.begin(), cpp_name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; })))
    return usage("--cpp-name must be a C++ identifier: letters, digits and _, not starting with a digit (got '" +
                 cpp_name + "')");
  CostModel cost;
  cost.compute[Phase::kForward] = forward_cost;
  // The whole backward B splits into W (--w-cost, default B / 2) and I = B - W.
  cost.compute[Phase::kBackwardWeight] = w_cost;
  cost.compute[Phase::kBackwardInput] = whole_backward - w_cost;
  cost.p2p_latency = p2p_latency;
  cost.replay = replay == "steps" ? ReplayMode::kSteps : ReplayMode::kDataflow;
  cost.overlap_efficiency = overlap_efficiency;
  cost.copy_bandwidth = copy_bandwidth;
  cost.reduce = in.has("--reduce-cost") ? reduce_cost
                : !reduce_ring.empty()  ? ring_allreduce_time(replicas, ring[1], ring[0], ring[2])
                                        : forward_cost;
  if (!stage_costs.empty()) cost.stage_costs = stage_cost_list(stage_costs, "--stage-costs");
  if (!stash_sizes.empty()) cost.memory = stash_size_list(stash_sizes, "--stash-sizes");

  Program p;
  std::optional<Synthesis> found;
  if (!input.empty()) {
    p = load_pytorch_csv(input);
    const ScheduleShape& s = p.shape;
    for (const auto& [flag, noun, given, has] :
         {std::tuple{"--devices", "devices", devices, s.devices}, std::tuple{"--chunks", "chunks", chunks, s.chunks},
          std::tuple{"--micro-batches", "micro-batches", micro_batches, s.micro_batches}}) {
      if (in.has(flag) && given != has)
        return usage(input + ": the program has " + std::to_string(has) + " " + noun + ", but " + flag + " is " +
                     std::to_string(given));
    }
  } else if (synthesized) {
    if (chunks == 0) chunks = default_chunks(ScheduleKind::kAuto);
    const ScheduleShape shape{ScheduleKind::kAuto, devices, chunks, micro_batches,
                              placement == placement_name(Placement::kV) ? Placement::kV : Placement::kLoop};
    if (!cost.stage_costs.empty() && cost.stage_costs.size() != static_cast<std::size_t>(shape.stages()))
      return usage("--stage-costs has " + std::to_string(cost.stage_costs.size()) +
                   " entries; it needs one per virtual stage, P * V = " + std::to_string(shape.stages()));
    found = synthesize(shape, cost,
                       {.memory = memory_limit, .recompute = recompute == "auto", .offload = offload_stages == "auto",
                        .pairs = overlap_efficiency > 0});
    p = found->program;
  } else {
    const ScheduleKind kind = *parse_schedule(schedule);
    if (chunks == 0) chunks = default_chunks(kind);
    p = make_schedule(kind, devices, chunks, micro_batches);
  }
  if (overlapped && verify(p)) p = overlap(p);  // a program that fails is reported below
  // The stage policies, after overlap() (C goes before a pair), offload after recompute (a recomputed
  // micro-batch stays); each flag's stages comma-separated, or all.
  auto stages_of = [&](const std::string& list, const char* flag) {
    try {
      return list == "all" ? all_stages(p.shape) : int_list(list, flag, 0, p.shape.stages() - 1);
    } catch (const BadArgument& e) {
      throw BadArgument(e.flag, e.message + " (the virtual stages, 0.." + std::to_string(p.shape.stages() - 1) +
                                    ", or all)");
    }
  };
  if (!recompute.empty() && recompute != "auto" && verify(p)) p = with_recompute(p, stages_of(recompute, "--recompute"));
  if (!offload_stages.empty() && offload_stages != "auto" && verify(p))
    p = with_offload(p, stages_of(offload_stages, "--offload"));
  if (in.has("--copy-bandwidth") && offloads(p) == 0 && offload_stages != "auto")
    return usage("--copy-bandwidth times the offloads and reloads: give --offload STAGES (or all) whose micro-batches "
                 "live long enough to offload");
  if (replicas > 1 && verify(p)) p = with_grad_reduce(p);  // after overlap(): R follows a pair's backward
  if ((in.has("--reduce-cost") || !reduce_ring.empty()) && !has_grad_reduce(p))
    return usage("--reduce-cost and --reduce-ring time the gradient reductions of data parallelism: give --replicas "
                 "D > 1 (or a CSV with REDUCE_GRAD actions)");
  if (!cost.stage_costs.empty() && cost.stage_costs.size() != static_cast<std::size_t>(p.shape.stages()))
    return usage("--stage-costs has " + std::to_string(cost.stage_costs.size()) +
                 " entries; it needs one per virtual stage, P * V = " + std::to_string(p.shape.stages()));
  if (!cost.memory.stages.empty() && cost.memory.stages.size() != static_cast<std::size_t>(p.shape.stages()))
    return usage("--stash-sizes has " + std::to_string(cost.memory.stages.size()) +
                 " entries; it needs one, or one per virtual stage, P * V = " + std::to_string(p.shape.stages()));
  const ScheduleShape& s = p.shape;
  if (layers == 0) layers = 2 * s.devices * s.chunks;

  std::ostringstream out;
  const VerifyResult r = verify(p);
  if (!r) {
    err << program << ": verification failed: " << r.what() << "\n";
    return 1;
  }
  if (format == "overview") {
    const LayerAllocation allocation{layers, layers_per_stage};
    check_layer_split(s, allocation);
    print_overview(out, p, allocation);
  } else if (format == "actions") {
    out << format_actions(p);
  } else if (format == "steps") {
    out << "schedule: " << schedule_name(s.kind) << ", P=" << s.devices << " V=" << s.chunks
        << " M=" << s.micro_batches << "; each step runs its group of sends and receives, then its action\n";
    out << format_steps(lower(p));
  } else if (format == "csv") {
    out << to_pytorch_csv(p);
  } else if (format == "cpp") {
    out << format_cpp(p, cpp_name);
  } else {
    const Trace t = simulate(p, cost);
    if (format == "ascii") {
      out << render_ascii(t);
    } else if (format == "chrome") {
      out << render_chrome_trace(t);
    } else if (format == "summary") {
      print_summary(out, p, t, cost, found ? &*found : nullptr, memory_limit,
                    {activation_elements, *parse_dtype(dtype)});
    } else {
      SvgOptions o;
      o.time_span = time_span;
      o.subtitle = "simulated, " + replay_words(cost.replay) + " · " +
                   cost_line(cost, has_split(p), has_pairs(p), has_grad_reduce(p), offloads(p) > 0) + " · makespan " +
                   format_decimal(makespan(t), 4) + " · bubble ratio " + format_decimal(bubble_ratio(t), 4);
      if (no_closed_form(p, cost).empty())
        o.subtitle += " (closed form " + format_decimal(closed_form_bubble_ratio(s, cost), 4) + ")";
      out << render_svg(t, o);
    }
  }
  if (output.empty()) {
    out_stream << out.str();
    return 0;
  }
  bool bad_path = false;
  if (const std::string why = write_atomically(output, out.str(), bad_path); !why.empty()) {
    if (bad_path) return usage(why);
    err << program << ": " << why << "\n";
    return 1;
  }
  return 0;
}

}  // namespace detail

/// Runs the tool on the flags `given` (each a name of flags() with its text; ""
/// for a switch): the schedule or its simulation to `out` (or to --output), a
/// bad argument's one line to `err`. Returns the exit status: 0, 1 (the program
/// fails verification, or --output cannot be written) or 2 (bad arguments).
/// `program` names the tool in its messages.
inline int run(const Given& given, std::string_view program, std::ostream& out, std::ostream& err) {
  for (const auto& entry : given) {
    const std::string& name = entry.first;
    const std::string& text = entry.second;
    const auto& table = flags();
    const auto row = std::find_if(table.begin(), table.end(), [&](const Flag& f) { return f.name == name; });
    if (row == table.end()) {
      err << usage_line(program, name + " is not a flag of " + std::string(kName)) << "\n";
      return 2;
    }
    if (!row->value && !text.empty()) {
      err << usage_line(program, name + " is a switch; it takes no value (got '" + text + "')") << "\n";
      return 2;
    }
  }
  try {
    return detail::run_checked(detail::Reader{given}, program, out, err);
  } catch (const BadArgument& e) {
    err << usage_line(program, e.what()) << "\n";
  } catch (const Error& e) {
    err << usage_line(program, e.what()) << "\n";
  }
  return 2;
}

}  // namespace pipeweave::tool::print_schedule
