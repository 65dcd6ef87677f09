// ReplicaGroup: the fixed-order all-reduce of D replicas' gradients (bit for bit
// the left-to-right sum in replica order, whatever the threads' timing), the
// agreement, and the errors: a mismatch, a timeout naming the missing replicas,
// an abort that ends every wait.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../common/threads.hpp"
#include "pipeweave/runtime/replicas.hpp"

using namespace pipeweave;
using Catch::Matchers::Contains;

namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("all_reduce sums in replica order, bit for bit, over uneven slices and repeated calls", "[runtime]") {
  for (const int D : {1, 2, 3, 4, 5}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{1000}}) {
      INFO("D=" << D << " n=" << n);
      std::mt19937 rng(static_cast<unsigned>(D * 1000 + n));
      std::uniform_real_distribution<float> value(-1e3f, 1e3f);
      // [replica][tensor]: two tensors of n and n + 2 values, values of mixed magnitudes.
      std::vector<std::vector<std::vector<float>>> grads(static_cast<std::size_t>(D));
      for (auto& g : grads) {
        g = {std::vector<float>(n), std::vector<float>(n + 2)};
        for (auto& t : g)
          for (float& x : t) x = value(rng) * (rng() % 2 ? 1e-4f : 1.0f);
      }
      std::vector<std::vector<float>> want(2);
      for (std::size_t t = 0; t < 2; ++t) {
        want[t] = grads[0][t];
        for (int q = 1; q < D; ++q)
          for (std::size_t i = 0; i < want[t].size(); ++i) want[t][i] += grads[static_cast<std::size_t>(q)][t][i];
      }
      ReplicaGroup group(3, D, std::chrono::seconds(20));
      const auto errors = test::on_threads(D, [&](int r) {
        auto& g = grads[static_cast<std::size_t>(r)];
        const std::span<float> tensors[] = {g[0], g[1]};
        if (r % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // any arrival order
        group.all_reduce(r, 0, tensors);
        group.all_reduce(r, 1, tensors);  // a second reduction: the sum of D equal sums
      });
      for (const auto& e : errors) CHECK(e.empty());
      for (std::size_t t = 0; t < 2; ++t) {
        for (std::size_t i = 0; i < want[t].size(); ++i) {
          float twice = want[t][i];
          for (int q = 1; q < D; ++q) twice += want[t][i];
          for (int r = 0; r < D; ++r) REQUIRE(same_bits(grads[static_cast<std::size_t>(r)][t][i], twice));
        }
      }
    }
  }
}

TEST_CASE("agree() is the AND of every replica's answer", "[runtime]") {
  ReplicaGroup group(0, 3, std::chrono::seconds(20));
  std::vector<char> got(3);
  test::on_threads(3, [&](int r) { got[static_cast<std::size_t>(r)] = group.agree(r, true) ? 1 : 0; });
  CHECK(got == std::vector<char>{1, 1, 1});
  test::on_threads(3, [&](int r) { got[static_cast<std::size_t>(r)] = group.agree(r, r != 2) ? 1 : 0; });
  CHECK(got == std::vector<char>{0, 0, 0});
}

TEST_CASE("a replica group names what goes wrong: mismatch, timeout, abort", "[runtime]") {
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  SECTION("replicas on different chunks or tensor sizes") {
    ReplicaGroup group(1, 2, std::chrono::seconds(20));
    auto errors = test::on_threads(2, [&](int r) {
      const std::span<float> t[] = {r == 0 ? std::span<float>(a) : std::span<float>(b)};
      group.all_reduce(r, r == 0 ? 0 : 1, t);
    });
    for (const auto& e : errors)
      CHECK_THAT(e, Contains("device 1: replica") && Contains("replica 1 reduces chunk 1 while replica 0 reduces chunk 0"));
    errors = test::on_threads(2, [&](int r) {
      const std::span<float> t[] = {r == 0 ? std::span<float>(a) : std::span<float>(b)};
      group.all_reduce(r, 0, t);
    });
    for (const auto& e : errors) CHECK_THAT(e, Contains("tensor 0 of chunk 0 has 5 values in replica 1, 4 in replica 0"));
    CHECK(a == std::vector<float>(4, 1.0f));  // nothing summed
  }
  SECTION("a replica that never comes: the others time out, naming it") {
    ReplicaGroup group(2, 3, std::chrono::milliseconds(100));
    const auto errors = test::on_threads(3, [&](int r) {
      if (r == 1) return;
      const std::span<float> t[] = {a};
      group.all_reduce(r, 0, t);
    });
    CHECK_THAT(errors[0], Contains("device 2: replica 0: timed out after 100 ms waiting for replica 1 to reach the "
                                   "gradient reduction of chunk 0"));
    CHECK(errors[1].empty());
  }
  SECTION("an abort ends every wait and every later call until reset()") {
    ReplicaGroup group(0, 3, std::chrono::seconds(60));
    const auto start = std::chrono::steady_clock::now();
    const auto errors = test::on_threads(3, [&](int r) {
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        group.abort("device 1: step 4, B0.3: a chunk failed");
        return;
      }
      group.agree(r, true);
    });
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
    for (int r = 0; r < 2; ++r)
      CHECK_THAT(errors[static_cast<std::size_t>(r)],
                 Contains("stopped while waiting for replica 2 to reach the agreement of the replicas because another "
                          "device failed: device 1: step 4, B0.3: a chunk failed"));
    CHECK(group.aborted());
    CHECK_THROWS_WITH(group.agree(0, true), Contains("replica 0: stopped before the agreement of the replicas"));
    group.reset();
    CHECK_FALSE(group.aborted());
    std::vector<char> got(3);
    test::on_threads(3, [&](int r) { got[static_cast<std::size_t>(r)] = group.agree(r, true) ? 1 : 0; });
    CHECK(got == std::vector<char>{1, 1, 1});
  }
  CHECK_THROWS_WITH(ReplicaGroup(0, 0, std::chrono::seconds(1)), Contains("at least 1 replica, got 0"));
}
