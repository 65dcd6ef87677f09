// The CPU transport: NCCL's matching rules, checks, timeouts, abort and reset.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../common/threads.hpp"
#include "pipeweave/cpu/transport.hpp"

using namespace pipeweave;
using namespace std::chrono_literals;

using test::act;
using test::grad;
using test::on_threads;

TEST_CASE("messages match in FIFO order per directed pair and carry their data", "[cpu]") {
  auto ends = cpu::make_rendezvous(2, {5s});
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6, 7}, c = {8};
  std::vector<float> ra(3), rb(4), rc(1), back(3);
  auto errors = on_threads(2, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    if (d == 0) {
      t.group_begin(0);
      t.send(1, act(0, 0, 12), a.data());
      t.send(1, act(0, 1, 16), b.data());
      t.group_end();
      t.group_begin(1);
      t.send(1, grad(2, 0, 4), c.data());
      t.recv(1, act(1, 0, 12), back.data());
      t.group_end();
    } else {
      // The receives are split over groups differently from the sends; FIFO order still pairs them.
      t.group_begin(0);
      t.recv(0, act(0, 0, 12), ra.data());
      t.group_end();
      t.group_begin(1);
      t.recv(0, act(0, 1, 16), rb.data());
      t.recv(0, grad(2, 0, 4), rc.data());
      t.send(0, act(1, 0, 12), ra.data());
      t.group_end();
    }
  });
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(ra == a);
  CHECK(rb == b);
  CHECK(rc == c);
  CHECK(back == a);
}

TEST_CASE("a send completes only once its receive is posted", "[cpu]") {
  auto ends = cpu::make_rendezvous(2, {5s});
  std::atomic<bool> posted{false};
  bool seen_posted = false;
  float x = 1, y = 0;
  auto errors = on_threads(2, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    t.group_begin(0);
    if (d == 0) {
      t.send(1, act(0, 0, 4), &x);
      t.group_end();
      seen_posted = posted.load();
    } else {
      std::this_thread::sleep_for(20ms);  // give the send every chance to finish early
      t.recv(0, act(0, 0, 4), &y);
      posted = true;
      t.group_end();
    }
  });
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(seen_posted);
  CHECK(y == 1);
}

TEST_CASE("a group completes when all of its operations are matched, across several peers", "[cpu]") {
  auto ends = cpu::make_rendezvous(3, {5s});
  std::vector<float> got(3, 0.0f);
  auto errors = on_threads(3, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    float mine = static_cast<float>(d + 1);
    t.group_begin(d);
    // A ring: every device sends to the next and receives from the previous, in one group.
    t.send((d + 1) % 3, act(d, 0, 4), &mine);
    t.recv((d + 2) % 3, act((d + 2) % 3, 0, 4), &got[static_cast<std::size_t>(d)]);
    t.group_end();
  });
  CHECK(errors == std::vector<std::string>(3));
  CHECK(got == std::vector<float>{3, 1, 2});
}

TEST_CASE("a message that differs from what the receiver expects names both sides", "[cpu]") {
  SECTION("a different tensor") {
    auto ends = cpu::make_rendezvous(2, {5s});
    float x = 0, y = 0;
    auto errors = on_threads(2, [&](int d) {
      auto& t = ends[static_cast<std::size_t>(d)];
      try {
        if (d == 0) {
          t.group_begin(2);
          t.send(1, act(0, 1, 4), &x);
          t.group_end();
        } else {
          t.group_begin(3);
          t.recv(0, act(0, 0, 4), &y);
          t.group_end();
        }
      } catch (const Error&) {
        t.abort("mismatch");  // as the executor does: the first error stops everyone
        throw;
      }
    });
    const std::string mismatch = errors[0].find("expects") != std::string::npos ? errors[0] : errors[1];
    CHECK(mismatch ==
          "device 1, step 3 expects from device 0 activation(stage 0, micro-batch 0), 4 bytes of fp32, but the message it "
          "matches, sent by device 0 at its step 2, is activation(stage 0, micro-batch 1), 4 bytes of fp32");
  }
  SECTION("a different byte count") {
    auto ends = cpu::make_rendezvous(2, {5s});
    float x[2] = {}, y[2] = {};
    auto errors = on_threads(2, [&](int d) {
      auto& t = ends[static_cast<std::size_t>(d)];
      try {
        t.group_begin(0);
        if (d == 0)
          t.send(1, grad(1, 0, 8), x);
        else
          t.recv(0, grad(1, 0, 4), y);
        t.group_end();
      } catch (const Error&) {
        t.abort("mismatch");
        throw;
      }
    });
    const std::string both = errors[0] + "|" + errors[1];
    CHECK_THAT(both, Catch::Contains("expects from device 0 gradient(stage 1, micro-batch 0), 4 bytes of fp32") &&
                         Catch::Contains("is gradient(stage 1, micro-batch 0), 8 bytes of fp32"));
  }
  SECTION("a different dtype") {
    auto ends = cpu::make_rendezvous(2, {5s});
    float x[2] = {}, y[2] = {};
    auto errors = on_threads(2, [&](int d) {
      auto& t = ends[static_cast<std::size_t>(d)];
      try {
        t.group_begin(0);
        if (d == 0)
          t.send(1, Message{{TensorKind::kActivation, 0, 1}, 8, DType::kBF16}, x);
        else
          t.recv(0, Message{{TensorKind::kActivation, 0, 1}, 8, DType::kF32}, y);
        t.group_end();
      } catch (const Error&) {
        t.abort("mismatch");
        throw;
      }
    });
    const std::string both = errors[0] + "|" + errors[1];
    CHECK_THAT(both, Catch::Contains("expects from device 0 activation(stage 0, micro-batch 1), 8 bytes of fp32") &&
                         Catch::Contains("is activation(stage 0, micro-batch 1), 8 bytes of bf16"));
  }
}

TEST_CASE("a wait past the timeout names the device, the step and the message", "[cpu]") {
  auto ends = cpu::make_rendezvous(2, {50ms});
  float y = 0;
  auto errors = on_threads(2, [&](int d) {
    if (d != 1) return;  // device 0 never sends
    auto& t = ends[1];
    t.group_begin(4);
    t.recv(0, act(2, 1, 4), &y);
    t.group_end();
  });
  CHECK(errors[0].empty());
  CHECK(errors[1] ==
        "device 1, step 4: timed out after 50 ms waiting for device 0 to send activation(stage 2, micro-batch 1), 4 bytes of fp32");
}

TEST_CASE("abort stops every wait at once, and reset makes the fabric usable again", "[cpu]") {
  auto ends = cpu::make_rendezvous(3, {60s});  // a hang would show as a test timeout
  std::atomic<int> waiting{0};
  float x = 0;
  auto errors = on_threads(3, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    if (d == 2) {
      while (waiting.load() < 2) std::this_thread::yield();
      t.abort("device 2 failed");
      return;
    }
    t.group_begin(7);
    t.recv(2, act(1, 0, 4), &x);  // device 2 never sends
    ++waiting;
    t.group_end();
  });
  for (int d = 0; d < 2; ++d) {
    CHECK_THAT(errors[static_cast<std::size_t>(d)],
               Catch::StartsWith("device " + std::to_string(d) + ", step 7: stopped") &&
                   Catch::Contains("because another device failed: device 2 failed"));
  }
  // Every device resets together; then messages flow again.
  float v = 5, w = 0;
  errors = on_threads(3, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    t.reset();
    t.group_begin(0);
    if (d == 0) t.send(2, act(0, 0, 4), &v);
    if (d == 2) t.recv(0, act(0, 0, 4), &w);
    t.group_end();
  });
  CHECK(errors == std::vector<std::string>(3));
  CHECK(w == 5);
}

TEST_CASE("agree is true only when every device passes true", "[cpu]") {
  auto ends = cpu::make_rendezvous(3, {5s});
  std::vector<int> first(3), second(3);
  auto errors = on_threads(3, [&](int d) {
    auto& t = ends[static_cast<std::size_t>(d)];
    first[static_cast<std::size_t>(d)] = t.agree(true);
    second[static_cast<std::size_t>(d)] = t.agree(d != 1);
  });
  CHECK(errors == std::vector<std::string>(3));
  CHECK(first == std::vector<int>{1, 1, 1});
  CHECK(second == std::vector<int>{0, 0, 0});
}

TEST_CASE("an agreement that a device never reaches times out naming the missing device", "[cpu]") {
  auto ends = cpu::make_rendezvous(2, {50ms});
  auto errors = on_threads(2, [&](int d) {
    if (d == 0) ends[0].agree(true);
  });
  CHECK_THAT(errors[0], Catch::Contains("timed out after 50 ms waiting for device 1 to reach the agreement"));
}

TEST_CASE("operations outside a group and unknown peers are errors", "[cpu]") {
  auto ends = cpu::make_rendezvous(2);
  float x = 0;
  CHECK_THROWS_WITH(ends[0].send(1, act(0, 0, 4), &x), Catch::Contains("send outside a group"));
  ends[0].group_begin(0);
  CHECK_THROWS_WITH(ends[0].send(5, act(0, 0, 4), &x), Catch::Contains("peer 5 is not a device"));
  CHECK_THROWS_WITH(cpu::make_rendezvous(0), Catch::Contains("devices must be at least 1"));
}
