#pragma once
/// \file
/// A device's data-parallel gradient reductions: the ReplicaReducer runs each
/// R(c) of the device's program for its session (runtime/session.hpp), chunk
/// c's gradients summed over the D devices that hold it (runtime/replicas.hpp).
///
/// The device hands each R to its reducer and goes on with its next action.
/// Where the backend has a side() (OverlapBackend), the reducer is a side
/// backend driven by a thread of its own (QueueThread): the reduction starts
/// once every action before it is done, runs beside the rest of the program, and
/// the reductions of a device run in program order, the same on every replica.
/// The optimizer waits for them. A backend without a side() runs R on the
/// device's thread. An in-place collective (the CPU's HostReplicaGroup, NCCL's
/// in cuda/replicas.hpp) sums the gradients where they lie; any other gets a
/// host copy of them. A deferred collective (across processes: mpi/replicas.hpp)
/// is started by R on the device's thread and moves the gradients while the
/// device goes on; the optimizer ends it. With one replica, R sums nothing.
///
/// Which of these runs is chosen once, when the session is made
/// (make_replica_reducer(): by the collective's kind and the backend's type); a
/// step only calls the reducer: start() when it begins, post(t) at step t's R,
/// finish() before the optimizer (the first reduction that failed is the step's
/// error); after a failed step (the run aborted), settle() waits until no sum
/// still touches any device's memory, and reset() before the next step forgets
/// what the failed one left. A reduction's error names the device, the step and
/// the R, and the device and replica once (rethrow_at).
///
/// \code
/// // in a device's session, once, with its plan, backend, recorder and replica group:
/// // auto reducer = pipeweave::make_replica_reducer<B>({plan, backend, recorder, link, chunk_tensors});
/// // every step, on the device's thread:
/// // reducer->start();
/// // ... at step t, an R: reducer->post(t); the device goes on ...
/// // reducer->finish();  // every chunk's gradients hold their sum over the replicas
/// \endcode

#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/recorder.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "pipeweave/runtime/side_thread.hpp"
#include "pipeweave/schedule/kinds.hpp"

namespace pipeweave {

/// Where a device's replica group is (data parallelism): the group of the D
/// devices that hold the same pipeline device, and this one's replica index;
/// no group for a run of one replica.
struct ReplicaLink {
  ReplicaCollective* group = nullptr;  ///< the group; null: one replica
  int replica = 0;                     ///< this device's replica
};

/// What a device's reducer works with, the session's (all outlive the reducer).
template <Backend B>
struct ReducerParts {
  const DevicePlan& plan;       ///< the device's plan: its R steps
  B& backend;                   ///< the device's backend
  StepRecorder<B>& recorder;    ///< where the reductions' time stamps go
  ReplicaLink link;             ///< the replica group and the device's replica
  std::vector<std::span<const ParameterView>> chunks;  ///< [local chunk]: its parameter tensors
};

/// The gradient reductions of one device (see the file comment). The
/// device's thread calls every member.
template <Backend B>
class ReplicaReducer {
 public:
  virtual ~ReplicaReducer() = default;
  ReplicaReducer(const ReplicaReducer&) = delete;
  ReplicaReducer& operator=(const ReplicaReducer&) = delete;

  /// A step begins (forgets what the last one started).
  virtual void start() {}
  /// The device reached step `step`'s R: runs, starts or queues it.
  virtual void post(int step) = 0;
  /// Waits for every reduction of the step (the optimizer reads their sums);
  /// throws the error of the first that failed.
  virtual void finish() {}
  /// After a failed step: waits until the reductions handed over have ended
  /// (the abort ends their waits), so that no sum still touches any memory.
  virtual void settle() {}
  /// Before the step after a failed one: settle(), and their marks forgotten.
  void reset() {
    settle();
    parts_.recorder.on_reset();
  }

 protected:
  /// With the session's parts.
  explicit ReplicaReducer(ReducerParts<B> parts) : parts_(std::move(parts)) {}
  /// Runs sum(b, c) for step `step`'s R(c) on backend `b`; an error names the
  /// device, the step and the R (rethrow_at).
  template <class Sum>
  void run(B& b, int step, Sum& sum);
  /// Runs step `step`'s R on the device's thread, as one of its actions.
  template <class Sum>
  void run_here(int step, Sum& sum) {
    const std::size_t start = parts_.recorder.stamp();
    run(parts_.backend, step, sum);
    parts_.recorder.on_action_end(step, start);
  }

  ReducerParts<B> parts_;  ///< what it works with
};

/// The reducer of a device's session: the one place that chooses how its R
/// runs (see the file comment). Throws pipeweave::Error when the collective is
/// both deferred and in place.
template <Backend B>
std::unique_ptr<ReplicaReducer<B>> make_replica_reducer(ReducerParts<B> parts);

namespace detail {

/// One replica: its gradients are their sum already.
template <Backend B>
struct NoSum {
  explicit NoSum(const ReducerParts<B>&) {}
  void operator()(B&, int) {}
};

/// The host copy of every local chunk's gradients, which a collective that is
/// not in place sums.
template <Backend B>
class HostCopies {
 public:
  /// Room for the gradients of every chunk of `parts`.
  explicit HostCopies(const ReducerParts<B>& parts);
  /// Copies chunk c's gradients from `b` once its work so far is done.
  void download(B& b, int c);
  /// Copies chunk c's (summed) host copy back to its gradients on `b`.
  void upload(B& b, int c);
  /// Chunk c's tensors in its host copy.
  std::span<const std::span<float>> tensors(int c) const { return copies_[static_cast<std::size_t>(c)].tensors; }

 private:
  struct Copy {
    std::vector<float> floats;              // the chunk's gradients, one tensor after another
    std::vector<std::span<float>> tensors;  // ... each tensor in it
  };
  std::vector<std::span<const ParameterView>> chunks_;
  std::vector<Copy> copies_;  // [local chunk]
};

/// The sum through a host copy: down, summed by the collective, up.
template <Backend B>
class StagedSum {
 public:
  explicit StagedSum(const ReducerParts<B>& parts) : link_(parts.link), host_(parts) {}
  void operator()(B& b, int c) {
    host_.download(b, c);
    link_.group->all_reduce(link_.replica, c, host_.tensors(c));
    host_.upload(b, c);
  }

 private:
  ReplicaLink link_;
  HostCopies<B> host_;
};

/// The sum where the gradients lie, in the memory of B (InPlaceReplicaCollective).
template <Backend B>
class InPlaceSum {
 public:
  InPlaceSum(const ReducerParts<B>& parts, InPlaceReplicaCollective<B>& group);
  void operator()(B& b, int c) {
    group_->all_reduce_on(b, replica_, c, tensors_[static_cast<std::size_t>(c)]);
  }

 private:
  InPlaceReplicaCollective<B>* group_;
  int replica_;
  std::vector<std::vector<std::span<float>>> tensors_;  // [local chunk]: its gradient tensors
};

/// R on the device's thread, as one of its actions: a backend without a
/// side(), or one replica.
template <Backend B, class Sum>
class InlineReducer final : public ReplicaReducer<B> {
 public:
  InlineReducer(ReducerParts<B> parts, Sum sum) : ReplicaReducer<B>(std::move(parts)), sum_(std::move(sum)) {}
  void post(int step) override { this->run_here(step, sum_); }

 private:
  Sum sum_;
};

/// A deferred collective's R: started on the device's thread through a host
/// copy, ended by finish() (see the file comment).
template <Backend B>
class DeferredReducer final : public ReplicaReducer<B> {
 public:
  explicit DeferredReducer(ReducerParts<B> parts) : ReplicaReducer<B>(std::move(parts)), host_(this->parts_) {}
  void start() override { started_.clear(); }
  void post(int step) override {
    auto begin = [this](B& b, int c) {
      host_.download(b, c);
      this->parts_.link.group->all_reduce(this->parts_.link.replica, c, host_.tensors(c));
      started_.push_back(c);  // its sum lands in finish()
    };
    this->run_here(step, begin);
  }
  /// Ends every sum started, in order; each R's event then lasts until now.
  void finish() override;

 private:
  HostCopies<B> host_;
  std::vector<int> started_;  // the chunks whose sums this step started, in order
};

/// R on the reducer, a side backend of the device, from a thread of its own
/// (QueueThread), in program order (see the file comment).
template <OverlapBackend B, class Sum>
class ThreadedReducer final : public ReplicaReducer<B> {
 public:
  /// Starts the thread, bound to the device before any reduction.
  ThreadedReducer(ReducerParts<B> parts, Sum sum);
  void start() override { posted_ = 0; }
  /// Marks where the device's work stands and queues the R: the reducer's
  /// thread takes the wait when it takes the R, so a reduction queued behind
  /// another does not also wait for the device's later work.
  void post(int step) override;
  void finish() override;
  void settle() override { (void)thread_->drain(); }

 private:
  static constexpr int kBind = -1;  // the thread's first item: bind it to the device
  void run_item(int k);             // on the thread: the device's reduction number k of the step

  Sum sum_;
  B reducer_;                              // the backend the reductions run on
  std::vector<int> steps_;                 // [k]: the step of the device's reduction number k
  std::vector<typename B::Mark> ready_;    // [k]: where the device's work stood when it reached it
  int posted_ = 0;                         // how many were posted in this step
  std::unique_ptr<QueueThread> thread_;    // last: it reads the members above
};

/// The R of a backend with a side() on its reducer's thread, else on the device's.
template <Backend B, class Sum>
std::unique_ptr<ReplicaReducer<B>> reducer_with(ReducerParts<B> parts, Sum sum) {
  if constexpr (OverlapBackend<B>)
    return std::make_unique<ThreadedReducer<B, Sum>>(std::move(parts), std::move(sum));
  else
    return std::make_unique<InlineReducer<B, Sum>>(std::move(parts), std::move(sum));
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Definitions.

template <Backend B>
std::unique_ptr<ReplicaReducer<B>> make_replica_reducer(ReducerParts<B> parts) {
  ReplicaCollective* group = parts.link.group;
  if (group == nullptr || group->replicas() == 1) {
    detail::NoSum<B> none(parts);
    return std::make_unique<detail::InlineReducer<B, detail::NoSum<B>>>(std::move(parts), none);
  }
  auto* in_place = dynamic_cast<InPlaceReplicaCollective<B>*>(group);
  if (group->deferred()) {
    if (in_place != nullptr)
      throw_error({.device = parts.plan.device}, "a replica collective is either deferred or in place, not both");
    return std::make_unique<detail::DeferredReducer<B>>(std::move(parts));  // the device's thread starts and ends them
  }
  if (in_place != nullptr) {
    detail::InPlaceSum<B> sum(parts, *in_place);
    return detail::reducer_with(std::move(parts), std::move(sum));
  }
  detail::StagedSum<B> sum(parts);
  return detail::reducer_with(std::move(parts), std::move(sum));
}

template <Backend B>
template <class Sum>
void ReplicaReducer<B>::run(B& b, int step, Sum& sum) {
  const PlannedCompute& pc = parts_.plan.steps[static_cast<std::size_t>(step)].compute;
  try {
    sum(b, pc.action.chunk);
  } catch (const std::exception& e) {
    const ReplicaCollective* group = parts_.link.group;
    rethrow_at({.device = parts_.plan.device, .step = step, .action = pc.action, .stage = pc.stage}, e,
               group != nullptr && group->replicas() > 1 ? parts_.link.replica : -1);
  }
}

template <Backend B>
detail::HostCopies<B>::HostCopies(const ReducerParts<B>& parts) : chunks_(parts.chunks), copies_(chunks_.size()) {
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    std::size_t n = 0;
    for (const ParameterView& p : chunks_[c]) n += p.count;
    copies_[c].floats.assign(n, 0.0f);
    n = 0;
    for (const ParameterView& p : chunks_[c]) {
      copies_[c].tensors.emplace_back(copies_[c].floats.data() + n, p.count);
      n += p.count;
    }
  }
}

template <Backend B>
void detail::HostCopies<B>::download(B& b, int c) {
  Copy& host = copies_[static_cast<std::size_t>(c)];
  std::size_t at = 0;
  b.synchronize();  // the chunk's backwards are done
  for (const ParameterView& p : chunks_[static_cast<std::size_t>(c)]) {
    b.download(p.gradient, host.floats.data() + at, p.count);
    at += p.count;
  }
  b.synchronize();
}

template <Backend B>
void detail::HostCopies<B>::upload(B& b, int c) {
  const Copy& host = copies_[static_cast<std::size_t>(c)];
  std::size_t at = 0;
  for (const ParameterView& p : chunks_[static_cast<std::size_t>(c)]) {
    b.upload(host.floats.data() + at, p.gradient, p.count);
    at += p.count;
  }
  b.synchronize();
}

template <Backend B>
detail::InPlaceSum<B>::InPlaceSum(const ReducerParts<B>& parts, InPlaceReplicaCollective<B>& group)
    : group_(&group), replica_(parts.link.replica), tensors_(parts.chunks.size()) {
  for (std::size_t c = 0; c < parts.chunks.size(); ++c)
    for (const ParameterView& p : parts.chunks[c]) tensors_[c].emplace_back(p.gradient, p.count);
}

template <Backend B>
void detail::DeferredReducer<B>::finish() {
  if (started_.empty()) return;
  B& b = this->parts_.backend;
  this->parts_.link.group->complete(this->parts_.link.replica);
  for (const int c : started_) host_.upload(b, c);
  this->parts_.recorder.on_deferred_reductions_end();
  started_.clear();
}

template <OverlapBackend B, class Sum>
detail::ThreadedReducer<B, Sum>::ThreadedReducer(ReducerParts<B> parts, Sum sum)
    : ReplicaReducer<B>(std::move(parts)), sum_(std::move(sum)), reducer_(this->parts_.backend.side()) {
  const std::vector<PlannedStep>& steps = this->parts_.plan.steps;
  for (std::size_t t = 0; t < steps.size(); ++t)
    if (steps[t].has_compute && is_collective(steps[t].compute.action.phase)) steps_.push_back(static_cast<int>(t));
  ready_.resize(steps_.size());
  this->parts_.recorder.reserve_reductions(steps_.size());
  this->parts_.recorder.add_lane(Lane::kReducer, reducer_);
  thread_ = std::make_unique<QueueThread>([this](int k) { run_item(k); }, steps_.size());
  thread_->post(kBind);
  if (const std::exception_ptr e = thread_->drain()) std::rethrow_exception(e);
}

template <OverlapBackend B, class Sum>
void detail::ThreadedReducer<B, Sum>::post(int step) {
  const int k = posted_++;
  this->parts_.backend.mark(ready_[static_cast<std::size_t>(k)]);
  this->parts_.recorder.on_reduction_posted(step);
  thread_->post(k);
}

template <OverlapBackend B, class Sum>
void detail::ThreadedReducer<B, Sum>::finish() {
  B& device = this->parts_.backend;
  // The device's own work first, in a wait that polls the transport (a GPU
  // transfer that stalls is caught there, not in a reducer waiting behind it).
  device.synchronize();
  if (const std::exception_ptr e = thread_->drain()) std::rethrow_exception(e);
  device.wait_for(reducer_);
  this->parts_.recorder.on_reductions_joined();
}

template <OverlapBackend B, class Sum>
void detail::ThreadedReducer<B, Sum>::run_item(int k) {
  if (k == kBind) {
    bind_thread(reducer_);
    return;
  }
  const int step = steps_[static_cast<std::size_t>(k)];
  reducer_.wait_for(ready_[static_cast<std::size_t>(k)]);
  const std::size_t start = this->parts_.recorder.stamp(Lane::kReducer);
  this->run(reducer_, step, sum_);
  this->parts_.recorder.on_reduction_end(step, start);
}

}  // namespace pipeweave
