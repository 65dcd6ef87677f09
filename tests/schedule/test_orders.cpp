// Orders of the generators: the worked example, exact small cases, and
// properties over a grid of shapes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/schedules.hpp"
#include "pipeweave/schedule/verify.hpp"

using namespace pipeweave;

namespace {

std::string line_of(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

}  // namespace

TEST_CASE("interleaved 1F1B matches the worked example for P=4, V=2, M=8", "[schedule]") {
  const std::vector<std::string> expected = {
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 F0.6 B1.0 F0.7 B1.1 F1.4 B1.2 F1.5 B1.3 F1.6 B0.0 F1.7 B0.1 "
      "B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 B1.0 F0.5 B1.1 F0.6 B1.2 F0.7 B1.3 F1.4 B0.0 F1.5 B0.1 F1.6 B0.2 "
      "F1.7 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 F0.4 B1.2 F0.5 B1.3 F0.6 B0.0 F0.7 B0.1 F1.4 B0.2 F1.5 B0.3 "
      "F1.6 B1.4 F1.7 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 F0.4 B0.0 F0.5 B0.1 F0.6 B0.2 F0.7 B0.3 F1.4 B1.4 "
      "F1.5 B1.5 F1.6 B1.6 F1.7 B1.7 B0.4 B0.5 B0.6 B0.7",
  };
  const Program run_time = make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  REQUIRE(run_time.devices.size() == 4);
  using S = Interleaved1F1B<4, 2, 8>;
  for (int d = 0; d < 4; ++d) {
    CHECK(line_of(run_time.devices[static_cast<std::size_t>(d)]) == expected[static_cast<std::size_t>(d)]);
    const auto& ct = S::actions[static_cast<std::size_t>(d)];
    CHECK(line_of(std::vector<Action>(ct.begin(), ct.end())) == expected[static_cast<std::size_t>(d)]);
  }
  CHECK(S::program() == run_time);
}

TEST_CASE("1F1B and GPipe orders on small shapes", "[schedule]") {
  const Program one = make_schedule(ScheduleKind::kOneFOneB, 3, 1, 4);
  CHECK(line_of(one.devices[0]) == "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3");
  CHECK(line_of(one.devices[1]) == "F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3");
  CHECK(line_of(one.devices[2]) == "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 F0.3 B0.3");
  const Program few = make_schedule(ScheduleKind::kOneFOneB, 4, 1, 2);  // M < P: warm-up capped at M
  CHECK(line_of(few.devices[0]) == "F0.0 F0.1 B0.0 B0.1");
  CHECK(line_of(few.devices[3]) == "F0.0 B0.0 F0.1 B0.1");
  const Program gpipe = make_schedule(ScheduleKind::kGPipe, 2, 1, 3);
  for (const auto& device : gpipe.devices) CHECK(line_of(device) == "F0.0 F0.1 F0.2 B0.0 B0.1 B0.2");
  CHECK(OneFOneB<3, 4>::program() == one);
  CHECK(GPipe<2, 3>::program() == gpipe);
}

TEST_CASE("properties over a grid of shapes", "[schedule]") {
  int shapes = 0;
  for (int P = 1; P <= 8; ++P) {
    for (int V = 1; V <= 4; ++V) {
      for (int M = P; M <= 64; M += P) {
        for (ScheduleKind kind : {ScheduleKind::kInterleaved1F1B, ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
          if (kind != ScheduleKind::kInterleaved1F1B && V != 1) continue;
          const Program p = make_schedule(kind, P, V, M);
          ++shapes;
          INFO(schedule_name(kind) << " P=" << P << " V=" << V << " M=" << M);
          REQUIRE(p.devices.size() == static_cast<std::size_t>(P));
          for (int d = 0; d < P; ++d) {
            const auto& actions = p.devices[static_cast<std::size_t>(d)];
            INFO("device " << d);
            REQUIRE(actions.size() == static_cast<std::size_t>(2 * V * M));
            // Micro-batches of one chunk run in ascending order, forward and backward.
            std::vector<int> next_forward(static_cast<std::size_t>(V), 0), next_backward(static_cast<std::size_t>(V), 0);
            int first_backward = -1;
            for (std::size_t k = 0; k < actions.size(); ++k) {
              const Action& a = actions[k];
              auto& next = a.phase == Phase::kForward ? next_forward : next_backward;
              REQUIRE(a.micro_batch == next[static_cast<std::size_t>(a.chunk)]);
              ++next[static_cast<std::size_t>(a.chunk)];
              if (a.phase == Phase::kBackward && first_backward < 0) first_backward = static_cast<int>(k);
            }
            for (int c = 0; c < V; ++c) {
              CHECK(next_forward[static_cast<std::size_t>(c)] == M);
              CHECK(next_backward[static_cast<std::size_t>(c)] == M);
            }
            int expected_warmup = M;
            if (kind == ScheduleKind::kInterleaved1F1B) expected_warmup = std::min(2 * (P - d - 1) + (V - 1) * P, V * M);
            if (kind == ScheduleKind::kOneFOneB) expected_warmup = std::min(P - d - 1, M);
            CHECK(warmup_forwards(p.shape, d) == expected_warmup);
            // After the warm-up, the steady period starts with one more forward.
            const bool has_steady = expected_warmup < V * M;
            CHECK(first_backward == expected_warmup + (has_steady ? 1 : 0));
            for (int k = 0; k < expected_warmup; ++k) CHECK(period_of(p.shape, d, k) == Period::kWarmUp);
            // Interleaved backwards run chunks in reverse: the first backward is of the last chunk.
            if (kind == ScheduleKind::kInterleaved1F1B)
              CHECK(actions[static_cast<std::size_t>(first_backward)].chunk == V - 1);
          }
          const VerifyResult r = verify(p);
          INFO(r.what());
          CHECK(r);
        }
      }
    }
  }
  CHECK(shapes > 600);
}

TEST_CASE("periods split each device into warm-up, steady and cool-down", "[schedule]") {
  const ScheduleShape s{ScheduleKind::kInterleaved1F1B, 4, 2, 8};
  // Device 0: 10 warm-up forwards, 6 steady pairs, 10 cool-down backwards.
  int count[3] = {0, 0, 0};
  for (int k = 0; k < s.actions_per_device(); ++k) ++count[static_cast<int>(period_of(s, 0, k))];
  CHECK(count[0] == 10);
  CHECK(count[1] == 12);
  CHECK(count[2] == 10);
  CHECK(period_of(s, 3, 3) == Period::kWarmUp);
  CHECK(period_of(s, 3, 4) == Period::kSteady);
  CHECK(period_of(s, 3, 28) == Period::kCoolDown);
}

TEST_CASE("make_schedule rejects bad parameters with the rule", "[schedule]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 6),
                    Contains("micro-batches (6) must be a multiple of devices (4)"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kInterleaved1F1B, 0, 2, 8), Contains("devices must be at least 1"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 0), Contains("micro-batches must be at least 1"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kGPipe, 4, 2, 8), Contains("chunks must be 1"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kGPipe, 4, -1, 8), Contains("chunks must be at least 1"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kCustom, 4, 1, 8), Contains("no generator"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kInterleaved1F1B, 1024, 1024, 1024), Contains("at most 2^26"));
  CHECK_THROWS_AS(make_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 6), Error);
  CHECK_NOTHROW(make_schedule(ScheduleKind::kOneFOneB, 4, 1, 6));  // only interleaved needs M % P == 0
}

namespace {

// Device d's actions in PyTorch's notation, "<stage><kind><micro-batch>", space-separated.
// Device d's actions in PyTorch's notation, a pair as (0F3;3B1)OVERLAP_F_B.
std::string pytorch_line(const Program& p, int d) {
  std::string out;
  const auto& row = p.devices[static_cast<std::size_t>(d)];
  for (std::size_t k = 0; k < row.size();) {
    out += out.empty() ? "" : " ";
    out += pytorch_step(p.shape, d, k, row.size(), [&](std::size_t i) { return row[i]; });
  }
  return out;
}

}  // namespace

TEST_CASE("the zero-bubble orders match the worked examples", "[schedule]") {
  const Program h1 = make_schedule(ScheduleKind::kZeroBubbleH1, 3, 1, 6);
  CHECK(pytorch_line(h1, 0) == "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0F4 0I2 0W2 0F5 0I3 0W3 0I4 0W4 0I5 0W5");
  CHECK(pytorch_line(h1, 1) == "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1F4 1I3 1W2 1F5 1I4 1W3 1I5 1W4 1W5");
  CHECK(pytorch_line(h1, 2) == "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2F4 2I4 2W2 2F5 2I5 2W3 2W4 2W5");
  const Program v = make_schedule(ScheduleKind::kZeroBubbleV, 2, 2, 4);
  CHECK(v.shape.placement == Placement::kV);
  CHECK(pytorch_line(v, 0) ==
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3");
  CHECK(pytorch_line(v, 1) ==
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3");
  // Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  CHECK((v.shape.stage_of(0, 1) == 3 && v.shape.stage_of(1, 1) == 2 && v.shape.device_of_stage(3) == 0));
  CHECK(ZeroBubbleH1<3, 6>::program() == h1);
  CHECK(ZeroBubbleV<2, 4>::program() == v);
}

TEST_CASE("DualPipeV matches the worked example, pairs and all", "[schedule]") {
  const Program p = make_schedule(ScheduleKind::kDualPipeV, 2, 2, 4);
  CHECK(p.shape.placement == Placement::kV);
  CHECK(pytorch_line(p, 0) ==
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B 3B3 0I2 0W2 "
        "0I3 0W3");
  CHECK(pytorch_line(p, 1) ==
        "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2B2 1B2 2I3 1I3 2W3 "
        "1W3");
  CHECK(DualPipeV<2, 4>::program() == p);
  CHECK(DualPipeV<2, 4>::counts[0] == 19);
  CHECK(DualPipeV<2, 4>::counts[1] == 18);
  for (int d = 0; d < 2; ++d) CHECK(warmup_forwards(p.shape, d) == 4);
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kDualPipeV, 2, 2, 3),
                    "dualpipe-v schedule: micro-batches (3) must be at least the number of stages, 2 * devices = 4, "
                    "as PyTorch's ScheduleDualPipeV requires");
  for (int P = 1; P <= 6; ++P) {
    for (int M = 2 * P; M <= 2 * P + 6; ++M) {
      const Program q = make_schedule(ScheduleKind::kDualPipeV, P, 2, M);
      INFO("P=" << P << " M=" << M);
      for (int d = 0; d < P; ++d) {
        const auto& row = q.devices[static_cast<std::size_t>(d)];
        const PeriodCounts periods = period_counts(q.shape, d);
        CHECK(periods[Period::kWarmUp] == 2 * P);
        CHECK(periods[Period::kWarmUp] + periods[Period::kSteady] + periods[Period::kCoolDown] ==
              static_cast<int>(row.size()));
        CHECK(static_cast<int>(row.size()) <= q.shape.actions_per_device());
        for (int k = 0; k < 2 * P; ++k) {  // the warm-up: forwards alone
          const Action& a = row[static_cast<std::size_t>(k)];
          CHECK(a == fwd(a.chunk, a.micro_batch));
        }
      }
    }
  }
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kDualPipeV, 2, 3, 8),
                    "dualpipe-v schedule: chunks must be 2 (got 3): DualPipeV places two chunks per device in a V");
}

TEST_CASE("the orders equal PyTorch 2.15's on a grid of shapes, and PyTorch's refusals are ours", "[schedule]") {
  // tests/data/pytorch/<class>.txt: PyTorch's own orders (tools/pytorch_orders.py).
  const std::vector<std::pair<std::string, std::vector<ScheduleKind>>> classes = {
      {"ScheduleLoopedBFS", {ScheduleKind::kLoopedBFS}},
      {"ScheduleInterleavedZeroBubble", {ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kZeroBubbleH1}},
      {"ScheduleZBVZeroBubble", {ScheduleKind::kZeroBubbleV}},
      {"ScheduleDualPipeV", {ScheduleKind::kDualPipeV}},
  };
  int orders = 0, refusals = 0;
  for (const auto& entry : classes) {
    const std::string& name = entry.first;  // named apart: Clang 14 cannot capture structured bindings
    const std::vector<ScheduleKind>& kinds = entry.second;
    std::ifstream in(std::string(PIPEWEAVE_TEST_DATA) + "/pytorch/" + name + ".txt");
    REQUIRE(in);
    std::string line;
    std::vector<std::string> ranks;
    std::string header, error;
    auto compare = [&] {
      if (header.empty()) return;
      int P = 0, V = 0, M = 0;
      REQUIRE(std::sscanf(header.c_str() + name.size(), " P=%d V=%d M=%d", &P, &V, &M) == 3);
      for (ScheduleKind kind : kinds) {
        if (kind == ScheduleKind::kZeroBubbleH1 && V != 1) continue;
        INFO(header << " as " << schedule_name(kind));
        if (!error.empty()) {
          CHECK_THROWS_AS(make_schedule(kind, P, V, M), Error);
          ++refusals;
          continue;
        }
        const Program p = make_schedule(kind, P, V, M);
        REQUIRE(ranks.size() == static_cast<std::size_t>(P));
        for (int d = 0; d < P; ++d) CHECK("rank " + std::to_string(d) + ": " + pytorch_line(p, d) == ranks[static_cast<std::size_t>(d)]);
        const VerifyResult r = verify(p);
        INFO(r.what());
        CHECK(r);
        ++orders;
      }
    };
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      if (line.rfind("rank ", 0) == 0) {
        ranks.push_back(line);
      } else if (line.rfind("error: ", 0) == 0) {
        error = line;
      } else {
        compare();
        header = line;
        ranks.clear();
        error.clear();
      }
    }
    compare();
  }
  CHECK(orders > 1200);
  CHECK(refusals > 150);
}

TEST_CASE("zero-bubble orders hold each action once, W after its I, over a wide grid", "[schedule]") {
  int shapes = 0;
  for (ScheduleKind kind : {ScheduleKind::kLoopedBFS, ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleavedZeroBubble,
                            ScheduleKind::kZeroBubbleV}) {
    for (int P = 1; P <= 9; ++P) {
      for (int V = 1; V <= 5; ++V) {
        for (int M = 1; M <= 40; M += (M < 12 ? 1 : 7)) {
          const ScheduleShape s{kind, P, V, M, placement_of(kind)};
          if (!shape_error(s).empty()) continue;
          const Program p = make_program(s);
          ++shapes;
          INFO(schedule_name(kind) << " P=" << P << " V=" << V << " M=" << M);
          for (int d = 0; d < P; ++d) {
            const auto& actions = p.devices[static_cast<std::size_t>(d)];
            REQUIRE(actions.size() == static_cast<std::size_t>(s.actions_per_device()));
            // Each chunk's micro-batches: F in ascending order (looped BFS: B descending), I and W ascending.
            std::vector<int> next(static_cast<std::size_t>(kPhases * V), 0);
            const PeriodCounts periods = period_counts(s, d);
            CHECK(periods[Period::kWarmUp] == warmup_forwards(s, d));
            for (int k = 0; k < periods[Period::kWarmUp]; ++k) CHECK(actions[static_cast<std::size_t>(k)].phase == Phase::kForward);
            for (const Action& a : actions) {
              int& n = next[static_cast<std::size_t>(static_cast<int>(a.phase) * V + a.chunk)];
              if (a.phase == Phase::kBackward) {
                CHECK(a.micro_batch == M - 1 - n);
              } else {
                CHECK(a.micro_batch == n);
              }
              if (a.phase == Phase::kBackwardWeight)  // its I ran before
                CHECK(next[static_cast<std::size_t>(static_cast<int>(Phase::kBackwardInput) * V + a.chunk)] > a.micro_batch);
              ++n;
            }
          }
          const VerifyResult r = verify(p);
          INFO(r.what());
          CHECK(r);
        }
      }
    }
  }
  CHECK(shapes > 500);
}

TEST_CASE("make_schedule states each new kind's rule", "[schedule]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kZeroBubbleV, 4, 3, 8),
                    Contains("zb-v schedule: chunks must be 2 (got 3): ZB-V places two chunks per device in a V"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kZeroBubbleH1, 4, 2, 8),
                    Contains("zb-h1 schedule: chunks must be 1 (got 2); use interleaved-zb for several chunks per device"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kInterleavedZeroBubble, 4, 2, 9),
                    Contains("interleaved-zb schedule: micro-batches (9) must be a multiple of the rounds, max(1, "
                             "micro-batches / devices) = 2, as PyTorch's ScheduleInterleavedZeroBubble requires"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kZeroBubbleH1, 2, 1, 5), Contains("multiple of the rounds"));
  CHECK_THROWS_WITH(make_program({ScheduleKind::kZeroBubbleV, 4, 2, 8, Placement::kLoop}),
                    Contains("zb-v schedule: the placement must be v (got loop)"));
  CHECK_THROWS_WITH(make_program({ScheduleKind::kInterleaved1F1B, 4, 2, 8, Placement::kV}),
                    Contains("interleaved schedule: the placement must be loop (got v)"));
  CHECK_NOTHROW(make_schedule(ScheduleKind::kInterleavedZeroBubble, 4, 2, 6));  // one round of 6
  CHECK_NOTHROW(make_schedule(ScheduleKind::kLoopedBFS, 3, 4, 5));            // any shape
  CHECK_NOTHROW(make_schedule(ScheduleKind::kZeroBubbleV, 5, 2, 3));          // M < 2P - 1: actions past M left out
}
