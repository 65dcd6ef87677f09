// Layer allocation: virtual stage s = c*P + d holds an equal share of layers, or
// the layers a list gives it, after those of the stages before it.
#include <catch2/catch.hpp>

#include <vector>

#include "pipeweave/schedule/allocation.hpp"

using namespace pipeweave;

namespace {

// The 1-based layers of each device, its chunks in order.
std::vector<std::vector<int>> device_layers(const ScheduleShape& s, const LayerAllocation& a) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(s.devices));
  for (int d = 0; d < s.devices; ++d)
    for (int c = 0; c < s.chunks; ++c) {
      const LayerRange r = chunk_layers(s, a, d, c);
      for (int layer = r.begin; layer < r.end; ++layer) out[static_cast<std::size_t>(d)].push_back(layer + 1);
    }
  return out;
}

// Stage s begins where stage s - 1 ends, the first at 0 and the last at L.
void check_model_order(const ScheduleShape& s, const LayerAllocation& a) {
  int next = 0;
  for (int stage = 0; stage < s.stages(); ++stage) {
    const LayerRange r = chunk_layers(s, a, s.device_of_stage(stage), s.chunk_of_stage(stage));
    CHECK(r == stage_layers(s, a, stage));
    CHECK(r.begin == next);
    CHECK(r.size() >= 1);
    next = r.end;
  }
  CHECK(next == a.layers);
}

constexpr ScheduleShape kSeed{ScheduleKind::kInterleaved1F1B, 4, 2, 8};
constexpr ScheduleShape kZbv{ScheduleKind::kZeroBubbleV, 2, 2, 4, Placement::kV};

}  // namespace

TEST_CASE("seed example: 16 layers on 4 devices with 2 chunks each", "[schedule]") {
  // 1-based layers per device, as in the design notes.
  CHECK(device_layers(kSeed, 16) ==
        std::vector<std::vector<int>>{{1, 2, 9, 10}, {3, 4, 11, 12}, {5, 6, 13, 14}, {7, 8, 15, 16}});
  static_assert(chunk_layers(ScheduleShape{ScheduleKind::kInterleaved1F1B, 4, 2, 8}, 16, 0, 1) == LayerRange{8, 10});
  // A list of equal entries is the even split.
  CHECK(device_layers(kSeed, {16, {2, 2, 2, 2, 2, 2, 2, 2}}) == device_layers(kSeed, 16));
  CHECK(LayerAllocation{16}.even());
  CHECK_FALSE((LayerAllocation{16, {2, 2, 2, 2, 2, 2, 2, 2}}.even()));
}

TEST_CASE("an uneven list gives each virtual stage its layers, in model order", "[schedule]") {
  // Megatron-LM's first and last stages with one layer each (the embedding and the loss beside them).
  const LayerAllocation a{14, {1, 2, 2, 2, 2, 2, 2, 1}};
  CHECK(layer_split_error(kSeed, a).empty());
  CHECK(device_layers(kSeed, a) == std::vector<std::vector<int>>{{1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14}});
  CHECK(stage_layers(kSeed, a, 0) == LayerRange{0, 1});
  CHECK(stage_layers(kSeed, a, 4) == LayerRange{7, 9});
  CHECK(stage_layers(kSeed, a, 7) == LayerRange{13, 14});
  CHECK(a.range(8, 3) == LayerRange{5, 7});
  check_model_order(kSeed, a);
  // Compile time: device 3's chunk 1 (stage 7) is layer 14 alone; device 0's chunk 1 (stage 4) layers 8 and 9.
  static_assert(chunk_layers(kSeed, {14, {1, 2, 2, 2, 2, 2, 2, 1}}, 3, 1) == LayerRange{13, 14});
  static_assert(chunk_layers(kSeed, {14, {1, 2, 2, 2, 2, 2, 2, 1}}, 0, 1) == LayerRange{7, 9});
  static_assert(layer_split_error(kSeed, {14, {1, 2, 2, 2, 2, 2, 2, 1}}).empty());
}

TEST_CASE("the v placement takes the list in virtual-stage order, up the devices and back down", "[schedule]") {
  // Stages 0, 1 on devices 0, 1; stages 2, 3 on devices 1, 0.
  const LayerAllocation a{10, {1, 2, 3, 4}};
  CHECK(layer_split_error(kZbv, a).empty());
  CHECK(chunk_layers(kZbv, a, 0, 0) == LayerRange{0, 1});
  CHECK(chunk_layers(kZbv, a, 1, 0) == LayerRange{1, 3});
  CHECK(chunk_layers(kZbv, a, 1, 1) == LayerRange{3, 6});
  CHECK(chunk_layers(kZbv, a, 0, 1) == LayerRange{6, 10});
  CHECK(device_layers(kZbv, a) == std::vector<std::vector<int>>{{1, 7, 8, 9, 10}, {2, 3, 4, 5, 6}});
  check_model_order(kZbv, a);
  static_assert(chunk_layers(kZbv, {10, {1, 2, 3, 4}}, 0, 1) == LayerRange{6, 10});
}

TEST_CASE("stages cover every layer once, in model order", "[schedule]") {
  for (int P = 1; P <= 6; ++P) {
    for (int V = 1; V <= 3; ++V) {
      for (const Placement placement : {Placement::kLoop, Placement::kV}) {
        const ScheduleShape s{ScheduleKind::kCustom, P, V, P, placement};
        check_model_order(s, 2 * P * V);
        LayerAllocation uneven{0, {}};
        for (int stage = 0; stage < s.stages(); ++stage) uneven.per_stage.push_back(1 + (stage * 7) % 3);
        for (int n : uneven.per_stage) uneven.layers += n;
        REQUIRE(layer_split_error(s, uneven).empty());
        check_model_order(s, uneven);
      }
    }
  }
}

TEST_CASE("layer counts that do not split evenly are rejected", "[schedule]") {
  CHECK_THROWS_WITH(check_layer_split(kSeed, 12), "layers (12) must be a multiple of devices * chunks (4 * 2 = 8)");
  CHECK_THROWS_WITH(check_layer_split(kSeed, 0), "layers must be at least 1 (got 0)");
  CHECK_THROWS_WITH(check_layer_split(ScheduleShape{ScheduleKind::kCustom, 0, 2, 1}, 4),
                    "devices and chunks must be at least 1 (got 0 and 2)");
  CHECK_NOTHROW(check_layer_split(kSeed, 24));
}

TEST_CASE("a list of layers per stage names what is wrong and what is allowed", "[schedule]") {
  CHECK_THROWS_WITH(check_layer_split(kSeed, {14, {1, 2, 2}}),
                    "layers per stage has 3 entries; it must have one per virtual stage, devices * chunks (4 * 2 = 8)");
  CHECK_THROWS_WITH(check_layer_split(kZbv, {3, {3}}),
                    "layers per stage has 1 entry; it must have one per virtual stage, devices * chunks (2 * 2 = 4)");
  CHECK_THROWS_WITH(check_layer_split(kSeed, {16, {1, 2, 2, 2, 0, 2, 2, 5}}),
                    "layers per stage: virtual stage 4 has 0 layers; each virtual stage must have at least 1");
  CHECK_THROWS_WITH(check_layer_split(kZbv, {10, {1, -2, 3, 8}}),
                    "layers per stage: virtual stage 1 has -2 layers; each virtual stage must have at least 1");
  CHECK_THROWS_WITH(check_layer_split(kSeed, {16, {1, 2, 2, 2, 2, 2, 2, 1}}),
                    "layers per stage sum to 14; they must sum to the model's layers (16)");
  CHECK_THROWS_WITH(check_layer_split(ScheduleShape{ScheduleKind::kCustom, 2, 0, 1}, {2, {1, 1}}),
                    "devices and chunks must be at least 1 (got 2 and 0)");
  // No overflow: the sum of large entries is counted in 64 bits.
  CHECK_THROWS_WITH(check_layer_split(kZbv, {7, {2147483647, 2147483647, 1, 1}}),
                    "layers per stage sum to 4294967296; they must sum to the model's layers (7)");
  static_assert(layer_split_error(kSeed, {16, {1, 2, 2, 2, 2, 2, 2, 1}}).view() ==
                "layers per stage sum to 14; they must sum to the model's layers (16)");
}
