#pragma once
/// \file
/// The model's side of the interfaces the device session (runtime/session.hpp) is
/// written against, as C++20 concepts over a Backend (runtime/backend.hpp):
///
/// - Chunk (and SplitChunk, TensorChunk, RecomputableChunk, OffloadableChunk, WeightOffloadableChunk): what one model
///   chunk computes (forward,
///   backward, its parameters and gradients, the sizes and dtypes of the tensors
///   it takes and gives);
/// - Loss: the loss of the last stage's output and its gradient (model/loss.hpp
///   has MSE);
/// - Optimizer: the update rule of the parameters (model/optimizer.hpp has SGD
///   with momentum and Adam);
///
/// and what every host does with them: the calls that pass a chunk or a loss its
/// tensors as it takes them (chunk_forward, loss_forward_backward, ...) and the
/// checks of their dtypes and sizes before any step (check_chunk_dtypes,
/// check_neighbours, check_loss_dtype).

#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/runtime/error.hpp"

namespace pipeweave {

/// One parameter tensor of a chunk and its gradient, both in device memory, both
/// `count` floats.
struct ParameterView {
  float* value = nullptr;     ///< the parameters
  float* gradient = nullptr;  ///< their gradients, same layout
  std::size_t count = 0;      ///< floats in each
};

/// Which micro-batch a chunk call works on, and where what it keeps lives.
struct ChunkCall {
  int micro_batch = 0;  ///< the micro-batch, 0..M-1
  int slot = 0;         ///< the stash slot of this micro-batch, 0..slots-1 (see Chunk::reserve)
  int rows = 0;         ///< samples in the micro-batch
  long long step = 0;   ///< optimizer updates applied before this training step (a resumed run goes on
                        ///< counting): with micro_batch, the seed of a random mask a forward run again must repeat
};

/// What one model chunk computes: the executor calls it for every forward and
/// backward of its virtual stage and never looks inside. The built-in layer stack
/// (model/mlp.hpp) is one such chunk; a user's own kernels are another.
///
/// - `input_size()`, `output_size()`: elements per sample of the tensor entering
///   the chunk and of the tensor leaving it. The message a chunk sends forward is
///   rows * output_size() elements of its output dtype; backward it sends
///   rows * input_size() elements of its input dtype.
/// - optionally `dtypes()`: the BoundaryDTypes of its ends (runtime/dtype.hpp):
///   `input`, of x and dx, and `output`, of y and dy. Without it, both are fp32.
///   Neighbouring chunks must agree (a pipeline whose stages disagree does not
///   build), and so must the first stage and the batch (fp32), the last stage and
///   the loss (a floating dtype).
/// - `reserve(backend, slots, rows)`: allocates what the chunk keeps for up to
///   `slots` micro-batches in flight at once, of `rows` samples each, and any
///   scratch. Called before the first step (again only if slots or rows change);
///   forward and backward must not allocate afterwards.
/// - `forward(backend, call, x, y)`: reads x (rows x input_size), writes y
///   (rows x output_size) and keeps in slot `call.slot` what backward needs. It may
///   keep the pointers x and y: the executor leaves both tensors unchanged until
///   the micro-batch's backward returns (in the same slot, unless an offload moved
///   the stash: see OffloadableChunk).
/// - `backward(backend, call, dy, dx)`: reads dy (rows x output_size), *adds* the
///   parameter gradients into the gradient buffers of `parameters()`, and writes dx
///   (rows x input_size) unless dx is empty (the first virtual stage needs no input
///   gradient). The slot is free for another micro-batch afterwards.
/// - `parameters()`: the chunk's parameters and gradients, stable for its lifetime.
///   The executor zeroes the gradients before each step and applies the optimizer
///   after it.
/// - optionally `parameter_copy_dtype()` and `use_parameter_copies(views)`: copies
///   of its parameters in a low precision that the engine keeps up to date
///   (CopiesParameters, runtime/parameter_copies.hpp).
///
/// The tensors come as views, x and dy a ConstTensorRef, y and dx a TensorRef
/// (`x.as<bf16>()` gives the memory and checks the dtype), or, for a chunk whose
/// ends are both fp32, as `const float*` and `float*` if its calls take those
/// (TensorChunk says which; chunk_forward() and its siblings below make the call
/// either way). All work is enqueued on `backend`'s stream; a chunk never
/// synchronizes.
template <class C, class B>
concept Chunk = Backend<B> && std::movable<C> &&
    requires(C& c, const C& cc, B& b, const ChunkCall& call, int count, const float* in, float* out) {
      { cc.input_size() } -> std::same_as<std::size_t>;
      { cc.output_size() } -> std::same_as<std::size_t>;
      c.reserve(b, count, count);
      c.forward(b, call, in, out);
      c.backward(b, call, in, out);
      { c.parameters() } -> std::convertible_to<std::span<const ParameterView>>;
    };

/// A Chunk whose calls take tensor views (and so may have ends of any dtype).
template <class C, class B>
concept TensorChunk = Chunk<C, B> && requires(C& c, B& b, const ChunkCall& call, ConstTensorRef in, TensorRef out) {
  c.forward(b, call, in, out);
  c.backward(b, call, in, out);
};

/// A Chunk whose backward also runs in two halves, as the zero-bubble schedules
/// (I and W actions) call it. A micro-batch's backward is then either
/// `backward` or `backward_input` followed, later, by `backward_weight`:
///
/// - `reserve_split(backend, slots, rows)`: like `reserve`, for what a slot keeps
///   from its `backward_input` until its `backward_weight`; called after `reserve`
///   when the schedule splits backwards.
/// - `backward_input(backend, call, dy, dx)`: reads dy, writes dx unless empty,
///   and keeps in slot `call.slot` what the parameter gradients need. The executor
///   leaves x, y and dy unchanged until `backward_weight` of the slot returns.
/// - `backward_weight(backend, call)`: *adds* the parameter gradients of the
///   micro-batch; the slot is free afterwards.
///
/// Together the halves must add the same gradients as `backward`; a chunk whose
/// halves run the same arithmetic as its `backward` (as MlpChunk's do) trains bit
/// for bit alike through split and full backwards.
template <class C, class B>
concept SplitChunk = Chunk<C, B> && requires(C& c, B& b, const ChunkCall& call, int count, const float* in, float* out) {
  c.reserve_split(b, count, count);
  c.backward_input(b, call, in, out);
  c.backward_weight(b, call);
};

/// A Chunk that may be recomputed (a program's C actions): its forward, run
/// again on the same input into another slot, keeps there what its backward
/// reads, exactly as the first time. Nothing else it holds changes between the
/// two (no dropout mask drawn anew, no running statistics updated), so the
/// training stays bit for bit what it is without recomputation. A chunk says so:
/// `static constexpr bool recomputable = true;`. The session runs a recomputed
/// micro-batch's forward in a slot it frees at once (the chunk keeps nothing
/// of it), and its C in a slot held until its backward ends (B, or W).
template <class C>
concept RecomputableChunk = requires {
  { C::recomputable } -> std::convertible_to<bool>;
  requires C::recomputable;
};

/// A Chunk whose stash may go to host memory and come back (a program's O and L
/// actions): what a slot keeps moves out at the offload and back, into another
/// slot perhaps, at the reload, exactly, so the training stays bit for bit what
/// it is without offload. The session owns the host memory and the tensors x
/// and y of the micro-batch, which it moves itself where their buffers are not
/// needed meanwhile (runtime/plan.hpp); the chunk moves what it keeps itself.
///
/// - `offload_size(rows)`: floats of host memory one micro-batch of `rows`
///   samples needs.
/// - `offload(backend, call, host)`: copies what slot `call.slot` keeps to
///   `host` (enqueued, with `download`); the slot is free for another
///   micro-batch afterwards.
/// - `reload(backend, call, x, y, host)`: copies it back into slot `call.slot`
///   (enqueued, with `upload`); x and y are the micro-batch's input and output
///   as the forward had them (the same values, possibly in other buffers: a
///   chunk that kept pointers to them takes these). The backward then runs as
///   if the stash had never left.
///
/// The host memory is the session's, untouched by anyone else from the offload
/// to the reload.
template <class C, class B>
concept OffloadableChunk =
    Chunk<C, B> && requires(C& c, const C& cc, B& b, const ChunkCall& call, int rows, float* host, const float* from,
                            ConstTensorRef x, ConstTensorRef y) {
      { cc.offload_size(rows) } -> std::same_as<std::size_t>;
      c.offload(b, call, host);
      c.reload(b, call, x, y, from);
    };

/// An OffloadableChunk and SplitChunk whose slot may also go to host memory
/// in a weight window: after the micro-batch's `backward_input`, back before
/// its `backward_weight` (a program's O after an I, its L before the W). What
/// moves is what the slot keeps for `backward_weight`; the session moves the
/// micro-batch's x, y and dy itself, where their buffers are not needed
/// meanwhile, and hands x and dy back at the reload (`backward_weight` reads
/// no y).
///
/// - `weight_offload_size(rows)`: floats of host memory one micro-batch of
///   `rows` samples needs there.
/// - `offload_for_weight(backend, call, host)`: copies what slot `call.slot`
///   keeps for `backward_weight` to `host` (enqueued); the slot is free for
///   another micro-batch afterwards.
/// - `reload_for_weight(backend, call, x, dy, host)`: copies it back into slot
///   `call.slot`, perhaps another (enqueued); x and dy are the micro-batch's
///   input and output gradient as `backward_input` had them.
template <class C, class B>
concept WeightOffloadableChunk =
    OffloadableChunk<C, B> && SplitChunk<C, B> &&
    requires(C& c, const C& cc, B& b, const ChunkCall& call, int rows, float* host, const float* from,
             ConstTensorRef x, ConstTensorRef dy) {
      { cc.weight_offload_size(rows) } -> std::same_as<std::size_t>;
      c.offload_for_weight(b, call, host);
      c.reload_for_weight(b, call, x, dy, from);
    };

/// A Chunk that says how many bytes its stash slots hold, so that the session
/// measures, in bytes, what a device keeps (Trace::peak_bytes,
/// runtime/held_memory.hpp):
///
/// - `slot_bytes(rows)`: what one slot keeps of a micro-batch of `rows`
///   samples from its forward (or recomputation, or reload) to its backward
///   (or W, or offload);
/// - `split_slot_bytes(rows)`: what it keeps besides from `backward_input`
///   to `backward_weight` (0 for a chunk that never splits).
///
/// The micro-batch's x, y and kept output gradient are the session's buffers,
/// which it counts itself.
template <class C>
concept SizedChunk = requires(const C& cc, int rows) {
  { cc.slot_bytes(rows) } -> std::same_as<std::size_t>;
  { cc.split_slot_bytes(rows) } -> std::same_as<std::size_t>;
};

/// The dtypes of a chunk's ends: its `dtypes()`, or fp32 at both.
template <class C>
BoundaryDTypes chunk_dtypes(const C& chunk) {
  if constexpr (requires { { chunk.dtypes() } -> std::convertible_to<BoundaryDTypes>; })
    return chunk.dtypes();
  else
    return {};
}

/// Throws pipeweave::Error, starting with `who`, unless the dtypes of the chunk
/// of virtual stage `stage` (of `stages`) can run: a chunk whose calls take fp32
/// pointers has fp32 ends; the first stage takes the batch's fp32 inputs; the
/// last stage gives the loss a floating dtype.
template <Backend B, class C>
  requires Chunk<C, B>
void check_chunk_dtypes(const C& chunk, int stage, int stages, std::string_view who) {
  const BoundaryDTypes d = chunk_dtypes(chunk);
  if (!TensorChunk<C, B> && d != BoundaryDTypes{})
    throw_error({}, who, ": the chunk of virtual stage ", stage, " declares ", d.input, " input and ", d.output,
                " output, but its calls take fp32 pointers (a chunk of other dtypes takes ConstTensorRef and "
                "TensorRef; runtime/chunk.hpp)");
  if (stage == 0 && d.input != DType::kF32)
    throw_error({}, who, ": virtual stage 0 takes ", d.input, " input, but the batch's inputs are fp32");
  if (stage == stages - 1 && !dtype_row(d.output).floating)
    throw_error({}, who, ": virtual stage ", stage, " gives ", d.output,
                " output, but the loss reads a floating dtype (fp32 or bf16)");
}

/// What a chunk takes and gives: elements per sample and dtypes of its ends.
struct StageEnds {
  std::size_t input_size = 0, output_size = 0;
  BoundaryDTypes dtypes{};
};

/// The ends of `chunk`.
template <class C>
StageEnds stage_ends(const C& chunk) {
  return {chunk.input_size(), chunk.output_size(), chunk_dtypes(chunk)};
}

/// Throws pipeweave::Error, starting with `who`, unless virtual stage `stage`
/// (ends `from`) gives what stage + 1 (ends `to`) takes: as many elements per
/// sample, of one dtype.
inline void check_neighbours(const StageEnds& from, const StageEnds& to, int stage, std::string_view who) {
  if (from.output_size != to.input_size)
    throw_error({}, who, ": the model does not match the program: virtual stage ", stage, " gives ", from.output_size,
                " features per sample, but stage ", stage + 1, " takes ", to.input_size);
  const DType gives = from.dtypes.output, takes = to.dtypes.input;
  if (gives != takes)
    throw_error({}, who, ": virtual stage ", stage, " gives ", gives, " activations (and takes ", gives,
                " gradients), but stage ", stage + 1, " takes ", takes, "; neighbouring chunks must agree");
}

/// Runs `chunk.forward` with views, or with fp32 pointers for a chunk whose calls take those.
template <class C, Backend B>
  requires Chunk<C, B>
void chunk_forward(C& chunk, B& backend, const ChunkCall& call, ConstTensorRef x, TensorRef y) {
  if constexpr (TensorChunk<C, B>)
    chunk.forward(backend, call, x, y);
  else
    chunk.forward(backend, call, x.as<float>(), y.as<float>());
}
/// Runs `chunk.backward` (see chunk_forward).
template <class C, Backend B>
  requires Chunk<C, B>
void chunk_backward(C& chunk, B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
  if constexpr (TensorChunk<C, B>)
    chunk.backward(backend, call, dy, dx);
  else
    chunk.backward(backend, call, dy.as<float>(), dx.as<float>());
}
/// Runs `chunk.backward_input` (see chunk_forward).
template <class C, Backend B>
  requires SplitChunk<C, B>
void chunk_backward_input(C& chunk, B& backend, const ChunkCall& call, ConstTensorRef dy, TensorRef dx) {
  if constexpr (requires { chunk.backward_input(backend, call, dy, dx); })
    chunk.backward_input(backend, call, dy, dx);
  else
    chunk.backward_input(backend, call, dy.as<float>(), dx.as<float>());
}

/// Which micro-batch a loss call works on and its shape.
struct LossCall {
  int micro_batch = 0;        ///< the micro-batch, 0..M-1
  int rows = 0;               ///< samples in the micro-batch
  std::size_t features = 0;   ///< floats per sample of the last stage's output
};

/// The loss of the model's output, computed on the device of the last virtual
/// stage right after the forward that produces the output.
///
/// - `target_size(features)`: floats per sample of the target, for an output of
///   `features` floats per sample (MSE: the same; a class index: 1). The targets
///   of a batch are rows x target_size floats, row-major.
/// - `reserve(backend, rows, features)`: allocates any scratch for micro-batches
///   of `rows` samples; called once before the first step.
/// - `forward_backward(backend, call, y, target, dy, loss)`: reads the output y
///   (rows x features) and the targets of the micro-batch, writes the micro-batch's
///   loss to `*loss` and its gradient with respect to y to dy (rows x features),
///   all in device memory. The loss of a step is the mean of the micro-batch
///   losses, and the gradients are averaged the same way, so a loss that is a
///   mean over its micro-batch makes a step the same for every M.
///
/// y and dy have the last stage's output dtype: they come as views (ConstTensorRef,
/// TensorRef) where forward_backward takes those, else as fp32 pointers
/// (loss_forward_backward() makes the call either way). The targets and the loss
/// are fp32.
template <class L, class B>
concept Loss = Backend<B> && std::movable<L> &&
    requires(L& l, const L& cl, B& b, const LossCall& call, std::size_t n, int rows, const float* y,
             const float* target, float* dy, float* loss) {
      { cl.target_size(n) } -> std::same_as<std::size_t>;
      l.reserve(b, rows, n);
      l.forward_backward(b, call, y, target, dy, loss);
    };

/// A Loss whose forward_backward takes views (and so may read an output of any floating dtype).
template <class L, class B>
concept TensorLoss = Loss<L, B> && requires(L& l, B& b, const LossCall& call, ConstTensorRef y, const float* target,
                                            TensorRef dy, float* loss) {
  l.forward_backward(b, call, y, target, dy, loss);
};

/// Throws pipeweave::Error, starting with `who`, unless the loss can read the
/// last virtual stage's (`stage`'s) output of dtype `output`: a loss whose call
/// takes fp32 pointers reads fp32 only.
template <class L, Backend B>
  requires Loss<L, B>
void check_loss_dtype(DType output, int stage, std::string_view who) {
  if (!TensorLoss<L, B> && output != DType::kF32)
    throw_error({}, who, ": virtual stage ", stage, " gives ", output,
                " output, but the loss takes fp32 pointers (a loss of other dtypes takes ConstTensorRef and TensorRef)");
}

/// Runs `loss.forward_backward` with views, or with fp32 pointers for a loss whose call takes those.
template <class L, Backend B>
  requires Loss<L, B>
void loss_forward_backward(L& loss, B& backend, const LossCall& call, ConstTensorRef y, const float* target,
                           TensorRef dy, float* out) {
  if constexpr (TensorLoss<L, B>)
    loss.forward_backward(backend, call, y, target, dy, out);
  else
    loss.forward_backward(backend, call, y.as<float>(), target, dy.as<float>(), out);
}

/// What an optimizer's update is told about the step.
struct OptimizerStep {
  long long t = 1;          ///< updates applied so far, this one included (Adam's bias correction)
  float grad_scale = 1.0f;  ///< multiplies every gradient (1/M: the mean over the micro-batches)
};

/// The update rule of the parameters: a small copyable value (the rule and its
/// hyper-parameters); the state it keeps per parameter tensor is allocated and
/// zeroed by whoever applies it (OptimizerState in runtime/optimizer_state.hpp).
///
/// - `state_buffers()`: how many buffers of `count` floats each parameter tensor
///   keeps (momentum: 1, Adam: 2, plain SGD: 0).
/// - `update(backend, parameter, state, step)`: enqueues one update of
///   `parameter.value` from `parameter.gradient` times `step.grad_scale`, reading
///   and writing its `state` buffers.
/// - optionally `check()`: throws pipeweave::Error naming a hyper-parameter out of range.
template <class O, class B>
concept Optimizer = Backend<B> && std::copy_constructible<O> &&
    requires(const O& o, B& b, const ParameterView& p, std::span<float* const> state, const OptimizerStep& step) {
      { o.state_buffers() } -> std::convertible_to<int>;
      o.update(b, p, state, step);
    };

}  // namespace pipeweave
