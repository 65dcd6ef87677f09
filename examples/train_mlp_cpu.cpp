// train_mlp's CPU backend: one thread per device, the rendezvous transport, the
// sequential reference on the calling thread.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/runtime/replicas.hpp"
#include "train_mlp.hpp"

namespace train_mlp {
namespace {

namespace pw = pipeweave;

int cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

class CpuThreads final : public Backend {
 public:
  std::string describe(const pw::tool::TrainingFlags&, int) const override {
    return std::string(pw::cpu::CpuBackend{}.name()) + ", one thread per device, OpenBLAS pinned to 1 thread each";
  }
  // On fewer cores than threads the halves of a pair share cores, which fitted costs do not know.
  bool pairs_at_once(int devices) const override { return cores() >= 2 * devices; }
  // P device threads on C cores compute at most min(P, C) actions at once.
  std::string step_bound(int devices, double bubble) const override {
    const int c = cores();
    char line[320];
    if (devices > c)
      std::snprintf(line, sizeof line,
                    "%d device threads share %d cores: at most %d compute at once, so a pipelined step takes at least "
                    "1/%d of the sequential one, not 1/%d, and hand-overs between threads of one core cost a wake-up "
                    "each",
                    devices, c, c, c, devices);
    else
      std::snprintf(line, sizeof line,
                    "%d device threads on %d cores: a pipelined step takes at least (1 + bubble) / %d = %.2f of the "
                    "sequential one (the simulated bubble)",
                    devices, c, devices, (1 + bubble) / devices);
    return line;
  }
  std::unique_ptr<Pipeline> make_pipeline(const pw::Program& program, const pw::MlpSpec& spec, const pw::HostModel& init,
                                          const pw::PipelineOptions& options,
                                          const pw::tool::TrainingFlags&) const override {
    auto p = pw::make_mlp_pipeline(program, spec, init, options, pw::cpu::CpuOptions{pw::TransportKind::kRendezvous, 1});
    const bool in_place =
        dynamic_cast<const pw::HostReplicaGroup<pw::cpu::CpuBackend>*>(p->replica_collective(0)) != nullptr;
    return std::make_unique<PipelineOf<pw::cpu::CpuMlpPipeline>>(
        std::move(p), in_place ? "in place in host memory, in replica order" : "through a host copy, in replica order");
  }
  std::unique_ptr<Reference> make_reference(const pw::MlpSpec& spec, const pw::HostModel& init, int rows,
                                            int micro_batches, int replicas, const pw::OptimizerConfig& optimizer,
                                            const pw::tool::TrainingFlags&) const override {
    return std::make_unique<ReferenceOf<pw::SequentialTrainer<pw::cpu::CpuBackend>>>(
        std::make_unique<pw::SequentialTrainer<pw::cpu::CpuBackend>>(pw::cpu::CpuBackend{}, spec, init, rows,
                                                                     micro_batches * replicas, optimizer),
        replicas);
  }
};

const CpuThreads backend{};
const Registry::Add registered(pw::tool::BackendKind::kCpu, backend);

}  // namespace
}  // namespace train_mlp
