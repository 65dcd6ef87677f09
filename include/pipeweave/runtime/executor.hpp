#pragma once
/// \file
/// The executor: runs a verified schedule's lowered program on P devices, one
/// thread each, written once against the Backend, Transport and Chunk concepts.
///
/// A training step on device d walks its lowered steps. A step's group of sends
/// and receives runs first (sends of tensors computed earlier, receives of tensors
/// needed now or later), then its action:
/// - F(c, m): the input is micro-batch m of the batch (virtual stage 0), a received
///   activation, or the output of the previous stage on this device; the chunk runs
///   forward and keeps what backward needs; at the last virtual stage the MSE loss
///   and its gradient are computed at once.
/// - B(c, m): the output gradient is the loss gradient, a received gradient, or the
///   input gradient of the next stage on this device; the chunk runs backward, adds
///   its parameter gradients, and its input gradient (not at stage 0) waits for the
///   next group to be sent. What F kept is released.
/// After the program every device counts its non-finite gradients (and the last
/// stage its non-finite losses); the devices agree, and only when all are finite
/// does every device apply one optimizer step on the gradients averaged over the
/// M micro-batches. The step thus either completes or leaves every parameter, and
/// the optimizer state, as it was.
///
/// Buffers come from the device plan (runtime/plan.hpp) and are allocated when the
/// pipeline is built; a step allocates nothing on the device.
///
/// An error on one device (a transport mismatch or timeout, an exception of a
/// chunk) aborts the transport, which makes every other device stop promptly; the
/// first error reaches the caller of train_step() as pipeweave::Error, with the
/// device, step and action where it happened.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipeweave/analysis/trace.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/device_threads.hpp"
#include "pipeweave/runtime/functors.hpp"
#include "pipeweave/runtime/layers.hpp"
#include "pipeweave/runtime/optimizer.hpp"
#include "pipeweave/runtime/plan.hpp"
#include "pipeweave/schedule/error.hpp"
#include "pipeweave/schedule/lowering.hpp"
#include "pipeweave/schedule/verify.hpp"

namespace pipeweave {

/// What one device owns: its backend, its transport endpoint and its V chunks;
/// chunks[c] is virtual stage c * P + d.
template <Backend B, Transport T, class C>
  requires Chunk<C, B>
struct DeviceParts {
  B backend;              ///< the device's memory and compute
  T transport;            ///< its end of the P2P fabric
  std::vector<C> chunks;  ///< [c]: virtual stage c * P + d
};

/// The most samples a batch may have.
inline constexpr int kMaxRows = 1 << 24;

/// Settings of a pipeline.
struct PipelineOptions {
  int rows = 0;                ///< samples per batch; a multiple of the micro-batches M
  OptimizerConfig optimizer{}; ///< the update applied after every step
};

/// One device's part of the executor: its plan, buffers and optimizer.
template <Backend B, Transport T, class C>
  requires Chunk<C, B>
class DeviceExecutor {
 public:
  /// Allocates every buffer the plan needs and reserves the chunks' stash slots.
  DeviceExecutor(DeviceParts<B, T, C>& parts, DevicePlan plan, int rows, const OptimizerConfig& optimizer)
      : parts_(parts), plan_(std::move(plan)), rows_(rows) {
    B& b = parts_.backend;
    const ScheduleShape& s = plan_.shape;
    const int M = s.micro_batches;
    for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
      in_size_.push_back(parts_.chunks[c].input_size());
      out_size_.push_back(parts_.chunks[c].output_size());
      parts_.chunks[c].reserve(b, std::max(1, plan_.slots[c]), rows_);
    }
    buffers_.reserve(plan_.buffers.size());
    for (const PlannedBuffer& pb : plan_.buffers) buffers_.push_back(b.allocate(floats(width(pb.chunk, pb.role))));
    for (const PlannedOp& op : plan_.ops) {
      const bool act = op.tensor.kind == TensorKind::kActivation;
      const BufferRole role = op.kind == OpKind::kSend ? (act ? BufferRole::kOutput : BufferRole::kInputGrad)
                                                       : (act ? BufferRole::kInput : BufferRole::kOutputGrad);
      messages_.push_back(Message{op.tensor, floats(width(op.chunk, role)) * sizeof(float)});
    }
    if (plan_.first_stage) inputs_ = b.allocate(floats(in_size_[0]) * static_cast<std::size_t>(M));
    if (plan_.last_stage) {
      targets_ = b.allocate(floats(out_size_.back()) * static_cast<std::size_t>(M));
      losses_ = b.allocate(static_cast<std::size_t>(M));
      host_losses_.assign(static_cast<std::size_t>(M), 0.0f);
    }
    for (std::size_t c = 0; c < parts_.chunks.size(); ++c) {
      for (const ParameterView& p : std::span<const ParameterView>(parts_.chunks[c].parameters())) {
        params_.push_back(p);
        param_chunk_.push_back(static_cast<int>(c));
      }
    }
    flags_ = b.allocate(std::max<std::size_t>(1, params_.size()));
    host_flags_.assign(params_.size(), 0.0f);
    optimizer_ = std::make_unique<Optimizer<B>>(b, std::span<const ParameterView>(params_), optimizer);
    compute_marks_.reserve(plan_.steps.size());
    comm_marks_.reserve(plan_.steps.size());
    b.synchronize();
  }

  /// Runs one training step; `inputs` and `targets` are the whole batch on the
  /// host (read only by the devices of the first and the last virtual stage).
  /// Returns true when the update was applied; false when some device found a
  /// non-finite value, in which case problem() says what this device found.
  /// Fills this device's part of `trace`.
  bool run(const float* inputs, const float* targets, Trace& trace) {
    B& b = parts_.backend;
    T& net = parts_.transport;
    const int d = plan_.device;
    const ScheduleShape& s = plan_.shape;
    const int M = s.micro_batches, last = s.stages() - 1;
    step_ = -1;
    action_ = nullptr;
    problem_.clear();
    net.agree(true);  // start together: the trace's origin
    b.reset_clock();
    for (const ParameterView& p : params_) b.fill(p.gradient, p.count, 0.0f);
    if (plan_.first_stage) b.upload(inputs, inputs_.data(), inputs_.size());
    if (plan_.last_stage) b.upload(targets, targets_.data(), targets_.size());
    compute_marks_.clear();
    comm_marks_.clear();
    int kept = 0, peak = 0;
    for (std::size_t t = 0; t < plan_.steps.size(); ++t) {
      const PlannedStep& st = plan_.steps[t];
      step_ = static_cast<int>(t);
      if (st.op_count > 0) {
        const std::size_t start = b.time_stamp();
        net.group_begin(step_);
        for (int i = st.first_op; i < st.first_op + st.op_count; ++i) {
          const PlannedOp& op = plan_.ops[static_cast<std::size_t>(i)];
          float* data = buffer(op.buffer);
          if (op.kind == OpKind::kSend)
            net.send(op.peer, messages_[static_cast<std::size_t>(i)], data);
          else
            net.recv(op.peer, messages_[static_cast<std::size_t>(i)], data);
        }
        net.group_end();
        comm_marks_.push_back({static_cast<int>(t), st.sends, st.recvs, start, b.time_stamp()});
      }
      if (!st.has_compute) continue;
      const PlannedCompute& pc = st.compute;
      action_ = &pc;
      const std::size_t start = b.time_stamp();
      try {
        C& chunk = parts_.chunks[static_cast<std::size_t>(pc.action.chunk)];
        const ChunkCall call{pc.action.micro_batch, pc.slot, rows_};
        const auto mb = static_cast<std::size_t>(pc.action.micro_batch);
        if (pc.action.phase == Phase::kForward) {
          const float* x = pc.x == kBatchInput ? inputs_.data() + mb * floats(in_size_[0]) : buffer(pc.x);
          float* y = buffer(pc.y);
          chunk.forward(b, call, x, y);
          if (pc.stage == last) {
            const std::size_t n = floats(out_size_.back());
            MseLoss::forward_backward(b, y, targets_.data() + mb * n, n, buffer(pc.dy), losses_.data() + mb);
          }
          peak = std::max(peak, ++kept);
        } else {
          chunk.backward(b, call, buffer(pc.dy), pc.dx == kNoBuffer ? nullptr : buffer(pc.dx));
          --kept;
        }
      } catch (const std::exception& e) {
        throw Error(where() + e.what());
      }
      compute_marks_.push_back({static_cast<int>(t), start, b.time_stamp()});
    }
    action_ = nullptr;
    // Agree that every value is finite before anyone updates anything.
    for (std::size_t k = 0; k < params_.size(); ++k)
      b.sum(params_[k].count, NonFinite{params_[k].gradient}, flags_.data() + k);
    if (!params_.empty()) b.download(flags_.data(), host_flags_.data(), params_.size());
    if (plan_.last_stage) b.download(losses_.data(), host_losses_.data(), static_cast<std::size_t>(M));
    b.synchronize();
    const bool ok = local_problem();
    const bool all_ok = net.agree(ok);
    if (all_ok) {
      optimizer_->step(b, 1.0f / static_cast<float>(M));
      b.synchronize();
    }
    // The trace of this device.
    auto& compute = trace.compute[static_cast<std::size_t>(d)];
    auto& comm = trace.comm[static_cast<std::size_t>(d)];
    compute.clear();
    comm.clear();
    for (const ComputeMark& m : compute_marks_) {
      const PlannedCompute& pc = plan_.steps[static_cast<std::size_t>(m.step)].compute;
      compute.push_back({d, m.step, pc.action, pc.stage, b.elapsed_us(m.start), b.elapsed_us(m.end)});
    }
    for (const CommMark& m : comm_marks_)
      comm.push_back({d, m.step, m.sends, m.recvs, b.elapsed_us(m.start), b.elapsed_us(m.end)});
    trace.peak_activations[static_cast<std::size_t>(d)] = peak;
    return all_ok;
  }

  /// What this device found non-finite in the last step (empty when nothing), and
  /// whether it is a loss (which explains every other finding).
  const std::string& problem() const { return problem_; }
  /// True when problem() is about the loss.
  bool problem_is_loss() const { return problem_is_loss_; }
  /// The micro-batch losses of the last step (the last virtual stage's device only).
  std::span<const float> losses() const { return host_losses_; }
  /// The plan this device runs.
  const DevicePlan& plan() const { return plan_; }
  /// "device d, step t, F1.3 (stage 5, micro-batch 3): " for the current action.
  std::string where() const {
    Text t;
    t << "device " << plan_.device << ", step " << step_;
    if (action_ != nullptr) {
      t << ", ";
      append_token(t, action_->action) << " (stage " << action_->stage << ", micro-batch " << action_->action.micro_batch
                                       << ")";
    }
    return t.str() + ": ";
  }

 private:
  struct ComputeMark {
    int step;
    std::size_t start, end;
  };
  struct CommMark {
    int step, sends, recvs;
    std::size_t start, end;
  };

  std::size_t floats(std::size_t width) const { return width * static_cast<std::size_t>(rows_); }
  std::size_t width(int chunk, BufferRole role) const {
    const auto c = static_cast<std::size_t>(chunk);
    return role == BufferRole::kInput || role == BufferRole::kInputGrad ? in_size_[c] : out_size_[c];
  }
  float* buffer(int id) { return buffers_[static_cast<std::size_t>(id)].data(); }

  // Builds problem_ from the downloaded flags and losses; true when all is finite.
  bool local_problem() {
    problem_is_loss_ = false;
    bool ok = true;
    for (std::size_t m = 0; m < host_losses_.size(); ++m) {
      if (is_finite(host_losses_[m])) continue;
      if (ok) {
        Text t;
        t << "device " << plan_.device << ": the loss of micro-batch " << static_cast<int>(m) << " is "
          << (std::isnan(host_losses_[m]) ? "nan" : "infinite");
        problem_ = t.str();
        problem_is_loss_ = true;
      }
      ok = false;
    }
    for (std::size_t k = 0; k < host_flags_.size(); ++k) {
      if (host_flags_[k] == 0.0f) continue;
      if (ok) {
        Text t;
        t << "device " << plan_.device << ": " << static_cast<long long>(host_flags_[k])
          << " gradient values of chunk " << param_chunk_[k] << " (stage "
          << plan_.shape.stage_of(plan_.device, param_chunk_[k]) << ") are not finite";
        problem_ = t.str();
      }
      ok = false;
    }
    return ok;
  }

  DeviceParts<B, T, C>& parts_;
  DevicePlan plan_;
  int rows_;  // samples per micro-batch
  std::vector<std::size_t> in_size_, out_size_;
  std::vector<typename B::Buffer> buffers_;
  std::vector<Message> messages_;  // [planned op]
  typename B::Buffer inputs_, targets_, losses_, flags_;
  std::vector<float> host_losses_, host_flags_;
  std::vector<ParameterView> params_;
  std::vector<int> param_chunk_;
  std::unique_ptr<Optimizer<B>> optimizer_;
  std::vector<ComputeMark> compute_marks_;
  std::vector<CommMark> comm_marks_;
  int step_ = -1;
  const PlannedCompute* action_ = nullptr;
  std::string problem_;
  bool problem_is_loss_ = false;
};

/// The outcome of one training step.
struct StepResult {
  double loss = 0;  ///< mean of the micro-batch losses (each an MSE over its micro-batch)
};

/// A pipeline of P devices running one schedule: builds each device's parts on
/// its own thread, plans its buffers, and runs training steps.
///
/// \code
/// // make_device(d) returns DeviceParts{backend, transport, chunks of device d}:
/// // pipeweave::Pipeline<B, T, C> pipe(program, make_device, {.rows = 64, .optimizer = {}});
/// // double loss = pipe.train_step(inputs, targets).loss;
/// \endcode
template <Backend B, Transport T, class C>
  requires Chunk<C, B>
class Pipeline {
 public:
  /// The parts of one device.
  using Parts = DeviceParts<B, T, C>;

  /// Verifies `program`, calls make_device(d) on device d's thread for every d,
  /// checks that the parts match the program (V chunks per device, each stage's
  /// output size equal to the next stage's input size, transports numbered 0..P-1)
  /// and allocates every buffer. Throws pipeweave::Error on any mismatch.
  template <class MakeDevice>
  Pipeline(const Program& program, MakeDevice&& make_device, const PipelineOptions& options)
      : shape_(program.shape), options_(options) {
    if (const VerifyResult r = verify(program); !r) throw Error("pipeline: the program is not valid: " + r.what());
    check_optimizer(options.optimizer);
    const int P = shape_.devices, V = shape_.chunks, M = shape_.micro_batches;
    if (options.rows > kMaxRows) {
      Text t;
      t << "pipeline: a batch of " << options.rows << " samples is more than the limit of " << kMaxRows;
      throw Error(t.str());
    }
    if (options.rows < 1 || options.rows % M != 0) {
      Text t;
      t << "pipeline: the batch of " << options.rows << " samples does not split into " << M
        << " equal micro-batches of at least 1 sample";
      throw Error(t.str());
    }
    const LoweredProgram lp = lower(program);
    threads_ = std::make_unique<DeviceThreads>(P);
    parts_.resize(static_cast<std::size_t>(P));
    executors_.resize(static_cast<std::size_t>(P));
    std::vector<DevicePlan> plans(static_cast<std::size_t>(P));
    auto build = [&](int d) {
      try {
        parts_[static_cast<std::size_t>(d)] = std::make_unique<Parts>(make_device(d));
        plans[static_cast<std::size_t>(d)] = plan_device(lp, d);
      } catch (const std::exception& e) {
        throw Error("pipeline: building device " + std::to_string(d) + ": " + e.what());
      }
    };
    rethrow_first(threads_->run(build));
    for (int d = 0; d < P; ++d) {
      const Parts& p = *parts_[static_cast<std::size_t>(d)];
      if (static_cast<int>(p.chunks.size()) != V) {
        Text t;
        t << "pipeline: device " << d << " has " << static_cast<int>(p.chunks.size()) << " chunks, but the program has "
          << V << " per device";
        throw Error(t.str());
      }
      if (p.transport.device() != d || p.transport.devices() != P) {
        Text t;
        t << "pipeline: the transport of device " << d << " is device " << p.transport.device() << " of "
          << p.transport.devices() << "; the program has " << P << " devices";
        throw Error(t.str());
      }
    }
    for (int stage = 0; stage + 1 < shape_.stages(); ++stage) {
      const std::size_t out = chunk_of(stage).output_size(), in = chunk_of(stage + 1).input_size();
      if (out != in) {
        Text t;
        t << "pipeline: the model does not match the program: virtual stage " << stage << " gives "
          << static_cast<long long>(out) << " features per sample, but stage " << stage + 1 << " takes "
          << static_cast<long long>(in);
        throw Error(t.str());
      }
    }
    input_size_ = chunk_of(0).input_size();
    output_size_ = chunk_of(shape_.stages() - 1).output_size();
    auto make_executors = [&](int d) {
      try {
        executors_[static_cast<std::size_t>(d)] = std::make_unique<DeviceExecutor<B, T, C>>(
            *parts_[static_cast<std::size_t>(d)], std::move(plans[static_cast<std::size_t>(d)]), options.rows / M,
            options.optimizer);
      } catch (const std::exception& e) {
        throw Error("pipeline: allocating the buffers of device " + std::to_string(d) + ": " + e.what());
      }
    };
    rethrow_first(threads_->run(make_executors));
    trace_.shape = shape_;
    trace_.source = TraceSource::kMeasured;
    trace_.time_unit = "us";
    trace_.compute.resize(static_cast<std::size_t>(P));
    trace_.comm.resize(static_cast<std::size_t>(P));
    trace_.peak_activations.assign(static_cast<std::size_t>(P), 0);
    errors_.resize(static_cast<std::size_t>(P));
    applied_.assign(static_cast<std::size_t>(P), 0);
  }

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  /// Releases each device's buffers and parts on its own thread.
  ~Pipeline() {
    if (!threads_) return;
    auto destroy = [&](int d) {
      executors_[static_cast<std::size_t>(d)].reset();
      parts_[static_cast<std::size_t>(d)].reset();
    };
    threads_->run(destroy);
  }

  /// One training step on the batch: `inputs` is rows x input size, `targets` rows x
  /// output size, both row-major on the host. Returns the loss. Throws
  /// pipeweave::Error when a device fails or a loss or gradient is not finite; the
  /// parameters and the optimizer state are then as they were before the call.
  StepResult train_step(std::span<const float> inputs, std::span<const float> targets) {
    const auto rows = static_cast<std::size_t>(options_.rows);
    if (inputs.size() != rows * input_size_ || targets.size() != rows * output_size_) {
      Text t;
      t << "train_step: expected " << static_cast<long long>(rows * input_size_) << " input and "
        << static_cast<long long>(rows * output_size_) << " target values (" << options_.rows
        << " samples), got " << static_cast<long long>(inputs.size()) << " and "
        << static_cast<long long>(targets.size());
      throw Error(t.str());
    }
    ++step_count_;
    if (needs_reset_) {
      auto reset = [&](int d) { parts_[static_cast<std::size_t>(d)]->transport.reset(); };
      rethrow_first(threads_->run(reset));
      needs_reset_ = false;
    }
    std::atomic<int> first{-1};
    std::vector<char>& applied = applied_;
    std::fill(applied.begin(), applied.end(), 0);
    auto work = [&](int d) {
      const auto i = static_cast<std::size_t>(d);
      try {
        applied[i] = executors_[i]->run(inputs.data(), targets.data(), trace_) ? 1 : 0;
      } catch (const std::exception& e) {
        fail(first, d, e.what());
      } catch (...) {
        fail(first, d, executors_[i]->where() + "unknown exception");
      }
    };
    rethrow_first(threads_->run(work));
    if (first.load() >= 0) {
      needs_reset_ = true;
      throw Error(errors_[static_cast<std::size_t>(first.load())] +
                  " (the step was not applied: every device kept its parameters)");
    }
    if (!std::all_of(applied.begin(), applied.end(), [](char a) { return a != 0; })) {
      std::string what;
      for (const auto& e : executors_)
        if (e->problem_is_loss()) {
          what = e->problem();
          break;
        }
      for (const auto& e : executors_)
        if (what.empty() && !e->problem().empty()) what = e->problem();
      throw Error("training step " + std::to_string(step_count_) + ": " + what +
                  "; the step was not applied: every device kept its parameters");
    }
    const auto losses = executors_[static_cast<std::size_t>(shape_.device_of_stage(shape_.stages() - 1))]->losses();
    double sum = 0;
    for (float l : losses) sum += l;
    return {sum / static_cast<double>(losses.size())};
  }

  /// The measured trace of the last step (times in microseconds from its start).
  const Trace& trace() const { return trace_; }
  /// The schedule's shape.
  const ScheduleShape& shape() const { return shape_; }
  /// The options the pipeline was built with.
  const PipelineOptions& options() const { return options_; }
  /// The plan of device d.
  const DevicePlan& plan(int device) const { return executors_.at(static_cast<std::size_t>(device))->plan(); }
  /// The micro-batch losses of the last step.
  std::span<const float> micro_batch_losses() const {
    return executors_[static_cast<std::size_t>(shape_.device_of_stage(shape_.stages() - 1))]->losses();
  }

  /// Calls fn(d, parts) on device d's thread for every device (e.g. to download
  /// parameters); rethrows the first exception.
  template <class F>
  void for_each_device(F&& fn) {
    auto job = [&](int d) { fn(d, *parts_[static_cast<std::size_t>(d)]); };
    rethrow_first(threads_->run(job));
  }

 private:
  const C& chunk_of(int stage) const {
    return parts_[static_cast<std::size_t>(shape_.device_of_stage(stage))]
        ->chunks[static_cast<std::size_t>(shape_.chunk_of_stage(stage))];
  }

  // Records device d's error; the first device to fail aborts the transport.
  void fail(std::atomic<int>& first, int d, const std::string& what) noexcept {
    try {
      errors_[static_cast<std::size_t>(d)] = what;
    } catch (...) {
    }
    int none = -1;
    if (first.compare_exchange_strong(none, d)) parts_[static_cast<std::size_t>(d)]->transport.abort(what);
  }

  static void rethrow_first(const std::vector<std::exception_ptr>& errors) {
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& x) {
        throw Error(x.what());
      }
    }
  }

  ScheduleShape shape_;
  PipelineOptions options_;
  std::unique_ptr<DeviceThreads> threads_;
  std::vector<std::unique_ptr<Parts>> parts_;
  std::vector<std::unique_ptr<DeviceExecutor<B, T, C>>> executors_;
  std::size_t input_size_ = 0, output_size_ = 0;
  Trace trace_;
  std::vector<std::string> errors_;
  std::vector<char> applied_;  // [device]: the last step's update was applied
  bool needs_reset_ = false;
  long long step_count_ = 0;
};

}  // namespace pipeweave
