#pragma once
/// \file
/// A fingerprint of what the processes of a multi-process run must agree on. The
/// multi-process host (mpi/pipeline.hpp) hashes the program (its shape and every
/// device's actions, which fix every message of every step) and the batch; the
/// caller adds whatever else the ranks must share (the model, the optimizer, the
/// arithmetic). NCCL carries no metadata, so the multi-process transports rely on
/// this agreement instead of checking each message: with the same program, the
/// verifier's proof that every send meets the receive that expects it (in FIFO
/// order per pair) holds on every rank, and the byte counts follow from the model.
///
/// The hash is FNV-1a over a fixed little-endian encoding, so it is the same on
/// every machine and compiler. Standard library only.
///
/// \code
/// const auto program = pipeweave::make_schedule(pipeweave::ScheduleKind::kOneFOneB, 2, 1, 4);
/// const std::uint64_t h = pipeweave::ConfigHash{}.add(program).add(std::string_view("rows")).add(64).value();
/// \endcode

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeweave/schedule/action.hpp"

namespace pipeweave {

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
  /// The hash so far.
  constexpr std::uint64_t value() const { return value_; }

 private:
  std::uint64_t value_ = 0xcbf29ce484222325ULL;
};

/// The fingerprint of a run: the program, the batch rows and `config`, the
/// caller's fingerprint of everything else the ranks must share.
constexpr std::uint64_t run_hash(const Program& program, int rows, std::uint64_t config) {
  return ConfigHash{}
      .add(program)
      .add(std::string_view("rows"))
      .add(rows)
      .add(std::string_view("config"))
      .add(config)
      .value();
}

/// "0x" and 16 hex digits.
inline std::string hash_text(std::uint64_t v) {
  constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xf];
  return s;
}

}  // namespace pipeweave
