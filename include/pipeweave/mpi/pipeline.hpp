#pragma once
/// \file
/// The multi-process host: one process per pipeline device, launched by
/// `mpirun -n P`; rank d runs device d's session (runtime/session.hpp) on the
/// calling thread. With D data-parallel replicas (options.replicas) it takes
/// `mpirun -n P*D`: options.layout (RankLayout) says which rank holds device d of
/// replica r, each replica's pipeline transfers stay among its ranks, each
/// device's R sums its gradients over the D ranks that hold it
/// (mpi/replicas.hpp), and the ranks' agreements span all P x D. It works with
/// any Chunk, Loss and update rule; the transport is a Transport of the
/// multi-process kind (MultiProcessTransport): built on the rank's Control
/// without talking to the others, then joined collectively by connect().
/// mpi/transport.hpp provides MPI point-to-point for host memory (the CPU
/// backend: cpu/mpi.hpp), cuda/mpi.hpp NCCL's.
///
/// Start-up, in this order on every rank: the Control (the only blocking
/// collectives, reached first by every rank); the local part, which may fail on
/// one rank only (checks of the program and the batch, make_device, the plan and
/// the session's buffers); the start-up agreement (mpi/control.hpp), where the
/// ranks refuse together when their settings differ (the message names the
/// first that differs) or any rank failed;
/// then the transport's connect(). After start-up every collective is
/// non-blocking and polled for the failure notices of other ranks.
///
/// \code
/// // int main(int argc, char** argv) {
/// //   pipeweave::mpi::MpiSession mpi(argc, argv);
/// //   auto make_device = [&](const std::shared_ptr<pipeweave::mpi::Control>& control) { ... DeviceParts ... };
/// //   pipeweave::mpi::MpiPipeline<B, T, C> pipe(MPI_COMM_WORLD, program, make_device, {.rows = 512});
/// //   double loss = pipe.train_step(inputs, targets).loss;  // the same on every rank
/// // }
/// \endcode

#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/model/loss.hpp"
#include "pipeweave/model/optimizer.hpp"
#include "pipeweave/mpi/bootstrap.hpp"
#include "pipeweave/mpi/control.hpp"
#include "pipeweave/mpi/replicas.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/runtime/config_hash.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/runtime/session.hpp"
#include "pipeweave/runtime/state.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave::mpi {

/// A transport the multi-process host can use: a Transport whose endpoint is
/// built locally (by make_device, from the rank's Control) and joined to the
/// other ranks by connect(), collectively, after the start-up agreement.
template <class T>
concept MultiProcessTransport = Transport<T> && requires(T& t) { t.connect(); };

/// One rank of a pipeline across processes (see the file comment). Every call is
/// collective over the ranks of the communicator.
template <Backend B, MultiProcessTransport T, class C, class L = MseLoss, class O = OptimizerConfig>
  requires Chunk<C, B> && Loss<L, B> && Optimizer<O, B>
class MpiPipeline {
  using Session = DeviceSession<B, T, C, L, O>;

 public:
  /// Starts this rank's device: make_device(control) returns its
  /// DeviceParts<B, T, C> (see the file comment for the order of start-up).
  /// `shared` holds the settings of everything else the ranks must share (model,
  /// optimizer, arithmetic, ...); the host puts the program's and the batch's
  /// first (run_config). Throws pipeweave::Error, with the same message on every
  /// rank, when the ranks' settings differ or a rank cannot start.
  template <class MakeDevice>
  MpiPipeline(MPI_Comm comm, const Program& program, MakeDevice&& make_device, const BasicPipelineOptions<O>& options,
              const RunConfig& shared = {}, L loss = L{})
      : control_(std::make_shared<Control>(comm, options.timeout)), shape_(program.shape), rows_(options.rows) {
    std::string problem;
    ExclusiveResource owned;  // a transport that needs its device for itself names it (NCCL: the GPU)
    try {
      LoweredProgram lowered = check_run(program, options, "mpi pipeline");
      const int P = shape_.devices, D = options.replicas;
      if (P * D != control_->size())
        throw_error({}, "the program has ", P, " devices", D > 1 ? " and " + std::to_string(D) + " replicas" : "",
                    ", but ", control_->size(), " ranks were started (one rank per device",
                    D > 1 ? " of each replica" : "", ": mpirun -n ", P * D, ")");
      RankGrid grid;
      grid.devices = P;
      grid.replicas = D;
      grid.layout = options.layout;
      control_->set_grid(grid);
      if (D > 1) reduction_ = std::make_unique<ReplicaReduction>(control_);
      typename Session::Parts parts = make_device(control_);
      check_parts(parts, shape_, device(), "mpi pipeline");
      if constexpr (requires { { parts.transport.exclusive_resource() } -> std::same_as<ExclusiveResource>; })
        owned = parts.transport.exclusive_resource();
      session_ = Session::make(std::move(parts), std::move(lowered), device(), options, loss,
                               ReplicaLink{reduction_.get(), control_->replica()});
    } catch (const std::exception& e) {
      problem = e.what();
    }
    // The replicas and their layout first: ranks started with another D differ in the devices and the program too.
    RunConfig fingerprint;
    fingerprint.add("replicas", options.replicas);
    if (options.replicas > 1) fingerprint.add("rank layout", rank_layout_name(options.layout));
    fingerprint.add(run_config(program, options.rows)).add(shared);
    agree_to_start(*control_, fingerprint, problem, owned);
    check_neighbours_across_ranks();
    try {
      // The reductions' communicator first: only MPI's, so it fails on every rank or none (the
      // transport's connect may fail on some ranks only, e.g. NCCL's).
      if (reduction_) reduction_->connect();
      session_->parts().transport.connect();
    } catch (const std::exception& e) {
      control_->abort(e.what());
      throw;
    }
    trace_ = measured_trace(shape_);
    if constexpr (SizedChunk<C>) trace_.peak_bytes.assign(static_cast<std::size_t>(shape_.devices), 0.0);
  }

  /// One training step on the whole batch (every rank passes the same batch; only
  /// the ranks of the first and the last stage read it): replica r trains on the
  /// rows [r * rows / D, (r + 1) * rows / D). Returns the loss on every rank, the
  /// mean over every micro-batch of every replica. Throws pipeweave::Error on
  /// every rank when one fails or a value is not finite; the parameters are then
  /// as they were.
  StepResult train_step(std::span<const float> inputs, std::span<const float> targets) {
    // Only the ranks that read them check their sizes.
    const std::size_t in_size = session_->input_size(), target_size = session_->target_size();
    check_batch(inputs, targets, rows_, in_size, target_size);
    ++step_count_;
    if (!broken_.empty()) throw_error({}, "training step ", step_count_, ": the run cannot go on: ", broken_);
    if (needs_reset_) {
      try {
        session_->reset();
        if (reduction_) reduction_->reset();
      } catch (const std::exception& e) {
        // A reset that fails on some ranks only leaves the others' collectives unmatched: the run ends here.
        broken_ = error_text({}, "rank ", rank(), ": resetting after a failed step: ", e.what());
        control_->abort(broken_);
        throw_error({}, "training step ", step_count_, ": the run cannot go on: ", broken_);
      }
      needs_reset_ = false;
    }
    bool applied = false;
    double loss = 0;
    const auto shard = static_cast<std::size_t>(rows_ / control_->grid().replicas) *
                       static_cast<std::size_t>(control_->replica());
    try {
      try {
        applied = session_->run(inputs.empty() ? inputs.data() : inputs.data() + shard * in_size,
                                targets.empty() ? targets.data() : targets.data() + shard * target_size);
      } catch (const std::exception& e) {
        if (replicas() == 1) throw;
        throw_error({}, replica_words(), e.what());
      }
      session_->record(trace_);
      if (applied) loss = mean_loss();
    } catch (const std::exception& e) {
      session_->abort(e.what());
      needs_reset_ = true;
      throw_error({}, e.what(), " (", not_applied("rank"), ")");
    }
    if (!applied)
      throw_error({}, "training step ", step_count_, ": ",
                  session_->problem().empty() ? "another rank found a value that is not finite"
                                              : replica_words() + session_->problem(),
                  "; ", not_applied("rank"));
    return {loss};
  }

  /// This rank.
  int rank() const { return control_->rank(); }
  /// The pipeline device this rank holds.
  int device() const { return control_->device(); }
  /// The replica this rank belongs to.
  int replica() const { return control_->replica(); }
  /// The number of data-parallel replicas D.
  int replicas() const { return control_->grid().replicas; }
  /// The schedule's shape.
  const ScheduleShape& shape() const { return shape_; }
  /// This rank's plan.
  const DevicePlan& plan() const { return session_->plan(); }
  /// The last step's trace with this rank's events only.
  const Trace& trace() const { return trace_; }
  /// This rank's parts.
  typename Session::Parts& parts() { return session_->parts(); }
  /// The control plane of this rank.
  Control& control() { return *control_; }

  /// Collective: the last step's trace of all ranks, complete on `root` (each
  /// rank's times are from its own start of the step, which the ranks begin
  /// together after an agreement).
  Trace gather_trace(int root = 0) {
    const auto d = static_cast<std::size_t>(device());
    // 8 values an event, the first its tag: 0 compute (3: a pair's forward), 1 p2p, 2 R, 4 O or L; then the
    // device's peaks: activations, memory, bytes.
    std::vector<double> mine;
    auto event = [&](double tag, const TraceEvent& e) {
      mine.insert(mine.end(), {tag, static_cast<double>(e.step), static_cast<double>(e.action.phase),
                               static_cast<double>(e.action.chunk), static_cast<double>(e.action.micro_batch),
                               static_cast<double>(e.stage), e.start, e.end});
    };
    for (const TraceEvent& e : trace_.compute[d]) event(e.action.overlaps_next ? 3.0 : 0.0, e);
    for (const TraceEvent& e : trace_.collective[d]) event(2.0, e);
    for (const TraceEvent& e : trace_.copies[d]) event(4.0, e);
    for (const CommEvent& e : trace_.comm[d])
      mine.insert(mine.end(), {1.0, static_cast<double>(e.step), static_cast<double>(e.sends),
                               static_cast<double>(e.recvs), 0.0, 0.0, e.start, e.end});
    const auto peak = [&](const auto& v) { return d < v.size() ? static_cast<double>(v[d]) : 0.0; };
    mine.insert(mine.end(), {peak(trace_.peak_activations), peak(trace_.peak_memory), peak(trace_.peak_bytes)});
    const std::vector<std::vector<double>> all = control_->gather(mine, root, static_cast<int>(step_count_));
    Trace t = trace_;
    const RankGrid& grid = control_->grid();
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (grid.replica(static_cast<int>(r)) != 0) continue;  // replica 0's devices, as the threads' trace has
      const auto dev = static_cast<std::size_t>(grid.device(static_cast<int>(r)));
      auto& compute = t.compute[dev];
      auto& comm = t.comm[dev];
      auto& collective = t.collective[dev];
      auto& copies = t.copies[dev];
      compute.clear();
      comm.clear();
      collective.clear();
      copies.clear();
      const std::vector<double>& v = all[r];
      const std::size_t events = v.size() - 3;
      for (std::size_t i = 0; i + 8 <= events; i += 8) {
        const double* p = v.data() + i;
        const TraceEvent e{static_cast<int>(dev), static_cast<int>(p[1]),
                           Action{static_cast<Phase>(static_cast<int>(p[2])), static_cast<int>(p[3]),
                                  static_cast<int>(p[4]), p[0] == 3.0},
                           static_cast<int>(p[5]), p[6], p[7]};
        if (p[0] == 1.0)
          comm.push_back({static_cast<int>(dev), static_cast<int>(p[1]), static_cast<int>(p[2]), static_cast<int>(p[3]),
                          p[6], p[7]});
        else
          (p[0] == 2.0 ? collective : p[0] == 4.0 ? copies : compute).push_back(e);
      }
      t.peak_activations[dev] = static_cast<int>(v[events]);
      if (dev < t.peak_memory.size()) t.peak_memory[dev] = v[events + 1];
      if (dev < t.peak_bytes.size()) t.peak_bytes[dev] = v[events + 2];
    }
    return t;
  }

  /// Collective: the parameters of every virtual stage ([stage] = the floats of
  /// its chunk's parameter tensors, in order), complete on `root`; the other ranks
  /// get their own stages only.
  std::vector<std::vector<float>> stage_parameters(int root = 0) {
    const std::vector<std::vector<float>> chunks = session_->chunk_parameters();
    std::vector<double> sizes;
    std::vector<float> values;
    for (const auto& c : chunks) {
      sizes.push_back(static_cast<double>(c.size()));
      values.insert(values.end(), c.begin(), c.end());
    }
    std::vector<std::vector<float>> out(static_cast<std::size_t>(shape_.stages()));
    for (int c = 0; c < shape_.chunks; ++c)
      out[static_cast<std::size_t>(shape_.stage_of(device(), c))] = chunks[static_cast<std::size_t>(c)];
    const int step = static_cast<int>(step_count_);
    const std::vector<std::vector<double>> all_sizes = control_->gather(sizes, root, step);
    const std::vector<std::vector<float>> all = control_->gather(values, root, step);
    const RankGrid& grid = control_->grid();
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (grid.replica(static_cast<int>(r)) != 0) continue;  // every replica holds the same parameters
      std::size_t at = 0;
      for (int c = 0; c < shape_.chunks; ++c) {
        const auto n = static_cast<std::size_t>(all_sizes[r][static_cast<std::size_t>(c)]);
        out[static_cast<std::size_t>(shape_.stage_of(grid.device(static_cast<int>(r)), c))].assign(
            all[r].begin() + static_cast<std::ptrdiff_t>(at), all[r].begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
      }
    }
    return out;
  }

  /// This rank's part of the run's state (runtime/state.hpp): the stages of its
  /// chunks (the others left empty) and the updates applied. Not collective.
  TrainingState state() {
    TrainingState out;
    out.stages.resize(static_cast<std::size_t>(shape_.stages()));
    for (int c = 0; c < shape_.chunks; ++c)
      session_->copy_chunk_state(c, out.stages[static_cast<std::size_t>(shape_.stage_of(device(), c))]);
    out.updates = session_->updates();
    return out;
  }

  /// Collective: sets this rank's stages and the updates applied from `state`
  /// (only the stages of this rank's chunks are read). Throws pipeweave::Error on
  /// every rank, changing nothing on any, when the state does not fit some rank.
  void set_state(const TrainingState& state) {
    std::string problem;
    try {
      if (state.stages.size() != static_cast<std::size_t>(shape_.stages()))
        throw_error({}, "state: ", state.stages.size(), " stages; the pipeline has ", shape_.stages());
      if (state.updates < 0) throw_error({}, "state: ", state.updates, " updates applied; at least 0");
      for (int c = 0; c < shape_.chunks; ++c) {
        const int stage = shape_.stage_of(device(), c);
        session_->check_chunk_state(c, state.stages[static_cast<std::size_t>(stage)], "stage " + std::to_string(stage));
      }
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problems(*control_, problem, static_cast<int>(step_count_), "set_state: refused");
    for (int c = 0; c < shape_.chunks; ++c)
      session_->set_chunk_state(c, state.stages[static_cast<std::size_t>(shape_.stage_of(device(), c))]);
    session_->set_updates(state.updates);
    step_count_ = state.updates;
  }

 private:
  /// Collective, after every rank has started: gathers what each rank's chunks
  /// take and give, and throws pipeweave::Error on every rank alike, before any
  /// step, where neighbouring virtual stages disagree (check_neighbours).
  void check_neighbours_across_ranks() {
    std::vector<double> mine;  // per local chunk: stage, input size, input dtype, output size, output dtype
    const auto& chunks = session_->parts().chunks;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const StageEnds e = stage_ends(chunks[c]);
      mine.insert(mine.end(), {static_cast<double>(shape_.stage_of(device(), static_cast<int>(c))),
                               static_cast<double>(e.input_size), static_cast<double>(e.dtypes.input),
                               static_cast<double>(e.output_size), static_cast<double>(e.dtypes.output)});
    }
    std::vector<StageEnds> stages(static_cast<std::size_t>(shape_.stages()));
    for (const std::vector<double>& rank : control_->gather(mine, Control::kEveryRank, -1))
      for (std::size_t i = 0; i + 5 <= rank.size(); i += 5)
        stages.at(static_cast<std::size_t>(rank[i])) = {
            static_cast<std::size_t>(rank[i + 1]), static_cast<std::size_t>(rank[i + 3]),
            {static_cast<DType>(static_cast<int>(rank[i + 2])), static_cast<DType>(static_cast<int>(rank[i + 4]))}};
    for (int s = 0; s + 1 < shape_.stages(); ++s)
      check_neighbours(stages[static_cast<std::size_t>(s)], stages[static_cast<std::size_t>(s) + 1], s,
                       "mpi pipeline");
  }

  // "replica r: " where the run has several; else nothing.
  std::string replica_words() const {
    return replicas() > 1 ? "replica " + std::to_string(replica()) + ": " : std::string();
  }

  // The mean of every micro-batch loss of every replica, summed in replica order
  // (as the threads of one process sum them); collective.
  double mean_loss() {
    const int last = shape_.device_of_stage(shape_.stages() - 1);
    std::vector<double> mine;
    if (device() == last)
      for (const float l : session_->losses()) mine.push_back(l);
    const std::vector<std::vector<double>> all = control_->gather(mine, Control::kEveryRank, static_cast<int>(step_count_));
    double sum = 0;
    std::size_t n = 0;
    for (int r = 0; r < replicas(); ++r)
      for (const double l : all[static_cast<std::size_t>(control_->grid().rank(r, last))]) {
        sum += l;
        ++n;
      }
    return n == 0 ? 0.0 : sum / static_cast<double>(n);
  }

  std::shared_ptr<Control> control_;
  ScheduleShape shape_;
  int rows_;
  std::unique_ptr<ReplicaReduction> reduction_;  // with replicas: the gradient reductions (before session_: it points here)
  std::unique_ptr<Session> session_;
  Trace trace_;
  bool needs_reset_ = false;
  std::string broken_;  // why a reset failed: the run cannot go on
  long long step_count_ = 0;
};

}  // namespace pipeweave::mpi
