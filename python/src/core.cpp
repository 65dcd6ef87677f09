// pipeweave._core: the schedule and analysis layers (standard library only) for Python.
//
// Every function here is the library's own: this file converts arguments and
// results, and names the Python-side arguments; it decides nothing a C++ user
// of the same function would not see decided. Errors are pipeweave::Error,
// raised in Python as pipeweave.Error with the library's text.
#include <nanobind/nanobind.h>
#include <nanobind/operators.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <filesystem>
#include <map>
#include <sstream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/print_schedule.hpp"
#include "pipeweave/schedule.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace pw = pipeweave;

namespace {

using Triple = std::tuple<double, double, double>;

// The value a keyword names among `choices` (name, value), in their order; otherwise Error "<what> must be 'a' or 'b'"
// (two choices) or "one of 'a', 'b', 'c'" (more), "(got '<name>')". The one refusal of a keyword's name.
template <class T>
T named(const std::string& what, const std::string& name, const std::vector<std::pair<std::string_view, T>>& choices) {
  std::string words;
  std::size_t k = 0;
  for (const auto& [choice, value] : choices) {
    if (choice == name) return value;
    words += (k == 0 ? "" : choices.size() == 2 ? " or " : ", ") + ("'" + std::string(choice) + "'");
    ++k;
  }
  throw pw::Error(what + " must be " + (choices.size() == 2 ? "" : "one of ") + words + " (got '" + name + "')");
}

pw::Placement placement_named(const std::string& name) {
  return named<pw::Placement>("placement", name,
                              {{pw::placement_name(pw::Placement::kLoop), pw::Placement::kLoop},
                               {pw::placement_name(pw::Placement::kV), pw::Placement::kV}});
}

pw::ReplayMode replay_named(const std::string& name) {
  return named<pw::ReplayMode>("replay", name,
                               {{pw::replay_name(pw::ReplayMode::kSteps), pw::ReplayMode::kSteps},
                                {pw::replay_name(pw::ReplayMode::kDataflow), pw::ReplayMode::kDataflow}});
}

// The shape of a schedule of `kind`, its chunks the kind's default where none are given.
pw::ScheduleShape shape_of(pw::ScheduleKind kind, int devices, std::optional<int> chunks, int micro_batches,
                           std::optional<std::string> placement) {
  return {kind, devices, chunks ? *chunks : pw::default_chunks(kind), micro_batches,
          placement ? placement_named(*placement) : pw::placement_of(kind)};
}

// A device's actions in PyTorch's spelling, one string per step (an overlapped pair is one).
std::vector<std::vector<std::string>> pytorch_actions(const pw::Program& p) {
  std::vector<std::vector<std::string>> out(p.devices.size());
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const auto& row = p.devices[d];
    for (std::size_t k = 0; k < row.size();)
      out[d].push_back(pw::pytorch_step(p.shape, static_cast<int>(d), k, row.size(), [&](std::size_t i) { return row[i]; }));
  }
  return out;
}

std::vector<pw::StageCost> stage_costs(const std::vector<Triple>& stages) {
  std::vector<pw::StageCost> out;
  for (const auto& [f, i, w] : stages) {
    pw::StageCost c = pw::StageCost::following();
    c[pw::Phase::kForward] = f;
    c[pw::Phase::kBackwardInput] = i;
    c[pw::Phase::kBackwardWeight] = w;
    out.push_back(c);
  }
  return out;
}

pw::MemoryModel memory_model(const std::vector<Triple>& sizes) {
  pw::MemoryModel m;
  for (const auto& [stash, input, gradient] : sizes) m.stages.push_back({.stash = stash, .input = input, .gradient = gradient});
  if (m.stages.size() == 1) {
    m.all = m.stages.front();
    m.stages.clear();
  }
  return m;
}

pw::CostModel make_costs(double forward, std::optional<double> backward, std::optional<double> input,
                         std::optional<double> weight, std::optional<std::vector<Triple>> stages, double p2p_latency,
                         double p2p_bandwidth, double activation_bytes, std::optional<std::vector<double>> device_speed,
                         double overlap_efficiency, double reduce, double copy_bandwidth,
                         std::optional<std::vector<Triple>> stash_sizes, const std::string& replay) {
  pw::CostModel c;
  c.compute[pw::Phase::kForward] = forward;
  c.compute[pw::Phase::kBackward] = backward.value_or(-1);
  c.compute[pw::Phase::kBackwardInput] = input.value_or(-1);
  c.compute[pw::Phase::kBackwardWeight] = weight.value_or(-1);
  if (stages) {
    if (stages->empty()) throw pw::Error("costs: stages needs one (forward, input, weight) per virtual stage");
    c.stage_costs = stage_costs(*stages);
  }
  c.p2p_latency = p2p_latency;
  c.p2p_bandwidth = p2p_bandwidth;
  c.activation_bytes = activation_bytes;
  if (device_speed) c.device_speed = *device_speed;
  c.overlap_efficiency = overlap_efficiency;
  c.reduce = reduce;
  c.copy_bandwidth = copy_bandwidth;
  if (stash_sizes) {
    if (stash_sizes->empty())
      throw pw::Error("costs: stash_sizes needs one (stash, input, gradient), or one per virtual stage");
    c.memory = memory_model(*stash_sizes);
  }
  c.replay = replay_named(replay);
  // What the model alone can be checked for; the stage counts are checked against a program's shape where one is used.
  if (const pw::Text e = pw::cost_model_error(c, c.device_speed.empty() ? 1 : static_cast<int>(c.device_speed.size()));
      !e.empty())
    throw pw::Error(e.str());
  if (const pw::Text e = pw::memory_model_error(c.memory, -1); !e.empty()) throw pw::Error(e.str());
  return c;
}

std::vector<int> stage_list(const pw::Program& p, const nb::object& stages, const char* who) {
  if (nb::isinstance<nb::str>(stages)) {
    if (nb::cast<std::string>(stages) == "all") return pw::all_stages(p.shape);
    throw pw::Error(std::string(who) + ": stages must be a list of virtual stages or 'all' (got '" +
                    nb::cast<std::string>(stages) + "')");
  }
  return nb::cast<std::vector<int>>(stages);
}

std::string program_repr(const pw::Program& p) { return "<pipeweave.Program " + pw::describe_shape(p.shape) + ">"; }

pw::CommOrder comm_order_named(const std::string& name) {
  std::vector<std::pair<std::string_view, pw::CommOrder>> choices;
  for (const pw::CommOrderRow& row : pw::kCommOrderRows) choices.emplace_back(row.name, row.order);
  return named("semantics", name, choices);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "pipeweave's schedule and analysis layers: generate, prove, lower, simulate and synthesize "
            "pipeline-parallel schedules, and read and write PyTorch's pipelining CSV.";

  nb::exception<pw::Error>(m, "Error");

  nb::class_<pw::Program>(m, "Program",
                          "Every device's ordered compute actions and the shape they were made for.\n\n"
                          ">>> p = pipeweave.schedule('1f1b', 2, 1, 2)\n"
                          ">>> p.actions\n"
                          "[['0F0', '0F1', '0B0', '0B1'], ['1F0', '1B0', '1F1', '1B1']]")
      .def_prop_ro("kind", [](const pw::Program& p) { return std::string(pw::schedule_name(p.shape.kind)); },
                   "The generator's name ('1f1b', 'interleaved', ...), 'auto' when synthesized, 'custom' when "
                   "hand-written or read from a CSV.")
      .def_prop_ro("devices", [](const pw::Program& p) { return p.shape.devices; }, "Pipeline devices P.")
      .def_prop_ro("chunks", [](const pw::Program& p) { return p.shape.chunks; }, "Model chunks per device V.")
      .def_prop_ro("micro_batches", [](const pw::Program& p) { return p.shape.micro_batches; }, "Micro-batches M.")
      .def_prop_ro("stages", [](const pw::Program& p) { return p.shape.stages(); }, "Virtual stages P * V.")
      .def_prop_ro("placement", [](const pw::Program& p) { return std::string(pw::placement_name(p.shape.placement)); },
                   "Where the stages sit: 'loop' (stage s on device s mod P) or 'v' (down the devices and back up).")
      .def_prop_ro("actions", &pytorch_actions,
                   "Each device's actions as PyTorch's action strings ('0F3', '5I2', '(0F6;4B0)OVERLAP_F_B', "
                   "'3REDUCE_GRAD'), one per step; raises Error for an action PyTorch has not (a recomputation, an "
                   "offload): str(program) spells every action.")
      .def(
          "device_of_stage",
          [](const pw::Program& p, int stage) {
            if (stage < 0 || stage >= p.shape.stages())
              throw pw::Error("device_of_stage: stage " + std::to_string(stage) + " is not a virtual stage of the program (0 to " +
                              std::to_string(p.shape.stages() - 1) + ")");
            return p.shape.device_of_stage(stage);
          },
          "stage"_a, "The device (rank) that holds virtual stage `stage` under the program's placement.")
      .def("__str__", &pw::format_actions)
      .def("__repr__", &program_repr)
      .def(nb::self == nb::self);
  // Equal programs compare equal; a program is a value that can change no more than a list: unhashable, as a list.
  m.attr("Program").attr("__hash__") = nb::none();

  nb::class_<pw::VerifyResult>(m, "Verification",
                               "The proof's outcome: true when the program cannot deadlock, runs every action once "
                               "after what it reads, and keeps what its memory rules say; otherwise the first "
                               "violation, where it is.")
      .def_ro("ok", &pw::VerifyResult::ok)
      .def_ro("device", &pw::VerifyResult::device, "The device of the violation, -1 when it belongs to none.")
      .def_ro("step", &pw::VerifyResult::step, "The step of the violation, -1 when it belongs to none.")
      .def_prop_ro("message", &pw::VerifyResult::what, "'ok', or what is wrong.")
      .def("__bool__", [](const pw::VerifyResult& r) { return r.ok; })
      .def("__str__", &pw::VerifyResult::what)
      .def("__repr__", [](const pw::VerifyResult& r) { return "<pipeweave.Verification " + r.what() + ">"; });

  nb::class_<pw::LoweredProgram>(m, "Lowered",
                                 "A lowered program: each device's steps, a group of sends and receives and then "
                                 "at most one compute action, in the order the runtime issues them.")
      .def_prop_ro("steps",
                   [](const pw::LoweredProgram& lp) {
                     std::vector<std::vector<std::string>> out(lp.devices.size());
                     for (std::size_t d = 0; d < lp.devices.size(); ++d)
                       for (std::size_t t = 0; t < lp.devices[d].size(); ++t) out[d].push_back(pw::to_string(lp.devices[d][t]));
                     return out;
                   },
                   "Each device's steps as text: '[recv act s0 m1 <- d0] F1.1'.")
      .def("__str__", &pw::format_steps);

  nb::class_<pw::CostModel>(m, "Costs",
                            "What each action and each transfer costs in the simulator, and how it replays.\n\n"
                            ">>> pipeweave.Costs(forward=1, input=1, weight=0.5, p2p_latency=0.1)\n"
                            "<pipeweave.Costs F 1, I 1, W 0.5, B 1.5>")
      .def(
          "__init__",
          [](pw::CostModel* self, double forward, std::optional<double> backward, std::optional<double> input,
             std::optional<double> weight, std::optional<std::vector<Triple>> stages, double p2p_latency,
             double p2p_bandwidth, double activation_bytes, std::optional<std::vector<double>> device_speed,
             double overlap_efficiency, double reduce, double copy_bandwidth,
             std::optional<std::vector<Triple>> stash_sizes, const std::string& replay) {
            new (self) pw::CostModel(make_costs(forward, backward, input, weight, std::move(stages), p2p_latency,
                                                p2p_bandwidth, activation_bytes, std::move(device_speed),
                                                overlap_efficiency, reduce, copy_bandwidth, std::move(stash_sizes),
                                                replay));
          },
          nb::kw_only(), "forward"_a = 1.0, "backward"_a = nb::none(), "input"_a = nb::none(), "weight"_a = nb::none(),
          "stages"_a = nb::none(), "p2p_latency"_a = 0.0, "p2p_bandwidth"_a = 0.0, "activation_bytes"_a = 0.0,
          "device_speed"_a = nb::none(), "overlap_efficiency"_a = 0.0, "reduce"_a = 0.0, "copy_bandwidth"_a = 0.0,
          "stash_sizes"_a = nb::none(), "replay"_a = "steps",
          "forward: a chunk's forward F; input, weight: the halves I and W of a split backward (default: F each); "
          "backward: a whole backward B (default I + W); stages: one (F, I, W) per virtual stage in place of those; "
          "p2p_latency, p2p_bandwidth (0: unlimited), activation_bytes: each transfer; device_speed: one factor per "
          "device that divides its compute times; overlap_efficiency: how much of an overlapped pair's shorter half "
          "is hidden, 0..1; reduce: a chunk's gradient all-reduce R; copy_bandwidth: the copy lane's, in stash units "
          "per time unit (0: unlimited); stash_sizes: (stash, input, gradient) for every stage, or one per virtual "
          "stage (default (1, 0.125, 1): one activation); replay: 'steps' (the lowered steps under rendezvous) or "
          "'dataflow' (the bound of the program order).")
      .def_prop_ro("forward", [](const pw::CostModel& c) { return c.cost_of(pw::Phase::kForward); })
      .def_prop_ro("backward", [](const pw::CostModel& c) { return c.backward_cost(); })
      .def_prop_ro("input", [](const pw::CostModel& c) { return c.input_cost(); })
      .def_prop_ro("weight", [](const pw::CostModel& c) { return c.weight_cost(); })
      .def_prop_ro("stages",
                   [](const pw::CostModel& c) {
                     std::vector<Triple> out;
                     for (const pw::StageCost& s : c.stage_costs)
                       out.emplace_back(s.cost_of(pw::Phase::kForward), s.cost_of(pw::Phase::kBackwardInput),
                                        s.cost_of(pw::Phase::kBackwardWeight));
                     return out;
                   },
                   "One (F, I, W) per virtual stage; empty when every stage costs the same.")
      .def_ro("p2p_latency", &pw::CostModel::p2p_latency)
      .def_ro("overlap_efficiency", &pw::CostModel::overlap_efficiency)
      .def_ro("reduce", &pw::CostModel::reduce)
      .def_ro("copy_bandwidth", &pw::CostModel::copy_bandwidth)
      .def_prop_ro("replay", [](const pw::CostModel& c) { return std::string(pw::replay_name(c.replay)); })
      .def("__repr__", [](const pw::CostModel& c) {
        // Per-stage costs replace the scalar ones, so only they are shown then.
        if (c.stage_costs.empty())
          return "<pipeweave.Costs F " + pw::format_number(c.cost_of(pw::Phase::kForward)) + ", I " +
                 pw::format_number(c.input_cost()) + ", W " + pw::format_number(c.weight_cost()) + ", B " +
                 pw::format_number(c.backward_cost()) + ">";
        std::string stages;
        for (const pw::StageCost& s : c.stage_costs)
          stages += (stages.empty() ? "" : ", ") + pw::format_number(s.cost_of(pw::Phase::kForward)) + ":" +
                    pw::format_number(s.cost_of(pw::Phase::kBackwardInput)) + ":" +
                    pw::format_number(s.cost_of(pw::Phase::kBackwardWeight));
        return "<pipeweave.Costs " + std::to_string(c.stage_costs.size()) + " stages, F:I:W " + stages + ">";
      });

  nb::class_<pw::TraceEvent>(m, "Event", "One action of a run: its device, step, stage and times.")
      .def_ro("device", &pw::TraceEvent::device)
      .def_ro("step", &pw::TraceEvent::step, "The step of the device's lowered program.")
      .def_ro("stage", &pw::TraceEvent::stage, "The virtual stage.")
      .def_prop_ro("phase", [](const pw::TraceEvent& e) { return std::string(1, pw::phase_letter(e.action.phase)); },
                   "F, B, I, W, C (a recomputation), R (a gradient reduction), O or L (an offload or reload).")
      .def_prop_ro("micro_batch", [](const pw::TraceEvent& e) { return e.action.micro_batch; })
      .def_ro("start", &pw::TraceEvent::start)
      .def_ro("end", &pw::TraceEvent::end)
      .def("__repr__", [](const pw::TraceEvent& e) {
        return "<pipeweave.Event device " + std::to_string(e.device) + " " + pw::to_string(e.action.single()) + " " +
               pw::format_number(e.start) + ".." + pw::format_number(e.end) + ">";
      });

  nb::class_<pw::Trace>(m, "Trace",
                        "A run of a schedule, simulated: each device's actions with their times, and the most each "
                        "device kept at once.")
      .def_prop_ro("makespan", [](const pw::Trace& t) { return pw::makespan(t); })
      .def_prop_ro("bubble_ratio", [](const pw::Trace& t) { return pw::bubble_ratio(t); },
                   "(makespan - the busiest device's busy time) / that busy time: Megatron-LM's (P - 1) / M for 1F1B at "
                   "its default costs.")
      .def_ro("peak_activations", &pw::Trace::peak_activations, "Per device: forward stashes kept at once, at most.")
      .def_ro("peak_memory", &pw::Trace::peak_memory,
              "Per device: stashes and the gradients kept for a W, at most, in the stash sizes' unit.")
      .def_prop_ro("events",
                   [](const pw::Trace& t) {
                     std::vector<pw::TraceEvent> out;
                     for (const auto* lanes : {&t.compute, &t.collective, &t.copies})
                       for (const auto& row : *lanes) out.insert(out.end(), row.begin(), row.end());
                     return out;
                   },
                   "Every action as it ran: the compute lanes', then the gradient reductions' and the copies', "
                   "device by device.")
      .def("ascii", [](const pw::Trace& t, int width) { return pw::render_ascii(t, {.width = width}); },
           "width"_a = 160, "The timeline as text, one line per device (width: the most columns of a line).")
      .def(
          "svg",
          [](const pw::Trace& t, int width, int row_height, const std::string& title, const std::string& subtitle,
             double time_span) {
            return pw::render_svg(t, {.width = width, .row_height = row_height, .title = title, .subtitle = subtitle,
                                      .time_span = time_span});
          },
          nb::kw_only(), "width"_a = 1200, "row_height"_a = 34, "title"_a = "", "subtitle"_a = "", "time_span"_a = 0.0,
          "The timeline as an SVG picture; time_span: the time its width stands for (pictures drawn with one span "
          "share a scale).")
      .def("chrome_trace", [](const pw::Trace& t, const std::string& name) { return pw::render_chrome_trace(t, name); },
           "name"_a = "", "The run as Chrome trace JSON (Perfetto, chrome://tracing).")
      .def("summary", &pw::render_summary, "Makespan, bubble ratio and each device's busy time and peaks, as text.")
      .def("to_csv", &pw::render_pytorch_csv, "The actions in the order they ran, in PyTorch's CSV format.");

  nb::class_<pw::Synthesis>(m, "Synthesis", "A synthesized program and what the search knows of it.")
      .def_ro("program", &pw::Synthesis::program, "The fastest program found; it verifies and fits the memory limit.")
      .def_ro("makespan", &pw::Synthesis::makespan, "Its simulated makespan under the costs.")
      .def_ro("lower_bound", &pw::Synthesis::lower_bound, "No program of the shape can be faster than this.")
      .def_ro("peak_memory", &pw::Synthesis::peak_memory, "The most any device keeps, in the stash sizes' unit.")
      .def_ro("origin", &pw::Synthesis::origin, "The candidate it came from: a search policy or a built-in kind.")
      .def_prop_ro("best_builtin",
                   [](const pw::Synthesis& s) {
                     return s.best_builtin.name.empty()
                                ? std::nullopt
                                : std::optional<std::tuple<std::string, pw::Program, double>>(
                                      std::tuple{s.best_builtin.name, s.best_builtin.program, s.best_builtin.makespan});
                   },
                   "(name, program, makespan) of the fastest built-in schedule that fits the limit; None when none does.")
      .def_ro("evaluated", &pw::Synthesis::evaluated, "Programs simulated by the search.")
      .def("__repr__", [](const pw::Synthesis& s) {
        return "<pipeweave.Synthesis makespan " + pw::format_number(s.makespan) + ", lower bound " +
               pw::format_number(s.lower_bound) + ", peak memory " + pw::format_number(s.peak_memory) + ", from " +
               s.origin + ">";
      });

  nb::class_<pw::CommsProgram>(m, "Comms",
                                "A program with its communication as PyTorch's compute_comms rows hold it: each rank's "
                                "sends, receives and waits between its compute actions.")
      .def_ro("program", &pw::CommsProgram::program, "The compute actions alone.")
      .def_prop_ro("rows",
                   [](const pw::CommsProgram& c) {
                     std::vector<std::vector<std::string>> out(c.rows.size());
                     for (std::size_t r = 0; r < c.rows.size(); ++r)
                       for (const pw::CommsEntry& e : c.rows[r]) out[r].push_back(pw::comms_field(c, static_cast<int>(r), e));
                     return out;
                   },
                   "Each rank's row as PyTorch's action strings: '0F1', '0SEND_F1', '1RECV_F1', '0WAIT_SEND_F1'.")
      .def("to_csv", &pw::to_pytorch_comms_csv,
           "The rows in PyTorch's CSV format, for _load_csv(..., format='compute_comms').")
      .def("__str__", &pw::to_pytorch_comms_csv)
      .def("__eq__", [](const pw::CommsProgram& a, const pw::CommsProgram& b) { return a.rows == b.rows && a.program.devices == b.program.devices; })
      .def("__repr__", [](const pw::CommsProgram& c) { return "<pipeweave.Comms " + pw::describe_shape(c.program.shape) + ">"; });
  m.attr("Comms").attr("__hash__") = nb::none();

  nb::class_<pw::CommsVerdict>(m, "CommsProof",
                               "prove_comms()'s outcome: true when the rows cannot hang; otherwise the rank and the "
                               "index of the field in its row, and what is wrong: for a hang, each blocked rank's wait "
                               "and the cycle of waits.")
      .def_ro("ok", &pw::CommsVerdict::ok)
      .def_ro("rank", &pw::CommsVerdict::rank, "The rank of the problem, -1 when it belongs to none.")
      .def_ro("index", &pw::CommsVerdict::index, "The field of its row, -1 when it belongs to none.")
      .def_prop_ro("message", &pw::CommsVerdict::what, "'ok', or what is wrong.")
      .def("__bool__", [](const pw::CommsVerdict& v) { return v.ok; })
      .def("__str__", &pw::CommsVerdict::what)
      .def("__repr__", [](const pw::CommsVerdict& v) { return "<pipeweave.CommsProof " + v.what() + ">"; });

  m.def(
      "with_comms",
      [](const pw::Program& p, const std::string& receives) {
        return pw::with_comms(p, named<pw::ReceivePlacement>("with_comms: receives", receives,
                                                             {{"late", pw::ReceivePlacement::kLate},
                                                              {"early", pw::ReceivePlacement::kEarly}}));
      },
      "program"_a, "receives"_a = "early",
        "The program with its sends, receives and waits placed for PyTorch's runtime: each send right after the "
        "step that makes its tensor, a pair of ranks' messages in one order on both sides, each receive as early as "
        "that order allows (receives='early', the default: just after the rank's previous send to its sender in that "
        "order; 'late': just before the step that reads it where it can), a REDUCE_GRAD per stage where the "
        "program has none (PyTorch's runtime scales the gradients there); proved under the 'pair' and 'async' "
        "semantics before it is returned.\n\n"
        ">>> print(pipeweave.with_comms(pipeweave.schedule('1f1b', 2, 1, 1)), end='')\n"
        "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0");
  m.def(
      "parse_comms", [](const std::string& text) { return pw::parse_pytorch_comms(text); }, "text"_a,
      "compute_comms rows from PyTorch's CSV text, the sends, receives and waits as written (PyTorch's "
      "_dump_csv(..., format='compute_comms')).");
  m.def(
      "load_comms", [](const std::filesystem::path& path) { return pw::load_pytorch_comms(path.string()); }, "path"_a,
      "parse_comms() of a file.");
  m.def(
      "prove_comms",
      [](const pw::CommsProgram& c, const std::string& semantics) { return pw::prove_comms(c, comm_order_named(semantics)); },
      "comms"_a, "semantics"_a = "pair", nb::call_guard<nb::gil_scoped_release>(),
      "Proves that the rows cannot hang, or names the hang. semantics: 'async' (gloo-like: a send never blocks, a "
      "compute waits for the receives it reads), 'pair' (NCCL-like: a rank's sends and receives with one peer "
      "complete in the order posted, a send when its receive is reached), or 'rank' (one stream per rank: all of a "
      "rank's sends and receives in the order posted).");
  m.def(
      "kinds",
      [] {
        std::vector<std::string> out;
        for (const pw::ScheduleKind k : pw::generated_kinds()) out.emplace_back(pw::schedule_name(k));
        return out;
      },
      "The names of the generated schedules, for schedule().");
  m.def(
      "schedule",
      [](const std::string& kind, int devices, std::optional<int> chunks, int micro_batches,
         std::optional<std::string> placement) {
        return pw::make_program(shape_of(pw::schedule_kind(kind), devices, chunks, micro_batches, std::move(placement)));
      },
      "kind"_a, "devices"_a, "chunks"_a.none(), "micro_batches"_a, "placement"_a = nb::none(),
      "The program of a generated schedule, in exactly PyTorch's order: kind one of kinds(); chunks None for the "
      "kind's own (1, or 2 for the v-shaped ones); placement None for the kind's own. Raises Error stating the rule "
      "a shape breaks.\n\n>>> pipeweave.schedule('interleaved', 4, 2, 8)\n"
      "<pipeweave.Program Interleaved 1F1B: P=4 devices, V=2 chunks, M=8 micro-batches>");
  m.def("verify", [](const pw::Program& p) { return pw::verify(p); }, "program"_a,
        "Proves a program: no deadlock, every dependency met, the memory rules kept. The result is true when it holds "
        "and names the first violation otherwise.");
  m.def("lower", &pw::lower_checked, "program"_a,
        "Lowers a program to the steps a runtime issues (sends and receives placed), proving it on the way; raises "
        "Error with verify()'s message when it does not hold.");
  m.def(
      "simulate",
      [](const pw::Program& p, std::optional<pw::CostModel> costs) { return pw::simulate(p, costs.value_or(pw::CostModel{})); },
      "program"_a, "costs"_a = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "Runs a program on the simulator under the costs (default: F 1, I 1, W 1, free transfers).");
  m.def(
      "synthesize",
      [](int devices, int chunks, int micro_batches, std::optional<pw::CostModel> costs, double memory_limit,
         const std::string& placement, bool recompute, bool offload, bool split_backward, bool pairs, long long work) {
        const pw::ScheduleShape shape{pw::ScheduleKind::kAuto, devices, chunks, micro_batches, placement_named(placement)};
        nb::gil_scoped_release unlocked;
        return pw::synthesize(shape, costs.value_or(pw::CostModel{}),
                              {.memory = memory_limit, .recompute = recompute, .offload = offload,
                               .split_backward = split_backward, .pairs = pairs, .work = work});
      },
      "devices"_a, "chunks"_a, "micro_batches"_a, "costs"_a = nb::none(), nb::kw_only(), "memory_limit"_a = 0.0,
      "placement"_a = "loop", "recompute"_a = false, "offload"_a = false, "split_backward"_a = true, "pairs"_a = true,
      "work"_a = 0,
      "The fastest proven program the search finds for the costs under a memory limit (each device's peak memory, "
      "in the stash sizes' unit; 0: none), against every built-in schedule that fits. recompute, offload: micro-batches "
      "may be recomputed, stashes offloaded, to meet the limit; split_backward, pairs: I/W halves and overlapped pairs "
      "may be used; work: the search's budget in simulated actions (0: the default, about 0.5 s at P 8, V 2, M 64).");
  m.def(
      "smallest_memory_limit",
      [](int devices, int chunks, int micro_batches, const std::string& placement, bool recompute,
         std::optional<pw::CostModel> costs) {
        const pw::ScheduleShape shape{pw::ScheduleKind::kAuto, devices, chunks, micro_batches, placement_named(placement)};
        return pw::smallest_memory_limit(shape, costs ? costs->memory : pw::MemoryModel{}, recompute);
      },
      "devices"_a, "chunks"_a, "micro_batches"_a, nb::kw_only(), "placement"_a = "loop", "recompute"_a = false,
      "costs"_a = nb::none(), "The smallest memory limit any program of the shape fits in (synthesize() refuses less).");
  m.def("with_grad_reduce", &pw::with_grad_reduce, "program"_a,
        "The program with each chunk's gradient all-reduce (REDUCE_GRAD) after the chunk's last backward on its "
        "device: data parallelism around the pipeline.");
  m.def("overlap", &pw::overlap, "program"_a,
        "The program with its steady phase fused into overlapped pairs, a forward and an independent backward that "
        "run at once.");
  m.def(
      "with_recompute",
      [](const pw::Program& p, const nb::object& stages) { return pw::with_recompute(p, stage_list(p, stages, "with_recompute")); },
      "program"_a, "stages"_a,
      "The program with the given virtual stages (a list, or 'all') recomputing every micro-batch: each keeps only "
      "its input from its forward to a recomputation right before its backward.");
  m.def(
      "with_offload",
      [](const pw::Program& p, const nb::object& stages) { return pw::with_offload(p, stage_list(p, stages, "with_offload")); },
      "program"_a, "stages"_a,
      "The program with the given virtual stages (a list, or 'all') offloading their stashes to host memory after "
      "the forward and reloading them before the backward, on each device's copy lane.");
  m.def(
      "parse_csv", [](const std::string& text) { return pw::parse_pytorch_csv(text); }, "text"_a,
      "A program from PyTorch's pipelining CSV text (one row per rank); the shape is inferred, the kind 'custom'. "
      "Communication actions (SEND_F, RECV_B, ...) are checked for form and skipped: lower() places them. Raises "
      "Error naming the line and column of a bad field.");
  m.def(
      "load_csv", [](const std::filesystem::path& path) { return pw::load_pytorch_csv(path.string()); }, "path"_a,
      "parse_csv() of a file.");
  m.def("to_csv", &pw::to_pytorch_csv, "program"_a,
        "The program in PyTorch's pipelining CSV format (compute actions; _load_csv(..., format='compute_only')).");
  m.def("to_cpp", &pw::format_cpp, "program"_a, "name"_a = "Schedule",
        "The program as a C++ header whose struct `name` static_assert(pipeweave::verify(...)) proves at compile time.");

  // The command line (pipeweave-schedule, python -m pipeweave: pipeweave/cli.py) is print_schedule's own run()
  // behind argparse: its flags' table, and run() on the flags given.
  namespace ps = pw::tool::print_schedule;
  m.def(
      "_print_schedule_flags",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string, bool>> rows;
        for (const ps::Flag& f : ps::flags()) rows.emplace_back(f.name, f.metavar, f.help, f.value);
        return rows;
      },
      "print_schedule's flags in --help order: (name, its value in --help, help, takes a value).");
  m.attr("_print_schedule_description") = std::string(ps::kDescription);
  m.def(
      "_print_schedule",
      [](const std::map<std::string, std::string>& given, const std::string& program) {
        std::ostringstream out, err;
        const int status = ps::run(ps::Given(given.begin(), given.end()), program, out, err);
        return std::tuple{status, out.str(), err.str()};
      },
      "given"_a, "program"_a,
      "print_schedule run on the flags given (name: text, '' for a switch): (exit status, stdout, stderr).");
}
