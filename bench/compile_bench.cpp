// compile_bench: what a compile-time schedule costs the compiler. It writes a
// translation unit that static_asserts verify(Interleaved1F1B<P, V, M>{}) (or
// bubble_ratio, --expr bubble) and compiles it with -fsyntax-only under each
// compiler's default constexpr limits.
//
//   compile_bench                                  # g++ and clang++, P x V = 8x4 and 16x4
//   compile_bench --compilers g++ --shapes 4x2 --max-actions 4096
//   compile_bench --budget 32 --shapes 8x4         # the constexpr bound each evaluation needs
//
// The default question: the largest M that compiles. Per compiler and P x V of
// --shapes, M doubles from P up to --max-actions actions, then bisects below the
// first M that does not compile; each try reports its seconds, the compiler's
// peak memory and, where it fails, the limit that stopped it. A first row per
// compiler (M = 0) compiles the headers alone.
//
// --budget M: where the constant-evaluation budget goes. Per compiler and P x V,
// the smallest bound (GCC's -fconstexpr-ops-limit, Clang's -fconstexpr-steps)
// under which a static_assert on Interleaved1F1B<P, V, M> still compiles, for its
// actions alone, its lowering (the largest of its chunks) and verify() (the
// largest of all its evaluations), found by bisection; per action and as a share
// of the compiler's default. Exit status 1 when a shape never compiles.
#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/tool.hpp"

#ifndef PIPEWEAVE_INCLUDE_DIR
#define PIPEWEAVE_INCLUDE_DIR "include"
#endif

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

// One run of a command: exit status (-1 when killed at the time limit), wall
// seconds, peak memory of the process, and what it printed.
struct CommandRun {
  int status = -1;
  double seconds = 0;
  long peak_kb = 0;
  std::string output;
};

CommandRun run_command(const std::vector<std::string>& argv, double timeout_s, const std::filesystem::path& log) {
  CommandRun r;
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  for (;;) {
    const pid_t done = wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &usage);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.peak_kb = usage.ru_maxrss;
  r.status = status == -1 ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  std::ifstream in(log);
  r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

// A command on PATH (the first word of `command`), or an empty string.
std::string on_path(const std::string& command) {
  const std::string name = command.substr(0, command.find(' '));
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string full = dir + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

// What stopped a compile: the constexpr limit its output names, a timeout, or its first error line.
std::string binding_limit(const CommandRun& r) {
  if (r.status == -1) return "time limit";
  for (const char* flag : {"-fconstexpr-ops-limit", "-fconstexpr-loop-limit", "-fconstexpr-depth",
                           "-fconstexpr-cache-depth", "-fconstexpr-steps", "maximum step limit"})
    if (r.output.find(flag) != std::string::npos) return flag;
  if (r.output.find("memory") != std::string::npos) return "memory";
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos) return line.substr(0, 160);
  return r.output.empty() ? "failed without a message (status " + std::to_string(r.status) + ")" : r.output.substr(0, 160);
}

long long actions_of(int p, int v, int m) { return 2LL * p * v * m; }

struct CompileSetup {
  std::string include_dir, expr;
  double timeout_s;
  std::filesystem::path dir;
};

// Compiles a translation unit that includes the schedule and analysis headers
// and then holds `body`; extra compiler arguments after the standard ones.
CommandRun compile_body(const CompileSetup& c, const std::string& cxx, const std::string& body,
                        const std::vector<std::string>& extra = {}) {
  const auto src = c.dir / "constexpr_cost.cpp";
  {
    std::ofstream out(src);
    out << "#include \"pipeweave/analysis/metrics.hpp\"\n#include \"pipeweave/schedule/verify.hpp\"\n" << body
        << "int main() { return 0; }\n";
  }
  std::vector<std::string> argv;
  std::istringstream words(cxx);
  for (std::string w; words >> w;) argv.push_back(w);
  for (const std::string& a : {std::string("-std=c++20"), std::string("-fsyntax-only"), "-I" + c.include_dir}) argv.push_back(a);
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(src.string());
  return run_command(argv, c.timeout_s, c.dir / "constexpr_cost.log");
}

std::string schedule_type(int p, int v, int m) {
  return "pipeweave::Interleaved1F1B<" + std::to_string(p) + ", " + std::to_string(v) + ", " + std::to_string(m) + ">";
}

struct CompileAttempt {
  std::string compiler;
  int devices = 0, chunks = 0, micro_batches = 0;  // 0: the headers alone
  bool ok = false;
  double seconds = 0;
  long peak_kb = 0;
  std::string limit;
};

CompileAttempt compile_once(const CompileSetup& c, const std::string& cxx, int p, int v, int m) {
  std::string body;
  if (m > 0) {
    body = "using S = " + schedule_type(p, v, m) + ";\n";
    body += c.expr == "verify" ? "static_assert(pipeweave::verify(S{}), \"verify\");\n"
                               : "static_assert(pipeweave::bubble_ratio(S{}) >= 0, \"bubble_ratio\");\n";
  }
  const CommandRun r = compile_body(c, cxx, body);
  return {cxx, p, v, m, r.status == 0, r.seconds, r.peak_kb, r.status == 0 ? std::string() : binding_limit(r)};
}

// The largest M (a multiple of P) whose static_assert compiles: M doubles from
// P up to `max_actions` actions, then bisects below the first M that fails.
std::vector<CompileAttempt> compile_search(const CompileSetup& c, const std::string& cxx, int p, int v,
                                           long long max_actions) {
  std::vector<CompileAttempt> tries;
  auto attempt = [&](int m) {
    std::cerr << "compile_bench: " << cxx << " " << schedule_type(p, v, m) << " ... " << std::flush;
    CompileAttempt a = compile_once(c, cxx, p, v, m);
    std::cerr << (a.ok ? "compiles" : "fails: " + a.limit) << " (" << std::fixed << std::setprecision(1) << a.seconds
              << " s, " << a.peak_kb / 1024 << " MB)\n";
    tries.push_back(a);
    return a.ok;
  };
  int good = 0, bad = 0;
  for (int m = p; actions_of(p, v, m) <= max_actions; m *= 2) {
    if (!attempt(m)) {
      bad = m;
      break;
    }
    good = m;
  }
  while (bad > 0 && good > 0 && bad - good > p) {
    const int mid = good + ((bad - good) / p / 2) * p;
    if (attempt(mid)) good = mid;
    else bad = mid;
  }
  return tries;
}

// The smallest constexpr bound under which each evaluation of a schedule compiles.
struct BudgetRow {
  std::string compiler, what;
  int devices, chunks, micro_batches;
  long long bound = -1;  // -1: not found below 2^40
  long long default_bound = 0;
};

std::vector<BudgetRow> compile_budget(const CompileSetup& c, const std::string& cxx, int p, int v, int m) {
  const bool clang = cxx.find("clang") != std::string::npos;
  const std::string flag = clang ? "-fconstexpr-steps=" : "-fconstexpr-ops-limit=";
  const long long default_bound = clang ? 1LL << 20 : 1LL << 25;
  const std::string type = "using S = " + schedule_type(p, v, m) + ";\n";
  const std::vector<std::pair<std::string, std::string>> exprs = {
      {"actions", "static_assert(S::actions.size() > 0);\n"},
      {"lowering", "static_assert(S::lowered().complete);\n"},
      {"verify", "static_assert(pipeweave::verify(S{}));\n"}};
  std::vector<BudgetRow> rows;
  for (const auto& [what, assertion] : exprs) {
    auto fits = [&](long long bound) { return compile_body(c, cxx, type + assertion, {flag + std::to_string(bound)}).status == 0; };
    long long lo = 0, hi = 1 << 14;
    while (!fits(hi) && hi < (1LL << 40)) lo = hi, hi *= 4;
    BudgetRow row{cxx, what, p, v, m, -1, default_bound};
    if (hi < (1LL << 40)) {
      while (hi - lo > std::max(1LL, hi / 256)) {
        const long long mid = lo + (hi - lo) / 2;
        (fits(mid) ? hi : lo) = mid;
      }
      row.bound = hi;
    }
    std::cerr << "compile_bench: " << cxx << " " << schedule_type(p, v, m) << " " << what << ": " << row.bound << "\n";
    rows.push_back(row);
  }
  return rows;
}

tool::Report search_report(const std::vector<CompileAttempt>& tries) {
  tool::Report report(tool::shape_columns({"compiler", "", "compiler", 12}, 5,
                                          {{"actions", "", "actions", 9},
                                           {"seconds", "s", "seconds", 8, 2},
                                           {"peak", "MB", "peak_mb", 8},
                                           {"result", "", "result", 8}}));
  for (const CompileAttempt& a : tries)
    report.add({a.compiler, static_cast<long long>(a.devices), static_cast<long long>(a.chunks),
                static_cast<long long>(a.micro_batches), actions_of(a.devices, a.chunks, a.micro_batches), a.seconds,
                static_cast<long long>(a.peak_kb / 1024), a.ok ? std::string("compiles") : "fails: " + a.limit});
  return report;
}

// The largest M that compiled, per compiler and shape, as comment lines.
std::vector<std::string> largest_lines(const std::vector<CompileAttempt>& tries) {
  std::map<std::tuple<std::string, int, int>, int> largest;
  for (const CompileAttempt& a : tries)
    if (a.micro_batches > 0) {
      int& m = largest[{a.compiler, a.devices, a.chunks}];
      if (a.ok) m = std::max(m, a.micro_batches);
    }
  std::vector<std::string> lines;
  for (const auto& [key, m] : largest) {
    const auto& [compiler, p, v] = key;
    lines.push_back(compiler + ": largest M that compiles for P=" + std::to_string(p) + ", V=" + std::to_string(v) +
                    ": " + std::to_string(m) + " (" + std::to_string(actions_of(p, v, m)) + " actions)");
  }
  return lines;
}

tool::Report budget_report(const std::vector<BudgetRow>& rows) {
  tool::Report report(tool::shape_columns({"compiler", "", "compiler", 12}, 5,
                                          {{"actions", "", "actions", 9},
                                           {"evaluation", "", "evaluation", 10},
                                           {"bound", "", "bound", 12},
                                           {"per_action", "", "bound_per_action", 11, 0},
                                           {"of_default", "%", "percent_of_default", 10, 1}}));
  for (const BudgetRow& r : rows) {
    const long long actions = actions_of(r.devices, r.chunks, r.micro_batches);
    const bool found = r.bound >= 0;
    report.add({r.compiler, static_cast<long long>(r.devices), static_cast<long long>(r.chunks),
                static_cast<long long>(r.micro_batches), actions, r.what, found ? tool::Cell(r.bound) : tool::Cell(),
                found ? tool::Cell(static_cast<double>(r.bound) / static_cast<double>(actions)) : tool::Cell(),
                found ? tool::Cell(100.0 * static_cast<double>(r.bound) / static_cast<double>(r.default_bound))
                      : tool::Cell()});
  }
  return report;
}

int usage_error(const std::string& message) { return tool::usage_error("compile_bench", message); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures what static_assert(verify(Interleaved1F1B<P, V, M>{})) costs GCC and Clang: the largest M "
               "that compiles under the default constexpr limits, or (--budget) the bound each evaluation needs."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::string> compilers, shape_texts = {"8x4", "16x4"};
  long long max_actions = 32768;
  int budget_m = 0;
  double timeout = 600;
  bool json = false;
  std::string include_dir = PIPEWEAVE_INCLUDE_DIR, expr = "verify";
  app.add_option("--compilers", compilers, "Comma-separated compiler commands (default: g++ and clang++, those on PATH)")
      ->delimiter(',');
  app.add_option("--shapes", shape_texts, "Comma-separated PxV, P and V in 1..64 (default 8x4,16x4)")->delimiter(',');
  app.add_option("--max-actions", max_actions, "Largest number of actions the search tries, 1..1048576 (default 32768)")
      ->check(CLI::Range(1LL, 1LL << 20));
  app.add_option("--budget", budget_m,
                 "Instead of the search: the smallest constexpr bound under which the actions, the lowering and "
                 "verify() of Interleaved1F1B<P, V, M> compile, for this M (a multiple of every P; slow)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--timeout", timeout, "Seconds one compile may take, 1..3600 (default 600)")->check(CLI::Range(1.0, 3600.0));
  app.add_option("--include-dir", include_dir, "pipeweave's include directory (default: this source tree's)");
  app.add_option("--expr", expr, "What the search's static_assert evaluates: verify or bubble (simulate + bubble_ratio); "
                                 "default verify")
      ->check(CLI::IsMember({"verify", "bubble"}));
  app.add_flag("--json", json, "Print JSON instead of the table");
  if (const auto status = tool::parse(app, argc, argv, "compile_bench")) return *status;

  std::vector<std::pair<int, int>> shapes;
  for (const std::string& text : shape_texts) {
    int p = 0, v = 0;
    char x = 0;
    std::istringstream in(text);
    if (!(in >> p >> x >> v) || x != 'x' || p < 1 || v < 1 || p > 64 || v > 64 || !in.eof())
      return usage_error("--shapes takes PxV with P and V in 1..64, e.g. 8x4 (got '" + text + "')");
    if (budget_m > 0 && budget_m % p != 0)
      return usage_error("--budget: M (" + std::to_string(budget_m) + ") must be a multiple of P (" +
                         std::to_string(p) + ")");
    shapes.push_back({p, v});
  }
  if (compilers.empty()) {
    for (const char* c : {"g++", "clang++"})
      if (!on_path(c).empty()) compilers.push_back(c);
    if (compilers.empty()) return usage_error("found neither g++ nor clang++ on PATH; name one with --compilers");
  }
  for (const std::string& c : compilers)
    if (on_path(c).empty()) return usage_error("--compilers: '" + c + "' is not on PATH");
  if (!std::filesystem::exists(std::filesystem::path(include_dir) / "pipeweave" / "schedule.hpp"))
    return usage_error("--include-dir: '" + include_dir + "' holds no pipeweave/schedule.hpp");

  CompileSetup setup{include_dir, expr, timeout,
                     std::filesystem::temp_directory_path() /
                         ("pipeweave_compile_bench_" + std::to_string(static_cast<long long>(::getpid())))};
  std::filesystem::create_directories(setup.dir);
  std::vector<CompileAttempt> tries;
  std::vector<BudgetRow> budget;
  for (const std::string& cxx : compilers) {
    if (budget_m == 0) tries.push_back(compile_once(setup, cxx, 0, 0, 0));
    for (const auto& [p, v] : shapes) {
      if (budget_m > 0) {
        const std::vector<BudgetRow> rows = compile_budget(setup, cxx, p, v, budget_m);
        budget.insert(budget.end(), rows.begin(), rows.end());
      } else {
        const std::vector<CompileAttempt> more = compile_search(setup, cxx, p, v, max_actions);
        tries.insert(tries.end(), more.begin(), more.end());
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(setup.dir, ec);

  // A shape that never compiles (not even its smallest M, or no bound below 2^40) fails the run.
  long long never = 0;
  if (budget_m > 0) {
    never = std::count_if(budget.begin(), budget.end(), [](const BudgetRow& r) { return r.bound < 0; });
    const tool::Report report = budget_report(budget);
    if (json) std::cout << report.json("compile_bench", {{"budget_micro_batches", std::to_string(budget_m)}});
    else
      std::cout << report.text({"pipeweave compile_bench --budget " + std::to_string(budget_m) +
                                    ": the smallest constexpr bound (g++: -fconstexpr-ops-limit operations, default "
                                    "2^25; clang++: -fconstexpr-steps steps, default 2^20)",
                                "under which static_assert on Interleaved1F1B<P, V, M> compiles: its actions alone, its "
                                "lowering, verify(); per action, and as a share of the default"},
                               tool::wrong_footer("evaluations that never compiled", never));
  } else {
    for (const CompileAttempt& a : tries)
      if (a.micro_batches > 0 && a.micro_batches == a.devices && !a.ok) ++never;
    const tool::Report report = search_report(tries);
    if (json) std::cout << report.json("compile_bench", {{"expression", tool::json_string(expr)}});
    else {
      std::vector<std::string> comments = {
          "pipeweave compile_bench: static_assert(" + std::string(expr == "verify" ? "verify" : "bubble_ratio") +
              "(Interleaved1F1B<P, V, M>{})) with -std=c++20 -fsyntax-only and each compiler's default constexpr "
              "limits;",
          "M doubles up to " + std::to_string(max_actions) +
              " actions, then bisects below the first M that fails; M = 0: the headers alone"};
      std::vector<std::string> footer = largest_lines(tries);
      std::string text = report.text(comments, tool::wrong_footer("shapes whose smallest M did not compile", never));
      for (const std::string& line : footer) text += "# " + line + "\n";
      std::cout << text;
    }
  }
  return never > 0 ? 1 : 0;
}
