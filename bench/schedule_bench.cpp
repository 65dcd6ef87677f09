// schedule_bench: what schedules cost to make, lower, verify and simulate at
// run time, and what they give (bubble ratio, peak activations and memory),
// every figure checked against the closed forms. What they cost the compiler:
// compile_bench.
//
//   schedule_bench                                   # the default sweep, a table
//   schedule_bench --schedules NAME --devices 64 --chunks 8 --micro-batches 64,256,1024
//
// Each row: warm-up calls, then timed calls of make_schedule, lower, verify
// (verify(program, lowered): the program and the lowering just timed, without
// lowering again) and simulate (both replays, of the program; sim.low: the
// steps replay of the lowering just timed, simulate(lowered)), on one core (the thread's CPU time, which other
// processes on the machine do not inflate); the mean time per call, divided by the number of
// actions (ns per action: constant across sizes when the cost is linear), and
// the milliseconds of make_schedule + lower + verify and of simulate. Beside
// each, `fresh`: the milliseconds the same thread takes to write as many bytes
// into pages new to the process (one byte per page: the kernel's page faults and
// zeroing) as those calls write: the lowering (a program made again reuses the
// memory of the one before) and simulate's trace. Where the output comes as new
// pages, as it does at a million actions (a page fault per 4 KiB of output on
// every call), no implementation of these outputs goes under that floor on the
// machine at hand; B/act gives those bytes per action. #wrong
// counts failed checks: verification; where the shape has a closed form,
// dataflow bubble = closed form, steps bubble = closed form for every kind but
// the kinds whose row says steps_reach_closed_form = false (never below it for those); peak activations and
// (where it has one) peak memory = closed form on every device; CSV round trip.
// A schedule named `<kind>+overlap` is overlap() of that kind's program
// (generate times both); it and a kind whose own order has pairs have no closed form: their rows
// check that the dataflow bound is never above the steps replay. Exit status
// 1 when any row has #wrong > 0.
//
#include <CLI/CLI.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/schedule.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

struct Row {
  ScheduleKind kind;
  bool overlapped = false;  // overlap() of the kind's program
  int devices, chunks, micro_batches;
  long long actions = 0, steps = 0;
  double generate_us = 0, lower_us = 0, verify_us = 0, simulate_us = 0, simulate_lowered_us = 0, dataflow_us = 0;
  // Bytes a lowering and a trace hold; the time to get that much fresh memory.
  double lowered_bytes = 0, trace_bytes = 0, fresh_lowered_us = 0, fresh_trace_us = 0;
  double bubble_steps = 0, bubble_dataflow = 0;
  std::optional<double> bubble_closed;  // none where the shape has no closed form
  double makespan_steps = 0, makespan_dataflow = 0;
  int peak_first = 0, peak_last = 0, memory_first = 0, memory_last = 0;
  int wrong = 0;

  double ns_per_action(double us) const { return actions > 0 ? 1e3 * us / static_cast<double>(actions) : 0.0; }
};

// CPU seconds this thread has used (user and system: page faults included);
// unlike the wall clock, other processes on the machine do not inflate it (a
// virtual machine's host can, when it takes the core without reporting steal time).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Mean CPU seconds per call of f over `iters` calls after `warmup` calls.
template <class F>
double time_calls(int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  const double t0 = thread_seconds();
  for (int i = 0; i < iters; ++i) f();
  return (thread_seconds() - t0) / std::max(iters, 1);
}

// Mean CPU seconds to write `bytes` into memory new to this process, one byte
// per page (each page faulted in and zeroed by the kernel), over `iters` fresh
// mappings after `warmup`; mapping and unmapping are not timed. What a call
// whose output of that size comes as new pages pays however it computes it.
double fresh_pages_seconds(std::size_t bytes, int warmup, int iters) {
  if (bytes == 0) return 0;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  double total = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("schedule_bench: mapping " + std::to_string(bytes) + " bytes failed");
    volatile char* c = static_cast<char*>(p);
    const double t0 = thread_seconds();
    for (std::size_t k = 0; k < bytes; k += page) c[k] = 1;
    if (i >= warmup) total += thread_seconds() - t0;
    munmap(p, bytes);
  }
  return total / std::max(iters, 1);
}

// Bytes of a lowering's step records and operations, and of a trace's events.
double bytes_of(const LoweredProgram& lp) {
  double b = 0;
  for (const StepList& d : lp.devices)
    b += static_cast<double>(d.size() * sizeof(*d.record_data()) + d.ops().size() * sizeof(P2POp));
  return b;
}
double bytes_of(const Trace& t) {
  double b = 0;
  for (const auto& d : t.compute) b += static_cast<double>(d.size() * sizeof(TraceEvent));
  for (const auto& d : t.comm) b += static_cast<double>(d.size() * sizeof(CommEvent));
  return b;
}

// Keeps a value alive so that the optimizer cannot drop the call that made it.
template <class T>
void keep(const T& v) {
  asm volatile("" : : "g"(&v) : "memory");
}

// The name of a row's schedule: the kind's, with "+overlap" where the program is overlapped.
std::string row_name(const Row& r) { return std::string(schedule_name(r.kind)) + (r.overlapped ? "+overlap" : ""); }

Row measure(ScheduleKind kind, bool overlapped, int p, int v, int m, int warmup, int iters) {
  Row r;
  r.kind = kind;
  r.overlapped = overlapped;
  r.devices = p;
  r.chunks = v;
  r.micro_batches = m;
  auto make = [&] { return overlapped ? overlap(make_schedule(kind, p, v, m)) : make_schedule(kind, p, v, m); };
  const Program prog = make();
  const LoweredProgram lp = lower(prog);
  for (const auto& d : prog.devices) r.actions += static_cast<long long>(d.size());
  for (const auto& d : lp.devices) r.steps += static_cast<long long>(d.size());
  r.generate_us = 1e6 * time_calls(warmup, iters, [&] { keep(make()); });
  r.lower_us = 1e6 * time_calls(warmup, iters, [&] { keep(lower(prog)); });
  r.verify_us = 1e6 * time_calls(warmup, iters, [&] { keep(verify(prog, lp)); });
  r.simulate_us = 1e6 * time_calls(warmup, iters, [&] { keep(simulate(prog)); });
  r.simulate_lowered_us = 1e6 * time_calls(warmup, iters, [&] { keep(simulate(lp)); });
  const CostModel dataflow = CostModel{}.with_replay(ReplayMode::kDataflow);
  r.dataflow_us = 1e6 * time_calls(warmup, iters, [&] { keep(simulate(prog, dataflow)); });

  const Trace steps = simulate(prog), flow = simulate(prog, dataflow);
  r.lowered_bytes = bytes_of(lp);
  r.trace_bytes = bytes_of(steps);
  r.fresh_lowered_us = 1e6 * fresh_pages_seconds(static_cast<std::size_t>(r.lowered_bytes), warmup, iters);
  r.fresh_trace_us = 1e6 * fresh_pages_seconds(static_cast<std::size_t>(r.trace_bytes), warmup, iters);
  r.bubble_steps = bubble_ratio(steps);
  r.bubble_dataflow = bubble_ratio(flow);
  const bool closed = !overlapped && !kind_row(kind).pairs;  // the closed forms are of plain orders
  if (closed && closed_form_error(prog.shape).empty()) r.bubble_closed = closed_form_bubble_ratio(prog.shape);
  r.makespan_steps = makespan(steps);
  r.makespan_dataflow = makespan(flow);
  r.peak_first = steps.peak_activations.front();
  r.peak_last = steps.peak_activations.back();
  r.memory_first = static_cast<int>(steps.peak_memory.front());  // whole activations: the default memory model
  r.memory_last = static_cast<int>(steps.peak_memory.back());
  // The checks behind #wrong: both replays meet the closed forms where they exist
  // (where the kind's row says the steps replay does not reach it, only that it is never beaten).
  r.wrong += !verify(prog);
  r.wrong += !verify(lp);
  r.wrong += !verify(prog, lp);
  r.wrong += !(simulate(lp).compute == steps.compute);  // the same replay, from the stored steps
  if (r.bubble_closed) {
    r.wrong += std::abs(r.bubble_dataflow - *r.bubble_closed) > 1e-9;
    r.wrong += r.bubble_steps < *r.bubble_closed - 1e-9;
    if (kind_row(kind).steps_reach_closed_form) r.wrong += std::abs(r.bubble_steps - *r.bubble_closed) > 1e-9;
  }
  r.wrong += !closed && r.makespan_dataflow > r.makespan_steps + 1e-9;
  const bool memory_closed = closed && closed_form_memory_error(prog.shape).empty();
  for (int d = 0; d < p && closed; ++d) {
    const auto i = static_cast<std::size_t>(d);
    const int want = closed_form_peak_activations(prog.shape, d);
    r.wrong += steps.peak_activations[i] != want || flow.peak_activations[i] != want;
    if (memory_closed) {
      const int memory = closed_form_peak_memory(prog.shape, d);
      r.wrong += steps.peak_memory[i] != memory || flow.peak_memory[i] != memory;
    }
  }
  r.wrong += parse_pytorch_csv(to_pytorch_csv(prog), CsvImportOptions{std::nullopt, std::size_t{1} << 30, 1 << 20})
                 .devices != prog.devices;
  return r;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string right(const std::string& s, std::size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

void print_table(const std::vector<Row>& rows, int warmup, int iters) {
  std::cout << "# pipeweave schedule_bench: " << warmup << " warm-up and " << iters
            << " timed calls per figure; times are this thread's CPU time (one core), means per call, per action and in total.\n"
            << "# bubble ratio = (makespan - busiest device's compute) / that compute; forward 1, backward 2 (I 1 + W 1), "
               "free communication.\n"
            << "# steps: the lowered program under rendezvous (what the executors run); dataflow: the program order's "
               "bound; closed form '-': none for the shape.\n"
            << "# peak act.: forward stashes kept at once; peak mem.: those and the gradients kept for a W (one "
               "activation each).\n"
            << "# fresh: ms to write as many bytes into pages new to the process (one byte per page) as the calls "
               "beside it write (B/act: per action): the lowering; simulate's trace.\n#\n";
  std::cout << "#                                                           ------------ ns per action -------------  "
               "------------------- ms (B/act) -------------------  -------- bubble ratio --------  --- peak act.  --- peak mem.\n";
  std::cout << "#          schedule     P    V      M   actions     steps  generate  lower verify simulate sim.low dataflow  "
               "gen+low+ver  fresh B/act  simulate  fresh B/act     steps  dataflow  closed form     d0   dP-1     d0   dP-1  #wrong\n";
  for (const Row& r : rows) {
    std::cout << right(row_name(r), 20) << right(std::to_string(r.devices), 6)
              << right(std::to_string(r.chunks), 5) << right(std::to_string(r.micro_batches), 7)
              << right(std::to_string(r.actions), 10) << right(std::to_string(r.steps), 10)
              << right(fixed(r.ns_per_action(r.generate_us), 1), 10) << right(fixed(r.ns_per_action(r.lower_us), 1), 7)
              << right(fixed(r.ns_per_action(r.verify_us), 1), 7) << right(fixed(r.ns_per_action(r.simulate_us), 1), 9)
              << right(fixed(r.ns_per_action(r.simulate_lowered_us), 1), 8)
              << right(fixed(r.ns_per_action(r.dataflow_us), 1), 9)
              << right(fixed((r.generate_us + r.lower_us + r.verify_us) / 1e3, 2), 13)
              << right(fixed(r.fresh_lowered_us / 1e3, 2), 7)
              << right(fixed(r.actions > 0 ? r.lowered_bytes / static_cast<double>(r.actions) : 0.0, 0), 6)
              << right(fixed(r.simulate_us / 1e3, 2), 10) << right(fixed(r.fresh_trace_us / 1e3, 2), 7)
              << right(fixed(r.actions > 0 ? r.trace_bytes / static_cast<double>(r.actions) : 0.0, 0), 6)
              << right(fixed(r.bubble_steps, 4), 10)
              << right(fixed(r.bubble_dataflow, 4), 10)
              << right(r.bubble_closed ? fixed(*r.bubble_closed, 4) : std::string("-"), 13)
              << right(std::to_string(r.peak_first), 7) << right(std::to_string(r.peak_last), 7)
              << right(std::to_string(r.memory_first), 7) << right(std::to_string(r.memory_last), 7)
              << right(std::to_string(r.wrong), 8) << "\n";
  }
  int wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  std::cout << "# rows: " << rows.size() << ", #wrong: " << wrong << "\n";
}

std::string json_rows(const std::vector<Row>& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out += std::string(i ? ",\n " : "\n ") + "{\"schedule\":\"" + row_name(r) +
           "\",\"devices\":" + std::to_string(r.devices) + ",\"chunks\":" + std::to_string(r.chunks) +
           ",\"micro_batches\":" + std::to_string(r.micro_batches) + ",\"actions\":" + std::to_string(r.actions) +
           ",\"steps\":" + std::to_string(r.steps) + ",\"generate_us\":" + format_number(r.generate_us) +
           ",\"lower_us\":" + format_number(r.lower_us) + ",\"verify_us\":" + format_number(r.verify_us) +
           ",\"simulate_us\":" + format_number(r.simulate_us) +
           ",\"simulate_lowered_us\":" + format_number(r.simulate_lowered_us) + ",\"dataflow_us\":" + format_number(r.dataflow_us) +
           ",\"lowered_bytes\":" + format_number(r.lowered_bytes) + ",\"fresh_lowered_us\":" + format_number(r.fresh_lowered_us) +
           ",\"trace_bytes\":" + format_number(r.trace_bytes) + ",\"fresh_trace_us\":" + format_number(r.fresh_trace_us) +
           ",\"makespan_steps\":" + format_number(r.makespan_steps) +
           ",\"makespan_dataflow\":" + format_number(r.makespan_dataflow) +
           ",\"bubble_steps\":" + format_number(r.bubble_steps) + ",\"bubble_dataflow\":" +
           format_number(r.bubble_dataflow) + ",\"bubble_closed_form\":" +
           (r.bubble_closed ? format_number(*r.bubble_closed) : std::string("null")) +
           ",\"peak_first\":" + std::to_string(r.peak_first) + ",\"peak_last\":" + std::to_string(r.peak_last) +
           ",\"memory_first\":" + std::to_string(r.memory_first) + ",\"memory_last\":" + std::to_string(r.memory_last) +
           ",\"wrong\":" + std::to_string(r.wrong) + "}";
  }
  return out + "\n]";
}


int usage_error(const std::string& message) { return tool::usage_error("schedule_bench", message); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times making, lowering, verifying and simulating pipeline schedules, reports their bubble ratio and "
               "peak activations checked against the closed forms."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::string> names = tool::schedule_names();
  for (const std::string& name : tool::schedule_names()) names.push_back(name + "+overlap");
  std::vector<std::string> schedules = tool::schedule_names();
  schedules.push_back(tool::default_schedule() + "+overlap");
  std::vector<int> devices = {4, 8}, chunks = {2, 4}, micro_batches = {8, 16, 32, 64};
  int warmup = 2, iters = 10;
  bool json = false;
  app.add_option("--schedules", schedules,
                 "Comma-separated: " + tool::join_words(tool::schedule_names(), ", ") +
                     ", each also as <name>+overlap, its program overlapped (default all, and " +
                     tool::default_schedule() + "+overlap)")
      ->delimiter(',')
      ->check(CLI::IsMember(names));
  app.add_option("--devices", devices, "Comma-separated P values, 1..4096 (default 4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  app.add_option("--chunks", chunks,
                 "Comma-separated V values for " + tool::any_chunks_kinds() + ", 1..64 (default 2,4); " +
                     tool::two_chunks_kinds() + " run with 2, the others with 1")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches", micro_batches,
                 "Comma-separated M values, 1..65536 (default 8,16,32,64); a kind skips the M it does not take "
                 "(M " + tool::micro_batches_help() + ")")
      ->delimiter(',')
      ->check(CLI::Range(1, 65536));
  app.add_option("--warmup", warmup, "Untimed calls before timing, 0..1000 (default 2)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed calls per figure, 1..100000 (default 10)")->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "Print JSON instead of the table");
  if (const auto status = tool::parse(app, argc, argv, "schedule_bench")) return *status;
  struct Config {
    ScheduleKind kind;
    bool overlapped;
    int p, v, m;
  };
  std::vector<Config> configs;
  for (const std::string& name : schedules) {
    const std::size_t plus = name.find('+');
    const ScheduleKind kind = *parse_schedule(name.substr(0, plus));
    const bool overlapped = plus != std::string::npos;
    const bool any_chunks = kind_row(kind).chunks == 0;
    for (int p : devices)
      for (int v : any_chunks ? chunks : std::vector<int>{default_chunks(kind)})
        for (int m : micro_batches)
          if (shape_error({kind, p, v, m, placement_of(kind)}).empty()) configs.push_back({kind, overlapped, p, v, m});
  }
  if (configs.empty())
    return usage_error("no valid configuration in the sweep (M must be " + tool::micro_batches_help() + ")");
  std::vector<Row> rows;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    if (std::chrono::duration<double>(Clock::now() - start).count() > 2)
      std::cerr << "[" << i + 1 << "/" << configs.size() << "] " << schedule_name(c.kind) << " P=" << c.p
                << " V=" << c.v << " M=" << c.m << "\n";
    rows.push_back(measure(c.kind, c.overlapped, c.p, c.v, c.m, warmup, iters));
  }

  int wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (json) {
    std::cout << "{\"warmup\":" << warmup << ",\"iters\":" << iters << ",\"rows\":" << json_rows(rows) << "}\n";
  } else {
    print_table(rows, warmup, iters);
  }
  return wrong > 0 ? 1 : 0;
}
