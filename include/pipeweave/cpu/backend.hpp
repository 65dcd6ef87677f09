#pragma once
/// \file
/// The CPU backend: host memory, GEMM through OpenBLAS's cblas, and the shared
/// elementwise functors in loops of its own. Every operation runs at once on the
/// calling thread, so the stream of the Backend concept is the thread itself and
/// synchronize() has nothing to wait for.
///
/// Cost: the GEMMs are OpenBLAS's; every other operation is one pass over its
/// data in blocks of kBlock consecutive elements whose iterations are independent
/// (the concept lets them run at once), which the compiler turns into vector
/// instructions at -O2 already; no division per element (a matrix is walked row
/// by row), and a sum keeps kBlock partial sums. OpenBLAS must run the kernels of
/// the CPU it is on: ensure_blas_kernels() sees to that once per process.
///
/// Build with OpenBLAS (-lopenblas); Meson's `openblas_dep` does that.

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeweave/runtime/backend.hpp"
#include "pipeweave/runtime/error.hpp"
#include "pipeweave/runtime/options.hpp"
#include "pipeweave/schedule/error.hpp"

/// Before a loop: its iterations are independent (no iteration reads what another
/// writes), so the compiler may vectorize it without checking for overlap.
#if defined(__clang__)
#define PIPEWEAVE_INDEPENDENT_ITERATIONS _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define PIPEWEAVE_INDEPENDENT_ITERATIONS _Pragma("GCC ivdep")
#else
#define PIPEWEAVE_INDEPENDENT_ITERATIONS
#endif

// OpenBLAS's runtime kernel selection (builds with DYNAMIC_ARCH); weak, so that a
// build without it leaves them null.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace pipeweave::cpu {

/// Sets the number of threads each OpenBLAS call may use, for the whole process.
/// The CPU pipeline runs one device per thread, so one BLAS thread per device
/// (the default of cpu::MlpPipeline) keeps the cores from being oversubscribed.
inline void set_blas_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

/// What only the CPU backend has, beside the run's PipelineOptions (one process
/// or one rank per device alike).
struct CpuOptions {
  TransportKind transport = TransportKind::kAuto;  ///< kAuto or kRendezvous (see resolve_cpu_transport); MPI runs: kAuto
  int blas_threads = 1;  ///< OpenBLAS threads per call (process-wide); 0 leaves the setting alone
};

/// Threads OpenBLAS may use per call at present.
inline int blas_threads() { return openblas_get_num_threads(); }

/// The OpenBLAS kernels in use, e.g. "SkylakeX" or "Haswell".
inline std::string blas_kernels() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

/// The best OpenBLAS kernels for this CPU's instruction set (x86-64 with GCC or
/// Clang): "SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA, "SandyBridge"
/// with AVX; empty elsewhere.
inline std::string_view blas_kernels_for_this_cpu() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "SandyBridge";
#endif
  return {};
}

/// Makes OpenBLAS run the kernels of this CPU; once per process, from the first
/// CpuBackend. An OpenBLAS built for several CPUs (DYNAMIC_ARCH, as Debian's)
/// picks its kernels by the CPU model when it loads, and a model it does not know
/// gets its Prescott (SSE3) kernels: OpenBLAS 0.3.21 (Debian 12) does so on Intel
/// CPUs newer than Sapphire Rapids, where its AVX-512 kernels run GEMMs about 5
/// times as fast. Only in that case, and only when OPENBLAS_CORETYPE does not say
/// which kernels to take, this selects the kernels blas_kernels_for_this_cpu()
/// names, the way OPENBLAS_CORETYPE would at load time. Call it before any BLAS
/// call of another thread is in flight.
inline void ensure_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string_view best = blas_kernels_for_this_cpu();
    if (best.empty() || std::getenv("OPENBLAS_CORETYPE") != nullptr || gotoblas_dynamic_init == nullptr ||
        gotoblas_dynamic_quit == nullptr || blas_kernels() != "Prescott")
      return;
    const std::string core(best);
    ::setenv("OPENBLAS_CORETYPE", core.c_str(), 0);  // what the selection reads
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    ::unsetenv("OPENBLAS_CORETYPE");
  });
}

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
  /// Its buffers are host memory (HostMemoryBackend).
  static constexpr bool kHostMemory = true;
  /// Iterations per block of the elementwise loops.
  static constexpr std::size_t kBlock = 16;

  /// A backend; the first in the process makes OpenBLAS run the kernels of this
  /// CPU (ensure_blas_kernels).
  CpuBackend() { ensure_blas_kernels(); }

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
  /// n floats of host memory for the copy lane (CopyLaneBackend): a buffer like any other.
  Buffer allocate_host(std::size_t n) { return allocate(n); }

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
    if (n != 0 && value == 0.0f && !std::signbit(value)) {
      std::memset(dst, 0, n * sizeof(float));
      return;
    }
    for_each(n, [dst, value](std::size_t i) { dst[i] = value; });
  }

  /// C = alpha * op(A) * op(B) + beta * C, row-major, through cblas_sgemm.
  void gemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
                tb == Transpose::kYes ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  /// f(i) for i in [0, n), in blocks of kBlock.
  template <class F>
  void for_each(std::size_t n, F f) {
    std::size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
      PIPEWEAVE_INDEPENDENT_ITERATIONS
      for (std::size_t k = 0; k < kBlock; ++k) f(i + k);
    }
    for (; i < n; ++i) f(i);
  }

  /// f(r, c) for every element of a rows x cols matrix, row by row.
  template <class F>
  void for_each_element(std::size_t rows, std::size_t cols, F f) {
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t c = 0;
      for (; c + kBlock <= cols; c += kBlock) {
        PIPEWEAVE_INDEPENDENT_ITERATIONS
        for (std::size_t k = 0; k < kBlock; ++k) f(r, c + k);
      }
      for (; c < cols; ++c) f(r, c);
    }
  }

  /// out[c] += f(0, c) + ... + f(rows - 1, c) for every column c, summed from 0 in
  /// increasing r: row by row over tiles of kSumTile columns, one partial sum per column.
  template <class F>
  void column_sums(std::size_t rows, std::size_t cols, F f, float* out) {
    alignas(64) float sums[kSumTile];
    for (std::size_t c0 = 0; c0 < cols; c0 += kSumTile) {
      const std::size_t width = std::min(kSumTile, cols - c0);
      std::fill_n(sums, width, 0.0f);
      for (std::size_t r = 0; r < rows; ++r) {
        std::size_t k = 0;
        for (; k + kBlock <= width; k += kBlock) {
          PIPEWEAVE_INDEPENDENT_ITERATIONS
          for (std::size_t j = 0; j < kBlock; ++j) sums[k + j] += f(r, c0 + k + j);
        }
        for (; k < width; ++k) sums[k] += f(r, c0 + k);
      }
      for (std::size_t k = 0; k < width; ++k) out[c0 + k] += sums[k];
    }
  }

  /// *out = the sum of f(i) over [0, n): kBlock partial sums, lane j adding up
  /// f(j), f(j + kBlock), ... in order, then the lanes in order, then the rest.
  template <class F>
  void sum(std::size_t n, F f, float* out) {
    alignas(64) float lanes[kBlock] = {};
    std::size_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
      PIPEWEAVE_INDEPENDENT_ITERATIONS
      for (std::size_t k = 0; k < kBlock; ++k) lanes[k] += f(i + k);
    }
    float s = 0.0f;
    for (float lane : lanes) s += lane;
    for (; i < n; ++i) s += f(i);
    *out = s;
  }

  /// Nothing to wait for: every operation has completed when it returns.
  void synchronize() {}
  /// A second backend for the backward half of an overlapped pair; the executor
  /// calls it from a thread of its own (see OverlapBackend). Its time stamps count
  /// from this backend's origin (its reset_clock() sets none of its own).
  CpuBackend side() const {
    CpuBackend s;
    s.origin_ = origin_;
    s.shares_origin_ = true;
    return s;
  }
  /// A side for copies (CopyLaneBackend): a side() like any other.
  CpuBackend copy_side() const { return side(); }
  /// Nothing to wait for: `other`'s operations were complete when they returned.
  void wait_for(const CpuBackend& /*other*/) {}
  /// A point in the backend's work (see OverlapBackend): nothing to record, as
  /// every operation has completed when it returns.
  struct Mark {};
  /// Nothing to record.
  void mark(Mark& /*m*/) const {}
  /// Nothing to wait for.
  void wait_for(const Mark& /*m*/) {}

  /// Sets the clock's origin to now and forgets earlier stamps (a side backend only
  /// forgets: its origin is the one of the backend it was made from, set there).
  void reset_clock() {
    if (!shares_origin_) *origin_ = Clock::now();
    stamps_.clear();
  }
  /// Records the time now; returns its index.
  std::size_t time_stamp() {
    stamps_.push_back(Clock::now());
    return stamps_.size() - 1;
  }
  /// Microseconds from the origin to stamp `index`.
  double elapsed_us(std::size_t index) const {
    return std::chrono::duration<double, std::micro>(stamps_.at(index) - *origin_).count();
  }

  /// "cpu (OpenBLAS SkylakeX kernels)": the kernels in use (blas_kernels()).
  std::string_view name() const {
    static const std::string text = "cpu (OpenBLAS " + blas_kernels() + " kernels)";
    return text;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kSumTile = 256;  // columns whose partial sums column_sums keeps at once
  std::size_t allocations_ = 0;
  // The clock's origin, shared with the side() backends made from this one (set on
  // the thread that owns this backend; they read it on that thread, in elapsed_us)
  // and with any copy of it.
  std::shared_ptr<Clock::time_point> origin_ = std::make_shared<Clock::time_point>(Clock::now());
  bool shares_origin_ = false;  // a side() backend: the origin is set by the backend it came from
  std::vector<Clock::time_point> stamps_;  // capacity kept across reset_clock()
};

static_assert(CopyLaneBackend<CpuBackend>);

}  // namespace pipeweave::cpu
