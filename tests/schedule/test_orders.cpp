// Orders of the generators: the worked example, exact small cases, and
// properties over a grid of shapes.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

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
