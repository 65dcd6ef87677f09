#pragma once
/// \file
/// The CPU transport: rendezvous channels between device threads with NCCL's
/// matching rules. Per directed pair of devices, sends and receives match in FIFO
/// order without tags; a send completes when its receive is posted (the data is
/// copied then); a group completes when every one of its operations is matched.
/// Every match is checked (tensor and bytes), every wait has a timeout, and an
/// abort on one device stops the waits of all.
///
/// \code
/// auto ends = pipeweave::cpu::make_rendezvous(2, {std::chrono::milliseconds(500)});
/// // thread of device 0:
/// //   ends[0].group_begin(step); ends[0].send(1, message, data); ends[0].group_end();
/// // thread of device 1:
/// //   ends[1].group_begin(step); ends[1].recv(0, message, buffer); ends[1].group_end();
/// \endcode

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::cpu {

/// Settings of the rendezvous fabric.
struct RendezvousOptions {
  /// The longest any wait (a group, an agreement, a reset) may take before it is an error.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

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
  const T& front() const { return items_[head_]; }
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

/// The state all endpoints share, guarded by one mutex.
class RendezvousFabric {
 public:
  RendezvousFabric(int devices, RendezvousOptions options)
      : devices_(devices), options_(options), channels_(static_cast<std::size_t>(devices) * static_cast<std::size_t>(devices)),
        groups_(static_cast<std::size_t>(devices)), agreed_(static_cast<std::size_t>(devices), 0),
        in_reset_(static_cast<std::size_t>(devices), 0),
        wakes_(std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(devices))) {}

  int devices() const { return devices_; }

  /// One posted operation, waiting in its channel for its counterpart.
  struct Posted {
    int device = 0;  // the device that posted it
    int op = 0;      // its index in that device's group
    Message message{};
    const void* src = nullptr;
    void* dst = nullptr;
  };

  /// One operation of a device's current group.
  struct GroupOp {
    OpKind kind = OpKind::kSend;
    int peer = 0;
    Message message{};
    const void* src = nullptr;
    void* dst = nullptr;
    bool done = false;
  };

  /// A device's current group.
  struct Group {
    int step = -1;
    bool open = false;
    int pending = 0;
    std::vector<GroupOp> ops;
  };

  Group& group(int device) { return groups_[static_cast<std::size_t>(device)]; }

  /// Posts the device's group and waits until all of it is matched.
  void run_group(int device) {
    Group& g = group(device);
    std::unique_lock lock(mutex_);
    throw_if_aborted(device, g, nullptr);
    g.pending = static_cast<int>(g.ops.size());
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      GroupOp& op = g.ops[i];
      const Posted p{device, static_cast<int>(i), op.message, op.src, op.dst};
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
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (g.pending > 0 && !aborted_) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && g.pending > 0 && !aborted_) {
        const GroupOp& op = first_pending(g);
        Text t;
        t << "device " << device << ", step " << g.step << ": timed out after "
          << static_cast<long long>(options_.timeout.count()) << " ms waiting for device " << op.peer << " to "
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
    agree_all_ &= ok;
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
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (agree_generation_ == generation && !aborted_) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && agree_generation_ == generation &&
          !aborted_) {
        Text t;
        t << "device " << device << " (after step " << g.step << "): timed out after "
          << static_cast<long long>(options_.timeout.count()) << " ms waiting for device";
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
      t << "device " << device << " (after step " << g.step << "): stopped while waiting for the agreement of all devices: ";
      throw Error(t.str() + reason_);
    }
    return agree_result_;
  }

  /// Marks the fabric aborted and wakes every wait. The first reason is kept.
  void abort(std::string_view reason) noexcept {
    try {
      std::lock_guard lock(mutex_);
      if (!aborted_) reason_.assign(reason);
      aborted_ = true;
    } catch (...) {
      std::lock_guard lock(mutex_);  // the reason could not be stored; abort anyway
      aborted_ = true;
    }
    wake_all();
  }

  /// Collective: the last device to arrive clears every channel, group and the abort.
  void reset(int device) {
    std::unique_lock lock(mutex_);
    in_reset_[static_cast<std::size_t>(device)] = 1;
    if (++reset_arrived_ == devices_) {
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
      aborted_ = false;
      reason_.clear();
      reset_arrived_ = 0;
      for (auto& r : in_reset_) r = 0;
      ++reset_generation_;
      wake_all();
      return;
    }
    const unsigned long long generation = reset_generation_;
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (reset_generation_ == generation) {
      if (wake(device).wait_until(lock, deadline) == std::cv_status::timeout && reset_generation_ == generation) {
        Text t;
        t << "device " << device << ": timed out after " << static_cast<long long>(options_.timeout.count())
          << " ms waiting for every device to reset the transport";
        in_reset_[static_cast<std::size_t>(device)] = 0;
        --reset_arrived_;
        throw Error(t.str());
      }
    }
  }

 private:
  struct Channel {
    Fifo<Posted> sends;
    Fifo<Posted> recvs;
  };

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

  std::condition_variable& wake(int device) { return wakes_[static_cast<std::size_t>(device)]; }
  void wake_all() {
    for (int d = 0; d < devices_; ++d) wake(d).notify_all();
  }

  static const GroupOp& first_pending(const Group& g) {
    for (const GroupOp& op : g.ops)
      if (!op.done) return op;
    return g.ops.front();
  }

  // Called with the lock held.
  void throw_if_aborted(int device, const Group& g, const GroupOp* waiting) const {
    if (!aborted_) return;
    Text t;
    t << "device " << device << ", step " << g.step << ": stopped";
    std::string s = t.str();
    if (waiting != nullptr) {
      Text w;
      w << " while waiting for device " << waiting->peer << " to " << (waiting->kind == OpKind::kSend ? "receive " : "send ");
      s += w.str() + describe(waiting->message);
    }
    throw Error(s + " because another device failed: " + reason_);
  }

  // Called with the lock held: pairs a send with the receive it meets in FIFO order.
  void match(const Posted& send, const Posted& recv) {
    Group& sg = group(send.device);
    Group& rg = group(recv.device);
    if (!(send.message == recv.message)) {
      Text t;
      t << "device " << recv.device << ", step " << rg.step << " expects from device " << send.device << " ";
      std::string s = t.str() + describe(recv.message);
      Text u;
      u << ", but the message it matches, sent by device " << send.device << " at its step " << sg.step << ", is ";
      throw Error(s + u.str() + describe(send.message));
    }
    if (send.message.bytes != 0) std::memcpy(recv.dst, send.src, send.message.bytes);
    sg.ops[static_cast<std::size_t>(send.op)].done = true;
    rg.ops[static_cast<std::size_t>(recv.op)].done = true;
    --sg.pending;
    --rg.pending;
    if (sg.pending == 0) wake(send.device).notify_one();
    if (rg.pending == 0 && recv.device != send.device) wake(recv.device).notify_one();
  }

  int devices_;
  RendezvousOptions options_;
  std::mutex mutex_;
  std::vector<Channel> channels_;  // [from * P + to]
  std::vector<Group> groups_;
  bool aborted_ = false;
  std::string reason_;
  bool agree_all_ = true;
  bool agree_result_ = true;
  int agree_arrived_ = 0;
  unsigned long long agree_generation_ = 0;
  std::vector<char> agreed_;
  int reset_arrived_ = 0;
  unsigned long long reset_generation_ = 0;
  std::vector<char> in_reset_;
  std::unique_ptr<std::condition_variable[]> wakes_;  // [device]: where that device waits
};

}  // namespace detail

/// One device's end of the rendezvous fabric. Satisfies pipeweave::Transport. Each
/// endpoint is used by its own device thread; endpoints of one fabric share it.
class RendezvousEndpoint {
 public:
  /// Device `device`'s end of `fabric`; see make_rendezvous().
  RendezvousEndpoint(std::shared_ptr<detail::RendezvousFabric> fabric, int device)
      : fabric_(std::move(fabric)), device_(device) {}

  /// This device's index.
  int device() const { return device_; }
  /// Number of devices on the fabric.
  int devices() const { return fabric_->devices(); }

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) {
    auto& g = fabric_->group(device_);
    if (g.open) throw Error(where(step) + "group_begin inside an open group");
    g.open = true;
    g.step = step;
    g.ops.clear();
  }
  /// Adds a send of `message.bytes` bytes at `data` to device `peer`.
  void send(int peer, const Message& message, const void* data) { add(OpKind::kSend, peer, message, data, nullptr); }
  /// Adds a receive of `message` from device `peer` into `data`.
  void recv(int peer, const Message& message, void* data) { add(OpKind::kRecv, peer, message, nullptr, data); }
  /// Posts the group and returns once every operation of it is matched; throws
  /// pipeweave::Error on a mismatch, a timeout or an abort.
  void group_end() {
    auto& g = fabric_->group(device_);
    if (!g.open) throw Error(where(g.step) + "group_end without group_begin");
    g.open = false;
    if (!g.ops.empty()) fabric_->run_group(device_);
  }
  /// True when every device passes true; waits for all of them.
  bool agree(bool ok) { return fabric_->agree(device_, ok); }
  /// Stops every wait on every device with an error quoting `reason`.
  void abort(std::string_view reason) noexcept { fabric_->abort(reason); }
  /// Collective: clears an aborted fabric once every device has called it.
  void reset() { fabric_->reset(device_); }

 private:
  std::string where(int step) const {
    Text t;
    t << "device " << device_ << ", step " << step << ": ";
    return t.str();
  }
  void add(OpKind kind, int peer, const Message& message, const void* src, void* dst) {
    auto& g = fabric_->group(device_);
    if (!g.open) throw Error(where(g.step) + (kind == OpKind::kSend ? "send" : "recv") + " outside a group");
    if (peer < 0 || peer >= devices()) {
      Text t;
      t << "peer " << peer << " is not a device (devices are 0.." << devices() - 1 << ")";
      throw Error(where(g.step) + t.str());
    }
    g.ops.push_back({kind, peer, message, src, dst, false});
  }

  std::shared_ptr<detail::RendezvousFabric> fabric_;
  int device_;
};

static_assert(Transport<RendezvousEndpoint>);

/// The endpoints of `devices` devices on one new rendezvous fabric; endpoint d
/// belongs to device d's thread.
inline std::vector<RendezvousEndpoint> make_rendezvous(int devices, RendezvousOptions options = {}) {
  if (devices < 1) throw Error("make_rendezvous: devices must be at least 1 (got " + std::to_string(devices) + ")");
  auto fabric = std::make_shared<detail::RendezvousFabric>(devices, options);
  std::vector<RendezvousEndpoint> ends;
  ends.reserve(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) ends.emplace_back(fabric, d);
  return ends;
}

}  // namespace pipeweave::cpu
