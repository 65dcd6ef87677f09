// The host-side matching of every transport of one process (runtime/matcher.hpp):
// the match hook, checks, timeouts, abort, agreement and reset. FIFO order and the
// training runs through it are covered by the CPU transport's tests (cpu/), which
// use this matcher with a copying hook.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/threads.hpp"
#include "pipeweave/runtime/matcher.hpp"

using namespace pipeweave;
using namespace std::chrono_literals;
using test::act;
using test::grad;
using test::on_threads;

TEST_CASE("the match hook runs once per pair, with both sides' operations", "[runtime]") {
  struct Seen {
    std::vector<std::array<int, 4>> calls;
    bool both = true;
    std::mutex m;
  } seen;
  RendezvousMatcher matcher(3, 5s, [&](const MatchSide& send, const MatchSide& recv) {
    std::lock_guard lock(seen.m);
    seen.calls.push_back({send.device, send.index, recv.device, recv.index});
    // The hook sees both operations (Catch2's assertions are not thread-safe: collect, check after).
    seen.both &= send.op.kind == OpKind::kSend && recv.op.kind == OpKind::kRecv && send.op.message == recv.op.message;
  });
  auto errors = on_threads(3, [&](int d) {
    matcher.begin(d, 0);
    if (d == 0) {
      matcher.add(0, OpKind::kSend, 1, act(0, 0, 4), nullptr, nullptr);
      matcher.add(0, OpKind::kSend, 2, act(0, 1, 4), nullptr, nullptr);
    } else {
      matcher.add(d, OpKind::kRecv, 0, act(0, d - 1, 4), nullptr, nullptr);
    }
    if (matcher.close(d)) matcher.post(d);
  });
  CHECK(errors == std::vector<std::string>{"", "", ""});
  std::sort(seen.calls.begin(), seen.calls.end());
  CHECK(seen.calls == std::vector<std::array<int, 4>>{{0, 0, 1, 0}, {0, 1, 2, 0}});
  CHECK(seen.both);
}

TEST_CASE("a mismatched message is an error naming both sides, before the hook runs", "[runtime]") {
  std::atomic<int> hooks{0};
  RendezvousMatcher matcher(2, 2s, [&](const MatchSide&, const MatchSide&) { ++hooks; });
  auto errors = on_threads(2, [&](int d) {
    matcher.begin(d, 3);
    if (d == 0)
      matcher.add(0, OpKind::kSend, 1, act(0, 1, 16), nullptr, nullptr);
    else
      matcher.add(1, OpKind::kRecv, 0, act(0, 0, 16), nullptr, nullptr);
    matcher.close(d);
    try {
      matcher.post(d);
    } catch (const Error& e) {
      matcher.abort(e.what());
      throw;
    }
  });
  const std::string both = errors[0] + errors[1];
  CHECK_THAT(both, Catch::Contains("device 1, step 3 expects from device 0 activation(stage 0, micro-batch 0), 16 bytes of fp32"));
  CHECK_THAT(both, Catch::Contains("sent by device 0 at its step 3, is activation(stage 0, micro-batch 1), 16 bytes of fp32"));
  CHECK(hooks == 0);

  RendezvousMatcher bytes(2, 2s);
  errors = on_threads(2, [&](int d) {
    bytes.begin(d, 0);
    bytes.add(d, d == 0 ? OpKind::kSend : OpKind::kRecv, 1 - d, act(0, 0, d == 0 ? 16 : 12), nullptr, nullptr);
    bytes.close(d);
    try {
      bytes.post(d);
    } catch (const Error& e) {
      bytes.abort(e.what());
      throw;
    }
  });
  CHECK_THAT(errors[0] + errors[1], Catch::Contains("12 bytes of fp32, but the message it matches"));
}

TEST_CASE("a wait longer than the timeout names the device, the step and the message", "[runtime]") {
  RendezvousMatcher matcher(2, 100ms);
  matcher.begin(0, 7);
  matcher.add(0, OpKind::kRecv, 1, grad(3, 2, 64), nullptr, nullptr);
  matcher.close(0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(matcher.post(0), Catch::Contains("device 0, step 7: timed out after 100 ms waiting for device 1 "
                                                     "to send gradient(stage 3, micro-batch 2), 64 bytes of fp32"));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("an abort stops every waiting device with the reason", "[runtime]") {
  RendezvousMatcher matcher(3, 30s);
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = on_threads(3, [&](int d) {
    if (d == 2) {
      std::this_thread::sleep_for(50ms);
      matcher.abort("device 2, step 4: CUDA error");
      return;
    }
    if (d == 0) {
      matcher.begin(0, 1);
      matcher.add(0, OpKind::kSend, 2, act(0, 0, 4), nullptr, nullptr);
      matcher.close(0);
      matcher.post(0);
    } else {
      matcher.agree(1, true);
    }
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK_THAT(errors[0], Catch::Contains("device 0, step 1: stopped while waiting for device 2 to receive") &&
                            Catch::Contains("because another device failed: device 2, step 4: CUDA error"));
  CHECK_THAT(errors[1], Catch::Contains("stopped while waiting for the agreement of all devices: device 2, step 4"));
  CHECK(errors[2].empty());
  CHECK(matcher.aborted());
  CHECK(matcher.reason() == "device 2, step 4: CUDA error");
}

TEST_CASE("agree is the AND of all devices, and reset clears an abort once all devices call it", "[runtime]") {
  RendezvousMatcher matcher(3, 5s);
  std::vector<int> results(3, -1);
  auto errors = on_threads(3, [&](int d) { results[static_cast<std::size_t>(d)] = matcher.agree(d, d != 1); });
  CHECK(errors == std::vector<std::string>{"", "", ""});
  CHECK(results == std::vector<int>{0, 0, 0});
  errors = on_threads(3, [&](int d) { results[static_cast<std::size_t>(d)] = matcher.agree(d, true); });
  CHECK(results == std::vector<int>{1, 1, 1});

  matcher.abort("boom");
  CHECK_THROWS_WITH(matcher.agree(0, true), Catch::Contains("boom"));
  std::atomic<int> ran{0};
  errors = on_threads(3, [&](int d) { matcher.reset(d, [&] { ++ran; }); });
  CHECK(errors == std::vector<std::string>{"", "", ""});
  CHECK(ran == 1);
  CHECK_FALSE(matcher.aborted());
  errors = on_threads(3, [&](int d) { results[static_cast<std::size_t>(d)] = matcher.agree(d, true); });
  CHECK(results == std::vector<int>{1, 1, 1});

  // A failure of the last arrival's work is reported to every device.
  errors = on_threads(3, [&](int d) { matcher.reset(d, [] { throw Error("no communicator"); }); });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("resetting the transport failed: no communicator"));
}

TEST_CASE("a device whose own part of the reset failed still meets the others: every reset names it, none waits",
          "[runtime]") {
  // A minute's timeout: were device 1's failure to keep it from the barrier, the others would wait that long and
  // name a timeout, not the failure.
  RendezvousMatcher matcher(3, 60s);
  matcher.abort("device 1, step 2: injected");
  std::atomic<int> ran{0};
  auto errors = on_threads(3, [&](int d) {
    matcher.reset(d, [&] { ++ran; }, d == 1 ? "its stream did not drain" : "");
  });
  for (int d = 0; d < 3; ++d)
    CHECK(errors[static_cast<std::size_t>(d)] ==
          "device " + std::to_string(d) + ": resetting the transport failed: device 1: its stream did not drain");
  CHECK(ran == 0);  // the work of a whole reset is not done for a device that cannot be used
  // The failure belongs to that reset: the next one, with every device's part done, succeeds.
  errors = on_threads(3, [&](int d) { matcher.reset(d, [&] { ++ran; }); });
  CHECK(errors == std::vector<std::string>(3));
  CHECK(ran == 1);
}

TEST_CASE("misuse of a group is an error naming the device and step", "[runtime]") {
  RendezvousMatcher matcher(2, 1s);
  CHECK_THROWS_WITH(matcher.add(0, OpKind::kSend, 1, act(0, 0, 4), nullptr, nullptr), Catch::Contains("outside a group"));
  CHECK_THROWS_WITH(matcher.close(0), Catch::Contains("group_end without group_begin"));
  matcher.begin(0, 5);
  CHECK_THROWS_WITH(matcher.begin(0, 6), Catch::Contains("device 0, step 6: group_begin inside an open group"));
  CHECK_THROWS_WITH(matcher.add(0, OpKind::kSend, 2, act(0, 0, 4), nullptr, nullptr),
                    Catch::Contains("peer 2 is not a device (devices are 0..1)"));
  CHECK_THROWS_WITH(matcher.add(0, OpKind::kSend, 0, act(0, 0, 4), nullptr, nullptr), Catch::Contains("itself"));
  CHECK_FALSE(matcher.close(0));  // an empty group posts nothing
  CHECK_THROWS_WITH(RendezvousMatcher(0, 1s), Catch::Contains("at least 1"));
}

TEST_CASE("agree and reset share one timed barrier: a device that gives up leaves it, and all can meet again",
          "[runtime]") {
  RendezvousMatcher matcher(3, 100ms);
  // Device 2 never resets: the others give up, naming it (and device 1's own failure goes with that reset).
  auto errors = on_threads(3, [&](int d) {
    if (d != 2) matcher.reset(d, [] {}, d == 1 ? "its stream did not drain" : "");
  });
  for (int d = 0; d < 2; ++d)  // (the first to give up is missing for the second too)
    CHECK_THAT(errors[static_cast<std::size_t>(d)],
               Catch::StartsWith("device " + std::to_string(d) + ": timed out after 100 ms waiting for device") &&
                   Catch::EndsWith("2 to reset the transport"));
  // Nobody is left half-arrived: all three meet now, for a reset and for an agreement.
  errors = on_threads(3, [&](int d) { matcher.reset(d); });
  CHECK(errors == std::vector<std::string>(3));
  errors = on_threads(3, [&](int d) {
    if (d == 0) matcher.agree(0, true);
  });
  CHECK_THAT(errors[0], Catch::Contains("waiting for device 1, 2 to reach the agreement of all devices"));
  std::vector<int> results(3, -1);
  errors = on_threads(3, [&](int d) { results[static_cast<std::size_t>(d)] = matcher.agree(d, d != 2); });
  CHECK(errors == std::vector<std::string>(3));
  CHECK(results == std::vector<int>{0, 0, 0});
}
