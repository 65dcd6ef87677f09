// checkpoint_cpu: how fast is a checkpoint written, against plain sequential
// writes of the same bytes to the same disk, and how long does the pipeline wait
// for it? For each model size: a CPU pipeline of the MLP trains one step (Adam,
// so the state holds two moments per parameter); then, in each round, in
// alternating order:
// - checkpoint: a BackgroundSaver's save: the pipeline's state copied to the host
//   (copy_state() into the saver's memory, the only part that holds the
//   pipeline), then, on the saver's thread, save_mlp (every device's two files
//   written at once, each fsynced, the manifest, the directory fsynced and
//   renamed, latest moved; the newest kept);
// - plain: the same bytes written to one file in 8 MiB writes, then fsynced.
//
//   checkpoint_cpu [--hidden 512,1024] [--layers 16] [--devices 4] [--rounds 3] [--dir DIR] [--json]
//
// Columns (medians over the rounds): the bytes; plain and checkpoint bandwidth
// and their ratio (the goal: at least 0.5); the copy off the devices and the
// save's write in ms; blocked/plain, the pipeline's wait (the copy; the write
// runs beside the training) over the plain write of the same bytes (the goal:
// at most 1). #wrong counts the sizes whose checkpoint does not
// read back equal to the state saved.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/tool.hpp"
#include "pipeweave/checkpoint/background.hpp"
#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/cpu/pipeline.hpp"
#include "pipeweave/schedule/generators.hpp"

namespace {

using namespace pipeweave;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Writes every vector of `state` into one new file at `path` in writes of at most
// 8 MiB, fsyncs and closes it; returns the bytes.
std::size_t plain_write(const fs::path& path, const TrainingState& state) {
  checkpoint::detail::Fd f(path, O_WRONLY | O_CREAT | O_EXCL, "create");
  std::size_t bytes = 0;
  auto put = [&](const std::vector<float>& v) {
    const char* p = reinterpret_cast<const char*>(v.data());
    for (std::size_t left = v.size() * sizeof(float); left > 0;) {
      const std::size_t n = std::min<std::size_t>(left, std::size_t{8} << 20);
      f.write_all(p, n);
      p += n;
      left -= n;
      bytes += n;
    }
  };
  for (const StageState& s : state.stages) {
    put(s.parameters);
    for (const auto& b : s.optimizer) put(b);
  }
  f.sync();
  f.close();
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint writes against plain sequential writes of the same bytes to the same disk, and how long "
               "the pipeline waits for a checkpoint."};
  app.set_help_flag("-h,--help", "Print this help and exit");
  std::string hidden_list = "512,1024", dir = "checkpoint_cpu.tmp";
  int layers = 16, devices = 4, rounds = 3;
  bool json = false;
  app.add_option("--hidden", hidden_list, "Features of every layer, a list (default 512,1024)");
  app.add_option("--layers", layers, "Layers, a multiple of --devices (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--devices", devices, "Pipeline devices, one file pair each (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "Rounds of each write (default 3)")->check(CLI::Range(1, 1000));
  app.add_option("--dir", dir, "Where to write: a directory on the disk to measure, removed at the end "
                               "(default checkpoint_cpu.tmp)");
  app.add_flag("--json", json, "Print the rows as JSON");
  if (const auto status = tool::parse(app, argc, argv, "checkpoint_cpu")) return *status;
  std::vector<int> hiddens;
  try {
    hiddens = tool::int_list(hidden_list, "--hidden", 1, kMaxWidth);
    if (layers % devices != 0) throw Error("--layers must be a multiple of --devices");
  } catch (const tool::BadArgument& e) {
    return tool::usage_error("checkpoint_cpu", e.what());
  } catch (const Error& e) {
    return tool::usage_error("checkpoint_cpu", e.what());
  }
  const fs::path root = dir;
  if (fs::exists(root)) return tool::usage_error("checkpoint_cpu", "--dir " + dir + " exists; name a new directory");

  tool::Report report({{"hidden", "", "hidden", 7},
                       {"MB", "", "megabytes", 8, 1},
                       {"plain", "MB/s", "plain_mb_per_s", 9, 0},
                       {"ckpt", "MB/s", "checkpoint_mb_per_s", 9, 0},
                       {"ckpt/plain", "", "checkpoint_over_plain", 11, 2},
                       {"copy", "ms", "copy_ms", 8, 1},
                       {"save", "ms", "save_ms", 8, 1},
                       {"blocked/plain", "", "blocked_over_plain", 14, 2},
                       {"#wrong", "", "wrong", 7}});
  long long wrong_total = 0;
  try {
    fs::create_directories(root);
    for (int hidden : hiddens) {
      std::fprintf(stderr, "checkpoint_cpu: hidden %d ...\n", hidden);
      const MlpSpec spec = MlpSpec::uniform(layers, hidden, hidden, hidden);
      const OptimizerConfig opt{OptimizerKind::kAdam, 1e-3f};
      const Program program = make_schedule(ScheduleKind::kOneFOneB, devices, 1, devices);
      const int rows = 4 * devices;
      const RegressionTask task = make_regression_task(spec, rows, 1);
      auto pipe = make_mlp_pipeline(program, spec, init_mlp(spec), {rows, opt});
      pipe->train_step(task.inputs, task.targets);
      const checkpoint::MlpRun run{spec, opt, rows, 1};
      std::vector<double> plain_s, save_s, copy_s;
      std::size_t bytes = 0;
      long long wrong = 0;
      checkpoint::BackgroundSaver saver(root / "ckpt", run, program.shape, 1, "threads");
      TrainingState state;  // what the plain write writes: the same bytes
      for (int r = 0; r < rounds; ++r) {
        auto checkpoint_round = [&] {
          saver.save(r, [&](TrainingState& s) { pipe->copy_state(s); });
          const checkpoint::SaveTimes t = *saver.wait();
          copy_s.push_back(t.copy_s);
          save_s.push_back(t.write_s);
          if (r == 0) wrong += checkpoint::load_mlp(t.directory, run, program.shape).state == pipe->state() ? 0 : 1;
        };
        auto plain_round = [&] {
          pipe->copy_state(state);
          const auto t0 = Clock::now();
          bytes = plain_write(root / "plain.bin", state);
          plain_s.push_back(seconds_since(t0));
          fs::remove(root / "plain.bin");
        };
        if (r % 2 == 0) {
          checkpoint_round();
          plain_round();
        } else {
          plain_round();
          checkpoint_round();
        }
      }
      const double mb = static_cast<double>(bytes) / 1e6, plain = tool::median(plain_s), save = tool::median(save_s),
                   copy = tool::median(copy_s);
      report.add({static_cast<long long>(hidden), mb, mb / plain, mb / save, plain / save, 1e3 * copy, 1e3 * save,
                  copy / plain, wrong});
      wrong_total += wrong;
    }
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(root, ec);
    std::fprintf(stderr, "checkpoint_cpu: %s\n", e.what());
    return 1;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  if (json) {
    std::printf("%s", report.json("checkpoint_cpu", {{"layers", std::to_string(layers)},
                                                     {"devices", std::to_string(devices)},
                                                     {"rounds", std::to_string(rounds)}})
                          .c_str());
  } else {
    std::printf("%s", report.text({"checkpoint_cpu: " + std::to_string(layers) + " layers, " + std::to_string(devices) +
                                       " devices, Adam (parameters and two moments), medians of " +
                                       std::to_string(rounds) + " rounds in " + dir,
                                   "ckpt/plain: checkpoint bandwidth over plain writes of the same bytes (goal >= 0.5); "
                                   "blocked/plain: the pipeline's wait (the copy; the write runs beside the training) over the plain write (goal <= 1)"},
                                  tool::wrong_footer("checkpoints read back", wrong_total))
                          .c_str());
  }
  return wrong_total == 0 ? 0 : 1;
}
