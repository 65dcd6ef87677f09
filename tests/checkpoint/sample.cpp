// checkpoint_sample DIR: trains the MLP 3 steps through interleaved 1F1B (P = 2,
// V = 2, Adam), saves a checkpoint into DIR/checkpoint, and writes what the run
// holds, taken from the sequential reference trained beside it (equal bit for
// bit, and read through another path than the checkpoint's): DIR/expected.f32,
// every tensor's float32 values back to back, and DIR/expected.json, each
// tensor's name -> [offset in floats, shape]. check_checkpoint.py safetensors
// reads the checkpoint with the safetensors Python library and compares.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace pw = pipeweave;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_sample DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    const pw::MlpSpec spec = pw::MlpSpec::uniform(8, 5, 12, 3, 7);
    const pw::OptimizerConfig opt{pw::OptimizerKind::kAdam, 0.01f};
    const pw::RegressionTask task = pw::make_regression_task(spec, 16, 2);
    const pw::Program program = pw::make_schedule(pw::ScheduleKind::kInterleaved1F1B, 2, 2, 4);
    auto pipe = pw::make_mlp_pipeline(program, spec, pw::init_mlp(spec), {16, opt});
    pw::SequentialTrainer<pw::cpu::CpuBackend> reference(pw::cpu::CpuBackend{}, spec, pw::init_mlp(spec), 16, 4, opt);
    for (int s = 0; s < 3; ++s) {
      pipe->train_step(task.inputs, task.targets);
      reference.train_step(task.inputs, task.targets);
    }
    pw::checkpoint::save_mlp(dir / "checkpoint", {spec, opt, 16, 2}, program.shape, pipe->state(), 3, 0, "threads");
    const pw::TrainingState held = reference.state();  // one stage: every layer
    const pw::StageState& all = held.stages.at(0);
    const std::vector<std::string> names = pw::checkpoint::state_names(opt);
    nlohmann::ordered_json index;
    std::vector<float> values;
    for (const pw::checkpoint::LayerTensor& t : pw::checkpoint::layer_tensors(spec, {0, spec.layers()})) {
      auto add = [&](const std::string& name, const std::vector<float>& from) {
        index[name] = {values.size(), t.shape};
        values.insert(values.end(), from.begin() + static_cast<std::ptrdiff_t>(t.offset),
                      from.begin() + static_cast<std::ptrdiff_t>(t.offset + t.count));
      };
      add(t.name, all.parameters);
      for (std::size_t k = 0; k < names.size(); ++k) add(t.name + "." + names[k], all.optimizer[k]);
    }
    std::ofstream(dir / "expected.f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
    std::ofstream(dir / "expected.json") << index.dump();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_sample: %s\n", e.what());
    return 1;
  }
}
