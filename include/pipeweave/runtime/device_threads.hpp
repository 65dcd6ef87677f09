#pragma once
/// \file
/// One long-lived thread per device. run(fn) calls fn(d) on thread d for every
/// device at once and returns when all have finished, with each thread's
/// exception (if any) kept for the caller. The threads persist between calls, so
/// a device's backend and transport are always used from the same thread.

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pipeweave {

/// A fixed set of threads, thread d running device d's work.
class DeviceThreads {
 public:
  /// Starts `devices` threads.
  explicit DeviceThreads(int devices) : errors_(static_cast<std::size_t>(devices)) {
    threads_.reserve(static_cast<std::size_t>(devices));
    for (int d = 0; d < devices; ++d) threads_.emplace_back([this, d] { loop(d); });
  }
  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;
  /// Stops and joins the threads.
  ~DeviceThreads() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  /// Number of threads.
  int size() const { return static_cast<int>(threads_.size()); }

  /// Calls fn(d) on thread d for every d and waits for all. Returns the exception
  /// each thread ended with (null where none); fn must be safe to call concurrently.
  template <class F>
  const std::vector<std::exception_ptr>& run(F& fn) {
    std::unique_lock lock(mutex_);
    job_ = &fn;
    call_ = [](void* f, int d) { (*static_cast<F*>(f))(d); };
    for (auto& e : errors_) e = nullptr;
    remaining_ = size();
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [this] { return remaining_ == 0; });
    job_ = nullptr;
    return errors_;
  }

 private:
  void loop(int d) {
    unsigned long long seen = 0;
    for (;;) {
      void* job;
      void (*call)(void*, int);
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        call = call_;
      }
      std::exception_ptr error;
      try {
        call(job, d);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      errors_[static_cast<std::size_t>(d)] = error;
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> errors_;
  void* job_ = nullptr;
  void (*call_)(void*, int) = nullptr;
  int remaining_ = 0;
  unsigned long long generation_ = 0;
  bool stop_ = false;
};

}  // namespace pipeweave
