#pragma once
/// \file
/// What a device holds for the micro-batches it keeps, in bytes, as its
/// actions run: the stash slots its chunks hold (SizedChunk) and the buffers
/// of the tensors kept with them, x, y and a kept output gradient, each buffer
/// once however many tensors share it (a local neighbour stage's y is this
/// stage's x). The device session feeds it each action it ran; its peak is the
/// measured trace's peak_bytes.
///
/// A micro-batch of (chunk c, m) holds:
/// - from its forward: a slot (none where the program recomputes it: then
///   until its C only x and y), x (not the batch's), y, and at the last stage
///   the loss gradient dy the forward wrote;
/// - from its I: the slot's split part and dy;
/// - from its O to its L: nothing but what the plan did not move (a shared
///   buffer, or y with a send still to come);
/// - after its B, or its W: nothing.
/// A received tensor waiting for its action, and an input gradient waiting
/// for its send, are not kept: no stash counts them, and neither does this.
///
/// These are the rules memory.hpp's KeptCount applies to a memory model; under
/// the sizes of the built-in MLP in bytes (mlp_memory_model(),
/// model/mlp_pipeline.hpp) peak_memory() of the program predicts the peak
/// measured here, exactly wherever mlp_memory_model_exact() holds.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/phases.hpp"

namespace pipeweave {

/// The bytes a device holds for its kept micro-batches (see the file comment).
class HeldMemory {
 public:
  /// Measures nothing (a chunk that does not say its slots' bytes).
  HeldMemory() = default;
  /// For device plan `plan`: local chunk c's slots hold slot_bytes[c] (and
  /// split_bytes[c] more from an I to its W); buffer k of the plan holds
  /// buffer_bytes[k].
  HeldMemory(const DevicePlan& plan, std::vector<std::size_t> slot_bytes, std::vector<std::size_t> split_bytes,
             std::vector<std::size_t> buffer_bytes)
      : micro_batches_(plan.shape.micro_batches),
        last_stage_(plan.shape.stages() - 1),
        slot_(std::move(slot_bytes)),
        split_(std::move(split_bytes)),
        buffer_(std::move(buffer_bytes)),
        refs_(buffer_.size(), 0),
        kept_(slot_.size() * static_cast<std::size_t>(micro_batches_)) {}

  /// Whether it measures.
  bool on() const { return !slot_.empty(); }
  /// A step starts: nothing is held.
  void reset() {
    std::fill(refs_.begin(), refs_.end(), 0);
    std::fill(kept_.begin(), kept_.end(), Kept{});
    now_ = peak_ = 0;
  }
  /// The action `pc` has ended.
  void after(const PlannedCompute& pc) {
    if (!on() || pc.action.chunk < 0 || pc.action.micro_batch < 0 || is_collective(pc.action.phase)) return;
    const PhaseRow& row = phase_row(pc.action.phase);
    const auto c = static_cast<std::size_t>(pc.action.chunk);
    Kept& k = kept_[c * static_cast<std::size_t>(micro_batches_) + static_cast<std::size_t>(pc.action.micro_batch)];
    if (row.needs.keeps) {  // F
      set(k.slot, !pc.recomputed, slot_[c]);
      hold(k.x, pc.x);
      hold(k.y, pc.y);
      if (pc.stage == last_stage_) hold(k.dy, pc.dy);
    } else if (is_recompute(pc.action.phase)) {
      set(k.slot, true, slot_[c]);
    } else if (is_copy(pc.action.phase)) {
      const bool out = row.offloads;
      set(k.slot, !out, slot_[c]);
      if (pc.weight_window) set(k.split, !out, split_[c]);
      if (pc.moves_x) out ? release(k.x) : hold(k.x, pc.x);
      if (pc.moves_y) out ? release(k.y) : hold(k.y, pc.y);
      if (pc.moves_dy) out ? release(k.dy) : hold(k.dy, pc.dy);
    } else if (row.input_gradient && !row.weight_gradient) {  // I
      set(k.split, true, split_[c]);
      if (k.dy < 0) hold(k.dy, pc.dy);
    }
    if (row.needs.releases) {  // B or W
      set(k.slot, false, slot_[c]);
      set(k.split, false, split_[c]);
      release(k.x);
      release(k.y);
      release(k.dy);
    }
    peak_ = std::max(peak_, now_);
  }
  /// The bytes held now.
  std::size_t now() const { return now_; }
  /// The most bytes held at once since reset().
  std::size_t peak() const { return peak_; }

 private:
  struct Kept {
    int x = -1, y = -1, dy = -1;  // the buffers it holds (-1: none)
    bool slot = false, split = false;
  };
  // Holds buffer `id` (none below 0) as `at`.
  void hold(int& at, int id) {
    if (id < 0 || at == id) return;
    release(at);
    at = id;
    if (refs_[static_cast<std::size_t>(id)]++ == 0) now_ += buffer_[static_cast<std::size_t>(id)];
  }
  void release(int& at) {
    if (at < 0) return;
    if (--refs_[static_cast<std::size_t>(at)] == 0) now_ -= buffer_[static_cast<std::size_t>(at)];
    at = -1;
  }
  // Sets a part of a micro-batch's slot held or not, `bytes` large.
  void set(bool& held, bool to, std::size_t bytes) {
    if (held != to) now_ = to ? now_ + bytes : now_ - bytes;
    held = to;
  }

  int micro_batches_ = 0, last_stage_ = 0;
  std::vector<std::size_t> slot_, split_, buffer_;  // [chunk], [chunk], [buffer]
  std::vector<int> refs_;                           // [buffer]: the kept tensors it holds
  std::vector<Kept> kept_;                          // [chunk * M + m]
  std::size_t now_ = 0, peak_ = 0;
};

}  // namespace pipeweave
