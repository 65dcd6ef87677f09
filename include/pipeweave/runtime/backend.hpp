#pragma once
/// \file
/// The device side of the interfaces the device session (runtime/session.hpp)
/// is written against, as C++20 concepts (runtime/chunk.hpp has the model's side:
/// Chunk, Loss, Optimizer):
///
/// - Backend: one device's memory and compute (buffers, copies, GEMM, elementwise
///   functors, reductions, a clock) on one in-order stream;
/// - Transport: one device's end of the point-to-point fabric (NCCL-style groups of
///   sends and receives, an agreement among all devices, abort).
///
/// Every Backend operation is *enqueued* on the device's stream and runs in order
/// with the operations enqueued before it. The CPU backend runs each one at once;
/// a GPU backend returns before the work is done. Code written against these
/// concepts therefore never reads device memory on the host except after
/// `synchronize()`, and never hands host memory to `upload`/`download` that it
/// touches again before `synchronize()`. Device buffers need no such care: a later
/// operation on the same stream sees the effect of every earlier one.

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "pipeweave/runtime/dtype.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/lowering.hpp"

namespace pipeweave {

/// Whether a GEMM operand is used as stored or transposed.
enum class Transpose : unsigned char { kNo, kYes };

namespace detail {

/// Stand-ins used only to state the concepts: an index functor and a value functor.
struct IndexProbe {
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t) const {}
};
struct ValueProbe {
  PIPEWEAVE_HOST_DEVICE float operator()(std::size_t) const { return 0.0f; }
};

}  // namespace detail

/// One device's memory and compute, on one in-order stream. All matrices of its
/// GEMM are fp32 and row-major; all pointers are device pointers unless said
/// otherwise. Tensors of other dtypes (runtime/dtype.hpp) live in buffers too:
/// allocate_tensor() below gives one the 4-byte words its bytes need.
///
/// - `Buffer`: an owning, movable, default-constructible (empty) array of floats with
///   `data()` and `size()`; it frees its memory when destroyed.
/// - `allocate(n)`: a buffer of n floats, contents undefined. `allocations()` counts
///   the calls so far (tests use it to prove that steady-state steps allocate nothing).
/// - `upload(host, device, n)`, `download(device, host, n)`: copies between host and
///   device memory; the host memory must stay untouched until `synchronize()`. A
///   GPU backend may block inside a copy to or from pageable host memory until
///   the stream reaches it, so code that may wait behind a transfer with a peer
///   calls `synchronize()` (which a transport makes poll for failures) first.
/// - `copy(src, dst, n)`, `fill(dst, n, value)`: device-to-device.
/// - `gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`:
///   C = alpha * op(A) * op(B) + beta * C with row-major op(A) m x k, op(B) k x n,
///   C m x n and leading dimensions (row strides) lda, ldb, ldc; beta = 0 ignores C.
/// - `for_each(n, f)`: calls f(i) for every i in [0, n), in any order or at once, on
///   the device; f is any trivially copyable functor marked PIPEWEAVE_HOST_DEVICE
///   (the built-in model's are in model/functors.hpp). A ParameterUpdate is the
///   one kind of functor that may write parameters.
/// - `sum(n, f, out)`: *out = the sum of f(i) over [0, n), written to device memory.
/// - `synchronize()`: waits until everything enqueued so far has completed; the
///   only wait of the executor on a device.
/// - `reset_clock()`, `time_stamp()`, `elapsed_us(stamp)`: `reset_clock` enqueues the
///   origin and forgets earlier stamps; `time_stamp` enqueues a time stamp and
///   returns its index; `elapsed_us` gives, after `synchronize()`, microseconds from
///   the origin to that stamp.
/// - `name()`: a short description for output, e.g. "cpu (OpenBLAS SkylakeX kernels)".
///
/// Two operations over a row-major matrix are optional; the layers call them through
/// for_each_element() and column_sums() below, which fall back on for_each where a
/// backend lacks them (the CPU backend has both, as loops that vectorize):
/// - `for_each_element(rows, cols, f)`: calls f(r, c) for every element, in any order
///   or at once;
/// - `column_sums(rows, cols, f, out)`: out[c] += the sum of f(r, c) over r = 0, 1,
///   ..., rows - 1, added up in that order from 0, for every column c.
template <class B>
concept Backend = std::movable<B> &&
    requires(B& b, const B& cb, typename B::Buffer& buffer, const typename B::Buffer& const_buffer, std::size_t n,
             const float* src, float* dst, float scalar, int dim, Transpose op) {
      typename B::Buffer;
      requires std::movable<typename B::Buffer> && std::default_initializable<typename B::Buffer>;
      { b.allocate(n) } -> std::same_as<typename B::Buffer>;
      { buffer.data() } -> std::same_as<float*>;
      { const_buffer.data() } -> std::same_as<const float*>;
      { const_buffer.size() } -> std::same_as<std::size_t>;
      { cb.allocations() } -> std::same_as<std::size_t>;
      b.upload(src, dst, n);
      b.download(src, dst, n);
      b.copy(src, dst, n);
      b.fill(dst, n, scalar);
      b.gemm(op, op, dim, dim, dim, scalar, src, dim, src, dim, scalar, dst, dim);
      b.for_each(n, detail::IndexProbe{});
      b.sum(n, detail::ValueProbe{}, dst);
      b.synchronize();
      b.reset_clock();
      { b.time_stamp() } -> std::same_as<std::size_t>;
      { cb.elapsed_us(n) } -> std::same_as<double>;
      { cb.name() } -> std::convertible_to<std::string_view>;
    };

/// A Backend that runs the two halves of an overlapped pair at once (a forward
/// and an independent backward of one device; see runtime/overlap.hpp):
///
/// - `side()`: a second backend of the same device with an in-order stream of its
///   own (a GPU backend: its own stream, cuBLAS handle, workspace and scratch).
///   Buffers of either are usable by both. The executor runs a pair's backward
///   on the side, from a second host thread, while its forward runs here. The
///   side's clock is this backend's: its `elapsed_us` counts from the origin that
///   this backend's `reset_clock()` set last (the side's own `reset_clock()` only
///   forgets its stamps), so the stamps of both halves of a step share one origin.
/// - `wait_for(other)`: work enqueued here from now on starts after everything
///   enqueued on `other` so far has completed. The CPU backend has nothing to do
///   (its operations are complete when they return; the host thread's join
///   orders them); a GPU backend makes its stream wait for an event of other's.
/// - `B::Mark`, `mark(m)` and `wait_for(m)`: the same in two parts, for a wait
///   taken later, from another thread: `mark(m)` records in `m` the point after
///   everything enqueued here so far (a GPU backend: an event of its stream), and
///   `wait_for(m)` on another backend of the device makes its later work start
///   after that point. A device's gradient reductions use it: the device marks
///   where each R stands in its work, and the reducer waits for that mark when it
///   takes the R, not when the R was handed to it (runtime/reducer.hpp).
template <class B>
concept OverlapBackend = Backend<B> && std::default_initializable<typename B::Mark> &&
                         requires(B& b, const B& cb, typename B::Mark& m, const typename B::Mark& cm) {
                           { cb.side() } -> std::same_as<B>;
                           b.wait_for(cb);
                           cb.mark(m);
                           b.wait_for(cm);
                         };

/// An OverlapBackend with host memory of its own that copies to and from its
/// buffers run beside its compute: `allocate_host(n)` gives n floats of it (on a
/// GPU page-locked, so that a copy on a stream returns at once and overlaps the
/// kernels of another; the CPU's: plain memory), whose `data()` upload() and
/// download() take as their host side. The session moves offloaded stashes (O, L)
/// on a copy_side() of the device, its copy lane, into and out of such memory: the lane
/// waits (wait_for) for the compute before each copy, and the compute waits (a
/// Mark) for a copy only where it reuses the memory an offload read, or reads what
/// a reload wrote (runtime/plan.hpp).
///
/// `copy_side()` is a side() for copies only (a GPU's: a stream of its own, without
/// the cuBLAS workspace a side for compute holds); the batch's inputs and targets
/// go to the device on one, a micro-batch at a time ahead of the forward that
/// reads them (runtime/batch_feed.hpp). A backend may also say which host memory
/// is page-locked already (`page_locked(p, n)`): the batch is copied from there
/// directly instead of through page-locked memory of the feed's own.
template <class B>
concept CopyLaneBackend = OverlapBackend<B> && requires(B& b, const B& cb, std::size_t n) {
  { b.allocate_host(n).data() } -> std::same_as<float*>;
  { b.allocate_host(n).size() } -> std::same_as<std::size_t>;
  { cb.copy_side() } -> std::same_as<B>;
};

/// A backend whose buffers are host memory (`B::kHostMemory`, the CPU's): the
/// host may read and write them directly once the backend's work is done, so a
/// collective can sum gradients where they lie (runtime/replicas.hpp).
template <class B>
concept HostMemoryBackend = Backend<B> && requires {
  requires B::kHostMemory;
};

/// A backend whose device must be current on a host thread before that thread
/// launches work for it (CUDA: cudaSetDevice, so that a chunk's own kernel launch
/// on `backend.stream()` goes to the right GPU). `bind_thread()` makes it so on the
/// calling thread; the runtime calls it once on every thread it starts for a
/// device (the device's thread and its side thread), before any action runs there.
template <class B>
concept ThreadBoundBackend = requires(const B& cb) { cb.bind_thread(); };

/// The floats `count` elements of `dtype` take: as many as their bytes need, rounded up.
constexpr std::size_t tensor_words(std::size_t count, DType dtype) {
  return (count * dtype_bytes(dtype) + sizeof(float) - 1) / sizeof(float);
}

/// A buffer for `count` elements of `dtype` (tensor_words() floats), viewed in
/// the dtype through tensor(). Contents undefined.
template <Backend B>
typename B::Buffer allocate_tensor(B& backend, std::size_t count, DType dtype) {
  return backend.allocate(tensor_words(count, dtype));
}

/// A view of `buffer` as a tensor of `dtype`.
template <class Buffer>
TensorRef tensor(Buffer& buffer, DType dtype) {
  return {static_cast<void*>(buffer.data()), dtype};
}

/// Binds the calling thread to `backend`'s device where the backend has one to bind.
template <class B>
void bind_thread(const B& backend) {
  if constexpr (ThreadBoundBackend<B>) backend.bind_thread();
}

namespace detail {

/// f(i / cols, i % cols): a functor of a matrix element called on a flat index.
template <class F>
struct AtElement {
  F f;
  std::size_t cols;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t i) const { f(i / cols, i % cols); }
};

/// out[c] += the sum of f(r, c) over increasing r, for one column c per call.
template <class F>
struct ColumnSumOf {
  F f;
  float* out;
  std::size_t rows;
  PIPEWEAVE_HOST_DEVICE void operator()(std::size_t c) const {
    float s = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) s += f(r, c);
    out[c] += s;
  }
};

}  // namespace detail

/// Calls f(r, c) for every element of a row-major rows x cols matrix, in any order
/// or at once (f touches only element (r, c) of what it writes): the backend's
/// own for_each_element where it has one, else one for_each call per element.
template <Backend B, class F>
void for_each_element(B& backend, std::size_t rows, std::size_t cols, F f) {
  if constexpr (requires { backend.for_each_element(rows, cols, f); })
    backend.for_each_element(rows, cols, f);
  else
    backend.for_each(rows * cols, detail::AtElement<F>{f, cols});
}

/// out[c] += f(0, c) + f(1, c) + ... + f(rows - 1, c), summed from 0 in that order
/// (so the result is the same on every backend), for every column c of a
/// row-major rows x cols matrix; `out` is device memory. f may also write its own
/// element elsewhere (e.g. the gradient whose column sums it returns). The
/// backend's own column_sums where it has one, else one for_each call per column.
template <Backend B, class F>
void column_sums(B& backend, std::size_t rows, std::size_t cols, F f, float* out) {
  if constexpr (requires { backend.column_sums(rows, cols, f, out); })
    backend.column_sums(rows, cols, f, out);
  else
    backend.for_each(cols, detail::ColumnSumOf<F>{f, out, rows});
}

/// What one message carries: which tensor (kind, producing virtual stage,
/// micro-batch), its dtype and how many bytes. A receive states what it expects;
/// the transport checks that the matching send agrees on all three.
struct Message {
  TensorId tensor{};            ///< kind, producing virtual stage, micro-batch
  std::size_t bytes = 0;        ///< payload size
  DType dtype = DType::kF32;    ///< the payload's element type
  friend constexpr bool operator==(const Message&, const Message&) = default;
};

/// Appends "activation(stage 0, micro-batch 2), 512 bytes of bf16" (see error_text).
inline void append_to(std::string& s, const Message& m) {
  append_to(s, m.tensor);
  s += ", " + std::to_string(m.bytes) + " bytes of ";
  append_to(s, m.dtype);
}

/// One device's end of the point-to-point fabric, with NCCL's matching rules: per
/// directed pair of devices, sends and receives match in FIFO order, without tags.
///
/// - `device()`, `devices()`: this device's index and the number of devices.
/// - `group_begin(step)`, `send(peer, message, data)`, `recv(peer, message, data)`,
///   `group_end()`: one group of operations posted by the lowered program's step
///   `step` (used in error messages). A send completes when its receive is posted; a
///   group completes when every one of its operations has been matched. The data
///   pointers are device pointers of `message.bytes` bytes.
/// - Ordering: an endpoint is bound to its device's Backend stream. The group reads
///   its send buffers after everything enqueued on that stream before `group_end()`,
///   and everything enqueued after `group_end()` sees the received data and may
///   overwrite the send buffers. (The CPU transport simply returns from `group_end()`
///   once the group is complete.)
/// - Checks: a received message whose tensor or byte count differs from what the
///   receive expects is an error naming both sides; a wait longer than the
///   transport's timeout is an error naming the device, the step and the message
///   waited for. Both throw pipeweave::Error.
/// - `agree(ok)`: collective over all devices; returns true when every device passed
///   true.
/// - `abort(reason)`: called by a failing device; every pending and later wait on any
///   device throws pipeweave::Error quoting `reason`, so no device hangs.
/// - `reset()`: collective; called by every device, concurrently, before the next
///   step after a failed one; returns once the transport is usable again.
template <class T>
concept Transport = requires(T& t, const T& ct, int peer, int step, const Message& message, const void* src,
                             void* dst, bool ok, std::string_view reason) {
  { ct.device() } -> std::same_as<int>;
  { ct.devices() } -> std::same_as<int>;
  t.group_begin(step);
  t.send(peer, message, src);
  t.recv(peer, message, dst);
  t.group_end();
  { t.agree(ok) } -> std::same_as<bool>;
  t.abort(reason);
  t.reset();
};

/// A functor that updates parameters, the only functors that may write them:
/// `for_each(n, f)` writes `f.w[0, n)` (the values of one parameter tensor) and
/// reads whatever else it needs. A rule's update functors say so with
/// `static constexpr bool kUpdatesParameters = true;`. A backend that keeps a copy
/// of the parameters (the CUDA backend's bf16 copy) refreshes it in the same pass.
template <class F>
concept ParameterUpdate = requires(const F& f) {
  requires F::kUpdatesParameters;
  { f.w } -> std::convertible_to<float*>;
};

}  // namespace pipeweave
