// PyTorch-format CSV: export, import, round trips, error messages with line and
// column, and random or truncated input that must end in a program or an Error.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/grad_reduce.hpp"
#include "pipeweave/schedule/overlap.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;

namespace {

std::string error_of(std::string_view text, const CsvImportOptions& options = {}) {
  try {
    parse_pytorch_csv(text, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("export writes one row per device, stage index first", "[analysis]") {
  const Program p = make_schedule(ScheduleKind::kOneFOneB, 2, 1, 2);
  CHECK(to_pytorch_csv(p) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  const Program q = make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  // Device 1 holds stages 1 and 3.
  CHECK(to_pytorch_csv(q).substr(to_pytorch_csv(q).find('\n') + 1, 8) == "1F0,1F1,");
  CHECK(render_pytorch_csv(simulate(q)) == to_pytorch_csv(q));
}

TEST_CASE("import reads back every generated program", "[analysis]") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B})
    for (int p = 1; p <= 5; ++p)
      for (int v = 1; v <= (kind == ScheduleKind::kInterleaved1F1B ? 3 : 1); ++v)
        for (int m = p; m <= 10; m += p) {
          const Program prog = make_schedule(kind, p, v, m);
          const Program back = parse_pytorch_csv(to_pytorch_csv(prog));
          INFO(schedule_name(kind) << " " << p << " " << v << " " << m);
          CHECK(back.shape == ScheduleShape{ScheduleKind::kCustom, p, v, m});
          CHECK(back.devices == prog.devices);
          CsvImportOptions given;
          given.shape = prog.shape;
          CHECK(parse_pytorch_csv(to_pytorch_csv(prog), given) == prog);
        }
}

TEST_CASE("import takes PyTorch's idle cells, spacing, quoting and communication actions", "[analysis]") {
  const std::string text =
      "\xEF\xBB\xBF"
      "0F0,0F1, 0SEND_F0 ,0F2,,0B0,0RECV_B0,0B1,0B2,0UNSHARD\r\n"
      ",1RECV_F0,\"1F0\",1B0,1F1,1B1,1F2,1B2,1SEND_B2\r\n"
      "\n\n";
  const Program p = parse_pytorch_csv(text);
  CHECK(p.shape == ScheduleShape{ScheduleKind::kCustom, 2, 1, 3});
  CHECK(p.devices[0] == std::vector<Action>{fwd(0, 0), fwd(0, 1), fwd(0, 2), bwd(0, 0), bwd(0, 1), bwd(0, 2)});
  CHECK(p.devices[1] == std::vector<Action>{fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1), fwd(0, 2), bwd(0, 2)});
  CHECK(verify(p));
  CHECK(bubble_ratio(simulate(p)) > 0);
}

TEST_CASE("import errors name the line and the column", "[analysis]") {
  CHECK_THAT(error_of("0F0,0X1\n"), Contains("csv line 1, column 5 ('0X1'): unknown action kind 'X'"));
  CHECK_THAT(error_of("0F0\n1F0,  0I0\n"), Contains("csv line 2, column 5: stage 0 belongs to device 0 (stage = chunk * 2 + "
                                                    "device), but it is in row 2, device 1"));
  CHECK_THAT(error_of("0F0,0F\n"), Contains("line 1, column 5 ('0F'): a compute action needs a micro-batch"));
  CHECK_THAT(error_of("F0\n"), Contains("line 1, column 1 ('F0'): expected a stage index first"));
  CHECK_THAT(error_of("0F0x\n"), Contains("unexpected 'x' after the action"));
  CHECK_THAT(error_of("0\n"), Contains("expected an action kind"));
  CHECK_THAT(error_of("9999999999F0\n"), Contains("stage index too large"));
  CHECK_THAT(error_of("0F99999999\n"), Contains("micro-batch index too large"));
  CHECK_THAT(error_of("0F0,0B0\n0F1\n"), Contains("csv line 2, column 1: stage 0 belongs to device 0"));
  CHECK_THAT(error_of("0F0,\"0B0\n"), Contains("csv line 1, column 5: a quoted field does not end on its line"));
  CHECK_THAT(error_of("\"0F0\" x,0B0\n"), Contains("csv line 1, column 7: unexpected text after a quoted field"));
  CHECK_THAT(error_of("0F0," + std::string(80, '1') + "\n"), Contains("line 1, column 5 ('111111111111111111111111...'): a field longer"));
  const std::string pair_form =
      "an overlapped pair is (<forward>;<backward>)OVERLAP_F_B, a forward F and then a backward B or I of one device "
      "(e.g. (0F6;4B0)OVERLAP_F_B)";
  CHECK_THAT(error_of("0F0,(0B0;0F1)OVERLAP_F_B\n"), Contains("csv line 1, column 5 ('(0B0;0F1)OVERLAP_F_B'): " + pair_form));
  CHECK_THAT(error_of("0F0,(0F1;0W0)OVERLAP_F_B\n"), Contains("column 5 ('(0F1;0W0)OVERLAP_F_B'): " + pair_form));
  CHECK_THAT(error_of("0F0,(0F1;0B0)\n"), Contains("column 5 ('(0F1;0B0)'): " + pair_form));
  CHECK_THAT(error_of("0F0,(0F1)OVERLAP_F_B\n"), Contains("column 5 ('(0F1)OVERLAP_F_B'): " + pair_form));
  CHECK_THAT(error_of("0F0,(0F1;0SEND_B0)OVERLAP_F_B\n"), Contains(pair_form));
  CHECK_THAT(error_of("0F0,(0F1;0X0)OVERLAP_F_B\n"), Contains("column 5 ('0X0'): unknown action kind 'X'"));
  CHECK_THAT(error_of("0F0,0OVERLAP_F_B\n"), Contains("column 5 ('0OVERLAP_F_B'): " + pair_form));
  CHECK_THAT(error_of(""), Contains("csv: no rows"));
  CHECK_THAT(error_of("\n\n,,\n"), Contains("no compute actions (F, B, I or W) in 3 rows"));
  CHECK_THAT(error_of("0F0,0B0,0F500000,0B500000\n"), Contains("needs 1000002; most would be missing"));
  CsvImportOptions few;
  few.max_devices = 2;
  CHECK_THAT(error_of("0F0\n1F0\n2F0\n", few), Contains("csv line 3, column 1: more than 2 rows"));
  few.max_bytes = 4;
  CHECK_THAT(error_of("0F0,0B0\n", few), Contains("8 bytes; at most 4"));
  CsvImportOptions shaped;
  shaped.shape = ScheduleShape{ScheduleKind::kCustom, 1, 1, 2};
  CHECK_THAT(error_of("0F0\n1F0\n", shaped), Contains("2 rows (devices), but the shape has 1 devices"));
  CHECK_THAT(error_of("0F0,0F2\n", shaped), Contains("csv line 1, column 5: micro-batch 2 is past the last of the shape (1)"));
  CHECK_THAT(error_of("1F0\n", shaped), Contains("stage 1 is past the last stage of the shape (0)"));
}

TEST_CASE("import reads split backwards and infers the v placement", "[analysis]") {
  for (ScheduleKind kind : {ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kZeroBubbleV,
                            ScheduleKind::kLoopedBFS})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 9; ++m) {
        const int v = default_chunks(kind);
        if (!shape_error({kind, p, v, m, placement_of(kind)}).empty()) continue;
        const Program prog = make_schedule(kind, p, v, m);
        const Program back = parse_pytorch_csv(to_pytorch_csv(prog));
        INFO(schedule_name(kind) << " " << p << " " << m);
        // With one device (or one chunk) both placements are one; the loop placement is inferred.
        const Placement placement = p == 1 ? Placement::kLoop : prog.shape.placement;
        CHECK(back.shape == ScheduleShape{ScheduleKind::kCustom, p, v, m, placement});
        CHECK(back.devices == prog.devices);
        CHECK(verify(back));
        CsvImportOptions given;
        given.shape = prog.shape;
        CHECK(parse_pytorch_csv(to_pytorch_csv(prog), given) == prog);
      }
  // The worked example: ZB-V with 2 devices, rank 0 holding stages 0 and 3.
  const Program zbv = make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4);
  CHECK(to_pytorch_csv(zbv).substr(0, 36) == "0F0,0F1,0F2,3F0,3I0,3W0,3F1,3I1,3W1,");
  CHECK(zbv.devices[0][3] == fwd(1, 0));  // stage 3 is device 0's chunk 1
}

TEST_CASE("import takes PyTorch's own dumps, bookkeeping actions skipped", "[analysis]") {
  // Written by tools/pytorch_orders.py with PyTorch 2.15: compute only, and with
  // PyTorch's sends, receives, waits, unshards and gradient reductions (REDUCE_GRAD is R).
  const std::string dir = std::string(PIPEWEAVE_TEST_DATA) + "/pytorch/";
  for (const auto& [name, kind, p, m] :
       {std::tuple{"ScheduleZBVZeroBubble_P2_M4", ScheduleKind::kZeroBubbleV, 2, 4},
        std::tuple{"ScheduleInterleavedZeroBubble_P3_M6", ScheduleKind::kZeroBubbleH1, 3, 6},
        std::tuple{"ScheduleDualPipeV_P2_M4", ScheduleKind::kDualPipeV, 2, 4}}) {
    INFO(name);
    const Program want = make_schedule(kind, p, default_chunks(kind), m);
    const Program compute = load_pytorch_csv(dir + name + "_compute.csv");
    const Program comms = load_pytorch_csv(dir + name + "_comms.csv");
    CHECK(compute.shape == ScheduleShape{ScheduleKind::kCustom, p, want.shape.chunks, m, want.shape.placement});
    CHECK(compute.devices == want.devices);
    // PyTorch's REDUCE_GRAD sits where with_grad_reduce() puts R: after each stage's last B or W.
    CHECK(comms == with_grad_reduce(compute));
    CHECK(has_grad_reduce(comms));
    CHECK(verify(comms));
    CHECK(makespan(simulate(comms)) == makespan(simulate(want)));  // a reduction of cost 0 changes nothing
  }
  const Program p = parse_pytorch_csv("0F0,0WAIT_SEND_F0,0I0,0W0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0WAIT_SEND_B0\n");
  CHECK(p.devices[0] == std::vector<Action>{fwd(0, 0), bwd_input(0, 0), bwd_weight(0, 0), reduce_grad(0)});
  CHECK(to_pytorch_csv(p) == "0F0,0I0,0W0,0REDUCE_GRAD\n");
  CHECK_THAT(error_of("0F0,0B0,0REDUCE_GRAD3\n"), Contains("a REDUCE_GRAD has no micro-batch index"));
  CHECK_THAT(error_of("0F0,0WAIT_SEND_F\n"), Contains("column 5 ('0WAIT_SEND_F'): a communication action needs a micro-batch"));
}

TEST_CASE("import names a stage that no placement puts in its row", "[analysis]") {
  // P = 3, V = 2: loop puts stage 3 on device 0, v on device 2; row 2 is device 1.
  CHECK_THAT(error_of("0F0\n1F0,3F0\n2F0\n"),
             Contains("csv line 2, column 5: stage 3 belongs to device 0 in the loop placement (stage = chunk * 3 + "
                      "device) and to device 2 in the v placement, but it is in row 2, device 1"));
  // Row 1 holds stage 5, which only the v placement puts on device 0; stage 3 in row 1 then breaks it.
  CHECK_THAT(error_of("0F0,3F0,5F0\n1F0,4F0\n2F0\n"),
             Contains("csv line 1, column 5: stage 3 is in row 1, device 0, but the v placement, which stage 5 at line 1, "
                      "column 9 needs, puts it on device 2: the rows mix the loop and v placements"));
  CsvImportOptions v;
  v.shape = ScheduleShape{ScheduleKind::kCustom, 3, 2, 1, Placement::kV};
  CHECK_THAT(error_of("0F0,3F0\n1F0,4F0\n2F0,5F0\n", v),
             Contains("csv line 1, column 5: stage 3 belongs to device 2 (v placement), but it is in row 1, device 0"));
}

TEST_CASE("random and truncated input ends in a program or an Error", "[analysis]") {
  const std::string valid = to_pytorch_csv(make_schedule(ScheduleKind::kInterleaved1F1B, 3, 2, 6));
  std::vector<std::string> inputs;
  for (std::size_t n = 0; n <= valid.size(); ++n) inputs.push_back(valid.substr(0, n));
  std::mt19937 rng(20240611);
  const std::string alphabet = "0123456789FBIWSEND_RCVUHAFOL,\"\r\n \t(;)\xff";
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const std::size_t len = rng() % 64;
    for (std::size_t k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    inputs.push_back(s);
    // A valid file with a few bytes changed.
    std::string mutated = valid;
    for (int k = 0; k < 3; ++k) mutated[rng() % mutated.size()] = alphabet[rng() % alphabet.size()];
    inputs.push_back(mutated);
  }
  std::size_t parsed = 0, verified = 0;
  for (const std::string& s : inputs) {
    try {
      const Program p = parse_pytorch_csv(s);
      ++parsed;
      if (verify(p)) {
        ++verified;
        CHECK(makespan(simulate(p)) > 0);
      } else {
        CHECK_THROWS_AS(simulate(p), Error);
      }
    } catch (const Error&) {
      // expected for most inputs
    }
  }
  CHECK(parsed > 0);
  CHECK(verified > 0);
}

TEST_CASE("load_pytorch_csv reads a file and names it in errors", "[analysis]") {
  const std::string path = "pipeweave_test_import.csv";
  {
    std::ofstream out(path);
    out << "0F0,0B0\n";
  }
  CHECK(load_pytorch_csv(path).devices == std::vector<std::vector<Action>>{{fwd(0, 0), bwd(0, 0)}});
  {
    std::ofstream out(path);
    out << "0F0,0Q0\n";
  }
  CHECK_THROWS_WITH(load_pytorch_csv(path), Contains("pipeweave_test_import.csv: csv line 1, column 5"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(load_pytorch_csv(path), Contains("cannot open 'pipeweave_test_import.csv'"));
}

TEST_CASE("a file of 4,096 rows imports, verifies and simulates", "[analysis]") {
  const Program p = make_schedule(ScheduleKind::kGPipe, 4096, 1, 2);
  const Program back = parse_pytorch_csv(to_pytorch_csv(p));
  CHECK(back.shape == ScheduleShape{ScheduleKind::kCustom, 4096, 1, 2});
  CHECK(back.devices == p.devices);
  CHECK(verify(back));
  CHECK(makespan(simulate(back)) == (2 + 4096 - 1) * 3);
}

TEST_CASE("overlapped pairs export and import as PyTorch's OVERLAP_F_B", "[analysis]") {
  const Program p = parse_pytorch_csv("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n");
  CHECK(p.devices[0] == std::vector<Action>{fwd(0, 0), fwd(0, 1).paired(), bwd(0, 0), bwd(0, 1)});
  CHECK(to_pytorch_csv(p) == "0F0,(0F1;0B0)OVERLAP_F_B,0B1\n");
  CHECK(parse_pytorch_csv("0F0, \"(0F1;0I0)OVERLAP_F_B\" ,0W0,0I1,0W1\n").devices[0][1] == fwd(0, 1).paired());
  for (const Program& q : {overlap(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8)),
                           make_schedule(ScheduleKind::kDualPipeV, 3, 2, 7)}) {
    const Program back = parse_pytorch_csv(to_pytorch_csv(q));
    CHECK(back.devices == q.devices);
    CHECK(render_pytorch_csv(simulate(q)) == to_pytorch_csv(q));
  }
}
