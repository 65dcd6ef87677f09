#pragma once
/// \file
/// RAII owners of CUDA handles: the current-device guard, streams, events, cuBLAS
/// handles and device memory. Each is move-only; each destructor releases its
/// handle and never throws.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>

#include "pipeweave/cuda/check.hpp"

namespace pipeweave::cuda {

/// Number of CUDA devices usable by this process; 0 when there is no GPU or no
/// driver (never throws), so callers can skip or fall back.
inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

/// 16 bytes of a GPU's UUID as nvidia-smi writes them: "GPU-" and 32 hex digits
/// in groups of 8-4-4-4-12.
inline std::string uuid_text(const char (&bytes)[16]) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<unsigned char>(bytes[i])));
    out += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) out += '-';
  }
  return out;
}

/// The UUID of GPU `device` (uuid_text): it names one GPU however a process
/// numbers it (CUDA_VISIBLE_DEVICES renumbers the GPUs a process sees).
inline std::string gpu_uuid(int device) {
  cudaDeviceProp prop{};
  PIPEWEAVE_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return uuid_text(prop.uuid.bytes);
}

/// Makes `device` current for the guard's lifetime and restores the previous one.
/// When `device` is current already it touches nothing: since CUDA 12
/// cudaSetDevice creates the device's context, and a guard that restored the
/// default device 0 would open a context there on every process (each rank of a
/// multi-process run selects its own GPU first, so its guards do nothing).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    PIPEWEAVE_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device_) PIPEWEAVE_CHECK_CUDA(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = 0;
  int previous_ = 0;
};

/// A non-blocking CUDA stream on the current device.
class Stream {
 public:
  Stream() { PIPEWEAVE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(stream_, o.stream_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// The raw handle.
  cudaStream_t get() const { return stream_; }
  /// Blocks the host until all work on the stream has finished.
  void synchronize() const { PIPEWEAVE_CHECK_CUDA(cudaStreamSynchronize(stream_)); }
  /// Makes later work on this stream wait for `event`.
  void wait(cudaEvent_t event) const { PIPEWEAVE_CHECK_CUDA(cudaStreamWaitEvent(stream_, event, 0)); }

 private:
  cudaStream_t stream_ = nullptr;
};

/// A CUDA event; `timing` events can measure elapsed time between two records.
class Event {
 public:
  explicit Event(bool timing = false) {
    PIPEWEAVE_CHECK_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// The raw handle.
  cudaEvent_t get() const { return event_; }
  /// Records the event on a stream.
  void record(cudaStream_t stream) const { PIPEWEAVE_CHECK_CUDA(cudaEventRecord(event_, stream)); }
  /// Blocks the host until the event has completed.
  void synchronize() const { PIPEWEAVE_CHECK_CUDA(cudaEventSynchronize(event_)); }
  /// True when the work before the event has completed; throws on an error status.
  bool done() const {
    const cudaError_t s = cudaEventQuery(event_);
    if (s == cudaErrorNotReady) return false;
    PIPEWEAVE_CHECK_CUDA(s);
    return true;
  }
  /// Milliseconds between two completed timing events.
  static float elapsed_ms(const Event& start, const Event& end) {
    float ms = 0;
    PIPEWEAVE_CHECK_CUDA(cudaEventElapsedTime(&ms, start.event_, end.event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

/// A cuBLAS handle bound to a stream.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream = nullptr) {
    PIPEWEAVE_CHECK_CUBLAS(cublasCreate(&handle_));
    PIPEWEAVE_CHECK_CUBLAS(cublasSetStream(handle_, stream));
  }
  ~CublasHandle() {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
  }
  CublasHandle(CublasHandle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept {
    std::swap(handle_, o.handle_);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  /// The raw handle.
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// Where a CudaArray's memory comes from: the current device (cudaMalloc).
struct DeviceMemory {
  static cudaError_t allocate(void** p, std::size_t bytes) { return cudaMalloc(p, bytes); }
  static void release(void* p) { (void)cudaFree(p); }
};
/// ... or page-locked host memory (cudaMallocHost): a copy between it and device
/// memory on a stream returns at once, and runs beside the kernels of other streams.
struct PinnedMemory {
  static cudaError_t allocate(void** p, std::size_t bytes) { return cudaMallocHost(p, bytes); }
  static void release(void* p) { (void)cudaFreeHost(p); }
};

/// An owning array of `count` elements of T in the memory `Memory` allocates.
template <class T, class Memory>
class CudaArray {
 public:
  CudaArray() = default;
  explicit CudaArray(std::size_t count) : count_(count) {
    if (count_ > 0) PIPEWEAVE_CHECK_CUDA(Memory::allocate(reinterpret_cast<void**>(&data_), count_ * sizeof(T)));
  }
  ~CudaArray() {
    if (data_ != nullptr) Memory::release(data_);
  }
  CudaArray(CudaArray&& o) noexcept : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  CudaArray& operator=(CudaArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;

  T* data() { return data_; }                    ///< the first element
  const T* data() const { return data_; }        ///< the first element
  std::size_t size() const { return count_; }    ///< elements
  std::size_t bytes() const { return count_ * sizeof(T); }  ///< size in bytes

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// Device memory for `count` elements of T, on the current device.
template <class T>
using DeviceArray = CudaArray<T, DeviceMemory>;
/// Page-locked host memory for `count` elements of T (see PinnedMemory).
template <class T>
using PinnedArray = CudaArray<T, PinnedMemory>;

}  // namespace pipeweave::cuda
