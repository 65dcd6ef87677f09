#pragma once
/// \file
/// MPI point-to-point for tensors in host memory: the transport of the
/// multi-process host (mpi/pipeline.hpp) for a backend whose buffers the host
/// reads and writes (the CPU backend; cpu/mpi.hpp builds its parts). One process
/// per pipeline device under `mpirun`, across machines too.
///
/// Matching and checks. A message is two MPI messages on a communicator of the
/// transport's own: a header (the tensor, its byte count and the sender's step),
/// sent synchronously (MPI_Issend), then the payload (MPI_Isend). MPI keeps the
/// messages of one sender, tag and communicator in order, so per directed pair of
/// ranks the sends and receives match in FIFO order without tags, as NCCL's do;
/// and a synchronous send completes only once its receive has started, so a send
/// completes when its receive is posted, as the Transport concept says. The
/// receiver checks each header against what it expects before it posts the
/// payload's receive: a mismatch is an error naming both sides (worded as the
/// in-process matcher words it), and no byte of that message lands.
///
/// Failure. Every wait polls (runtime/poll.hpp) for the failure notices of other
/// ranks (mpi/control.hpp) and has the timeout; a timeout names the rank and the
/// message waited for, and the ranks that do not answer a roll call (a lost
/// process). A group that fails cancels its pending receives, so nothing lands in
/// a buffer after the error. reset() (collective, before the next step) drains
/// what the failed step left in flight: the ranks exchange how many headers and
/// payloads each sent to each, every rank receives the ones it has not, and every
/// send completes, so the next step starts on a clean communicator.
///
/// \code
/// // rank d of P, under mpirun:
/// // auto control = std::make_shared<pipeweave::mpi::Control>(MPI_COMM_WORLD, std::chrono::seconds(30));
/// // pipeweave::mpi::HostEndpoint end(control);
/// // end.connect();                                        // collective
/// // end.group_begin(step); end.send(d + 1, message, data); end.group_end();
/// \endcode

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/mpi/control.hpp"
#include "pipeweave/mpi/group.hpp"
#include "pipeweave/mpi/pipeline.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/matcher.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave::mpi {

/// One rank's end of MPI point-to-point for tensors in host memory: a
/// multi-process transport (MultiProcessTransport). Built locally on the rank's
/// Control, joined to the other ranks by connect(). Its send and recv
/// (RankCalls) take host memory. Not thread-safe: the rank's thread uses it.
class HostEndpoint : public RankCalls<HostEndpoint> {
 public:
  /// The endpoint of this rank; talks to nobody yet.
  explicit HostEndpoint(std::shared_ptr<Control> control) : s_(std::make_unique<State>(std::move(control))) {}

  /// Collective: the transport's own communicator of all ranks.
  void connect() {
    State& s = *s_;
    if (s.comm != MPI_COMM_NULL) return;
    s.comm = s.control->new_communicator();
    const auto P = static_cast<std::size_t>(devices());
    for (auto* v : {&s.sent_headers, &s.sent_payloads, &s.got_headers, &s.got_payloads}) v->assign(P, 0);
    s.blocked.assign(P, 0);
  }

  /// Opens a group of the lowered program's step `step`.
  void group_begin(int step) {
    State& s = *s_;
    if (s.in_flight) throw_error(s.where(step), "a failed group is still in flight; reset the transport first");
    s.group.begin(device(), step);
  }

  /// Posts the group and returns once every operation of it is complete (each
  /// send received, each receive checked and filled). Throws pipeweave::Error on a
  /// mismatch, a timeout, or another rank's failure; the group's receives are then
  /// cancelled.
  void group_end() {
    State& s = *s_;
    if (!s.group.close(device())) return;
    if (s.comm == MPI_COMM_NULL) throw_error(s.where(s.step()), "the endpoint is not connected (call connect)");
    s.control->check(s.step());
    s.in_flight = true;
    try {
      s.post();
      if (!poll_until([&] { return s.progress(); }, s.control->timeout(),
                      [&](std::chrono::steady_clock::duration) { s.control->check(s.step()); }))
        throw_error({}, s.control->explain_timeout(s.timeout_text()));
    } catch (...) {
      s.cancel_receives();
      throw;
    }
    s.in_flight = false;
  }

  /// True when every rank passes true (polled; see Control::agree).
  bool agree(bool ok) {
    State& s = *s_;
    s.control->check(s.step());
    return s.control->agree(ok, s.step());
  }
  /// Stops this rank's receives and tells every other rank, whose waits then stop
  /// with an error quoting `reason`.
  void abort(std::string_view reason) noexcept {
    s_->cancel_receives();
    s_->control->abort(reason);
  }
  /// Collective over all ranks, before the next step after a failed one: clears the
  /// failure (Control::reset) and drains every message the failed step left in
  /// flight. Throws pipeweave::Error when that does not end within the timeout.
  void reset() {
    State& s = *s_;
    s.control->reset();
    if (s.comm != MPI_COMM_NULL) s.drain();
    s.group.clear();
    s.in_flight = false;
  }

 private:
  // What a message carries ahead of its payload.
  struct Header {
    std::int32_t kind = 0, stage = 0, micro_batch = 0, step = 0;
    std::uint64_t bytes = 0;
    std::int32_t dtype = 0;  // DType
    std::int32_t unused = 0;
  };
  struct Op {
    OpKind kind = OpKind::kSend;
    int peer = 0;
    Message message{};
    const void* src = nullptr;
    void* dst = nullptr;
    Header header{};  // sent, or received
    MPI_Request header_request = MPI_REQUEST_NULL, payload_request = MPI_REQUEST_NULL;
    bool checked = false;  // a receive: its header arrived and matched
  };
  static constexpr int kHeaderTag = 1, kPayloadTag = 2;
  // How long a receive that cannot be cancelled (its transfer under way) is waited for.
  static constexpr std::chrono::milliseconds kCancelWait{200};

  struct State {
    explicit State(std::shared_ptr<Control> c) : control(std::move(c)) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    // Frees the communicator; with operations of a failed group still pending
    // (no reset since), leaves it and keeps their buffers until the process ends.
    ~State() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized || comm == MPI_COMM_NULL) return;
      cancel_receives();
      if (in_flight) {
        detail::keep_until_exit(std::make_shared<std::vector<Op>>(std::move(group.ops())));
        return;
      }
      MPI_Comm_free(&comm);
    }

    Where where(int at_step) const { return {.device = control->device(), .step = at_step}; }
    int step() const { return group.step(); }
    // The MPI rank (of the run's communicators) of device `device` of this rank's replica.
    int rank_of(int device) const { return control->rank_of(device); }

    // The MPI datatype and count of a payload of `bytes` bytes.
    std::pair<MPI_Datatype, int> payload_type(std::uint64_t bytes) const {
      if (bytes % sizeof(float) == 0 && bytes / sizeof(float) <= INT_MAX)
        return {MPI_FLOAT, static_cast<int>(bytes / sizeof(float))};
      if (bytes <= INT_MAX) return {MPI_BYTE, static_cast<int>(bytes)};
      throw_error(where(step()), "a message of ", bytes, " bytes is larger than one MPI message may be");
    }

    // Posts every operation of the group: a send's header and payload, a receive's header.
    void post() {
      for (Op& op : group.ops()) {
        const auto q = static_cast<std::size_t>(op.peer);
        if (op.kind == OpKind::kSend) {
          op.header = {static_cast<std::int32_t>(op.message.tensor.kind), op.message.tensor.stage,
                       op.message.tensor.micro_batch, step(), op.message.bytes,
                       static_cast<std::int32_t>(op.message.dtype)};
          check_mpi(MPI_Issend(&op.header, sizeof(Header), MPI_BYTE, rank_of(op.peer), kHeaderTag, comm, &op.header_request),
                    "MPI_Issend");
          ++sent_headers[q];
          if (op.message.bytes > 0) {
            const auto [type, count] = payload_type(op.message.bytes);
            check_mpi(MPI_Isend(op.src, count, type, rank_of(op.peer), kPayloadTag, comm, &op.payload_request), "MPI_Isend");
            ++sent_payloads[q];
          }
        } else {
          check_mpi(MPI_Irecv(&op.header, sizeof(Header), MPI_BYTE, rank_of(op.peer), kHeaderTag, comm, &op.header_request),
                    "MPI_Irecv");
        }
      }
    }

    // One poll of the group; true when every operation is complete. A receive's
    // payload is posted once its header has arrived and matched, in the order of
    // the receives from that peer (a later header is not looked at before an
    // earlier one), so payloads match their receives in FIFO order too.
    bool progress() {
      bool done = true;
      std::fill(blocked.begin(), blocked.end(), 0);
      for (Op& op : group.ops()) {
        const auto q = static_cast<std::size_t>(op.peer);
        if (op.kind == OpKind::kSend) {
          done = test(op.header_request) && done;
          done = test(op.payload_request) && done;
          continue;
        }
        if (!op.checked) {
          if (blocked[q] || !test(op.header_request)) {
            blocked[q] = 1;
            done = false;
            continue;
          }
          ++got_headers[q];
          check_header(op);
          op.checked = true;
          if (op.message.bytes > 0) {
            const auto [type, count] = payload_type(op.message.bytes);
            check_mpi(MPI_Irecv(op.dst, count, type, rank_of(op.peer), kPayloadTag, comm, &op.payload_request), "MPI_Irecv");
          }
        }
        if (op.payload_request != MPI_REQUEST_NULL) {
          if (test(op.payload_request))
            ++got_payloads[q];
          else
            done = false;
        }
      }
      return done;
    }

    // True once `request` is complete (or was none).
    static bool test(MPI_Request& request) {
      if (request == MPI_REQUEST_NULL) return true;
      int flag = 0;
      check_mpi(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      return flag != 0;
    }

    // Throws when a received header is not the message the receive expects.
    void check_header(const Op& op) const {
      const Header& h = op.header;
      if (h.kind != static_cast<std::int32_t>(TensorKind::kActivation) &&
          h.kind != static_cast<std::int32_t>(TensorKind::kGradient))
        throw_error(where(step()), "received a malformed message header from device ", op.peer,
                    " (is it running another build?)");
      if (h.dtype < 0 || static_cast<std::size_t>(h.dtype) >= std::size(kDTypeRows))
        throw_error(where(step()), "received a message header of unknown dtype ", h.dtype, " from device ", op.peer,
                    " (is it running another build?)");
      const Message got{{static_cast<TensorKind>(h.kind), h.stage, h.micro_batch}, h.bytes,
                        static_cast<DType>(h.dtype)};
      if (!(got == op.message)) throw_mismatch(control->device(), step(), op.message, op.peer, h.step, got);
    }

    // The error of a group that timed out: the first operation not complete.
    std::string timeout_text() const {
      const auto ms = control->timeout().count();
      const Where w = where(step());
      for (const Op& op : group.ops()) {
        if (op.kind == OpKind::kSend && op.header_request != MPI_REQUEST_NULL)
          return error_text(w, "timed out after ", ms, " ms waiting for device ", op.peer, " to receive ",
                            op.message);
        if (op.kind == OpKind::kSend && op.payload_request != MPI_REQUEST_NULL)
          return error_text(w, "timed out after ", ms, " ms waiting for device ", op.peer,
                            " to take the payload of ", op.message);
        if (op.kind == OpKind::kRecv && !op.checked)
          return error_text(w, "timed out after ", ms, " ms waiting for device ", op.peer, " to send ",
                            op.message);
        if (op.kind == OpKind::kRecv && op.payload_request != MPI_REQUEST_NULL)
          return error_text(w, "timed out after ", ms, " ms waiting for the payload of ", op.message,
                            " from device ", op.peer);
      }
      return error_text(w, "timed out after ", ms, " ms");
    }

    // Cancels every pending receive of the group; each one that completes
    // (cancelled, or received meanwhile) is counted. A receive whose message is
    // already being transferred cannot be cancelled: it is given a moment, and left
    // pending when its sender does not finish (a lost rank); reset() settles it.
    // Never throws.
    void cancel_receives() noexcept {
      for (Op& op : group.ops()) {
        if (op.kind != OpKind::kRecv) continue;
        for (MPI_Request* r : {&op.header_request, &op.payload_request})
          if (*r != MPI_REQUEST_NULL) MPI_Cancel(r);
      }
      try {
        poll_until([&] { return settle_receives(); }, kCancelWait, [](std::chrono::steady_clock::duration) {});
      } catch (...) {
        // MPI_Test does not throw; poll_until's clock neither
      }
    }
    // Tests the group's pending receives, counting each that completed with its
    // message (not cancelled); true when none is pending.
    bool settle_receives() noexcept {
      bool settled = true;
      for (Op& op : group.ops()) {
        if (op.kind != OpKind::kRecv) continue;
        const auto q = static_cast<std::size_t>(op.peer);
        for (auto [r, count] : {std::pair{&op.header_request, &got_headers}, std::pair{&op.payload_request, &got_payloads}}) {
          if (*r == MPI_REQUEST_NULL) continue;
          int done = 0, cancelled = 0;
          MPI_Status status;
          if (MPI_Test(r, &done, &status) != MPI_SUCCESS || !done) {
            settled = false;
            continue;
          }
          MPI_Test_cancelled(&status, &cancelled);
          if (!cancelled && q < count->size()) ++(*count)[q];
        }
      }
      return settled;
    }

    // reset()'s drain: every rank receives what was sent to it in this generation
    // and not received (the counts are exchanged), and every send of this rank
    // completes. MPI's order per sender and tag makes the drained messages the
    // oldest ones, so a rank that already starts its next step is not disturbed.
    void drain() {
      cancel_receives();
      // Every rank is here (Control::reset met them all), so a transfer still in
      // flight finishes; the counts below hold once it has.
      if (!poll_until([&] { return settle_receives(); }, control->timeout(),
                      [&](std::chrono::steady_clock::duration) { control->failed(); }))
        throw_error({.device = control->device()}, "resetting the transport: timed out after ",
                    control->timeout().count(), " ms waiting for the receives of the failed step to end");
      const int P = control->devices(), me = control->device();
      std::vector<double> mine(2 * static_cast<std::size_t>(P));
      for (int q = 0; q < P; ++q) {
        mine[static_cast<std::size_t>(q)] = static_cast<double>(sent_headers[static_cast<std::size_t>(q)]);
        mine[static_cast<std::size_t>(P + q)] = static_cast<double>(sent_payloads[static_cast<std::size_t>(q)]);
      }
      const std::vector<std::vector<double>> sent = control->gather(mine, Control::kEveryRank, -1);
      std::vector<std::uint64_t> headers_due(static_cast<std::size_t>(P)), payloads_due(headers_due.size());
      std::size_t total = 0;
      for (std::size_t q = 0; q < headers_due.size(); ++q) {
        const std::vector<double>& from = sent[static_cast<std::size_t>(rank_of(static_cast<int>(q)))];
        headers_due[q] = static_cast<std::uint64_t>(from[static_cast<std::size_t>(me)]) - got_headers[q];
        payloads_due[q] = static_cast<std::uint64_t>(from[static_cast<std::size_t>(P + me)]) - got_payloads[q];
        total += headers_due[q];
      }
      std::vector<Header> headers(total);
      std::vector<MPI_Request> requests(total, MPI_REQUEST_NULL);
      std::size_t at = 0;
      for (int q = 0; q < P; ++q)
        for (std::uint64_t k = 0; k < headers_due[static_cast<std::size_t>(q)]; ++k, ++at)
          check_mpi(MPI_Irecv(&headers[at], sizeof(Header), MPI_BYTE, rank_of(q), kHeaderTag, comm, &requests[at]), "MPI_Irecv");
      std::vector<char> scratch;
      auto drained = [&] {
        for (int q = 0; q < P; ++q) {
          auto& due = payloads_due[static_cast<std::size_t>(q)];
          while (due > 0) {
            int flag = 0;
            MPI_Message message = MPI_MESSAGE_NULL;
            MPI_Status status;
            check_mpi(MPI_Improbe(rank_of(q), kPayloadTag, comm, &flag, &message, &status), "MPI_Improbe");
            if (!flag) break;
            int count = 0;
            MPI_Get_count(&status, MPI_BYTE, &count);
            scratch.resize(static_cast<std::size_t>(std::max(count, 1)));
            check_mpi(MPI_Mrecv(scratch.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
            --due;
          }
        }
        bool done = std::all_of(payloads_due.begin(), payloads_due.end(), [](std::uint64_t d) { return d == 0; });
        for (MPI_Request& r : requests) done = test(r) && done;
        for (Op& op : group.ops())
          if (op.kind == OpKind::kSend) done = test(op.header_request) && test(op.payload_request) && done;
        return done;
      };
      // Polling for notices answers the roll calls of other ranks meanwhile.
      if (!poll_until(drained, control->timeout(), [&](std::chrono::steady_clock::duration) { control->failed(); }))
        throw_error({}, control->explain_timeout(
                            error_text({.device = me}, "resetting the transport: timed out after ",
                                       control->timeout().count(), " ms draining the messages of the failed step")));
      for (auto* v : {&sent_headers, &sent_payloads, &got_headers, &got_payloads}) std::fill(v->begin(), v->end(), 0);
    }

    std::shared_ptr<Control> control;
    MPI_Comm comm = MPI_COMM_NULL;
    RankGroup<Op> group;  // its operations' buffers stay put while a request is pending
    bool in_flight = false;  // a group was posted and has not completed (until reset)
    // [peer]: messages of this generation sent to, and received from, each rank.
    std::vector<std::uint64_t> sent_headers, sent_payloads, got_headers, got_payloads;
    std::vector<char> blocked;  // [peer]: scratch of progress()
  };

  friend class RankCalls<HostEndpoint>;
  std::unique_ptr<State> s_;
};

static_assert(MultiProcessTransport<HostEndpoint>);

}  // namespace pipeweave::mpi
