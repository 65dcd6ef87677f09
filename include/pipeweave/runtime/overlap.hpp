#pragma once
/// \file
/// The overlapped pairs of a device (runtime/session.hpp): OverlapPairs runs a
/// pair's two halves at once, a forward on the device's backend from the device's
/// thread and the next step's backward on the backend's side (OverlapBackend: on
/// a GPU its second stream, ordered after the main stream's work so far by an
/// event) from the device's second thread (SideThread); then the main stream
/// waits for the side's. Both halves end before anything fails out of a pair;
/// the forward's error comes first. The halves' time stamps go to the device's
/// StepRecorder (runtime/recorder.hpp), each on its own lane.
///
/// \code
/// // once, on the device's thread, for a plan with pairs:
/// // pipeweave::OverlapPairs<B> pairs(backend, recorder, device);
/// // at step t, a pair:
/// // pairs.run(t, [&](B& main) { ... forward of step t ... }, [&](B& side) { ... backward of step t + 1 ... });
/// \endcode

#include <exception>
#include <memory>
#include <optional>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/recorder.hpp"
#include "pipeweave/runtime/side_thread.hpp"

namespace pipeweave {

/// The side backend and thread of a device's overlapped pairs (see the file comment).
template <Backend B>
class OverlapPairs {
 public:
  /// The side of `device` (device number `device_id`, for errors), its thread
  /// bound to the device before it runs any half; the side's stamps go to
  /// `recorder`. Both outlive this object. Throws pipeweave::Error unless B is an
  /// OverlapBackend.
  OverlapPairs(B& device, StepRecorder<B>& recorder, int device_id);
  OverlapPairs(const OverlapPairs&) = delete;
  OverlapPairs& operator=(const OverlapPairs&) = delete;

  /// Runs step `step`'s pair: forward(device) here, at once with backward(side)
  /// (step `step` + 1's action) on the side's thread; returns when both have
  /// ended and the device's later work follows both. Rethrows the forward's
  /// error, else the backward's.
  template <class Forward, class Backward>
  void run(int step, Forward&& forward, Backward&& backward);

 private:
  B& device_;
  StepRecorder<B>& recorder_;
  std::optional<B> side_;                // the backend the backwards run on
  std::unique_ptr<SideThread> thread_;   // ... from this thread
};

template <Backend B>
OverlapPairs<B>::OverlapPairs(B& device, StepRecorder<B>& recorder, int device_id)
    : device_(device), recorder_(recorder) {
  if constexpr (OverlapBackend<B>) {
    side_.emplace(device.side());
    recorder_.add_lane(Lane::kSide, *side_);
    thread_ = std::make_unique<SideThread>();
    auto bind = [this] { bind_thread(*side_); };  // once, before the thread runs any half of a pair
    thread_->start(bind);
    if (const std::exception_ptr e = thread_->finish()) std::rethrow_exception(e);
  } else {
    throw_error({.device = device_id}, "the schedule runs overlapped pairs, but the backend has no second "
                "stream to run a pair's backward on (an OverlapBackend has side() and wait_for(); see "
                "runtime/backend.hpp)");
  }
}

template <Backend B>
template <class Forward, class Backward>
void OverlapPairs<B>::run(int step, Forward&& forward, Backward&& backward) {
  if constexpr (OverlapBackend<B>) {
    B& b = device_;
    B& side = *side_;
    side.wait_for(b);  // the side's work follows the group's receives and every earlier action
    Stamps main_half, side_half;
    auto backward_half = [&] {
      side_half.start = recorder_.stamp(Lane::kSide);
      backward(side);
      side_half.end = recorder_.stamp(Lane::kSide);
    };
    thread_->start(backward_half);
    main_half.start = recorder_.stamp();
    std::exception_ptr error;
    try {
      forward(b);
    } catch (...) {
      error = std::current_exception();
    }
    main_half.end = recorder_.stamp();
    const std::exception_ptr side_error = thread_->finish();
    // Later work (the groups that send the pair's outputs; after a failure, the
    // next step's zeroing of the gradients) follows both halves.
    try {
      b.wait_for(side);
    } catch (...) {
      if (!error && !side_error) throw;
    }
    if (error) std::rethrow_exception(error);
    if (side_error) std::rethrow_exception(side_error);
    recorder_.on_pair_end(step, main_half, side_half);
  }
}

}  // namespace pipeweave
