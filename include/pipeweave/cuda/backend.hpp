#pragma once
/// \file
/// The CUDA backend: one device's memory and compute on one CUDA stream. Buffers
/// are device memory; GEMMs run on cuBLAS (fp32, TF32, or bf16 operands with fp32
/// accumulation, the weights read from a bf16 copy that each optimizer step
/// refreshes); elementwise functors run through
/// Thrust on the stream (`thrust::cuda::par_nosync.on(stream)`), reductions through
/// CUB into device memory; the clock is a series of CUDA events. Nothing here waits
/// for the GPU except synchronize() (and download() into pageable memory, which the
/// CUDA runtime completes before it returns).
///
/// Every function is enqueued on the backend's stream and returns at once, so a
/// step of the executor runs ahead of the GPU. The backend belongs to one host
/// thread at a time; each call makes the backend's GPU current on that thread.
///
/// \code
/// pipeweave::cuda::CudaBackend b(/*gpu=*/0, {.math = pipeweave::cuda::MathMode::kTf32});
/// auto x = b.allocate(1024);
/// b.fill(x.data(), x.size(), 1.0f);
/// b.synchronize();
/// \endcode

#include <cub/device/device_reduce.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>
#include <thrust/transform.h>

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/gemm.hpp"
#include "pipeweave/cuda/handles.hpp"
#include "pipeweave/cuda/precision.hpp"
#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/runtime/poll.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave {

/// CUDA's bfloat16 is a second name of the bf16 dtype: a chunk's kernels may
/// take `x.as<__nv_bfloat16>()` (runtime/dtype.hpp).
template <>
struct DTypeOf<__nv_bfloat16> : std::integral_constant<DType, DType::kBF16> {};
static_assert(sizeof(__nv_bfloat16) == sizeof(bf16));

}  // namespace pipeweave

namespace pipeweave::cuda {

/// An owning array of floats in device memory; the backend's Buffer.
using DeviceBuffer = DeviceArray<float>;

/// What only the CUDA backend has, beside the run's PipelineOptions: the
/// arithmetic and cuBLAS workspace of each device's backend, the transport
/// between the devices of a process, and where the devices run.
struct CudaOptions {
  MathMode math = MathMode::kFp32;                 ///< the arithmetic of every GEMM
  std::size_t cublas_workspace = 32u << 20;        ///< bytes of cuBLAS workspace per backend, allocated once
  TransportKind transport = TransportKind::kAuto;  ///< devices of one process: see resolve_gpu_transport(); MPI runs: kAuto
  /// One process: [device thread g] -> GPU, g = r * P + d for device d of replica
  /// r (P x D entries; one replica: P); empty: place_devices(P x D, GPUs visible),
  /// which puts a replica's devices on one GPU before the next. One rank per
  /// device: this rank's GPU as the only entry; empty: its index among the ranks
  /// of its machine, modulo the GPUs it sees (rank_gpu()).
  std::vector<int> gpus{};
};

/// Called while synchronize() waits, with the time waited so far; it may throw to
/// stop the wait (a transport uses it to notice a failed peer or a timeout).
using WaitCheck = std::function<void(std::chrono::steady_clock::duration waited)>;

namespace detail {

/// The shape of column_sums' kernel: a block sums kSumColumns adjacent columns (one
/// warp wide, so that a row of them is one coalesced access) through tiles of
/// kSumTileRows rows, which kSumLoaders warps evaluate, kSumRowsEach rows each.
inline constexpr unsigned kSumColumns = 32;
inline constexpr unsigned kSumLoaders = 8;
inline constexpr unsigned kSumRowsEach = 8;
inline constexpr unsigned kSumTileRows = kSumLoaders * kSumRowsEach;

/// out[c] += f(0, c) + f(1, c) + ... + f(rows - 1, c), added up from 0 in that order,
/// for the block's kSumColumns columns; the block is kSumColumns x (1 + kSumLoaders)
/// threads. The parallelism is across columns and across the evaluations of f,
/// never across the additions of one column: the loader warps (threadIdx.y >= 1)
/// evaluate f on a tile of rows into shared memory, each thread kSumRowsEach
/// independent rows, while warp 0 adds up the tile before, one thread per column,
/// row by row. Two tile buffers alternate, so the loads of a tile overlap the
/// additions of the one before; f is called once per element, as it may write its
/// element elsewhere.
template <class F>
__global__ void __launch_bounds__(kSumColumns*(1 + kSumLoaders))
    column_sums_kernel(std::size_t rows, std::size_t cols, F f, float* out) {
  __shared__ float tile[2][kSumTileRows][kSumColumns];
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  const bool in_matrix = c < cols;
  const std::size_t tiles = (rows + kSumTileRows - 1) / kSumTileRows;
  float s = 0.0f;
  // Round t: the loaders fill buffer t % 2 with tile t, warp 0 adds tile t - 1
  // from the other buffer; the barrier ends the round for both (every thread
  // runs every round, so each barrier is reached by the whole block).
  for (std::size_t t = 0; t <= tiles; ++t) {
    if (threadIdx.y > 0) {
      if (t < tiles) {
        const unsigned lane_row = threadIdx.y - 1;
        const std::size_t first = t * kSumTileRows + lane_row;
        float v[kSumRowsEach];
#pragma unroll
        for (unsigned j = 0; j < kSumRowsEach; ++j) {
          const std::size_t r = first + static_cast<std::size_t>(j) * kSumLoaders;
          v[j] = in_matrix && r < rows ? f(r, c) : 0.0f;
        }
#pragma unroll
        for (unsigned j = 0; j < kSumRowsEach; ++j) tile[t % 2][lane_row + j * kSumLoaders][threadIdx.x] = v[j];
      }
    } else if (t > 0 && in_matrix) {
      const std::size_t begin = (t - 1) * kSumTileRows;
      const std::size_t n = rows - begin < kSumTileRows ? rows - begin : kSumTileRows;
      const float(&rows_of)[kSumTileRows][kSumColumns] = tile[(t - 1) % 2];
#pragma unroll 16
      for (std::size_t i = 0; i < n; ++i) s += rows_of[i][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && in_matrix) out[c] += s;
}

/// fp32 -> bf16, rounding to nearest even.
struct ToBf16 {
  __host__ __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};

/// An optimizer update that also writes the bf16 copy of what it updates, in the
/// same kernel.
template <class Update>
struct UpdateAndCopy {
  Update update;
  __nv_bfloat16* copy;
  __host__ __device__ void operator()(std::size_t i) const {
    update(i);
    copy[i] = __float2bfloat16_rn(update.w[i]);
  }
};

/// A bf16 copy of `count` parameters at `begin`.
struct Bf16Copy {
  const float* begin = nullptr;
  std::size_t count = 0;
  DeviceArray<__nv_bfloat16> copy;

  /// Whether [p, p + n) lies inside the copied range.
  bool holds(const float* p, std::size_t n) const {
    const auto b = reinterpret_cast<std::uintptr_t>(begin), q = reinterpret_cast<std::uintptr_t>(p);
    return q >= b && q + n * sizeof(float) <= b + count * sizeof(float);
  }
  /// Whether [p, p + n) shares memory with the copied range.
  bool overlaps(const void* p, std::size_t bytes) const {
    const auto b = reinterpret_cast<std::uintptr_t>(begin), q = reinterpret_cast<std::uintptr_t>(p);
    return bytes > 0 && q < b + count * sizeof(float) && b < q + bytes;
  }
};

/// Device memory that grows when asked for more and is otherwise reused; stream
/// ordered (cudaMallocAsync / cudaFreeAsync), so growing it never waits for the GPU.
class Scratch {
 public:
  Scratch() = default;
  Scratch(Scratch&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), stream_(o.stream_) {}
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(stream_, o.stream_);
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
  }

  /// At least `bytes` bytes, usable by work enqueued on `stream` from now on.
  void* get(std::size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_ && stream == stream_) return data_;
    std::size_t grow = bytes_ + bytes_ / 2;
    if (grow < bytes) grow = bytes;
    if (grow < 4096) grow = 4096;
    if (data_ != nullptr) PIPEWEAVE_CHECK_CUDA(cudaFreeAsync(data_, stream_));
    data_ = nullptr;
    bytes_ = 0;
    stream_ = stream;
    PIPEWEAVE_CHECK_CUDA(cudaMallocAsync(&data_, grow, stream));
    bytes_ = grow;
    return data_;
  }
  /// Bytes held now.
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// Elements a row-major rows x cols matrix with row stride ld spans.
constexpr std::size_t span_of(int rows, int cols, int ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(cols);
}

}  // namespace detail

/// The CUDA backend of one device. Satisfies pipeweave::Backend.
class CudaBackend {
  // The Thrust execution policy of the stream: asynchronous, no synchronization.
  auto policy() const -> decltype(thrust::cuda::par_nosync.on(cudaStream_t{})) {
    return thrust::cuda::par_nosync.on(stream_.get());
  }

 public:
  /// The buffer type of this backend: device memory.
  using Buffer = DeviceBuffer;

  /// A backend on GPU `gpu`, with its own non-blocking stream, cuBLAS handle and
  /// workspace. Makes `gpu` current on the calling thread.
  explicit CudaBackend(int gpu = 0, const CudaOptions& options = {})
      : gpu_(select(gpu)),
        math_(options.math),
        device_name_(query_name(gpu)),
        name_("cuda (" + device_name_ + ", cuBLAS " + std::string(math_name(options.math)) + ", Thrust)"),
        cublas_(stream_.get()),
        workspace_(options.cublas_workspace),
        origin_(std::make_shared<Event>(true)) {
    if (workspace_.size() > 0)
      PIPEWEAVE_CHECK_CUBLAS(cublasSetWorkspace(cublas_.get(), workspace_.data(), workspace_.size()));
    PIPEWEAVE_CHECK_CUBLAS(cublasSetMathMode(cublas_.get(), math_ == MathMode::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                                      : CUBLAS_DEFAULT_MATH));
  }

  /// The GPU this backend runs on.
  int gpu() const { return gpu_; }
  /// The stream every operation is enqueued on.
  cudaStream_t stream() const { return stream_.get(); }
  /// The cuBLAS handle (bound to stream()).
  cublasHandle_t cublas() const { return cublas_.get(); }
  /// The arithmetic of the GEMMs.
  MathMode math() const { return math_; }
  /// The GPU's name, e.g. "NVIDIA H200".
  const std::string& device_name() const { return device_name_; }
  /// Installs the check synchronize() calls while it waits; an empty function
  /// makes synchronize() block in the CUDA runtime instead of polling.
  void set_wait_check(WaitCheck check) { wait_check_ = std::move(check); }

  /// A buffer of n floats in device memory, contents undefined.
  Buffer allocate(std::size_t n) {
    activate();
    ++allocations_;
    Buffer buffer(n);
    // Memory freed and handed out again: a bf16 copy of what lived there is void.
    std::erase_if(bf16_copies_, [&](const detail::Bf16Copy& c) { return c.overlaps(buffer.data(), buffer.bytes()); });
    return buffer;
  }
  /// Number of allocate() calls so far.
  std::size_t allocations() const { return allocations_; }
  /// n floats of page-locked host memory (CopyLaneBackend): upload() and
  /// download() between it and device memory return at once, and run beside
  /// the work of the GPU's other streams. Counted by allocations().
  PinnedArray<float> allocate_host(std::size_t n) {
    activate();
    ++allocations_;
    return PinnedArray<float>(n);
  }

  /// Host to device; `host` must stay untouched until synchronize().
  void upload(const float* host, float* device, std::size_t n) {
    if (n == 0) return;
    activate();
    PIPEWEAVE_CHECK_CUDA(cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, stream()));
    written(device, n);
  }
  /// Device to host; read `host` after synchronize().
  void download(const float* device, float* host, std::size_t n) {
    if (n == 0) return;
    activate();
    PIPEWEAVE_CHECK_CUDA(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream()));
  }
  /// dst[0..n) = src[0..n), both in device memory.
  void copy(const float* src, float* dst, std::size_t n) {
    if (n == 0 || src == dst) return;
    activate();
    PIPEWEAVE_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
    written(dst, n);
  }
  /// dst[0..n) = value (a memset for +0.0f).
  void fill(float* dst, std::size_t n, float value) {
    if (n == 0) return;
    activate();
    if (std::bit_cast<std::uint32_t>(value) == 0u)
      PIPEWEAVE_CHECK_CUDA(cudaMemsetAsync(dst, 0, n * sizeof(float), stream()));
    else
      run_thrust("fill", [&] { thrust::fill_n(policy(), dst, n, value); });
    written(dst, n);
  }

  /// C = alpha * op(A) * op(B) + beta * C, row-major, on cuBLAS in the backend's
  /// math mode. In bf16 mode each operand is read from a bf16 copy: the
  /// parameters' copy when the operand lies in parameters the optimizer updates
  /// (see for_each), else a rounding into scratch memory (one Thrust transform);
  /// C stays fp32.
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    if (m <= 0 || n <= 0) return;
    activate();
    const bool ta_t = ta == Transpose::kYes, tb_t = tb == Transpose::kYes;
    if (math_ != MathMode::kBf16) {
      cuda::gemm(cublas_.get(), math_, ta_t, tb_t, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      written(c, detail::span_of(m, n, ldc));
      return;
    }
    const std::size_t na = ta_t ? detail::span_of(k, m, lda) : detail::span_of(m, k, lda);
    const std::size_t nb = tb_t ? detail::span_of(n, k, ldb) : detail::span_of(k, n, ldb);
    const __nv_bfloat16* a16 = parameter_copy(a, na);
    const __nv_bfloat16* b16 = parameter_copy(b, nb);
    const std::size_t a_bytes = a16 != nullptr ? 0 : (na * sizeof(__nv_bfloat16) + 255) / 256 * 256;
    const std::size_t b_bytes = b16 != nullptr ? 0 : nb * sizeof(__nv_bfloat16);
    if (a_bytes + b_bytes > 0) {
      auto* base = static_cast<unsigned char*>(scratch_.get(a_bytes + b_bytes + 256, stream()));
      run_thrust("bf16 conversion", [&] {
        if (a16 == nullptr) a16 = to_bf16(a, na, reinterpret_cast<__nv_bfloat16*>(base));
        if (b16 == nullptr) b16 = to_bf16(b, nb, reinterpret_cast<__nv_bfloat16*>(base + a_bytes));
      });
    }
    gemm_bf16_fp32(cublas_.get(), ta_t, tb_t, m, n, k, alpha, a16, lda, b16, ldb, beta, c, ldc);
    written(c, detail::span_of(m, n, ldc));
  }

  /// bf16 mode: fp32 values the GEMMs have rounded to bf16 so far (operands not
  /// read from a parameter copy); a step that reads its weights from their copy
  /// rounds only activations and gradients.
  std::size_t bf16_rounded() const { return bf16_rounded_; }
  /// bf16 mode: parameter ranges with a bf16 copy (one per optimizer update seen).
  std::size_t bf16_parameter_copies() const { return bf16_copies_.size(); }

  /// Calls f(i) for every i in [0, n) on the GPU (Thrust, no synchronization).
  ///
  /// In bf16 mode an optimizer update (a ParameterUpdate, runtime/backend.hpp) also writes a bf16
  /// copy of the n parameters it updates, in the same kernel; the copy is made at
  /// the first update of that range, and gemm() reads any operand inside the range
  /// from it. So the weights are rounded to bf16 once per optimizer step, not in
  /// every GEMM. upload, copy, fill and gemm refresh the copy when they write into
  /// the range; parameters must not be written by any other functor.
  template <class F>
  void for_each(std::size_t n, F f) {
    if (n == 0) return;
    activate();
    if constexpr (ParameterUpdate<F>) {
      if (math_ == MathMode::kBf16) {
        const detail::UpdateAndCopy<F> both{f, copy_for_update(f.w, n)};
        run_thrust("for_each", [&] {
          thrust::for_each_n(policy(), thrust::counting_iterator<std::size_t>(0), n, both);
        });
        return;
      }
    }
    run_thrust("for_each", [&] {
      thrust::for_each_n(policy(), thrust::counting_iterator<std::size_t>(0), n, f);
    });
  }

  /// out[c] += the sum of f(r, c) over r = 0, 1, ..., rows - 1, added up in that
  /// order from 0 (as the CPU backend adds, so both give the same bits), for every
  /// column c of a row-major rows x cols matrix; the layers' bias gradients. One
  /// kernel, a block per detail::kSumColumns columns, in which warps evaluating f on
  /// a tile of rows run beside a warp adding up the tile before, column by column
  /// in row order (detail::column_sums_kernel).
  template <class F>
  void column_sums(std::size_t rows, std::size_t cols, F f, float* out) {
    if (cols == 0) return;
    const std::size_t blocks = (cols + detail::kSumColumns - 1) / detail::kSumColumns;
    if (blocks > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw_error({}, "cuda backend: column_sums over ", cols, " columns needs more blocks than a grid has");
    activate();
    const dim3 block(detail::kSumColumns, 1 + detail::kSumLoaders);
    detail::column_sums_kernel<<<static_cast<unsigned>(blocks), block, 0, stream()>>>(rows, cols, f, out);
    PIPEWEAVE_CHECK_CUDA(cudaGetLastError());
  }

  /// *out = the sum of f(i) over [0, n), written to device memory by a CUB
  /// reduction on the stream (deterministic from run to run on one GPU model).
  template <class F>
  void sum(std::size_t n, F f, float* out) {
    activate();
    if (n == 0) {
      PIPEWEAVE_CHECK_CUDA(cudaMemsetAsync(out, 0, sizeof(float), stream()));
      return;
    }
    std::size_t bytes = 0;
    const thrust::counting_iterator<std::size_t> first(0);
    PIPEWEAVE_CHECK_CUDA(cub::DeviceReduce::TransformReduce(nullptr, bytes, first, out, n, ::cuda::std::plus<float>{},
                                                            f, 0.0f, stream()));
    void* temp = scratch_.get(bytes, stream());
    PIPEWEAVE_CHECK_CUDA(cub::DeviceReduce::TransformReduce(temp, bytes, first, out, n, ::cuda::std::plus<float>{},
                                                            f, 0.0f, stream()));
    written(out, 1);
  }

  /// Waits until everything enqueued so far has completed. With a wait check
  /// installed it polls, calling the check between polls; otherwise it blocks.
  void synchronize() {
    activate();
    if (!wait_check_) {
      stream_.synchronize();
      return;
    }
    done_.record(stream());
    poll_until([&] { return done_.done(); }, kNoTimeout, wait_check_);
  }

  /// A second backend of the same GPU for the backward half of an overlapped
  /// pair: its own non-blocking stream, cuBLAS handle, workspace and scratch, the
  /// same math mode (see OverlapBackend). In bf16 mode it rounds its GEMMs'
  /// weights from the fp32 values (the same bf16 values as this backend's
  /// parameter copies give), since the copies live here.
  /// Its time stamps count from this backend's origin (the side's reset_clock() records
  /// none of its own), so that both streams' stamps of a step share one clock.
  CudaBackend side() const { return side_with(workspace_.size()); }
  /// A side for copies only (CopyLaneBackend): a stream of its own like side()'s,
  /// without a cuBLAS workspace (it runs no GEMM).
  CudaBackend copy_side() const { return side_with(0); }
  /// Whether the host memory [p, p + n) is page-locked (cudaMallocHost, or
  /// registered with cudaHostRegister), so that a copy from it on a stream
  /// returns at once: asked of its first and last element, the range taken to be
  /// one allocation or registration (as cudaMallocHost of the batch, or one
  /// cudaHostRegister of it, gives). Pageable memory is cudaMemoryTypeUnregistered
  /// (CUDA 11 and later; cudaErrorInvalidValue before, which is forgotten); any
  /// other error is thrown.
  bool page_locked(const float* p, std::size_t n) const {
    if (p == nullptr || n == 0) return false;
    for (const float* at : {p, p + (n - 1)}) {
      cudaPointerAttributes a{};
      const cudaError_t e = cudaPointerGetAttributes(&a, at);
      if (e == cudaErrorInvalidValue) {
        (void)cudaGetLastError();  // the pointer is unknown to CUDA: pageable
        return false;
      }
      PIPEWEAVE_CHECK_CUDA(e);
      if (a.type != cudaMemoryTypeHost) return false;
    }
    return true;
  }
  /// Work enqueued from now on waits for everything enqueued on `other` so far
  /// (an event of other's stream); the host does not wait.
  void wait_for(const CudaBackend& other) {
    other.mark(fence_);
    wait_for(fence_);
  }
  /// A point in the backend's work (see OverlapBackend): an event of its stream.
  using Mark = Event;
  /// Records `m` on this stream: the point after everything enqueued so far.
  void mark(Mark& m) const {
    activate();
    m.record(stream());
  }
  /// Work enqueued from now on waits for the point `m` marks (of any stream of
  /// this GPU); the host does not wait.
  void wait_for(const Mark& m) {
    activate();
    PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(stream(), m.get(), 0));
  }

  /// Enqueues the clock's origin and forgets earlier stamps (a side backend only
  /// forgets: its origin is the one of the backend it was made from, reset there).
  void reset_clock() {
    activate();
    if (!shares_origin_) origin_->record(stream());
    next_stamp_ = 0;
  }
  /// Enqueues a time stamp (a timing event); returns its index.
  std::size_t time_stamp() {
    activate();
    if (next_stamp_ == stamps_.size()) stamps_.emplace_back(true);
    stamps_[next_stamp_].record(stream());
    return next_stamp_++;
  }
  /// Microseconds from the origin to stamp `index`; valid after synchronize().
  double elapsed_us(std::size_t index) const {
    if (index >= next_stamp_)
      throw_error({}, "cuda backend: time stamp ", index, " was not taken since the clock's reset");
    return 1000.0 * static_cast<double>(Event::elapsed_ms(*origin_, stamps_[index]));
  }

  /// Makes this backend's GPU current on the calling thread (ThreadBoundBackend):
  /// the runtime calls it once on each thread it starts for the device.
  void bind_thread() const { PIPEWEAVE_CHECK_CUDA(cudaSetDevice(gpu_)); }

  /// "cuda (NVIDIA H200, cuBLAS fp32, Thrust)".
  std::string_view name() const { return name_; }

 private:
  // Checks that `gpu` exists and makes it current, before any member that
  // creates a CUDA object on the current device is constructed.
  static int select(int gpu) {
    const int count = gpu_count();
    if (gpu < 0 || gpu >= count)
      throw_error({}, "cuda backend: GPU ", gpu, " does not exist (", count, " GPUs visible)");
    PIPEWEAVE_CHECK_CUDA(cudaSetDevice(gpu));
    return gpu;
  }
  static std::string query_name(int gpu) {
    cudaDeviceProp prop{};
    PIPEWEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, gpu));
    return prop.name;
  }

  CudaBackend side_with(std::size_t workspace) const {
    CudaBackend s(gpu_, CudaOptions{.math = math_, .cublas_workspace = workspace});
    s.origin_ = origin_;
    s.shares_origin_ = true;
    return s;
  }

  void activate() const {
    int current = -1;
    PIPEWEAVE_CHECK_CUDA(cudaGetDevice(&current));
    if (current != gpu_) PIPEWEAVE_CHECK_CUDA(cudaSetDevice(gpu_));
  }

  // bf16 mode: the copy of the parameters that hold [p, p + n), or nullptr.
  const __nv_bfloat16* parameter_copy(const float* p, std::size_t n) const {
    for (const detail::Bf16Copy& c : bf16_copies_)
      if (c.holds(p, n)) return c.copy.data() + (p - c.begin);
    return nullptr;
  }

  // The bf16 copy an update of [w, w + n) writes: the range's copy, made (and
  // overlapping ones dropped) the first time.
  __nv_bfloat16* copy_for_update(const float* w, std::size_t n) {
    for (detail::Bf16Copy& c : bf16_copies_)
      if (c.begin == w && c.count == n) return c.copy.data();
    std::erase_if(bf16_copies_, [&](const detail::Bf16Copy& c) { return c.overlaps(w, n * sizeof(float)); });
    bf16_copies_.push_back({w, n, DeviceArray<__nv_bfloat16>(n)});
    return bf16_copies_.back().copy.data();
  }

  // After an operation wrote [p, p + n): refreshes the bf16 copies of the
  // parameters it wrote into (none outside bf16 mode).
  void written(const float* p, std::size_t n) {
    for (detail::Bf16Copy& c : bf16_copies_)
      if (c.overlaps(p, n * sizeof(float)))
        run_thrust("bf16 refresh", [&] {
          thrust::transform(policy(), c.begin, c.begin + c.count, c.copy.data(), detail::ToBf16{});
        });
  }

  // Rounds n values into `out` (enqueued); returns out.
  const __nv_bfloat16* to_bf16(const float* x, std::size_t n, __nv_bfloat16* out) {
    if (n > 0) thrust::transform(policy(), x, x + n, out, detail::ToBf16{});
    bf16_rounded_ += n;
    return out;
  }

  template <class Body>
  static void run_thrust(const char* what, Body&& body) {
    try {
      body();
    } catch (const thrust::system_error& e) {
      throw_error({}, "cuda backend: Thrust ", what, " failed: ", e.what());
    }
  }

  int gpu_ = 0;
  MathMode math_ = MathMode::kFp32;
  std::string device_name_, name_;
  Stream stream_;  // created after select(); declared before everything used on it, so destroyed after
  CublasHandle cublas_;
  DeviceArray<unsigned char> workspace_;
  detail::Scratch scratch_;
  std::shared_ptr<const Event> origin_;  // the clock's origin, shared with the side() backends made from this one
  bool shares_origin_ = false;           // a side() backend: the origin is recorded by the backend it came from
  Event done_, fence_;
  std::vector<Event> stamps_;
  std::size_t next_stamp_ = 0;
  std::size_t allocations_ = 0;
  WaitCheck wait_check_;
  std::vector<detail::Bf16Copy> bf16_copies_;  // bf16 mode: copies of the parameters the optimizer updates
  std::size_t bf16_rounded_ = 0;
};

static_assert(CopyLaneBackend<CudaBackend>);

}  // namespace pipeweave::cuda
