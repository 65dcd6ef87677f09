// What train_mlp_mpi's backends share: the run's settings as parsed, the model,
// task and program they make, one rank's training loop, written once for any
// multi-process pipeline and sequential reference, and the interface of a
// backend: each is a translation unit that registers itself (the CPU's in
// train_mlp_mpi.cpp, the CUDA one's in train_mlp_mpi_cuda.cu where the build
// has CUDA); --backend finds them by the rows of tool::kBackendRows.
#pragma once

#include "pipeweave/mpi/bootstrap.hpp"  // first: it includes <mpi.h> without the C++ bindings

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/training.hpp"
#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/checkpoint/mlp.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/model/mlp_pipeline.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/model/sequential.hpp"
#include "pipeweave/mpi/checkpoint.hpp"
#include "pipeweave/mpi/pipeline.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/allocation.hpp"
#include "pipeweave/schedule/error.hpp"

namespace train_mlp_mpi {

/// The settings of a run, as given on the command line: the training tools'
/// flags (with this tool's defaults) and where the ranks sit.
struct Settings : pipeweave::tool::TrainingFlags {
  std::string rank_layout{pipeweave::rank_layout_name(pipeweave::RankLayout::kDpAdjacent)};
  Settings() {
    hidden = 256;
    batch = 1024;
    steps = 50;
    timeout_ms = 60000;
  }
};

/// What a run trains: the program for `ranks` / D devices, the model, its optimizer and its task.
struct Run {
  Settings settings;
  pipeweave::Program program;
  pipeweave::MlpSpec spec;
  pipeweave::OptimizerConfig optimizer;
  pipeweave::HostModel init;
  pipeweave::RegressionTask task;
  std::chrono::milliseconds timeout{};

  /// Throws pipeweave::Error when the settings do not make a program or a model,
  /// when the ranks do not split into the replicas or the batch into their
  /// micro-batches, or when the model's layers do not split into the program's stages.
  Run(const Settings& s, int ranks) : settings(s), timeout(s.timeout_ms) {
    const int D = s.replicas;
    if (ranks % D != 0)
      throw pipeweave::Error("--replicas " + std::to_string(D) + ": " + std::to_string(ranks) +
                             " ranks do not split into " + std::to_string(D) +
                             " replicas of one pipeline (start P x D ranks: mpirun -n a multiple of " +
                             std::to_string(D) + ")");
    if (s.batch % (D * s.micro_batches) != 0)
      throw pipeweave::Error("--batch " + std::to_string(s.batch) + " does not split into " + std::to_string(D) +
                             " replicas x " + std::to_string(s.micro_batches) +
                             " micro-batches (it must be a multiple of " + std::to_string(D * s.micro_batches) + ")");
    program = pipeweave::tool::training_program(s, ranks / D);
    spec = pipeweave::tool::training_spec(s, program.shape);
    optimizer = s.optimizer_config();
    init = pipeweave::init_mlp(spec);
    task = pipeweave::make_regression_task(spec, s.batch, s.seed);
    saved = {spec, optimizer, s.batch, s.seed};
  }
  /// What a checkpoint of the run records and a resumed run must match.
  pipeweave::checkpoint::MlpRun saved;

  /// The options of every rank's pipeline.
  pipeweave::PipelineOptions options() const {
    pipeweave::PipelineOptions o{settings.batch, optimizer, timeout};
    o.replicas = settings.replicas;
    o.layout = *pipeweave::parse_rank_layout(settings.rank_layout);
    return o;
  }
  /// The micro-batches of the sequential reference: M of every replica (it adds
  /// each replica's gradients, then the replicas in order: set_replicas()).
  int reference_micro_batches() const { return program.shape.micro_batches * settings.replicas; }
};

/// One rank's run: make_pipeline() builds this rank of the multi-process
/// pipeline (collective), make_reference(pipeline) the sequential reference on
/// rank 0. Rank 0 prints the header and the losses and compares the parameters
/// at the end; every rank returns rank 0's verdict (0 equal within the
/// tolerance, 1 not), or 1 after an error, which each rank prints as one line.
template <class MakePipeline, class MakeReference>
int train_rank(const Run& run, int rank, const std::string& backend_line, MakePipeline&& make_pipeline,
               MakeReference&& make_reference) {
  const bool root = rank == 0;
  const Settings& s = run.settings;
  const pipeweave::ScheduleShape& shape = run.program.shape;
  try {
    auto pipe = make_pipeline();
    if (root) {
      const int D = s.replicas;
      std::printf("schedule: %s, %d %s x %d chunks = %d virtual stages, %d micro-batches of %d samples\n",
                  (s.schedule + (s.overlapped ? " with overlapped pairs" : "")).c_str(), shape.devices,
                  D > 1 ? "devices" : "ranks (devices)", shape.chunks,
                  shape.stages(), shape.micro_batches, s.batch / (D * shape.micro_batches));
      if (D > 1)
        std::printf("data parallelism: %d replicas of the pipeline, %d x %d = %d ranks, %s: %s; replica r on "
                    "samples [r*%d, (r+1)*%d); each chunk's gradients summed over the replicas at its R, in replica "
                    "order\n",
                    D, shape.devices, D, shape.devices * D, s.rank_layout.c_str(),
                    std::string(pipeweave::rank_layout_row(run.options().layout).words).c_str(),
                    s.batch / D, s.batch / D);
      std::printf("model: %d layers of %d features, optimizer %s, learning rate %g, seed %llu\n", s.layers, s.hidden,
                  s.optimizer.c_str(), static_cast<double>(s.lr), static_cast<unsigned long long>(s.seed));
      std::printf("layers per virtual stage: %s\n",
                  pipeweave::tool::per_stage_words(shape, run.spec.allocation()).c_str());
      std::printf("%s\n",
                  pipeweave::tool::activations_line(run.spec, s.batch / (D * shape.micro_batches)).c_str());
      std::printf("backend: %s\n\n", backend_line.c_str());
    }
    auto reference = root ? make_reference(*pipe) : nullptr;
    // The reference sums gradients in the schedule's order of micro-batches (gradient_order()), and
    // with replicas each replica's sum, then the replicas in order, as the reductions do.
    if (reference) {
      reference->set_gradient_order(pipeweave::gradient_order(run.program));
      reference->set_replicas(s.replicas);
    }
    long long first = 0;
    if (!s.ckpt.resume.empty()) {  // every rank reads its own stages; all refuse together
      const pipeweave::checkpoint::Loaded loaded = pipeweave::mpi::load_mlp(pipe->control(), s.ckpt.resume, run.saved, shape);
      if (const std::string problem = s.resume_problem(loaded.step); !problem.empty()) throw pipeweave::Error(problem);
      pipe->set_state(loaded.state);
      if (root) {
        reference->set_state(pipeweave::checkpoint::load_mlp_whole(loaded.directory, run.saved).state);
        std::printf("resumed: from %s at step %lld\n", loaded.directory.c_str(), loaded.step);
      }
      first = loaded.step;
    }
    for (int step = static_cast<int>(first) + 1; step <= s.steps; ++step) {
      const double loss = pipe->train_step(run.task.inputs, run.task.targets).loss;
      if (root) s.print_loss(step, first, loss, reference->train_step(run.task.inputs, run.task.targets));
      std::fflush(stdout);  // a step's line before its checkpoint is written
      if (s.ckpt.saves_after(step, s.steps)) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto dir = pipeweave::mpi::save_mlp(pipe->control(), s.ckpt.save, run.saved, shape, pipe->state(), step, s.ckpt.keep);
        const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (root) std::printf("checkpoint: step %d saved to %s (copying and writing %.1f ms)\n", step, dir.c_str(), ms);
        std::fflush(stdout);
      }
    }
    if (s.replicas > 1 && s.steps > first) {
      // The last step's trace of replica 0's ranks (collective): how long the step waited for the reductions.
      const pipeweave::Trace t = pipe->gather_trace();
      if (root)
        std::printf("gradient reductions (the last step, replica 0's ranks): exposed after the last compute %.3f ms "
                    "(most of any rank) of a %.3f ms step\n",
                    pipeweave::max_exposed_reduction(t) / 1e3, pipeweave::makespan(t) / 1e3);
    }
    const pipeweave::HostModel got = pipeweave::download_weights(*pipe, run.spec);  // complete on rank 0
    int status = 0;
    if (root) {
      const pipeweave::HostModel want = reference->weights();
      const double diff = pipeweave::max_abs_difference(got, want);
      status = diff <= s.tolerance ? 0 : 1;
      std::printf("\ncheck against sequential training on rank 0: max |pipelined - sequential| = %g%s "
                  "(tolerance %g): %s\n",
                  diff, got == want ? " (bit-for-bit equal)" : "", s.tolerance, status == 0 ? "ok" : "FAILED");
    }
    // Rank 0's verdict on every rank (polled like every collective after start-up).
    return static_cast<int>(pipe->control().broadcast(status, 0, s.steps));
  } catch (const pipeweave::Error& e) {
    std::fflush(stdout);
    // One write per line, so that the ranks' lines do not interleave.
    std::fprintf(stderr, "train_mlp_mpi: rank %d: %s\n", rank, e.what());
    return 1;
  }
}

/// A backend of train_mlp_mpi: one rank's run on it.
class RankBackend : public pipeweave::tool::BackendImpl {
 public:
  /// Trains this rank's part of the run (train_rank()); returns its exit status.
  virtual int train(const Run& run, int rank) const = 0;
};

/// train_mlp_mpi's backends in this build.
using Registry = pipeweave::tool::BackendRegistry<RankBackend>;

}  // namespace train_mlp_mpi
