#pragma once
/// \file
/// A fingerprint of everything the ranks of a multi-process run must agree on:
/// the program (its shape and every device's actions, which fix every message of
/// every step), the model (widths and seed), the batch, the optimizer and the
/// arithmetic. NCCL carries no metadata, so the multi-process transport relies on
/// this agreement instead of checking each message: with the same program, the
/// verifier's proof that every send meets the receive that expects it (in FIFO
/// order per pair) holds on every rank, and the byte counts follow from the model.
///
/// The hash is FNV-1a over a fixed little-endian encoding, so it is the same on
/// every machine and compiler. This header includes no CUDA or MPI header.
///
/// \code
/// const auto program = pipeweave::make_schedule(pipeweave::ScheduleKind::kOneFOneB, 2, 1, 4);
/// const std::uint64_t h = pipeweave::cuda::ConfigHash{}.add(program).value();
/// \endcode

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/runtime/executor.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/optimizer.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave::cuda {

/// FNV-1a (64 bits) over values in a fixed encoding; each add() returns *this.
class ConfigHash {
 public:
  /// Adds one byte.
  constexpr ConfigHash& add_byte(std::uint8_t b) {
    value_ = (value_ ^ b) * 0x100000001b3ULL;
    return *this;
  }
  /// Adds an integer as 8 little-endian bytes.
  constexpr ConfigHash& add(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) add_byte(static_cast<std::uint8_t>(u >> (8 * i)));
    return *this;
  }
  /// Adds an int.
  constexpr ConfigHash& add(int v) { return add(static_cast<std::int64_t>(v)); }
  /// Adds an unsigned 64-bit value.
  constexpr ConfigHash& add(std::uint64_t v) { return add(static_cast<std::int64_t>(v)); }
  /// Adds a float by its bits.
  constexpr ConfigHash& add(float v) { return add(static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(v))); }
  /// Adds a string with its length.
  constexpr ConfigHash& add(std::string_view s) {
    add(static_cast<std::int64_t>(s.size()));
    for (char c : s) add_byte(static_cast<std::uint8_t>(c));
    return *this;
  }
  /// Adds a program: its shape and every device's actions in order.
  constexpr ConfigHash& add(const Program& p) {
    add(std::string_view("program"));
    add(static_cast<int>(p.shape.kind)).add(p.shape.devices).add(p.shape.chunks).add(p.shape.micro_batches);
    add(static_cast<std::int64_t>(p.devices.size()));
    for (const auto& actions : p.devices) {
      add(static_cast<std::int64_t>(actions.size()));
      for (const Action& a : actions) add(static_cast<int>(a.phase)).add(a.chunk).add(a.micro_batch);
    }
    return *this;
  }
  /// Adds a model: its widths and seed.
  ConfigHash& add(const MlpSpec& spec) {
    add(std::string_view("model"));
    add(static_cast<std::int64_t>(spec.widths.size()));
    for (int w : spec.widths) add(w);
    return add(static_cast<std::uint64_t>(spec.seed));
  }
  /// Adds an optimizer's kind and hyper-parameters.
  constexpr ConfigHash& add(const OptimizerConfig& o) {
    add(std::string_view("optimizer"));
    return add(static_cast<int>(o.kind)).add(o.learning_rate).add(o.momentum).add(o.beta1).add(o.beta2).add(o.epsilon);
  }
  /// The hash so far.
  constexpr std::uint64_t value() const { return value_; }

 private:
  std::uint64_t value_ = 0xcbf29ce484222325ULL;
};

/// The fingerprint of a training run: program, model, batch rows, optimizer and
/// math mode. Ranks started with different arguments get different values.
inline std::uint64_t run_hash(const Program& program, const MlpSpec& spec, const PipelineOptions& options,
                              MathMode math) {
  ConfigHash h;
  h.add(program).add(spec).add(std::string_view("rows")).add(options.rows).add(options.optimizer);
  return h.add(std::string_view("math")).add(std::string_view(math_name(math))).value();
}

/// "0x" and 16 hex digits.
inline std::string hash_text(std::uint64_t v) {
  constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xf];
  return s;
}

}  // namespace pipeweave::cuda
