#pragma once
/// \file
/// The copy lane of a device (runtime/session.hpp): where its offloads (O) and
/// reloads (L) move stashes between the device's memory and the host slots of
/// its chunks (runtime/plan.hpp), host memory the lane owns.
///
/// With a CopyLaneBackend (the CPU's, a GPU's) the lane is a copy_side() of the
/// device's backend, with host memory from allocate_host() (page-locked on a
/// GPU). A copy is issued where the plan says (an offload's when the action
/// that completes its stash ends, a reload's at its L: runtime/plan.hpp); it
/// first waits (wait_for) for everything the device enqueued before it, runs on
/// the lane (a GPU: the side's stream, so the host does not wait) and marks its
/// end; the device waits for that mark where the plan says
/// (PlannedStep::waits_copy: at the O, and before the action that reads what an
/// L wrote). So the copies run beside the compute, as the simulator's copy lane
/// does, and their time stamps are the lane's (Lane::kCopy).
///
/// With any other backend the copies run on the device's own backend into
/// plain host memory, after a synchronize() (a copy to or from pageable memory
/// may block the host, so it waits where a transport polls), and take their
/// time from the device's compute.
///
/// \code
/// // once, on the device's thread, for a plan that offloads:
/// // pipeweave::CopyLane<B> lane(backend, recorder, plan, strides);
/// // step t's copy k, issued:  lane.run(t, k, [&](B& on) { ... on.download(stash, lane.host(c, slot), n) ... });
/// // a later step:             lane.wait(k);  // the device's work from now on follows copy k
/// \endcode

#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/recorder.hpp"

namespace pipeweave {

namespace detail {

/// A copy_side() of a device (CopyLaneBackend; empty for another backend) that
/// waits for its copies when it goes, since they may read or write host memory
/// that goes right after it. A moved-from one waits for nothing.
template <class B>
class OwnedLane {
 public:
  OwnedLane() = default;
  explicit OwnedLane(const B& device) {
    if constexpr (CopyLaneBackend<B>) lane_.emplace(device.copy_side());
  }
  OwnedLane(OwnedLane&& o) noexcept : lane_(std::move(o.lane_)) { o.lane_.reset(); }
  OwnedLane& operator=(OwnedLane&&) = delete;
  OwnedLane(const OwnedLane&) = delete;
  OwnedLane& operator=(const OwnedLane&) = delete;
  ~OwnedLane() { finish(); }

  /// The lane's backend (a CopyLaneBackend's only).
  B& operator*() { return *lane_; }
  /// The lane's backend (a CopyLaneBackend's only).
  B* operator->() { return &*lane_; }
  /// Waits until every copy enqueued on the lane has ended; throws pipeweave::Error where it fails.
  void settle() {
    if (lane_) lane_->synchronize();
  }

 private:
  void finish() noexcept {
    try {
      settle();
    } catch (...) {  // the device failed already: its copies are over too
    }
  }
  std::optional<B> lane_;
};

/// The host memory of a copy lane: the backend's (allocate_host) or plain.
template <class B>
struct LaneHostMemory {
  using type = std::vector<float>;
  static type make(B& /*device*/, std::size_t n) { return type(n); }
};
template <CopyLaneBackend B>
struct LaneHostMemory<B> {
  using type = decltype(std::declval<B&>().allocate_host(std::size_t{}));
  static type make(B& device, std::size_t n) { return device.allocate_host(n); }
};

/// The marks of a lane's copies: the backend's points in its work, where it has them.
template <class B>
struct LaneMarks {
  using type = std::vector<char>;
};
template <CopyLaneBackend B>
struct LaneMarks<B> {
  using type = std::vector<typename B::Mark>;
};

}  // namespace detail

/// A device's copy lane and host slots (see the file comment).
template <Backend B>
class CopyLane {
 public:
  /// Whether copies run beside the device's compute (B is a CopyLaneBackend).
  static constexpr bool kBeside = CopyLaneBackend<B>;

  /// The lane of `device` for `plan` (its copies and host slots), with
  /// `strides[c]` floats per host slot of local chunk c; its stamps go to
  /// `recorder`. The device, recorder and plan outlive the lane.
  CopyLane(B& device, StepRecorder<B>& recorder, const DevicePlan& plan, std::span<const std::size_t> strides)
      : device_(device), recorder_(recorder), strides_(strides.begin(), strides.end()), lane_(device) {
    for (std::size_t c = 0; c < strides_.size(); ++c)
      host_.push_back(detail::LaneHostMemory<B>::make(
          device, static_cast<std::size_t>(plan.host_slots[c]) * strides_[c]));
    if constexpr (kBeside) recorder_.add_lane(Lane::kCopy, *lane_);
    marks_.resize(static_cast<std::size_t>(plan.copies));
  }
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  /// Host slot `slot` of local chunk c: strides[c] floats.
  float* host(int c, int slot) {
    return host_[static_cast<std::size_t>(c)].data() + static_cast<std::size_t>(slot) * strides_[static_cast<std::size_t>(c)];
  }

  /// Step `step`'s copy number `copy` (PlannedCompute::copy): body(backend)
  /// enqueues its copies on the backend it is given, the lane's, after
  /// everything the device enqueued so far.
  template <class Body>
  void run(int step, int copy, Body&& body) {
    if constexpr (kBeside) {
      B& lane = *lane_;
      lane.wait_for(device_);
      const std::size_t start = recorder_.stamp(Lane::kCopy);
      body(lane);
      recorder_.on_copy_end(step, start, Lane::kCopy);
      lane.mark(marks_[static_cast<std::size_t>(copy)]);
    } else {
      device_.synchronize();
      const std::size_t start = recorder_.stamp();
      body(device_);
      recorder_.on_copy_end(step, start, Lane::kMain);
    }
  }

  /// The device's work enqueued from now on follows copy `copy` (its host does not wait).
  void wait(int copy) {
    if constexpr (kBeside) device_.wait_for(marks_[static_cast<std::size_t>(copy)]);
  }
  /// The device's work enqueued from now on follows every copy issued so far.
  void wait_all() {
    if constexpr (kBeside) device_.wait_for(*lane_);
  }

  /// Waits until every copy enqueued has ended (after a failed step, before the
  /// next reuses the memory they touch).
  void settle() { lane_.settle(); }

 private:
  B& device_;
  StepRecorder<B>& recorder_;
  std::vector<std::size_t> strides_;                         // [chunk]: floats per host slot
  std::vector<typename detail::LaneHostMemory<B>::type> host_;  // [chunk]: its host slots (they outlive lane_'s copies)
  detail::OwnedLane<B> lane_;                                // the side the copies run on
  typename detail::LaneMarks<B>::type marks_;                // [copy]: where it ended on the lane
};

}  // namespace pipeweave
