#pragma once
/// \file
/// Text forms of programs for people and tools: one line of action tokens per
/// device, and the lowered steps with their sends and receives.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "pipeweave/schedule/kinds.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/tokens.hpp"

namespace pipeweave {

/// "device <d>: <token> <token> ..." for one device, an overlapped pair as one
/// token "(F0.6;B1.0)".
inline std::string format_device_actions(const Program& p, int device) {
  const std::string tokens = format_tokens(p.devices.at(static_cast<std::size_t>(device)));
  return "device " + std::to_string(device) + ":" + (tokens.empty() ? "" : " ") + tokens;
}

/// One line per device, "device <d>: <token> <token> ...", each ending in a newline.
inline std::string format_actions(const Program& p) {
  std::string out;
  for (std::size_t d = 0; d < p.devices.size(); ++d) out += format_device_actions(p, static_cast<int>(d)) + "\n";
  return out;
}

/// The program as C++: a header that defines the struct `name` in the form the
/// compile-time API takes (shape, actions, counts, program(), its lowering
/// made in chunks), and proves it where it is compiled:
/// `static_assert(pipeweave::verify(name{}))`. `name` must be a C++ identifier.
inline std::string format_cpp(const Program& p, std::string_view name) {
  const ScheduleShape& s = p.shape;
  std::size_t width = 1;
  for (const auto& row : p.devices) width = std::max(width, row.size());
  const std::string n(name), P = std::to_string(p.devices.size()), W = std::to_string(width);
  const KindRow& kind = kind_row(s.kind);
  std::string out = "// " + std::string(kind.title) + " schedule: " + std::to_string(s.devices) + " devices x " +
                    std::to_string(s.chunks) + " chunks, " + std::to_string(s.micro_batches) + " micro-batches, " +
                    std::string(placement_name(s.placement)) + " placement.\n";
  out += "#pragma once\n\n#include <array>\n\n#include \"pipeweave/schedule.hpp\"\n\n";
  out += "struct " + n + " {\n";
  out += "  static constexpr pipeweave::ScheduleShape shape{" +
         (kind.generated || kind.synthesized ? "*pipeweave::parse_schedule(\"" + std::string(kind.name) + "\", true)"
                                             : std::string("pipeweave::ScheduleKind::kCustom")) +
         ", " + std::to_string(s.devices) + ", " + std::to_string(s.chunks) + ", " + std::to_string(s.micro_batches) +
         ", pipeweave::Placement::" + (s.placement == Placement::kV ? "kV" : "kLoop") + "};\n";
  out += "  static constexpr int devices = " + std::to_string(s.devices) + ", chunks = " + std::to_string(s.chunks) +
         ", micro_batches = " + std::to_string(s.micro_batches) + ", actions_per_device = " + W + ";\n";
  out += "  static constexpr std::array<int, " + P + "> counts{";
  for (std::size_t d = 0; d < p.devices.size(); ++d) out += (d ? ", " : "") + std::to_string(p.devices[d].size());
  out += "};\n  static constexpr std::array<std::array<pipeweave::Action, " + W + ">, " + P + "> actions{{\n";
  for (const auto& row : p.devices) {
    std::string line = "      {{";
    for (std::size_t k = 0; k < row.size(); ++k) {
      const Action& a = row[k];
      std::string call = "pipeweave::" + std::string(phase_row(a.phase).maker) + "(" + std::to_string(a.chunk) + ", " +
                         std::to_string(a.micro_batch) + ")" + (a.overlaps_next ? ".paired()" : "");
      if (line.size() + call.size() + 2 > 118) {
        out += line + "\n";
        line = "       ";
      }
      line += (k ? " " : "") + call + (k + 1 < row.size() ? "," : "");
    }
    out += line + "}},\n";
  }
  out += "  }};\n";
  auto clock = [](const LoweringCosts& c) {
    std::string out = "{";
    for (const Phase ph : compute_phases()) out += (out.size() > 1 ? ", " : "") + std::to_string(c[ph]);
    return out + "}";
  };
  std::string letters;  // "F, B, I, W, C": the order of a clock's entries
  for (const Phase ph : compute_phases()) letters += (letters.empty() ? "" : ", ") + std::string(1, phase_letter(ph));
  if (p.lowering != LoweringCosts{}) {
    out += "  // The reference clock its steps are planned on (pipeweave::Program::lowering): " + letters + ".\n";
    out += "  static constexpr pipeweave::LoweringCosts lowering_costs" + clock(p.lowering) + ";\n";
  }
  if (!p.stage_lowering.empty()) {
    out += "  // Each virtual stage's reference clock (pipeweave::Program::stage_lowering): " + letters + ".\n";
    out += "  static constexpr std::array<pipeweave::LoweringCosts, " + std::to_string(p.stage_lowering.size()) +
           "> stage_lowering_costs{{\n";
    std::string line = "     ";
    for (std::size_t st = 0; st < p.stage_lowering.size(); ++st) {
      const std::string item = clock(p.stage_lowering[st]) + (st + 1 < p.stage_lowering.size() ? "," : "}};");
      if (line.size() + item.size() + 1 > 118) {
        out += line + "\n";
        line = "     ";
      }
      line += " " + item;
    }
    out += line + "\n";
  }
  out += "  using Base = " + n + ";\n";
  out += "  static constexpr const auto& lowered() { return pipeweave::detail::static_lowering<" + n + ">; }\n";
  out += "  static constexpr pipeweave::Program program() { return pipeweave::detail::static_program<" + n + ">(); }\n";
  out += "};\n\nstatic_assert(pipeweave::verify(" + n + "{}));\n";
  return out;
}

/// "send act s0 m1 -> d1" or "recv grad s5 m0 <- d3".
inline std::string to_string(const P2POp& op) {
  const TensorId& x = op.tensor;
  std::string s = op.kind == OpKind::kSend ? "send " : "recv ";
  s += x.kind == TensorKind::kActivation ? "act" : "grad";
  s += " s" + std::to_string(x.stage) + " m" + std::to_string(x.micro_batch);
  s += op.kind == OpKind::kSend ? " -> d" : " <- d";
  return s + std::to_string(op.peer);
}

/// One step: its group in brackets (if any), then its compute token (if any);
/// the forward of an overlapped pair opens its token, "(F0.6;", and the next
/// step, its backward, closes it (format_steps()).
inline std::string to_string(const Step& step) {
  std::string s;
  if (!step.ops.empty()) {
    s += "[";
    for (std::size_t i = 0; i < step.ops.size(); ++i) s += (i ? ", " : "") + to_string(step.ops[i]);
    s += "]";
  }
  if (step.has_compute) {
    const bool opens_pair = step.compute.overlaps_next;
    s += std::string(s.empty() ? "" : " ") + (opens_pair ? "(" : "") + to_string(step.compute) + (opens_pair ? ";" : "");
  }
  return s;
}

/// The lowered program: a header line per device, then one line per step.
inline std::string format_steps(const LoweredProgram& lp) {
  std::string out;
  for (std::size_t d = 0; d < lp.devices.size(); ++d) {
    out += "device " + std::to_string(d) + ": " + std::to_string(lp.devices[d].size()) + " steps\n";
    for (std::size_t t = 0; t < lp.devices[d].size(); ++t) {
      const bool closes_pair = t > 0 && lp.devices[d][t - 1].has_compute && lp.devices[d][t - 1].compute.overlaps_next;
      out += "  step " + std::to_string(t) + ": " + to_string(lp.devices[d][t]) + (closes_pair ? ")" : "") + "\n";
    }
  }
  return out;
}

}  // namespace pipeweave
