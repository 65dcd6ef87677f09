// PyTorch's compute_comms rows: pipeweave's placement of the sends, receives and
// waits (with_comms), the import that keeps them, and the proof that rows cannot
// hang under each semantics of point-to-point operations, or the named hang.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "pipeweave/analysis/comms.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/recompute.hpp"

using namespace pipeweave;

namespace {

constexpr CommOrder kOrders[] = {CommOrder::kAsyncSends, CommOrder::kInOrderPerPair, CommOrder::kInOrderPerRank};

std::string verdict(std::string_view csv, CommOrder order) { return prove_comms(parse_pytorch_comms(csv), order).what(); }

std::string error_of(std::string_view csv) {
  try {
    parse_pytorch_comms(csv);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The hang of a pair of ranks whose sends cross: each posts a send before the receive the other's send needs.
constexpr std::string_view kCrossedSends =
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1\n"
    "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n";

// Where each receive of a placement stands, by its rule. Late: the first field after its block of receives is the
// step that reads it or a send to its sender, or a later receive of the block comes from its sender (the pair's order
// holds it there). Early: the field before its block is a send to its sender, or the block opens the row, or an
// earlier receive of the block comes from its sender.
void check_receives(const CommsProgram& c, bool late) {
  const ScheduleShape& s = c.program.shape;
  auto peer_of = [&](const CommsEntry& e) {
    const TensorId x{kCommRows[e.comm].tensor, e.stage + kCommRows[e.comm].producer_offset, e.micro_batch};
    return s.device_of_stage(kCommRows[e.comm].role == CommRole::kRecv ? x.stage : consumer_stage(x));
  };
  auto is = [&](const CommsEntry& e, CommRole role) { return e.comm >= 0 && kCommRows[e.comm].role == role; };
  for (int r = 0; r < static_cast<int>(c.rows.size()); ++r) {
    const auto& row = c.rows[static_cast<std::size_t>(r)];
    const auto& actions = c.program.devices[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < row.size(); ++k) {
      const CommsEntry& e = row[k];
      if (!is(e, CommRole::kRecv)) continue;
      const int peer = peer_of(e);
      if (late) {
        std::size_t j = k + 1;
        bool held = false;
        for (; j < row.size() && is(row[j], CommRole::kRecv); ++j) held = held || peer_of(row[j]) == peer;
        REQUIRE(j < row.size());
        const CommsEntry& b = row[j];
        bool reads = false;
        for (int h = 0; b.comm < 0 && h < b.actions; ++h) {
          const Transfer in = input_of(s, r, actions[static_cast<std::size_t>(b.action + h)]);
          reads = reads || (in.exists && in.tensor.kind == kCommRows[e.comm].tensor &&
                            in.tensor.stage == e.stage + kCommRows[e.comm].producer_offset &&
                            in.tensor.micro_batch == e.micro_batch);
        }
        CHECK((reads || (is(b, CommRole::kSend) && peer_of(b) == peer) || held));
      } else {
        std::size_t j = k;
        bool held = false;
        for (; j > 0 && is(row[j - 1], CommRole::kRecv); --j) held = held || peer_of(row[j - 1]) == peer;
        CHECK((j == 0 || (is(row[j - 1], CommRole::kSend) && peer_of(row[j - 1]) == peer) || held));
      }
    }
  }
}

}  // namespace

TEST_CASE("with_comms places 1F1B's sends after their steps and each receive as early, or as late, as the pair's "
          "order allows",
          "[comms]") {
  CHECK(to_pytorch_comms_csv(with_comms(make_schedule("1f1b", 2, 1, 4))) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0F2,0SEND_F2,0RECV_B1,0B1,0WAIT_SEND_F1,0F3,0SEND_F3,"
        "0RECV_B2,0RECV_B3,0B2,0WAIT_SEND_F2,0B3,0WAIT_SEND_F3,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
        "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1RECV_F2,1F1,1B1,1SEND_B1,1RECV_F3,1F2,1B2,1SEND_B2,1F3,1B3,1SEND_B3,"
        "1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_SEND_B1,1WAIT_SEND_B2,1WAIT_SEND_B3\n");
  const CommsProgram c = with_comms(make_schedule("1f1b", 2, 1, 4), ReceivePlacement::kLate);
  CHECK(to_pytorch_comms_csv(c) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0F2,0SEND_F2,0RECV_B1,0B1,0WAIT_SEND_F1,0F3,0SEND_F3,"
        "0RECV_B2,0B2,0WAIT_SEND_F2,0RECV_B3,0B3,0WAIT_SEND_F3,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
        // rank 1 receives activation 1 before it sends gradient 0: rank 0 sent it first, and a pair of ranks
        // completes its sends and receives in one order
        "1RECV_F0,1F0,1B0,1RECV_F1,1SEND_B0,1F1,1B1,1RECV_F2,1SEND_B1,1F2,1B2,1RECV_F3,1SEND_B2,1F3,1B3,1SEND_B3,"
        "1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0,1WAIT_SEND_B1,1WAIT_SEND_B2,1WAIT_SEND_B3\n");
  // PyTorch's runtime scales each stage's gradients at its REDUCE_GRAD: every row has one per stage.
  CHECK(c.program == with_grad_reduce(make_schedule("1f1b", 2, 1, 4)));
  for (const CommOrder order : kOrders) CHECK(prove_comms(c, order));
  CHECK(parse_pytorch_comms(to_pytorch_comms_csv(c)).rows == c.rows);
}

TEST_CASE("every kind's placement proves under the pair and asynchronous semantics, every receive where its rule says",
          "[comms]") {
  int shapes = 0, rank_order[2] = {0, 0};
  for (const ScheduleKind kind : generated_kinds()) {
    for (int P = 1; P <= 5; ++P) {
      for (int V = 1; V <= 3; ++V) {
        for (int M = 1; M <= 10; ++M) {
          Program base;
          try {
            base = make_schedule(kind, P, V, M);
          } catch (const Error&) {
            continue;
          }
          for (const int variant : {0, 1, 2}) {
            const Program p = variant == 0 ? base : variant == 1 ? overlap(base) : with_grad_reduce(base);
            for (const ReceivePlacement receives : {ReceivePlacement::kLate, ReceivePlacement::kEarly}) {
              const bool late = receives == ReceivePlacement::kLate;
              INFO(schedule_name(kind) << " P=" << P << " V=" << V << " M=" << M << " variant " << variant
                                       << (late ? " late" : " early"));
              const CommsProgram c = with_comms(p, receives);  // throws unless it proves under pair and async
              REQUIRE(c.program == (variant == 2 ? p : with_grad_reduce(p)));
              CHECK(prove_comms(c, CommOrder::kInOrderPerPair));
              CHECK(prove_comms(c, CommOrder::kAsyncSends));
              rank_order[late ? 0 : 1] += prove_comms(c, CommOrder::kInOrderPerRank) ? 1 : 0;
              const CommsProgram back = parse_pytorch_comms(to_pytorch_comms_csv(c));
              CHECK(back.rows == c.rows);
              CHECK(back.program.devices == c.program.devices);
              check_receives(c, late);
              shapes += late ? 1 : 0;
            }
          }
        }
      }
    }
  }
  CHECK(shapes > 900);
  // The stricter one-stream-per-rank order holds for most, not all.
  CHECK(rank_order[0] > shapes / 2);
  CHECK(rank_order[1] > shapes / 2);
}

TEST_CASE("PyTorch 2.15's own compute_comms dumps are proved not to hang", "[comms]") {
  for (const char* name : {"ScheduleDualPipeV_P2_M4", "ScheduleInterleavedZeroBubble_P3_M6", "ScheduleZBVZeroBubble_P2_M4",
                           "ScheduleInterleaved1F1B_P4_M8", "ScheduleLoopedBFS_P2_M4"}) {
    INFO(name);
    const CommsProgram c = load_pytorch_comms(std::string(PIPEWEAVE_TEST_DATA) + "/pytorch/" + name + "_comms.csv");
    for (const CommOrder order : kOrders) CHECK(prove_comms(c, order).what() == "ok");
    // Their compute is the compute_only dump's, but for the reductions PyTorch adds with its communication.
    const Program compute = load_pytorch_csv(std::string(PIPEWEAVE_TEST_DATA) + "/pytorch/" + name + "_compute.csv");
    CHECK(count_actions(c.program, Phase::kForward) == count_actions(compute, Phase::kForward));
  }
}

TEST_CASE("the placements that PyTorch 2.15's runtime ran, bit for bit like its own classes, are with_comms' own",
          "[comms]") {
  // tests/data/pytorch/exports/README.md: how they were written and run.
  const std::vector<std::tuple<std::string, int, int, int>> shapes = {
      {"gpipe", 4, 1, 8}, {"1f1b", 4, 1, 8},        {"interleaved", 4, 2, 8}, {"looped-bfs", 2, 2, 4},
      {"zb-h1", 4, 1, 8}, {"interleaved-zb", 3, 2, 6}, {"zb-v", 2, 2, 4},        {"dualpipe-v", 2, 2, 8}};
  for (const auto& [kind, P, V, M] : shapes) {
    const std::string name = kind + "_P" + std::to_string(P) + "_V" + std::to_string(V) + "_M" + std::to_string(M);
    INFO(name);
    std::ifstream in(std::string(PIPEWEAVE_TEST_DATA) + "/pytorch/exports/" + name + ".csv");
    REQUIRE(in);
    std::ostringstream text;
    text << in.rdbuf();
    CHECK(to_pytorch_comms_csv(with_comms(make_schedule(kind, P, V, M))) == text.str());
  }
}

TEST_CASE("a hang is named: the rank, the action, what it waits for, and the cycle of waits", "[comms]") {
  CHECK(verdict(kCrossedSends, CommOrder::kAsyncSends) == "ok");
  const CommsVerdict v = prove_comms(parse_pytorch_comms(kCrossedSends), CommOrder::kInOrderPerPair);
  CHECK(!v);
  CHECK(v.rank == 0);
  CHECK(v.index == 5);
  CHECK(v.what() ==
        "hangs under pair semantics (in order per pair of ranks (NCCL-like): a rank's sends and receives with one "
        "peer complete in the order posted, a send when its receive is reached): rank 0 at action 5 (0B0) waits for "
        "0RECV_B0 (rank 0, action 4), behind 0SEND_F1 (rank 0, action 3), which waits for 1RECV_F1 (rank 1, action "
        "4), behind 1SEND_B0 (rank 1, action 3), which waits for 0RECV_B0 (rank 0, action 4); cycle of waits: rank 0 "
        "-> rank 1 -> rank 0");
  // A compute order whose waits close a cycle hangs under every semantics.
  const std::string_view cycle =
      "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0F1,0SEND_F1,0RECV_B1,0B1,0WAIT_SEND_F1\n"
      "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n";
  for (const CommOrder order : kOrders) {
    const std::string what = verdict(cycle, order);
    CHECK_THAT(what, Catch::Matchers::Contains(
                         "rank 0 at action 3 (0B0) waits for 0RECV_B0 (rank 0, action 2), which waits for 1SEND_B0 "
                         "(rank 1, action 5); rank 1 at action 3 (1F1) waits for 1RECV_F1 (rank 1, action 2), which "
                         "waits for 0SEND_F1 (rank 0, action 6); cycle of waits: rank 0 -> rank 1 -> rank 0"));
    CHECK_THAT(what, Catch::Matchers::StartsWith("hangs under " + std::string(comm_order_row(order).name) + " semantics"));
  }
}

TEST_CASE("each row's own rules are PyTorch runtime's, named at the field", "[comms]") {
  const std::string good1 = "1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n";
  CHECK(verdict("0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n" + good1, CommOrder::kInOrderPerPair) == "ok");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
       "rank 1, action 0 (1F0): computes before receiving its input: no RECV_F of it earlier in the row (PyTorch's "
       "runtime refuses to run it)"},
      {"0SEND_F0,0F0,0RECV_B0,0B0,0WAIT_SEND_F0\n" + good1,
       "rank 0, action 0 (0SEND_F0): sends a tensor before the action that makes it (PyTorch's runtime has nothing "
       "to send)"},
      {"0F0,0SEND_F0,0RECV_B0,0B0\n" + good1,
       "rank 0, action 1 (0SEND_F0): a send that no WAIT_SEND in the row waits for (PyTorch refuses the row)"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0WAIT_SEND_F0\n" + good1,
       "rank 0, action 5 (0WAIT_SEND_F0): waits for a send that is not pending (none earlier in the row, or already "
       "waited for)"},
      {"0F0,0SEND_F0,0RECV_B0,0RECV_B0,0B0,0WAIT_SEND_F0\n" + good1,
       "rank 0, action 3 (0RECV_B0): receives a tensor again before a compute has read the first receive"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1SEND_F0\n",
       "rank 1, action 5 (1SEND_F0): a send of an activation of a stage at the end of the model, which has no "
       "neighbour there"},
      {"0F0,0SEND_F0,1F0,1B0,0B0,0WAIT_SEND_F0\n",
       "rank 0, action 1 (0SEND_F0): a send of an activation between stages 0 and 1, which are both on this rank: "
       "they hand over without a message"},
      {"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0WAIT_SEND_F0,0WAIT_SEND_F1\n"
       "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n",
       "rank 1, action 0 (1RECV_F1): receive 0 from rank 0 is matched with its send 0 to this rank, rank 0, action 1 "
       "(0SEND_F0), a different tensor (a pair of ranks matches its sends and receives in the order posted)"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1WAIT_SEND_B0\n",
       "rank 1, action 3 (1WAIT_SEND_B0): waits for a send that is not pending (none earlier in the row, or already "
       "waited for)"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD\n" + good1,
       "rank 0: stage 0's REDUCE_GRAD has no WAIT_REDUCE_GRAD after it"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0WAIT_REDUCE_GRAD\n" + good1,
       "rank 0, action 5 (0WAIT_REDUCE_GRAD): waits for a gradient reduction that was not started"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1SEND_B0,1B0,1WAIT_SEND_B0\n",
       "rank 1, action 2 (1SEND_B0): sends a tensor before the action that makes it (PyTorch's runtime has nothing "
       "to send)"},
      {"0F0,0SEND_F0,0RECV_B0,0I0,0WAIT_SEND_F0\n1RECV_F0,1F0,1I0,1SEND_B0,1W0,1WAIT_SEND_B0\n",
       "the compute order: device 0: W0.0 (stage 0, micro-batch 0) is missing"},
  };
  for (const auto& [csv, message] : cases) {
    INFO(csv);
    CHECK(verdict(csv, CommOrder::kInOrderPerPair) == message);
  }
}

TEST_CASE("the import keeps the communication as written and refuses what it does not know by name", "[comms]") {
  const CommsProgram c =
      parse_pytorch_comms("0UNSHARD,0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0WAIT_SEND_F0,0WAIT_REDUCE_GRAD,0RESHARD\n"
                          "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0\n");
  REQUIRE(c.rows.size() == 2);
  CHECK(c.rows[0].size() == 9);
  CHECK(c.rows[1][4] == CommsEntry{-1, 1, 0, 2, 1});  // REDUCE_GRAD: the program's third action on rank 1
  CHECK(c.program.devices[1].size() == 3);
  CHECK(prove_comms(c, CommOrder::kInOrderPerRank));
  CHECK(parse_pytorch_csv(to_pytorch_comms_csv(c)) == c.program);
  CHECK(error_of("0F0,0SEND_X0\n") ==
        "csv line 1, column 5 ('0SEND_X0'): unknown action kind 'SEND_X'; an action is <stage><kind><micro-batch> with "
        "kind F, B, I or W (e.g. 0F0, 5B3, 5I3), or <stage>REDUCE_GRAD, or a communication action: "
        "<stage>SEND_F<micro-batch>, <stage>RECV_F<micro-batch>, <stage>SEND_B<micro-batch>, "
        "<stage>RECV_B<micro-batch>, <stage>WAIT_SEND_F<micro-batch>, <stage>WAIT_SEND_B<micro-batch>, "
        "<stage>WAIT_REDUCE_GRAD, <stage>UNSHARD, <stage>RESHARD");
  CHECK(error_of("0UNSHARD3,0F0\n") == "csv line 1, column 1 ('0UNSHARD3'): a UNSHARD has no micro-batch index (e.g. 3UNSHARD)");
  CHECK(error_of("0SEND_F,0F0\n") == "csv line 1, column 1 ('0SEND_F'): a communication action needs a micro-batch index");
  CHECK(error_of("(0F0;0SEND_F0)OVERLAP_F_B\n") ==
        "csv line 1, column 1 ('(0F0;0SEND_F0)OVERLAP_F_...'): an overlapped pair is (<forward>;<backward>)OVERLAP_F_B, "
        "a forward F and then a backward B or I of one device (e.g. (0F6;4B0)OVERLAP_F_B)");
  CHECK_THROWS_WITH(with_comms(parse_pytorch_csv("0F0,0B0\n1B0,1F0\n")),
                    "with_comms: the program is not correct: device 1, step 0: B0.0 (stage 1, micro-batch 0) runs "
                    "before F0.0 (step 1), whose result it needs");
  CHECK_THROWS_WITH(with_comms(with_recompute(make_schedule("1f1b", 2, 1, 2), {0})),
                    Catch::Matchers::Contains("which PyTorch's schedules and CSV do not have"));
}
