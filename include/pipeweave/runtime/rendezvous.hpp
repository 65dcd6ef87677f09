#pragma once
/// \file
/// Host-side matching with NCCL's rules, shared by every transport of one process:
/// per directed pair of devices, sends and receives match in FIFO order without
/// tags; a send completes when its receive is posted; a group completes when every
/// one of its operations is matched. Each match is checked (tensor and byte count)
/// before any data moves, every wait has a timeout, and an abort on one device
/// stops the waits of all.
///
/// The matcher moves no data itself. Whoever completes a match (the device that
/// posts second) calls the match hook under the matcher's lock: the CPU transport
/// copies the bytes there, the virtual-device GPU transport enqueues its copy, and
/// the NCCL transport installs no hook and uses the matcher as its message check.
/// Channels are ring buffers that keep their room, so a steady state of steps
/// allocates nothing.
///
/// Standard library only: the logic is tested on the CPU.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// "activation(stage 0, micro-batch 2), 512 bytes".
inline std::string describe(const Message& m) {
  Text t;
  append_tensor(t, m.tensor) << ", " << static_cast<long long>(m.bytes) << " bytes";
  return t.str();
}

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

/// One operation of a device's current group.
struct RendezvousOp {
  OpKind kind = OpKind::kSend;
  int peer = 0;
  Message message{};
  const void* src = nullptr;
  void* dst = nullptr;
  bool done = false;
};

/// Called by the thread that completes a match, under the matcher's lock, with
/// the sending device and the index of the send in its group, and the same for
/// the receive. It may throw; the exception then reaches that thread's caller.
struct MatchHook {
  void* context = nullptr;
  void (*fn)(void* context, int send_device, int send_op, int recv_device, int recv_op) = nullptr;
};

/// The matching state of all devices of one process, guarded by one mutex.
class RendezvousMatcher {
 public:
  /// A matcher for `devices` devices whose waits give up after `timeout`.
  RendezvousMatcher(int devices, std::chrono::milliseconds timeout, MatchHook hook = {})
      : devices_(require_devices(devices)),
        timeout_(timeout),
        hook_(hook),
        wakes_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(devices))),
        channels_(static_cast<std::size_t>(devices) * static_cast<std::size_t>(devices)),
        groups_(static_cast<std::size_t>(devices)),
        agreed_(static_cast<std::size_t>(devices), 0) {}

  /// Replaces the match hook; only before the first group is posted.
  void set_hook(MatchHook hook) { hook_ = hook; }

  /// Number of devices.
  int devices() const { return devices_; }
  /// The longest a wait may take.
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Opens device d's group for the lowered program's step `step`.
  void begin(int device, int step) {
    Group& g = group(device);
    if (g.open) throw Error(where(device, step) + "group_begin inside an open group");
    g.open = true;
    g.step = step;
    g.ops.clear();
  }
  /// Adds an operation to device d's open group.
  void add(int device, OpKind kind, int peer, const Message& message, const void* src, void* dst) {
    Group& g = group(device);
    if (!g.open) throw Error(where(device, g.step) + (kind == OpKind::kSend ? "send" : "recv") + " outside a group");
    if (peer < 0 || peer >= devices_) {
      Text t;
      t << "peer " << peer << " is not a device (devices are 0.." << devices_ - 1 << ")";
      throw Error(where(device, g.step) + t.str());
    }
    if (peer == device) throw Error(where(device, g.step) + "a device cannot send to or receive from itself");
    g.ops.push_back({kind, peer, message, src, dst, false});
  }
  /// Closes device d's group; returns false when it has no operation (nothing to post).
  bool close(int device) {
    Group& g = group(device);
    if (!g.open) throw Error(where(device, g.step) + "group_end without group_begin");
    g.open = false;
    return !g.ops.empty();
  }
  /// The operations of device d's last group.
  const std::vector<RendezvousOp>& ops(int device) const { return groups_[static_cast<std::size_t>(device)].ops; }
  /// The step of device d's last group.
  int step(int device) const { return groups_[static_cast<std::size_t>(device)].step; }

  /// Posts device d's closed group and returns once every operation of it is
  /// matched. Throws pipeweave::Error on a mismatch, a timeout or an abort.
  void post(int device) {
    Group& g = group(device);
    std::unique_lock lock(mutex_);
    throw_if_aborted(device, g, nullptr);
    g.pending = static_cast<int>(g.ops.size());
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const RendezvousOp& op = g.ops[i];
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
    while (g.pending > 0 && !aborted_.load()) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && g.pending > 0 && !aborted_.load()) {
        const RendezvousOp& op = first_pending(g);
        Text t;
        t << "device " << device << ", step " << g.step << ": timed out after "
          << static_cast<long long>(timeout_.count()) << " ms waiting for device " << op.peer << " to "
          << (op.kind == OpKind::kSend ? "receive " : "send ");
        throw Error(t.str() + describe(op.message));
      }
    }
    if (g.pending > 0) throw_if_aborted(device, g, &first_pending(g));
  }

  /// Collective AND of `ok` over all devices.
  bool agree(int device, bool ok) {
    std::unique_lock lock(mutex_);
    const Group& g = group(device);
    throw_if_aborted(device, g, nullptr);
    agree_all_ = agree_all_ && ok;
    agreed_[static_cast<std::size_t>(device)] = 1;
    if (++agree_arrived_ == devices_) {
      agree_result_ = agree_all_;
      agree_all_ = true;
      agree_arrived_ = 0;
      for (auto& a : agreed_) a = 0;
      ++agree_generation_;
      wake_all();
      return agree_result_;
    }
    const unsigned long long generation = agree_generation_;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (agree_generation_ == generation && !aborted_.load()) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && agree_generation_ == generation &&
          !aborted_.load()) {
        Text t;
        t << "device " << device << " (after step " << g.step << "): timed out after "
          << static_cast<long long>(timeout_.count()) << " ms waiting for device";
        int missing = 0;
        for (int d = 0; d < devices_; ++d) {
          if (agreed_[static_cast<std::size_t>(d)]) continue;
          t << (missing++ ? ", " : " ") << d;
        }
        t << " to reach the agreement of all devices";
        throw Error(t.str());
      }
    }
    if (agree_generation_ == generation) {
      Text t;
      t << "device " << device << " (after step " << g.step
        << "): stopped while waiting for the agreement of all devices: ";
      throw Error(t.str() + reason_);
    }
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
  /// `on_all()` (while the others wait), clears
  /// every channel, group and the abort, and releases all. A failure of
  /// `on_all` is reported to every device.
  template <class OnAll>
  void reset(int device, OnAll&& on_all) {
    std::unique_lock lock(mutex_);
    if (++reset_arrived_ == devices_) {
      std::string failure;
      try {
        on_all();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      for (Channel& ch : channels_) {
        ch.sends.clear();
        ch.recvs.clear();
      }
      for (Group& g : groups_) {
        g.ops.clear();
        g.pending = 0;
        g.open = false;
      }
      agree_all_ = true;
      agree_arrived_ = 0;
      for (auto& a : agreed_) a = 0;
      aborted_.store(false);
      reason_.clear();
      reset_arrived_ = 0;
      reset_failure_ = failure;
      ++reset_generation_;
      wake_all();
      if (!failure.empty()) throw Error("device " + std::to_string(device) + ": resetting the transport failed: " + failure);
      return;
    }
    const unsigned long long generation = reset_generation_;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (reset_generation_ == generation) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && reset_generation_ == generation) {
        --reset_arrived_;
        Text t;
        t << "device " << device << ": timed out after " << static_cast<long long>(timeout_.count())
          << " ms waiting for every device to reset the transport";
        throw Error(t.str());
      }
    }
    if (!reset_failure_.empty())
      throw Error("device " + std::to_string(device) + ": resetting the transport failed: " + reset_failure_);
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
    Fifo<Posted> sends;
    Fifo<Posted> recvs;
  };
  struct Group {
    int step = -1;
    bool open = false;
    int pending = 0;
    std::vector<RendezvousOp> ops;
  };

  static int require_devices(int devices) {
    if (devices < 1) throw Error("transport: devices must be at least 1 (got " + std::to_string(devices) + ")");
    return devices;
  }
  std::condition_variable& wake(int device) { return wakes_[static_cast<std::size_t>(device)]; }
  void wake_all() {
    for (int d = 0; d < devices_; ++d) wake(d).notify_all();
  }
  Group& group(int device) { return groups_[static_cast<std::size_t>(device)]; }
  const Group& group(int device) const { return groups_[static_cast<std::size_t>(device)]; }
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
  static std::string where(int device, int step) {
    Text t;
    t << "device " << device << ", step " << step << ": ";
    return t.str();
  }
  static const RendezvousOp& first_pending(const Group& g) {
    for (const RendezvousOp& op : g.ops)
      if (!op.done) return op;
    return g.ops.front();
  }

  // Called with the lock held.
  void throw_if_aborted(int device, const Group& g, const RendezvousOp* waiting) const {
    if (!aborted_.load()) return;
    Text t;
    t << "device " << device << ", step " << g.step << ": stopped";
    std::string s = t.str();
    if (waiting != nullptr) {
      Text w;
      w << " while waiting for device " << waiting->peer << " to "
        << (waiting->kind == OpKind::kSend ? "receive " : "send ");
      s += w.str() + describe(waiting->message);
    }
    throw Error(s + " because another device failed: " + reason_);
  }

  // Called with the lock held: pairs a send with the receive it meets in FIFO order.
  void match(const Posted& send, const Posted& recv) {
    Group& sg = group(send.device);
    Group& rg = group(recv.device);
    RendezvousOp& s = sg.ops[static_cast<std::size_t>(send.op)];
    RendezvousOp& r = rg.ops[static_cast<std::size_t>(recv.op)];
    if (!(s.message == r.message)) {
      Text t;
      t << "device " << recv.device << ", step " << rg.step << " expects from device " << send.device << " ";
      std::string text = t.str() + describe(r.message);
      Text u;
      u << ", but the message it matches, sent by device " << send.device << " at its step " << sg.step << ", is ";
      throw Error(text + u.str() + describe(s.message));
    }
    if (hook_.fn != nullptr) hook_.fn(hook_.context, send.device, send.op, recv.device, recv.op);
    s.done = true;
    r.done = true;
    --sg.pending;
    --rg.pending;
    if (sg.pending == 0) wake(send.device).notify_one();
    if (rg.pending == 0 && recv.device != send.device) wake(recv.device).notify_one();
  }

  int devices_;
  std::chrono::milliseconds timeout_;
  MatchHook hook_;
  mutable std::mutex mutex_;
  std::unique_ptr<std::condition_variable[]> wakes_;  // [device]: where that device waits
  std::vector<Channel> channels_;  // [from * P + to]
  std::vector<Group> groups_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  bool agree_all_ = true;
  bool agree_result_ = true;
  int agree_arrived_ = 0;
  unsigned long long agree_generation_ = 0;
  std::vector<char> agreed_;
  int reset_arrived_ = 0;
  unsigned long long reset_generation_ = 0;
  std::string reset_failure_;
};

}  // namespace detail
}  // namespace pipeweave
