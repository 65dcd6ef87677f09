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
/// auto ends = pipeweave::cpu::make_rendezvous(2, std::chrono::milliseconds(500));
/// // thread of device 0:
/// //   ends[0].group_begin(step); ends[0].send(1, message, data); ends[0].group_end();
/// // thread of device 1:
/// //   ends[1].group_begin(step); ends[1].recv(0, message, buffer); ends[1].group_end();
/// \endcode

#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::cpu {

/// One device's end of the rendezvous fabric. Satisfies pipeweave::Transport. Each
/// endpoint is used by its own device thread; endpoints of one fabric share it.
class RendezvousEndpoint {
 public:
  /// Device `device`'s end of `matcher`; see make_rendezvous().
  RendezvousEndpoint(std::shared_ptr<RendezvousMatcher> matcher, int device)
      : matcher_(std::move(matcher)), device_(device) {}

  /// This device's index.
  int device() const { return device_; }
  /// Number of devices on the fabric.
  int devices() const { return matcher_->devices(); }

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) { matcher_->begin(device_, step); }
  /// Adds a send of `message.bytes` bytes at `data` to device `peer`.
  void send(int peer, const Message& message, const void* data) {
    matcher_->add(device_, OpKind::kSend, peer, message, data, nullptr);
  }
  /// Adds a receive of `message` from device `peer` into `data`.
  void recv(int peer, const Message& message, void* data) {
    matcher_->add(device_, OpKind::kRecv, peer, message, nullptr, data);
  }
  /// Posts the group and returns once every operation of it is matched (the data
  /// is copied at each match); throws pipeweave::Error on a mismatch, a timeout or
  /// an abort.
  void group_end() {
    if (matcher_->close(device_)) matcher_->post(device_);
  }
  /// True when every device passes true; waits for all of them.
  bool agree(bool ok) { return matcher_->agree(device_, ok); }
  /// Stops every wait on every device with an error quoting `reason`.
  void abort(std::string_view reason) noexcept { matcher_->abort(reason); }
  /// Collective: clears an aborted fabric once every device has called it.
  void reset() { matcher_->reset(device_); }
  /// reset() for a device whose own part of a reset failed (`why`), in a
  /// transport that wraps this one: it meets the others all the same, and every
  /// device's reset throws naming it, so that none waits for this device until
  /// the timeout. Throws pipeweave::Error.
  void reset_failed(std::string_view why) { matcher_->reset(device_, [] {}, why); }

 private:
  std::shared_ptr<RendezvousMatcher> matcher_;
  int device_;
};

static_assert(Transport<RendezvousEndpoint>);

/// The endpoints of `devices` devices on one new rendezvous fabric, whose waits
/// (a group, an agreement, a reset) give up after `timeout` and spin for up to
/// `spin` before they park (runtime/matcher.hpp); endpoint d belongs to device
/// d's thread. At each match the receiving side's buffer gets the bytes.
inline std::vector<RendezvousEndpoint> make_rendezvous(int devices, std::chrono::milliseconds timeout = kDefaultTimeout,
                                                       std::chrono::microseconds spin = kDefaultSpin) {
  if (devices < 1) throw_error({}, "make_rendezvous: devices must be at least 1 (got ", devices, ")");
  auto matcher = std::make_shared<RendezvousMatcher>(
      devices, timeout,
      [](const MatchSide& send, const MatchSide& recv) {
        if (recv.op.message.bytes != 0) std::memcpy(recv.op.dst, send.op.src, recv.op.message.bytes);
      },
      spin);
  std::vector<RendezvousEndpoint> ends;
  ends.reserve(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) ends.emplace_back(matcher, d);
  return ends;
}

}  // namespace pipeweave::cpu
