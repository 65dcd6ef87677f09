#pragma once
/// \file
/// The model of memory: what one stage keeps of one micro-batch (StashSize,
/// in a unit the user sets: bytes, MiB, or by default one activation), and
/// the one count of what a device keeps as its actions run (KeptCount), which
/// peak_memory() of a program, the simulator and the measured traces all use.
///
/// \code
/// using namespace pipeweave;
/// static_assert(peak_memory(OneFOneB<2, 4>::program())[0] == 2);
/// static_assert(peak_memory(with_recompute(OneFOneB<2, 4>::program(), {0}))[0] == 1.125);
/// \endcode
///
/// What a device keeps, counted after each of its actions:
/// - F of (stage s, micro-batch m): the stash of s (all that its backward
///   reads), or, where the program recomputes (s, m) (it has a C of it), only
///   the input of s, which the forward keeps while it drops the rest;
/// - C: the stash again, the input now a part of it (stash - input more);
/// - O (offload): frees the stash, now in host memory; L (reload): keeps it
///   again; an O and L between an I and its W (the weight window) move the
///   output gradient kept for W with the stash;
/// - B: frees the stash; I: keeps the output gradient, which W reads too;
///   W: frees the stash and that gradient;
/// - R: nothing.
/// A forward's own working memory is no stash and is not counted; an action
/// frees what it frees when it ends.

#include <cstddef>
#include <vector>

#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/buffer.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// The input's share of a stash where none is given: a stage of four
/// Linear/ReLU layers stashes each layer's input and its ReLU mask, eight
/// tensors of the batch's width, and its own input is one of them.
inline constexpr double kDefaultInputShare = 0.125;

/// What one stage keeps of one micro-batch, in the memory model's unit.
struct StashSize {
  double stash = 1;                  ///< all that its backward reads, kept from its F to its B (or W)
  double input = kDefaultInputShare;  ///< its input alone: what a recomputed micro-batch keeps from its F to its C
  double gradient = 1;               ///< its output gradient, kept from an I to its W

  friend constexpr bool operator==(const StashSize&, const StashSize&) = default;
};

/// The sizes of every stage's stashes: `all` for each stage, unless `stages`
/// holds one per virtual stage (the first stage's embedding, the last one's
/// loss, uneven layers). By default a stash is one activation, and so is a
/// kept gradient: peak memory then counts activations.
struct MemoryModel {
  StashSize all{};
  std::vector<StashSize> stages{};  ///< [virtual stage]; empty: `all` for each

  /// The sizes of virtual stage `stage`.
  constexpr const StashSize& of(int stage) const {
    return stages.empty() ? all : stages[static_cast<std::size_t>(stage)];
  }

  friend constexpr bool operator==(const MemoryModel&, const MemoryModel&) = default;
};

/// What is wrong with a memory model for a shape of `stages` virtual stages
/// (empty when nothing is): a size below 0, an input larger than its stash,
/// or a list of sizes that is not one per stage.
constexpr Text memory_model_error(const MemoryModel& m, int stages) {
  Text t;
  if (!m.stages.empty() && m.stages.size() != static_cast<std::size_t>(stages)) {
    t << "memory model: " << static_cast<long long>(m.stages.size()) << " stash sizes for " << stages
      << " virtual stages; give one per stage, or none";
    return t;
  }
  auto bad = [](double x) { return !(x >= 0) || x > 1e300; };  // negative, NaN or infinite
  for (int st = -1; st < static_cast<int>(m.stages.size()) && t.empty(); ++st) {
    const StashSize& z = st < 0 ? m.all : m.stages[static_cast<std::size_t>(st)];
    Text who("memory model");
    if (st >= 0) who << ", stage " << st;
    if (bad(z.stash) || bad(z.input) || bad(z.gradient))
      t << who.view() << ": the stash, input and gradient sizes must be finite and at least 0";
    else if (z.input > z.stash)
      t << who.view() << ": the input is a part of the stash, so it cannot be larger than the stash";
  }
  return t;
}

/// What a program does with the stash of each (device, chunk, micro-batch)
/// besides keeping it: recomputes it (a C) or offloads it (an O) before its
/// backward, and offloads it in its weight window (an O after its I).
class StashFates {
 public:
  constexpr StashFates() = default;
  /// None yet, for a shape; mark() adds them.
  constexpr explicit StashFates(const ScheduleShape& s)
      : chunks_(s.chunks), micro_batches_(s.micro_batches), flags_(s.devices * s.chunks * s.micro_batches, 0) {}
  /// Those of a program.
  constexpr explicit StashFates(const Program& p) : StashFates(p.shape) {
    for (std::size_t d = 0; d < p.devices.size(); ++d)
      for (const Action& a : p.devices[d]) mark(static_cast<int>(d), a);
  }
  /// Counts device d's action `a` in, when it is a C, an O or an I in range (the verifier names the
  /// others); device d's actions come in their order.
  constexpr void mark(int device, const Action& a) {
    if (!in_range(a.chunk, a.micro_batch)) return;
    unsigned char& f = flags_[index(device, a.chunk, a.micro_batch)];
    if (is_recompute(a.phase)) f |= 1;
    if (phase_row(a.phase).offloads) f |= (f & 8) ? 4 : 2;
    if (a.phase == Phase::kBackwardInput) f |= 8;
  }
  /// True when device d's program recomputes its (chunk, micro-batch).
  constexpr bool recomputed(int device, int chunk, int micro_batch) const { return (flags(device, chunk, micro_batch) & 1) != 0; }
  /// True when device d's program offloads its (chunk, micro-batch) between its forward and its backward.
  constexpr bool offloaded(int device, int chunk, int micro_batch) const { return (flags(device, chunk, micro_batch) & 2) != 0; }
  /// True when it offloads it in its weight window: the O after its I, the L before its W.
  constexpr bool weight_window(int device, int chunk, int micro_batch) const {
    return (flags(device, chunk, micro_batch) & 4) != 0;
  }
  /// True when the program offloads some stash.
  constexpr bool any_offloaded() const {
    for (int i = 0; i < flags_.size(); ++i)
      if (flags_[i] & 6) return true;
    return false;
  }

 private:
  constexpr unsigned char flags(int device, int chunk, int micro_batch) const {
    const int i = index(device, chunk, micro_batch);
    return in_range(chunk, micro_batch) && i >= 0 && i < flags_.size() ? flags_[i] : 0;
  }
  constexpr bool in_range(int c, int m) const { return c >= 0 && c < chunks_ && m >= 0 && m < micro_batches_; }
  constexpr int index(int d, int c, int m) const { return (d * chunks_ + c) * micro_batches_ + m; }

  int chunks_ = 0, micro_batches_ = 0;
  detail::Buffer<unsigned char> flags_{};
};

/// What a device keeps as its actions run (see the file comment): after()
/// applies one action; `stashes` and `memory` are the counts now, `peak_*` the
/// most so far. `stashes` counts the micro-batches kept (a recomputed one
/// counts, whole or not); `memory` sums their sizes and the kept gradients.
struct KeptCount {
  int stashes = 0;
  int peak_stashes = 0;
  double memory = 0;
  double peak_memory = 0;

  /// Applies action `a`, of a stage of sizes `size`, whose (chunk,
  /// micro-batch) the program recomputes or not (an offloaded one is not
  /// recomputed: its forward keeps the whole stash until its O), and offloads
  /// in its weight window or not (an O or L there moves the kept gradient too).
  constexpr void after(const Action& a, const StashSize& size, bool recomputed, bool weight_window = false) {
    const PhaseRow& row = phase_row(a.phase);
    const double copied = size.stash + (weight_window ? size.gradient : 0);
    stashes += row.stash_delta;
    if (row.needs.keeps) memory += recomputed ? size.input : size.stash;
    else if (is_copy(a.phase)) memory += row.offloads ? -copied : copied;
    else if (row.restores) memory += size.stash - size.input;  // C: the rest of the stash
    else if (row.needs.releases) memory -= size.stash;
    memory += row.gradient_delta * size.gradient;
    if (stashes > peak_stashes) peak_stashes = stashes;
    if (memory > peak_memory) peak_memory = memory;
  }
};

/// What each device of a program keeps, counted after each action in its
/// order under a memory model (see the file comment); one per device.
constexpr std::vector<KeptCount> kept_counts(const Program& p, const MemoryModel& model = {}) {
  std::vector<KeptCount> kept(p.devices.size());
  const StashFates fates(p);
  const int M = p.shape.micro_batches;
  for (std::size_t d = 0; d < p.devices.size(); ++d) {
    const int device = static_cast<int>(d);
    detail::Buffer<bool> input_done(p.shape.chunks * M, false);  // [chunk * M + micro-batch]: its I has run
    for (const Action& a : p.devices[d]) {
      if (a.chunk < 0 || a.chunk >= p.shape.chunks || a.micro_batch < 0 || a.micro_batch >= M) continue;  // the verifier names them
      bool& done = input_done[a.chunk * M + a.micro_batch];
      kept[d].after(a, model.of(p.shape.stage_of(device, a.chunk)), fates.recomputed(device, a.chunk, a.micro_batch),
                    is_copy(a.phase) && done);
      done = done || a.phase == Phase::kBackwardInput;
    }
  }
  return kept;
}

/// Peak memory of each device from a program's order: the most it keeps at
/// once, stashes and gradients kept for a W, in the memory model's unit (by
/// default one activation). Exact for the order: every host frees and keeps
/// where the actions say.
constexpr std::vector<double> peak_memory(const Program& p, const MemoryModel& model = {}) {
  std::vector<double> peak;
  for (const KeptCount& k : kept_counts(p, model)) peak.push_back(k.peak_memory);
  return peak;
}

/// Peak activations of each device from a program's order: the most
/// micro-batches it keeps a stash of at once (a stash lives until its B, or its
/// W, and is away from its O to its L), whole or as its input alone.
constexpr std::vector<int> peak_activations(const Program& p) {
  std::vector<int> peak;
  for (const KeptCount& k : kept_counts(p)) peak.push_back(k.peak_stashes);
  return peak;
}

}  // namespace pipeweave
