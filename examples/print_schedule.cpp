// print_schedule: prints, lowers and verifies a pipeline schedule.
//
//   print_schedule --schedule interleaved --devices 4 --chunks 2 --micro-batches 8 --format actions
//
// Bad arguments: exit status 2 and one line on stderr saying what is wrong.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

// The schedule layer only: this tool needs neither the runtime nor its dependencies.
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/format.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace {

using namespace pipeweave;

int usage_error(const std::string& message) {
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::cerr << "print_schedule: " << line << " (see --help)\n";
  return 2;
}

std::string layer_list(const LayerRange& r) {
  return r.size() == 1 ? "layer " + std::to_string(r.begin + 1)
                       : "layers " + std::to_string(r.begin + 1) + "-" + std::to_string(r.end);
}

// Shape, layer allocation, the three periods of each device, and the verdict.
void print_overview(const Program& p, int layers) {
  const ScheduleShape& s = p.shape;
  std::cout << "schedule: " << schedule_name(s.kind) << ", " << s.devices << " devices x " << s.chunks
            << " chunks = " << s.stages() << " virtual stages, " << s.micro_batches << " micro-batches, " << layers
            << " layers\n\n";
  std::cout << "layers per device (1-based; virtual stage s = c*P + d):\n";
  for (int d = 0; d < s.devices; ++d) {
    std::cout << "  device " << d << ":";
    for (int c = 0; c < s.chunks; ++c) {
      std::cout << (c ? "," : "") << " chunk " << c << " = " << layer_list(chunk_layers(s, layers, d, c)) << " (stage "
                << s.stage_of(d, c) << ")";
    }
    std::cout << "\n";
  }
  std::cout << "\nprograms (warm-up | steady 1F1B | cool-down):\n";
  for (int d = 0; d < s.devices; ++d) {
    std::cout << "  device " << d << ":";
    Period last = Period::kWarmUp;
    int count[3] = {0, 0, 0};
    const auto& actions = p.devices[static_cast<std::size_t>(d)];
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const Period now = period_of(s, d, static_cast<int>(k));
      if (now != last) std::cout << " |";
      last = now;
      ++count[static_cast<int>(now)];
      std::cout << " " << to_string(actions[k]);
    }
    std::cout << "\n";
  }
  std::cout << "\nphases:\n";
  for (int d = 0; d < s.devices; ++d) {
    const int warmup = warmup_forwards(s, d);
    const int steady = s.chunks * s.micro_batches - warmup;
    std::cout << "  device " << d << ": warm-up " << warmup << " forwards, steady " << steady
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
  std::cout << "\nverification: " << (r ? "ok" : "FAILED: " + r.what()) << "\n";
  if (r) {
    std::cout << "  every (virtual stage, micro-batch) has one forward and one backward;\n"
              << "  every action runs after the actions it needs;\n"
              << "  " << sends << " sends in " << steps << " steps, each matched in FIFO order by the receive that expects it;\n"
              << "  the steps run to completion under rendezvous semantics: no deadlock.\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Prints a pipeline-parallel schedule: its actions, its lowered steps with sends and receives, or an "
               "overview with the layer allocation and the verification result."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  const std::map<std::string, ScheduleKind> kinds = {{"gpipe", ScheduleKind::kGPipe},
                                                     {"1f1b", ScheduleKind::kOneFOneB},
                                                     {"interleaved", ScheduleKind::kInterleaved1F1B}};
  std::string schedule = "interleaved", format = "actions";
  int devices = 4, chunks = 0, micro_batches = 8, layers = 0;
  bool demo = false;
  app.add_option("--schedule", schedule, "gpipe, 1f1b or interleaved (default interleaved)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--devices", devices, "Pipeline devices P, 1..4096 (default 4)")->check(CLI::Range(1, 4096));
  app.add_option("--chunks", chunks, "Model chunks per device V, 1..4096 (default 2 for interleaved, else 1)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--micro-batches", micro_batches,
                 "Micro-batches M, 1..65536; a multiple of P for interleaved (default 8)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--format", format,
                 "actions: one line per device; steps: the lowered program with sends and receives; overview: layer "
                 "allocation, phases and verification (default actions)")
      ->check(CLI::IsMember({"actions", "steps", "overview"}));
  app.add_option("--layers", layers, "Model layers for --format overview, a multiple of P*V (default 2*P*V)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--demo", demo, "The seed example: 16 layers, 4 devices, 2 chunks, 8 micro-batches, as an overview");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (demo) {
    schedule = "interleaved";
    format = "overview";
    devices = 4;
    chunks = 2;
    micro_batches = 8;
    layers = 16;
  }
  const ScheduleKind kind = kinds.at(schedule);
  if (chunks == 0) chunks = kind == ScheduleKind::kInterleaved1F1B ? 2 : 1;
  if (layers == 0) layers = 2 * devices * chunks;
  try {
    const Program p = make_schedule(kind, devices, chunks, micro_batches);
    if (format == "overview") {
      check_layer_split(p.shape, layers);
      print_overview(p, layers);
      return verify(p) ? 0 : 1;
    }
    if (format == "actions") {
      std::cout << format_actions(p);
    } else {
      std::cout << "schedule: " << schedule << ", P=" << devices << " V=" << chunks << " M=" << micro_batches
                << "; each step runs its group of sends and receives, then its action\n";
      std::cout << format_steps(lower(p));
    }
    const VerifyResult r = verify(p);
    if (!r) {
      std::cerr << "print_schedule: verification failed: " << r.what() << "\n";
      return 1;
    }
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  return 0;
}
