#pragma once
/// \file
/// A device's second thread: it runs one job at a time beside the device's own
/// thread, the backward half of an overlapped pair while the device's thread runs
/// the forward (runtime/session.hpp). start(job) hands it the job; finish() waits
/// until the job has returned and gives the exception it ended with. The thread
/// lives as long as the object, so a steady state of pairs starts no thread and
/// allocates nothing.
///
/// Hand-over: each side polls briefly (spin_until, which yields the core) before
/// it sleeps on the state word (std::atomic wait), so a job that follows within
/// the spin time costs no wake-up.
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
#include <exception>
#include <thread>

#include "pipeweave/runtime/poll.hpp"

namespace pipeweave {

/// A persistent thread that runs one job at a time (see the file comment).
class SideThread {
 public:
  /// How long either side polls before it sleeps.
  static constexpr std::chrono::microseconds kSpin{50};

  /// Starts the thread, idle.
  SideThread() : thread_([this] { loop(); }) {}
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;
  /// Waits for a running job, then stops and joins the thread.
  ~SideThread() {
    (void)finish();
    state_.store(kStop, std::memory_order_release);
    state_.notify_all();
    thread_.join();
  }

  /// Runs job() on the thread; `job` must live until finish() returns. The
  /// thread must be idle (finish() called since the last start()).
  template <class F>
  void start(F& job) {
    job_ = &job;
    call_ = [](void* f) { (*static_cast<F*>(f))(); };
    error_ = nullptr;
    state_.store(kRun, std::memory_order_release);
    state_.notify_all();
  }

  /// Waits until the job started last has returned (at once when none runs);
  /// returns the exception it ended with, null when none.
  std::exception_ptr finish() {
    if (!spin_until([this] { return state_.load(std::memory_order_acquire) != kRun; }, kSpin))
      for (int s = state_.load(std::memory_order_acquire); s == kRun; s = state_.load(std::memory_order_acquire))
        state_.wait(kRun, std::memory_order_acquire);
    return error_;
  }

 private:
  static constexpr int kIdle = 0, kRun = 1, kStop = 2;

  void loop() {
    for (;;) {
      int s = kIdle;
      if (!spin_until([&] { return (s = state_.load(std::memory_order_acquire)) != kIdle; }, kSpin))
        for (s = state_.load(std::memory_order_acquire); s == kIdle; s = state_.load(std::memory_order_acquire))
          state_.wait(kIdle, std::memory_order_acquire);
      if (s == kStop) return;
      try {
        call_(job_);
      } catch (...) {
        error_ = std::current_exception();
      }
      state_.store(kIdle, std::memory_order_release);
      state_.notify_all();
    }
  }

  std::atomic<int> state_{kIdle};
  void* job_ = nullptr;
  void (*call_)(void*) = nullptr;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once everything it reads exists
};

}  // namespace pipeweave
