// synthesis_bench: how close synthesize() comes, over a documented set of cost
// profiles and memory caps, to the best built-in schedule that fits the cap
// and to the lower bound; and what the search costs.
//
//   synthesis_bench                         # every profile, shape and cap: a table
//   synthesis_bench --profiles uniform,zb-1.5b --shapes 4x1x16 --json
//
// Profiles (cost_profiles.hpp; docs/schedules.md says where each comes from):
// uniform, zb-1.5b, last-1.3x and comm-10% by default; uneven on request.
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
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "cost_profiles.hpp"

using namespace pipeweave;
using namespace bench;

int main(int argc, char** argv) {
  CLI::App app{"Synthesized schedules against the best built-in one within a memory cap and against the lower "
               "bound, over cost profiles, shapes and caps."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  const std::vector<std::string> names = profile_names();
  std::string profiles = "uniform,zb-1.5b,last-1.3x,comm-10%", shapes = "4x1x16,4x2x16,4x2x16v,8x2x64";
  long long work = 0;
  bool json = false;
  app.add_option("--profiles", profiles,
                 "Comma-separated: " + tool::join_words(names, ", ") + " (default uniform,zb-1.5b,last-1.3x,comm-10%)");
  app.add_option("--shapes", shapes,
                 "Comma-separated PxVxM, a trailing v for the v placement (default 4x1x16,4x2x16,4x2x16v,8x2x64)");
  app.add_option("--work", work, "The search's budget in simulated actions (default: synthesize()'s)")
      ->check(CLI::Range(0LL, 1LL << 40));
  app.add_flag("--json", json, "The rows as JSON instead of a table");
  if (const auto status = tool::parse(app, argc, argv, "synthesis_bench")) return *status;

  std::string error;
  const std::optional<std::vector<Profile>> chosen = parse_profiles(profiles, error);
  if (!chosen) return tool::usage_error("synthesis_bench", error);
  const std::optional<std::vector<ScheduleShape>> chosen_shapes = parse_shapes(shapes, true, error);
  if (!chosen_shapes) return tool::usage_error("synthesis_bench", error);

  tool::Report report(tool::shape_columns({"profile", "", "profile", 10}, 3,
                                          {{"place", "", "placement", 5},
                                           {"cap", "act", "memory_limit", 5, 0},
                                           {"synth", "", "synthesized", 9, 2},
                                           {"best built-in", "", "builtin", 22},
                                           {"built-in", "", "builtin_makespan", 9, 2},
                                           {"bound", "", "lower_bound", 9, 2},
                                           {"syn/bi", "", "synth_over_builtin", 7, 4},
                                           {"syn/lb", "", "synth_over_bound", 7, 4},
                                           {"peak", "act", "peak_memory", 5, 0},
                                           {"sims", "", "evaluated", 5},
                                           {"cpu_ms", "ms", "search_ms", 8, 1},
                                           {"origin", "", "origin", 0, -1, false}}));
  long long wrong = 0;
  for (const ScheduleShape& s : *chosen_shapes) {
    for (const Profile& prof : *chosen) {
      const CostModel cost = cost_of(prof, s.stages());
      const double base = one_f_one_b_peak(s, cost.memory);
      double free_peak = 0;  // the peak of the search without a cap
      for (const double cap : {base, 2 * base, 0.0}) {
        if (cap < 0 || (cap > 0 && cap < smallest_memory_limit(s, cost.memory))) continue;
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
        const bool fits = bi.fits();
        report.add({prof.name, static_cast<long long>(s.devices), static_cast<long long>(s.chunks),
                    static_cast<long long>(s.micro_batches), std::string(placement_name(s.placement)),
                    cap == 0 ? tool::Cell{std::string("none")} : tool::Cell{cap}, r.makespan,
                    fits ? tool::Cell{bi.name} : tool::Cell{std::string("none fits")},
                    fits ? tool::Cell{bi.makespan} : tool::Cell{}, r.lower_bound,
                    fits ? tool::Cell{r.makespan / bi.makespan} : tool::Cell{}, r.makespan / r.lower_bound,
                    r.peak_memory, static_cast<long long>(r.evaluated), ms, r.origin});
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
