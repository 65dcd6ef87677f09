// print_schedule: prints, lowers, verifies and simulates a pipeline schedule, or
// one read from a PyTorch-format CSV file.
//
//   print_schedule --schedule NAME --devices 4 --chunks 2 --micro-batches 8 --format actions
//   print_schedule --format svg --output docs/img/seed_timeline.svg
//   print_schedule --input order.csv --format summary --p2p-latency 0.1
//   print_schedule --demo --overlap      (the seed example, its steady phase in overlapped pairs)
//   print_schedule --schedule auto --stage-costs 1:2:1,1:2:1,1:2:1,1.3:2.6:1.3 --chunks 1 --memory-limit 4 --format summary
//   print_schedule --format overview --layers-per-stage 1,2,2,2,2,2,2,1   (uneven stages)
//   print_schedule --replicas 2 --reduce-cost 3 --format ascii   (data parallelism: a gradient reduction per chunk)
//   print_schedule --schedule 1f1b --offload all --copy-bandwidth 1 --format ascii   (offloads on the copy lane)
//
// The tool itself is common/print_schedule.hpp (its flags and run()); this file
// parses the command line with CLI11 over its table. The Python package's
// pipeweave-schedule runs the same run() behind argparse.
//
// Bad arguments: exit status 2 and one line on stderr saying what is wrong and
// what is allowed. A program that fails verification: exit status 1. With
// --output, the file is written whole or not at all (a temporary file, then rename).
#include <iostream>
#include <map>
#include <string>

#include "common/print_schedule.hpp"
#include "common/tool.hpp"

namespace ps = pipeweave::tool::print_schedule;

int main(int argc, char** argv) {
  CLI::App app{std::string(ps::kDescription)};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::map<std::string, std::string> texts;
  std::map<std::string, bool> switches;
  for (const ps::Flag& f : ps::flags()) {
    if (f.value)
      app.add_option(f.name, texts[f.name], f.help)->type_name(f.metavar);
    else
      app.add_flag(f.name, switches[f.name], f.help);
  }
  if (const auto status = pipeweave::tool::parse(app, argc, argv, ps::kName)) return *status;
  ps::Given given;
  for (const ps::Flag& f : ps::flags())
    if (app.count(f.name) > 0) given[f.name] = f.value ? texts[f.name] : std::string();
  return ps::run(given, ps::kName, std::cout, std::cerr);
}
