#pragma once
/// \file
/// NVTX ranges, so that Nsight Systems shows the schedule: every forward and
/// backward of a chunk is a range named like `F c1 m3` (phase, the device's local
/// chunk, micro-batch), every group of sends and receives a range `P2P step 12`,
/// all in the NVTX domain "pipeweave". NVTX3 is header-only (from the CUDA
/// toolkit); without a tool attached a range costs a few nanoseconds.
///
/// NvtxChunk wraps any Chunk and marks its calls, so the executor needs no
/// knowledge of NVTX:
///
/// \code
/// // chunks.emplace_back(pipeweave::cuda::NvtxChunk<MyChunk>(MyChunk{...}, /*chunk=*/c));
/// \endcode

#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <cstdio>
#include <span>
#include <utility>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/chunk.hpp"
#include "pipeweave/schedule/action.hpp"

namespace pipeweave::cuda {

/// The NVTX domain "pipeweave", created on first use.
inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("pipeweave");
  return domain;
}

/// ARGB colors of the ranges: forward, backward, P2P.
inline constexpr std::uint32_t kNvtxForward = 0xff4e79a7u;
inline constexpr std::uint32_t kNvtxBackward = 0xfff28e2bu;
inline constexpr std::uint32_t kNvtxP2P = 0xff9c9c9cu;

/// An NVTX range from construction to destruction on the calling thread.
class NvtxRange {
 public:
  /// Opens a range named `name` (copied by NVTX) with an ARGB color.
  NvtxRange(const char* name, std::uint32_t argb) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = argb;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &a);
  }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

/// Writes "F c1 m3" (or "B", "I", "W ...") into `out`; the label of an action's range.
inline void action_label(std::span<char> out, Phase phase, int chunk, int micro_batch) {
  std::snprintf(out.data(), out.size(), "%c c%d m%d", phase_letter(phase), chunk, micro_batch);
}

/// A Chunk that runs `C` and marks each forward and backward with an NVTX range
/// `F c<chunk> m<micro-batch>` / `B ...`, where chunk is the device's local index.
/// It keeps every concept of `C`: where `C` is a SplitChunk, so is the wrapper (its
/// backward_input and backward_weight marked `I ...` and `W ...`); where it is not,
/// neither is the wrapper; and so for RecomputableChunk and OffloadableChunk
/// (offload and reload marked `O ...` and `L ...`).
template <class C>
class NvtxChunk {
 public:
  /// Wraps `inner`, the device's local chunk `chunk`.
  NvtxChunk(C inner, int chunk) : inner_(std::move(inner)), chunk_(chunk) {}

  /// Recomputable where the inner chunk is (RecomputableChunk).
  static constexpr bool recomputable = RecomputableChunk<C>;

  /// Features entering the chunk.
  std::size_t input_size() const { return inner_.input_size(); }
  /// Features leaving the chunk.
  std::size_t output_size() const { return inner_.output_size(); }
  /// The inner chunk's dtypes.
  BoundaryDTypes dtypes() const { return chunk_dtypes(inner_); }
  /// See Chunk::reserve.
  template <class B>
  void reserve(B& backend, int slots, int rows) {
    inner_.reserve(backend, slots, rows);
  }
  /// The inner forward inside a range "F c<chunk> m<micro-batch>".
  template <class B>
  void forward(B& backend, const ChunkCall& call, ConstTensorRef x, TensorRef y) {
    marked(Phase::kForward, call.micro_batch, [&] { chunk_forward(inner_, backend, call, x, y); });
  }
  /// The inner backward inside a range "B c<chunk> m<micro-batch>".
  template <class B>
  void backward(B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    marked(Phase::kBackward, call.micro_batch, [&] { chunk_backward(inner_, backend, call, dy, dx); });
  }
  /// See SplitChunk::reserve_split; only where the inner chunk splits its backward.
  template <class B>
    requires requires(C& c, B& b) { c.reserve_split(b, 1, 1); }
  void reserve_split(B& backend, int slots, int rows) {
    inner_.reserve_split(backend, slots, rows);
  }
  /// The inner backward_input inside a range "I c<chunk> m<micro-batch>".
  template <class B>
    requires SplitChunk<C, B>
  void backward_input(B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
    marked(Phase::kBackwardInput, call.micro_batch, [&] { chunk_backward_input(inner_, backend, call, dy, dx); });
  }
  /// The inner backward_weight inside a range "W c<chunk> m<micro-batch>".
  template <class B>
    requires requires(C& c, B& b, const ChunkCall& call) { c.backward_weight(b, call); }
  void backward_weight(B& backend, const ChunkCall& call) {
    marked(Phase::kBackwardWeight, call.micro_batch, [&] { inner_.backward_weight(backend, call); });
  }
  /// See SizedChunk; only where the inner chunk says its slots' bytes.
  std::size_t slot_bytes(int rows) const
    requires SizedChunk<C>
  {
    return inner_.slot_bytes(rows);
  }
  /// See SizedChunk.
  std::size_t split_slot_bytes(int rows) const
    requires SizedChunk<C>
  {
    return inner_.split_slot_bytes(rows);
  }
  /// See OffloadableChunk; only where the inner chunk moves what it keeps.
  std::size_t offload_size(int rows) const
    requires requires(const C& c) { { c.offload_size(rows) } -> std::same_as<std::size_t>; }
  {
    return inner_.offload_size(rows);
  }
  /// The inner offload inside a range "O c<chunk> m<micro-batch>".
  template <class B>
    requires OffloadableChunk<C, B>
  void offload(B& backend, const ChunkCall& call, float* host) {
    marked(Phase::kOffload, call.micro_batch, [&] { inner_.offload(backend, call, host); });
  }
  /// The inner reload inside a range "L c<chunk> m<micro-batch>".
  template <class B>
    requires OffloadableChunk<C, B>
  void reload(B& backend, const ChunkCall& call, ConstTensorRef x, ConstTensorRef y, const float* host) {
    marked(Phase::kReload, call.micro_batch, [&] { inner_.reload(backend, call, x, y, host); });
  }
  /// See WeightOffloadableChunk; only where the inner chunk moves what it keeps for its W.
  std::size_t weight_offload_size(int rows) const
    requires requires(const C& c) { { c.weight_offload_size(rows) } -> std::same_as<std::size_t>; }
  {
    return inner_.weight_offload_size(rows);
  }
  /// The inner offload_for_weight inside a range "O c<chunk> m<micro-batch>".
  template <class B>
    requires WeightOffloadableChunk<C, B>
  void offload_for_weight(B& backend, const ChunkCall& call, float* host) {
    marked(Phase::kOffload, call.micro_batch, [&] { inner_.offload_for_weight(backend, call, host); });
  }
  /// The inner reload_for_weight inside a range "L c<chunk> m<micro-batch>".
  template <class B>
    requires WeightOffloadableChunk<C, B>
  void reload_for_weight(B& backend, const ChunkCall& call, ConstTensorRef x, ConstTensorRef dy, const float* host) {
    marked(Phase::kReload, call.micro_batch, [&] { inner_.reload_for_weight(backend, call, x, dy, host); });
  }
  /// The inner chunk's parameters.
  decltype(auto) parameters() const { return inner_.parameters(); }

  /// The wrapped chunk.
  C& inner() { return inner_; }
  /// The wrapped chunk.
  const C& inner() const { return inner_; }
  /// The device's local index of this chunk.
  int chunk() const { return chunk_; }

 private:
  // Runs `call` inside the range of the action.
  template <class Call>
  void marked(Phase phase, int micro_batch, Call&& call) {
    char label[48];
    action_label(label, phase, chunk_, micro_batch);
    const NvtxRange range(label, phase == Phase::kForward ? kNvtxForward : kNvtxBackward);  // I and W: backward's
    call();
  }

  C inner_;
  int chunk_;
};

}  // namespace pipeweave::cuda
