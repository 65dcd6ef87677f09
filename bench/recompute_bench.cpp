// recompute_bench: what synthesize() gains under memory caps by choosing which
// micro-batches to recompute, against a built-in order that recomputes every
// micro-batch (Megatron-LM's uniform full recomputation) and against itself
// with no cap.
//
//   recompute_bench                        # every profile, shape and cap: a table
//   recompute_bench --profiles uniform --shapes 4x1x16 --json
//
// Profiles:
// - uniform: F 1, B 2 (I 1, W 1); a stash is one activation, its input 1/8 of it;
// - last-1.3x: uniform, the last stage 1.3 times slower (it carries the loss);
// - zb-1.5b: the zero-bubble paper's measured times of its 1.5B model: F 18.522,
//   I 18.086, W 9.337 (Qi et al., appendix D);
// - uneven: four layers per stage but the first, which has six (an embedding),
//   each layer F 1, I 1, W 1 and a stash of 2 (its input and its mask) with an
//   input of 1: stage costs and stash sizes in proportion.
// Caps: the peak memory of the synthesized program with no cap, half of 1F1B's
// peak (interleaved 1F1B's where V > 1), and a quarter of it; a cap below the
// smallest any program meets, recomputing, is left out.
//
// Each row: the synthesized makespan with recomputation allowed and the
// micro-batches it recomputes; (a) the fastest built-in order with every
// micro-batch of every stage recomputed that fits the cap (each kind of the
// shape's placement, with and without overlapped pairs); (b) the synthesized
// makespan with no cap; a/syn (how many times faster than (a)) and syn/b.
// #wrong counts rows whose program fails verify(), passes the cap, or is
// slower than (a) or than any built-in order without recomputation that fits.
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
  StageCost cost;          // every stage's
  double last_factor = 1;  // the last stage's costs times this
  bool uneven = false;     // the first stage has 6 layers, the others 4
};

const std::vector<Profile> kProfiles = {
    {"uniform", {1, -1, 1, 1}},
    {"last-1.3x", {1, -1, 1, 1}, 1.3},
    {"zb-1.5b", {18.522, -1, 18.086, 9.337}},
    {"uneven", {1, -1, 1, 1}, 1, true},
};

CostModel cost_of(const Profile& p, int stages) {
  CostModel c;
  c.stage_costs.assign(static_cast<std::size_t>(stages), p.cost);
  for (int st = 0; st < stages; ++st) {
    const double scale = (st + 1 == stages ? p.last_factor : 1.0) * (p.uneven ? (st == 0 ? 6 : 4) : 1);
    for (const Phase ph : compute_phases())
      if (c.stage_costs[static_cast<std::size_t>(st)][ph] > 0) c.stage_costs[static_cast<std::size_t>(st)][ph] *= scale;
  }
  if (p.uneven) {
    c.memory.stages.assign(static_cast<std::size_t>(stages), {.stash = 8, .input = 1, .gradient = 1});
    c.memory.stages.front() = {.stash = 12, .input = 1, .gradient = 1};
  }
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

// The fastest built-in order of the shape's placement within `cap`, with and without pairs; with every
// micro-batch recomputed (`uniform`) or none.
Builtin best_builtin(const ScheduleShape& s, const CostModel& cost, double cap, bool uniform) {
  Builtin best;
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, s.placement};
    if (!shape_error(ks).empty()) continue;
    const Program p = make_program(ks);
    for (const bool paired : {false, true}) {
      const Program q = paired ? overlap(p) : p;
      const Trace t = simulate(uniform ? with_recompute(q, all_stages(ks)) : q, cost);
      if (most(t.peak_memory) <= cap * (1 + 1e-12) && makespan(t) < best.makespan)
        best = {std::string(schedule_name(k)) + (paired ? "+overlap" : "") + (uniform ? "+recompute" : ""),
                makespan(t)};
    }
  }
  return best;
}

// 1F1B's peak memory for the shape: 1F1B at V = 1, interleaved 1F1B above, loop placement.
double one_f_one_b_peak(const ScheduleShape& s, const CostModel& cost) {
  const ScheduleKind k = s.chunks == 1 ? ScheduleKind::kOneFOneB : ScheduleKind::kInterleaved1F1B;
  const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, Placement::kLoop};
  if (!shape_error(ks).empty()) return 0;
  return most(peak_memory(make_program(ks), cost.memory));
}

int recomputations(const Program& p) {
  int n = 0;
  for (const auto& row : p.devices)
    for (const Action& a : row) n += a.phase == Phase::kRecompute ? 1 : 0;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Synthesis that recomputes under memory caps, against a built-in order with uniform full "
               "recomputation and against synthesis with no cap, over cost profiles, shapes and caps."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::vector<std::string> names;
  for (const Profile& p : kProfiles) names.push_back(p.name);
  std::string profiles = tool::join_words(names, ",", ","), shapes = "4x1x16,4x2x16,8x1x32";
  long long work = 0;
  bool json = false;
  app.add_option("--profiles", profiles, "Comma-separated: " + tool::join_words(names, ", ") + " (default all)");
  app.add_option("--shapes", shapes, "Comma-separated PxVxM (default 4x1x16,4x2x16,8x1x32)");
  app.add_option("--work", work, "The search's budget in simulated actions (default: synthesize()'s)")
      ->check(CLI::Range(0LL, 1LL << 40));
  app.add_flag("--json", json, "The rows as JSON instead of a table");
  if (const auto status = tool::parse(app, argc, argv, "recompute_bench")) return *status;

  std::vector<Profile> chosen;
  for (const std::string& n : tool::split(profiles)) {
    const auto it = std::find_if(kProfiles.begin(), kProfiles.end(), [&](const Profile& p) { return p.name == n; });
    if (it == kProfiles.end())
      return tool::usage_error("recompute_bench", "--profiles: no profile is called '" + n + "'; the profiles are " +
                                                      tool::join_words(names));
    chosen.push_back(*it);
  }
  std::vector<ScheduleShape> chosen_shapes;
  for (const std::string& text : tool::split(shapes)) {
    int P = 0, V = 0, M = 0;
    char extra = 0;
    if (std::sscanf(text.c_str(), "%dx%dx%d%c", &P, &V, &M, &extra) != 3 || P < 1 || V < 1 || M < 1 || P > 64 ||
        V > 8 || M > 1024)
      return tool::usage_error("recompute_bench", "--shapes: '" + text + "' is not PxVxM (P 1..64, V 1..8, M 1..1024)");
    chosen_shapes.push_back({ScheduleKind::kAuto, P, V, M});
  }

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
                                           {"cpu_ms", "ms", "search_ms", 8, 1}}));
  long long wrong = 0, gains = 0, recomputing = 0;
  for (const ScheduleShape& s : chosen_shapes) {
    for (const Profile& prof : chosen) {
      const CostModel cost = cost_of(prof, s.stages());
      const Synthesis free = synthesize(s, cost, {.work = work});
      const double base = one_f_one_b_peak(s, cost), least = smallest_memory_limit(s, cost.memory, true);
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
        const bool fits = uniform.makespan < std::numeric_limits<double>::infinity();
        if (fits && cap < free.peak_memory) {
          ++recomputing;
          gains += uniform.makespan >= 1.15 * r.makespan ? 1 : 0;
        }
        report.add({prof.name, static_cast<long long>(s.devices), static_cast<long long>(s.chunks),
                    static_cast<long long>(s.micro_batches), cap, r.makespan,
                    static_cast<long long>(recomputations(r.program)),
                    fits ? tool::Cell{uniform.name} : tool::Cell{std::string("none fits")},
                    fits ? tool::Cell{uniform.makespan} : tool::Cell{}, fits ? tool::Cell{uniform.makespan / r.makespan} : tool::Cell{},
                    free.makespan, r.makespan / free.makespan, r.peak_memory, ms});
      }
    }
  }
  if (json) {
    std::cout << report.json("recompute_bench", {{"wrong", std::to_string(wrong)},
                                                 {"rows_1_15x_over_uniform", std::to_string(gains)},
                                                 {"rows_below_no_cap_peak_with_uniform", std::to_string(recomputing)}});
  } else {
    std::cout << report.text({"recompute_bench: synthesize() recomputing under a memory cap, against (a) the fastest "
                              "built-in with uniform full recomputation that fits and (b) synthesis with no cap",
                              "makespans under the lowered steps' replay; cap and peak in the profile's memory unit "
                              "(activations, or layer tensors for uneven); C: micro-batches recomputed; cpu_ms: the "
                              "search on one core",
                              "rows below the no-cap peak where (a) fits: " + std::to_string(recomputing) +
                                  "; of them at least 1.15x faster than (a): " + std::to_string(gains)},
                             tool::wrong_footer("rows checked (verified, within the cap, <= (a), <= every built-in "
                                                "without recomputation that fits)",
                                                wrong));
  }
  return wrong == 0 ? 0 : 1;
}
