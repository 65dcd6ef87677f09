#pragma once
/// \file
/// The data-parallel replicas of one pipeline device: ReplicaCollective, what a
/// device's session needs of them (the sum of a chunk's gradients over the
/// replicas, a gradient reduction R of grad_reduce.hpp, and their agreement),
/// and ReplicaGroup, that collective for replicas that are threads of one
/// process: a fixed-order all-reduce in host memory. The multi-process host has
/// its own (mpi/replicas.hpp), the same sum over ranks.
///
/// With D replicas of a P-device pipeline, the D devices that hold pipeline
/// device d hold the same chunks; when each reaches its R<c>, the gradients of
/// chunk c are summed over the D of them. The sum runs in replica order, g_0 +
/// g_1 + ... + g_{D-1} element by element from the left, so every replica gets
/// the same floats in every run, whatever thread comes first: replica r adds up
/// the r-th of D slices of each tensor, reading every replica's buffer there and
/// writing the sum back to all of them (no element is touched by two threads).
/// Two timed barriers frame it: all buffers are posted before anyone reads, and
/// nobody returns (and reuses its buffers) before everyone has written.
///
/// Every wait has the group's timeout and ends when the group is aborted (a
/// failure elsewhere), with an error naming the device, the replica and the
/// replicas it waited for: a failed replica never leaves the others hanging.
/// Standard library only.
///
/// \code
/// pipeweave::ReplicaGroup group(/*device=*/0, /*replicas=*/2, std::chrono::seconds(10));
/// // on replica r's thread, its gradients of chunk 0:
/// // std::span<float> g[] = {weights_grad, bias_grad};
/// // group.all_reduce(r, 0, g);   // both replicas now hold g_0 + g_1
/// \endcode

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave {

/// The collective of the D devices that hold one pipeline device, as a device's
/// reducer (runtime/reducer.hpp) uses it; `replica` is the calling device's.
/// Every sum is g_0 + g_1 + ... + g_{D-1} element by element from the left, so
/// every implementation gives the same floats.
class ReplicaCollective {
 public:
  virtual ~ReplicaCollective() = default;
  /// The number of replicas D.
  virtual int replicas() const = 0;
  /// False: all_reduce() returns with the sum, and may run on a thread of the
  /// device other than its own (a reducer's). True: all_reduce() only starts the
  /// sum, which complete() ends (both on the device's thread); the tensors must
  /// not change in between.
  virtual bool deferred() const { return false; }
  /// The sum over the replicas of chunk `chunk`'s gradient tensors, in place
  /// (started, when deferred()). Throws pipeweave::Error naming the device and
  /// the replica on a mismatch, a timeout or a failure elsewhere.
  virtual void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) = 0;
  /// Ends every sum all_reduce() started, in the order started (deferred() only).
  virtual void complete(int /*replica*/) {}
  /// Collective AND of `ok` over the replicas.
  virtual bool agree(int replica, bool ok) = 0;
  /// Ends every wait of the collective with an error quoting `reason`. Safe from any thread.
  virtual void abort(std::string_view reason) noexcept = 0;
  /// Makes the collective usable again after a failed step; called between
  /// steps, from the host, while no replica is inside it.
  virtual void reset() = 0;
};

/// A collective that sums where the gradients are, in the memory of backend B
/// (the host's for the CPU, a GPU's for NCCL), with no host copy: a device's
/// reducer calls all_reduce_on() instead of staging the tensors through the
/// host for all_reduce().
template <class B>
class InPlaceReplicaCollective : public ReplicaCollective {
 public:
  /// The sum over the replicas of chunk `chunk`'s gradient tensors, which lie in
  /// the memory of `b` (the backend the reduction runs on, on its thread): on
  /// return they hold it for every later work of `b`. Throws as all_reduce().
  virtual void all_reduce_on(B& b, int replica, int chunk, std::span<const std::span<float>> tensors) = 0;
};

/// Makes the collective of pipeline device `device`'s `replicas` replicas, no
/// wait of which takes longer than `timeout` (a pipeline's choice of
/// collective; none: the host-staged ReplicaGroup).
using MakeReplicaCollective =
    std::function<std::unique_ptr<ReplicaCollective>(int device, int replicas, std::chrono::milliseconds timeout)>;

/// The D replicas of one pipeline device in one process (see the file comment).
class ReplicaGroup final : public ReplicaCollective {
 public:
  /// The group of pipeline device `device` (for messages) with `replicas` >= 1
  /// members; no wait takes longer than `timeout`.
  ReplicaGroup(int device, int replicas, std::chrono::milliseconds timeout)
      : device_(device), replicas_(replicas), timeout_(timeout), posted_(static_cast<std::size_t>(replicas)),
        agreed_(static_cast<std::size_t>(replicas), 1) {
    if (replicas < 1) throw_error({.device = device}, "a replica group needs at least 1 replica, got ", replicas);
    barrier_.in.assign(static_cast<std::size_t>(replicas), 0);
  }

  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  /// The pipeline device of the group.
  int device() const { return device_; }
  /// The number of replicas D.
  int replicas() const override { return replicas_; }

  /// Collective over the D replicas, called by each with its gradient tensors of
  /// chunk `chunk`: on return every replica's tensors hold their sum in replica
  /// order. Throws pipeweave::Error, naming the device and the replica, when the
  /// replicas disagree on the chunk or on the tensors' sizes, on a timeout, or
  /// when the group is aborted; the tensors are then unchanged where the
  /// disagreement or the abort came before the sum.
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    match(replica, chunk, tensors);
    // Each replica sums its slice of every tensor, in replica order, and writes it to all.
    const auto D = static_cast<std::size_t>(replicas_), r = static_cast<std::size_t>(replica);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::size_t n = tensors[t].size(), begin = n * r / D, end = n * (r + 1) / D;
      for (std::size_t i = begin; i < end; ++i) {
        float sum = posted_[0].tensors[t][i];
        for (std::size_t q = 1; q < D; ++q) sum += posted_[q].tensors[t][i];
        for (std::size_t q = 0; q < D; ++q) posted_[q].tensors[t][i] = sum;
      }
    }
    std::unique_lock lock(mutex_);
    meet(lock, replica, "finish the gradient reduction of chunk " + std::to_string(chunk), [] {});
  }

  /// The first half of all_reduce(), for a collective that sums elsewhere
  /// (NCCL): collective over the D replicas, it returns once every replica has
  /// posted `tensors` of chunk `chunk`, and throws as all_reduce() when they
  /// disagree on the chunk or the sizes. The tensors are only posted, not read.
  void match(int replica, int chunk, std::span<const std::span<float>> tensors) {
    std::unique_lock lock(mutex_);
    throw_if_aborted(replica, "the gradient reduction of chunk " + std::to_string(chunk));
    posted_[static_cast<std::size_t>(replica)] = {chunk, tensors};
    meet(lock, replica, "reach the gradient reduction of chunk " + std::to_string(chunk), [this] { check_posted(); });
    if (!mismatch_.empty()) throw_error({.device = device_}, "replica ", replica, ": ", mismatch_);
  }

  /// Collective AND of `ok` over the D replicas.
  bool agree(int replica, bool ok) override {
    std::unique_lock lock(mutex_);
    throw_if_aborted(replica, "the agreement of the replicas");
    agreed_[static_cast<std::size_t>(replica)] = ok ? 1 : 0;
    meet(lock, replica, "reach the agreement of the replicas", [this] {
      agree_result_ = true;
      for (const char a : agreed_) agree_result_ = agree_result_ && a != 0;
    });
    return agree_result_;
  }

  /// Ends every wait of the group with an error quoting `reason` (the first
  /// reason is kept), now and until reset(). Safe from any thread.
  void abort(std::string_view reason) noexcept override {
    {
      std::lock_guard lock(mutex_);
      if (!aborted_) {
        try {
          reason_.assign(reason);
        } catch (...) {
          // keep the abort without its reason
        }
      }
      aborted_ = true;
    }
    wake_.notify_all();
  }
  /// True once abort() was called (until reset()).
  bool aborted() const {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

  /// Makes the group usable again after an error (an abort, a timeout, a
  /// mismatch). Call it while no replica is inside a collective of the group
  /// (between steps, from the host).
  void reset() override {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    reason_.clear();
    mismatch_.clear();
    barrier_.arrived = 0;
    barrier_.in.assign(static_cast<std::size_t>(replicas_), 0);
  }

 private:
  struct Posted {
    int chunk = -1;
    std::span<const std::span<float>> tensors;
  };
  struct Barrier {
    int arrived = 0;
    unsigned long long generation = 0;
    std::vector<char> in;  // [replica]: arrived at this generation
  };

  // Called by the last replica to arrive at the first barrier of all_reduce().
  void check_posted() {
    mismatch_.clear();
    const Posted& first = posted_[0];
    for (std::size_t q = 1; q < posted_.size() && mismatch_.empty(); ++q) {
      const Posted& p = posted_[q];
      if (p.chunk != first.chunk) {
        mismatch_ = "replica " + std::to_string(q) + " reduces chunk " + std::to_string(p.chunk) + " while replica 0 "
                    "reduces chunk " + std::to_string(first.chunk) + "; the replicas must run one program";
      } else if (p.tensors.size() != first.tensors.size()) {
        mismatch_ = "replica " + std::to_string(q) + " reduces " + std::to_string(p.tensors.size()) +
                    " tensors of chunk " + std::to_string(p.chunk) + ", replica 0 " + std::to_string(first.tensors.size());
      } else {
        for (std::size_t t = 0; t < p.tensors.size() && mismatch_.empty(); ++t)
          if (p.tensors[t].size() != first.tensors[t].size())
            mismatch_ = "tensor " + std::to_string(t) + " of chunk " + std::to_string(p.chunk) + " has " +
                        std::to_string(p.tensors[t].size()) + " values in replica " + std::to_string(q) + ", " +
                        std::to_string(first.tensors[t].size()) + " in replica 0";
      }
    }
  }

  void throw_if_aborted(int replica, const std::string& what) const {  // with the lock held
    if (aborted_)
      throw_error({.device = device_}, "replica ", replica, ": stopped before ", what,
                  " because another device failed: ", reason_);
  }

  // The timed barrier, with the lock held: the last replica to arrive runs
  // on_last() and releases the others; a timeout or an abort makes a waiting
  // replica throw, naming the replicas that had not arrived.
  template <class OnLast>
  void meet(std::unique_lock<std::mutex>& lock, int replica, const std::string& goal, OnLast&& on_last) {
    barrier_.in[static_cast<std::size_t>(replica)] = 1;
    if (++barrier_.arrived == replicas_) {
      on_last();
      barrier_.arrived = 0;
      barrier_.in.assign(static_cast<std::size_t>(replicas_), 0);
      ++barrier_.generation;
      wake_.notify_all();
      return;
    }
    const unsigned long long generation = barrier_.generation;
    const bool released =
        wake_.wait_for(lock, timeout_, [&] { return barrier_.generation != generation || aborted_; });
    if (barrier_.generation != generation) return;
    // It stays counted as arrived: after an error the group is reset() before it is used again, and the
    // others see the same replicas missing.
    std::string missing;
    for (int q = 0; q < replicas_; ++q)
      if (!barrier_.in[static_cast<std::size_t>(q)]) missing += (missing.empty() ? " " : ", ") + std::to_string(q);
    if (!released)
      throw_error({.device = device_}, "replica ", replica, ": timed out after ", timeout_.count(),
                  " ms waiting for replica", missing, " to ", goal);
    throw_error({.device = device_}, "replica ", replica, ": stopped while waiting for replica", missing, " to ", goal,
                " because another device failed: ", reason_);
  }

  int device_;
  int replicas_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  Barrier barrier_;
  std::vector<Posted> posted_;  // [replica]: its tensors of the reduction under way
  std::vector<char> agreed_;    // [replica]: what it passed to agree()
  bool agree_result_ = true;
  bool aborted_ = false;
  std::string reason_;
  std::string mismatch_;  // what check_posted() found; thrown by every replica
};

/// The base of in-place collectives that meet on a ReplicaGroup: the agreement,
/// the abort, the reset and host sums are the group's (`host()`), and
/// all_reduce_on is the derived class's.
template <class B>
class InPlaceReplicaGroup : public InPlaceReplicaCollective<B> {
 public:
  /// As ReplicaGroup's.
  InPlaceReplicaGroup(int device, int replicas, std::chrono::milliseconds timeout) : host_(device, replicas, timeout) {}

  int replicas() const override { return host_.replicas(); }
  void all_reduce(int replica, int chunk, std::span<const std::span<float>> tensors) override {
    host_.all_reduce(replica, chunk, tensors);
  }
  bool agree(int replica, bool ok) override { return host_.agree(replica, ok); }
  void abort(std::string_view reason) noexcept override { host_.abort(reason); }
  void reset() override { host_.reset(); }

 protected:
  /// The group the replicas meet on.
  ReplicaGroup& host() { return host_; }

 private:
  ReplicaGroup host_;
};

/// ReplicaGroup on the gradients themselves, for a backend B whose memory is
/// the host's (the CPU's): the same sum in replica order, with no copy.
template <HostMemoryBackend B>
class HostReplicaGroup final : public InPlaceReplicaGroup<B> {
 public:
  using InPlaceReplicaGroup<B>::InPlaceReplicaGroup;

  /// What a pipeline of B takes to make its groups of this kind.
  static MakeReplicaCollective factory() {
    return [](int device, int replicas, std::chrono::milliseconds timeout) -> std::unique_ptr<ReplicaCollective> {
      return std::make_unique<HostReplicaGroup>(device, replicas, timeout);
    };
  }

  /// `b` is the backend the device reduces on: its reducer, whose
  /// work before the R is done once b.synchronize() returns.
  void all_reduce_on(B& b, int replica, int chunk, std::span<const std::span<float>> tensors) override {
    b.synchronize();
    this->host().all_reduce(replica, chunk, tensors);
  }
};

}  // namespace pipeweave
