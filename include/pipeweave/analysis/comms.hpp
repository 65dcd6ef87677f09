#pragma once
/// \file
/// A program with its communication as PyTorch writes it: the "compute_comms"
/// rows of torch.distributed.pipelining (`_dump_csv(..., format="compute_comms")`,
/// `_PipelineScheduleRuntime._load_csv(..., format="compute_comms")`), in which
/// each rank's row holds its sends (`SEND_F`, `SEND_B`), receives (`RECV_F`,
/// `RECV_B`) and waits for its sends (`WAIT_SEND_F`, `WAIT_SEND_B`) between its
/// compute actions, in the order PyTorch's runtime issues them.
///
/// - with_comms() places the communication of a verified program for PyTorch:
///   each send right after the compute that makes its tensor, the messages of
///   a pair of ranks in one order on both sides, each receive as early as that
///   order allows (or as late), each wait for a forward send after the
///   backward that frees its activation, the other waits at the end of the
///   row; proved below before it is returned;
/// - parse_pytorch_comms() reads such rows as they are written, sends and
///   receives included (parse_pytorch_csv() drops them);
/// - prove_comms() proves that the rows cannot hang under a semantics of
///   point-to-point operations (CommOrder), or names the hang: the rank, the
///   action index and the cycle of waits.
///
/// PyTorch's runtime posts a send or a receive without waiting (isend, irecv);
/// a compute waits for the receives it reads, a WAIT_SEND for its send. A
/// rank's sends to a peer are matched with the peer's receives from it in the
/// order both are posted, whatever the semantics.
///
/// \code
/// pipeweave::CommsProgram c = pipeweave::with_comms(pipeweave::make_schedule("1f1b", 2, 1, 2));
/// std::string csv = pipeweave::to_pytorch_comms_csv(c);
/// // "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0RECV_B1,0B0,...\n1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,..."
/// assert(pipeweave::prove_comms(pipeweave::parse_pytorch_comms(csv), pipeweave::CommOrder::kInOrderPerPair));
/// \endcode

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/dataflow.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What a point-to-point operation's completion waits for: one row each in
/// kCommOrderRows.
enum class CommOrder : unsigned char {
  kAsyncSends,      ///< a send completes when posted; a receive when its send is posted (gloo-like)
  kInOrderPerPair,  ///< a rank's operations with one peer complete in the order posted, each send together with its receive (NCCL-like)
  kInOrderPerRank,  ///< all of a rank's operations complete in the order posted (one stream per rank)
};

/// A semantics' name and words.
struct CommOrderRow {
  CommOrder order;
  std::string_view name;   ///< "async", "pair", "rank"
  std::string_view words;  ///< in messages
};

inline constexpr CommOrderRow kCommOrderRows[] = {
    {CommOrder::kAsyncSends, "async",
     "asynchronous sends (gloo-like): a send never blocks, a compute waits for the receives it reads"},
    {CommOrder::kInOrderPerPair, "pair",
     "in order per pair of ranks (NCCL-like): a rank's sends and receives with one peer complete in the order "
     "posted, a send when its receive is reached"},
    {CommOrder::kInOrderPerRank, "rank",
     "in order per rank (one stream per rank): a rank's sends and receives complete in the order posted, a send "
     "when its receive is reached"},
};

constexpr const CommOrderRow& comm_order_row(CommOrder order) { return kCommOrderRows[static_cast<int>(order)]; }

/// The semantics comm_order_row() calls `name`; none for any other name.
constexpr std::optional<CommOrder> parse_comm_order(std::string_view name) {
  for (const CommOrderRow& row : kCommOrderRows)
    if (row.name == name) return row.order;
  return std::nullopt;
}

/// One field of a rank's compute_comms row: a step of the program (a compute
/// action, an overlapped pair, a gradient reduction) or a communication action.
struct CommsEntry {
  int comm = -1;         ///< its row of kCommRows (pytorch_csv.hpp); -1: a step of the program
  int stage = 0;         ///< the action's virtual stage (PyTorch's stage index)
  int micro_batch = 0;   ///< its micro-batch (0 where it has none)
  int action = -1;       ///< a program step: the index of its (first) action in Program::devices[rank]
  int actions = 0;       ///< a program step: 1, or 2 for an overlapped pair

  friend constexpr bool operator==(const CommsEntry&, const CommsEntry&) = default;
};

/// A program and each rank's compute_comms row: every action of the program in
/// its order, with the communication between.
struct CommsProgram {
  Program program;
  std::vector<std::vector<CommsEntry>> rows;

  friend constexpr bool operator==(const CommsProgram&, const CommsProgram&) = default;
};

/// Outcome of prove_comms(): true when the rows cannot hang; otherwise the
/// rank and the index of the field in its row where the problem is (-1 for
/// none), and a one-line message.
struct CommsVerdict {
  bool ok = true;
  int rank = -1;
  int index = -1;
  std::string message;

  explicit operator bool() const { return ok; }
  /// The message, or "ok".
  std::string what() const { return ok ? std::string("ok") : message; }
};

/// An entry as PyTorch spells it: "1RECV_F3", "0F2", "(0F6;4B0)OVERLAP_F_B", "3REDUCE_GRAD".
inline std::string comms_field(const CommsProgram& c, int rank, const CommsEntry& e) {
  if (e.comm < 0) {
    std::size_t k = static_cast<std::size_t>(e.action);
    const auto& row = c.program.devices[static_cast<std::size_t>(rank)];
    return pytorch_step(c.program.shape, rank, k, row.size(), [&](std::size_t i) { return row[i]; });
  }
  const CommRow& row = kCommRows[e.comm];
  return std::to_string(e.stage) + std::string(row.name) + (row.micro_batch ? std::to_string(e.micro_batch) : "");
}

/// The rows in PyTorch's compute_comms CSV format.
inline std::string to_pytorch_comms_csv(const CommsProgram& c) {
  std::string out;
  for (std::size_t r = 0; r < c.rows.size(); ++r) {
    for (std::size_t k = 0; k < c.rows[r].size(); ++k)
      out += (k ? "," : "") + comms_field(c, static_cast<int>(r), c.rows[r][k]);
    out += "\n";
  }
  return out;
}

/// Reads compute_comms rows from PyTorch-format CSV text, its sends, receives
/// and waits as written (the rules of parse_pytorch_csv() for the rest). The
/// rows are not proved here: prove_comms() them. Throws pipeweave::Error naming
/// the line and column of the first field that does not parse.
inline CommsProgram parse_pytorch_comms(std::string_view text, const CsvImportOptions& options = {}) {
  const detail::CsvTable table = detail::read_pytorch_csv(text, options);
  CommsProgram c{detail::csv_program(table), std::vector<std::vector<CommsEntry>>(table.rows.size())};
  for (std::size_t d = 0; d < table.rows.size(); ++d) {
    const auto& row = table.rows[d];
    int action = 0;
    for (std::size_t k = 0; k < row.size(); ++k) {
      const detail::CsvAction& a = row[k];
      if (a.comm >= 0) {
        c.rows[d].push_back({a.comm, a.stage, a.micro_batch});
        continue;
      }
      const int n = a.overlaps_next && k + 1 < row.size() ? 2 : 1;  // a pair: its forward, then its backward
      c.rows[d].push_back({-1, a.stage, a.micro_batch, action, n});
      action += n;
      k += static_cast<std::size_t>(n - 1);
    }
  }
  return c;
}

/// parse_pytorch_comms() of a file.
inline CommsProgram load_pytorch_comms(const std::string& path, const CsvImportOptions& options = {}) {
  return detail::parse_csv_file(path, options, parse_pytorch_comms);
}

namespace detail {

/// The tensor a send, receive or wait entry moves.
inline TensorId comms_tensor(const CommsEntry& e) {
  const CommRow& row = kCommRows[e.comm];
  return {row.tensor, e.stage + row.producer_offset, e.micro_batch};
}

/// The rank a send or receive entry of `rank` talks to, or -1 where its stage has no such neighbour.
inline int comms_peer(const ScheduleShape& s, const CommsEntry& e) {
  const CommRow& row = kCommRows[e.comm];
  const TensorId x = comms_tensor(e);
  const int other = row.role == CommRole::kRecv ? x.stage : consumer_stage(x);
  return other < 0 || other >= s.stages() ? -1 : s.device_of_stage(other);
}

/// " at rank r, action k (1F0)": where an entry is, in messages.
inline std::string comms_where(const CommsProgram& c, int rank, int index) {
  return "rank " + std::to_string(rank) + ", action " + std::to_string(index) + " (" +
         comms_field(c, rank, c.rows[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)]) + ")";
}

/// One send or receive of the rows, with what the proof knows of it.
struct CommsOp {
  int rank = 0;
  int index = 0;       ///< its field in the rank's row
  int peer = 0;
  bool send = false;
  int match = -1;      ///< the op it is matched with on the peer
  int queue = -1;      ///< its completion queue (in-order semantics)
  bool posted = false;
  bool complete = false;
};

/// The sends and receives of the rows, matched; what each field waits for.
struct CommsPlan {
  std::vector<CommsOp> ops;
  std::vector<std::vector<int>> op_of;     ///< [rank][field]: its op, or -1
  std::vector<std::vector<std::vector<int>>> reads;  ///< [rank][field]: the ops a program step or a wait waits for
};

inline CommsVerdict comms_fail(const CommsProgram& c, int rank, int index, const std::string& what) {
  return {false, rank, index, comms_where(c, rank, index) + ": " + what};
}

/// The checks of each row on its own, as PyTorch's runtime makes them, and the
/// matching of sends and receives; fills `plan`. Every problem is named at its field.
inline CommsVerdict plan_comms(const CommsProgram& c, CommsPlan& plan) {
  const ScheduleShape& s = c.program.shape;
  const int P = static_cast<int>(c.rows.size());
  const int results = s.action_count();
  plan.op_of.assign(c.rows.size(), {});
  plan.reads.assign(c.rows.size(), {});
  // [rank][peer]: the ops each rank posts to each peer, sends and receives apart, in order.
  std::vector<std::vector<int>> sends(static_cast<std::size_t>(P) * P), recvs(sends.size());
  // Per rank, reset between ranks where they were touched: results made on the rank, [tensor]: its pending send
  // op (-2 once waited for), [tensor]: its posted, unread receive op.
  std::vector<char> done(static_cast<std::size_t>(results), 0);
  std::vector<int> sent(static_cast<std::size_t>(2 * results), -1), received(sent.size(), -1);
  std::vector<int> touched_done, touched;
  for (int r = 0; r < P; ++r) {
    const auto& row = c.rows[static_cast<std::size_t>(r)];
    const auto& actions = c.program.devices[static_cast<std::size_t>(r)];
    plan.op_of[r].assign(row.size(), -1);
    plan.reads[r].assign(row.size(), {});
    for (const int i : touched_done) done[static_cast<std::size_t>(i)] = 0;
    for (const int i : touched) sent[static_cast<std::size_t>(i)] = received[static_cast<std::size_t>(i)] = -1;
    touched_done.clear();
    touched.clear();
    int pending_reduce = -1;  // stage of the reduction not yet waited for
    for (int k = 0; k < static_cast<int>(row.size()); ++k) {
      const CommsEntry& e = row[static_cast<std::size_t>(k)];
      auto fail = [&](const std::string& what) { return comms_fail(c, r, k, what); };
      if (e.comm < 0) {
        for (int h = 0; h < e.actions; ++h) {
          const Action& a = actions[static_cast<std::size_t>(e.action + h)];
          if (a.phase == Phase::kReduce) {
            if (pending_reduce >= 0)
              return fail("a gradient reduction starts while stage " + std::to_string(pending_reduce) +
                          "'s has not been waited for (PyTorch allows one pending REDUCE_GRAD per rank)");
            pending_reduce = e.stage;
            continue;
          }
          const Flow f = flow_of(s, r, a);
          for (int i = 0; i < f.needs; ++i) {
            if (s.device_of_stage(f.need_stage[i]) != r || done[static_cast<std::size_t>(f.need[i])]) continue;
            if (f.need_stage[i] == s.stage_of(r, a.chunk))
              return fail(std::string(phase_row(a.phase).role) + " before the action of its own stage it needs");
            return fail("computes before the action of stage " + std::to_string(f.need_stage[i]) +
                        " on this rank that makes its input");
          }
          const Transfer in = input_of(s, r, a);
          if (in.exists && s.device_of_stage(in.stage) != r) {
            const int x = tensor_index(s, in.tensor);
            const int op = received[static_cast<std::size_t>(x)];
            if (op < 0)
              return fail("computes before receiving its input: no " +
                          std::string(in.tensor.kind == TensorKind::kActivation ? "RECV_F" : "RECV_B") +
                          " of it earlier in the row (PyTorch's runtime refuses to run it)");
            plan.reads[r][k].push_back(op);
            received[static_cast<std::size_t>(x)] = -1;
          }
          done[static_cast<std::size_t>(f.self)] = 1;
          touched_done.push_back(f.self);
        }
        continue;
      }
      const CommRow& cr = kCommRows[e.comm];
      if (cr.role == CommRole::kLocal) {
        if (cr.name == "WAIT_REDUCE_GRAD") {
          if (pending_reduce != e.stage)
            return fail(pending_reduce < 0 ? std::string("waits for a gradient reduction that was not started")
                                           : "waits for stage " + std::to_string(e.stage) + "'s reduction, but stage " +
                                                 std::to_string(pending_reduce) + "'s is the pending one");
          pending_reduce = -1;
        }
        continue;  // UNSHARD and RESHARD wait for no other rank
      }
      const TensorId x = comms_tensor(e);
      const int peer = comms_peer(s, e);
      if (x.stage < 0 || x.stage >= s.stages() || peer < 0)
        return fail(std::string(cr.words) + " of a stage at the end of the model, which has no neighbour there");
      if (peer == r)
        return fail(std::string(cr.words) + " between stages " + std::to_string(x.stage) + " and " +
                    std::to_string(consumer_stage(x)) + ", which are both on this rank: they hand over without a "
                    "message");
      const int xi = tensor_index(s, x);
      touched.push_back(xi);
      if (cr.role == CommRole::kWaitSend) {
        const int op = sent[static_cast<std::size_t>(xi)];
        if (op < 0) return fail("waits for a send that is not pending (none earlier in the row, or already waited for)");
        plan.reads[r][k].push_back(op);
        sent[static_cast<std::size_t>(xi)] = -2;  // waited for
        continue;
      }
      const int op = static_cast<int>(plan.ops.size());
      plan.ops.push_back({r, k, peer, cr.role == CommRole::kSend});
      plan.op_of[r][k] = op;
      if (cr.role == CommRole::kSend) {
        if (!done[static_cast<std::size_t>(tensor_index(s, x))])
          return fail("sends a tensor before the action that makes it (PyTorch's runtime has nothing to send)");
        if (sent[static_cast<std::size_t>(xi)] != -1) return fail("sends the same tensor twice");
        sent[static_cast<std::size_t>(xi)] = op;
        sends[static_cast<std::size_t>(r * P + peer)].push_back(op);
      } else {
        if (received[static_cast<std::size_t>(xi)] >= 0)
          return fail("receives a tensor again before a compute has read the first receive");
        received[static_cast<std::size_t>(xi)] = op;
        recvs[static_cast<std::size_t>(peer * P + r)].push_back(op);
      }
    }
    for (int k = 0; k < static_cast<int>(row.size()); ++k) {
      const int op = plan.op_of[r][k];
      if (op < 0) continue;
      const int xi = tensor_index(s, comms_tensor(row[static_cast<std::size_t>(k)]));
      if (plan.ops[static_cast<std::size_t>(op)].send && sent[static_cast<std::size_t>(xi)] == op)
        return comms_fail(c, r, k, "a send that no WAIT_SEND in the row waits for (PyTorch refuses the row)");
      if (!plan.ops[static_cast<std::size_t>(op)].send && received[static_cast<std::size_t>(xi)] == op)
        return comms_fail(c, r, k, "a receive that no compute of the row reads");
    }
    if (pending_reduce >= 0)
      return {false, r, -1, "rank " + std::to_string(r) + ": stage " + std::to_string(pending_reduce) +
                                "'s REDUCE_GRAD has no WAIT_REDUCE_GRAD after it"};
  }
  // Matching: the k-th send from a rank to a peer is the k-th receive of the peer from it.
  for (int a = 0; a < P; ++a) {
    for (int b = 0; b < P; ++b) {
      const auto& out = sends[static_cast<std::size_t>(a * P + b)];
      const auto& in = recvs[static_cast<std::size_t>(a * P + b)];
      for (std::size_t k = 0; k < std::max(out.size(), in.size()); ++k) {
        if (k >= in.size()) {
          const CommsOp& o = plan.ops[static_cast<std::size_t>(out[k])];
          return comms_fail(c, o.rank, o.index, "rank " + std::to_string(b) + " posts no receive for this send");
        }
        const CommsOp& i = plan.ops[static_cast<std::size_t>(in[k])];
        if (k >= out.size())
          return comms_fail(c, i.rank, i.index, "rank " + std::to_string(a) + " posts no send for this receive");
        const CommsOp& o = plan.ops[static_cast<std::size_t>(out[k])];
        const TensorId want = comms_tensor(c.rows[static_cast<std::size_t>(i.rank)][static_cast<std::size_t>(i.index)]);
        const TensorId got = comms_tensor(c.rows[static_cast<std::size_t>(o.rank)][static_cast<std::size_t>(o.index)]);
        if (!(want == got))
          return comms_fail(c, i.rank, i.index,
                            "receive " + std::to_string(k) + " from rank " + std::to_string(a) + " is matched with its send " +
                                std::to_string(k) + " to this rank, " + comms_where(c, o.rank, o.index) +
                                ", a different tensor (a pair of ranks matches its sends and receives in the order posted)");
        plan.ops[static_cast<std::size_t>(out[k])].match = in[k];
        plan.ops[static_cast<std::size_t>(in[k])].match = out[k];
      }
    }
  }
  return {};
}

/// A run of the rows under a semantics: each rank goes as far as it can, until
/// every rank is at its end or none can move.
class CommsRun {
 public:
  CommsRun(const CommsProgram& c, CommsPlan& plan, CommOrder order) : c_(c), plan_(plan), order_(order) {
    const int P = static_cast<int>(c.rows.size());
    const int queues = order == CommOrder::kInOrderPerPair ? P * P : P;
    queues_.assign(static_cast<std::size_t>(queues), {});
    heads_.assign(queues_.size(), 0);
    for (CommsOp& op : plan_.ops) {
      op.posted = op.complete = false;
      op.queue = order == CommOrder::kInOrderPerPair ? op.rank * P + op.peer : op.rank;
    }
    pc_.assign(c.rows.size(), 0);
  }

  /// Runs to the end or to a hang; true at the end.
  bool run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < static_cast<int>(pc_.size()); ++r) moved = advance(r) || moved;
    }
    for (int r = 0; r < static_cast<int>(pc_.size()); ++r)
      if (!at_end(r)) return false;
    return true;
  }

  int pc(int rank) const { return pc_[static_cast<std::size_t>(rank)]; }
  bool at_end(int rank) const { return pc(rank) == static_cast<int>(c_.rows[static_cast<std::size_t>(rank)].size()); }

  /// The first op a blocked rank's field waits for.
  int blocking_op(int rank) const {
    for (const int op : plan_.reads[static_cast<std::size_t>(rank)][static_cast<std::size_t>(pc(rank))])
      if (!plan_.ops[static_cast<std::size_t>(op)].complete) return op;
    return -1;
  }
  /// The incomplete op ahead of `op` in its queue (the head), or `op` itself.
  int head_of(int op) const {
    if (order_ == CommOrder::kAsyncSends) return op;
    const CommsOp& o = plan_.ops[static_cast<std::size_t>(op)];
    return queues_[static_cast<std::size_t>(o.queue)][heads_[static_cast<std::size_t>(o.queue)]];
  }

 private:
  // Moves rank r as far as it goes; true when it moved.
  bool advance(int r) {
    const auto& row = c_.rows[static_cast<std::size_t>(r)];
    int& pc = pc_[static_cast<std::size_t>(r)];
    const int start = pc;
    while (pc < static_cast<int>(row.size())) {
      const int op = plan_.op_of[static_cast<std::size_t>(r)][static_cast<std::size_t>(pc)];
      if (op >= 0) {
        post(op);
      } else if (blocking_op(r) >= 0) {
        break;
      }
      ++pc;
    }
    return pc != start;
  }

  void post(int op) {
    CommsOp& o = plan_.ops[static_cast<std::size_t>(op)];
    o.posted = true;
    if (order_ == CommOrder::kAsyncSends) {
      if (o.send) o.complete = true;
      CommsOp& recv = plan_.ops[static_cast<std::size_t>(o.send ? o.match : op)];
      if (plan_.ops[static_cast<std::size_t>(recv.match)].posted) recv.complete = true;
      return;
    }
    queues_[static_cast<std::size_t>(o.queue)].push_back(op);
    settle(o.queue);
  }

  // Completes the heads of queue q and of the queues they meet, while their matches are heads too.
  void settle(int q) {
    std::vector<int> work{q};
    while (!work.empty()) {
      const int at = work.back();
      work.pop_back();
      auto& queue = queues_[static_cast<std::size_t>(at)];
      std::size_t& head = heads_[static_cast<std::size_t>(at)];
      while (head < queue.size()) {
        CommsOp& o = plan_.ops[static_cast<std::size_t>(queue[head])];
        CommsOp& m = plan_.ops[static_cast<std::size_t>(o.match)];
        if (!m.posted || head_of(o.match) != o.match) break;
        o.complete = m.complete = true;
        ++head;
        ++heads_[static_cast<std::size_t>(m.queue)];
        work.push_back(m.queue);
      }
    }
  }

  const CommsProgram& c_;
  CommsPlan& plan_;
  CommOrder order_;
  std::vector<std::vector<int>> queues_;  // [queue]: its ops in the order posted
  std::vector<std::size_t> heads_;        // [queue]: its first incomplete op
  std::vector<int> pc_;                   // [rank]: its next field
};

/// What blocked rank r waits for, in words: the op its field waits for, the
/// ops ahead of it in their queues, their matches, until an op whose match is
/// not posted yet (`unposted`, on the rank r then waits on), or until the ops
/// close a cycle among themselves (posted ops held up behind each other in
/// their queues, as in-order semantics can): `cycle`, the ranks around it.
struct WaitChain {
  std::string words;
  int unposted = -1;
  int rank = -1;                            ///< the rank it waits on (-1 for a cycle of ops)
  std::vector<int> cycle;                   ///< the ranks of a cycle of ops, in order
  std::vector<std::pair<int, int>> behind;  ///< (op, the op ahead of it in its queue that holds it up)
};

inline WaitChain follow_wait(const CommsProgram& c, const CommsPlan& plan, const CommsRun& run, int r) {
  auto op_words = [&](int op) {
    const CommsOp& o = plan.ops[static_cast<std::size_t>(op)];
    return comms_field(c, o.rank, c.rows[static_cast<std::size_t>(o.rank)][static_cast<std::size_t>(o.index)]) +
           " (rank " + std::to_string(o.rank) + ", action " + std::to_string(o.index) + ")";
  };
  int op = run.blocking_op(r);
  WaitChain w;
  w.words = "rank " + std::to_string(r) + " at action " + std::to_string(run.pc(r)) + " (" +
            comms_field(c, r, c.rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(run.pc(r))]) +
            ") waits for " + op_words(op);
  std::vector<int> path;  // the ops passed, in order
  auto close = [&](int again) {
    const std::size_t from = static_cast<std::size_t>(std::find(path.begin(), path.end(), again) - path.begin());
    for (std::size_t i = from; i < path.size(); ++i) {
      const int rank = plan.ops[static_cast<std::size_t>(path[i])].rank;
      if (w.cycle.empty() || w.cycle.back() != rank) w.cycle.push_back(rank);
    }
    if (w.cycle.size() > 1 && w.cycle.front() == w.cycle.back()) w.cycle.pop_back();
  };
  for (;;) {
    path.push_back(op);
    const int head = run.head_of(op);
    if (head != op) {
      w.words += ", behind " + op_words(head);
      w.behind.emplace_back(op, head);
      if (std::find(path.begin(), path.end(), head) != path.end()) {
        close(head);
        break;
      }
      op = head;
      path.push_back(op);
    }
    const int m = plan.ops[static_cast<std::size_t>(op)].match;
    const CommsOp& mo = plan.ops[static_cast<std::size_t>(m)];
    w.words += ", which waits for " + op_words(m);
    if (!mo.posted) {
      w.unposted = m;
      w.rank = mo.rank;
      break;
    }
    if (std::find(path.begin(), path.end(), m) != path.end()) {
      close(m);
      break;
    }
    op = m;  // posted, but held up in its own queue
  }
  return w;
}

/// The one-line report of a hang: each blocked rank on the cycle of waits, what
/// it waits for, and the cycle.
inline std::string hang_report(const CommsProgram& c, const CommsPlan& plan, const CommsRun& run, CommOrder order) {
  const int P = static_cast<int>(c.rows.size());
  std::vector<WaitChain> chains(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    if (!run.at_end(r)) chains[static_cast<std::size_t>(r)] = follow_wait(c, plan, run, r);
  std::string out = "hangs under " + std::string(comm_order_row(order).name) + " semantics (" +
                    std::string(comm_order_row(order).words) + "): ";
  auto cycle_words = [](const std::vector<int>& ranks) {
    std::string t = "; cycle of waits: ";
    for (const int r : ranks) t += "rank " + std::to_string(r) + " -> ";
    return t + "rank " + std::to_string(ranks.front());
  };
  // From the first blocked rank, follow whom each waits on until a rank repeats or a cycle of ops closes.
  int r = 0;
  while (run.at_end(r)) ++r;
  std::vector<int> at(static_cast<std::size_t>(P), -1), path;
  while (at[static_cast<std::size_t>(r)] < 0) {
    const WaitChain& w = chains[static_cast<std::size_t>(r)];
    at[static_cast<std::size_t>(r)] = static_cast<int>(path.size());
    path.push_back(r);
    if (!w.cycle.empty()) {
      std::string words;
      for (const int q : path) words += (words.empty() ? "" : "; ") + chains[static_cast<std::size_t>(q)].words;
      return out + words + cycle_words(w.cycle);
    }
    if (w.rank < 0 || run.at_end(w.rank)) break;
    r = w.rank;
  }
  const std::size_t from = static_cast<std::size_t>(std::max(0, at[static_cast<std::size_t>(r)]));
  std::string words;
  for (std::size_t i = from; i < path.size(); ++i)
    words += (words.empty() ? "" : "; ") + chains[static_cast<std::size_t>(path[i])].words;
  return out + words + cycle_words(std::vector<int>(path.begin() + static_cast<std::ptrdiff_t>(from), path.end()));
}

}  // namespace detail

/// Proves that the rows cannot hang under `order`: each row's own rules (as
/// PyTorch's runtime checks them: a compute after the receive of its input, a
/// send after the compute that makes it, one wait per send), the matching of
/// every send with the receive its pair of ranks pairs it with, a run to the
/// end under the semantics, and the program's own proof (every action once,
/// after the actions it needs). Otherwise names the first problem: its rank,
/// its field, and for a hang each blocked rank's wait and the cycle of waits.
inline CommsVerdict prove_comms(const CommsProgram& c, CommOrder order) {
  if (c.rows.size() != c.program.devices.size())
    return {false, -1, -1, "compute_comms: " + std::to_string(c.rows.size()) + " rows for " +
                               std::to_string(c.program.devices.size()) + " devices"};
  detail::CommsPlan plan;
  if (CommsVerdict v = detail::plan_comms(c, plan); !v) return v;
  detail::CommsRun run(c, plan, order);
  if (!run.run()) {
    int r = 0;
    while (run.at_end(r)) ++r;
    return {false, r, run.pc(r), detail::hang_report(c, plan, run, order)};
  }
  if (const VerifyResult v = detail::verify_actions(c.program); !v)
    return {false, v.device, -1, "the compute order: " + v.what()};
  return {};
}


/// Where with_comms() posts each receive within what its pair's order allows.
/// Early by default: in PyTorch 2.15's runtime over gloo, with stages that
/// sleep their cost (bench/vs_pytorch_runtime.py, P 4, M 8), early receives
/// make every kind's step 0.88-1.00 of PyTorch's own class, late ones 1.00-1.10
/// (docs/logs/pytorch_comms.md): a transfer starts when its receive is posted,
/// so a late one puts it on the critical path; the pair's one order, not
/// lateness, is what keeps the rows from hanging.
enum class ReceivePlacement : unsigned char {
  kEarly,  ///< as early: just after its rank's previous send in the pair's order (or at the row's start)
  kLate,   ///< as late: just before the step that reads it, where it can
};

/// The program with its communication placed for PyTorch's runtime, proved
/// under the in-order per pair and the asynchronous semantics:
/// - each send right after the step that makes its tensor (an overlapped
///   pair's sends after the pair, its forward's first);
/// - the messages between a pair of ranks in one order on both sides (a pair
///   completes its sends and receives in the order posted): the order in which
///   the program's dataflow run (simulate(), ReplayMode::kDataflow, the default
///   costs) makes them, the lower rank's first at equal times;
/// - each receive as early as that order allows (ReceivePlacement::kEarly):
///   just after its rank's previous send to its sender in the pair's order, no
///   earlier than its previous receive from it; or as late (kLate): just
///   before the step that reads it, and before the rank's next send to its
///   sender and its next receive from it in the pair's order;
/// - each WAIT_SEND_F after the backward of its stage and micro-batch (which
///   frees the activation), every other wait at the end of its row, in the
///   order of the sends; a WAIT_REDUCE_GRAD right after its REDUCE_GRAD;
/// - a REDUCE_GRAD per stage where the program has none (with_grad_reduce(),
///   after the stage's last backward, where PyTorch puts it): PyTorch's runtime
///   scales each stage's gradients by 1 / M there, or reduces them under FSDP;
///   the result's program is then the program with them.
/// Throws pipeweave::Error for a program that does not verify, or that has an
/// action PyTorch has not (a recomputation, an offload).
inline CommsProgram with_comms(const Program& program, ReceivePlacement receives = ReceivePlacement::kEarly) {
  detail::require_correct(program, "with_comms");
  const Program p = has_grad_reduce(program) ? program : with_grad_reduce(program);
  const ScheduleShape& s = p.shape;
  const int P = static_cast<int>(p.devices.size());
  const int send_f = detail::comm_row_named("SEND_F"), send_b = detail::comm_row_named("SEND_B");
  const int wait_f = detail::comm_row_named("WAIT_SEND_F"), wait_b = detail::comm_row_named("WAIT_SEND_B");
  const int recv_f = detail::comm_row_named("RECV_F"), recv_b = detail::comm_row_named("RECV_B");
  const int wait_reduce = detail::comm_row_named("WAIT_REDUCE_GRAD");
  const Trace run = simulate(p, CostModel{}.with_replay(ReplayMode::kDataflow));
  // A message between two ranks: its tensor, when its step ends in the dataflow run, where it is sent and read.
  struct Message {
    TensorId tensor;
    double time;
    int from, to;
    int send_at;  // base position of its send on `from`
    int read_at;  // base position of the step that reads it on `to`
    int position = 0;  // its receive: before this base position of `to`
  };
  std::vector<Message> messages;
  std::vector<int> read_at(static_cast<std::size_t>(2 * s.action_count()), -1);  // [tensor]: the step reading it
  // The rows without their receives: the steps, their sends and the waits.
  std::vector<std::vector<CommsEntry>> base(p.devices.size());
  std::vector<char> forward_sent(static_cast<std::size_t>(s.action_count()), 0);  // [forward]: sent, not waited for
  for (int r = 0; r < P; ++r) {
    const auto& row = p.devices[static_cast<std::size_t>(r)];
    const auto& events = run.compute[static_cast<std::size_t>(r)];
    auto& out = base[static_cast<std::size_t>(r)];
    std::vector<CommsEntry> tail;  // the waits for the sends that no later backward frees
    std::vector<std::pair<int, int>> forwards;  // (stage, micro-batch) of each forward sent, in order
    std::size_t event = 0;  // the dataflow run's events: the program's compute actions, in order
    for (std::size_t k = 0; k < row.size();) {
      const std::size_t n = row[k].overlaps_next && k + 1 < row.size() ? 2 : 1;
      const Action& first = row[k];
      (void)pytorch_action(s, r, first);  // refuses an action PyTorch has not, in its words
      const int stage = s.stage_of(r, first.chunk);
      out.push_back({-1, stage, first.phase == Phase::kReduce ? 0 : first.micro_batch, static_cast<int>(k),
                     static_cast<int>(n)});
      if (first.phase == Phase::kReduce) {
        out.push_back({wait_reduce, stage, 0});
        k += n;
        continue;
      }
      const int step = static_cast<int>(out.size()) - 1;
      double end = 0;
      for (std::size_t h = 0; h < n; ++h) end = std::max(end, events[event++].end);
      for (std::size_t h = 0; h < n; ++h) {
        const Transfer in = input_of(s, r, row[k + h]);
        if (in.exists && s.device_of_stage(in.stage) != r) read_at[static_cast<std::size_t>(tensor_index(s, in.tensor))] = step;
      }
      for (std::size_t h = 0; h < n; ++h) {
        const Action& a = row[k + h];
        const int st = s.stage_of(r, a.chunk);
        const Transfer o = output_of(s, r, a);
        if (o.exists && s.device_of_stage(o.stage) != r) {
          const bool forward = o.tensor.kind == TensorKind::kActivation;
          messages.push_back({o.tensor, end, r, s.device_of_stage(o.stage), static_cast<int>(out.size()), -1});
          out.push_back({forward ? send_f : send_b, st, a.micro_batch});
          if (forward) {
            forward_sent[static_cast<std::size_t>(s.action_index(Phase::kForward, st, a.micro_batch))] = 1;
            forwards.emplace_back(st, a.micro_batch);
          } else {
            tail.push_back({wait_b, st, a.micro_batch});
          }
        }
        char& sent = forward_sent[static_cast<std::size_t>(s.action_index(Phase::kForward, st, a.micro_batch))];
        if (makes_input_gradient(a.phase) && sent) {
          out.push_back({wait_f, st, a.micro_batch});
          sent = 0;
        }
      }
      k += n;
    }
    for (const auto& [st, m] : forwards) {  // forwards sent whose backward is not in this row
      char& sent = forward_sent[static_cast<std::size_t>(s.action_index(Phase::kForward, st, m))];
      if (sent) tail.push_back({wait_f, st, m});
      sent = 0;
    }
    out.insert(out.end(), tail.begin(), tail.end());
  }
  for (Message& m : messages) m.read_at = read_at[static_cast<std::size_t>(tensor_index(s, m.tensor))];
  // Each pair's messages in one order; each receive as early, or as late, as that order allows.
  std::vector<std::vector<int>> pair(static_cast<std::size_t>(P) * P);  // [lower * P + higher]
  for (int x = 0; x < static_cast<int>(messages.size()); ++x) {
    const Message& m = messages[static_cast<std::size_t>(x)];
    pair[static_cast<std::size_t>(std::min(m.from, m.to) * P + std::max(m.from, m.to))].push_back(x);
  }
  for (auto& list : pair) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      const Message& x = messages[static_cast<std::size_t>(a)];
      const Message& y = messages[static_cast<std::size_t>(b)];
      if (x.time != y.time) return x.time < y.time;
      return x.from != y.from ? x.from < y.from : x.send_at < y.send_at;
    });
    if (receives == ReceivePlacement::kLate) {
      // For each side of the pair: the base position of its next send, and of its next receive, below.
      int next_send[2] = {1 << 30, 1 << 30}, next_recv[2] = {1 << 30, 1 << 30};
      for (std::size_t i = list.size(); i-- > 0;) {
        Message& m = messages[static_cast<std::size_t>(list[i])];
        const int sender = m.from < m.to ? 0 : 1, receiver = 1 - sender;
        m.position = std::min({m.read_at, next_send[receiver], next_recv[receiver]});
        next_recv[receiver] = m.position;
        next_send[sender] = m.send_at;
      }
    } else {
      // For each side: just after its previous send in the pair's order, and no earlier than its previous receive.
      int after_send[2] = {0, 0}, last_recv[2] = {0, 0};
      for (const int x : list) {
        Message& m = messages[static_cast<std::size_t>(x)];
        const int sender = m.from < m.to ? 0 : 1, receiver = 1 - sender;
        m.position = std::max(after_send[receiver], last_recv[receiver]);
        last_recv[receiver] = m.position;
        after_send[sender] = m.send_at + 1;
      }
    }
  }
  // The rows: each rank's receives before their positions, in the order of their pairs.
  std::vector<std::vector<int>> recvs(p.devices.size());
  for (const auto& list : pair)
    for (const int x : list) recvs[static_cast<std::size_t>(messages[static_cast<std::size_t>(x)].to)].push_back(x);
  CommsProgram c{p, std::vector<std::vector<CommsEntry>>(p.devices.size())};
  for (int r = 0; r < P; ++r) {
    auto& list = recvs[static_cast<std::size_t>(r)];
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return messages[static_cast<std::size_t>(a)].position < messages[static_cast<std::size_t>(b)].position;
    });
    auto& row = c.rows[static_cast<std::size_t>(r)];
    const auto& steps = base[static_cast<std::size_t>(r)];
    std::size_t next = 0;
    for (int b = 0; b < static_cast<int>(steps.size()); ++b) {
      for (; next < list.size() && messages[static_cast<std::size_t>(list[next])].position == b; ++next) {
        const TensorId& x = messages[static_cast<std::size_t>(list[next])].tensor;
        row.push_back({x.kind == TensorKind::kActivation ? recv_f : recv_b, consumer_stage(x), x.micro_batch});
      }
      row.push_back(steps[static_cast<std::size_t>(b)]);
    }
  }
  for (const CommOrder order : {CommOrder::kInOrderPerPair, CommOrder::kAsyncSends})
    if (const CommsVerdict v = prove_comms(c, order); !v) throw Error("with_comms: the placement does not prove: " + v.what());
  return c;
}

}  // namespace pipeweave
