// print_schedule: prints, lowers, verifies and simulates a pipeline schedule, or
// one read from a PyTorch-format CSV file.
//
//   print_schedule --schedule interleaved --devices 4 --chunks 2 --micro-batches 8 --format actions
//   print_schedule --format svg --output docs/seed_timeline.svg
//   print_schedule --input order.csv --format summary --p2p-latency 0.1
//
// Bad arguments: exit status 2 and one line on stderr saying what is wrong and
// what is allowed. A program that fails verification: exit status 1. With
// --output, the file is written whole or not at all (a temporary file, then rename).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>

// The schedule and analysis layers only: this tool needs neither the runtime nor its dependencies.
#include "common/tool.hpp"
#include "pipeweave/schedule.hpp"

namespace {

using namespace pipeweave;

int usage_error(const std::string& message) { return tool::usage_error("print_schedule", message); }

std::string layer_list(const LayerRange& r) {
  return r.size() == 1 ? "layer " + std::to_string(r.begin + 1)
                       : "layers " + std::to_string(r.begin + 1) + "-" + std::to_string(r.end);
}

// Shape, layer allocation, the three periods of each device, and the verdict.
void print_overview(std::ostream& out, const Program& p, int layers) {
  const ScheduleShape& s = p.shape;
  out << "schedule: " << schedule_name(s.kind) << ", " << s.devices << " devices x " << s.chunks
            << " chunks = " << s.stages() << " virtual stages, " << s.micro_batches << " micro-batches, " << layers
            << " layers\n\n";
  out << "layers per device (1-based; virtual stage s = c*P + d):\n";
  for (int d = 0; d < s.devices; ++d) {
    out << "  device " << d << ":";
    for (int c = 0; c < s.chunks; ++c) {
      out << (c ? "," : "") << " chunk " << c << " = " << layer_list(chunk_layers(s, layers, d, c)) << " (stage "
                << s.stage_of(d, c) << ")";
    }
    out << "\n";
  }
  out << "\nprograms (warm-up | steady 1F1B | cool-down):\n";
  for (int d = 0; d < s.devices; ++d) {
    out << "  device " << d << ":";
    Period last = Period::kWarmUp;
    int count[3] = {0, 0, 0};
    const auto& actions = p.devices[static_cast<std::size_t>(d)];
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const Period now = period_of(s, d, static_cast<int>(k));
      if (now != last) out << " |";
      last = now;
      ++count[static_cast<int>(now)];
      out << " " << to_string(actions[k]);
    }
    out << "\n";
  }
  out << "\nphases:\n";
  if (s.kind == ScheduleKind::kCustom) out << "  (a custom program: no warm-up rule)\n";
  for (int d = 0; d < s.devices && s.kind != ScheduleKind::kCustom; ++d) {
    const int warmup = warmup_forwards(s, d);
    const int steady = s.chunks * s.micro_batches - warmup;
    out << "  device " << d << ": warm-up " << warmup << " forwards, steady " << steady
              << " forward/backward pairs, cool-down " << warmup << " backwards\n";
  }
  const LoweredProgram lp = lower(p);
  int sends = 0, steps = 0;
  for (const auto& device : lp.devices) {
    steps += static_cast<int>(device.size());
    for (const Step& st : device)
      for (const P2POp& op : st.ops) sends += op.kind == OpKind::kSend;
  }
  const VerifyResult r = verify(p);
  out << "\nverification: " << (r ? "ok" : "FAILED: " + r.what()) << "\n";
  if (r) {
    out << "  every (virtual stage, micro-batch) has one forward and one backward;\n"
              << "  every action runs after the actions it needs;\n"
              << "  " << sends << " sends in " << steps << " steps, each matched in FIFO order by the receive that expects it;\n"
              << "  the steps run to completion under rendezvous semantics: no deadlock.\n";
  }
}


// Writes `text` to `path` whole or not at all: a temporary file next to it, then
// rename. Returns an empty string, or what went wrong.
std::string write_atomically(const std::string& path, const std::string& text, bool& bad_path) {
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

std::string cost_line(const CostModel& c) {
  return "forward " + format_decimal(c.forward, 6) + ", backward " + format_decimal(c.backward_cost(), 6) +
         ", p2p latency " + format_decimal(c.p2p_latency, 6);
}

std::string replay_words(ReplayMode mode) {
  return mode == ReplayMode::kSteps ? "lowered steps under rendezvous" : "dataflow (program order, no lowering)";
}

// Summary: the trace's own summary, then the cost model, the closed form and the dataflow bound.
void print_summary(std::ostream& out, const Program& p, const Trace& t, const CostModel& cost) {
  out << render_summary(t);
  out << "cost model: " << cost_line(cost) << "; replay: " << replay_words(cost.replay) << "\n";
  if (p.shape.kind != ScheduleKind::kCustom) {
    out << "closed form (free communication): bubble ratio " << format_decimal(closed_form_bubble_ratio(p.shape), 6)
        << ", makespan " << format_decimal(closed_form_makespan(p.shape, cost), 6) << ", peak activations";
    for (int d = 0; d < p.shape.devices; ++d) out << (d ? ", " : " ") << closed_form_peak_activations(p.shape, d);
    out << "\n";
  }
  if (cost.replay == ReplayMode::kSteps) {
    const Trace bound = simulate(p, cost.with_replay(ReplayMode::kDataflow));
    out << "dataflow bound (program order, no lowering): bubble ratio " << format_decimal(bubble_ratio(bound), 6)
        << ", makespan " << format_decimal(makespan(bound), 6) << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Prints a pipeline-parallel schedule: its actions, its lowered steps with sends and receives, an "
               "overview with the layer allocation and the verification result, or a simulated run as a timeline "
               "(ascii, chrome, svg), in PyTorch's CSV format, or as a summary."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::string schedule = "interleaved", format = "actions", input, output, replay = "steps";
  int devices = 4, chunks = 0, micro_batches = 8, layers = 0;
  double forward_cost = 1, backward_cost = -1, p2p_latency = 0;
  bool demo = false;
  auto* schedule_opt = app.add_option("--schedule", schedule, "gpipe, 1f1b or interleaved (default interleaved)")
                           ->check(CLI::IsMember(tool::schedule_names()));
  app.add_option("--devices", devices, "Pipeline devices P, 1..4096 (default 4)")->check(CLI::Range(1, 4096));
  app.add_option("--chunks", chunks, "Model chunks per device V, 1..4096 (default 2 for interleaved, else 1)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--micro-batches", micro_batches,
                 "Micro-batches M, 1..65536; a multiple of P for interleaved (default 8)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--format", format,
                 "actions: one line per device; steps: the lowered program with sends and receives; overview: layer "
                 "allocation, phases and verification; ascii, chrome (Chrome trace JSON for Perfetto), svg: the "
                 "simulated timeline; csv: PyTorch's pipelining CSV; summary: simulated makespan, bubble ratio and "
                 "peak activations (default actions)")
      ->check(CLI::IsMember({"actions", "steps", "overview", "ascii", "chrome", "svg", "csv", "summary"}));
  app.add_option("--layers", layers, "Model layers for --format overview, a multiple of P*V (default 2*P*V)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--input", input,
                 "Read the program from a CSV file in PyTorch's pipelining format instead of generating it; "
                 "--devices, --chunks and --micro-batches, when given, must match it")
      ->excludes(schedule_opt);
  app.add_option("--forward-cost", forward_cost, "Simulated time of one chunk's forward, > 0 (default 1)");
  app.add_option("--backward-cost", backward_cost, "Simulated time of one chunk's backward, > 0 (default 2 * forward)");
  app.add_option("--p2p-latency", p2p_latency, "Simulated time of each send/receive transfer, >= 0 (default 0)");
  app.add_option("--replay", replay,
                 "steps: the lowered program under rendezvous, as the executors run it; dataflow: each action as "
                 "soon as its inputs are there, the bound of the program order (default steps)")
      ->check(CLI::IsMember({"steps", "dataflow"}));
  app.add_option("--output", output, "Write to this file (whole or not at all) instead of standard output");
  app.add_flag("--demo", demo, "The seed example: 16 layers, 4 devices, 2 chunks, 8 micro-batches, as an overview");
  if (const auto status = tool::parse(app, argc, argv, "print_schedule")) return *status;
  if (!(std::isfinite(forward_cost) && forward_cost > 0))
    return usage_error("--forward-cost must be a number > 0 (got " + std::to_string(forward_cost) + ")");
  if (app.count("--backward-cost") && !(std::isfinite(backward_cost) && backward_cost > 0))
    return usage_error("--backward-cost must be a number > 0 (got " + std::to_string(backward_cost) + ")");
  if (!(std::isfinite(p2p_latency) && p2p_latency >= 0))
    return usage_error("--p2p-latency must be a number >= 0 (got " + std::to_string(p2p_latency) + ")");
  if (demo) {
    if (!input.empty()) return usage_error("--demo and --input exclude each other");
    schedule = "interleaved";
    format = "overview";
    devices = 4;
    chunks = 2;
    micro_batches = 8;
    layers = 16;
  }
  CostModel cost;
  cost.forward = forward_cost;
  cost.backward = app.count("--backward-cost") ? backward_cost : -1;
  cost.p2p_latency = p2p_latency;
  cost.replay = replay == "steps" ? ReplayMode::kSteps : ReplayMode::kDataflow;

  Program p;
  try {
    if (!input.empty()) {
      p = load_pytorch_csv(input);
      const ScheduleShape& s = p.shape;
      for (const auto& [flag, noun, given, found] :
           {std::tuple{"--devices", "devices", devices, s.devices}, std::tuple{"--chunks", "chunks", chunks, s.chunks},
            std::tuple{"--micro-batches", "micro-batches", micro_batches, s.micro_batches}}) {
        if (app.count(flag) && given != found)
          return usage_error(input + ": the program has " + std::to_string(found) + " " + noun + ", but " + flag +
                             " is " + std::to_string(given));
      }
    } else {
      const ScheduleKind kind = *parse_schedule(schedule);
      if (chunks == 0) chunks = kind == ScheduleKind::kInterleaved1F1B ? 2 : 1;
      p = make_schedule(kind, devices, chunks, micro_batches);
    }
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  const ScheduleShape& s = p.shape;
  if (layers == 0) layers = 2 * s.devices * s.chunks;

  std::ostringstream out;
  try {
    const VerifyResult r = verify(p);
    if (!r) {
      std::cerr << "print_schedule: verification failed: " << r.what() << "\n";
      return 1;
    }
    if (format == "overview") {
      check_layer_split(s, layers);
      print_overview(out, p, layers);
    } else if (format == "actions") {
      out << format_actions(p);
    } else if (format == "steps") {
      out << "schedule: " << schedule_name(s.kind) << ", P=" << s.devices << " V=" << s.chunks
          << " M=" << s.micro_batches << "; each step runs its group of sends and receives, then its action\n";
      out << format_steps(lower(p));
    } else if (format == "csv") {
      out << to_pytorch_csv(p);
    } else {
      const Trace t = simulate(p, cost);
      if (format == "ascii") {
        out << render_ascii(t);
      } else if (format == "chrome") {
        out << render_chrome_trace(t);
      } else if (format == "summary") {
        print_summary(out, p, t, cost);
      } else {
        SvgOptions o;
        o.subtitle = "simulated, " + replay_words(cost.replay) + " · " + cost_line(cost) + " · makespan " +
                     format_decimal(makespan(t), 4) + " · bubble ratio " + format_decimal(bubble_ratio(t), 4);
        if (s.kind != ScheduleKind::kCustom)
          o.subtitle += " (closed form " + format_decimal(closed_form_bubble_ratio(s), 4) + ")";
        out << render_svg(t, o);
      }
    }
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  if (output.empty()) {
    std::cout << out.str();
    return 0;
  }
  bool bad_path = false;
  if (const std::string why = write_atomically(output, out.str(), bad_path); !why.empty()) {
    if (bad_path) return usage_error(why);
    std::cerr << "print_schedule: " << why << "\n";
    return 1;
  }
  return 0;
}
