// recompute_bench: what synthesize() gains under memory caps by choosing which
// micro-batches to recompute, or to offload to host memory, against a
// built-in order that recomputes every micro-batch (Megatron-LM's uniform full
// recomputation) and against itself with no cap.
//
//   recompute_bench                        # every profile, shape and cap: a table
//   recompute_bench --profiles uniform --shapes 4x1x16 --json
//
// Profiles (cost_profiles.hpp): uniform, last-1.3x, zb-1.5b and uneven by
// default; comm-10% on request.
// Caps: the peak memory of the synthesized program with no cap, half of 1F1B's
// peak (interleaved 1F1B's where V > 1), and a quarter of it; a cap below the
// smallest any program meets, recomputing, is left out.
//
// Each row: the synthesized makespan with recomputation allowed and the
// micro-batches it recomputes; (a) the fastest built-in order with every
// micro-batch of every stage recomputed that fits the cap (each kind of the
// shape's placement, with and without overlapped pairs); (b) the synthesized
// makespan with no cap; a/syn (how many times faster than (a)) and syn/b;
// then the synthesized makespan with offload allowed too (copies on each
// device's copy lane at --copy-bandwidth, default one activation per forward),
// the stashes it offloads and its ratio to (b).
// #wrong counts rows whose program fails verify(), passes the cap, or is
// slower than (a) or than any built-in order without recomputation that fits.
// Exit status 1 when #wrong > 0.
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "cost_profiles.hpp"

using namespace pipeweave;
using namespace bench;

int main(int argc, char** argv) {
  CLI::App app{"Synthesis that recomputes under memory caps, against a built-in order with uniform full "
               "recomputation and against synthesis with no cap, over cost profiles, shapes and caps."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  const std::vector<std::string> names = profile_names();
  std::string profiles = "uniform,last-1.3x,zb-1.5b,uneven", shapes = "4x1x16,4x2x16,8x1x32";
  long long work = 0;
  double copy_bandwidth = 1;
  bool json = false;
  app.add_option("--profiles", profiles,
                 "Comma-separated: " + tool::join_words(names, ", ") + " (default uniform,last-1.3x,zb-1.5b,uneven)");
  app.add_option("--shapes", shapes, "Comma-separated PxVxM (default 4x1x16,4x2x16,8x1x32)");
  app.add_option("--work", work, "The search's budget in simulated actions (default: synthesize()'s)")
      ->check(CLI::Range(0LL, 1LL << 40));
  app.add_option("--copy-bandwidth", copy_bandwidth,
                 "The copy lane's bandwidth for the offload column, in the profile's memory unit per time unit "
                 "(default 1: a copy of one activation as long as a uniform forward; 0: unlimited)")
      ->check(CLI::Range(0.0, 1e300));
  app.add_flag("--json", json, "The rows as JSON instead of a table");
  if (const auto status = tool::parse(app, argc, argv, "recompute_bench")) return *status;

  std::string error;
  const std::optional<std::vector<Profile>> chosen = parse_profiles(profiles, error);
  if (!chosen) return tool::usage_error("recompute_bench", error);
  const std::optional<std::vector<ScheduleShape>> chosen_shapes = parse_shapes(shapes, false, error);
  if (!chosen_shapes) return tool::usage_error("recompute_bench", error);

  tool::Report report(tool::shape_columns({"profile", "", "profile", 10}, 3,
                                          {{"cap", "", "memory_limit", 7, 3},
                                           {"synth", "", "synthesized", 9, 2},
                                           {"C", "", "recomputed", 4},
                                           {"(a) uniform recompute", "", "uniform", 26},
                                           {"(a)", "", "uniform_makespan", 9, 2},
                                           {"a/syn", "", "uniform_over_synth", 6, 3},
                                           {"(b) no cap", "", "no_cap", 9, 2},
                                           {"syn/b", "", "synth_over_no_cap", 6, 3},
                                           {"peak", "", "peak_memory", 7, 3},
                                           {"+offload", "", "with_offload", 9, 2},
                                           {"O", "", "offloaded", 4},
                                           {"+O/b", "", "with_offload_over_no_cap", 6, 3},
                                           {"cpu_ms", "ms", "search_ms", 8, 1}}));
  long long wrong = 0, gains = 0, recomputing = 0, halves = 0, halves_near = 0;
  for (const ScheduleShape& s : *chosen_shapes) {
    for (const Profile& prof : *chosen) {
      const CostModel cost = cost_of(prof, s.stages());
      CostModel copying = cost;
      copying.copy_bandwidth = copy_bandwidth;
      const Synthesis free = synthesize(s, cost, {.work = work});
      const double base = one_f_one_b_peak(s, cost.memory), least = smallest_memory_limit(s, cost.memory, true);
      for (const double cap : {free.peak_memory, base / 2, base / 4}) {
        if (cap < least) continue;
        const double t0 = cpu_ms();
        const Synthesis r = synthesize(s, cost, {.memory = cap, .recompute = true, .work = work});
        const double ms = cpu_ms() - t0;
        const Builtin uniform = best_builtin(s, cost, cap, true), plain = best_builtin(s, cost, cap, false);
        const Trace t = simulate(r.program, cost);
        const bool ok = verify(r.program) && most(t.peak_memory) <= cap * (1 + 1e-12) &&
                        makespan(t) <= uniform.makespan * (1 + 1e-9) && makespan(t) <= plain.makespan * (1 + 1e-9);
        wrong += ok ? 0 : 1;
        const Synthesis o = synthesize(s, copying, {.memory = cap, .recompute = true, .offload = true, .work = work});
        const Trace to = simulate(o.program, copying);
        wrong += verify(o.program) && most(to.peak_memory) <= cap * (1 + 1e-12) && makespan(to) == o.makespan &&
                         o.makespan <= r.makespan * (1 + 1e-9)
                     ? 0
                     : 1;
        if (cap == base / 2) {
          ++halves;
          halves_near += o.makespan <= 1.05 * free.makespan ? 1 : 0;
        }
        const bool fits = uniform.fits();
        if (fits && cap < free.peak_memory) {
          ++recomputing;
          gains += uniform.makespan >= 1.15 * r.makespan ? 1 : 0;
        }
        report.add({prof.name, static_cast<long long>(s.devices), static_cast<long long>(s.chunks),
                    static_cast<long long>(s.micro_batches), cap, r.makespan,
                    static_cast<long long>(recomputations(r.program)),
                    fits ? tool::Cell{uniform.name} : tool::Cell{std::string("none fits")},
                    fits ? tool::Cell{uniform.makespan} : tool::Cell{}, fits ? tool::Cell{uniform.makespan / r.makespan} : tool::Cell{},
                    free.makespan, r.makespan / free.makespan, r.peak_memory, o.makespan,
                    static_cast<long long>(offloads(o.program)), o.makespan / free.makespan, ms});
      }
    }
  }
  if (json) {
    std::cout << report.json("recompute_bench", {{"wrong", std::to_string(wrong)},
                                                 {"rows_1_15x_over_uniform", std::to_string(gains)},
                                                 {"rows_below_no_cap_peak_with_uniform", std::to_string(recomputing)},
                                                 {"rows_at_half_1f1b", std::to_string(halves)},
                                                 {"rows_at_half_1f1b_offload_within_5pct", std::to_string(halves_near)}});
  } else {
    std::cout << report.text({"recompute_bench: synthesize() recomputing under a memory cap, against (a) the fastest "
                              "built-in with uniform full recomputation that fits and (b) synthesis with no cap",
                              "makespans under the lowered steps' replay; cap and peak in the profile's memory unit "
                              "(activations, or layer tensors for uneven); C: micro-batches recomputed; cpu_ms: the "
                              "search on one core",
                              "rows below the no-cap peak where (a) fits: " + std::to_string(recomputing) +
                                  "; of them at least 1.15x faster than (a): " + std::to_string(gains),
                              "+offload: synthesized with recomputation and offload allowed, copies at " +
                                  format_decimal(copy_bandwidth, 3) + " units per time unit (0: unlimited); O: stashes "
                                  "offloaded; rows at half of 1F1B's peak: " + std::to_string(halves) +
                                  "; of them +offload within 5% of (b): " + std::to_string(halves_near)},
                             tool::wrong_footer("rows checked (verified, within the cap, <= (a), <= every built-in "
                                                "without recomputation that fits; +offload verified, within the cap, "
                                                "its makespan simulated again, <= synth)",
                                                wrong));
  }
  return wrong == 0 ? 0 : 1;
}
