// Fuzz target: the PyTorch CSV importer (analysis/pytorch_csv.hpp) on arbitrary
// bytes. Any input ends in a program or a pipeweave::Error with a message; a
// program's actions lie inside its shape; the same text read as compute_comms rows
// (analysis/comms.hpp) holds that program, and each semantics' proof of the rows
// ends in a verdict; a program that verifies survives a round trip through the CSV
// writer, simulates to a finite, positive makespan, and its with_comms() placement
// proves and survives a round trip; one that does not is refused by the simulator
// with an Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz.hpp"
#include "pipeweave/analysis/comms.hpp"
#include "pipeweave/analysis/metrics.hpp"
#include "pipeweave/analysis/pytorch_csv.hpp"
#include "pipeweave/analysis/simulate.hpp"
#include "pipeweave/schedule/generators.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pf = pipeweave::fuzz;
using namespace pipeweave;

namespace {

// Verification and simulation cost more than linear time in the number of devices
// (see the schedule core's scaling issue); the larger programs a file can hold
// are only parsed, to bound the time per input.
constexpr int kMaxVerifiedDevices = 64;
constexpr std::size_t kMaxVerifiedActions = 4096;

void check(pf::Input& in) {
  const Program p = parse_pytorch_csv(in.text());
  const ScheduleShape& s = p.shape;
  if (static_cast<int>(p.devices.size()) != s.devices) pf::finding("the program's device lists do not match its shape");
  std::size_t actions = 0;
  for (const auto& device : p.devices) {
    actions += device.size();
    for (const Action& a : device)
      if (a.chunk < 0 || a.chunk >= s.chunks || a.micro_batch < 0 || a.micro_batch >= s.micro_batches)
        pf::finding("an imported action lies outside the program's shape: " + to_string(a));
  }
  if (s.devices > kMaxVerifiedDevices || actions > kMaxVerifiedActions) return;
  // The same text as compute_comms rows: every semantics' proof ends in a verdict, each failure a message.
  const CommsProgram rows = parse_pytorch_comms(in.text());
  if (!(rows.program == p)) pf::finding("the compute_comms import's program is not the CSV import's");
  for (const CommOrderRow& order : kCommOrderRows)
    if (const CommsVerdict v = prove_comms(rows, order.order); !v && v.message.empty())
      pf::finding("prove_comms fails without a message");
  if (const VerifyResult r = verify(p); !r) return pf::refused_by_simulate(p, r);
  // A verified program's placement proves and survives a round trip (with_comms refuses only actions PyTorch lacks).
  const CommsProgram placed = with_comms(p);
  if (!(parse_pytorch_comms(to_pytorch_comms_csv(placed)).rows == placed.rows))
    pf::finding("a placement changes in a compute_comms round trip");
  if (!(parse_pytorch_csv(to_pytorch_csv(p)) == p)) pf::finding("a verified program changes in a CSV round trip");
  const double m = makespan(simulate(p));
  if (!pf::finite(m) || !(m > 0)) pf::finding("a verified program simulates to makespan " + std::to_string(m));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return pf::test_one(data, size, check);
}

// The files print_schedule --format csv writes (to_pytorch_csv) for small shapes of every kind.
pf::Seeds fuzz_seeds() {
  pf::Seeds seeds;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B})
    for (int P : {1, 2, 3, 4})
      for (int M : {P, 2 * P})
        seeds.push_back(to_pytorch_csv(
            make_schedule(kind, P, kind == ScheduleKind::kInterleaved1F1B ? 2 : 1, M)));
  // compute_comms rows: with_comms() placements.
  for (const char* kind : {"1f1b", "interleaved", "zb-v"})
    seeds.push_back(to_pytorch_comms_csv(with_comms(make_schedule(kind, 2, default_chunks(schedule_kind(kind)), 4))));
  return seeds;
}
