#pragma once
/// \file
/// The tokens that spell actions: "F1.3", a gradient reduction "R0", an
/// overlapped pair "(F0.6;B1.0)", and a device's actions as one line of them.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// Appends an action token, `<kind><chunk>.<micro-batch>` with kind F, B, I or
/// W; a gradient reduction, one per chunk, is `R<chunk>` (a micro-batch other
/// than its 0 is shown, as `R<chunk>.<micro-batch>`, for the verifier's message).
constexpr Text& append_token(Text& t, const Action& a) {
  const char letter[1] = {phase_letter(a.phase)};
  t.append(std::string_view(letter, 1)).append(a.chunk);
  if (!is_collective(a.phase) || a.micro_batch != 0) t.append(".").append(a.micro_batch);
  return t;
}

/// The token of an action as a string, e.g. "F1.3".
inline std::string to_string(const Action& a) {
  Text t;
  append_token(t, a);
  return t.str();
}

/// Appends the token of the compute step that starts at row[k] of a device's n
/// actions, and returns how many actions it holds: "F1.3" (1), or an
/// overlapped pair "(F0.6;B1.0)" (2).
constexpr int append_step_token(Text& t, const Action* row, int k, int n) {
  if (!row[k].overlaps_next || k + 1 >= n) {
    append_token(t, row[k]);
    return 1;
  }
  append_token(t << "(", row[k]) << ";";
  append_token(t, row[k + 1]) << ")";
  return 2;
}

/// A device's actions as tokens separated by spaces, a pair as one token
/// "(F0.6;B1.0)".
inline std::string format_tokens(const std::vector<Action>& row) {
  std::string out;
  const int n = static_cast<int>(row.size());
  for (int k = 0; k < n;) {
    Text t;
    k += append_step_token(t, row.data(), k, n);
    out += (out.empty() ? "" : " ") + t.str();
  }
  return out;
}

/// The overlapped pairs of one device's actions: forwards marked overlaps_next
/// with an action after them (append_step_token() makes each one token).
constexpr int pair_count(const std::vector<Action>& row) {
  int pairs = 0;
  for (std::size_t k = 0; k + 1 < row.size(); ++k) pairs += row[k].overlaps_next ? 1 : 0;
  return pairs;
}

/// The overlapped pairs of every device's program.
constexpr int pair_count(const Program& p) {
  int pairs = 0;
  for (const auto& row : p.devices) pairs += pair_count(row);
  return pairs;
}

/// True when some device's program has an overlapped pair.
constexpr bool has_pairs(const Program& p) { return pair_count(p) > 0; }

}  // namespace pipeweave
