#pragma once
/// \file
/// The one polling loop of the library. Every wait that may depend on another
/// device (a GPU stream behind an NCCL transfer, an NCCL call in progress, an MPI
/// request) polls instead of blocking, so that a failed peer or a timeout ends it
/// with an error instead of a hang.
///
/// \code
/// bool ready = false;  // set by another thread
/// const bool done = pipeweave::poll_until([&] { return ready; }, std::chrono::seconds(1),
///                                         [](std::chrono::steady_clock::duration) {});
/// \endcode

#include <chrono>
#include <thread>

namespace pipeweave {

/// A timeout that never runs out.
inline constexpr std::chrono::steady_clock::duration kNoTimeout = std::chrono::steady_clock::duration::max();

/// Calls done() until it returns true and then returns true; returns false once
/// `timeout` has passed without it. Between two calls it calls between(waited),
/// with the time waited so far (it may throw to end the wait), then backs off:
/// it yields for the first 64 polls, then sleeps 20 us, and 200 us after 1024
/// polls, so a short wait costs little latency and a long one little CPU.
template <class Done, class Between>
bool poll_until(Done&& done, std::chrono::steady_clock::duration timeout, Between&& between) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= timeout) return false;
    between(waited);
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 200));
  }
}

}  // namespace pipeweave
