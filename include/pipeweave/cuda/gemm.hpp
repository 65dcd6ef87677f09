#pragma once
/// \file
/// Row-major GEMM on cuBLAS in three precisions: fp32, fp32 with TF32 tensor cores,
/// and bf16 inputs with fp32 accumulation. Row-major C = op(A) op(B) is computed as
/// the column-major C^T = op(B)^T op(A)^T, so no transposition is materialised.

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "pipeweave/cuda/check.hpp"
#include "pipeweave/cuda/precision.hpp"

namespace pipeweave::cuda {

/// Row-major C[m x n] = alpha * op(A) * op(B) + beta * C, where op(A) is m x k and
/// op(B) is k x n; lda, ldb, ldc are row strides in elements. Element type is
/// float for kFp32 and kTf32 and __nv_bfloat16 for kBf16 (all three matrices).
/// Enqueued on the handle's stream.
inline void gemm(cublasHandle_t handle, MathMode mode, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                 const void* a, int lda, const void* b, int ldb, float beta, void* c, int ldc) {
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (mode == MathMode::kFp32) {
    PIPEWEAVE_CHECK_CUBLAS(cublasSgemm(handle, op_b, op_a, n, m, k, &alpha, static_cast<const float*>(b), ldb,
                                       static_cast<const float*>(a), lda, &beta, static_cast<float*>(c), ldc));
    return;
  }
  const cudaDataType_t type = mode == MathMode::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = mode == MathMode::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  PIPEWEAVE_CHECK_CUBLAS(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, b, type, ldb, a, type, lda, &beta, c, type,
                                      ldc, compute, CUBLAS_GEMM_DEFAULT));
}

/// Row-major C[m x n] (fp32) = alpha * op(A) * op(B) + beta * C with A and B in
/// bf16 and the products accumulated in fp32: the mixed-precision GEMM of the
/// backend's kBf16 mode. Enqueued on the handle's stream.
inline void gemm_bf16_fp32(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const __nv_bfloat16* a, int lda, const __nv_bfloat16* b, int ldb, float beta, float* c,
                           int ldc) {
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PIPEWEAVE_CHECK_CUBLAS(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda,
                                      &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace pipeweave::cuda
