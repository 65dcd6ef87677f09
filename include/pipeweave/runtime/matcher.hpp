#pragma once
/// \file
/// The rendezvous matcher: the host-side half of every transport whose devices
/// share one process (the CPU transport and both GPU transports of one process),
/// and the wording of a mismatch, which the transport across processes shares.
/// It pairs the operations the devices post with NCCL's rules: per directed pair
/// of devices, sends and receives match in FIFO order without tags; a send
/// completes when its receive is posted; a group completes when every one of its
/// operations is matched. Each match is checked (tensor and byte count) before
/// any data moves, every wait has a timeout, and an abort on one device stops the
/// waits of all. Each device's group is a GroupBuilder (runtime/group.hpp), as a
/// rank's group of the multi-process host is, so a call out of turn reads the
/// same on every transport.
///
/// The matcher moves no data itself. Whoever completes a match (the device that
/// posts second) calls the match hook, under the matcher's lock, with both
/// operations: the CPU transport copies the bytes there, the virtual-device GPU
/// transport enqueues its copy, and the NCCL transport installs no hook and uses
/// the matcher as its message check. Channels are ring buffers that keep their
/// room, so a steady state of steps allocates nothing.
///
/// Waiting (a group's matches, an agreement, a reset): a device's thread first
/// spins, without the lock, for up to the matcher's spin time, provided no more
/// of the devices' threads are awake than the machine has cores (a spinning
/// thread must not take the core of the thread it waits for); then it parks on a
/// condition variable of its own. Whoever completes its wait wakes it only if it
/// is parked, and wakes no other thread, so a hand-over within the spin time
/// costs no system call.
///
/// Standard library only: its logic is tested on the CPU.
///
/// \code
/// // Two devices on two threads; the hook copies the payload.
/// pipeweave::RendezvousMatcher m(2, std::chrono::seconds(5),
///     [](const pipeweave::MatchSide& send, const pipeweave::MatchSide& recv) {
///       std::memcpy(recv.op.dst, send.op.src, recv.op.message.bytes);
///     });
/// // device d: m.begin(d, step); m.add(d, OpKind::kSend, peer, message, src, nullptr); if (m.close(d)) m.post(d);
/// \endcode

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/group.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

namespace detail {

/// A first-in first-out queue on a ring buffer that grows only when full, so a
/// steady state of posts and matches allocates nothing.
template <class T>
class Fifo {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  /// Makes room for `n` items without growing later.
  void reserve(std::size_t n) {
    while (items_.size() < n) grow();
  }
  void push(const T& x) {
    if (size_ == items_.size()) grow();
    items_[(head_ + size_) % items_.size()] = x;
    ++size_;
  }
  T pop() {
    T x = items_[head_];
    head_ = (head_ + 1) % items_.size();
    --size_;
    return x;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }

 private:
  void grow() {
    std::vector<T> bigger(items_.empty() ? 4 : 2 * items_.size());
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = items_[(head_ + i) % items_.size()];
    items_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> items_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace detail

/// One operation of a device's group as posted to the matcher.
struct RendezvousOp {
  OpKind kind = OpKind::kSend;
  int peer = 0;
  Message message{};
  const void* src = nullptr;  ///< a send's data
  void* dst = nullptr;        ///< a receive's buffer
  bool done = false;          ///< matched
};

/// One side of a match: the device, the index of the operation in that device's
/// group, and the operation.
struct MatchSide {
  int device;
  int index;
  const RendezvousOp& op;
};

/// Throws the error of a receive that matched a message other than the one it
/// expects: "device 1, step 3 expects from device 0 activation(stage 0,
/// micro-batch 0), 4 bytes of fp32, but the message it matches, sent by device 0 at its
/// step 2, is activation(stage 0, micro-batch 1), 4 bytes of fp32". Every transport
/// that checks its messages words a mismatch so.
[[noreturn]] inline void throw_mismatch(int recv_device, int recv_step, const Message& expected, int send_device,
                                        int send_step, const Message& got) {
  throw_error({}, "device ", recv_device, ", step ", recv_step, " expects from device ", send_device, " ", expected,
              ", but the message it matches, sent by device ", send_device, " at its step ", send_step, ", is ", got);
}

/// Called by the thread that completes a match, under the matcher's lock, after
/// the check, with the send's side and the receive's. It may throw; the
/// exception then reaches that thread's caller.
using MatchHook = std::function<void(const MatchSide& send, const MatchSide& recv)>;

/// The matching state of all devices of one process, guarded by one mutex.
class RendezvousMatcher {
 public:
  /// A matcher for `devices` devices whose waits give up after `timeout`; `hook`
  /// runs at every match (none: the matcher only checks); a waiting thread spins
  /// for up to `spin` before it parks, when a core is free for it.
  RendezvousMatcher(int devices, std::chrono::milliseconds timeout, MatchHook hook = {},
                    std::chrono::microseconds spin = kDefaultSpin)
      : devices_(require_devices(devices)),
        timeout_(timeout),
        spin_(spin),
        cores_(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        awake_(devices),
        hook_(std::move(hook)),
        wakes_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(devices))),
        channels_(static_cast<std::size_t>(devices) * static_cast<std::size_t>(devices)),
        groups_(static_cast<std::size_t>(devices)),
        agreement_(devices),
        resetting_(devices),
        agreed_ok_(static_cast<std::size_t>(devices), 1) {}

  /// Number of devices.
  int devices() const { return devices_; }
  /// The longest a wait may take.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The longest a waiting thread spins before it parks.
  std::chrono::microseconds spin() const { return spin_; }

  /// Opens device d's group for the lowered program's step `step`.
  void begin(int device, int step) { group(device).built.begin(device, step); }
  /// Adds an operation to device d's open group.
  void add(int device, OpKind kind, int peer, const Message& message, const void* src, void* dst) {
    group(device).built.add(device, RendezvousOp{kind, peer, message, src, dst, false}, [&](const Where& where) {
      if (peer < 0 || peer >= devices_)
        throw_error(where, "peer ", peer, " is not a device (devices are 0..", devices_ - 1, ")");
      if (peer == device) throw_error(where, "a device cannot send to or receive from itself");
    });
  }
  /// Closes device d's group; returns false when it has no operation (nothing to post).
  bool close(int device) { return group(device).built.close(device); }
  /// The operations of device d's last group.
  const std::vector<RendezvousOp>& ops(int device) const {
    return groups_[static_cast<std::size_t>(device)].built.ops();
  }
  /// The step of device d's last group.
  int step(int device) const { return groups_[static_cast<std::size_t>(device)].built.step(); }

  /// Posts device d's closed group and returns once every operation of it is
  /// matched. Throws pipeweave::Error on a mismatch, a timeout or an abort.
  void post(int device);

  /// Collective AND of `ok` over all devices; an abort stops the wait.
  bool agree(int device, bool ok) {  // agree_result_ is read after meet(), perhaps without the lock: see meet()
    std::unique_lock lock(mutex_);
    throw_if_aborted(device, group(device), nullptr);
    agreed_ok_[static_cast<std::size_t>(device)] = ok ? 1 : 0;
    meet(lock, agreement_, device, group(device).built.step(), "reach the agreement of all devices",
         "the agreement of all devices", [this] {
      agree_result_ = true;
      for (char a : agreed_ok_) agree_result_ = agree_result_ && a != 0;
    });
    return agree_result_;
  }

  /// Marks the matcher aborted and wakes every wait; the first reason is kept.
  void abort(std::string_view reason) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (!aborted_.load()) {
        try {
          reason_.assign(reason);
        } catch (...) {
          // keep the abort without its reason
        }
      }
      aborted_.store(true);
    }
    wake_all();
  }
  /// True once abort() was called (until reset()); safe from any thread.
  bool aborted() const noexcept { return aborted_.load(); }
  /// The reason of the abort (empty when none).
  std::string reason() const {
    std::lock_guard lock(mutex_);
    return reason_;
  }

  /// Collective: once every device has called it, the last to arrive runs
  /// `on_all()` (while the others wait), clears every channel, group, agreement
  /// and the abort, and releases all. A failure of `on_all` is reported to every
  /// device. A device whose own part of the reset failed before it got here
  /// (a stream that did not drain, a reducer that did not settle) still arrives,
  /// with `own_failure` saying why: then `on_all` does not run and every device's
  /// reset throws naming it, so that none waits for that device until the timeout.
  /// A reset that times out (a device never came) reports the timeout, and an
  /// own failure recorded in it goes with it.
  template <class OnAll>
  void reset(int device, OnAll&& on_all, std::string_view own_failure = {}) {
    std::unique_lock lock(mutex_);
    if (!own_failure.empty() && failed_reset_.empty())
      failed_reset_ = "device " + std::to_string(device) + ": " + std::string(own_failure);
    try {
      meet(lock, resetting_, device, -1, "reset the transport", {}, [&] {
        reset_failure_.clear();
        std::swap(reset_failure_, failed_reset_);
        try {
          if (reset_failure_.empty()) on_all();
        } catch (const std::exception& e) {
          reset_failure_ = e.what();
        }
        for (Channel& ch : channels_) {
          ch.sends.clear();
          ch.recvs.clear();
        }
        for (Group& g : groups_) {
          g.built.clear();
          g.pending.store(0);
        }
        agreement_.clear();
        aborted_.store(false);
        reason_.clear();
      });
    } catch (...) {
      // A reset that times out ends when the last device that came gives up: an own failure recorded then
      // belongs to that reset, which reported the timeout instead, and the next reset starts clean.
      if (resetting_.arrived == 0) failed_reset_.clear();
      throw;
    }
    if (!reset_failure_.empty()) throw_error({.device = device}, "resetting the transport failed: ", reset_failure_);
  }
  /// reset() with nothing to run at the end.
  void reset(int device) {
    reset(device, [] {});
  }

 private:
  struct Posted {
    int device = 0;
    int op = 0;
  };
  struct Channel {
    detail::Fifo<Posted> sends;
    detail::Fifo<Posted> recvs;
  };
  // One cache line or more each: a spinning thread reads its own, the others write theirs.
  struct alignas(64) Group {
    GroupBuilder<RendezvousOp> built;  // its state, step and operations (runtime/group.hpp)
    bool parked = false;         // its thread waits on its condition variable (under the lock)
    std::atomic<int> pending{0};  // operations not matched yet; read without the lock while spinning
  };
  // The arrivals of one kind of collective call (agree, reset).
  struct Barrier {
    explicit Barrier(int devices) : in(static_cast<std::size_t>(devices), 0) {}
    void clear() {
      arrived = 0;
      for (auto& i : in) i = 0;
    }
    std::vector<char> in;  // [device]: arrived in this generation
    int arrived = 0;
    std::atomic<unsigned long long> generation{0};  // read without the lock while spinning
  };

  static int require_devices(int devices) {
    if (devices < 1) throw_error({}, "transport: devices must be at least 1 (got ", devices, ")");
    return devices;
  }
  std::condition_variable& wake(int device) { return wakes_[static_cast<std::size_t>(device)]; }
  void wake_all() {
    for (int d = 0; d < devices_; ++d) wake(d).notify_all();
  }
  // Called with the lock held: wakes device d's thread if it is parked.
  void wake_if_parked(int device) {
    if (group(device).parked) wake(device).notify_one();
  }

  // Waits, with `lock` held on entry, until done() (which reads atomics only):
  // spins without the lock first when a core is free, then parks on the device's
  // condition variable. Returns true once done() holds: with the lock held, or
  // released when the spin saw it (the waker released what it wrote with the
  // atomic that done() reads; taking the lock again would only wait for the
  // waker to leave it). Returns false, with the lock held, when the deadline
  // passed first.
  template <class Done>
  bool wait(std::unique_lock<std::mutex>& lock, int device, std::chrono::steady_clock::time_point deadline,
            Done&& done);
  Group& group(int device) { return groups_[static_cast<std::size_t>(device)]; }
  // The channel from -> to. Both of its queues get their room on first use, whichever
  // side posts first, so that later steps, whose timing differs, allocate nothing.
  Channel& channel(int from, int to) {
    Channel& ch =
        channels_[static_cast<std::size_t>(from) * static_cast<std::size_t>(devices_) + static_cast<std::size_t>(to)];
    ch.sends.reserve(kChannelRoom);
    ch.recvs.reserve(kChannelRoom);
    return ch;
  }
  static constexpr std::size_t kChannelRoom = 8;
  static const RendezvousOp& first_pending(const Group& g) {
    for (const RendezvousOp& op : g.built.ops())
      if (!op.done) return op;
    return g.built.ops().front();
  }

  // The timed barrier of agree() and reset(), called with the lock held: device d
  // arrives; the last of all to arrive runs on_last() and releases the others. A
  // device that waits longer than the timeout, or that sees an abort when
  // `stopped_by` names what it waits for, leaves the barrier again and throws
  // (the timeout names the devices that did not arrive). It may return with the
  // lock released (see wait()); what on_last() wrote is then visible all the same,
  // and stays until this device arrives at the next meeting of `b`.
  template <class OnLast>
  void meet(std::unique_lock<std::mutex>& lock, Barrier& b, int device, int after_step, std::string_view goal,
            std::string_view stopped_by, OnLast&& on_last);
  static void leave(Barrier& b, int device) {
    b.in[static_cast<std::size_t>(device)] = 0;
    --b.arrived;
  }

  // Called with the lock held.
  void throw_if_aborted(int device, const Group& g, const RendezvousOp* waiting) const {
    if (!aborted_.load()) return;
    const Where where{.device = device, .step = g.built.step()};
    if (waiting == nullptr) throw_error(where, "stopped because another device failed: ", reason_);
    throw_error(where, "stopped while waiting for device ", waiting->peer,
                waiting->kind == OpKind::kSend ? " to receive " : " to send ", waiting->message,
                " because another device failed: ", reason_);
  }

  // Called with the lock held: pairs a send with the receive it meets in FIFO order.
  void match(const Posted& send, const Posted& recv);

  int devices_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  int cores_;                  // hardware threads of the machine
  std::atomic<int> awake_;     // threads of the devices not parked in the matcher
  MatchHook hook_;
  mutable std::mutex mutex_;
  std::unique_ptr<std::condition_variable[]> wakes_;  // [device]: where that device waits
  std::vector<Channel> channels_;  // [from * P + to]
  std::vector<Group> groups_;
  alignas(64) std::atomic<bool> aborted_{false};  // read by spinning threads: a cache line of its own
  alignas(64) std::string reason_;
  Barrier agreement_, resetting_;
  std::vector<char> agreed_ok_;  // [device]: what it passed to agree()
  bool agree_result_ = true;
  std::string reset_failure_;  // why the last reset failed (empty: it did not)
  std::string failed_reset_;   // the first own failure since the last reset completed, "device d: ..."
};

inline void RendezvousMatcher::post(int device) {
  Group& g = group(device);
  std::unique_lock lock(mutex_);
  throw_if_aborted(device, g, nullptr);
  const std::vector<RendezvousOp>& ops = g.built.ops();
  g.pending.store(static_cast<int>(ops.size()));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const RendezvousOp& op = ops[i];
    const Posted p{device, static_cast<int>(i)};
    if (op.kind == OpKind::kSend) {
      Channel& ch = channel(device, op.peer);
      if (!ch.recvs.empty())
        match(p, ch.recvs.pop());
      else
        ch.sends.push(p);
    } else {
      Channel& ch = channel(op.peer, device);
      if (!ch.sends.empty())
        match(ch.sends.pop(), p);
      else
        ch.recvs.push(p);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (!wait(lock, device, deadline, [&] { return g.pending.load() == 0 || aborted_.load(); })) {
    const RendezvousOp& op = first_pending(g);
    throw_error({.device = device, .step = g.built.step()}, "timed out after ", timeout_.count(),
                " ms waiting for device ", op.peer, op.kind == OpKind::kSend ? " to receive " : " to send ",
                op.message);
  }
  if (g.pending.load() == 0) return;
  if (!lock.owns_lock()) lock.lock();
  throw_if_aborted(device, g, &first_pending(g));
}


template <class Done>
bool RendezvousMatcher::wait(std::unique_lock<std::mutex>& lock, int device,
                             std::chrono::steady_clock::time_point deadline, Done&& done) {
  if (done()) return true;
  if (spin_.count() > 0 && awake_.load() <= cores_) {
    lock.unlock();
    using Duration = std::chrono::steady_clock::duration;
    if (spin_until(done, std::min<Duration>(spin_, deadline - std::chrono::steady_clock::now()))) return true;
    lock.lock();
  }
  Group& g = group(device);
  while (!done()) {
    g.parked = true;
    --awake_;
    const std::cv_status status = wake(device).wait_until(lock, deadline);
    ++awake_;
    g.parked = false;
    if (status == std::cv_status::timeout && !done()) return false;
  }
  return true;
}


template <class OnLast>
void RendezvousMatcher::meet(std::unique_lock<std::mutex>& lock, Barrier& b, int device, int after_step,
                             std::string_view goal, std::string_view stopped_by, OnLast&& on_last) {
  b.in[static_cast<std::size_t>(device)] = 1;
  if (++b.arrived == devices_) {
    on_last();
    b.clear();
    ++b.generation;
    for (int d = 0; d < devices_; ++d) wake_if_parked(d);
    return;
  }
  const unsigned long long generation = b.generation.load();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  auto stopped = [&] { return !stopped_by.empty() && aborted_.load(); };
  auto when = [&] { return after_step >= 0 ? "after step " + std::to_string(after_step) + ", " : std::string(); };
  if (!wait(lock, device, deadline, [&] { return b.generation.load() != generation || stopped(); })) {  // lock held
    std::string missing;
    for (int d = 0; d < devices_; ++d)
      if (!b.in[static_cast<std::size_t>(d)]) missing += (missing.empty() ? " " : ", ") + std::to_string(d);
    leave(b, device);
    throw_error({.device = device}, when(), "timed out after ", timeout_.count(), " ms waiting for device", missing,
                " to ", goal);
  }
  if (b.generation.load() != generation) return;  // released by the last to arrive
  if (!lock.owns_lock()) lock.lock();
  if (b.generation.load() != generation) return;
  leave(b, device);
  throw_error({.device = device}, when(), "stopped while waiting for ", stopped_by, ": ", reason_);
}


inline void RendezvousMatcher::match(const Posted& send, const Posted& recv) {
  Group& sg = group(send.device);
  Group& rg = group(recv.device);
  RendezvousOp& s = sg.built.ops()[static_cast<std::size_t>(send.op)];
  RendezvousOp& r = rg.built.ops()[static_cast<std::size_t>(recv.op)];
  if (!(s.message == r.message))
    throw_mismatch(recv.device, rg.built.step(), r.message, send.device, sg.built.step(), s.message);
  if (hook_) hook_(MatchSide{send.device, send.op, s}, MatchSide{recv.device, recv.op, r});
  s.done = true;
  r.done = true;
  if (--sg.pending == 0) wake_if_parked(send.device);
  if (--rg.pending == 0) wake_if_parked(recv.device);
}


}  // namespace pipeweave
