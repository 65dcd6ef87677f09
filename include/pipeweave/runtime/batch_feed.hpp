#pragma once
/// \file
/// A device's batch feed (runtime/session.hpp): the step's inputs (at the first
/// virtual stage) or targets (at the last) copied to the device one micro-batch
/// at a time, ahead of the action that reads them, so that the copies run beside
/// the compute instead of before it.
///
/// With a CopyLaneBackend the feed copies on a copy_side() of the device's
/// backend (a GPU: a stream of its own). A step starts with the copies of the
/// first kAhead micro-batches in the order the device reads them; the action
/// that reads micro-batch m first has the device wait (wait_for) for m's copy,
/// and issues the copy kAhead places further on. Host memory the backend says is
/// page-locked (`page_locked(p, n)`, where it has it) is copied from directly;
/// other host memory is first copied on the host, micro-batch by micro-batch,
/// into page-locked memory the feed owns (allocate_host), so that the copy on the
/// stream never makes the host wait. The caller's batch stays untouched until
/// the step ends.
///
/// Any other backend uploads the whole batch on the device's own backend when
/// the step starts.
///
/// \code
/// // once, on the device's thread, for a device that reads the batch's inputs:
/// // pipeweave::BatchFeed<B> feed(backend, inputs_buffer, floats_per_micro_batch, order);
/// // a step:   feed.start(backend, host_inputs);
/// // before the first forward of micro-batch m:   feed.ready(backend, m);
/// \endcode

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/copy_lane.hpp"

namespace pipeweave {

/// A device's feed of one part of the batch, inputs or targets (see the file comment).
template <Backend B>
class BatchFeed {
 public:
  /// Whether the copies run beside the device's compute (B is a CopyLaneBackend).
  static constexpr bool kBeside = CopyLaneBackend<B>;
  /// Micro-batches whose copies are issued before the device reads the first.
  static constexpr std::size_t kAhead = 2;

  /// Feeds `device_memory` (`order.size()` micro-batches of `per_micro_batch`
  /// floats each, micro-batch m at m * per_micro_batch) of `device`, the
  /// backend every later call is given; `order` lists each micro-batch once, in
  /// the order the device first reads them.
  BatchFeed(const B& device, float* device_memory, std::size_t per_micro_batch, std::vector<int> order)
      : memory_(device_memory), per_(per_micro_batch), order_(std::move(order)),
        position_(order_.size(), 0), lane_(device) {
    for (std::size_t i = 0; i < order_.size(); ++i) position_[static_cast<std::size_t>(order_[i])] = i;
    if constexpr (kBeside) marks_.resize(order_.size());
  }

  /// A step starts with the batch's part at `host` (all micro-batches, in
  /// micro-batch order), untouched until the step ends: the first copies go.
  void start(B& device, const float* host) {
    host_ = host;
    if constexpr (kBeside) {
      staged_ = false;
      if constexpr (requires(const B& b, const float* p, std::size_t n) { { b.page_locked(p, n) } -> std::same_as<bool>; })
        staged_ = !device.page_locked(host, order_.size() * per_);
      if (staged_ && staging_.size() == 0) staging_ = device.allocate_host(order_.size() * per_);
      for (std::size_t i = 0; i < std::min(kAhead, order_.size()); ++i) issue(i);
    } else {
      device.upload(host, memory_, order_.size() * per_);
    }
  }

  /// The device's work from now on reads micro-batch m (the first time this
  /// step): it follows m's copy, and the copy kAhead places further goes.
  void ready(B& device, int m) {
    if constexpr (kBeside) {
      const std::size_t i = position_[static_cast<std::size_t>(m)];
      device.wait_for(marks_[i]);
      if (i + kAhead < order_.size()) issue(i + kAhead);
    }
  }

  /// Waits until every copy issued has ended (after a failed step, before the
  /// next writes the memory they read or write).
  void settle() { lane_.settle(); }

 private:
  // The copy of the micro-batch at place i of the order, through the staging memory unless the caller's is page-locked.
  void issue(std::size_t i) {
    if constexpr (kBeside) {
      const std::size_t at = static_cast<std::size_t>(order_[i]) * per_;
      const float* from = host_ + at;
      if (staged_) {
        std::memcpy(staging_.data() + at, from, per_ * sizeof(float));
        from = staging_.data() + at;
      }
      lane_->upload(from, memory_ + at, per_);
      lane_->mark(marks_[i]);
    }
  }

  float* memory_;
  std::size_t per_;
  std::vector<int> order_;            // micro-batches in the order the device first reads them
  std::vector<std::size_t> position_;  // [micro-batch]: its place in order_
  const float* host_ = nullptr;
  bool staged_ = false;  // this step's batch goes through staging_
  typename detail::LaneHostMemory<B>::type staging_{};  // (it outlives lane_'s copies)
  detail::OwnedLane<B> lane_;
  typename detail::LaneMarks<B>::type marks_;  // [place in the order]: where its copy ended on the lane
};

}  // namespace pipeweave
