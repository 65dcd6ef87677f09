// The cost profiles, shapes and yardsticks the synthesis benches share
// (synthesis_bench, recompute_bench): each profile a documented set of stage
// costs (and stash sizes), the --profiles and --shapes flags' parsing, and the
// fastest built-in order within a memory cap.
//
// Profiles:
// - uniform: F 1, B 2 (I 1, W 1), free communication; a stash is one
//   activation, its input 1/8 of it;
// - zb-1.5b: the zero-bubble paper's measured times of its 1.5B model (p 8,
//   m 24): F 18.522, I 18.086, W 9.337 (Qi et al., appendix D);
// - last-1.3x: uniform, the last stage 1.3 times slower (it carries the loss);
// - comm-10%: uniform, every transfer 0.1 (10% of F);
// - uneven: four layers per stage but the first, which has six (an
//   embedding), each layer F 1, I 1, W 1 and a stash of 2 layer tensors (its
//   input and its mask) with an input of 1: stage costs and stash sizes in
//   proportion.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/schedule.hpp"

namespace bench {

using namespace pipeweave;

struct Profile {
  std::string name;
  StageCost cost;          // every stage's
  double last_factor = 1;  // the last stage's costs times this
  double latency = 0;      // every transfer
  bool uneven = false;     // the first stage has 6 layers, the others 4
};

inline const std::vector<Profile> kProfiles = {
    {"uniform", {1, -1, 1, 1}},
    {"zb-1.5b", {18.522, -1, 18.086, 9.337}},
    {"last-1.3x", {1, -1, 1, 1}, 1.3},
    {"comm-10%", {1, -1, 1, 1}, 1, 0.1},
    {"uneven", {1, -1, 1, 1}, 1, 0, true},
};

/// A profile's cost model for a shape of `stages` virtual stages.
inline CostModel cost_of(const Profile& p, int stages) {
  CostModel c;
  c.stage_costs.assign(static_cast<std::size_t>(stages), p.cost);
  for (int st = 0; st < stages; ++st) {
    const double scale = (st + 1 == stages ? p.last_factor : 1.0) * (p.uneven ? (st == 0 ? 6 : 4) : 1);
    for (const Phase ph : compute_phases())
      if (c.stage_costs[static_cast<std::size_t>(st)][ph] > 0) c.stage_costs[static_cast<std::size_t>(st)][ph] *= scale;
  }
  c.p2p_latency = p.latency;
  if (p.uneven) {
    c.memory.stages.assign(static_cast<std::size_t>(stages), {.stash = 8, .input = 1, .gradient = 1});
    c.memory.stages.front() = {.stash = 12, .input = 1, .gradient = 1};
  }
  return c;
}

template <class T>
T most(const std::vector<T>& v) {
  return v.empty() ? T{} : *std::max_element(v.begin(), v.end());
}

/// This thread's CPU time in milliseconds.
inline double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

struct Builtin {
  std::string name;
  double makespan = std::numeric_limits<double>::infinity();
  bool fits() const { return makespan < std::numeric_limits<double>::infinity(); }
};

/// The fastest built-in order of the shape's placement within `cap` (0: none),
/// with and without overlapped pairs; with every micro-batch of every stage
/// recomputed (`uniform_recompute`) or none.
inline Builtin best_builtin(const ScheduleShape& s, const CostModel& cost, double cap, bool uniform_recompute = false) {
  Builtin best;
  for (const ScheduleKind k : generated_kinds()) {
    const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, s.placement};
    if (!shape_error(ks).empty()) continue;
    const Program p = make_program(ks);
    for (const bool paired : {false, true}) {
      const Program q = paired ? overlap(p) : p;
      const Trace t = simulate(uniform_recompute ? with_recompute(q, all_stages(ks)) : q, cost);
      if ((cap == 0 || most(t.peak_memory) <= cap * (1 + 1e-12)) && makespan(t) < best.makespan)
        best = {std::string(schedule_name(k)) + (paired ? "+overlap" : "") + (uniform_recompute ? "+recompute" : ""),
                makespan(t)};
    }
  }
  return best;
}

/// 1F1B's peak memory for the shape under a memory model: 1F1B at V = 1,
/// interleaved 1F1B above, loop placement; 0 where the shape has neither.
inline double one_f_one_b_peak(const ScheduleShape& s, const MemoryModel& memory = {}) {
  const ScheduleKind k = s.chunks == 1 ? ScheduleKind::kOneFOneB : ScheduleKind::kInterleaved1F1B;
  const ScheduleShape ks{k, s.devices, s.chunks, s.micro_batches, Placement::kLoop};
  if (!shape_error(ks).empty()) return 0;
  return most(peak_memory(make_program(ks), memory));
}

/// The names of `kProfiles` among `names` (all of them when empty), for a --profiles help.
inline std::vector<std::string> profile_names(const std::vector<std::string>& names = {}) {
  std::vector<std::string> out;
  for (const Profile& p : kProfiles)
    if (names.empty() || std::find(names.begin(), names.end(), p.name) != names.end()) out.push_back(p.name);
  return out;
}

/// The profiles --profiles names, or the message that says which name is unknown.
inline std::optional<std::vector<Profile>> parse_profiles(const std::string& text, std::string& error) {
  std::vector<Profile> out;
  for (const std::string& n : tool::split(text)) {
    const auto it = std::find_if(kProfiles.begin(), kProfiles.end(), [&](const Profile& p) { return p.name == n; });
    if (it == kProfiles.end()) {
      error = "--profiles: no profile is called '" + n + "'; the profiles are " + tool::join_words(profile_names());
      return std::nullopt;
    }
    out.push_back(*it);
  }
  return out;
}

/// The shapes --shapes names, PxVxM each, a trailing v for the v placement
/// where `v_allowed`; or the message that says which one is malformed.
inline std::optional<std::vector<ScheduleShape>> parse_shapes(const std::string& text, bool v_allowed,
                                                              std::string& error) {
  std::vector<ScheduleShape> out;
  for (const std::string& item : tool::split(text)) {
    int P = 0, V = 0, M = 0;
    char v = 0, extra = 0;
    const int n = std::sscanf(item.c_str(), "%dx%dx%d%c%c", &P, &V, &M, &v, &extra);
    if (n < 3 || n > 4 || (n == 4 && (v != 'v' || !v_allowed)) || P < 1 || V < 1 || M < 1 || P > 64 || V > 8 ||
        M > 1024) {
      error = "--shapes: '" + item + "' is not PxVxM (P 1..64, V 1..8, M 1..1024)" +
              (v_allowed ? ", with a trailing v for the v placement" : "");
      return std::nullopt;
    }
    out.push_back({ScheduleKind::kAuto, P, V, M, n == 4 ? Placement::kV : Placement::kLoop});
  }
  return out;
}

}  // namespace bench
