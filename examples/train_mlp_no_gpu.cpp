// train_mlp's GPU path in a build without the CUDA backend: there is none.
#include "train_mlp_gpu.hpp"

#include "pipeweave/schedule/error.hpp"

namespace train_mlp_gpu {

bool built() { return false; }
int gpus() { return 0; }
std::string check(const Settings&, int) { return "this build has no CUDA backend"; }
std::string describe(const Settings&, int) { return "none"; }

std::unique_ptr<Pipeline> make_pipeline(const pipeweave::Program&, const pipeweave::MlpSpec&, const pipeweave::HostModel&,
                                        const pipeweave::PipelineOptions&, const Settings&) {
  throw pipeweave::Error("this build has no CUDA backend");
}

std::unique_ptr<Reference> make_reference(const pipeweave::MlpSpec&, const pipeweave::HostModel&, int, int, int,
                                          const pipeweave::OptimizerConfig&, const Settings&) {
  throw pipeweave::Error("this build has no CUDA backend");
}

}  // namespace train_mlp_gpu
