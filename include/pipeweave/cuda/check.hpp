#pragma once
/// \file
/// Status checks for the CUDA runtime, cuBLAS and NCCL. Each macro evaluates its
/// expression once and, on failure, throws pipeweave::Error naming the expression,
/// file:line and the library's own error text.
///
/// \code
/// PIPEWEAVE_CHECK_CUDA(cudaMemsetAsync(ptr, 0, bytes, stream));
/// PIPEWEAVE_CHECK_CUBLAS(cublasSetStream(handle, stream));
/// PIPEWEAVE_CHECK_NCCL(ncclGroupEnd());
/// \endcode

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "pipeweave/runtime/error.hpp"

namespace pipeweave::cuda::detail {

[[noreturn]] inline void throw_status(const char* library, const char* expr, const char* file, int line,
                                      const std::string& text) {
  throw_error({}, library, " error at ", file, ":", line, ": ", expr, " returned ", text);
}

/// The CUDA runtime's errors after which the process's CUDA context cannot be
/// used again: the runtime's header says of each that any further CUDA work
/// returns the same error and the process must end and start again.
inline bool lasting_cuda_error(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

/// A CUDA status as the checks write it: its name and text, and for a lasting
/// error (lasting_cuda_error) what it means for the run.
inline std::string cuda_error_text(cudaError_t status) {
  std::string text = std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
  if (lasting_cuda_error(status))
    text += "; after this error no CUDA work of this process can succeed: end the process and start it again "
            "(a checkpoint resumes the run)";
  return text;
}

inline void check_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw_status("CUDA", expr, file, line, cuda_error_text(status));
}

inline void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_status("cuBLAS", expr, file, line,
               std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")");
}

inline void check_nccl(ncclResult_t status, const char* expr, const char* file, int line) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  std::string text = ncclGetErrorString(status);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0') text += ": " + std::string(last);
  throw_status("NCCL", expr, file, line, text);
}

}  // namespace pipeweave::cuda::detail

/// Throws pipeweave::Error unless the CUDA runtime call returns cudaSuccess.
#define PIPEWEAVE_CHECK_CUDA(expr) ::pipeweave::cuda::detail::check_cuda((expr), #expr, __FILE__, __LINE__)
/// Throws pipeweave::Error unless the cuBLAS call returns CUBLAS_STATUS_SUCCESS.
#define PIPEWEAVE_CHECK_CUBLAS(expr) ::pipeweave::cuda::detail::check_cublas((expr), #expr, __FILE__, __LINE__)
/// Throws pipeweave::Error unless the NCCL call returns ncclSuccess (or ncclInProgress for non-blocking communicators).
#define PIPEWEAVE_CHECK_NCCL(expr) ::pipeweave::cuda::detail::check_nccl((expr), #expr, __FILE__, __LINE__)
