#pragma once
/// \file
/// A device's second thread: it runs one job at a time beside the device's own
/// thread, the backward half of an overlapped pair while the device's thread runs
/// the forward (runtime/session.hpp). start(job) hands it the job; finish() waits
/// until the job has returned and gives the exception it ended with. The thread
/// lives as long as the object, so a steady state of pairs starts no thread and
/// allocates nothing.
///
/// Hand-over: each side polls the state (spin_until, which yields its core to any
/// thread that wants it) for up to the spin time before it sleeps on a condition
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
/// \endcode

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/poll.hpp"

namespace pipeweave {

/// A persistent thread that runs one job at a time (see the file comment).
class SideThread {
 public:
  /// Starts the thread, idle; either side polls for up to `spin` before it sleeps.
  explicit SideThread(std::chrono::microseconds spin = kDefaultSpin) : spin_(spin), thread_([this] { loop(); }) {}
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

  // Publishes a new state and wakes whoever sleeps (taking the lock after the
  // store means a sleeper either saw the state or is waiting on the variable).
  void set(int state) {
    state_.store(state, std::memory_order_release);
    { std::lock_guard lock(mutex_); }
    changed_.notify_all();
  }

  // Returns the state once done(state) holds: polling first, then asleep.
  template <class Done>
  int await(Done done) {
    int s = kIdle;
    auto check = [&] { return done(s = state_.load(std::memory_order_acquire)); };
    if (!spin_until(check, spin_)) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, check);
    }
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

  std::chrono::microseconds spin_;
  std::atomic<int> state_{kIdle};
  std::mutex mutex_;
  std::condition_variable changed_;
  void* job_ = nullptr;
  void (*call_)(void*) = nullptr;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once everything it reads exists
};

}  // namespace pipeweave
