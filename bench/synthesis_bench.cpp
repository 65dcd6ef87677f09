// synthesis_bench: how close synthesize() comes, over a documented set of cost
// profiles and memory caps, to the best built-in schedule that fits the cap
// and to the lower bound; and what the search costs.
//
//   synthesis_bench                         # every profile, shape and cap: a table
//   synthesis_bench --profiles uniform,zb-1.5b --shapes 4x1x16 --json
//
// Profiles (docs/schedules.md says where each comes from):
// - uniform: F 1, B 2 (I 1, W 1), free communication;
// - zb-1.5b: the zero-bubble paper's measured times of its 1.5B model (p 8,
//   m 24): F 18.522, I 18.086, W 9.337 (Qi et al., appendix D), free communication;
// - last-1.3x: uniform, the last stage 1.3 times slower (it carries the loss);
// - comm-10%: uniform, every transfer 0.1 (10% of F).
// Caps: 1F1B's peak memory (1F1B for V = 1, interleaved 1F1B for V > 1, of the
// same P, V and M), twice that, and none.
//
// Each row: the synthesized makespan (the lowered steps' replay, as the
// executors run them), the fastest built-in order that fits the cap (all eight
// kinds of the shape's placement, each with and without overlapped pairs,
// simulated here, not taken from the search), the lower bound, syn/built-in and
// syn/bound, the peak memory, the programs simulated and the search's CPU time on
// one core. #wrong counts rows where the synthesized program fails verify(),
// passes the cap, is slower than a built-in that fits, or, where a zero bubble
// is within reach (free communication, and no cap or one at least the peak of
// the search without one), is more than 2% above the bound. Under the steps
// replay every group of transfers holds both of its devices for its latency, so
// no device computes all the time where transfers cost: no zero bubble there.
// Exit status 1 when #wrong > 0.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/schedule.hpp"

namespace {

using namespace pipeweave;

struct Profile {
  std::string name;
  StageCost cost;           // every stage's
  double last_factor = 1;   // the last stage's costs times this
  double latency = 0;       // every transfer
};

const std::vector<Profile> kProfiles = {
    {"uniform", {1, -1, 1, 1}},
    {"zb-1.5b", {18.522, -1, 18.086, 9.337}},
    {"last-1.3x", {1, -1, 1, 1}, 1.3},
    {"comm-10%", {1, -1, 1, 1}, 1, 0.1},
};

CostModel cost_of(const Profile& p, int stages) {
  CostModel c;
  c.stage_costs.assign(static_cast<std::size_t>(stages), p.cost);
  StageCost& last = c.stage_costs.back();
  for (const Phase ph : compute_phases())
    if (last[ph] > 0) last[ph] *= p.last_factor;
  c.p2p_latency = p.latency;
  return c;
}

template <class T>
T most(const std::vector<T>& v) { return v.empty() ? T{} : *std::max_element(v.begin(), v.end()); }

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

struct Builtin {
  std::string name;
  double makespan = std::numeric_limits<double>::infinity();
};

// The fastest built-in order of the shape's placement within `cap` (0: none), with and without pairs.
Builtin best_builtin(const ScheduleShape& s, const CostModel& cost, int cap) {
  Builtin best;
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, s.placement};
    if (!shape_error(ks).empty()) continue;
    const Program p = make_program(ks);
    for (const bool paired : {false, true}) {
      const Trace t = simulate(paired ? overlap(p) : p, cost);
      if ((cap == 0 || most(t.peak_memory) <= cap) && makespan(t) < best.makespan)
        best = {std::string(schedule_name(k)) + (paired ? "+overlap" : ""), makespan(t)};
    }
  }
  return best;
}

// 1F1B's peak memory for the shape: 1F1B at V = 1, interleaved 1F1B above, loop placement.
int one_f_one_b_peak(const ScheduleShape& s) {
  const ScheduleKind k = s.chunks == 1 ? ScheduleKind::kOneFOneB : ScheduleKind::kInterleaved1F1B;
  const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, Placement::kLoop};
  if (!shape_error(ks).empty()) return 0;
  return most(peak_memory(make_program(ks)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Synthesized schedules against the best built-in one within a memory cap and against the lower "
               "bound, over cost profiles, shapes and caps."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::string> names;
  for (const Profile& p : kProfiles) names.push_back(p.name);
  std::string profiles = tool::join_words(names, ",", ","), shapes = "4x1x16,4x2x16,4x2x16v,8x2x64";
  long long work = 0;
  bool json = false;
  app.add_option("--profiles", profiles, "Comma-separated: " + tool::join_words(names, ", ") + " (default all)");
  app.add_option("--shapes", shapes,
                 "Comma-separated PxVxM, a trailing v for the v placement (default 4x1x16,4x2x16,4x2x16v,8x2x64)");
  app.add_option("--work", work, "The search's budget in simulated actions (default: synthesize()'s)")
      ->check(CLI::Range(0LL, 1LL << 40));
  app.add_flag("--json", json, "The rows as JSON instead of a table");
  if (const auto status = tool::parse(app, argc, argv, "synthesis_bench")) return *status;

  std::vector<Profile> chosen;
  for (const std::string& n : tool::split(profiles)) {
    const auto it = std::find_if(kProfiles.begin(), kProfiles.end(), [&](const Profile& p) { return p.name == n; });
    if (it == kProfiles.end())
      return tool::usage_error("synthesis_bench", "--profiles: no profile is called '" + n + "'; the profiles are " +
                                                      tool::join_words(names));
    chosen.push_back(*it);
  }
  std::vector<ScheduleShape> chosen_shapes;
  for (const std::string& text : tool::split(shapes)) {
    int P = 0, V = 0, M = 0;
    char v = 0;
    const int n = std::sscanf(text.c_str(), "%dx%dx%d%c", &P, &V, &M, &v);
    if (n < 3 || (n == 4 && v != 'v') || P < 1 || V < 1 || M < 1 || P > 64 || V > 8 || M > 1024)
      return tool::usage_error("synthesis_bench", "--shapes: '" + text +
                                                      "' is not PxVxM (P 1..64, V 1..8, M 1..1024), with a trailing v "
                                                      "for the v placement");
    chosen_shapes.push_back({ScheduleKind::kAuto, P, V, M, n == 4 ? Placement::kV : Placement::kLoop});
  }

  tool::Report report(tool::shape_columns({"profile", "", "profile", 10}, 3,
                                          {{"place", "", "placement", 5},
                                           {"cap", "act", "memory_limit", 5},
                                           {"synth", "", "synthesized", 9, 2},
                                           {"best built-in", "", "builtin", 22},
                                           {"built-in", "", "builtin_makespan", 9, 2},
                                           {"bound", "", "lower_bound", 9, 2},
                                           {"syn/bi", "", "synth_over_builtin", 7, 4},
                                           {"syn/lb", "", "synth_over_bound", 7, 4},
                                           {"peak", "act", "peak_memory", 5},
                                           {"sims", "", "evaluated", 5},
                                           {"cpu_ms", "ms", "search_ms", 8, 1},
                                           {"origin", "", "origin", 0, -1, false}}));
  long long wrong = 0;
  for (const ScheduleShape& s : chosen_shapes) {
    for (const Profile& prof : chosen) {
      const CostModel cost = cost_of(prof, s.stages());
      const int base = one_f_one_b_peak(s);
      int free_peak = 0;  // the peak of the search without a cap
      for (const int cap : {base, 2 * base, 0}) {
        if (cap < 0 || (cap > 0 && cap < smallest_memory_limit(s))) continue;
        const double t0 = cpu_ms();
        const Synthesis r = synthesize(s, cost, {.memory = cap, .work = work});
        const double ms = cpu_ms() - t0;
        if (cap == 0) free_peak = r.peak_memory;
        const Builtin bi = best_builtin(s, cost, cap);
        const Trace t = simulate(r.program, cost);
        bool ok = verify(r.program) && (cap == 0 || most(t.peak_memory) <= cap) &&
                  makespan(t) <= bi.makespan * (1 + 1e-9) && makespan(t) >= r.lower_bound * (1 - 1e-9);
        // A zero bubble is within reach with free communication (a group of transfers holds its devices) and no
        // cap, or one as large as the search used without.
        const bool reachable = prof.latency == 0 && (cap == 0 || (free_peak > 0 && cap >= free_peak));
        if (reachable) ok = ok && makespan(t) <= 1.02 * r.lower_bound;
        wrong += ok ? 0 : 1;
        const bool fits = bi.makespan < std::numeric_limits<double>::infinity();
        report.add({prof.name, static_cast<long long>(s.devices), static_cast<long long>(s.chunks),
                    static_cast<long long>(s.micro_batches), std::string(placement_name(s.placement)),
                    cap == 0 ? tool::Cell{std::string("none")} : tool::Cell{static_cast<long long>(cap)}, r.makespan,
                    fits ? tool::Cell{bi.name} : tool::Cell{std::string("none fits")},
                    fits ? tool::Cell{bi.makespan} : tool::Cell{}, r.lower_bound,
                    fits ? tool::Cell{r.makespan / bi.makespan} : tool::Cell{}, r.makespan / r.lower_bound,
                    static_cast<long long>(r.peak_memory), static_cast<long long>(r.evaluated), ms, r.origin});
      }
    }
  }
  if (json) {
    std::cout << report.json("synthesis_bench", {{"wrong", std::to_string(wrong)}});
  } else {
    std::cout << report.text({"synthesis_bench: synthesize() against the best built-in within the cap and the lower bound",
                              "makespans under the lowered steps' replay; cap in activations per device (peak memory); "
                              "cpu_ms: the search on one core"},
                             tool::wrong_footer("rows checked (verified, within the cap, <= built-in, >= bound; "
                                                "<= 1.02 x bound where a zero bubble is within reach)",
                                                wrong));
  }
  return wrong == 0 ? 0 : 1;
}
