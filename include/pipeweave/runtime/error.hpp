#pragma once
/// \file
/// How run-time errors are worded, in one place: `throw_error(where, parts...)`
/// prefixes "device 1, step 12, B0.2 (stage 1, micro-batch 2): " (as much of it
/// as `where` knows) and appends the parts in order: strings, numbers, actions
/// and tensors (and, through their own `append_to`, messages). The text has no
/// length limit; Text (schedule/error.hpp) stays for code that must be
/// constant-evaluated.
///
/// \code
/// // throws "device 1, step 3: sends a tensor not computed before: activation(stage 2, micro-batch 0)"
/// // pipeweave::throw_error({.device = 1, .step = 3}, "sends a tensor not computed before: ", tensor);
/// \endcode

#include <concepts>
#include <optional>
#include <string>
#include <string_view>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// Where an error happened; each part is optional.
struct Where {
  int device = -1;                 ///< the device (MPI: the rank); -1: none
  int step = -1;                   ///< the step of the device's lowered program; -1: none
  std::optional<Action> action{};  ///< the action that ran
  int stage = -1;                  ///< its virtual stage (with `action`)
};

/// Appends a string.
inline void append_to(std::string& s, std::string_view v) { s += v; }
/// Appends a C string.
inline void append_to(std::string& s, const char* v) { s += v; }
/// Appends an integer in decimal.
template <std::integral I>
  requires(!std::same_as<I, bool> && !std::same_as<I, char>)
void append_to(std::string& s, I v) {
  s += std::to_string(v);
}
/// Appends a floating-point number as std::to_string writes it ("0.010000").
template <std::floating_point F>
void append_to(std::string& s, F v) {
  s += std::to_string(v);
}
/// Appends an action's token, e.g. "F1.3".
inline void append_to(std::string& s, const Action& a) { s += to_string(a); }
/// Appends "activation(stage 3, micro-batch 1)" or "gradient(...)".
inline void append_to(std::string& s, const TensorId& x) {
  Text t;
  append_tensor(t, x);
  s += t.view();
}
/// Appends "device 1, step 12, B0.2 (stage 1, micro-batch 2): ", as far as `w` knows it.
inline void append_to(std::string& s, const Where& w) {
  const std::size_t start = s.size();
  auto separate = [&] {
    if (s.size() > start) s += ", ";
  };
  if (w.device >= 0) s += "device " + std::to_string(w.device);
  if (w.step >= 0) {
    separate();
    s += "step " + std::to_string(w.step);
  }
  if (w.action) {
    separate();
    s += to_string(*w.action) + " (stage " + std::to_string(w.stage) + ", micro-batch " +
         std::to_string(w.action->micro_batch) + ")";
  }
  if (s.size() > start) s += ": ";
}

/// The text of an error: `where`'s prefix, then every part in order.
template <class... Parts>
std::string error_text(const Where& where, const Parts&... parts) {
  std::string s;
  append_to(s, where);
  (append_to(s, parts), ...);
  return s;
}

/// Throws pipeweave::Error with error_text(where, parts...).
template <class... Parts>
[[noreturn]] void throw_error(const Where& where, const Parts&... parts) {
  throw Error(error_text(where, parts...));
}

}  // namespace pipeweave
