#pragma once
/// \file
/// What the processes of a multi-process run must agree on, as named settings
/// (RunConfig) and their fingerprint. The multi-process host (mpi/pipeline.hpp)
/// starts from the program's settings (the schedule, its shape, the order of every
/// device's actions) and the batch; the caller adds whatever else the ranks must
/// share (the model, the optimizer, the arithmetic). The ranks compare the
/// fingerprints at start-up, and when they differ, the settings, to name the
/// first that differs. NCCL carries no metadata, so the GPU transport across
/// processes relies on this agreement instead of checking each message: with the
/// same program, the verifier's proof that every send meets the receive that
/// expects it (in FIFO order per pair) holds on every rank, and the byte counts
/// follow from the model.
///
/// The fingerprint is FNV-1a over a fixed little-endian encoding, so it is the
/// same on every machine and compiler. Standard library only.
///
/// \code
/// const auto program = pipeweave::make_schedule("1f1b", 2, 1, 4);
/// pipeweave::RunConfig config = pipeweave::run_config(program, /*rows=*/64);
/// config.add("learning rate", 0.01f);              // "0.01"
/// const std::uint64_t h = config.hash();
/// \endcode

#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/schedule/kinds.hpp"

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
  /// Adds a program: its shape (the placement too), every device's actions in
  /// order with the marks of overlapped pairs, and the reference clock its steps
  /// are planned on (each rank lowers the program itself; another clock places
  /// the messages at other steps).
  constexpr ConfigHash& add(const Program& p) {
    add(std::string_view("program"));
    add(static_cast<int>(p.shape.kind)).add(p.shape.devices).add(p.shape.chunks).add(p.shape.micro_batches);
    add(static_cast<int>(p.shape.placement));
    add(static_cast<std::int64_t>(p.devices.size()));
    for (const auto& actions : p.devices) {
      add(static_cast<std::int64_t>(actions.size()));
      for (const Action& a : actions)
        add(static_cast<int>(a.phase)).add(a.chunk).add(a.micro_batch).add(a.overlaps_next ? 1 : 0);
    }
    add(static_cast<std::int64_t>(p.stage_lowering.size()));
    for (const LoweringCosts& c : p.stage_lowering) add(c);
    return add(p.lowering);
  }
  /// Adds a reference clock: each compute phase's cost, in order (F, B, I, W).
  constexpr ConfigHash& add(const LoweringCosts& c) {
    for (const long long x : c.cost) add(static_cast<std::int64_t>(x));
    return *this;
  }
  /// The hash so far.
  constexpr std::uint64_t value() const { return value_; }

 private:
  std::uint64_t value_ = 0xcbf29ce484222325ULL;
};

/// "0x" and 16 hex digits.
inline std::string hash_text(std::uint64_t v) {
  constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 15; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xf];
  return s;
}

/// The settings of a run that the ranks must share: named values, in a fixed
/// order, each written as a user would write it ("0.003", "interleaved").
class RunConfig {
 public:
  /// One setting.
  struct Field {
    std::string name;   ///< e.g. "learning rate"
    std::string value;  ///< e.g. "0.003"
    friend bool operator==(const Field&, const Field&) = default;
  };

  /// Adds a setting with its value's text.
  RunConfig& add(std::string_view name, std::string_view value) {
    fields_.push_back({std::string(name), std::string(value)});
    return *this;
  }
  /// Adds a setting with a C string value.
  RunConfig& add(std::string_view name, const char* value) { return add(name, std::string_view(value)); }
  /// Adds an integer setting.
  RunConfig& add(std::string_view name, long long value) { return add(name, std::string_view(std::to_string(value))); }
  /// Adds an int setting.
  RunConfig& add(std::string_view name, int value) { return add(name, static_cast<long long>(value)); }
  /// Adds an unsigned 64-bit setting.
  RunConfig& add(std::string_view name, std::uint64_t value) {
    return add(name, std::string_view(std::to_string(value)));
  }
  /// Adds a float setting, written in the fewest digits that read back as the same float.
  RunConfig& add(std::string_view name, float value) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;
    return add(name, std::string_view(text, static_cast<std::size_t>(end - text)));
  }
  /// Adds every setting of `other`, after these.
  RunConfig& add(const RunConfig& other) {
    fields_.insert(fields_.end(), other.fields_.begin(), other.fields_.end());
    return *this;
  }

  /// The settings in order.
  const std::vector<Field>& fields() const { return fields_; }
  /// The fingerprint of the settings (names and values, in order).
  std::uint64_t hash() const {
    ConfigHash h;
    h.add(static_cast<std::int64_t>(fields_.size()));
    for (const Field& f : fields_) h.add(std::string_view(f.name)).add(std::string_view(f.value));
    return h.value();
  }
  /// The settings as one string (each name and value followed by a NUL), for
  /// sending to another process; decode() reads it back.
  std::string encode() const {
    std::string out;
    for (const Field& f : fields_) {
      out.append(f.name).push_back('\0');
      out.append(f.value).push_back('\0');
    }
    return out;
  }
  /// The settings encode() wrote (a trailing part without its NUL is dropped).
  static RunConfig decode(std::string_view text) {
    RunConfig c;
    for (;;) {
      const std::size_t a = text.find('\0');
      if (a == std::string_view::npos) break;
      const std::size_t b = text.find('\0', a + 1);
      if (b == std::string_view::npos) break;
      c.add(text.substr(0, a), text.substr(a + 1, b - a - 1));
      text.remove_prefix(b + 1);
    }
    return c;
  }

 private:
  std::vector<Field> fields_;
};

/// The settings of a run that come with its program and batch: the schedule,
/// devices, chunks, micro-batches, the program (a fingerprint of its placement,
/// every device's actions in order and its reference clock: it differs only for
/// hand-made or synthesized programs of one shape) and the batch's samples.
inline RunConfig run_config(const Program& program, int rows) {
  const ScheduleShape& s = program.shape;
  RunConfig c;
  c.add("schedule", schedule_name(s.kind))
      .add("devices", s.devices)
      .add("chunks per device", s.chunks)
      .add("micro-batches", s.micro_batches)
      .add("program", std::string_view(hash_text(ConfigHash{}.add(program).value())))
      .add("batch", rows);
  return c;
}

}  // namespace pipeweave
