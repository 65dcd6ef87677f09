#pragma once
/// \file
/// A device's helper threads, which run work beside the device's own thread:
/// - SideThread runs one job at a time: the backward half of an overlapped pair
///   while the device's thread runs the forward (runtime/overlap.hpp). start(job)
///   hands it the job; finish() waits until the job has returned and gives the
///   exception it ended with.
/// - QueueThread runs posted items one after another in the order posted: a
///   device's gradient reductions, each started when its chunk's last backward is
///   done, while the device computes on (runtime/reducer.hpp). post(item) never
///   waits; drain() waits until every item posted has run.
/// Each lives as long as the object, so a steady state starts no thread and
/// allocates nothing.
///
/// Hand-over: each side polls (spin_until, which yields its core to any thread
/// that wants it) for up to the spin time before it sleeps on a condition
/// variable. The spin matters more than the wake-up it saves: a thread woken from
/// sleep is queued on the core of the thread that woke it, and on a virtual
/// machine it can wait there a millisecond for a core of its own, so the pair's
/// halves would run one after the other (measured with 2 vCPUs). The default is
/// the transport's (kDefaultSpin), which covers the gap between two pairs and the
/// difference of two halves.
///
/// \code
/// pipeweave::SideThread side;
/// int result = 0;
/// auto job = [&] { result = 42; };
/// side.start(job);
/// // ... the other half runs here ...
/// if (std::exception_ptr e = side.finish()) std::rethrow_exception(e);
///
/// std::vector<int> seen;
/// pipeweave::QueueThread queue([&](int item) { seen.push_back(item); }, /*capacity=*/2);
/// queue.post(3);
/// queue.post(5);
/// if (std::exception_ptr e = queue.drain()) std::rethrow_exception(e);  // seen == {3, 5}
/// \endcode

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/poll.hpp"

namespace pipeweave {

namespace detail {

/// What two threads hand over: a change made under a lock, and a wait for a
/// condition on atomics, polled for up to the spin time before it sleeps.
class Handoff {
 public:
  explicit Handoff(std::chrono::microseconds spin) : spin_(spin) {}
  /// Runs change() with the lock held, then wakes every sleeper (so a sleeper
  /// either saw the change before it slept or is woken by it).
  template <class F>
  void change(F&& change) {
    {
      std::lock_guard lock(mutex_);
      change();
    }
    changed_.notify_all();
  }
  /// Returns once ready() holds; ready() reads atomics only (it runs both with
  /// and without the lock). Polls first unless `poll` is false.
  template <class Ready>
  void await(Ready&& ready, bool poll = true) {
    if (poll && spin_until(ready, spin_)) return;
    std::unique_lock lock(mutex_);
    changed_.wait(lock, ready);
  }
  /// The lock that change() holds, for reading what it guards.
  std::mutex& mutex() { return mutex_; }

 private:
  std::chrono::microseconds spin_;
  std::mutex mutex_;
  std::condition_variable changed_;
};

}  // namespace detail

/// A persistent thread that runs one job at a time (see the file comment).
class SideThread {
 public:
  /// Starts the thread, idle; either side polls for up to `spin` before it sleeps.
  explicit SideThread(std::chrono::microseconds spin = kDefaultSpin) : handoff_(spin), thread_([this] { loop(); }) {}
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;
  /// Waits for a running job, then stops and joins the thread.
  ~SideThread() {
    (void)finish();
    set(kStop);
    thread_.join();
  }

  /// Runs job() on the thread; `job` must live until finish() returns. The
  /// thread must be idle (finish() called since the last start()).
  template <class F>
  void start(F& job) {
    job_ = &job;
    call_ = [](void* f) { (*static_cast<F*>(f))(); };
    error_ = nullptr;
    set(kRun);
  }

  /// Waits until the job started last has returned (at once when none runs);
  /// returns the exception it ended with, null when none.
  std::exception_ptr finish() {
    await([](int s) { return s != kRun; });
    return error_;
  }

 private:
  static constexpr int kIdle = 0, kRun = 1, kStop = 2;

  void set(int state) {
    handoff_.change([&] { state_.store(state, std::memory_order_release); });
  }

  // Returns the state once done(state) holds.
  template <class Done>
  int await(Done done) {
    int s = kIdle;
    handoff_.await([&] { return done(s = state_.load(std::memory_order_acquire)); });
    return s;
  }

  void loop() {
    while (await([](int s) { return s != kIdle; }) != kStop) {
      try {
        call_(job_);
      } catch (...) {
        error_ = std::current_exception();
      }
      set(kIdle);
    }
  }

  detail::Handoff handoff_;
  std::atomic<int> state_{kIdle};
  void* job_ = nullptr;
  void (*call_)(void*) = nullptr;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once everything it reads exists
};

/// A persistent thread that runs posted items, one after another, in the order
/// posted (see the file comment). After an item throws, the items posted after
/// it are skipped, and drain() gives that exception. The thread sleeps while it
/// waits for an item (it would take a core from the poster, which computes
/// meanwhile); drain() polls for the spin time first.
class QueueThread {
 public:
  /// Starts the thread, idle; it calls run(item) for each item posted. Up to
  /// `capacity` items between two drains post without allocating.
  template <class F>
  QueueThread(F run, std::size_t capacity, std::chrono::microseconds spin = kDefaultSpin)
      : run_(std::move(run)), handoff_(spin) {
    items_.reserve(capacity);
    thread_ = std::thread([this] { loop(); });
  }
  QueueThread(const QueueThread&) = delete;
  QueueThread& operator=(const QueueThread&) = delete;
  /// Waits for the items posted, then stops and joins the thread.
  ~QueueThread() {
    (void)drain();
    handoff_.change([&] { stop_.store(true, std::memory_order_release); });
    thread_.join();
  }

  /// Queues `item` to run after those posted before it; returns at once.
  void post(int item) {
    handoff_.change([&] {
      items_.push_back(item);
      posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    });
  }

  /// Waits until every item posted has run (or was skipped after an error);
  /// returns the exception of the first that threw since the last drain, null when
  /// none.
  std::exception_ptr drain() {
    handoff_.await([&] { return done_.load(std::memory_order_acquire) == posted_.load(std::memory_order_acquire); });
    std::exception_ptr error;
    handoff_.change([&] {
      base_ += items_.size();
      items_.clear();
      error = std::exchange(error_, nullptr);
    });
    return error;
  }

 private:
  void loop() {
    for (std::size_t next = 0;; ++next) {
      handoff_.await(
          [&] { return posted_.load(std::memory_order_acquire) > next || stop_.load(std::memory_order_acquire); },
          false);
      if (posted_.load(std::memory_order_acquire) <= next) return;  // stopped, with nothing left to run
      int item = 0;
      bool skip = false;
      {
        std::lock_guard lock(handoff_.mutex());
        item = items_[next - base_];
        skip = error_ != nullptr;
      }
      if (!skip) {
        try {
          run_(item);
        } catch (...) {
          std::lock_guard lock(handoff_.mutex());
          error_ = std::current_exception();
        }
      }
      handoff_.change([&] { done_.store(next + 1, std::memory_order_release); });
    }
  }

  std::function<void(int)> run_;
  detail::Handoff handoff_;
  std::vector<int> items_;  // the items posted since the last drain (guarded by the hand-off's lock)
  std::size_t base_ = 0;    // items posted before items_[0] (guarded likewise)
  std::atomic<std::size_t> posted_{0}, done_{0};  // items posted, and run, since the thread started
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;  // the first item's exception since the last drain (guarded likewise)
  std::thread thread_;        // started last, once everything it reads exists
};

}  // namespace pipeweave
