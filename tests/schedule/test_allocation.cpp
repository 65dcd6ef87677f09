// Layer allocation: virtual stage s = c*P + d holds an equal share of layers.
#include <catch2/catch.hpp>

#include "pipeweave/schedule/allocation.hpp"

using namespace pipeweave;

TEST_CASE("seed example: 16 layers on 4 devices with 2 chunks each", "[schedule]") {
  const ScheduleShape s{ScheduleKind::kInterleaved1F1B, 4, 2, 8};
  // 1-based layers per device, as in the design notes.
  const int expected[4][4] = {{1, 2, 9, 10}, {3, 4, 11, 12}, {5, 6, 13, 14}, {7, 8, 15, 16}};
  for (int d = 0; d < 4; ++d) {
    int i = 0;
    for (int c = 0; c < 2; ++c) {
      const LayerRange r = chunk_layers(s, 16, d, c);
      REQUIRE(r.size() == 2);
      for (int layer = r.begin; layer < r.end; ++layer) CHECK(layer + 1 == expected[d][i++]);
    }
  }
  static_assert(chunk_layers(ScheduleShape{ScheduleKind::kInterleaved1F1B, 4, 2, 8}, 16, 0, 1) == LayerRange{8, 10});
}

TEST_CASE("stages cover every layer once, in model order", "[schedule]") {
  for (int P = 1; P <= 6; ++P) {
    for (int V = 1; V <= 3; ++V) {
      const ScheduleShape s{ScheduleKind::kInterleaved1F1B, P, V, P};
      const int layers = 2 * P * V;
      int next = 0;
      for (int stage = 0; stage < s.stages(); ++stage) {
        const LayerRange r = chunk_layers(s, layers, s.device_of_stage(stage), s.chunk_of_stage(stage));
        CHECK(r.begin == next);
        next = r.end;
      }
      CHECK(next == layers);
    }
  }
}

TEST_CASE("layer counts that do not split evenly are rejected", "[schedule]") {
  using Catch::Matchers::Contains;
  const ScheduleShape s{ScheduleKind::kInterleaved1F1B, 4, 2, 8};
  CHECK_THROWS_WITH(check_layer_split(s, 12), Contains("layers (12) must be a multiple of devices * chunks (4 * 2 = 8)"));
  CHECK_THROWS_WITH(check_layer_split(s, 0), Contains("layers must be at least 1"));
  CHECK_NOTHROW(check_layer_split(s, 24));
}
