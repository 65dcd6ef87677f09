#pragma once
/// \file
/// Text forms of programs for people and tools: one line of action tokens per
/// device, and the lowered steps with their sends and receives.

#include <string>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/lowering.hpp"

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
