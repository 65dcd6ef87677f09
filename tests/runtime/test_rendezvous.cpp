// The host-side matching of every transport of one process (runtime/rendezvous.hpp):
// NCCL's rules, the match hook, checks, timeouts, abort, agreement and reset; and
// the CPU pipeline run through it (a memcpy hook), equal to sequential training.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/runtime/rendezvous.hpp"
#include "pipeweave/runtime/executor.hpp"
#include "pipeweave/runtime/mlp.hpp"
#include "pipeweave/runtime/sequential.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/generators.hpp"

using namespace pipeweave;
using namespace std::chrono_literals;
using pipeweave::detail::RendezvousMatcher;

namespace {

Message act(int stage, int micro_batch, std::size_t bytes) { return {{TensorKind::kActivation, stage, micro_batch}, bytes}; }
Message grad(int stage, int micro_batch, std::size_t bytes) { return {{TensorKind::kGradient, stage, micro_batch}, bytes}; }

// A Transport over the matcher whose hook copies on the host at the match, as the
// virtual-device transport enqueues its cudaMemcpyAsync there.
struct Shared {
  explicit Shared(int devices, std::chrono::milliseconds timeout)
      : matcher(devices, timeout, {this, &Shared::copy}) {}
  static void copy(void* context, int send_device, int send_op, int recv_device, int recv_op) {
    auto* s = static_cast<Shared*>(context);
    const auto& so = s->matcher.ops(send_device)[static_cast<std::size_t>(send_op)];
    const auto& ro = s->matcher.ops(recv_device)[static_cast<std::size_t>(recv_op)];
    if (ro.message.bytes > 0) std::memcpy(ro.dst, so.src, ro.message.bytes);
    ++s->matches;
  }
  RendezvousMatcher matcher;
  std::atomic<int> matches{0};
};

class HostEndpoint {
 public:
  HostEndpoint(std::shared_ptr<Shared> s, int device) : s_(std::move(s)), device_(device) {}
  int device() const { return device_; }
  int devices() const { return s_->matcher.devices(); }
  void group_begin(int step) { s_->matcher.begin(device_, step); }
  void send(int peer, const Message& m, const void* data) { s_->matcher.add(device_, OpKind::kSend, peer, m, data, nullptr); }
  void recv(int peer, const Message& m, void* data) { s_->matcher.add(device_, OpKind::kRecv, peer, m, nullptr, data); }
  void group_end() {
    if (s_->matcher.close(device_)) s_->matcher.post(device_);
  }
  bool agree(bool ok) { return s_->matcher.agree(device_, ok); }
  void abort(std::string_view reason) noexcept { s_->matcher.abort(reason); }
  void reset() { s_->matcher.reset(device_); }

 private:
  std::shared_ptr<Shared> s_;
  int device_;
};
static_assert(Transport<HostEndpoint>);

std::vector<HostEndpoint> make_ends(int devices, std::chrono::milliseconds timeout = 5s) {
  auto s = std::make_shared<Shared>(devices, timeout);
  std::vector<HostEndpoint> ends;
  for (int d = 0; d < devices; ++d) ends.emplace_back(s, d);
  return ends;
}

template <class F>
std::vector<std::string> on_threads(int devices, F fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(devices));
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      try {
        fn(d);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(d)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("the matcher pairs sends and receives in FIFO order per directed pair", "[cuda]") {
  auto ends = make_ends(2);
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

TEST_CASE("the match hook runs once per pair, with both sides' operations", "[cuda]") {
  struct Seen {
    std::vector<std::array<int, 4>> calls;
    std::mutex m;
  } seen;
  RendezvousMatcher matcher(3, 5s, {&seen, [](void* c, int sd, int so, int rd, int ro) {
                                auto* s = static_cast<Seen*>(c);
                                std::lock_guard lock(s->m);
                                s->calls.push_back({sd, so, rd, ro});
                              }});
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
}

TEST_CASE("a mismatched message is an error naming both sides, before the hook runs", "[cuda]") {
  std::atomic<int> hooks{0};
  RendezvousMatcher matcher(2, 2s, {&hooks, [](void* c, int, int, int, int) { ++*static_cast<std::atomic<int>*>(c); }});
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
  CHECK_THAT(both, Catch::Contains("device 1, step 3 expects from device 0 activation(stage 0, micro-batch 0), 16 bytes"));
  CHECK_THAT(both, Catch::Contains("sent by device 0 at its step 3, is activation(stage 0, micro-batch 1), 16 bytes"));
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
  CHECK_THAT(errors[0] + errors[1], Catch::Contains("12 bytes, but the message it matches"));
}

TEST_CASE("a wait longer than the timeout names the device, the step and the message", "[cuda]") {
  RendezvousMatcher matcher(2, 100ms);
  matcher.begin(0, 7);
  matcher.add(0, OpKind::kRecv, 1, grad(3, 2, 64), nullptr, nullptr);
  matcher.close(0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(matcher.post(0), Catch::Contains("device 0, step 7: timed out after 100 ms waiting for device 1 "
                                                     "to send gradient(stage 3, micro-batch 2), 64 bytes"));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("an abort stops every waiting device with the reason", "[cuda]") {
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

TEST_CASE("agree is the AND of all devices, and reset clears an abort once all devices call it", "[cuda]") {
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

TEST_CASE("misuse of a group is an error naming the device and step", "[cuda]") {
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

TEST_CASE("the CPU pipeline through the matcher equals sequential training bit for bit", "[cuda]") {
  const MlpSpec spec = MlpSpec::uniform(8, 12, 16, 6, 3);
  const RegressionTask task = make_regression_task(spec, 32, 5);
  const HostModel init = init_mlp(spec);
  const OptimizerConfig opt{OptimizerKind::kAdam, 0.01f};
  cpu::set_blas_threads(1);
  for (const auto& [kind, P, V, M] : {std::tuple{ScheduleKind::kInterleaved1F1B, 2, 2, 4},
                                      std::tuple{ScheduleKind::kOneFOneB, 4, 1, 8},
                                      std::tuple{ScheduleKind::kGPipe, 2, 1, 2}}) {
    const Program program = make_schedule(kind, P, V, M);
    std::vector<HostEndpoint> ends = make_ends(P);
    auto make_device = [&](int d) {
      DeviceParts<cpu::CpuBackend, HostEndpoint, MlpChunk<cpu::CpuBackend>> parts{cpu::CpuBackend{}, ends[static_cast<std::size_t>(d)], {}};
      for (int c = 0; c < V; ++c)
        parts.chunks.emplace_back(parts.backend, spec, chunk_layers(program.shape, spec.layers(), d, c), init);
      return parts;
    };
    Pipeline<cpu::CpuBackend, HostEndpoint, MlpChunk<cpu::CpuBackend>> pipe(program, make_device, {32, opt});
    SequentialTrainer<cpu::CpuBackend> reference(cpu::CpuBackend{}, spec, init, 32, M, opt);
    for (int step = 0; step < 3; ++step) {
      const double loss = pipe.train_step(task.inputs, task.targets).loss;
      CHECK(loss == reference.train_step(task.inputs, task.targets));
    }
    HostModel got;
    got.layers.resize(static_cast<std::size_t>(spec.layers()));
    pipe.for_each_device([&](int, auto& parts) {
      for (const auto& chunk : parts.chunks) chunk.download(parts.backend, got);
    });
    CHECK(got == reference.weights());
  }
}
