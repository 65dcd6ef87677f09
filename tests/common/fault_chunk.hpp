// A chunk for failure tests: the built-in MLP chunk on the CPU backend with a
// fault injected at one action of one device. The fault throws "injected fault"
// there, or does what the test asks instead (sleep, end the process), while it
// is armed. The threaded pipeline's tests (runtime/test_failures.cpp) and the
// multi-process ones (mpi/) share it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>

#include "pipeweave/cpu/backend.hpp"
#include "pipeweave/model/mlp.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/schedule/action.hpp"
#include "pipeweave/schedule/offload.hpp"

namespace pipeweave::test {

/// What goes wrong, and where.
struct Fault {
  int device = -1;             ///< -1: nothing
  int replica = -1;            ///< with data parallelism, the replica of that device; -1: every replica
  Action action{};             ///< the action of that device's chunk
  std::function<void()> act;   ///< what happens there; none: throw std::runtime_error("injected fault")
  std::atomic<bool> armed{false};
};

/// MlpChunk<CpuBackend> with `fault` injected (see the file comment).
class FaultChunk {
 public:
  FaultChunk(MlpChunk<cpu::CpuBackend> inner, int device, int chunk, std::shared_ptr<Fault> fault, int replica = 0)
      : inner_(std::move(inner)), device_(device), chunk_(chunk), replica_(replica), fault_(std::move(fault)) {}
  std::size_t input_size() const { return inner_.input_size(); }
  std::size_t output_size() const { return inner_.output_size(); }
  void reserve(cpu::CpuBackend& b, int slots, int rows) { inner_.reserve(b, slots, rows); }
  void forward(cpu::CpuBackend& b, const ChunkCall& call, const float* x, float* y) {
    maybe_fail(fwd(chunk_, call.micro_batch));
    inner_.forward(b, call, x, y);
  }
  void backward(cpu::CpuBackend& b, const ChunkCall& call, const float* dy, float* dx) {
    maybe_fail(bwd(chunk_, call.micro_batch));
    inner_.backward(b, call, dy, dx);
  }
  // Offload (OffloadableChunk): the copies of an O and of an L fail where the fault says.
  std::size_t offload_size(int rows) const { return inner_.offload_size(rows); }
  void offload(cpu::CpuBackend& b, const ChunkCall& call, float* host) {
    maybe_fail(pipeweave::offload(chunk_, call.micro_batch));
    inner_.offload(b, call, host);
  }
  void reload(cpu::CpuBackend& b, const ChunkCall& call, ConstTensorRef x, ConstTensorRef y, const float* host) {
    maybe_fail(pipeweave::reload(chunk_, call.micro_batch));
    inner_.reload(b, call, x, y, host);
  }
  std::span<const ParameterView> parameters() const { return inner_.parameters(); }
  /// The wrapped chunk.
  const MlpChunk<cpu::CpuBackend>& inner() const { return inner_; }

 private:
  void maybe_fail(const Action& a) {
    if (!fault_->armed || fault_->device != device_ || !(fault_->action == a)) return;
    if (fault_->replica >= 0 && fault_->replica != replica_) return;
    if (!fault_->act) throw std::runtime_error("injected fault");
    fault_->act();
  }
  MlpChunk<cpu::CpuBackend> inner_;
  int device_, chunk_, replica_;
  std::shared_ptr<Fault> fault_;
};

static_assert(Chunk<FaultChunk, cpu::CpuBackend> && OffloadableChunk<FaultChunk, cpu::CpuBackend>);

}  // namespace pipeweave::test
