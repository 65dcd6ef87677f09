#pragma once
/// \file
/// The CPU backend: host memory, GEMM through OpenBLAS's cblas, elementwise
/// functors and reductions through Thrust's host policy. Every operation runs at
/// once on the calling thread, so the stream of the Backend concept is the thread
/// itself and synchronize() has nothing to wait for.
///
/// Build with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP, Thrust's include
/// directory (the CUDA toolkit's CCCL headers) and -lopenblas; Meson's
/// `thrust_host_dep` and `openblas_dep` do that.

#include <cblas.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/schedule/error.hpp"

namespace pipeweave::cpu {

/// Sets the number of threads each OpenBLAS call may use, for the whole process.
/// The CPU pipeline runs one device per thread, so one BLAS thread per device
/// (the default of cpu::MlpPipeline) keeps the cores from being oversubscribed.
inline void set_blas_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

/// Threads OpenBLAS may use per call at present.
inline int blas_threads() { return openblas_get_num_threads(); }

/// An owning array of floats in host memory, aligned to 64 bytes.
class HostBuffer {
 public:
  HostBuffer() = default;
  /// n floats, contents undefined.
  explicit HostBuffer(std::size_t n)
      : data_(n ? static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t{kAlignment})) : nullptr),
        size_(n) {}
  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { release(); }

  /// The first element; nullptr when empty.
  float* data() { return data_; }
  /// The first element; nullptr when empty.
  const float* data() const { return data_; }
  /// Number of floats.
  std::size_t size() const { return size_; }

 private:
  static constexpr std::size_t kAlignment = 64;
  void release() {
    if (data_ != nullptr) ::operator delete[](data_, std::align_val_t{kAlignment});
    data_ = nullptr;
    size_ = 0;
  }
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The CPU backend of one device. Satisfies pipeweave::Backend; one instance per
/// device thread (the instance itself is not shared between threads).
class CpuBackend {
 public:
  /// The buffer type of this backend.
  using Buffer = HostBuffer;

  /// A buffer of n floats. Throws pipeweave::Error when the memory is not there.
  Buffer allocate(std::size_t n) {
    ++allocations_;
    try {
      return Buffer(n);
    } catch (const std::bad_alloc&) {
      throw_error({}, "cpu backend: cannot allocate ", n * sizeof(float), " bytes");
    }
  }
  /// Number of allocate() calls so far.
  std::size_t allocations() const { return allocations_; }

  /// Host to "device": a plain copy.
  void upload(const float* host, float* device, std::size_t n) { copy(host, device, n); }
  /// "Device" to host: a plain copy.
  void download(const float* device, float* host, std::size_t n) { copy(device, host, n); }
  /// dst[0..n) = src[0..n).
  void copy(const float* src, float* dst, std::size_t n) {
    if (n != 0 && src != dst) std::memmove(dst, src, n * sizeof(float));
  }
  /// dst[0..n) = value.
  void fill(float* dst, std::size_t n, float value) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = value;
  }

  /// C = alpha * op(A) * op(B) + beta * C, row-major, through cblas_sgemm.
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
                tb == Transpose::kYes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  /// f(i) for i in [0, n), with Thrust's host policy (in increasing i).
  template <class F>
  void for_each(std::size_t n, F f) {
    thrust::for_each(thrust::host, thrust::counting_iterator<std::size_t>(0), thrust::counting_iterator<std::size_t>(n),
                     f);
  }
  /// *out = the sum of f(i) over [0, n), with Thrust's host policy (in increasing i).
  template <class F>
  void sum(std::size_t n, F f, float* out) {
    *out = thrust::transform_reduce(thrust::host, thrust::counting_iterator<std::size_t>(0),
                                    thrust::counting_iterator<std::size_t>(n), f, 0.0f, thrust::plus<float>());
  }

  /// Nothing to wait for: every operation has completed when it returns.
  void synchronize() {}

  /// Sets the clock's origin to now and forgets earlier stamps.
  void reset_clock() {
    origin_ = Clock::now();
    stamps_.clear();
  }
  /// Records the time now; returns its index.
  std::size_t time_stamp() {
    stamps_.push_back(Clock::now());
    return stamps_.size() - 1;
  }
  /// Microseconds from the origin to stamp `index`.
  double elapsed_us(std::size_t index) const {
    return std::chrono::duration<double, std::micro>(stamps_.at(index) - origin_).count();
  }

  /// "cpu (OpenBLAS, Thrust host)".
  std::string_view name() const { return "cpu (OpenBLAS, Thrust host)"; }

 private:
  using Clock = std::chrono::steady_clock;
  std::size_t allocations_ = 0;
  Clock::time_point origin_ = Clock::now();
  std::vector<Clock::time_point> stamps_;  // capacity kept across reset_clock()
};

static_assert(Backend<CpuBackend>);

}  // namespace pipeweave::cpu
