#pragma once
/// \file
/// The polling loops of the library. Every wait that may depend on another device
/// (a GPU stream behind an NCCL transfer, an NCCL call in progress, an MPI
/// request) polls instead of blocking, so that a failed peer or a timeout ends it
/// with an error instead of a hang (poll_until). A thread that expects another
/// thread of its process to be done within microseconds spins first (spin_until),
/// so that the hand-over costs no wake-up.
///
/// \code
/// bool ready = false;  // set by another thread
/// const bool done = pipeweave::poll_until([&] { return ready; }, std::chrono::seconds(1),
///                                         [](std::chrono::steady_clock::duration) {});
/// \endcode

#include <chrono>
#include <thread>

namespace pipeweave {

/// Calls done() until it returns true (then returns true) or until `budget` has
/// passed (then returns false), yielding the core between calls: a thread that
/// waits for another thread of its process takes no core that thread could run
/// on, yet sees it finish within a system call's time instead of a wake-up's.
/// done() must be cheap and must not block (an atomic load).
template <class Done>
bool spin_until(Done&& done, std::chrono::steady_clock::duration budget) {
  const auto end = std::chrono::steady_clock::now() + budget;
  for (unsigned polls = 1;; ++polls) {
    if (done()) return true;
    std::this_thread::yield();
    if (polls % 8 == 0 && std::chrono::steady_clock::now() >= end) return done();
  }
}

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
