// handover_cpu: how long does a hand-over between two device threads take? A
// ping-pong through the CPU transport (the rendezvous fabric of the CPU pipeline):
// device 0 sends a message of B bytes to device 1, which sends it back. The round
// trip is device 0's time from opening the group of its send to the end of the
// group of its receive: two matches, two copies and two hand-overs to a waiting
// thread. Each size runs with each spin time: 0 parks a waiting thread at once
// (every hand-over a wake-up), the default spins first (runtime/matcher.hpp).
//
//   handover_cpu [--bytes 64,65536] [--spin-us 0,2000] [--warmup 500] [--iters 5000] [--json]
//
// Columns: the median round trip and its 10th and 90th percentiles, in
// microseconds; #wrong counts the messages whose payload arrived different from
// what was sent (each message carries its round's pattern).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/cpu/transport.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;

// The value of word k of the message of round i: every round and every word differ.
unsigned pattern(int round, std::size_t k) {
  return static_cast<unsigned>(round) * 2654435761u + static_cast<unsigned>(k);
}

void fill(std::vector<unsigned>& words, int round) {
  for (std::size_t k = 0; k < words.size(); ++k) words[k] = pattern(round, k);
}
long long mismatches(const std::vector<unsigned>& words, int round) {
  long long n = 0;
  for (std::size_t k = 0; k < words.size(); ++k) n += words[k] != pattern(round, k);
  return n > 0 ? 1 : 0;
}

struct Result {
  std::vector<double> round_trip_us;  // device 0's, timed rounds only
  long long wrong = 0;
};

// `rounds` ping-pongs of `bytes`, waiting threads spinning for up to `spin`; the
// first `warmup` are not timed.
Result ping_pong(std::size_t bytes, std::chrono::microseconds spin, int warmup, int rounds) {
  auto ends = cpu::make_rendezvous(2, std::chrono::milliseconds(30000), spin);
  const std::size_t words = std::max<std::size_t>(1, bytes / sizeof(unsigned));
  const Message ping{{TensorKind::kActivation, 0, 0}, words * sizeof(unsigned)};
  const Message pong{{TensorKind::kGradient, 1, 0}, words * sizeof(unsigned)};
  Result result;
  long long wrong_1 = 0;
  std::thread device_1([&] {
    std::vector<unsigned> buffer(words);
    for (int i = 0; i < warmup + rounds; ++i) {
      ends[1].group_begin(2 * i);
      ends[1].recv(0, ping, buffer.data());
      ends[1].group_end();
      wrong_1 += mismatches(buffer, i);
      ends[1].group_begin(2 * i + 1);
      ends[1].send(0, pong, buffer.data());
      ends[1].group_end();
    }
  });
  std::vector<unsigned> out(words), back(words);
  for (int i = 0; i < warmup + rounds; ++i) {
    fill(out, i);
    const auto t0 = Clock::now();
    ends[0].group_begin(2 * i);
    ends[0].send(1, ping, out.data());
    ends[0].group_end();
    ends[0].group_begin(2 * i + 1);
    ends[0].recv(1, pong, back.data());
    ends[0].group_end();
    const auto t1 = Clock::now();
    result.wrong += mismatches(back, i);
    if (i >= warmup) result.round_trip_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  device_1.join();
  result.wrong += wrong_1;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Round trip of a small message between two device threads through the CPU transport (ping-pong)."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::string sizes = "64,65536", spins = "0," + std::to_string(kDefaultSpin.count());
  int warmup = 500, iters = 5000;
  bool json = false;
  app.add_option("--bytes", sizes, "Comma-separated message sizes in bytes (default 64,65536)");
  app.add_option("--spin-us", spins,
                 "Comma-separated spin times of a waiting thread in microseconds; 0 parks at once (default 0," +
                     std::to_string(kDefaultSpin.count()) + ")");
  app.add_option("--warmup", warmup, "Untimed round trips first (default 500)")->check(CLI::Range(0, 1000000));
  app.add_option("--iters", iters, "Timed round trips (default 5000)")->check(CLI::Range(1, 10000000));
  app.add_flag("--json", json, "Print the rows as JSON instead of the table");
  if (const auto status = tool::parse(app, argc, argv, "handover_cpu")) return *status;
  std::vector<int> byte_list, spin_list;
  try {
    byte_list = tool::int_list(sizes, "--bytes", 4, 1 << 28);
    spin_list = tool::int_list(spins, "--spin-us", 0, 1000000);
  } catch (const tool::BadArgument& e) {
    return tool::usage_error("handover_cpu", e.what());
  }

  tool::Report report({{"spin", "us", "spin_us", 6},
                       {"bytes", "B", "bytes", 10},
                       {"rt_p10", "us", "round_trip_p10_us", 9, 2},
                       {"rt_median", "us", "round_trip_median_us", 10, 2},
                       {"rt_p90", "us", "round_trip_p90_us", 9, 2},
                       {"#wrong", "msgs", "wrong", 7}});
  long long wrong = 0;
  try {
    for (int bytes : byte_list) {
      for (int spin : spin_list) {
        std::fprintf(stderr, "handover_cpu: %d bytes, spin %d us\n", bytes, spin);
        const Result r = ping_pong(static_cast<std::size_t>(bytes), std::chrono::microseconds(spin), warmup, iters);
        wrong += r.wrong;
        report.add({static_cast<long long>(spin), static_cast<long long>(bytes), tool::percentile(r.round_trip_us, 0.1),
                    tool::median(r.round_trip_us), tool::percentile(r.round_trip_us, 0.9), r.wrong});
      }
    }
  } catch (const Error& e) {
    std::cerr << "handover_cpu: " << e.what() << "\n";
    return 2;
  }
  const unsigned cores = std::thread::hardware_concurrency();
  if (json) {
    std::fputs(report
                   .json("handover_cpu", {{"warmup", std::to_string(warmup)},
                                          {"iters", std::to_string(iters)},
                                          {"cores", std::to_string(cores)}})
                   .c_str(),
               stdout);
  } else {
    std::fputs(report
                   .text({"handover_cpu: ping-pong of two device threads through the CPU transport (rendezvous)",
                          "round trip = device 0's send group + receive group; " + std::to_string(warmup) +
                              " warm-up + " + std::to_string(iters) + " timed round trips; " + std::to_string(cores) +
                              " cores",
                          ""},
                         tool::wrong_footer("messages whose payload arrived different, all rows", wrong))
                   .c_str(),
               stdout);
  }
  return wrong == 0 ? 0 : 1;
}
