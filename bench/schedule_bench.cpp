// schedule_bench: what schedules cost to make, check and simulate, and what they
// give (bubble ratio, peak activations), with every figure checked against the
// closed forms; optionally, what verify() costs the compiler.
//
//   schedule_bench                                   # the default sweep, a table
//   schedule_bench --schedules interleaved --devices 8 --chunks 2,4 --micro-batches 16,64 --json
//   schedule_bench --compile-time                    # + the largest verify() that compiles
//
// Each row: warm-up calls, then timed calls of make_schedule, lower, verify and
// simulate (both replays); mean time per call. #wrong counts failed checks:
// verification, dataflow bubble = closed form, steps bubble = closed form for
// GPipe and 1F1B (and never below it), peak activations = closed form on every
// device, CSV round trip. Exit status 1 when any row has #wrong > 0.
//
// --compile-time writes a translation unit that static_asserts
// verify(Interleaved1F1B<P, V, M>{}) (or bubble_ratio, --compile-expr), compiles
// it with -fsyntax-only under the default constexpr limits while M doubles, then
// bisects to the largest M that compiles and names the limit that stops the next
// one (-fconstexpr-ops-limit, -fconstexpr-loop-limit or -fconstexpr-depth).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/schedule.hpp"

#ifndef PIPEWEAVE_CXX
#define PIPEWEAVE_CXX "c++"
#endif
#ifndef PIPEWEAVE_INCLUDE_DIR
#define PIPEWEAVE_INCLUDE_DIR "include"
#endif

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

struct Row {
  ScheduleKind kind;
  int devices, chunks, micro_batches;
  long long actions = 0, steps = 0;
  double generate_us = 0, lower_us = 0, verify_us = 0, simulate_us = 0, dataflow_us = 0;
  double bubble_steps = 0, bubble_dataflow = 0, bubble_closed = 0;
  double makespan_steps = 0, makespan_dataflow = 0;
  int peak_first = 0, peak_last = 0;
  int wrong = 0;
};

struct CompileAttempt {
  int micro_batches;
  bool ok;
  double seconds;
  std::string limit;  // the limit named by the compiler, or the first error line
};

// Mean seconds per call of f over `iters` calls after `warmup` calls.
template <class F>
double time_calls(int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double>(Clock::now() - t0).count() / std::max(iters, 1);
}

// Keeps a value alive so that the optimizer cannot drop the call that made it.
template <class T>
void keep(const T& v) {
  asm volatile("" : : "g"(&v) : "memory");
}

Row measure(ScheduleKind kind, int p, int v, int m, int warmup, int iters) {
  Row r{kind, p, v, m};
  const Program prog = make_schedule(kind, p, v, m);
  const LoweredProgram lp = lower(prog);
  r.actions = 2LL * p * v * m;
  for (const auto& d : lp.devices) r.steps += static_cast<long long>(d.size());
  r.generate_us = 1e6 * time_calls(warmup, iters, [&] { keep(make_schedule(kind, p, v, m)); });
  r.lower_us = 1e6 * time_calls(warmup, iters, [&] { keep(lower(prog)); });
  r.verify_us = 1e6 * time_calls(warmup, iters, [&] { keep(verify(prog)); });
  r.simulate_us = 1e6 * time_calls(warmup, iters, [&] { keep(simulate(prog)); });
  const CostModel dataflow = CostModel{}.with_replay(ReplayMode::kDataflow);
  r.dataflow_us = 1e6 * time_calls(warmup, iters, [&] { keep(simulate(prog, dataflow)); });

  const Trace steps = simulate(prog), flow = simulate(prog, dataflow);
  r.bubble_steps = bubble_ratio(steps);
  r.bubble_dataflow = bubble_ratio(flow);
  r.bubble_closed = closed_form_bubble_ratio(prog.shape);
  r.makespan_steps = makespan(steps);
  r.makespan_dataflow = makespan(flow);
  r.peak_first = steps.peak_activations.front();
  r.peak_last = steps.peak_activations.back();
  // The checks behind #wrong.
  r.wrong += !verify(prog);
  r.wrong += std::abs(r.bubble_dataflow - r.bubble_closed) > 1e-9;
  r.wrong += r.bubble_steps < r.bubble_closed - 1e-9;
  if (kind != ScheduleKind::kInterleaved1F1B) r.wrong += std::abs(r.bubble_steps - r.bubble_closed) > 1e-9;
  for (int d = 0; d < p; ++d) {
    const int want = closed_form_peak_activations(prog.shape, d);
    r.wrong += steps.peak_activations[static_cast<std::size_t>(d)] != want ||
               flow.peak_activations[static_cast<std::size_t>(d)] != want;
  }
  r.wrong += parse_pytorch_csv(to_pytorch_csv(prog)).devices != prog.devices;
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
            << " timed calls per figure; times are means per call.\n"
            << "# bubble ratio = (makespan - busiest device's compute) / that compute; forward 1, backward 2, free "
               "communication.\n"
            << "# steps: the lowered program under rendezvous (what the executors run); dataflow: the program order's "
               "bound.\n#\n";
  std::cout << "#                                            ---------- mean time per call (us) ----------  sim rate  "
               "-------- bubble ratio --------  peak act.\n";
  std::cout << "#    schedule    P    V      M  actions    steps  generate     lower    verify  simulate  dataflow  "
               "(Mact/s)     steps  dataflow  closed form  d0  dP-1  #wrong\n";
  for (const Row& r : rows) {
    std::cout << right(std::string(schedule_name(r.kind)), 14) << right(std::to_string(r.devices), 5)
              << right(std::to_string(r.chunks), 5) << right(std::to_string(r.micro_batches), 7)
              << right(std::to_string(r.actions), 9) << right(std::to_string(r.steps), 9)
              << right(fixed(r.generate_us, 1), 10) << right(fixed(r.lower_us, 1), 10)
              << right(fixed(r.verify_us, 1), 10) << right(fixed(r.simulate_us, 1), 10)
              << right(fixed(r.dataflow_us, 1), 10)
              << right(fixed(r.simulate_us > 0 ? r.actions / r.simulate_us : 0.0, 2), 10)
              << right(fixed(r.bubble_steps, 4), 10) << right(fixed(r.bubble_dataflow, 4), 10)
              << right(fixed(r.bubble_closed, 4), 13) << right(std::to_string(r.peak_first), 4)
              << right(std::to_string(r.peak_last), 6) << right(std::to_string(r.wrong), 8) << "\n";
  }
  int wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  std::cout << "# rows: " << rows.size() << ", wrong: " << wrong << "\n";
}

std::string json_rows(const std::vector<Row>& rows) {
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out += std::string(i ? ",\n " : "\n ") + "{\"schedule\":\"" + std::string(schedule_name(r.kind)) +
           "\",\"devices\":" + std::to_string(r.devices) + ",\"chunks\":" + std::to_string(r.chunks) +
           ",\"micro_batches\":" + std::to_string(r.micro_batches) + ",\"actions\":" + std::to_string(r.actions) +
           ",\"steps\":" + std::to_string(r.steps) + ",\"generate_us\":" + format_number(r.generate_us) +
           ",\"lower_us\":" + format_number(r.lower_us) + ",\"verify_us\":" + format_number(r.verify_us) +
           ",\"simulate_us\":" + format_number(r.simulate_us) + ",\"dataflow_us\":" + format_number(r.dataflow_us) +
           ",\"makespan_steps\":" + format_number(r.makespan_steps) +
           ",\"makespan_dataflow\":" + format_number(r.makespan_dataflow) +
           ",\"bubble_steps\":" + format_number(r.bubble_steps) + ",\"bubble_dataflow\":" +
           format_number(r.bubble_dataflow) + ",\"bubble_closed_form\":" + format_number(r.bubble_closed) +
           ",\"peak_first\":" + std::to_string(r.peak_first) + ",\"peak_last\":" + std::to_string(r.peak_last) +
           ",\"wrong\":" + std::to_string(r.wrong) + "}";
  }
  return out + "\n]";
}

// --- compile-time cost -------------------------------------------------------

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Which constexpr limit the compiler's output names; else its first error line.
std::string binding_limit(const std::string& log) {
  for (const char* flag : {"-fconstexpr-ops-limit", "-fconstexpr-loop-limit", "-fconstexpr-depth",
                           "-fconstexpr-cache-depth", "-fconstexpr-steps", "-fconstexpr-backtrace-limit"})
    if (log.find(flag) != std::string::npos) return flag;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos) return line.substr(0, 160);
  return log.empty() ? "failed without a message" : log.substr(0, 160);
}

CompileAttempt compile_once(const std::string& cxx, const std::string& include_dir, const std::string& expr,
                            const std::string& type, int m, const std::filesystem::path& dir) {
  const auto src = dir / "constexpr_cost.cpp";
  const auto log = dir / "constexpr_cost.log";
  {
    std::ofstream out(src);
    out << "#include \"pipeweave/analysis/metrics.hpp\"\n#include \"pipeweave/schedule/verify.hpp\"\n"
        << "using S = " << type << m << ">;\n";
    if (expr == "verify")
      out << "static_assert(pipeweave::verify(S{}), \"verify\");\n";
    else
      out << "static_assert(pipeweave::bubble_ratio(S{}) >= 0, \"bubble_ratio\");\n";
    out << "int main() { return 0; }\n";
  }
  const std::string cmd = cxx + " -std=c++20 -fsyntax-only -I" + shell_quote(include_dir) + " " +
                          shell_quote(src.string()) + " > " + shell_quote(log.string()) + " 2>&1";
  const auto t0 = Clock::now();
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {m, status == 0, seconds, status == 0 ? std::string() : binding_limit(text)};
}

struct CompileResult {
  std::string type;
  std::vector<CompileAttempt> attempts;
  int largest_ok = 0;
  std::string limit;
};

CompileResult compile_search(const std::string& cxx, const std::string& include_dir, const std::string& expr,
                             ScheduleKind kind, int p, int v, int max_m) {
  CompileResult res;
  res.type = kind == ScheduleKind::kInterleaved1F1B
                 ? "pipeweave::Interleaved1F1B<" + std::to_string(p) + ", " + std::to_string(v) + ", "
             : kind == ScheduleKind::kOneFOneB ? "pipeweave::OneFOneB<" + std::to_string(p) + ", "
                                               : "pipeweave::GPipe<" + std::to_string(p) + ", ";
  const int unit = kind == ScheduleKind::kInterleaved1F1B ? p : 1;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pipeweave_bench_" + std::to_string(static_cast<long long>(::getpid())));
  std::filesystem::create_directories(dir);
  auto attempt = [&](int m) {
    std::cerr << "compile-time: " << res.type << m << "> ... " << std::flush;
    CompileAttempt a = compile_once(cxx, include_dir, expr, res.type, m, dir);
    std::cerr << (a.ok ? "compiles" : "fails: " + a.limit) << " (" << fixed(a.seconds, 1) << " s)\n";
    res.attempts.push_back(a);
    return a;
  };
  int good = 0, bad = 0;
  std::string bad_limit;
  for (int m = unit; m <= max_m; m *= 2) {
    const CompileAttempt a = attempt(m);
    if (!a.ok) {
      bad = m;
      bad_limit = a.limit;
      break;
    }
    good = m;
  }
  // Bisect in multiples of `unit` between the last M that compiled and the first that did not.
  while (bad > 0 && good > 0 && bad - good > unit) {
    const int mid = good + ((bad - good) / unit / 2) * unit;
    const CompileAttempt a = attempt(mid);
    if (a.ok) {
      good = mid;
    } else {
      bad = mid;
      bad_limit = a.limit;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  res.largest_ok = good;
  res.limit = bad > 0 ? bad_limit : "none up to M = " + std::to_string(max_m);
  return res;
}

int usage_error(const std::string& message) { return tool::usage_error("schedule_bench", message); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times making, lowering, verifying and simulating pipeline schedules, reports their bubble ratio and "
               "peak activations checked against the closed forms, and optionally what verify() costs the compiler."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved"};
  std::vector<int> devices = {4, 8}, chunks = {2, 4}, micro_batches = {8, 16, 32, 64};
  int warmup = 2, iters = 10, compile_devices = 4, compile_chunks = 2, compile_max_m = 1 << 14;
  bool json = false, compile_time = false;
  std::string cxx = PIPEWEAVE_CXX, include_dir = PIPEWEAVE_INCLUDE_DIR, compile_schedule = "interleaved",
              compile_expr = "verify";
  app.add_option("--schedules", schedules, "Comma-separated: gpipe, 1f1b, interleaved (default all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--devices", devices, "Comma-separated P values, 1..512 (default 4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 512));
  app.add_option("--chunks", chunks, "Comma-separated V values for interleaved, 1..64 (default 2,4)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches", micro_batches,
                 "Comma-separated M values, 1..16384 (default 8,16,32,64); interleaved skips M not a multiple of P")
      ->delimiter(',')
      ->check(CLI::Range(1, 16384));
  app.add_option("--warmup", warmup, "Untimed calls before timing, 0..1000 (default 2)")->check(CLI::Range(0, 1000));
  app.add_option("--iters", iters, "Timed calls per figure, 1..100000 (default 10)")->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "Print JSON instead of the table");
  app.add_flag("--compile-time", compile_time,
               "Also find the largest M whose static_assert compiles under the default constexpr limits (slow: "
               "one compiler run per try)");
  app.add_option("--cxx", cxx, "Compiler for --compile-time (default: the one that built this binary)");
  app.add_option("--include-dir", include_dir, "pipeweave's include directory for --compile-time");
  app.add_option("--compile-schedule", compile_schedule, "Schedule for --compile-time (default interleaved)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  app.add_option("--compile-devices", compile_devices, "P for --compile-time, 1..64 (default 4)")
      ->check(CLI::Range(1, 64));
  app.add_option("--compile-chunks", compile_chunks, "V for --compile-time (interleaved), 1..64 (default 2)")
      ->check(CLI::Range(1, 64));
  app.add_option("--compile-max-m", compile_max_m, "Largest M tried by --compile-time, 1..65536 (default 16384)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--compile-expr", compile_expr,
                 "What the static_assert evaluates: verify or bubble (simulate + bubble_ratio); default verify")
      ->check(CLI::IsMember({"verify", "bubble"}));
  if (const auto status = tool::parse(app, argc, argv, "schedule_bench")) return *status;
  struct Config {
    ScheduleKind kind;
    int p, v, m;
  };
  std::vector<Config> configs;
  for (const std::string& name : schedules) {
    const ScheduleKind kind = *parse_schedule(name);
    for (int p : devices)
      for (int v : kind == ScheduleKind::kInterleaved1F1B ? chunks : std::vector<int>{1})
        for (int m : micro_batches)
          if (shape_error({kind, p, v, m}).empty()) configs.push_back({kind, p, v, m});
  }
  if (configs.empty()) return usage_error("no valid configuration in the sweep (interleaved needs M a multiple of P)");

  std::vector<Row> rows;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    if (std::chrono::duration<double>(Clock::now() - start).count() > 2)
      std::cerr << "[" << i + 1 << "/" << configs.size() << "] " << schedule_name(c.kind) << " P=" << c.p
                << " V=" << c.v << " M=" << c.m << "\n";
    rows.push_back(measure(c.kind, c.p, c.v, c.m, warmup, iters));
  }

  std::vector<CompileResult> compiled;
  if (compile_time) {
    const ScheduleKind kind = *parse_schedule(compile_schedule);
    compiled.push_back(compile_search(cxx, include_dir, compile_expr, kind, compile_devices,
                                      kind == ScheduleKind::kInterleaved1F1B ? compile_chunks : 1, compile_max_m));
  }

  int wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  if (json) {
    std::cout << "{\"warmup\":" << warmup << ",\"iters\":" << iters << ",\"rows\":" << json_rows(rows);
    if (compile_time) {
      const CompileResult& c = compiled.front();
      std::cout << ",\n\"compile_time\":{\"compiler\":" << "\"" << cxx << "\",\"expression\":\"" << compile_expr
                << "\",\"type\":\"" << c.type << "M>\",\"largest_m\":" << c.largest_ok << ",\"binding_limit\":\""
                << c.limit << "\",\"attempts\":[";
      for (std::size_t i = 0; i < c.attempts.size(); ++i)
        std::cout << (i ? "," : "") << "{\"m\":" << c.attempts[i].micro_batches
                  << ",\"ok\":" << (c.attempts[i].ok ? "true" : "false")
                  << ",\"seconds\":" << format_number(c.attempts[i].seconds) << "}";
      std::cout << "]}";
    }
    std::cout << "}\n";
  } else {
    print_table(rows, warmup, iters);
    for (const CompileResult& c : compiled) {
      std::cout << "#\n# compile time of static_assert(" << (compile_expr == "verify" ? "verify" : "bubble_ratio")
                << "(" << c.type << "M>{})) with " << cxx << " -std=c++20 -fsyntax-only, default constexpr limits\n";
      std::cout << "#        M   actions   seconds  result\n";
      for (const CompileAttempt& a : c.attempts) {
        const long long acts = 2LL * compile_devices *
                               (compile_schedule == "interleaved" ? compile_chunks : 1) * a.micro_batches;
        std::cout << right(std::to_string(a.micro_batches), 10) << right(std::to_string(acts), 10)
                  << right(fixed(a.seconds, 2), 10) << "  " << (a.ok ? "compiles" : "fails: " + a.limit) << "\n";
      }
      std::cout << "# largest M that compiles: " << c.largest_ok << "; the limit that stops the next: " << c.limit
                << "\n";
    }
  }
  return wrong > 0 ? 1 : 0;
}
