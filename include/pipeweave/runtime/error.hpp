#pragma once
/// \file
/// How run-time errors are worded, in one place: `throw_error(where, parts...)`
/// prefixes "device 1, step 12, B0.2 (stage 1, micro-batch 2): " (as much of it
/// as `where` knows) and appends the parts in order: strings, numbers, actions
/// and tensors (and, through their own `append_to`, messages). Every run-time
/// layer (runtime/, cpu/, cuda/, mpi/) throws through it, never `throw Error`
/// with a prefix of its own.
///
/// The core is schedule/error.hpp (Error, Text and the Text appenders:
/// append_token, append_tensor); this file is its run-time face. Two files
/// because the schedule and analysis layers must stay standard library only
/// and constant-evaluable, with a bounded Text, while a run-time message has
/// no length limit (std::string) and says where it happened (Where). So
/// append_to() adds only strings and numbers itself: an action, a tensor, a
/// Text and the Where prefix are spelled by the schedule layer's appenders.
///
/// \code
/// // throws "device 1, step 3: sends a tensor not computed before: activation(stage 2, micro-batch 0)"
/// // pipeweave::throw_error({.device = 1, .step = 3}, "sends a tensor not computed before: ", tensor);
/// \endcode

#include <concepts>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/tokens.hpp"

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
/// Appends a Text built by the schedule layer.
inline void append_to(std::string& s, const Text& t) { s += t.view(); }

namespace detail {
/// Appends what `spell(Text&)` writes with the schedule layer's appenders; the
/// values it spells are short enough for a Text.
template <class Spell>
void append_spelled(std::string& s, Spell&& spell) {
  Text t;
  spell(t);
  s += t.view();
}
}  // namespace detail

/// Appends an action's token, e.g. "F1.3" (append_token).
inline void append_to(std::string& s, const Action& a) {
  detail::append_spelled(s, [&](Text& t) { append_token(t, a); });
}
/// Appends "activation(stage 3, micro-batch 1)" or "gradient(...)" (append_tensor).
inline void append_to(std::string& s, const TensorId& x) {
  detail::append_spelled(s, [&](Text& t) { append_tensor(t, x); });
}
/// Appends "device 1, step 12, B0.2 (stage 1, micro-batch 2): ", as far as `w` knows it.
inline void append_to(std::string& s, const Where& w) {
  detail::append_spelled(s, [&](Text& t) {
    auto separate = [&] {
      if (!t.empty()) t << ", ";
    };
    if (w.device >= 0) t << "device " << w.device;
    if (w.step >= 0) {
      separate();
      t << "step " << w.step;
    }
    if (w.action) {
      separate();
      append_token(t, *w.action) << " (stage " << w.stage << ", micro-batch " << w.action->micro_batch << ")";
    }
    if (!t.empty()) t << ": ";
  });
}

/// The text of an error: `where`'s prefix, then every part in order.
template <class... Parts>
std::string error_text(const Where& where, const Parts&... parts) {
  std::string s;
  append_to(s, where);
  (append_to(s, parts), ...);
  return s;
}

/// `text` without `prefix` where it starts with it.
inline std::string_view without_prefix(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix ? text.substr(prefix.size()) : text;
}

/// Throws pipeweave::Error with error_text(where, parts...).
template <class... Parts>
[[noreturn]] void throw_error(const Where& where, const Parts&... parts) {
  throw Error(error_text(where, parts...));
}

/// Throws pipeweave::Error for `e`, thrown by the work at `where` (an action):
/// error_text(where, what), `what` being e's message without the "device d: "
/// that `where` says already, nor, when `replica` >= 0, "replica r: " (a
/// replica collective's own errors name the device and the replica: the prefix
/// says them once).
[[noreturn]] inline void rethrow_at(const Where& where, const std::exception& e, int replica = -1) {
  std::string_view what = without_prefix(e.what(), error_text({.device = where.device}));
  if (replica >= 0) what = without_prefix(what, "replica " + std::to_string(replica) + ": ");
  throw_error(where, what);
}

}  // namespace pipeweave
